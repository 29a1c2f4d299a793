"""The task admin on real PostgreSQL: summary, filters, search, guarded actions, permissions."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from django_pgtasks.admin import COUNT_LIMIT, NameFilter, TaskAdmin
from django_pgtasks.admin import changelist as admin_changelist
from django_pgtasks.admin.common import NAME_FILTER_SAMPLE
from django_pgtasks.models import Status, Task
from tests.helpers import large_seq_scans
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_pgtasks_task_changelist")
HIDDEN_INPUT = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


def change_url(task: Task) -> str:
    return reverse("admin:django_pgtasks_task_change", args=[task.pk])


def make_task(handler: Any = tasks.noop, *args: Any, **state: Any) -> Task:
    """Enqueue a task, then put it in ``state`` the way a worker would have."""
    task = Task.objects.enqueue(handler, *args)
    if state:
        Task.objects.filter(pk=task.pk).update(**state)
    task.refresh_from_db()
    return task


def failed(message: str) -> Task:
    return make_task(
        tasks.always_fails, status=Status.FAILED, attempt=3,
        error_text=f"{message}\n\nTraceback (most recent call last):\n  ...",
    )


def listed(response: HttpResponse) -> set[int]:
    return {task.pk for task in response.context["cl"].result_list}


def message_texts(response: HttpResponse) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def statuses(*task_list: Task) -> list[str]:
    return [Task.objects.get(pk=task.pk).status for task in task_list]


def hidden_inputs(response: HttpResponse) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for name, value in HIDDEN_INPUT.findall(response.content.decode()):
        fields.setdefault(name, []).append(html.unescape(value))
    return fields


def run_action(
    client: Client, action: str, selected: list[Task], url: str = CHANGELIST, **data: Any
) -> tuple[HttpResponse, HttpResponse]:
    """Pick ``action`` on the changelist, then submit its confirmation page with ``data``.

    The confirmation posts back exactly the hidden fields the page rendered, as a browser
    would. Where no confirmation page came (no permission), the same fields are forged.
    """
    ids = [task.pk for task in selected]
    select_across = data.pop("select_across", "0")
    chosen = client.post(url, {
        "action": action, "index": 0, "_selected_action": ids, "select_across": select_across,
    })
    if chosen.templates and chosen.templates[0].name == TaskAdmin.action_confirmation_template:
        form = hidden_inputs(chosen)
    else:
        form = {"action": action, "_selected_action": ids, "select_across": select_across,
                "post": "yes"}
    confirmed = client.post(url, {**form, **data})
    return chosen, confirmed



# -- error-group filter -------------------------------------------------------------------


def test_error_group_filter_rejects_values_no_group_can_have(admin_client: Client) -> None:
    failed("LookupError: order 41 not found")
    response = admin_client.get(CHANGELIST, {"error_group": "x" * 201})
    assert response.status_code == 302
    assert response.url.endswith("?e=1")


@pytest.mark.parametrize("param", ["error_group", "name", "queue", "status__exact", "locked_by"])
def test_filter_values_with_nul_are_refused_before_the_database(
    admin_client: Client, param: str
) -> None:
    # PostgreSQL would raise on them (a server error) rather than match nothing.
    make_task()
    assert admin_client.get(CHANGELIST, {param: "READY\x00"}).status_code == 400


def test_error_group_filter_value_is_data_not_sql(admin_client: Client) -> None:
    task = failed("LookupError: order 41 not found")
    response = admin_client.get(
        CHANGELIST, {"error_group": "x' OR '1'='1'); DROP TABLE pgtasks_task; --"}
    )
    assert response.status_code == 200
    assert listed(response) == set()
    assert Task.objects.filter(pk=task.pk).exists()


def test_the_list_counts_at_most_the_count_limit(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list never counts every matching row: a page view counts at most COUNT_LIMIT + 1
    rows and then says "more than" the limit."""
    monkeypatch.setattr(TaskAdmin, "list_per_page", 2)
    for _ in range(3):
        make_task()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST)
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1
    assert f"LIMIT {COUNT_LIMIT + 1}" in counts[0]
    assert (response.context["cl"].result_count, response.context["cl"].result_count_capped) == (
        3, False)
    assert "More than" not in response.content.decode()


