"""The admin side of workflows on real PostgreSQL: a task's "Workflow" fieldset, the workflow
filter of the task list, and the dashboard's workflows with their groups' callbacks."""

from __future__ import annotations

import html
import json
import re
import uuid
from typing import Any

import pytest
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.http import urlencode

from django_pgtasks.admin.workflow_panel import MAX_LISTED
from django_pgtasks.lifecycle.release import release_all
from django_pgtasks.models import Status, Task
from django_pgtasks.monitoring import dashboard
from django_pgtasks.worker.loop import Worker
from django_pgtasks.workflows import chain, group
from tests.helpers import large_seq_scans
from tests.testapp import tasks

# Workers run the workflows: their outcomes must be committed for the next task to see them.
pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:django_pgtasks_task_changelist")
DASHBOARD = reverse("admin:django_pgtasks_task_dashboard")
WORKFLOW_HEADING = 'class="fieldset-heading">Workflow</h2>'
ITEM = re.compile(r'<li data-task="(\d+)" data-status="(\w+)">(.*?)</li>', re.S)


def change_url(task: Task | int) -> str:
    return reverse("admin:django_pgtasks_task_change", args=[getattr(task, "pk", task)])


def workflow_url(workflow_id: uuid.UUID, **params: Any) -> str:
    return f"{CHANGELIST}?{urlencode({'workflow': workflow_id, **params})}"


def drain() -> None:
    assert Worker(concurrency=2, burst=True).run(install_signals=False) == 0


def page(client: Client, task: Task) -> str:
    response = client.get(change_url(task))
    assert response.status_code == 200
    return response.content.decode()


def listed_tasks(content: str, kind: str) -> list[tuple[int, str, str]]:
    """(task id, status, the item's HTML) of the ``kind`` list ("parents" or "dependents")
    of a task's page; empty when the page has no such list."""
    found = re.search(rf'<ul class="pgtasks-{kind}">(.*?)</ul>', content, re.S)
    if found is None:
        return []
    return [(int(pk), status, item) for pk, status, item in ITEM.findall(found.group(1))]


def more_link(content: str, kind: str) -> str | None:
    found = re.search(rf'<ul class="pgtasks-{kind}">.*?<li class="more"><a href="([^"]+)">'
                      rf"and (\d+) more</a></li></ul>", content, re.S)
    return f"{html.unescape(found.group(1))}#{found.group(2)}" if found else None


def listed(response: HttpResponse) -> set[int]:
    return {task.pk for task in response.context["cl"].result_list}


def group_with_callback(size: int, fail: tuple[int, ...] = ()) -> tuple[Any, list[Task], Task]:
    workflow = group([tasks.wf_step.build(f"m{i}", fail=i in fail) for i in range(size)],
                     then=tasks.wf_collect.build()).enqueue()
    *members, callback = workflow.tasks
    return workflow, members, callback


# -- a task's page ---------------------------------------------------------------------------


def test_a_callbacks_page_lists_its_group_members_and_their_states(admin_client: Client) -> None:
    workflow, members, callback = group_with_callback(3, fail=(1,))
    Task.objects.enqueue(tasks.noop)  # no part of it

    content = page(admin_client, callback)
    assert WORKFLOW_HEADING in content
    assert f'<a href="{html.escape(workflow_url(workflow.id))}" class="pgtasks-workflow">' \
           f"{workflow.id}</a>" in content
    assert 'data-remaining="3" data-parents="3">Waiting for 3 of 3 parents.' in content
    assert "If a parent does not succeed: run anyway." in content
    parents = listed_tasks(content, "parents")
    assert [(pk, status) for pk, status, _ in parents] == [
        (m.pk, Status.READY) for m in members]
    for member, (_, _, item) in zip(members, parents, strict=True):
        assert f'<a href="{change_url(member)}">{tasks.wf_step.name} #{member.pk}</a> — Ready' \
               == item
    assert listed_tasks(content, "dependents") == []

    drain()

    content = page(admin_client, callback)
    assert [(pk, status) for pk, status, _ in listed_tasks(content, "parents")] == [
        (members[0].pk, Status.SUCCESSFUL), (members[1].pk, Status.FAILED),
        (members[2].pk, Status.SUCCESSFUL)]
    assert 'data-remaining="0" data-parents="3">All 3 parents have ended.' in content


