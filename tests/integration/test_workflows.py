"""Workflows: chains, groups with a callback, dependencies (django_pgtasks.models.dependencies).

Workers run in threads here; tests/process/test_workflows.py runs them as processes, with
kill -9.
"""

from __future__ import annotations

import re
import threading
import uuid

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from django_pgtasks.database.schema import LIVE_TABLE
from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle.dependencies import PARENTS_PAGE
from django_pgtasks.lifecycle.release import release_all
from django_pgtasks.models import (
    ArchivedTask,
    Dependency,
    PendingRelease,
    Status,
    Task,
    WorkflowMember,
)
from django_pgtasks.patterns.retention import purge
from django_pgtasks.worker.loop import Worker
from django_pgtasks.workflows import chain, group
from tests.helpers import (
    large_seq_scans,
    nested_plans,
    rows_touched,
    run_workers,
    sparse_statistics,
    wait_until,
)
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain(threads: int = 4) -> None:
    """A burst worker: it releases the children of ended tasks on its loop, when idle."""
    assert Worker(concurrency=threads, burst=True).run(install_signals=False) == 0


def states(workflow) -> list[tuple[str, object]]:
    return [(t.status, t.result) for t in workflow.members().order_by("id")]


def ran_after(later: str, *earlier: str) -> bool:
    """Whether the run labelled ``later`` was logged after those labelled ``earlier``."""
    ids = dict(Execution.objects.values_list("worker", "id"))
    return all(ids[later] > ids[label] for label in earlier)


# -- chains -----------------------------------------------------------------------------------


def test_a_chain_runs_its_steps_in_order_each_reading_the_previous_result() -> None:
    workflow = chain(tasks.wf_add.build(1), tasks.wf_add.build(10),
                     tasks.wf_add.build(100)).enqueue()
    first, second, third = workflow.tasks
    assert [first.status, second.status, third.status] == [
        Status.READY, Status.WAITING, Status.WAITING]
    # A waiting task is not claimable.
    [claimed] = Task.objects.claim("w", limit=10)
    assert claimed.pk == first.pk
    Task.objects.filter(pk=first.pk).update(status=Status.READY, locked_by=None)
    drain()
    assert states(workflow) == [(Status.SUCCESSFUL, 1), (Status.SUCCESSFUL, 11),
                                (Status.SUCCESSFUL, 111)]
    assert {m.workflow_id for m in WorkflowMember.objects.all()} == {workflow.id}


@pytest.mark.parametrize(("policy", "ends"), [("skip", Status.CANCELLED),
                                              ("fail", Status.FAILED)])
def test_a_failed_step_stops_the_chain(policy: str, ends: str) -> None:
    workflow = chain(tasks.wf_step.build("a"), tasks.wf_step.build("b", fail=True),
                     tasks.wf_step.build("c"), tasks.wf_step.build("d"),
                     on_parent_failure=policy).enqueue()
    drain()
    a, b, c, d = workflow.members().order_by("id")
    assert (a.status, b.status, c.status, d.status) == (
        Status.SUCCESSFUL, Status.FAILED, ends, ends)
    assert c.error_text == (f"django_pgtasks.exceptions.ParentFailed: a task it depends on "
                            f"did not succeed (task {b.pk} ended FAILED).")
    assert f"task {c.pk} ended {ends}" in d.error_text
    assert c.finished_at is not None
    assert sorted(Execution.objects.values_list("worker", flat=True)) == ["a", "b"]


def test_run_anyway_runs_the_next_step_after_a_failure() -> None:
    workflow = chain(tasks.wf_step.build("a", fail=True), tasks.wf_collect.build(),
                     on_parent_failure="run").enqueue()
    drain()
    assert states(workflow) == [(Status.FAILED, None), (Status.SUCCESSFUL, [["FAILED", None]])]


# -- groups ------------------------------------------------------------------------------------


def test_a_group_callback_runs_once_with_every_members_outcome_in_order() -> None:
    members = [tasks.wf_step.build(f"m{i}", fail=i == 3) for i in range(6)]
    workflow = group(members, then=tasks.wf_collect.build()).enqueue()
    drain(threads=6)
    callback = workflow.tasks[-1]
    callback.refresh_from_db()
    assert callback.status == Status.SUCCESSFUL
    assert callback.result == [["FAILED", None] if i == 3 else ["SUCCESSFUL", f"m{i}"]
                               for i in range(6)]
    assert Execution.objects.filter(worker="callback").count() == 1
    assert ran_after("callback", *(f"m{i}" for i in range(6)))


