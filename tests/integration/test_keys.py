"""Deduplication keys and re-run on update (pattern 8), under concurrency."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_pgtasks import InvalidTaskError
from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    assert Worker(concurrency=2, burst=True).run(install_signals=False) == 0


def test_a_waiting_key_stays_one_task_and_takes_the_new_request() -> None:
    first = Task.objects.enqueue(tasks.add, 1, 2, key="sum", priority=50, delay=60)
    assert first.deduplicated is False
    again = Task.objects.enqueue(tasks.add, 3, 4, key="sum", priority=20)
    assert again.deduplicated is True
    assert again.pk == first.pk
    [row] = Task.objects.all()
    assert row.args == [3, 4]  # the latest arguments
    assert row.priority == 50  # the higher priority of the two
    assert row.run_after < first.run_after  # the earlier time: now, not in a minute
    assert row.status == Status.READY


def test_a_finished_key_becomes_new_again() -> None:
    first = Task.objects.enqueue(tasks.add, 1, 1, key="k")
    drain()
    assert Task.objects.get(pk=first.pk).status == Status.SUCCESSFUL
    second = Task.objects.enqueue(tasks.add, 2, 2, key="k")
    assert (second.deduplicated, second.pk != first.pk) == (False, True)
    drain()
    assert Task.objects.get(pk=second.pk).result == 4


def test_a_key_enqueued_while_its_task_runs_runs_once_more_after() -> None:
    task = Task.objects.enqueue(tasks.log_execution, key="reindex:doc:42")
    [running] = Task.objects.claim("w")  # the attempt is under way...
    again = Task.objects.enqueue(tasks.log_execution, key="reindex:doc:42")
    assert (again.pk, again.deduplicated, again.rerun_requested) == (task.pk, True, True)
    assert Task.objects.mark_succeeded(running) is True  # ...and finishes
    row = Task.objects.get(pk=task.pk)
    assert (row.status, row.attempt, row.rerun_requested) == (Status.READY, 0, False)
    drain()  # the one more run
    row.refresh_from_db()
    assert (row.status, row.attempt) == (Status.SUCCESSFUL, 1)
    assert Execution.objects.filter(task_id=task.pk).count() == 1  # the drained run


def test_a_failing_attempt_with_a_rerun_request_runs_again_with_fresh_attempts() -> None:
    task = Task.objects.enqueue(tasks.noop, key="k", max_attempts=1)
    [running] = Task.objects.claim("w")
    Task.objects.enqueue(tasks.noop, key="k")
    assert Task.objects.mark_failed(running, "boom", retry_delay=None) is True
    row = Task.objects.get(pk=task.pk)
    assert (row.status, row.attempt) == (Status.READY, 0)
    assert [e["attempt"] for e in row.errors] == [1]


def test_a_key_held_by_a_live_task_of_another_name_is_refused() -> None:
    Task.objects.enqueue(tasks.noop, key="shared")
    with pytest.raises(InvalidTaskError, match="belongs to a live task of another task name"):
        Task.objects.enqueue(tasks.add, 1, 2, key="shared")
    assert Task.objects.count() == 1


@pytest.mark.parametrize("bad", ["", "x" * 256, 42, "nul\x00"])
def test_invalid_keys_are_refused(bad) -> None:
    with pytest.raises(InvalidTaskError, match="key must be a string of 1 to 255"):
        Task.objects.enqueue(tasks.noop, key=bad)
    assert not Task.objects.exists()


def test_16_concurrent_enqueuers_of_one_key_make_one_live_task() -> None:
    barrier = threading.Barrier(16)
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []

    def enqueue(i: int) -> None:
        try:
            barrier.wait()
            for j in range(20):
                task = Task.objects.enqueue(tasks.add, i, j, key="hot")
                results.append((task.pk, task.deduplicated))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert Task.objects.count() == 1
    assert {pk for pk, _ in results} == {Task.objects.get().pk}
    assert sum(1 for _, dedup in results if not dedup) == 1  # exactly one insert


def test_concurrent_reenqueues_while_running_give_exactly_one_more_run() -> None:
    """Updates racing a running attempt: it finishes, then the task runs once more."""
    task = Task.objects.enqueue(tasks.log_execution, key="doc")
    [running] = Task.objects.claim("w")
    barrier = threading.Barrier(8)

    def enqueue() -> None:
        try:
            barrier.wait()
            Task.objects.enqueue(tasks.log_execution, key="doc")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Task.objects.count() == 1
    Task.objects.mark_succeeded(running)
    drain()
    row = Task.objects.get(pk=task.pk)
    assert (row.status, row.attempt) == (Status.SUCCESSFUL, 1)
    assert Execution.objects.filter(task_id=task.pk).count() == 1  # one more run, not eight


def test_keys_work_with_delays() -> None:
    task = Task.objects.enqueue(tasks.noop, key="later", delay=timedelta(hours=1))
    assert task.run_after - task.created_at == timedelta(hours=1)


def test_retry_now_leaves_a_finished_task_whose_key_is_live_again() -> None:
    old = Task.objects.enqueue(tasks.noop, key="k")
    Task.objects.filter(pk=old.pk).update(status=Status.FAILED)
    new = Task.objects.enqueue(tasks.noop, key="k")
    assert Task.objects.filter(pk__in=[old.pk, new.pk]).retry_now() == 1  # only the new one
    assert Task.objects.get(pk=old.pk).status == Status.FAILED


def test_a_pipeline_stage_cannot_have_a_key() -> None:
    from django_pgtasks.definition.registry import TaskContext

    task = Task.objects.enqueue(tasks.noop)
    task.followups = []
    with pytest.raises(InvalidTaskError, match="cannot have a deduplication key"):
        TaskContext(task=task, worker_id="w").then(tasks.noop, key="k")