def test_a_members_page_links_to_its_callback(admin_client: Client) -> None:
    workflow, members, callback = group_with_callback(2)

    content = page(admin_client, members[0])

    [(pk, status, item)] = listed_tasks(content, "dependents")
    assert (pk, status) == (callback.pk, Status.WAITING)
    assert f'<a href="{change_url(callback)}">{tasks.wf_collect.name} #{callback.pk}</a>' in item
    assert listed_tasks(content, "parents") == []
    assert "No parents: it waits for nothing." in content
    assert html.escape(workflow_url(workflow.id)) in content


def test_a_task_that_others_wait_for_shows_them_without_a_workflow_of_its_own(
    admin_client: Client,
) -> None:
    parent = Task.objects.enqueue(tasks.noop)
    child = Task.objects.enqueue(tasks.noop, depends_on=[parent])

    content = page(admin_client, parent)

    assert WORKFLOW_HEADING in content
    assert [(pk, status) for pk, status, _ in listed_tasks(content, "dependents")] == [
        (child.pk, Status.WAITING)]
    assert 'class="pgtasks-workflow"' not in content  # it belongs to none


def test_a_task_outside_workflows_has_no_workflow_fieldset(admin_client: Client) -> None:
    task = Task.objects.enqueue(tasks.noop)
    content = page(admin_client, task)
    assert WORKFLOW_HEADING not in content
    assert "pgtasks-parents" not in content


def test_a_parent_that_is_gone_shows_how_it_ended(admin_client: Client) -> None:
    gone, staying = Task.objects.enqueue(tasks.noop), Task.objects.enqueue(tasks.noop)
    child = Task.objects.enqueue(tasks.noop, depends_on=[gone, staying])
    Task.objects.filter(pk=gone.pk).update(status=Status.SUCCESSFUL)  # its edge records it
    Task.objects.filter(pk=gone.pk).delete()
    release_all("default")  # what the workers do: the end recorded on its edge

    content = page(admin_client, child)

    [first, second] = listed_tasks(content, "parents")
    assert first == (gone.pk, Status.SUCCESSFUL,
                     f"task #{gone.pk} (no longer in the table) — ended Successful")
    assert f'href="{change_url(gone)}"' not in content
    assert second[:2] == (staying.pk, Status.READY)
    assert f'href="{change_url(staying)}"' in second[2]
    assert 'data-remaining="1" data-parents="2">Waiting for 1 of 2 parents.' in content
    assert "If a parent does not succeed: skip (cancelled)." in content


def test_long_lists_stop_at_the_limit_and_link_to_the_workflow(
    admin_client: Client, django_assert_max_num_queries: Any,
) -> None:
    extra = 5
    head = tasks.wf_step.build("head")
    members = [tasks.wf_step.build(f"m{i}") for i in range(MAX_LISTED + extra)]
    callback = tasks.wf_collect.build()
    workflow = chain(head, group(members, then=callback)).enqueue()

    callback_page = page(admin_client, callback)
    parents = listed_tasks(callback_page, "parents")
    assert [pk for pk, _, _ in parents] == [m.pk for m in members[:MAX_LISTED]]
    assert more_link(callback_page, "parents") == f"{workflow_url(workflow.id)}#{extra}"
    assert "Waiting for 55 of 55 parents." in callback_page

    head_page = page(admin_client, head)
    dependents = listed_tasks(head_page, "dependents")
    assert [pk for pk, _, _ in dependents] == [m.pk for m in members[:MAX_LISTED]]
    assert more_link(head_page, "dependents") == f"{workflow_url(workflow.id)}#{extra}"

    # However long the lists, the pages cost a count more at most (the page cache is warm
    # here: CHANGE_PAGE_QUERIES counts a cold lookup that these pages no longer make).
    with django_assert_max_num_queries(CHANGE_PAGE_QUERIES):
        admin_client.get(change_url(callback))
    with django_assert_max_num_queries(CHANGE_PAGE_QUERIES):
        admin_client.get(change_url(head))