def test_a_group_callback_that_needs_every_member_to_succeed_is_skipped() -> None:
    workflow = group([tasks.wf_step.build("a"), tasks.wf_step.build("b", fail=True)],
                     then=tasks.wf_collect.build(), on_parent_failure="skip").enqueue()
    drain()
    callback = workflow.members().get(pk=workflow.tasks[-1].pk)
    assert callback.status == Status.CANCELLED
    assert not Execution.objects.filter(worker="callback").exists()


def test_a_diamond_runs_in_order() -> None:
    workflow = chain(tasks.wf_step.build("a"),
                     group([tasks.wf_step.build("b"), tasks.wf_step.build("c")]),
                     tasks.wf_step.build("d")).enqueue()
    drain()
    assert [s for s, _ in states(workflow)] == [Status.SUCCESSFUL] * 4
    assert ran_after("b", "a")
    assert ran_after("c", "a")
    assert ran_after("d", "b", "c")
    d = workflow.tasks[-1]
    assert [p.name for p in Task.objects.parent_outcomes(d)] == [tasks.wf_step.name] * 2


def test_a_group_without_callback_and_nested_groups() -> None:
    inner = group([tasks.wf_step.build("x"), tasks.wf_step.build("y")],
                  then=tasks.wf_step.build("xy"))
    workflow = group([inner, tasks.wf_step.build("z")], then=tasks.wf_collect.build()).enqueue()
    drain()
    callback = Task.objects.get(pk=workflow.tasks[-1].pk)
    assert callback.result == [["SUCCESSFUL", "xy"], ["SUCCESSFUL", "z"]]
    assert ran_after("xy", "x", "y")
    assert ran_after("callback", "xy", "z")


# -- depends_on ----------------------------------------------------------------------------


def test_depends_on_a_finished_task_is_ready_at_commit() -> None:
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    drain()
    with transaction.atomic():
        child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent.pk])
        assert Task.objects.get(pk=child.pk).status == Status.WAITING  # until the commit
    assert Task.objects.get(pk=child.pk).status == Status.READY
    drain()
    assert Task.objects.get(pk=child.pk).result == 3


def test_depends_on_a_running_task_waits_for_its_end() -> None:
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    [claimed] = Task.objects.claim("w")
    child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
    assert Task.objects.get(pk=child.pk).status == Status.WAITING
    assert Task.objects.get(pk=parent.pk).has_dependents
    assert Task.objects.mark_succeeded(claimed, 1)
    # The end left a release mark; the workers release the child in their own transaction.
    assert Task.objects.get(pk=child.pk).status == Status.WAITING
    assert PendingRelease.objects.filter(parent_id=parent.pk, parent_status="SUCCESSFUL").exists()
    assert release_all("default") == 1
    assert Task.objects.get(pk=child.pk).status == Status.READY
    assert not PendingRelease.objects.exists()


def test_the_parent_ends_while_the_child_is_being_enqueued() -> None:
    """The write skew the commit-time check closes: the enqueuing transaction cannot see the
    parent's end, and the worker's transaction cannot see the child's edge."""
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    [claimed] = Task.objects.claim("w")
    with transaction.atomic():
        child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
        ended = threading.Thread(target=_succeed, args=(claimed,))
        ended.start()
        ended.join()  # committed: its trigger could not see the uncommitted edge
        assert Task.objects.get(pk=child.pk).status == Status.WAITING
    assert Task.objects.get(pk=child.pk).status == Status.READY


def test_a_parent_ending_at_the_childs_commit_waits_for_it_then_releases_it() -> None:
    """The other order: the commit-time check holds the parent's lock; the worker recording
    the parent's end waits for the commit, then sees the child's edge."""
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    [claimed] = Task.objects.claim("w")
    with transaction.atomic():
        child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
        with connection.cursor() as cursor:  # what COMMIT runs first, run now
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
        ended = threading.Thread(target=_succeed, args=(claimed,))
        ended.start()
        wait_until(_an_outcome_waits_for_a_lock, 30, "the outcome to wait for the lock")
        assert Task.objects.get(pk=child.pk).status == Status.WAITING
    ended.join()
    assert Task.objects.get(pk=parent.pk).status == Status.SUCCESSFUL
    release_all("default")
    assert Task.objects.get(pk=child.pk).status == Status.READY


