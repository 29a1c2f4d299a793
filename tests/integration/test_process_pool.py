"""The process pool (``--pool process``) in an in-process worker: what runs where, and what a
child's limits and deaths do. The hostile handlers against a real ``run_pgtasks`` process,
and ``kill -9`` of the worker, are in ``tests/process/test_process_pool.py``."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
from django_pgtasks.worker.pools.forkserver import ForkServer
from tests.helpers import running_worker, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def _children_of(pid: int) -> set[int]:
    """The pids of the processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat.rpartition(b")")[2].split()
            if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                found.add(int(entry.name))
    return found


def _descendants() -> set[int]:
    """This process's children (a worker in a thread forks its fork server from here) and
    theirs."""
    first = _children_of(os.getpid())
    return first | {pid for parent in first for pid in _children_of(parent)}


def test_tasks_run_in_child_processes_on_connections_of_their_own() -> None:
    before = _descendants()
    runs = [Task.objects.enqueue(tasks.where_am_i) for _ in range(6)]
    assert Worker(concurrency=2, burst=True, pool="process").run(install_signals=False) == 0
    results = [Task.objects.get(pk=task.pk) for task in runs]
    assert [(t.status, t.error_text[:3000]) for t in results if t.status != Status.SUCCESSFUL] == []
    pids = {task.result["pid"] for task in results}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2  # one child per slot, kept from task to task
    # Each child opened its own connection after it was forked; no two share a backend.
    assert all(task.result["own_connection"] for task in results)
    backends = {task.result["pid"]: task.result["backend"] for task in results}
    assert len(set(backends.values())) == len(backends)
    # Nothing is left: the children and the fork server are gone.
    assert _descendants() <= before


def test_atomic_handlers_keep_exactly_once_when_a_child_is_killed_mid_transaction() -> None:
    task = Task.objects.enqueue(tasks.atomic_hangs_once)
    assert Worker(concurrency=1, burst=True, pool="process").run(install_signals=False) == 0
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.SUCCESSFUL, 2)
    # The first attempt's row was rolled back with its killed child's transaction.
    assert list(Execution.objects.filter(task_id=task.pk).values_list("attempt", flat=True)) \
        == [2]
    assert task.errors[0]["error"].startswith(
        "django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit of 1s; its "
        "child process ")
    assert task.result != int(task.errors[0]["error"].split("child process ")[1].split()[0])


def test_max_tasks_per_child_replaces_the_child_between_tasks() -> None:
    runs = [Task.objects.enqueue(tasks.where_am_i) for _ in range(3)]
    worker = Worker(concurrency=1, burst=True, pool="process", max_tasks_per_child=1)
    assert worker.run(install_signals=False) == 0
    pids = [Task.objects.get(pk=task.pk).result["pid"] for task in runs]
    assert len(set(pids)) == 3


def test_max_memory_per_child_replaces_a_child_that_grew() -> None:
    hog = Task.objects.enqueue(tasks.hog, 200)
    after = Task.objects.enqueue(tasks.where_am_i, priority=0)
    worker = Worker(concurrency=1, burst=True, pool="process", max_memory_per_child=150)
    assert worker.run(install_signals=False) == 0
    hog.refresh_from_db()
    after.refresh_from_db()
    assert hog.status == after.status == Status.SUCCESSFUL
    assert hog.result != after.result["pid"]  # a new child, its memory back to the start


def test_a_cancellation_reaches_the_handler_in_its_child(tmp_path: Path) -> None:
    started = tmp_path / "started"
    task = Task.objects.enqueue(tasks.waits_for_cancel, str(started))
    with running_worker(pool="process", concurrency=1):
        wait_until(started.exists, what="the handler to start")
        Task.objects.filter(pk=task.pk).cancel()
        wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.CANCELLED,
                   timeout=30, what="the task to be cancelled")


def _ran(task: Task) -> list[str]:
    return list(Execution.objects.filter(task_id=task.pk).values_list("worker", flat=True))


def test_a_handler_that_ignores_its_cancellation_is_stopped_once_the_grace_is_over(
        tmp_path: Path) -> None:
    noticed, gate = tmp_path / "noticed", tmp_path / "gate"  # the gate never opens
    task = Task.objects.enqueue(tasks.runs_on_after_cancel, str(noticed), str(gate))
    with running_worker(pool="process", concurrency=1, cancel_grace=0.5):
        wait_until(lambda: _ran(task), what="the handler to start")
        assert Task.objects.filter(pk=task.pk).cancel().stopping == 1
        wait_until(noticed.exists, what="the handler to see its cancellation, and run on")
        wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.CANCELLED,
                   timeout=30, what="the task to be stopped")
        task.refresh_from_db()
        pid = int(_ran(task)[0].split()[0].removeprefix("pid="))
        assert task.error_text.startswith(
            f"django_pgtasks.exceptions.TaskCancelled: Task {task.pk} was cancelled while it "
            f"ran; its handler was still running 0.5s after the request (CANCEL_GRACE), and "
            f"its child process {pid} was stopped with SIGTERM (killed by SIGTERM).")
        assert tasks.process_is_gone(pid)  # stopped before the outcome was recorded
        assert (task.attempt, len(_ran(task))) == (1, 1)
        # The slot goes on with a new child.
        after = Task.objects.enqueue(tasks.where_am_i)
        wait_until(lambda: Task.objects.get(pk=after.pk).status == Status.SUCCESSFUL,
                   timeout=30, what="the next task to run")
        assert Task.objects.get(pk=after.pk).result["pid"] != pid
    task.refresh_from_db()
    assert (task.status, task.attempt, len(_ran(task))) == (Status.CANCELLED, 1, 1)


