"""The correctness test from the patterns: N tasks, many concurrent workers, each task run once.

Every execution is logged by the handler to ``testapp.Execution``; the assertions count log rows,
so a task run twice shows up as a duplicate, and a lost task as a missing id.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import OperationalError
from django.db.models import Count, F
from django.db.models.functions import Now

from django_pgtasks.database.partition_moves import is_conflict
from django_pgtasks.models import CLAIM_ORDER, Status, Task, WorkerProcess
from django_pgtasks.worker.loop import Worker
from tests.helpers import all_finished, run_workers, stop_processes, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N_TASKS = 4_000


def run_workers_in_threads(worker_class: type[Worker], n: int, **options: Any) -> list[Worker]:
    return run_workers([worker_class(worker_id=f"thread-{i}", burst=True, concurrency=1,
                                     **options) for i in range(n)], timeout=600)

def execution_counts() -> tuple[int, int]:
    total = Execution.objects.count()
    distinct = Execution.objects.values("task_id").distinct().count()
    return total, distinct


def test_4000_tasks_8_worker_threads_run_each_task_exactly_once() -> None:
    Task.objects.enqueue_many(tasks.log_execution.build() for _ in range(N_TASKS))
    started = time.monotonic()
    workers = run_workers_in_threads(Worker, 8)
    elapsed = time.monotonic() - started
    print(f"\n{N_TASKS} tasks drained by 8 worker threads in {elapsed:.1f}s "
          f"({N_TASKS / elapsed:.0f} tasks/s)")
    assert execution_counts() == (N_TASKS, N_TASKS)
    assert Task.objects.succeeded().count() == N_TASKS
    assert sum(w.processed for w in workers) == N_TASKS
    assert sum(1 for w in workers if w.processed) == 8  # every worker took part


class NonLockingWorker(Worker):
    """The classic mistake: a plain SELECT, then a separate UPDATE, without SKIP LOCKED.

    Each row is updated by a statement of its own (autocommit), so a claim never holds one
    row's lock while it waits for another's: two such claims would otherwise deadlock, and
    the test is about duplicates, not deadlocks."""

    def _claim(self, limit: int) -> list[Task]:
        ids = list(Task.objects.due().order_by(*CLAIM_ORDER).values_list("id", flat=True)[:limit])
        for task_id in ids:
            try:
                Task.objects.filter(id=task_id).update(
                    status=Status.RUNNING, locked_by=self.worker_id, locked_at=Now(),
                    started_at=Now(), attempt=F("attempt") + 1,
                )
            except OperationalError as exc:  # the task ended (moved to history) meanwhile
                if not is_conflict(exc):
                    raise
        return list(Task.objects.filter(id__in=ids))


def test_the_same_test_finds_duplicates_when_the_claim_does_not_lock() -> None:
    """Proves the exactly-once assertion above can fail. 500 tasks ran about 1,400 times:
    200 are plenty to show it, at 40% of the cost."""
    n = 200
    Task.objects.enqueue_many(tasks.log_execution.build() for _ in range(n))
    run_workers_in_threads(NonLockingWorker, 8, prefetch=0)
    total, distinct = execution_counts()
    print(f"\nnon-locking claim: {total} executions of {distinct} distinct tasks")
    assert total > distinct  # some tasks ran more than once


def test_4000_tasks_4_worker_processes_run_each_task_exactly_once(start_command) -> None:
    processes = [
        start_command("run_pgtasks", "--concurrency", "2", "--worker-id", f"proc-{i}",
                      "--log-level", "WARNING")
        for i in range(4)
    ]
    try:
        # All four compete for the work: a process still starting when the others have
        # drained the queue would take none.
        wait_until(lambda: WorkerProcess.objects.count() == 4, timeout=60,
                   what="the four worker processes to register")
        started = time.monotonic()
        Task.objects.enqueue_many(tasks.log_execution.build() for _ in range(N_TASKS))
        wait_until(all_finished, timeout=300, what="every task to finish")
        elapsed = time.monotonic() - started
    finally:
        outputs = stop_processes(processes)
    print(f"\n{N_TASKS} tasks drained by 4 worker processes in {elapsed:.1f}s")
    assert [p.returncode for p in processes] == [0, 0, 0, 0], outputs
    assert execution_counts() == (N_TASKS, N_TASKS)
    assert Task.objects.succeeded().count() == N_TASKS
    per_worker = dict(Execution.objects.values_list("worker").annotate(n=Count("id")))
    assert set(per_worker) == {f"proc-{i}" for i in range(4)}, per_worker


def test_exactly_once_mode_with_worker_processes(start_command) -> None:
    n = 3_000
    Task.objects.enqueue_many(tasks.log_execution_atomic.build() for _ in range(n))
    processes = [
        start_command("run_pgtasks", "--burst", "--concurrency", "3", "--log-level", "WARNING")
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], outputs
    assert execution_counts() == (n, n)
    assert Task.objects.succeeded().count() == n


def test_a_handler_raising_at_random_under_load_ends_every_task_with_the_right_attempts(
) -> None:
    n = 500
    Task.objects.enqueue_bulk(tasks.divide_sometimes, [(i,) for i in range(n)])
    run_workers_in_threads(Worker, 4)
    executions = dict(Execution.objects.values_list("task_id").annotate(n=Count("id")))
    rows = list(Task.objects.values_list("pk", "status", "attempt", "errors"))
    assert len(rows) == n
    assert {status for _, status, _, _ in rows} <= {Status.SUCCESSFUL, Status.FAILED}
    for pk, status, attempt, errors in rows:
        assert executions[pk] == attempt  # every attempt ran exactly once, none lost
        failed_attempts = attempt - (1 if status == Status.SUCCESSFUL else 0)
        assert len(errors) == min(failed_attempts, 20)
        assert all(e["error"].startswith("ZeroDivisionError") for e in errors)
        if status == Status.FAILED:
            assert attempt == 10  # only after its last attempt
    assert sum(1 for _, s, a, _ in rows if s == Status.SUCCESSFUL and a > 1) > n // 4