def _succeed(task: Task) -> None:
    try:
        assert Task.objects.mark_succeeded(task, 1)
    finally:
        connections.close_all()


def _an_outcome_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the server keeps its first reading of pg_stat_activity.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database() "
                       "AND query LIKE '%UPDATE pgtasks_task t SET%'")
        return cursor.fetchone()[0] == 1


def _commit_check_locks(children: list, parents: list) -> int:
    """Enqueue ``children[i]`` waiting for ``parents[i]`` in one transaction; return how many
    times its commit-time check locked parents (auto_explain's plans of its statements)."""
    with transaction.atomic():
        Task.objects.enqueue_linked(children, parents)
        with nested_plans() as plans, connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
    return sum("FOR NO KEY UPDATE OF t" in plan for plan in plans)


def test_the_commit_check_of_a_fan_out_from_an_earlier_task_locks_it_once() -> None:
    """1,000 children of a task enqueued before: the check at their commit locks the parent
    (and opens a subtransaction) once, not once per child; each child still waits for it."""
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    children = [tasks.wf_add.build(i) for i in range(1000)]
    assert _commit_check_locks(children, [[parent]] * 1000) == 1
    assert Task.objects.get(pk=parent.pk).has_dependents
    assert set(WorkflowMember.objects.filter(task_id__in=[c.pk for c in children])
               .values_list("remaining", flat=True)) == {1}
    Task.objects.filter(pk=parent.pk).update(status=Status.SUCCESSFUL)
    release_all("default")
    assert Task.objects.filter(pk__in=[c.pk for c in children],
                               status=Status.READY).count() == 1000


def test_the_commit_check_still_counts_off_a_parent_that_ended_beside_a_remembered_one() -> None:
    """After children of a pending parent, a child of that parent *and* of one that has
    ended is checked in full: the ended parent is counted off, the pending one still counted;
    a child of the ended parent alone is counted off too, from the parent this transaction
    has locked and remembers, with no lock of its own."""
    pending = Task.objects.enqueue(tasks.wf_add, 1)
    ended = Task.objects.enqueue(tasks.wf_add, 2)
    Task.objects.filter(pk=ended.pk).update(status=Status.SUCCESSFUL)
    children = [tasks.wf_add.build(i) for i in range(3)]
    locks = _commit_check_locks(children, [[pending], [pending, ended], [ended]])
    assert locks == 2  # the first child, then the first child with the parent that ended
    remaining = dict(WorkflowMember.objects.filter(task_id__in=[c.pk for c in children])
                     .values_list("task_id", "remaining"))
    assert [remaining[c.pk] for c in children] == [1, 1, 0]
    assert [Task.objects.get(pk=c.pk).status for c in children] == [
        Status.WAITING, Status.WAITING, Status.READY]


def test_the_commit_check_of_a_fan_out_from_tasks_that_ended_locks_each_once() -> None:
    """300 children of a task that succeeded and 300 of one that failed, enqueued after
    they ended: the check at their commit locks each parent once, not once per child, and
    still counts each child off: the first become READY, the others end by their policy."""
    succeeded = Task.objects.enqueue(tasks.wf_add, 1)
    failed = Task.objects.enqueue(tasks.wf_add, 2)
    Task.objects.filter(pk=succeeded.pk).update(status=Status.SUCCESSFUL)
    Task.objects.filter(pk=failed.pk).update(status=Status.FAILED)
    children = [tasks.wf_add.build(i) for i in range(600)]
    assert _commit_check_locks(children, [[succeeded]] * 300 + [[failed]] * 300) == 2
    ids = [c.pk for c in children]
    assert Task.objects.filter(pk__in=ids[:300], status=Status.READY).count() == 300
    assert Task.objects.filter(pk__in=ids[300:], status=Status.CANCELLED,
                               error_text__contains=f"task {failed.pk} ended FAILED").count() \
        == 300
    assert set(WorkflowMember.objects.filter(task_id__in=ids)
               .values_list("remaining", flat=True)) == {0}