def test_a_list_that_fits_one_page_is_read_once_and_not_counted(admin_client: Client) -> None:
    tasks_made = [make_task() for _ in range(3)]
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST)
    assert listed(response) == {t.pk for t in tasks_made}
    assert response.context["cl"].result_count == 3
    sql = [q["sql"] for q in captured.captured_queries]
    assert not [q for q in sql if "COUNT(" in q.upper()]
    assert len([q for q in sql if '"pgtasks_task"."kwargs"' in q]) == 1  # the rows, once


def test_a_capped_count_says_more_than_the_limit(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_changelist, "COUNT_LIMIT", 3)
    monkeypatch.setattr(TaskAdmin, "list_per_page", 2)
    tasks_made = [make_task() for _ in range(5)]
    response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert (cl.result_count, cl.result_count_capped) == (3, True)
    content = response.content.decode()
    assert "More than 3 tasks match" in content
    assert "more than 3 tasks" in content  # the paginator line
    assert listed(response) == {t.pk for t in tasks_made[-2:]}  # the newest first
    # The last page ends at the limit.
    assert listed(admin_client.get(CHANGELIST, {"p": "2"})) == {tasks_made[2].pk}


def test_within_a_task_name_the_most_attempts_come_first(admin_client: Client) -> None:
    few = make_task(attempt=1)
    most = make_task(attempt=3)
    middle = make_task(attempt=2)
    response = admin_client.get(CHANGELIST, {"name": "tests.testapp.tasks.noop"})
    assert [t.pk for t in response.context["cl"].result_list] == [most.pk, middle.pk, few.pk]
    # Without a name, newest first.
    response = admin_client.get(CHANGELIST)
    assert [t.pk for t in response.context["cl"].result_list] == [middle.pk, most.pk, few.pk]


def test_the_list_shows_arguments_and_the_first_error_line(admin_client: Client) -> None:
    task = make_task(tasks.add, 1, 2)
    Task.objects.filter(pk=task.pk).update(
        kwargs={"note": "x" * 200}, status=Status.FAILED,
        error_text="ValueError: bad input\nTraceback (most recent call last):\n  secret frame",
    )
    content = admin_client.get(CHANGELIST).content.decode()
    assert escape('1, 2, note="xxxx') in content
    assert "ValueError: bad input" in content
    assert "secret frame" not in content  # the full text is on the task's page
    assert "x" * 100 not in content


def test_the_database_parameter_chooses_the_task_database(admin_client: Client) -> None:
    task = make_task()
    response = admin_client.get(CHANGELIST, {"database": "default"})
    assert response.status_code == 200
    assert listed(response) == {task.pk}
    # Not a filter: the links of the list keep it.
    assert "database=default" in response.context["cl"].get_query_string({"q": "x"})
    # Only aliases that hold queues are accepted.
    assert admin_client.get(CHANGELIST, {"database": "not_postgres"}).status_code == 404
    assert admin_client.get(CHANGELIST, {"database": "nowhere"}).status_code == 404
    # A task's page reached from the list reads the same database.
    preserved = {"_changelist_filters": "database=default&status__exact=READY"}
    assert admin_client.get(change_url(task), preserved).status_code == 200


# -- filters and search ------------------------------------------------------------------


def test_name_and_queue_filters(admin_client: Client) -> None:
    noop = make_task()
    add = make_task(tasks.add, 1, 2, queue="emails")

    response = admin_client.get(CHANGELIST)
    specs = {spec.title: spec for spec in response.context["cl"].filter_specs}
    names = [value for value, _ in specs["task name"].lookup_choices]
    assert {"tests.testapp.tasks.add", "tests.testapp.tasks.noop"} <= set(names)
    assert [v for v, _ in specs["queue"].lookup_choices] == ["default", "emails", "urgent"]
    assert "error group" in specs  # applied when used, but renders nothing until then
    assert "By error group" not in response.content.decode()

    assert listed(admin_client.get(CHANGELIST, {"name": "tests.testapp.tasks.add"})) == {add.pk}
    assert listed(admin_client.get(CHANGELIST, {"queue": "emails"})) == {add.pk}
    assert listed(admin_client.get(CHANGELIST, {"queue": "default"})) == {noop.pk}


