"""LISTEN/NOTIFY wake-ups: what notifies, when, and that idle workers wake at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction

from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.worker.loop import Worker
from tests.helpers import notifications, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listen() -> Iterator:
    """A separate connection listening on the channel; returns a function that reads what
    it was sent by the transactions committed so far (tests/helpers.py: no fixed wait)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute("LISTEN pgtasks")

    def received() -> list[str]:
        return notifications(conn, "pgtasks")

    yield received
    conn.close()


def test_enqueues_notify_once_per_queue_per_transaction_at_commit(listen) -> None:
    with transaction.atomic():
        Task.objects.enqueue(tasks.noop)
        Task.objects.enqueue(tasks.noop)
        Task.objects.enqueue_many(tasks.noop.build(queue="emails") for _ in range(500))
        assert listen() == []  # nothing before commit
    assert sorted(listen()) == ["default", "emails"]


def test_bulk_enqueues_notify_at_commit_with_their_delay(listen) -> None:
    with transaction.atomic():
        Task.objects.enqueue_bulk(tasks.add, [(1, 2), (3, 4)], queue="emails")
        assert listen() == []
    assert listen() == ["emails"]
    Task.objects.enqueue_many([tasks.noop.build(queue="urgent", delay=30)])
    [payload] = listen()
    queue, delay = payload.split("@")
    assert queue == "urgent"
    # Measured from the statement that reads the database time for the new rows, up to the
    # later COPY's: 30 s less the gap between the two (a few ms; seconds on a stalled machine).
    assert 25.0 <= float(delay) <= 30.0


def test_a_rolled_back_enqueue_notifies_nobody(listen) -> None:
    try:
        with transaction.atomic():
            Task.objects.enqueue(tasks.noop)
            raise RuntimeError("the caller fails")
    except RuntimeError:
        pass
    assert Task.objects.count() == 0
    assert listen() == []


def test_a_delayed_task_notifies_its_delay_relative_to_the_database_clock(listen) -> None:
    Task.objects.enqueue(tasks.noop, queue="urgent", delay=30)
    [payload] = listen()
    queue, delay = payload.split("@")
    assert queue == "urgent"
    # Measured from the statement that reads the database time for the new rows, up to the
    # later COPY's: 30 s less the gap between the two (a few ms; seconds on a stalled machine).
    assert 25.0 <= float(delay) <= 30.0


def test_claims_and_completions_are_silent_but_retries_notify(listen) -> None:
    Task.objects.enqueue(tasks.noop)
    Task.objects.enqueue(tasks.noop)
    assert listen() == ["default", "default"]  # two transactions
    first, second = Task.objects.claim("w", limit=2)
    Task.objects.mark_succeeded(first)
    assert listen() == []
    Task.objects.mark_failed(second, "boom", retry_delay=0)
    assert listen() == ["default"]
    Task.objects.filter(pk=second.pk).update(priority=7)  # not a new pending task
    assert listen() == []


@pytest.fixture
def quiet(settings) -> None:
    """No other reason to wake up: heartbeats and maintenance far apart, so that only a
    notification (or its absence) decides when an idle worker looks for work."""
    settings.PGTASKS = {**settings.PGTASKS, "HEARTBEAT_INTERVAL": 30.0,
                        "RESCUE_INTERVAL": 30.0, "RESCUE_GRACE": 60.0}


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set(), 30,
               "the listener to connect")
    return thread


def wait_until_asleep(worker: Worker) -> None:
    """Until the worker's loop sleeps having handled every wake-up so far, the one that
    follows its listener's connection included (``connected`` is set after it): it has
    looked for work since, and a task enqueued now is found only if something wakes it (or
    at its next poll)."""
    wait_until(lambda: worker.listener is not None and worker.listener.connected.is_set(), 30,
               "the listener to connect")
    wait_until(lambda: worker.asleep, 30, "the worker to look for work and fall asleep")


def wait_for_status(task: Task, status: str, timeout: float) -> Task:
    wait_until(lambda: Task.objects.get(pk=task.pk).status == status, timeout,
               f"task {task.pk} to be {status}")
    return Task.objects.get(pk=task.pk)