def status(task: Task) -> str:
    return Task.objects.get(pk=task.pk).status


def test_a_remembered_parent_that_the_transaction_reopens_is_waited_for_again() -> None:
    """The check remembers a parent it found ended, but reads its row again for each child:
    retried in the same transaction after a first child was counted off (and cancelled), the
    parent is waited for by the next child, and by the first, re-opened by the retry."""
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    Task.objects.filter(pk=parent.pk).update(status=Status.FAILED)
    first, second = tasks.wf_add.build(1), tasks.wf_add.build(2)
    with transaction.atomic():
        Task.objects.enqueue_linked([first], [[parent]])
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
            assert status(first) == Status.CANCELLED
            assert Task.objects.filter(pk=parent.pk).retry_now() == 1
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing DEFERRED")
        Task.objects.enqueue_linked([second], [[parent]])
    assert (status(parent), status(first), status(second)) == (
        Status.READY, Status.WAITING, Status.WAITING)


@pytest.mark.slow
def test_the_commit_check_reads_each_childs_own_edges_in_tables_analyzed_sparse() -> None:
    """Under statistics that scale a few live rows to the tables' many empty pages (see
    test_release), counting off 500 children of a task that ended reads each child's own
    edges, not the parent's 500 (nor the whole table) once per child."""
    sparse_statistics(2_000)
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    Task.objects.filter(pk=parent.pk).update(status=Status.SUCCESSFUL)
    children = [tasks.wf_add.build(i) for i in range(500)]
    with transaction.atomic():
        Task.objects.enqueue_linked(children, [[parent]] * 500)
        with nested_plans(analyze=True) as plans, connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
    assert len(plans) > 500  # each child's statements were seen
    assert rows_touched(plans) <= 10, max(plans, key=lambda p: rows_touched([p]))
    assert Task.objects.filter(pk__in=[c.pk for c in children], status=Status.READY).count() \
        == 500


def test_the_commit_check_remembers_only_the_most_recent_pending_parents() -> None:
    """100 children, each of its own earlier task: every child still waits for its parent,
    and the check's memory keeps the last 64 parents only (a list that only grew would make
    each check of a large enqueue read a longer one)."""
    parents = Task.objects.enqueue_many(tasks.wf_add.build(i) for i in range(100))
    children = [tasks.wf_add.build(i) for i in range(100)]
    with transaction.atomic():
        Task.objects.enqueue_linked(children, [[parent] for parent in parents])
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
            cursor.execute("SELECT current_setting('pgtasks.pending_parents')::bigint[]")
            remembered = cursor.fetchone()[0]
    assert remembered == [parent.pk for parent in reversed(parents)][:64]
    assert set(WorkflowMember.objects.filter(task_id__in=[c.pk for c in children])
               .values_list("remaining", flat=True)) == {1}
    assert Task.objects.filter(pk__in=[p.pk for p in parents], has_dependents=True).count() \
        == 100


def test_a_deleted_parent_counts_as_not_succeeded() -> None:
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
    Task.objects.filter(pk=parent.pk).delete()
    release_all("default")
    child.refresh_from_db()
    assert child.status == Status.CANCELLED
    assert f"task {parent.pk} ended DELETED" in child.error_text
    assert Task.objects.parent_outcomes(child)[0].status == "DELETED"


def test_a_parent_deleted_while_its_children_are_being_enqueued_counts_as_not_succeeded() -> None:
    """The check at the commit counts a parent deleted meanwhile (by another transaction) as
    DELETED: for the first child, which finds no row to lock, and for the next one, from the
    check's memory."""
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    children = [tasks.wf_add.build(i) for i in range(2)]

    def delete() -> None:
        try:
            Task.objects.filter(pk=parent.pk).delete()
        finally:
            connection.close()

    with transaction.atomic():
        Task.objects.enqueue_linked(children, [[parent]] * 2)
        deleted = threading.Thread(target=delete)
        deleted.start()
        deleted.join()  # committed
        with nested_plans() as plans, connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS pgtasks_member_committing IMMEDIATE")
    assert sum("FOR NO KEY UPDATE OF t" in plan for plan in plans) == 1
    for child in children:
        child.refresh_from_db()
        assert child.status == Status.CANCELLED
        assert f"task {parent.pk} ended DELETED" in child.error_text


