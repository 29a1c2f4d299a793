"""The worker in-process: outcomes, retries and backoff, fatal errors, guarded completion."""

from __future__ import annotations

import signal
import threading
from datetime import timedelta

import pytest
from django.db import connection

from django_pgtasks import pgtask, signals
from django_pgtasks.definition.error_text import truncate_error
from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker, format_exception
from tests.helpers import wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain(**options) -> Worker:
    worker = Worker(burst=True, concurrency=options.pop("concurrency", 2), **options)
    assert worker.run(install_signals=False) == 0
    return worker


def test_successful_task_stores_its_result() -> None:
    task = Task.objects.enqueue(tasks.add, 2, 3)
    drain()
    task.refresh_from_db()
    assert (task.status, task.result, task.attempt, task.error_text) == (
        Status.SUCCESSFUL, 5, 1, "")
    assert task.started_at <= task.finished_at
    assert task.locked_at is None


def test_async_handlers_run() -> None:
    task = Task.objects.enqueue(tasks.async_add, 20, 22)
    drain()
    task.refresh_from_db()
    assert (task.status, task.result) == (Status.SUCCESSFUL, 42)


def test_failing_task_is_retried_until_it_succeeds() -> None:
    task = Task.objects.enqueue(tasks.flaky, 2)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt, task.result) == (Status.SUCCESSFUL, 3, "ok")
    assert list(Execution.objects.order_by("attempt").values_list("attempt", flat=True)) == [
        1, 2, 3]


def test_attempts_exhausted_ends_failed_with_the_error() -> None:
    task = Task.objects.enqueue(tasks.always_fails, "disk full on /dev/sda1")
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 3)
    assert task.error_text.startswith("RuntimeError: disk full on /dev/sda1\n")
    assert "Traceback (most recent call last)" in task.error_text
    assert 'raise RuntimeError(message)' in task.error_text


def test_fatal_error_fails_after_one_attempt() -> None:
    task = Task.objects.enqueue(tasks.fatal_failure)
    declared = Task.objects.enqueue(tasks.declared_fatal)
    drain()
    for t in (task, declared):
        t.refresh_from_db()
        assert (t.status, t.attempt) == (Status.FAILED, 1), t.error_text
    assert task.error_text.startswith("django_pgtasks.exceptions.FatalError: the input can never")
    assert declared.error_text.startswith("KeyError: 'missing'")


def test_retry_is_scheduled_from_the_database_clock(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "BACKOFF_BASE": 60.0, "BACKOFF_JITTER": 0}
    task = Task.objects.enqueue(tasks.always_fails)
    drain()  # one attempt; the retry is an hour-scale delay away, so burst mode stops
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.AWAITING_RETRY, 1)
    # exponential: 60s * 2**0 after the failed attempt ended (both times are database times)
    assert task.run_after - task.finished_at == pytest.approx(timedelta(seconds=60),
                                                              abs=timedelta(milliseconds=50))
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after > now() FROM pgtasks_task WHERE id = %s", [task.pk])
        assert cursor.fetchone() == (True,)


def test_linear_and_exponential_backoff_policies(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "BACKOFF_BASE": 10.0, "BACKOFF_MAX": 100.0,
                        "BACKOFF_JITTER": 0}
    exp = pgtask(name="exp-policy", backoff="exponential")(lambda: None)
    lin = pgtask(name="lin-policy", backoff="linear")(lambda: None)
    assert [exp.retry_delay(n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 80, 100]
    assert [lin.retry_delay(n) for n in (1, 2, 3)] == [10, 20, 30]
    settings.PGTASKS = {**settings.PGTASKS, "BACKOFF_JITTER": 0.5}
    delays = {exp.retry_delay(3) for _ in range(50)}
    assert len(delays) > 1
    assert all(20 <= d <= 60 for d in delays)


def test_unknown_task_name_fails_the_task_and_the_worker_goes_on() -> None:
    bad = Task.objects.create(name="tests.testapp.tasks.not_there")
    good = Task.objects.enqueue(tasks.noop)
    drain()
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.status, bad.attempt) == (Status.FAILED, 1)
    assert "No task handler is registered under the name" in bad.error_text
    assert good.status == Status.SUCCESSFUL