def test_name_filter_reads_only_the_newest_tasks() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, finished_at)
            SELECT 'tests.seeded.task_' || (i %% 50), 'default', '[]', '{}', 100,
                   'SUCCESSFUL', 1, 3, '', '{}', now()
            FROM generate_series(1, %s) AS i
            """,
            [NAME_FILTER_SAMPLE * 3],
        )
        cursor.execute("ANALYZE pgtasks_task")
    newest = Task.objects.enqueue(tasks.add, 1, 2)

    names = NameFilter.recent_names(Task.objects.all())

    assert len(set(names)) == 51
    assert newest.name in names
    plan = names.explain()
    assert not large_seq_scans(plan), plan
    assert re.search(r"Index Scan( Backward)? using pgtasks_task_done_\w+_id_idx", plan), plan


def test_search_by_id_or_key(admin_client: Client) -> None:
    first, second, third = make_task(), make_task(), make_task(tasks.add, 1, 2)
    Task.objects.filter(pk=first.pk).update(key="invoice-2024-17")

    assert listed(admin_client.get(CHANGELIST, {"q": str(second.pk)})) == {second.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": f" {third.pk} "})) == {third.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": "invoice-2024-17"})) == {first.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": "invoice"})) == set()  # keys match exactly
    # Names are chosen with the name filter, not searched (a search over every row).
    assert listed(admin_client.get(CHANGELIST, {"q": "tasks.add"})) == set()
    assert listed(admin_client.get(CHANGELIST, {"q": "9" * 30})) == set()


def test_a_numeric_search_is_one_primary_key_lookup(admin_client: Client) -> None:
    task = make_task()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST, {"q": str(task.pk)})
    assert listed(response) == {task.pk}
    # The list's own query (every column) and its count.
    listing = [q["sql"] for q in captured.captured_queries
               if '"pgtasks_task"."kwargs"' in q["sql"] or "COUNT(*)" in q["sql"]]
    assert listing
    for sql in listing:
        assert sql.split(" WHERE ", 1)[1].startswith(f'"pgtasks_task"."id" = {task.pk} '), sql


def test_search_by_id_respects_active_filters(admin_client: Client) -> None:
    task = make_task()
    response = admin_client.get(CHANGELIST, {"q": str(task.pk), "status__exact": "FAILED"})
    assert listed(response) == set()


# -- actions -----------------------------------------------------------------------------


def test_retry_now_after_confirmation_skips_running_and_successful(admin_client: Client) -> None:
    failed_task = failed("ValueError: bad input")
    cancelled = make_task(status=Status.CANCELLED)
    running = make_task(status=Status.RUNNING, locked_by="w1")
    succeeded = make_task(status=Status.SUCCESSFUL)
    selected = [failed_task, cancelled, running, succeeded]

    chosen, confirmed = run_action(admin_client, "retry_now_selected", selected)

    assert chosen.status_code == 200
    assert "4 tasks are selected." in chosen.content.decode()
    assert "Of these: 1 running, 1 successful, 1 failed, 1 cancelled." in chosen.content.decode()
    assert 'name="post" value="yes"' in chosen.content.decode()
    assert confirmed.status_code == 302
    assert statuses(*selected) == ["READY", "READY", "RUNNING", "SUCCESSFUL"]
    assert Task.objects.get(pk=failed_task.pk).max_attempts == 4  # one more attempt
    assert message_texts(confirmed) == [
        "Retry now: 2 changed, 2 skipped (1 running, 1 successful)."
    ]


def test_retry_says_why_a_failed_task_was_skipped(admin_client: Client) -> None:
    """A failed task whose key another live task holds now stays failed, and the message
    says so instead of claiming it was running."""
    old = failed("ValueError: bad input")
    Task.objects.filter(pk=old.pk).update(key="report-7")
    Task.objects.enqueue(tasks.noop, key="report-7")

    _, confirmed = run_action(admin_client, "retry_now_selected", [old])

    assert statuses(old) == ["FAILED"]
    assert message_texts(confirmed) == [
        "Retry now: 0 changed, 1 skipped (1 key held by another live task, or changed "
        "meanwhile)."
    ]


def test_choosing_an_action_changes_nothing_until_confirmed(admin_client: Client) -> None:
    task = make_task()
    response = admin_client.post(
        CHANGELIST, {"action": "cancel_selected", "index": 0, "_selected_action": [task.pk]}
    )
    assert response.status_code == 200
    assert response.templates[0].name == TaskAdmin.action_confirmation_template
    # It says what becomes of running tasks, on every pool.
    assert "finishes its work anyway ends successful; on a process-pool worker, one still " \
           "running CANCEL_GRACE seconds later is stopped" in response.content.decode()
    assert statuses(task) == ["READY"]


def test_cancel_after_confirmation_stops_running_and_skips_finished(
    admin_client: Client,
) -> None:
    ready = make_task()
    waiting = make_task(status=Status.AWAITING_RETRY, attempt=1)
    running = make_task(status=Status.RUNNING, locked_by="w1")
    succeeded = make_task(status=Status.SUCCESSFUL)
    selected = [ready, waiting, running, succeeded]

    _, confirmed = run_action(admin_client, "cancel_selected", selected)

    # The running task keeps running until its handler stops: it is only asked to.
    assert statuses(*selected) == ["CANCELLED", "CANCELLED", "RUNNING", "SUCCESSFUL"]
    assert list(Task.objects.filter(pk__in=[t.pk for t in selected], cancel_requested=True)
                .values_list("pk", flat=True)) == [running.pk]
    assert message_texts(confirmed) == [
        "Cancel: 3 changed, 1 skipped (1 already finished). "
        "1 running task was asked to stop."
    ]


def test_action_on_all_matching_tasks_keeps_the_changelist_filters(admin_client: Client) -> None:
    failures = [failed("ValueError: bad input") for _ in range(3)]
    other = make_task(status=Status.CANCELLED)
    url = f"{CHANGELIST}?status__exact=FAILED"

    chosen, confirmed = run_action(
        admin_client, "retry_now_selected", failures[:1], url=url, select_across="1"
    )

    assert "3 tasks are selected." in chosen.content.decode()
    assert statuses(*failures, other) == ["READY", "READY", "READY", "CANCELLED"]
    assert message_texts(confirmed) == ["Retry now: 3 changed, 0 skipped."]


def test_change_priority_after_confirmation_skips_running(admin_client: Client) -> None:
    ready = make_task()
    running = make_task(status=Status.RUNNING, locked_by="w1")

    chosen, confirmed = run_action(
        admin_client, "change_priority_selected", [ready, running], priority="150"
    )

    assert 'name="priority"' in chosen.content.decode()
    assert not chosen.context["form"].errors  # the first showing is not an error
    assert confirmed.status_code == 302
    priorities = [Task.objects.get(pk=t.pk).priority for t in (ready, running)]
    assert priorities == [150, 100]
    assert message_texts(confirmed) == ["Priority 150: 1 changed, 1 skipped (1 running)."]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("500", "Ensure this value is less than or equal to 200."),
        ("-1", "Ensure this value is greater than or equal to 0."),
        ("abc", "Enter a whole number."),
        ("", "This field is required."),
    ],
)
def test_change_priority_rejects_invalid_input_and_writes_nothing(
    admin_client: Client, value: str, error: str
) -> None:
    task = make_task()
    _, response = run_action(admin_client, "change_priority_selected", [task], priority=value)

    assert response.status_code == 200
    assert response.context["form"].errors["priority"] == [error]
    assert escape(error) in response.content.decode()
    assert Task.objects.get(pk=task.pk).priority == 100
    assert message_texts(response) == []


def test_delete_selected_is_not_offered(admin_client: Client) -> None:
    make_task()
    choices = dict(admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices)
    assert set(choices) == {
        "", "retry_now_selected", "cancel_selected", "change_priority_selected",
    }


# -- detail page -------------------------------------------------------------------------


def test_detail_page_shows_pretty_json_and_the_full_error(admin_client: Client) -> None:
    task = make_task(tasks.add, 1, 2)
    payload = {"user": {"id": 7, "tags": ["a", "é"]}}
    error = "ValueError: bad input\n\nTraceback (most recent call last):\n  File \"x.py\""
    Task.objects.filter(pk=task.pk).update(
        kwargs=payload, metadata={"trace": "abc"}, result=[1, 2], error_text=error,
        status=Status.FAILED,
    )

    content = admin_client.get(change_url(task)).content.decode()

    for value in ([1, 2], payload, {"trace": "abc"}):
        assert f"<pre>{escape(json.dumps(value, indent=2, ensure_ascii=False))}</pre>" in content
    assert f"<pre>{escape(error)}</pre>" in content


def test_priority_is_editable_only_while_the_task_waits(admin_client: Client) -> None:
    ready = make_task()
    running = make_task(status=Status.RUNNING, locked_by="w1")

    assert 'name="priority"' in admin_client.get(change_url(ready)).content.decode()
    running_page = admin_client.get(change_url(running)).content.decode()
    assert 'name="priority"' not in running_page
    assert 'name="_save"' not in running_page  # nothing to save

    response = admin_client.post(change_url(ready), {"priority": "180"})
    assert response.status_code == 302
    assert Task.objects.get(pk=ready.pk).priority == 180
    assert LogEntry.objects.get().get_change_message() == "Changed Priority."

    response = admin_client.post(change_url(ready), {"priority": "500"})
    assert response.status_code == 200  # the form again, with its error
    assert Task.objects.get(pk=ready.pk).priority == 180


def test_a_stale_page_cannot_change_a_task_that_started(admin_client: Client) -> None:
    task = make_task()
    admin_client.get(change_url(task))  # the page was shown while the task waited...
    Task.objects.filter(pk=task.pk).update(status=Status.RUNNING, locked_by="w1")  # ...then

    response = admin_client.post(change_url(task), {"priority": "180"})

    assert response.status_code == 302
    assert response.url == change_url(task)
    assert Task.objects.get(pk=task.pk).priority == 100
    assert message_texts(response) == [
        f"The task “{task}” is no longer waiting to run, so its priority was not changed."
    ]
    assert not LogEntry.objects.exists()


def test_the_guarded_update_has_the_last_word(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task starts between the admin reading it and writing the new priority."""
    task = make_task()
    read_while_waiting = TaskAdmin.get_object

    def get_object(*args: Any, **kwargs: Any) -> Task | None:
        obj = read_while_waiting(*args, **kwargs)
        Task.objects.filter(pk=task.pk).update(status=Status.RUNNING, locked_by="w1")
        return obj

    monkeypatch.setattr(TaskAdmin, "get_object", get_object)
    response = admin_client.post(change_url(task), {"priority": "180"})

    row = Task.objects.get(pk=task.pk)
    assert (row.status, row.priority, row.locked_by) == (Status.RUNNING, 100, "w1")
    assert "no longer waiting to run" in message_texts(response)[0]