def test_the_outcome_of_a_purged_parent_is_read_from_the_archive_else_from_its_edge(
        settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    kept, archived, gone = (Task.objects.enqueue(tasks.wf_add, n, queue="emails")
                            for n in (1, 2, 3))
    child = Task.objects.enqueue(tasks.wf_add, 0, queue="urgent",
                                 depends_on=[archived, gone, kept])
    assert Worker(queues=["emails"], burst=True).run(install_signals=False) == 0
    release_all("default")
    with connection.cursor() as cursor:  # archived and purged, as the purge does
        cursor.execute("UPDATE pgtasks_task SET finished_at = now() - interval '40 days' "
                       "WHERE id = ANY (%s)", [[archived.pk, gone.pk]])
    assert purge().archived == {"SUCCESSFUL": 2}
    ArchivedTask.objects.filter(pk=gone.pk).delete()
    assert [(p.id, p.name, p.status, p.result) for p in Task.objects.parent_outcomes(child)] \
        == [(archived.pk, tasks.wf_add.name, "SUCCESSFUL", 2), (gone.pk, "", "SUCCESSFUL", None),
            (kept.pk, tasks.wf_add.name, "SUCCESSFUL", 1)]
    assert Task.objects.parent_counts(child) == {"SUCCESSFUL": 3}


def test_a_purged_child_takes_its_edges_and_membership_along() -> None:
    workflow = chain(tasks.wf_add.build(1), tasks.wf_add.build(2)).enqueue()
    drain()
    with connection.cursor() as cursor:  # as the purge does: SQL, not the ORM
        cursor.execute("DELETE FROM pgtasks_task")
    assert not Dependency.objects.exists()
    assert not WorkflowMember.objects.filter(workflow_id=workflow.id).exists()


def test_the_task_table_can_still_be_truncated_alone() -> None:
    chain(tasks.wf_add.build(1), tasks.wf_add.build(2)).enqueue()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgtasks_task")
    assert not Dependency.objects.exists()
    assert not WorkflowMember.objects.exists()


# -- operators -------------------------------------------------------------------------------


def test_cancelling_a_workflow_cancels_its_waiting_members_and_runs_no_callback() -> None:
    workflow = group([tasks.wf_step.build("a"), tasks.wf_step.build("b")],
                     then=tasks.wf_collect.build()).enqueue()
    [running] = Task.objects.claim("w")
    result = workflow.cancel()
    assert (result.cancelled, result.stopping) == (2, 1)
    assert Task.objects.get(pk=running.pk).cancel_requested
    Task.objects.mark_cancelled(running)
    assert {t.status for t in workflow.members()} == {Status.CANCELLED}
    drain()
    assert not Execution.objects.exists()


def test_retrying_a_failed_member_reopens_the_callback() -> None:
    workflow = group([tasks.wf_step.build("a"), tasks.wf_step.build("b", fail=True)],
                     then=tasks.wf_collect.build()).enqueue()
    drain()
    failed, callback = workflow.tasks[1], workflow.tasks[2]
    assert Task.objects.get(pk=callback.pk).result == [["SUCCESSFUL", "a"], ["FAILED", None]]
    Task.objects.filter(pk=failed.pk).update(kwargs={"fail": False})
    assert Task.objects.filter(pk=failed.pk).retry_now() == 1
    reopened = Task.objects.get(pk=callback.pk)
    assert (reopened.status, reopened.attempt, reopened.result) == (Status.WAITING, 0, None)
    drain()
    assert Task.objects.get(pk=callback.pk).result == [["SUCCESSFUL", "a"], ["SUCCESSFUL", "b"]]
    assert Execution.objects.filter(worker="callback").count() == 2


def test_a_waiting_task_can_be_cancelled_and_reprioritized_not_made_due() -> None:
    parent = Task.objects.enqueue(tasks.wf_add, 1)
    child = Task.objects.enqueue(tasks.wf_add, 2, depends_on=[parent])
    assert Task.objects.filter(pk=child.pk).set_priority(150) == 1
    assert Task.objects.filter(pk=child.pk).retry_now() == 0
    assert Task.objects.filter(pk=child.pk).cancel() == 1
    drain()
    assert Task.objects.get(pk=parent.pk).status == Status.SUCCESSFUL
    assert Task.objects.get(pk=child.pk).status == Status.CANCELLED


# -- enqueueing: all or nothing, refused before SQL ------------------------------------------


def test_a_workflow_is_enqueued_with_the_callers_transaction() -> None:
    with transaction.atomic():
        chain(tasks.wf_add.build(1), tasks.wf_add.build(2)).enqueue()
        assert Dependency.objects.count() == 1
        transaction.set_rollback(True)
    assert not Task.objects.exists()
    assert not Dependency.objects.exists()
    assert not WorkflowMember.objects.exists()


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, depends_on=[10**9]),
     "depends_on names tasks that do not exist: 1000000000."),
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, depends_on=["7"]),
     "depends_on takes tasks or their ids, not str '7'."),
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, depends_on=[True]),
     "depends_on takes tasks or their ids, not bool True."),
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, depends_on=[Task.objects.build(
        tasks.wf_add, 1)]), "depends on an unsaved task"),
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, depends_on=[], on_parent_failure="retry"),
     "on_parent_failure must be one of run, skip, fail, not 'retry'."),
    (lambda: Task.objects.enqueue(tasks.wf_add, 1, key="k", depends_on=[]),
     "cannot have one"),
    (lambda: chain(tasks.wf_add.build(1), "tests.testapp.tasks.wf_add").enqueue(),
     "A workflow step is an unsaved task"),
    (lambda: group([]).enqueue(), "A group needs at least one member."),
    (lambda: chain(tasks.wf_add.build(1), tasks.wf_add.build({1, 2})).enqueue(), None),
], ids=["missing", "string", "bool", "unsaved", "policy", "key", "step", "empty", "payload"])
def test_bad_workflows_are_refused_before_anything_is_written(make, message) -> None:
    with transaction.atomic():
        Task.objects.enqueue(tasks.noop)
        with pytest.raises(InvalidTaskError) as caught:
            make()
        assert Task.objects.count() == 1  # the caller's transaction is usable, nothing else
    if message:
        assert message in str(caught.value)
    assert not Dependency.objects.exists()