def test_hand_edited_nonsense_payload_fails_clearly() -> None:
    task = Task.objects.enqueue(tasks.add, 1, 2)
    Task.objects.filter(pk=task.pk).update(kwargs={"c": 3}, max_attempts=1)
    drain()
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "TypeError" in task.error_text
    assert "'c'" in task.error_text


def test_unserializable_return_value_fails_the_task() -> None:
    task = Task.objects.enqueue(tasks.returns_unserializable)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 1)
    assert "The task's return value of type object is not JSON-serializable" in task.error_text


def test_long_error_text_is_bounded(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "ERROR_TEXT_LIMIT": 500}
    task = Task.objects.enqueue(tasks.fails_loudly, 3_000_000)
    drain()
    task.refresh_from_db()
    assert len(task.error_text) <= 500
    assert task.error_text.startswith("RuntimeError: xxx")
    assert "characters cut" in task.error_text
    assert task.error_text.rstrip().endswith("x")  # the tail (innermost frames/message) is kept


def test_exceptions_that_fail_to_stringify_are_still_recorded() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    text = format_exception(Unprintable())
    assert "Unprintable" in text
    assert truncate_error("a\x00b") == "a\\x00b"


def test_late_finisher_cannot_overwrite_a_rescued_task(caplog) -> None:
    Task.objects.enqueue(tasks.noop)
    [mine] = Task.objects.claim("worker-a")
    # The task is taken away (rescued and re-claimed by another worker) while worker-a runs it.
    Task.objects.filter(pk=mine.pk).update(status=Status.READY)
    [theirs] = Task.objects.claim("worker-b")
    assert Task.objects.mark_succeeded(mine, result="late") is False
    assert Task.objects.mark_failed(mine, "late failure", retry_delay=None) is False
    row = Task.objects.get(pk=mine.pk)
    assert (row.status, row.locked_by, row.result) == (Status.RUNNING, "worker-b", None)
    assert "was no longer held by worker worker-a" in caplog.text
    assert Task.objects.mark_succeeded(theirs, result="ok") is True


def test_atomic_mode_rolls_back_handler_writes_when_the_lease_was_lost(caplog) -> None:
    task = Task.objects.enqueue(tasks.cancelled_while_running)
    drain()
    assert Task.objects.get(pk=task.pk).status == Status.CANCELLED
    assert not Execution.objects.exists()  # the handler's write was rolled back
    assert "was no longer held by worker" in caplog.text


def test_atomic_mode_commits_handler_writes_with_the_completion() -> None:
    task = Task.objects.enqueue(tasks.log_execution_atomic)
    drain()
    assert Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL
    assert list(Execution.objects.values_list("task_id", flat=True)) == [task.pk]


def test_signals_are_sent() -> None:
    seen: list[tuple[str, str]] = []

    def on_started(sender, task, **kw) -> None:
        seen.append(("started", task.status))

    def on_finished(sender, task, status, exception, **kw) -> None:
        seen.append(("finished", status))

    signals.task_started.connect(on_started)
    signals.task_finished.connect(on_finished)
    try:
        Task.objects.enqueue(tasks.add, 1, 1)
        drain()
    finally:
        signals.task_started.disconnect(on_started)
        signals.task_finished.disconnect(on_finished)
    assert seen == [("started", Status.RUNNING), ("finished", Status.SUCCESSFUL)]


def test_worker_serves_only_its_queues() -> None:
    mine = Task.objects.enqueue(tasks.noop, queue="urgent")
    other = Task.objects.enqueue(tasks.noop, queue="default")
    drain(queues=["urgent"])
    assert Task.objects.get(pk=mine.pk).status == Status.SUCCESSFUL
    assert Task.objects.get(pk=other.pk).status == Status.READY