#: Queries of the page of a task with parents and dependents, measured: the session, the
#: user, the task, its member row, its parents, its dependents, and the content type the
#: admin looks up once per process.
CHANGE_PAGE_QUERIES = 7


def test_the_workflow_part_of_a_page_costs_at_most_three_queries(admin_client: Client) -> None:
    plain = Task.objects.enqueue(tasks.noop)
    _, members, callback = group_with_callback(3)
    first_step = chain(tasks.wf_step.build("a"), tasks.wf_step.build("b")).enqueue().tasks[0]

    def queries(task: Task) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(change_url(task)).status_code == 200
        return len(captured)

    queries(plain)  # the admin's once-per-process lookups
    base = queries(plain)  # with the member row's lookup, which finds none
    assert queries(members[0]) == base + 2  # its parents (none) and dependents
    assert queries(callback) == base + 1  # its parents; nothing has it as a parent
    assert queries(first_step) == base + 2
    assert queries(callback) < CHANGE_PAGE_QUERIES


# -- the workflow filter ---------------------------------------------------------------------


def test_the_workflow_filter_lists_exactly_the_members(admin_client: Client) -> None:
    workflow, members, callback = group_with_callback(3)
    other = chain(tasks.wf_step.build("a"), tasks.wf_step.build("b")).enqueue()
    Task.objects.enqueue(tasks.noop)

    response = admin_client.get(CHANGELIST, {"workflow": str(workflow.id)})

    assert response.status_code == 200
    assert listed(response) == {task.pk for task in [*members, callback]}
    assert listed(admin_client.get(CHANGELIST, {"workflow": str(other.id)})) == {
        task.pk for task in other.tasks}
    # Shown in the sidebar while active only: the workflows are never listed.
    assert 'data-pgtasks-filter="workflow"' in response.content.decode()
    unfiltered = admin_client.get(CHANGELIST)
    assert len(listed(unfiltered)) == 7
    assert 'data-pgtasks-filter="workflow"' not in unfiltered.content.decode()


@pytest.mark.parametrize("value", [
    "not-a-uuid", "123", "x" * 200, "'; DROP TABLE pgtasks_workflow_member; --",
    "00000000-0000-0000-0000-00000000000g",
])
def test_a_bad_workflow_value_is_an_invalid_filter_not_a_server_error(
    admin_client: Client, value: str,
) -> None:
    workflow, _, _ = group_with_callback(2)
    response = admin_client.get(CHANGELIST, {"workflow": value})
    assert response.status_code == 302
    assert response.url.endswith("?e=1")
    assert Task.objects.filter(workflow_member__workflow_id=workflow.id).count() == 3


def test_a_workflow_value_with_nul_is_refused_and_an_unknown_one_lists_nothing(
    admin_client: Client,
) -> None:
    workflow, _, _ = group_with_callback(2)
    assert admin_client.get(CHANGELIST, {"workflow": f"{workflow.id}\x00"}).status_code == 400
    response = admin_client.get(CHANGELIST, {"workflow": str(uuid.uuid4())})
    assert (response.status_code, listed(response)) == (200, set())


# -- the dashboard ---------------------------------------------------------------------------


def workflow_rows(client: Client) -> tuple[list[dict[str, Any]], str]:
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    [section] = response.context["sections"]
    return section.workflows, " ".join(response.content.decode().split())