def test_a_step_used_twice_and_a_circle_are_refused() -> None:
    step = tasks.wf_add.build(1)
    with pytest.raises(InvalidTaskError, match="appears twice"):
        chain(step, step).enqueue()
    a, b = tasks.wf_add.build(1), tasks.wf_add.build(2)
    with pytest.raises(InvalidTaskError, match="in a circle"):
        Task.objects.enqueue_linked([a, b], [[b], [a]])
    assert not Task.objects.exists()


def test_depends_on_joins_the_workflow_of_its_first_parent() -> None:
    workflow = chain(tasks.wf_add.build(1), tasks.wf_add.build(2)).enqueue()
    late = Task.objects.enqueue(tasks.wf_add, 3, depends_on=[workflow.tasks[-1]])
    assert late.workflow_id == workflow.id
    assert workflow.members().count() == 3
    alone = Task.objects.enqueue(tasks.wf_add, 4, depends_on=[Task.objects.enqueue(tasks.noop)])
    assert isinstance(alone.workflow_id, uuid.UUID)
    assert alone.workflow_id != workflow.id


# -- at scale, concurrently --------------------------------------------------------------------


@pytest.mark.slow
def test_a_1000_member_group_callback_runs_exactly_once_under_8_workers() -> None:
    members = [tasks.wf_step.build(f"m{i}") for i in range(1000)]
    workflow = group(members, then=tasks.wf_collect.build()).enqueue()
    workers = [Worker(concurrency=2, burst=True, worker_id=f"w{i}") for i in range(8)]
    run_workers(workers)
    callback = Task.objects.get(pk=workflow.tasks[-1].pk)
    assert callback.status == Status.SUCCESSFUL
    assert callback.result == [["SUCCESSFUL", f"m{i}"] for i in range(1000)]
    assert Execution.objects.filter(worker="callback").count() == 1
    assert Execution.objects.count() == 1001
    assert WorkflowMember.objects.get(task_id=callback.pk).remaining == 0


HISTORY_ROWS = 30_000
PARENTS = 3_000