def test_a_handler_raising_systemexit_fails_its_task_and_the_worker_goes_on() -> None:
    bad = Task.objects.enqueue(tasks.exits)
    good = [Task.objects.enqueue(tasks.noop) for _ in range(3)]
    drain(concurrency=1)
    bad.refresh_from_db()
    assert (bad.status, bad.attempt) == (Status.FAILED, 1)
    assert bad.error_text.startswith("SystemExit: 3")
    assert all(Task.objects.get(pk=t.pk).status == Status.SUCCESSFUL for t in good)


def test_task_enqueued_signal_is_sent_for_single_and_bulk_enqueues() -> None:
    seen: list[int] = []

    def on_enqueued(sender, task, **kw) -> None:
        seen.append(task.pk)

    signals.task_enqueued.connect(on_enqueued)
    try:
        one = Task.objects.enqueue(tasks.noop)
        many = Task.objects.enqueue_many(tasks.noop.build() for _ in range(3))
    finally:
        signals.task_enqueued.disconnect(on_enqueued)
    assert seen == [one.pk, *(t.pk for t in many)]


def test_hand_edited_malformed_payload_shape_fails_clearly() -> None:
    task = Task.objects.enqueue(tasks.add, 1, 2)
    Task.objects.filter(pk=task.pk).update(args={"a": 1})
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 1)
    assert "Malformed stored payload: args must be a JSON array" in task.error_text


def test_each_attempt_keeps_its_worker_and_error() -> None:
    task = Task.objects.enqueue(tasks.flaky, 2)
    drain(worker_id="history-worker")
    task.refresh_from_db()
    assert task.worker_ids == ["history-worker"] * 3
    assert [e["attempt"] for e in task.errors] == [1, 2]
    assert task.errors[0]["error"].startswith("ConnectionError: attempt 1 failed")
    assert all(e["at"] for e in task.errors)
    assert task.error_text == ""  # the current state: succeeded; the history stays


def test_error_history_is_bounded(settings) -> None:
    task = Task.objects.enqueue(tasks.always_fails, max_attempts=25)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 25)
    assert [e["attempt"] for e in task.errors] == list(range(6, 26))  # the last 20


def test_a_late_finisher_cannot_record_over_a_later_attempt_of_the_same_worker() -> None:
    """The guard names the lease (the claim's locked_at): the same worker re-claiming a task
    holds a new lease."""
    Task.objects.enqueue(tasks.noop)
    [first] = Task.objects.claim("w")
    assert Task.objects.mark_failed(first, "timed out", retry_delay=0) is True
    [second] = Task.objects.claim("w")
    assert second.attempt == 2
    assert Task.objects.mark_succeeded(first, result="late attempt 1") is False
    assert Task.objects.mark_many_succeeded([(first, "late")]) == set()
    assert Task.objects.unclaim([first]) == 0
    row = Task.objects.get(pk=first.pk)
    assert (row.status, row.attempt, row.result) == (Status.RUNNING, 2, None)
    assert Task.objects.mark_many_succeeded([(second, "ok")]) == {second.pk}
    assert Task.objects.get(pk=first.pk).result == "ok"


def test_a_transaction_a_handler_left_open_does_not_reach_the_next_task() -> None:
    # One thread runs both, one after the other: the first leaves its transaction open with
    # a write in it; the worker closes that connection (the write is rolled back) before the
    # next task runs on the thread.
    first = Task.objects.enqueue(tasks.leaves_a_transaction_open, "left open")
    second = Task.objects.enqueue(tasks.in_a_transaction)
    drain(concurrency=1, prefetch=0)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == (Status.SUCCESSFUL, Status.SUCCESSFUL)
    assert second.result is False
    assert not Execution.objects.filter(worker="left open").exists()


