"""Worker liveness and rescue of abandoned tasks (docs/reliability.md), path by path.

A "ghost" worker is a real registration made with ``Liveness`` on its own connection, so its
advisory lock and heartbeat exist in PostgreSQL exactly as a worker's do; closing that
connection is what a killed process does to it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.worker.liveness import (
    LOCK_NAMESPACE,
    RESCUE_LOCK_KEY,
    Liveness,
    lock_key,
    rescue,
)
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def ghost(name: str = "ghost") -> Liveness:
    liveness = Liveness(name, ["default"], 1, "default")
    liveness.register()
    return liveness


def age(name: str, seconds: float) -> None:
    """Move a worker's last heartbeat into the past (database clock)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_worker SET last_seen_at = now() - make_interval(secs => %s)"
                       " WHERE name = %s", [seconds, name])


def vanish(liveness: Liveness) -> None:
    """What kill -9 does to a worker's liveness: its session ends and its lock goes."""
    key = lock_key(liveness.pk)
    liveness.close()
    wait_for_lock_release(key)


def wait_for_lock_release(key: int) -> None:
    """The server ends a session a moment after its client disconnects."""
    wait_until(lambda: not lock_held(key), 30, f"lock {key} to be released")


def lock_held(key: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = %s AND objid = %s AND objsubid = 2", [LOCK_NAMESPACE, key])
        return cursor.fetchone()[0] == 1


def test_a_running_worker_is_registered_with_its_lock_and_removed_when_it_stops() -> None:
    worker = Worker(worker_id="registered", concurrency=2, queues=["emails"])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        # Registered, then its lock key recorded once the lock is taken.
        wait_until(lambda: WorkerProcess.objects.filter(name="registered",
                                                        lock_key__isnull=False).exists(),
                   10, "the worker's registration with its lock key")
        row = WorkerProcess.objects.get(name="registered")
        assert (row.queues, row.concurrency, row.lock_key) == (["emails"], 2, lock_key(row.pk))
        assert row.hostname
        assert row.pid
        assert row.backend_pid
        assert lock_held(row.lock_key)
        # Its heartbeats go on: the row's last_seen_at moves on, twice (HEARTBEAT_INTERVAL
        # in tests/settings.py is 0.25s; the wait fails the test if they stopped).
        seen = [row.last_seen_at]

        def beat() -> bool:
            row.refresh_from_db()
            if row.last_seen_at != seen[-1]:
                seen.append(row.last_seen_at)
            return len(seen) >= 3

        wait_until(beat, 30, "two more heartbeats")
        assert seen == sorted(seen)
    finally:
        worker.stop()
        thread.join(30)
    assert not WorkerProcess.objects.filter(name="registered").exists()
    wait_for_lock_release(row.lock_key)


def test_tasks_of_a_worker_whose_lock_vanished_are_rescued_after_the_grace(settings) -> None:
    # A grace far longer than the steps below take, however slow the machine (with the
    # 1 s of tests/settings.py, a slow second would end it before the check "within").
    settings.PGTASKS = {**settings.PGTASKS, "RESCUE_GRACE": 30.0}
    liveness = ghost()
    key = lock_key(liveness.pk)
    task = Task.objects.enqueue(tasks.noop)
    Task.objects.claim("ghost")
    assert rescue() == []  # alive: lock held, heartbeat fresh
    liveness.close()  # what kill -9 does: the session ends, PostgreSQL drops the lock
    wait_for_lock_release(key)
    assert rescue() == []  # within the grace (a database restart looks like this at first)
    age("ghost", 31)
    [rescued] = rescue()
    # An interruption, not a failure: the attempt is given back.
    assert (rescued.id, rescued.worker, rescued.status) == (task.pk, "ghost", Status.READY)
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions, task.locked_at) == (
        Status.READY, 0, 1, None)
    assert task.error_text.startswith("django_pgtasks.exceptions.WorkerLost: worker ghost "
                                      "stopped while running attempt 1")
    assert [e["attempt"] for e in task.errors] == [1]
    assert task.errors[0]["error"] == task.error_text
    assert task.worker_ids == []  # one worker id per attempt counted
    assert not WorkerProcess.objects.filter(name="ghost").exists()  # forgotten
    [again] = Task.objects.claim("someone-else")  # due at once
    assert again.attempt == 1