def test_no_add_button_and_no_add_page(admin_client: Client) -> None:
    make_task()
    response = admin_client.get(CHANGELIST)
    assert not response.context["has_add_permission"]
    add_url = reverse("admin:django_pgtasks_task_add")
    assert add_url not in response.content.decode()
    assert admin_client.get(add_url).status_code == 403


def test_only_finished_tasks_can_be_deleted(admin_client: Client) -> None:
    waiting = make_task()
    done = make_task(status=Status.SUCCESSFUL)

    delete = "admin:django_pgtasks_task_delete"
    assert admin_client.get(reverse(delete, args=[waiting.pk])).status_code == 403
    assert admin_client.post(reverse(delete, args=[waiting.pk]), {"post": "yes"}).status_code == 403
    assert admin_client.post(reverse(delete, args=[done.pk]), {"post": "yes"}).status_code == 302
    assert list(Task.objects.values_list("pk", flat=True)) == [waiting.pk]


# -- view-only access --------------------------------------------------------------------


def test_view_only_user_sees_tasks_but_no_actions(viewer_client: Client) -> None:
    failed("ValueError: bad input")
    response = viewer_client.get(CHANGELIST)
    assert response.status_code == 200
    assert response.context["action_form"] is None
    assert 'name="action"' not in response.content.decode()


