"""Waiting for a task's result: woken by the completion's NOTIFY, not by polling."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_pgtasks.exceptions import PgTasksError, TaskWaitTimeout
from django_pgtasks.lifecycle import waiting
from django_pgtasks.models import Status, Task
from django_pgtasks.testing import drain
from django_pgtasks.worker.loop import Worker
from tests.helpers import notifications, wait_until
from tests.testapp import cooperative, tasks

pytestmark = pytest.mark.django_db(transaction=True)

PATIENCE = 60.0
#: A safety-net poll so long that a waiter that returns in time was woken by NOTIFY.
NO_POLL = 3600.0


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker(concurrency=4)
    thread = threading.Thread(target=lambda: (w.run(install_signals=False),
                                              connections.close_all()))
    thread.start()
    yield w
    w.stop()
    thread.join(timeout=PATIENCE)


def test_wait_returns_a_finished_task_at_once() -> None:
    task = Task.objects.enqueue(tasks.add, 2, 3)
    drain()
    done = Task.objects.wait(task.pk, timeout=0)
    assert (done.status, done.result) == (Status.SUCCESSFUL, 5)
    assert done.awaited is False  # nobody had to wait: nothing written


@pytest.fixture
def wakeups(monkeypatch) -> list[bool]:
    """How each sleep of a waiter ended: True for its task's notification, False for a
    timeout (the poll, or the end of the wait)."""
    ends: list[bool] = []
    sleep = waiting._sleep

    def recorded(*args) -> bool:
        ends.append(sleep(*args))
        return ends[-1]

    monkeypatch.setattr(waiting, "_sleep", recorded)
    return ends


def opened_once_awaited(task: Task, gate: Path) -> threading.Thread:
    """A thread that opens ``gate`` once a waiter has marked ``task`` awaited (so the task
    cannot end before the waiter listens, however slow the machine)."""
    def open_gate() -> None:
        try:
            wait_until(lambda: Task.objects.filter(pk=task.pk, awaited=True).exists(),
                       PATIENCE, "the waiter to mark the task awaited")
            gate.touch()
        finally:
            connections.close_all()

    thread = threading.Thread(target=open_gate)
    thread.start()
    return thread


def test_wait_is_woken_by_the_completion(worker, wakeups, tmp_path) -> None:
    gate = tmp_path / "gate"
    task = Task.objects.enqueue(cooperative.gated_double, 21, str(gate))
    opener = opened_once_awaited(task, gate)
    done = Task.objects.wait(task, timeout=PATIENCE, poll_interval=NO_POLL)
    opener.join()
    assert (done.status, done.result, done.awaited) == (Status.SUCCESSFUL, 42, True)
    assert wakeups == [True]  # one sleep, ended by the task's NOTIFY


def test_wait_ends_on_failure_and_cancellation_too(worker, wakeups) -> None:
    failing = Task.objects.enqueue(tasks.always_fails, "nope", max_attempts=1)
    assert Task.objects.wait(failing, timeout=PATIENCE, poll_interval=NO_POLL).status == (
        Status.FAILED)
    later = Task.objects.enqueue(tasks.noop, delay=3600)

    def cancel_soon() -> None:
        try:
            wait_until(lambda: Task.objects.filter(pk=later.pk, awaited=True).exists(),
                       PATIENCE, "the waiter to mark the task awaited")
            Task.objects.filter(pk=later.pk).cancel()
        finally:
            connections.close_all()

    thread = threading.Thread(target=cancel_soon)
    thread.start()
    assert Task.objects.wait(later, timeout=PATIENCE, poll_interval=NO_POLL).status == (
        Status.CANCELLED)
    thread.join()
    assert False not in wakeups  # every wait ended by a notification


def test_wait_times_out_with_a_timeout_error() -> None:
    task = Task.objects.enqueue(tasks.noop)  # no worker runs
    with pytest.raises(TaskWaitTimeout, match=f"Task {task.pk} did not finish within 0.2 "
                                              f"seconds \\(it is READY\\)") as caught:
        Task.objects.wait(task, timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.task.status == Status.READY


def test_wait_refuses_unknown_and_uncommitted_tasks() -> None:
    with pytest.raises(Task.DoesNotExist):
        Task.objects.wait(2**62, timeout=1)
    with transaction.atomic():
        task = Task.objects.enqueue(tasks.noop)
        with pytest.raises(PgTasksError, match="is not committed yet"):
            Task.objects.wait(task, timeout=PATIENCE)


def test_only_awaited_tasks_notify_their_completion() -> None:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN pgtasks_finished")
        quiet = [Task.objects.enqueue(tasks.add, i, i) for i in range(20)]
        awaited = Task.objects.enqueue(tasks.add, 1, 1)
        Task.objects.filter(pk=awaited.pk).update(awaited=True)
        drain()
        heard = notifications(listener, "pgtasks_finished")
    assert heard == [str(awaited.pk)]
    assert Task.objects.filter(pk__in=[t.pk for t in quiet], status=Status.SUCCESSFUL).count() \
        == 20


def test_many_waiters_on_tasks_run_by_worker_processes(start_command, wakeups) -> None:
    """Ten threads wait for ten tasks that two worker processes run; each waiter gets its own
    task's result (completions batched in one UPDATE each notify their own waiter)."""
    for _ in range(2):
        start_command("run_pgtasks", "--concurrency", "4")
    work = [Task.objects.enqueue(cooperative.slow_double, i, 0.2) for i in range(10)]
    results: dict[int, tuple[str, int]] = {}
    errors: list[BaseException] = []

    def waiter(task: Task) -> None:
        try:
            done = Task.objects.wait(task, timeout=PATIENCE, poll_interval=NO_POLL)
            results[task.pk] = (done.status, done.result)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=waiter, args=(t,)) for t in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results == {t.pk: (Status.SUCCESSFUL, i * 2) for i, t in enumerate(work)}
    assert False not in wakeups  # each waiter was woken by its own task's notification


def test_wait_for_a_django_tasks_result(worker) -> None:
    from django_pgtasks.lifecycle.waiting import wait_for_result
    from tests.djtasks import multiply

    result = multiply.enqueue(6, 7)
    assert wait_for_result(result, timeout=PATIENCE, poll_interval=NO_POLL) is result
    assert (result.status, result.return_value) == ("SUCCESSFUL", 42)
    again = result.task.get_backend().wait_result(result.id, timeout=0)
    assert again.return_value == 42