def test_the_recorded_error_class_of_a_rescue_is_importable() -> None:
    from django.utils.module_loading import import_string

    from django_pgtasks.exceptions import TaskInterrupted

    liveness = ghost()
    Task.objects.enqueue(tasks.noop)
    [task] = Task.objects.claim("ghost")
    vanish(liveness)
    age("ghost", 2)
    rescue()
    task.refresh_from_db()
    path = task.error_text.partition(":")[0]
    assert issubclass(import_string(path), TaskInterrupted)


def test_a_rescued_task_goes_back_to_its_place_in_the_queue() -> None:
    liveness = ghost()
    first = Task.objects.enqueue(tasks.noop)
    backlog = [Task.objects.enqueue(tasks.noop) for _ in range(5)]
    [claimed] = Task.objects.claim("ghost")
    assert claimed.pk == first.pk
    vanish(liveness)
    age("ghost", 2)
    rescue()
    # Ahead of the backlog that was enqueued after it, not behind it.
    [next_up] = Task.objects.claim("someone-else")
    assert next_up.pk == first.pk
    assert Task.objects.get(pk=first.pk).run_after == first.run_after
    assert all(Task.objects.get(pk=t.pk).status == Status.READY for t in backlog)


def test_rescue_of_a_task_that_had_failed_before_keeps_it_awaiting_retry() -> None:
    liveness = ghost()
    Task.objects.enqueue(tasks.noop, max_attempts=3)
    [task] = Task.objects.claim("ghost")
    Task.objects.mark_failed(task, "boom", retry_delay=0)
    [task] = Task.objects.claim("ghost")
    assert task.attempt == 2
    vanish(liveness)
    age("ghost", 2)
    [rescued] = rescue()
    assert rescued.status == Status.AWAITING_RETRY
    task.refresh_from_db()
    assert (task.attempt, task.interruptions) == (1, 1)


def test_a_silent_worker_is_rescued_after_worker_timeout_even_with_its_lock(settings) -> None:
    liveness = ghost("hung")
    try:
        Task.objects.enqueue(tasks.noop)
        Task.objects.claim("hung")
        age("hung", 3)  # past the grace, but the lock is held: alive, merely slow
        assert rescue() == []
        settings.PGTASKS = {**settings.PGTASKS, "WORKER_TIMEOUT": 2.0}
        [rescued] = rescue()
        assert rescued.worker == "hung"
    finally:
        liveness.close()


def test_heartbeat_only_liveness_ignores_locks(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "LIVENESS": "heartbeat", "WORKER_TIMEOUT": 60.0}
    liveness = ghost("pooled")
    assert WorkerProcess.objects.get(name="pooled").lock_key is None
    Task.objects.enqueue(tasks.noop)
    Task.objects.claim("pooled")
    vanish(liveness)
    age("pooled", 30)  # no lock to lose: only the heartbeat timeout counts
    assert rescue() == []
    age("pooled", 61)
    assert [r.worker for r in rescue()] == ["pooled"]


def test_tasks_claimed_outside_a_registered_worker_have_a_lease(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "WORKER_TIMEOUT": 30.0}
    Task.objects.enqueue(tasks.noop)
    [task] = Task.objects.claim("script")
    assert rescue() == []
    Task.objects.filter(pk=task.pk).update(locked_at=task.locked_at - timedelta(seconds=31))
    assert [r.id for r in rescue()] == [task.pk]