def test_an_idle_worker_wakes_at_once_when_work_arrives(quiet) -> None:
    worker = Worker(concurrency=1, poll_interval=60)  # polling alone would take a minute
    thread = run_in_thread(worker)
    try:
        wait_until_asleep(worker)
        task = Task.objects.enqueue(tasks.noop)
        done = wait_for_status(task, Status.SUCCESSFUL, timeout=30)
        assert (done.started_at - done.created_at).total_seconds() < 5
    finally:
        worker.stop()
        thread.join(30)


def test_an_idle_worker_sleeps_until_a_delayed_task_is_due(quiet) -> None:
    worker = Worker(concurrency=1, poll_interval=60)
    thread = run_in_thread(worker)
    try:
        task = Task.objects.enqueue(tasks.noop, delay=1.0)
        done = wait_for_status(task, Status.SUCCESSFUL, timeout=30)
        waited = (done.started_at - done.created_at).total_seconds()  # database clock
        assert 1.0 <= waited < 5
    finally:
        worker.stop()
        thread.join(30)


def test_the_listener_reconnects_after_its_backend_is_terminated(quiet) -> None:
    worker = Worker(concurrency=1, poll_interval=60)
    thread = run_in_thread(worker)
    try:
        # The watchdog's session listens, and holds the worker's registration.
        wait_until(lambda: WorkerProcess.objects.filter(name=worker.worker_id).exists(), 30)
        old = WorkerProcess.objects.get(name=worker.worker_id).backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old])
            assert cursor.fetchone()[0]
        # Registered again from a new session: it listens again.
        wait_until(lambda: WorkerProcess.objects.filter(name=worker.worker_id).exclude(
            backend_pid=old).exists(), 30, "the watchdog to reconnect")
        task = Task.objects.enqueue(tasks.noop)
        wait_for_status(task, Status.SUCCESSFUL, timeout=30)
    finally:
        worker.stop()
        thread.join(30)


def test_each_delayed_task_wakes_the_worker_when_it_is_due(quiet) -> None:
    worker = Worker(concurrency=1, poll_interval=60)
    thread = run_in_thread(worker)
    try:
        first = Task.objects.enqueue(tasks.noop, delay=1.0)
        second = Task.objects.enqueue(tasks.noop, delay=2.0)
        for task, delay in ((first, 1.0), (second, 2.0)):
            done = wait_for_status(task, Status.SUCCESSFUL, timeout=30)
            waited = (done.started_at - done.created_at).total_seconds()
            assert delay <= waited < delay + 10  # not the minute-long poll
    finally:
        worker.stop()
        thread.join(30)


def test_an_idle_worker_without_notifications_waits_for_its_poll(quiet, settings) -> None:
    """The control experiment: with LISTEN off, the same worker only finds work by polling."""
    settings.PGTASKS = {**settings.PGTASKS, "LISTEN": False}
    worker = Worker(concurrency=1, poll_interval=10)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until_asleep(worker)  # its look for work at start-up is done
        task = Task.objects.enqueue(tasks.noop)
        done = wait_for_status(task, Status.SUCCESSFUL, timeout=60)
        # Found at the poll, 10 s after the worker fell asleep: at least 5 s after the
        # enqueue, unless the enqueue itself took more than 5 s.
        assert (done.started_at - done.created_at).total_seconds() >= 5
    finally:
        worker.stop()
        thread.join(30)


def test_without_listen_the_worker_polls(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "LISTEN": False}
    worker = Worker(concurrency=1, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        # The watchdog keeps its session (liveness) but listens to nothing.
        wait_until(lambda: WorkerProcess.objects.filter(name=worker.worker_id).exists(), 30)
        assert not worker.listener.listen
        backend = WorkerProcess.objects.get(name=worker.worker_id).backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [backend])
            assert "LISTEN" not in cursor.fetchone()[0]
        task = Task.objects.enqueue(tasks.noop)
        wait_for_status(task, Status.SUCCESSFUL, timeout=30)
    finally:
        worker.stop()
        thread.join(30)
