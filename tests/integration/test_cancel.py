"""Cancellation: waiting tasks never start; running tasks are asked to stop cooperatively.

Running tasks learn of their cancellation through NOTIFY (the worker's listener) or, when
that is off or lost, with the worker's next heartbeat. Every handler here waits for the
cancellation without a time limit of its own (ten minutes), so a test only ends if the
request really reached it; the one with a time limit (4 s) logs that it saw the request,
and its test checks that log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connections

from django_pgtasks.models import CancelResult, Status, Task
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import cooperative, tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

#: Generous bound for anything a test waits for; never reached when the code works.
PATIENCE = 60.0


def started(*task_ids: int) -> Callable[[], bool]:
    return lambda: Execution.objects.filter(task_id__in=task_ids).count() >= len(task_ids)


@pytest.fixture
def worker(settings) -> Iterator[Callable[..., Worker]]:
    """Start in-process workers in threads; all are stopped at teardown."""
    running: list[tuple[Worker, threading.Thread]] = []

    def start(**options) -> Worker:
        w = Worker(concurrency=options.pop("concurrency", 2), **options)
        thread = threading.Thread(target=lambda: (w.run(install_signals=False),
                                                  connections.close_all()))
        thread.start()
        running.append((w, thread))
        if w.listener is None and settings.PGTASKS.get("LISTEN", True):
            wait_until(lambda: w.listener is not None and w.listener.connected.is_set(),
                       what="the listener")
        return w

    yield start
    for w, _ in running:
        w.stop()
    for _, thread in running:
        thread.join(timeout=PATIENCE)


def test_a_waiting_task_is_cancelled_and_never_starts() -> None:
    ready = Task.objects.enqueue(cooperative.quick, 1)
    retrying = Task.objects.enqueue(cooperative.quick, 2)
    Task.objects.filter(pk=retrying.pk).update(status=Status.AWAITING_RETRY, attempt=1)
    outcome = Task.objects.filter(pk__in=[ready.pk, retrying.pk]).cancel()
    assert (outcome, outcome.cancelled, outcome.stopping, outcome.skipped) == (2, 2, 0, 0)
    assert Worker(burst=True).run(install_signals=False) == 0
    assert set(Task.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    assert not Execution.objects.exists()


def test_cancel_reports_cancelled_asked_to_stop_and_skipped() -> None:
    ready, running, other_running, done, failed = (
        Task.objects.enqueue(tasks.noop) for _ in range(5))
    Task.objects.filter(pk__in=[running.pk, other_running.pk]).update(
        status=Status.RUNNING, locked_by="w")
    Task.objects.filter(pk=done.pk).update(status=Status.SUCCESSFUL)
    Task.objects.filter(pk=failed.pk).update(status=Status.FAILED)

    outcome = Task.objects.all().cancel()

    assert isinstance(outcome, CancelResult)
    assert (outcome.cancelled, outcome.stopping, outcome.skipped) == (1, 2, 2)
    assert outcome == 1  # an int: the number cancelled, as before
    rows = dict(Task.objects.values_list("pk", "status"))
    assert rows[ready.pk] == Status.CANCELLED
    assert rows[running.pk] == rows[other_running.pk] == Status.RUNNING  # still running...
    assert set(Task.objects.filter(cancel_requested=True).values_list("pk", flat=True)) == {
        running.pk, other_running.pk}                                     # ...asked to stop
    # running=False leaves running tasks alone; asking twice counts them again, no harm.
    assert Task.objects.all().cancel(running=False).stopping == 0
    assert Task.objects.all().cancel().stopping == 2


def test_a_running_task_stops_through_notify_and_ends_cancelled(worker, settings) -> None:
    # Heartbeats only at start-up: the request can only arrive through NOTIFY.
    settings.PGTASKS = {**settings.PGTASKS, "HEARTBEAT_INTERVAL": 3600.0}
    worker()
    task = Task.objects.enqueue(cooperative.stoppable)
    wait_until(started(task.pk), what="the handler to start")

    outcome = Task.objects.filter(pk=task.pk).cancel()
    assert (outcome.cancelled, outcome.stopping) == (0, 1)

    task = Task.objects.wait(task, timeout=PATIENCE)
    assert (task.status, task.attempt, task.result) == (Status.CANCELLED, 1, None)
    assert task.error_text.startswith("django_pgtasks.exceptions.TaskCancelled: Task ")
    assert task.errors[-1]["attempt"] == 1
    assert Execution.objects.filter(task_id=task.pk).count() == 1  # never retried


def test_without_notify_the_heartbeat_delivers_the_request(worker, settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "LISTEN": False}
    w = worker()
    # The watchdog thread still runs (heartbeats, the cancellation safety net), not listening.
    wait_until(lambda: w.listener is not None and w.listener.connected.is_set(),
               what="the watchdog")
    assert w.listener.listen is False
    task = Task.objects.enqueue(cooperative.polls_should_stop)
    wait_until(started(task.pk), what="the handler to start")
    Task.objects.filter(pk=task.pk).cancel()
    task = Task.objects.wait(task, timeout=PATIENCE)
    assert task.status == Status.CANCELLED


def test_an_async_handler_is_cancelled(worker) -> None:
    worker()
    task = Task.objects.enqueue(cooperative.async_stoppable)
    wait_until(started(task.pk), what="the handler to start")
    Task.objects.filter(pk=task.pk).cancel()
    task = Task.objects.wait(task, timeout=PATIENCE)
    assert task.status == Status.CANCELLED
    assert task.pk in cooperative.coroutines_cancelled  # its coroutine got CancelledError
    assert "TaskCancelled: The task was cancelled while it ran" in task.error_text


def test_a_handler_that_ignores_the_request_finishes_successful(worker) -> None:
    worker()
    task = Task.objects.enqueue(cooperative.ignores_cancel)
    wait_until(started(task.pk), what="the handler to start")
    Task.objects.filter(pk=task.pk).cancel()
    task = Task.objects.wait(task, timeout=PATIENCE)
    # It did its work: the outcome is the real one, and the request stays on record.
    assert (task.status, task.result) == (
        Status.SUCCESSFUL, "finished anyway (saw the cancellation: True)")
    assert task.cancel_requested is True


def test_any_error_after_the_request_ends_cancelled_without_retry(worker) -> None:
    worker()
    task = Task.objects.enqueue(cooperative.fails_after_cancel)
    wait_until(started(task.pk), what="the handler to start")
    Task.objects.filter(pk=task.pk).cancel()
    task = Task.objects.wait(task, timeout=PATIENCE)
    assert (task.status, task.attempt, task.max_attempts) == (Status.CANCELLED, 1, 3)
    assert task.error_text.startswith("RuntimeError: cleanup failed while stopping")


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_time_limit_reached_after_the_request_ends_cancelled_without_retry(
        worker, pool: str, tmp_path) -> None:
    gate = tmp_path / "gate"
    worker(pool=pool, cancel_grace=PATIENCE)  # the time limit comes first
    task = Task.objects.enqueue(cooperative.runs_on_into_its_time_limit, str(gate))
    try:
        wait_until(started(task.pk), what="the handler to start")
        Task.objects.filter(pk=task.pk).cancel()
        task = Task.objects.wait(task, timeout=PATIENCE)
    finally:
        gate.touch()  # the thread pool's abandoned handler ends
    assert (task.status, task.attempt, task.max_attempts) == (Status.CANCELLED, 1, 3)
    assert task.error_text.startswith(
        "django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit of 4s")
    assert list(Execution.objects.filter(task_id=task.pk).values_list("worker", flat=True)
                .order_by("id"))[1:] == ["saw the cancellation"]


def test_a_task_asked_to_stop_before_it_started_never_runs() -> None:
    # E.g. cancelled while prefetched, or rescued from a dead worker after the request.
    task = Task.objects.enqueue(cooperative.quick, 1)
    Task.objects.filter(pk=task.pk).update(cancel_requested=True)
    assert Worker(burst=True).run(install_signals=False) == 0
    task.refresh_from_db()
    assert task.status == Status.CANCELLED
    assert "was cancelled before attempt 1 started" in task.error_text
    assert not Execution.objects.exists()


def test_retry_now_of_a_cancelled_task_runs_it_again() -> None:
    task = Task.objects.enqueue(cooperative.quick, 21)
    Task.objects.filter(pk=task.pk).update(status=Status.CANCELLED, cancel_requested=True)
    assert Task.objects.filter(pk=task.pk).retry_now() == 1
    assert Worker(burst=True).run(install_signals=False) == 0
    task.refresh_from_db()
    assert (task.status, task.result, task.cancel_requested) == (Status.SUCCESSFUL, 42, False)


def test_cancel_reaches_the_right_tasks_among_concurrent_worker_processes(
        start_command) -> None:
    """Two worker processes run six long tasks; three are cancelled from here. Exactly those
    stop (each once, CANCELLED); the other three are still running until cancelled too."""
    for _ in range(2):
        start_command("run_pgtasks", "--concurrency", "3")
    work = [Task.objects.enqueue(cooperative.stoppable) for _ in range(6)]
    wait_until(started(*(t.pk for t in work)), what="all six handlers to start")
    assert len(set(Execution.objects.values_list("worker", flat=True))) == 2  # both served

    first, second = work[:3], work[3:]
    assert Task.objects.filter(pk__in=[t.pk for t in first]).cancel().stopping == 3
    for t in first:
        assert Task.objects.wait(t, timeout=PATIENCE).status == Status.CANCELLED
    assert set(Task.objects.filter(pk__in=[t.pk for t in second])
               .values_list("status", flat=True)) == {Status.RUNNING}

    assert Task.objects.filter(pk__in=[t.pk for t in second]).cancel().stopping == 3
    for t in second:
        assert Task.objects.wait(t, timeout=PATIENCE).status == Status.CANCELLED
    assert Execution.objects.count() == 6  # each ran once; none retried


def test_the_task_instance_shortcuts() -> None:
    task = Task.objects.enqueue(cooperative.quick, 1)
    assert task.cancel() == 1
    assert task.cancel().skipped == 1  # finished now
    assert task.wait(timeout=0).status == Status.CANCELLED


def test_a_handler_that_snoozes_after_the_request_is_cancelled(worker) -> None:
    worker()
    task = Task.objects.enqueue(cooperative.snoozes_until_cancelled)
    wait_until(started(task.pk), what="the handler to start")
    task.cancel()
    task = Task.objects.wait(task, timeout=PATIENCE)
    assert (task.status, task.attempt) == (Status.CANCELLED, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.Snooze: Snoozed for 0s.")


def test_a_key_enqueued_again_while_stopping_runs_once_more(worker) -> None:
    worker()
    task = Task.objects.enqueue(cooperative.stoppable, key="report-7")
    wait_until(started(task.pk), what="the handler to start")
    assert Task.objects.enqueue(cooperative.stoppable, key="report-7").deduplicated
    task.cancel()
    # The interrupted run ends; the re-run starts afresh, not asked to stop.
    wait_until(lambda: Execution.objects.filter(task_id=task.pk).count() == 2, what="the re-run")
    task.refresh_from_db()
    assert (task.status, task.cancel_requested, task.attempt) == (Status.RUNNING, False, 1)
    assert task.cancel().stopping == 1
    assert Task.objects.wait(task, timeout=PATIENCE).status == Status.CANCELLED