@pytest.mark.parametrize(
    ("action", "data"),
    [("retry_now_selected", {}), ("cancel_selected", {}),
     ("change_priority_selected", {"priority": "150"})],
)
def test_view_only_user_cannot_run_actions(
    viewer_client: Client, action: str, data: dict[str, str]
) -> None:
    ready = make_task()
    failed_task = failed("ValueError: bad input")

    chosen, confirmed = run_action(viewer_client, action, [ready, failed_task], **data)

    # Without the change permission there are no actions: both posts just show the list.
    for response in (chosen, confirmed):
        assert response.status_code == 200
        assert response.templates[0].name == "admin/django_pgtasks/task/change_list.html"
    rows = [Task.objects.get(pk=t.pk) for t in (ready, failed_task)]
    assert [(r.status, r.priority) for r in rows] == [(Status.READY, 100), (Status.FAILED, 100)]


def test_view_only_user_gets_a_read_only_detail_page(viewer_client: Client) -> None:
    task = make_task()
    page = viewer_client.get(change_url(task))
    assert page.status_code == 200
    assert 'name="priority"' not in page.content.decode()

    assert viewer_client.post(change_url(task), {"priority": "180"}).status_code == 403
    assert Task.objects.get(pk=task.pk).priority == 100


# -- times PostgreSQL holds and Python cannot -----------------------------------------------