def test_the_dashboard_shows_a_group_and_links_its_callback(admin_client: Client) -> None:
    workflow, _, callback = group_with_callback(3, fail=(2,))
    steps = chain(tasks.wf_step.build("a"), tasks.wf_step.build("b")).enqueue()

    rows, content = workflow_rows(admin_client)

    # The most recent first; a chain's steps wait for one task each: no callback.
    assert [row["row"].id for row in rows] == [steps.id, workflow.id]
    chain_row, group_row = rows
    assert chain_row["callbacks"] == []
    assert chain_row["row"].counts == {Status.READY: 1, Status.WAITING: 1}
    assert group_row["row"].counts == {Status.READY: 3, Status.WAITING: 1}
    [entry] = group_row["callbacks"]
    assert (entry["task"].id, entry["task"].parents, entry["task"].ended) == (
        callback.pk, 3, 0)
    assert (f'<a class="callback" data-task="{callback.pk}" href="{change_url(callback)}">'
            f"{tasks.wf_collect.name} #{callback.pk}</a> (waiting for parents, 0 of 3 parents "
            f"ended)") in content
    assert f'<a href="{html.escape(workflow_url(workflow.id))}"><code>{workflow.id}</code></a>' \
           in content

    drain()

    rows, content = workflow_rows(admin_client)
    group_row = rows[1]
    assert group_row["row"].counts == {Status.SUCCESSFUL: 3, Status.FAILED: 1}
    assert [(c["task"].ended, c["task"].parents) for c in group_row["callbacks"]] == [(3, 3)]
    assert "(successful, 3 of 3 parents ended)" in content
    failed_url = html.escape(workflow_url(workflow.id, status__exact=Status.FAILED))
    assert f'data-status="FAILED" href="{failed_url}">Failed: 1</a>' in content


def test_the_dashboard_lists_the_most_recent_workflows_by_their_newest_member(
    admin_client: Client,
) -> None:
    flows = [chain(tasks.wf_step.build(f"{i}a"), tasks.wf_step.build(f"{i}b")).enqueue()
             for i in range(dashboard.MAX_WORKFLOWS + 3)]
    # A task that joins the oldest workflow makes it the most recent one.
    Task.objects.enqueue(tasks.noop, depends_on=[flows[0].tasks[-1]])

    rows, _ = workflow_rows(admin_client)

    expected = [flows[0], *reversed(flows[4:])]
    assert [row["row"].id for row in rows] == [flow.id for flow in expected]
    assert len(rows) == dashboard.MAX_WORKFLOWS
    assert rows[0]["row"].total == 3


def test_callbacks_listed_per_workflow_are_bounded(admin_client: Client) -> None:
    extra = 2
    nested = group([group([tasks.wf_step.build(f"{i}{j}") for j in range(2)],
                          then=tasks.wf_step.build(f"cb{i}"))
                    for i in range(dashboard.MAX_WORKFLOW_CALLBACKS + extra)])
    workflow = nested.enqueue()

    [row], content = workflow_rows(admin_client)

    callbacks = [t for t in workflow.tasks if t.args[0].startswith("cb")]
    assert [c["task"].id for c in row["callbacks"]] == [
        t.pk for t in callbacks[: dashboard.MAX_WORKFLOW_CALLBACKS]]
    assert row["more_callbacks"] == extra
    assert f'<a href="{html.escape(workflow_url(workflow.id))}">and {extra} more</a>' in content


def test_the_dashboard_says_when_there_is_no_workflow(admin_client: Client) -> None:
    Task.objects.enqueue(tasks.noop)
    rows, content = workflow_rows(admin_client)
    assert rows == []
    assert "No workflow: no task waits for another." in content


#: Queries of the dashboard of one database with tasks and workflows, measured: 16 when no
#: workflow is found (one query of the section, one of the pending releases, one count of
#: a table this small), two more however many are.
DASHBOARD_QUERIES = 18