def test_a_quick_task_is_signalled_at_once_while_every_thread_runs_a_long_one(
        tmp_path) -> None:
    """task_finished, the handler's finished() and the outcome's log line follow the record
    within the completion window, even when every pool thread is busy with a long task; and
    the duration they report is the handler's run, not the wait for a free thread."""
    import threading
    import time

    from django.db import transaction

    from tests.helpers import run_workers, wait_until

    gate = tmp_path / "gate"
    with transaction.atomic():
        quick = Task.objects.enqueue(tasks.add, 1, 2)
        slow = [Task.objects.enqueue(tasks.waits_for, str(gate), 60, str(tmp_path / f"s{i}"))
                for i in range(4)]
    finished: dict[int, tuple[str, float, float]] = {}

    def receive(sender, task, status, duration, **kwargs) -> None:
        finished[task.pk] = (status, duration, time.monotonic())

    signals.task_finished.connect(receive)
    worker = Worker(concurrency=2, prefetch=0)
    runner = threading.Thread(target=run_workers, args=([worker],),
                              kwargs={"until": lambda: gate.exists()})
    try:
        runner.start()
        wait_until(lambda: Task.objects.get(pk=quick.pk).status == Status.SUCCESSFUL,
                   timeout=60, what="the quick task to be recorded")
        recorded = time.monotonic()
        # Both threads are in long handlers now (the next ones were claimed at once).
        wait_until(lambda: sum((tmp_path / f"s{i}").exists() for i in range(4)) == 2,
                   timeout=60, what="two long tasks to run")
        # Bounds well under the long tasks' minute at their gate, and far above what a
        # loaded machine takes: the callbacks did not wait for a free thread.
        wait_until(lambda: quick.pk in finished, timeout=30,
                   what="task_finished of the quick task while the long ones run")
        status, duration, at = finished[quick.pk]
        assert status == Status.SUCCESSFUL
        assert at - recorded < 20
        assert duration < 10, duration
    finally:
        gate.touch()
        runner.join(120)
        signals.task_finished.disconnect(receive)
    assert not runner.is_alive()
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in slow])} <= {
        Status.SUCCESSFUL, Status.READY}


@pytest.mark.timeout(60)
def test_signals_that_land_inside_a_lock_of_the_loop_stop_the_worker_without_hanging_it() -> None:
    """A signal handler runs on the main thread wherever that thread is: here inside the
    loop's wake-up event (as in ``Event.clear()``), and a second ``SIGTERM`` on the heels of
    the first. The handler hands each over to a thread of its own and returns at once; had it
    taken that lock itself, the main thread would wait for itself for ever."""
    worker = Worker(burst=True)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker._install_signal_handlers()
        handle = signal.getsignal(signal.SIGTERM)
        assert callable(handle)
        with worker._wakeup._cond:  # type: ignore[attr-defined]  # the event's own lock
            handle(signal.SIGTERM, None)
            handle(signal.SIGTERM, None)
            assert not worker._force.is_set()  # acted upon on their thread, not in here
        wait_until(worker._force.is_set, 30, "the second SIGTERM to stop the worker at once")
        assert worker._stop.is_set()
    finally:
        if worker._signals is not None:
            worker._signals.put(None)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_burst_worker_ends_once_its_last_outcomes_are_recorded_not_at_its_next_poll(
        settings) -> None:
    """The last outcomes are recorded after the completion window, when nothing will wake
    the loop any more: a burst worker then claims once more (a retry they made due would be
    found) and, finding nothing, ends, instead of sleeping until its next poll."""
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0.3}
    task = Task.objects.enqueue(tasks.noop)
    worker = Worker(burst=True, concurrency=4, poll_interval=120)
    ended = threading.Event()
    runner = threading.Thread(target=lambda: (worker.run(install_signals=False), ended.set()))
    runner.start()
    try:
        wait_until(ended.is_set, 60, "the burst worker to end before its next poll (120 s)")
    finally:
        worker.stop()
        runner.join()
    task.refresh_from_db()
    assert task.status == Status.SUCCESSFUL
