"""The task admin on real PostgreSQL: summary, filters, search, guarded actions, permissions."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from django_pgtasks.admin import NAME_FILTER_SAMPLE, NameFilter, TaskAdmin
from django_pgtasks.models import Status, Task
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


@pytest.fixture
def viewer_client(client: Client) -> Client:
    """A staff member who may look at tasks but change nothing."""
    user = User.objects.create_user("viewer", password="unused", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_pgtasks", codename="view_task")
    )
    client.force_login(user)
    return client


# -- changelist summary ------------------------------------------------------------------


def test_summary_counts_tasks_per_name_and_status(admin_client: Client) -> None:
    ready = [make_task(), make_task()]
    running = make_task(status=Status.RUNNING, locked_by="w1")
    add_failed = failed("ValueError: bad input")

    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    rows = {row.name: row for row in response.context["task_summary"].rows}
    assert set(rows) == {"tests.testapp.tasks.noop", "tests.testapp.tasks.always_fails"}
    noop = rows["tests.testapp.tasks.noop"]
    by_status = dict(zip(Status.values, noop.cells, strict=True))
    assert (by_status["READY"].count, by_status["RUNNING"].count, noop.total) == (2, 1, 3)
    assert by_status["FAILED"].count == 0
    assert rows["tests.testapp.tasks.always_fails"].total == 1
    assert escape(by_status["READY"].url) in response.content.decode()

    # Each cell links to the changelist filtered to exactly its tasks.
    assert listed(admin_client.get(by_status["READY"].url)) == {t.pk for t in ready}
    assert listed(admin_client.get(by_status["RUNNING"].url)) == {running.pk}
    assert listed(admin_client.get(noop.url)) == {*(t.pk for t in ready), running.pk}
    failed_column = response.context["task_summary"].status_columns[Status.values.index("FAILED")]
    assert listed(admin_client.get(failed_column.url)) == {add_failed.pk}


def test_failures_that_differ_only_by_ids_form_one_error_group(admin_client: Client) -> None:
    order_41 = failed("LookupError: order 41 not found")
    order_977 = failed("LookupError: order 977 not found")
    lease_a = failed("LeaseLostError: lease 3f2a9c1e-0b7d-4c1e-9a55-1d2e3f4a5b6c lost")
    lease_b = failed("LeaseLostError: lease 0c9d8e7f-1a2b-4c3d-8e9f-a0b1c2d3e4f5 lost")
    failed("ValueError: bad input")
    # Same error, but still waiting for a retry: not a failure yet.
    make_task(status=Status.AWAITING_RETRY, error_text="LookupError: order 5 not found")

    response = admin_client.get(CHANGELIST)

    groups = {group.text: group for group in response.context["task_summary"].error_groups}
    assert {text: group.count for text, group in groups.items()} == {
        "LookupError: order N not found": 2,
        "LeaseLostError: lease N-N-N-N-N lost": 2,
        "ValueError: bad input": 1,
    }
    assert list(groups)[-1] == "ValueError: bad input"  # commonest first
    orders = groups["LookupError: order N not found"]
    assert escape(orders.url) in response.content.decode()

    filtered = admin_client.get(orders.url)
    assert listed(filtered) == {order_41.pk, order_977.pk}
    assert "LookupError: order N not found" in filtered.content.decode()  # the active filter
    leases = admin_client.get(groups["LeaseLostError: lease N-N-N-N-N lost"].url)
    assert listed(leases) == {lease_a.pk, lease_b.pk}


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


def test_summary_queries_are_skipped_when_an_action_redirects(admin_client: Client) -> None:
    task = make_task()
    ids = [task.pk]
    admin_client.post(CHANGELIST, {"action": "cancel_selected", "index": 0,
                                   "_selected_action": ids})
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.post(CHANGELIST, {"action": "cancel_selected",
                                                  "_selected_action": ids, "post": "yes"})
    assert response.status_code == 302
    sql = "\n".join(query["sql"] for query in captured.captured_queries)
    assert "regexp_replace" not in sql
    assert 'GROUP BY "pgtasks_task"."name"' not in sql


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
                                      max_attempts, error_text, metadata)
            SELECT 'tests.seeded.task_' || (i %% 50), 'default', '[]', '{}', 100,
                   'SUCCESSFUL', 1, 3, '', '{}'
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
    assert "Seq Scan" not in plan
    assert "Index Scan using pgtasks_task_pkey" in plan


def test_search_by_id_key_and_name(admin_client: Client) -> None:
    first, second, third = make_task(), make_task(), make_task(tasks.add, 1, 2)
    Task.objects.filter(pk=first.pk).update(key="invoice-2024-17")

    assert listed(admin_client.get(CHANGELIST, {"q": str(second.pk)})) == {second.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": f" {third.pk} "})) == {third.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": "invoice-2024-17"})) == {first.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": "invoice"})) == set()  # keys match exactly
    assert listed(admin_client.get(CHANGELIST, {"q": "tasks.add"})) == {third.pk}
    assert listed(admin_client.get(CHANGELIST, {"q": "9" * 30})) == set()


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
    assert 'name="post" value="yes"' in chosen.content.decode()
    assert confirmed.status_code == 302
    assert statuses(*selected) == ["READY", "READY", "RUNNING", "SUCCESSFUL"]
    assert Task.objects.get(pk=failed_task.pk).max_attempts == 4  # one more attempt
    assert message_texts(confirmed) == [
        "Retry now: 2 changed, 2 skipped (running or successful)."
    ]


def test_choosing_an_action_changes_nothing_until_confirmed(admin_client: Client) -> None:
    task = make_task()
    response = admin_client.post(
        CHANGELIST, {"action": "cancel_selected", "index": 0, "_selected_action": [task.pk]}
    )
    assert response.status_code == 200
    assert response.templates[0].name == TaskAdmin.action_confirmation_template
    assert statuses(task) == ["READY"]


def test_cancel_after_confirmation_skips_running_and_finished(admin_client: Client) -> None:
    ready = make_task()
    waiting = make_task(status=Status.AWAITING_RETRY, attempt=1)
    running = make_task(status=Status.RUNNING, locked_by="w1")
    succeeded = make_task(status=Status.SUCCESSFUL)
    selected = [ready, waiting, running, succeeded]

    _, confirmed = run_action(admin_client, "cancel_selected", selected)

    assert statuses(*selected) == ["CANCELLED", "CANCELLED", "RUNNING", "SUCCESSFUL"]
    assert message_texts(confirmed) == [
        "Cancel: 2 changed, 2 skipped (running or already finished)."
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
    assert message_texts(confirmed) == [
        "Retry now: 3 changed, 0 skipped (running or successful)."
    ]


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
    assert message_texts(confirmed) == [
        "Priority 150: 1 changed, 1 skipped (running or already finished)."
    ]


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
    assert response.context["task_summary"].error_groups


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