@pytest.mark.slow
def test_reading_the_parents_of_a_large_join_touches_rows_per_parent_not_per_history_row() -> None:
    """A join of 3,000 parents, read beside 30,000 finished tasks of earlier work (analyzed):
    each statement reads the parents it returns (a probe of each partition's primary key per
    parent, a page of parents per statement), never the finished history in full, so that the
    read stays within a statement timeout however long the history grows."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      finished_at, result)
            SELECT 'tests.testapp.tasks.noop', 'default', '[]', '{}', 100,
                   CASE WHEN i %% 10 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END, 1, 3,
                   CASE WHEN i %% 10 = 0 THEN 'boom ' || i ELSE '' END, '{}', now(), now(),
                   to_jsonb(i)
            FROM generate_series(1, %s) AS i
            RETURNING id
            """,
            [HISTORY_ROWS + PARENTS],
        )
        parents = sorted(row[0] for row in cursor.fetchall())[-PARENTS:]
    child = tasks.noop.enqueue(depends_on=parents)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task; ANALYZE pgtasks_dependency")
    with nested_plans(analyze=True) as plans:
        outcomes = Task.objects.parent_outcomes(child)
        counts = Task.objects.parent_counts(child)
    assert [outcome.id for outcome in outcomes] == parents
    expected = Task.objects.filter(pk__in=parents).order_by("id")
    assert [(o.status, o.result, o.error_text) for o in outcomes] == [
        (t.status, t.result, t.error_text) for t in expected]
    assert counts == {"SUCCESSFUL": 2700, "FAILED": 300}
    # The reads of the parents (their edges apart): pages of PARENTS_PAGE, each row one probe.
    reads = [plan for plan in plans if "pgtasks_dependency" not in plan]
    assert len(reads) == 2 * PARENTS // PARENTS_PAGE, plans
    assert rows_touched(reads) <= PARENTS_PAGE, reads
    assert large_seq_scans("\n".join(reads)) == [], reads


WAITING_ROWS = 100_000