def test_rescue_of_a_task_with_one_attempt_does_not_fail_it() -> None:
    liveness = ghost()
    Task.objects.enqueue(tasks.noop, max_attempts=1)
    [task] = Task.objects.claim("ghost")
    vanish(liveness)
    age("ghost", 2)
    [rescued] = rescue()
    assert rescued.status == Status.READY
    task.refresh_from_db()
    assert (task.status, task.attempt, task.max_attempts) == (Status.READY, 0, 1)


def test_a_task_interrupted_past_its_budget_fails(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "MAX_INTERRUPTIONS": 2}
    task = Task.objects.enqueue(tasks.noop, max_attempts=1)
    statuses = []
    for i in range(3):
        liveness = ghost(f"oom-{i}")
        Task.objects.claim(f"oom-{i}")
        vanish(liveness)
        age(f"oom-{i}", 2)
        [rescued] = rescue()
        statuses.append(rescued.status)
    assert statuses == [Status.READY, Status.READY, Status.FAILED]
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.FAILED, 1, 3)
    assert task.error_text.startswith("django_pgtasks.exceptions.TooManyInterruptions: The "
                                      "task was interrupted more than 2 times")
    assert "The last interruption (3): django_pgtasks.exceptions.WorkerLost: worker oom-2" in (
        task.error_text)
    assert [e["error"].split(":")[0] for e in task.errors] == [
        "django_pgtasks.exceptions.WorkerLost"] * 3


def test_a_rescued_task_whose_cancellation_was_requested_ends_cancelled() -> None:
    liveness = ghost()
    task = Task.objects.enqueue(tasks.noop)
    Task.objects.claim("ghost")
    Task.objects.filter(pk=task.pk).cancel()
    vanish(liveness)
    age("ghost", 2)
    [rescued] = rescue()
    assert rescued.status == Status.CANCELLED


def test_the_late_finisher_of_a_rescued_task_cannot_record_its_outcome(caplog) -> None:
    liveness = ghost()
    Task.objects.enqueue(tasks.noop)
    [mine] = Task.objects.claim("ghost")
    vanish(liveness)
    age("ghost", 2)
    rescue()
    [theirs] = Task.objects.claim("new-owner")
    assert Task.objects.mark_succeeded(mine, result="late") is False
    assert Task.objects.mark_failed(mine, "late", retry_delay=0) is False
    assert "was no longer held by worker ghost" in caplog.text
    row = Task.objects.get(pk=mine.pk)
    assert (row.status, row.locked_by, row.attempt) == (Status.RUNNING, "new-owner", 1)
    assert Task.objects.mark_succeeded(theirs) is True


def test_a_worker_given_up_as_lost_registers_again_on_its_next_heartbeat() -> None:
    liveness = ghost("comeback")
    try:
        WorkerProcess.objects.filter(name="comeback").delete()
        assert liveness.heartbeat() is True
        row = WorkerProcess.objects.get(name="comeback")
        assert lock_held(row.lock_key)
    finally:
        liveness.unregister()


def test_only_one_rescue_pass_runs_at_a_time() -> None:
    held = threading.Event()
    done = threading.Event()

    def hold_rescue_lock() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                               [LOCK_NAMESPACE, RESCUE_LOCK_KEY])
                held.set()
                done.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_rescue_lock)
    thread.start()
    try:
        assert held.wait(10)
        assert rescue() is None
    finally:
        done.set()
        thread.join()
    assert rescue() == []


def test_stuck_lists_what_rescue_would_take_and_the_command_rescues_it(capsys) -> None:
    liveness = ghost()
    Task.objects.enqueue(tasks.noop)
    alive = Task.objects.enqueue(tasks.noop)
    [task] = Task.objects.claim("ghost")
    Task.objects.claim("live-but-unregistered")
    vanish(liveness)
    age("ghost", 2)
    assert list(Task.objects.stuck().values_list("pk", flat=True)) == [task.pk]
    call_command("pgtasks_rescue", "--dry-run")
    assert f"Task id={task.pk} name=tests.testapp.tasks.noop worker=ghost status=RUNNING" in (
        capsys.readouterr().out)
    assert Task.objects.get(pk=task.pk).status == Status.RUNNING
    call_command("pgtasks_rescue")
    assert "1 task(s) rescued." in capsys.readouterr().out
    assert Task.objects.get(pk=task.pk).status == Status.READY
    assert Task.objects.get(pk=alive.pk).status == Status.RUNNING