def test_a_handler_that_ends_within_the_grace_keeps_its_outcome(tmp_path: Path) -> None:
    noticed, gate = tmp_path / "noticed", tmp_path / "gate"
    task = Task.objects.enqueue(tasks.runs_on_after_cancel, str(noticed), str(gate))
    with running_worker(pool="process", concurrency=1, cancel_grace=120):
        wait_until(lambda: _ran(task), what="the handler to start")
        Task.objects.filter(pk=task.pk).cancel()
        wait_until(noticed.exists, what="the handler to see its cancellation")
        gate.touch()
        wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL,
                   timeout=30, what="the handler to finish")
    task.refresh_from_db()
    assert (task.attempt, task.cancel_requested, task.error_text) == (1, True, "")
    assert task.result != os.getpid()  # it ran in a child, to its end


def test_an_atomic_handler_stopped_after_its_cancellation_leaves_no_write(
        tmp_path: Path) -> None:
    started = tmp_path / "started"
    task = Task.objects.enqueue(tasks.atomic_hangs, str(started))
    with running_worker(pool="process", concurrency=1, cancel_grace=0):
        wait_until(started.exists, what="the handler to write its row and hang")
        Task.objects.filter(pk=task.pk).cancel()
        wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.CANCELLED,
                   timeout=30, what="the task to be stopped")
    task.refresh_from_db()
    assert task.error_text.startswith("django_pgtasks.exceptions.TaskCancelled: ")
    assert "0s after the request (CANCEL_GRACE)" in task.error_text
    # Its row was rolled back with the killed child's transaction.
    assert (_ran(task), task.attempt) == ([], 1)


def test_signals_and_callbacks_run_in_the_worker() -> None:
    from django_pgtasks.signals import task_finished, task_started

    seen: list[tuple[str, int, int]] = []

    def started(sender, task, **kwargs) -> None:
        seen.append(("started", task.pk, os.getpid()))

    def finished(sender, task, status, **kwargs) -> None:
        seen.append((f"finished {status}", task.pk, os.getpid()))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok = Task.objects.enqueue(tasks.add, 1, 2)
        worker = Worker(concurrency=1, burst=True, pool="process")
        assert worker.run(install_signals=False) == 0
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert seen == [("started", ok.pk, os.getpid()),
                    (f"finished {Status.SUCCESSFUL}", ok.pk, os.getpid())]
    assert worker.processed == 1
    assert Task.objects.get(pk=ok.pk).result == 3


def test_a_shutdown_past_its_grace_kills_the_children_before_giving_their_tasks_back(
        tmp_path: Path) -> None:
    started = tmp_path / "started"
    task = Task.objects.enqueue(tasks.waits_for, str(tmp_path / "never"), 600, str(started))
    before = _descendants()
    worker = Worker(concurrency=1, pool="process", shutdown_grace=0.2)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run(install_signals=False)))
    thread.start()
    try:
        wait_until(started.exists, what="the handler to start")
        child = next(iter(_descendants() - before))
    finally:
        worker.stop()
        thread.join(60)
    assert codes == [1]
    task.refresh_from_db()
    assert (task.status, task.interruptions) == (Status.READY, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.WorkerShutdown: ")
    assert tasks.process_is_gone(child)
    assert _descendants() <= before


def test_a_fork_server_kills_its_children_when_closed() -> None:
    ready = threading.Event()

    def child_main(channel) -> None:
        channel.recv(1)  # until the fork server is gone

    server = ForkServer(child_main, on_lost=ready.set)
    pid, channel = server.spawn()
    assert not tasks.process_is_gone(pid)
    server.signal(pid, signal.SIGSTOP)  # signals go through the fork server
    wait_until(lambda: Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
               == b"T", timeout=10, what="the child to stop")
    server.close()
    assert tasks.process_is_gone(pid)
    assert tasks.process_is_gone(server.pid)
    assert not ready.is_set()  # closed, not lost
    channel.close()


@pytest.mark.parametrize("window", [0, 0.005])
def test_every_kind_of_outcome_is_recorded_batched_or_not(settings, window: float) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": window}
    ok = Task.objects.enqueue(tasks.add, 2, 3)
    failed = Task.objects.enqueue(tasks.fatal_failure)
    atomic = Task.objects.enqueue(tasks.log_execution_atomic)
    unknown = Task.objects.enqueue(tasks.noop)
    Task.objects.filter(pk=unknown.pk).update(name="tests.testapp.tasks.no_such_handler")
    worker = Worker(concurrency=2, burst=True, pool="process")
    assert worker.run(install_signals=False) == 0
    assert Task.objects.get(pk=ok.pk).result == 5
    assert Task.objects.get(pk=failed.pk).status == Status.FAILED
    assert Task.objects.get(pk=atomic.pk).status == Status.SUCCESSFUL
    assert Execution.objects.filter(task_id=atomic.pk).count() == 1
    assert Task.objects.get(pk=unknown.pk).status == Status.FAILED
    assert worker.processed == 4