@pytest.mark.slow
def test_the_claim_never_reads_tasks_waiting_for_parents() -> None:
    """100,000 tasks waiting on parents and 1,000 ready ones: the claim reads the first rows
    of the claim index's range, which holds no waiting task, and touches a few pages."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after)
            SELECT 'tests.testapp.tasks.noop', 'default', '[]', '{}', 200,
                   CASE WHEN i <= %s THEN 'WAITING' ELSE 'READY' END, 0, 3, '', '{}',
                   now() - interval '1 day'
            FROM generate_series(1, %s) AS i
            """,
            [WAITING_ROWS, WAITING_ROWS + 1000],
        )
        cursor.execute("ANALYZE pgtasks_task")
    from django_pgtasks.lifecycle.claim import claim_statement

    with transaction.atomic():
        candidates = [Task.objects.claimable("default").select_for_update(skip_locked=True)
                      .values_list("id", "priority", "run_after")[:10]]
        sql, params = claim_statement(connection, LIVE_TABLE, candidates, 10)
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {sql}",
                           [*params, "w", "w"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    print(plan)
    assert "Index Scan using pgtasks_task_claim_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
    # The statement's own reads (the planner's catalog reads, first in a session, are not).
    buffers = [int(n) for n in re.findall(r"shared hit=(\d+)", plan.split("Planning:")[0])]
    assert max(buffers) < 200, plan


# -- django.tasks code ---------------------------------------------------------------------


def test_django_tasks_as_steps_of_a_group_with_a_callback() -> None:
    pytest.importorskip("django_pgtasks.definition.framework")
    from django_pgtasks.backend.workflows import step
    from tests.testapp import dj_tasks

    workflow = group([step(dj_tasks.dj_double, n) for n in (1, 2, 3)],
                     then=step(dj_tasks.dj_sum_of_parents)).enqueue()
    callback = dj_tasks.dj_sum_of_parents.get_result(str(workflow.tasks[-1].pk))
    assert callback.status == "READY"  # waiting for its parents: not started
    drain()
    callback.refresh()
    assert (callback.status, callback.return_value) == ("SUCCESSFUL", 12)


def test_a_django_task_of_another_backend_is_refused_as_a_step() -> None:
    pytest.importorskip("django_pgtasks.definition.framework")
    from django_pgtasks.backend.workflows import step
    from tests.testapp import dj_tasks

    with pytest.raises(InvalidTaskError, match="not a PgTasksBackend"):
        step(dj_tasks.dj_double.using(backend="immediate"), 1)


# -- the test helpers, inside a test's transaction -------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_run_eagerly_runs_a_chain_in_order_inside_the_tests_transaction() -> None:
    from django_pgtasks.testing import run_eagerly

    with run_eagerly():
        workflow = chain(tasks.wf_add.build(1), tasks.wf_add.build(10)).enqueue()
        late = Task.objects.enqueue(tasks.wf_add, 100, depends_on=[workflow.tasks[-1]])
    assert states(workflow) == [(Status.SUCCESSFUL, 1), (Status.SUCCESSFUL, 11),
                                (Status.SUCCESSFUL, 111)]
    assert Task.objects.get(pk=late.pk).result == 111


@pytest.mark.slow
def test_children_enqueued_while_their_parents_run_and_end_are_all_released() -> None:
    """Four threads enqueue children of random parents (waiting, running or ended) while two
    workers run those parents: every child is released once its parents have ended, and no
    enqueuer ever waits on a worker or fails."""
    parents = Task.objects.enqueue_many(tasks.sleepy.build(0.005) for _ in range(200))
    ids = [task.pk for task in parents]
    errors: list[BaseException] = []
    children: list[int] = []
    lock = threading.Lock()

    def enqueue(seed: int) -> None:
        import random

        rng = random.Random(seed)
        try:
            for _ in range(60):
                picked = rng.sample(ids, rng.randint(1, 3))
                child = Task.objects.enqueue(tasks.wf_collect, depends_on=picked)
                with lock:
                    children.append(child.pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    enqueuers = [threading.Thread(target=enqueue, args=(seed,)) for seed in range(4)]
    for thread in enqueuers:
        thread.start()
    workers = [Worker(concurrency=4, worker_id=f"w{i}") for i in range(2)]
    run_workers(workers, until=lambda: not any(t.is_alive() for t in enqueuers) and not (
        Task.objects.exclude(status=Status.SUCCESSFUL).exists()))
    assert not errors, errors
    assert len(children) == 240
    assert set(Task.objects.filter(pk__in=children).values_list("status", flat=True)) == {
        Status.SUCCESSFUL}
    assert not WorkflowMember.objects.exclude(remaining=0).exists()
    assert not Dependency.objects.filter(resolved=False).exists()
    # Each child ran once, after every one of its parents had ended.
    assert Execution.objects.filter(worker="callback").count() == 240


def test_a_release_held_up_by_a_lock_never_holds_up_the_parents_end(monkeypatch, caplog) -> None:
    """Another transaction holds the child's member row: the parent's end is recorded at once
    (it only leaves a mark); the release times out on the lock, is logged and given a
    back-off, and releases the child once the lock is gone; nothing runs twice."""
    import logging

    from django_pgtasks.lifecycle import release

    monkeypatch.setattr(release, "LOCK_TIMEOUT_SQL", "SET LOCAL lock_timeout = '100ms'")
    workflow = chain(tasks.wf_step.build("a"), tasks.wf_step.build("b")).enqueue()
    first, second = workflow.tasks
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pgtasks_workflow_member WHERE task_id = %s FOR UPDATE",
                           [second.pk])
        with caplog.at_level(logging.WARNING, logger="django_pgtasks.worker"):
            drain(threads=1)  # the burst worker stops: the only release due is backing off
        assert "lock timeout" in caplog.text
        assert Task.objects.get(pk=first.pk).status == Status.SUCCESSFUL
        assert Task.objects.get(pk=second.pk).status == Status.WAITING
        mark = PendingRelease.objects.get(parent_id=first.pk)
        assert mark.failures == 1
        assert "lock timeout" in mark.last_error
        assert mark.due_at > mark.created_at
    finally:
        holder.close()
    PendingRelease.objects.update(due_at=Now())  # its back-off, cut short
    drain(threads=1)
    assert [t.status for t in workflow.members().order_by("id")] == [Status.SUCCESSFUL] * 2
    assert sorted(Execution.objects.values_list("worker", flat=True)) == ["a", "b"]