def test_a_sync_task_over_its_time_limit_fails_and_frees_its_slot() -> None:
    # Hangs 6 s past its 0.5 s limit: room for the quick task to run before the abandoned
    # handler returns, however slow the machine.
    slow = Task.objects.enqueue(tasks.hangs, 6.0)
    quick = Task.objects.enqueue(tasks.noop, priority=0)  # runs after `slow` started
    worker = Worker(concurrency=1, burst=True)
    assert worker.run(install_signals=False) == 0
    slow.refresh_from_db()
    quick.refresh_from_db()
    assert (slow.status, slow.attempt) == (Status.FAILED, 1)
    assert slow.error_text.startswith("django_pgtasks.exceptions.TaskTimeoutError: Task "
                                      "exceeded its time limit of 0.5s")
    assert quick.status == Status.SUCCESSFUL  # the one slot was handed on
    # The abandoned handler finishes later, and hands in its success: the thread is then
    # done with the task (no longer counted as stuck).
    wait_until(lambda: worker._pool.stuck == 0, 30, "the abandoned handler to finish")
    assert quick.finished_at < Execution.objects.get(task_id=slow.pk).created_at
    # The worker had stopped: its late success waits, handed in. Recorded as the loop would
    # have, had it still been running, it changes nothing: the lease guard refuses it.
    assert worker.executor.batched  # COMPLETION_WINDOW > 0: outcomes are handed in
    assert worker.completion.ids() == {slow.pk}
    worker.completion.record(everything=True)
    assert worker.completion.ids() == set()
    assert Task.objects.get(pk=slow.pk).status == Status.FAILED


def test_an_async_task_over_its_time_limit_is_cancelled() -> None:
    task = Task.objects.enqueue(tasks.async_hangs)
    started = time.monotonic()
    assert Worker(concurrency=1, burst=True).run(install_signals=False) == 0
    assert time.monotonic() - started < 10  # cancelled, not left to sleep 30s
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert task.error_text.startswith("django_pgtasks.exceptions.TaskTimeoutError: Task "
                                      "exceeded its time limit of 0.3s and was cancelled.")


def test_a_worker_with_more_stuck_threads_than_slots_stops_to_be_replaced() -> None:
    # Each hangs 6 s past its 0.5 s limit: the second one overruns too before the first
    # abandoned handler returns, however slow the machine.
    Task.objects.enqueue_many(tasks.hangs.build(6.0) for _ in range(2))
    worker = Worker(concurrency=1)
    assert worker.run(install_signals=False) == 1
    assert Task.objects.failed().count() == 2
    # Let the abandoned handlers finish here, not in the middle of a later test.
    wait_until(lambda: Execution.objects.filter(worker="late").count() == 2, 30,
               "the abandoned handlers to finish")


def test_tasks_of_a_claim_whose_reply_was_lost_are_given_back() -> None:
    worker = Worker(concurrency=1, poll_interval=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: WorkerProcess.objects.filter(name=worker.worker_id).exists(), 30,
                   "the worker to register")
        # A claim that committed in the database while its reply never reached the worker:
        # the task is RUNNING under the live worker, which does not know of it.
        with transaction.atomic():  # committed already claimed: the worker never saw it free
            Task.objects.enqueue(tasks.noop)
            [lost] = Task.objects.claim(worker.worker_id)
        worker._check_orphans = True  # what a claim that raised sets
        wait_until(lambda: Task.objects.get(pk=lost.pk).status == Status.SUCCESSFUL, 30,
                   "the lost task to be given back and run")
        # Given back without counting the lost attempt, then run once by the worker.
        assert Task.objects.get(pk=lost.pk).attempt == 1
    finally:
        worker.stop()
        thread.join(30)