@pytest.mark.parametrize(("column", "value", "shown"), [
    ("finished_at", "infinity", "infinity (out of range)"),
    ("finished_at", "-infinity", "-infinity (out of range)"),
    ("finished_at", "4000-01-01 00:00:00+00 BC", "4000-01-01 00:00:00+00 BC (out of range)"),
    ("finished_at", "10000-01-01 00:00:00+00", "10000-01-01 00:00:00+00 (out of range)"),
    ("started_at", "infinity", "infinity (out of range)"),
    ("created_at", "-infinity", "-infinity (out of range)"),
    ("locked_at", "-infinity", "-infinity (out of range)"),
    ("updated_at", "infinity", "infinity (out of range)"),
])
def test_a_time_out_of_pythons_range_is_shown_not_a_500(
        admin_client: Client, column: str, value: str, shown: str) -> None:
    task = make_task(tasks.noop)
    with connection.cursor() as cursor:  # as raw SQL would write it
        ended = "" if column == "finished_at" else "finished_at = now(), "
        cursor.execute(f"UPDATE pgtasks_task SET status = 'SUCCESSFUL', {ended}"
                       f"{column} = %s WHERE id = %s", [value, task.pk])
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert listed(response) == {task.pk}
    if column == "finished_at":  # a column of the list
        assert escape(shown) in response.content.decode()
    response = admin_client.get(change_url(task))
    assert response.status_code == 200
    assert escape(shown) in response.content.decode()
    response = admin_client.get(reverse("admin:django_pgtasks_task_dashboard"))
    assert response.status_code == 200
    # Outside the admin's pages, code that computes with times still gets the error.
    with pytest.raises(Exception, match=r"timestamp too (large|small)"):
        Task.objects.get(pk=task.pk)


def test_the_dashboard_reads_live_tasks_with_infinite_times(admin_client: Client) -> None:
    waiting, running = make_task(tasks.noop), make_task(tasks.noop)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task SET run_after = '-infinity' WHERE id = %s",
                       [waiting.pk])
        cursor.execute("UPDATE pgtasks_task SET status = 'RUNNING', locked_by = 'w', "
                       "locked_at = '-infinity' WHERE id = %s", [running.pk])
    response = admin_client.get(reverse("admin:django_pgtasks_task_dashboard"))
    assert response.status_code == 200
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    assert escape("-infinity (out of range)") in response.content.decode()