def test_the_dashboard_costs_the_same_queries_however_many_workflows(
    admin_client: Client, django_assert_max_num_queries: Any,
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(DASHBOARD).status_code == 200
        return len(captured)

    Task.objects.enqueue(tasks.noop)  # the other sections read the same with tasks
    none = queries()
    group_with_callback(2)
    one = queries()
    assert one == none + 2  # the members per state, the callbacks
    for _ in range(6):
        group_with_callback(2)
        chain(tasks.wf_step.build("a"), tasks.wf_step.build("b")).enqueue()
    assert queries() == one
    with django_assert_max_num_queries(DASHBOARD_QUERIES):
        admin_client.get(DASHBOARD)


def explain(sql: str, params: Any) -> dict[str, Any]:
    """The executed plan of ``sql``, as PostgreSQL's JSON."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) "
                       f"{sql}", params)
        (plan,) = cursor.fetchone()
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in nodes(child))]


def rows_read(plan: dict[str, Any], index: str) -> int:
    """Index entries the scans of ``index`` read in all (kept or filtered out)."""
    return sum(round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
                     * node["Actual Loops"])
               for node in nodes(plan) if node.get("Index Name") == index)


@pytest.mark.slow
def test_the_dashboard_reads_the_recent_workflows_not_the_member_table() -> None:
    """50,000 member rows in 10,000 workflows of five: finding the 20 most recent reads the
    newest 100 entries of the member table's primary key; their counts and callbacks read
    the workflow index."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      finished_at)
            SELECT 'n', 'default', '[]', '{}', 100, 'SUCCESSFUL', 1, 3, '', '{}', now(), now()
            FROM generate_series(1, 50000)
        """)
        # Five members a workflow; each member waits for the ones before it.
        cursor.execute("""
            INSERT INTO pgtasks_workflow_member (task_id, workflow_id, remaining,
                                                 on_parent_failure, created_at)
            SELECT id, md5(((row_number() OVER (ORDER BY id) - 1) / 5)::text)::uuid, 0, 'run',
                   now()
            FROM pgtasks_task
        """)
        cursor.execute("""
            INSERT INTO pgtasks_dependency (child_id, parent_id, resolved, parent_status)
            SELECT c.task_id, p.task_id, true, 'SUCCESSFUL'
            FROM pgtasks_workflow_member c
            JOIN pgtasks_workflow_member p
              ON p.workflow_id = c.workflow_id AND p.task_id < c.task_id
        """)
        for table in ("pgtasks_task", "pgtasks_workflow_member", "pgtasks_dependency"):
            cursor.execute(f"ANALYZE {table}")

    recent = explain(dashboard.RECENT_WORKFLOWS_SQL, {"limit": dashboard.MAX_WORKFLOWS})
    assert not [n for n in nodes(recent) if n["Node Type"] == "Seq Scan"], recent
    read = rows_read(recent, "pgtasks_workflow_member_pkey")
    assert 96 <= read <= 100, recent

    rows = dashboard.recent_workflows("default")
    assert len(rows) == dashboard.MAX_WORKFLOWS
    assert [row.counts for row in rows] == [{"SUCCESSFUL": 5}] * dashboard.MAX_WORKFLOWS
    assert [[(c.parents, c.ended) for c in row.callbacks] for row in rows] == [
        [(2, 2), (3, 3), (4, 4)]] * dashboard.MAX_WORKFLOWS

    ids = [row.id for row in rows]
    for sql, params in [
        (dashboard.WORKFLOW_COUNTS_SQL, {"workflows": ids}),
        (dashboard.WORKFLOW_CALLBACKS_SQL,
         {"workflows": ids, "limit": dashboard.MAX_WORKFLOW_CALLBACKS}),
    ]:
        plan = explain(sql, params)
        assert not large_seq_scans(nodes(plan)), plan
        assert any("pgtasks_workflow_member_workflow_id" in n.get("Index Name", "")
                   for n in nodes(plan)), plan


def test_a_waiting_tasks_priority_can_be_changed_on_its_page(admin_client: Client) -> None:
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
    assert 'name="priority"' in admin_client.get(change_url(child)).content.decode()
    response = admin_client.post(change_url(child), {"priority": "180"})
    assert response.status_code == 302
    assert Task.objects.get(pk=child.pk).priority == 180
    assert Task.objects.get(pk=child.pk).status == Status.WAITING
