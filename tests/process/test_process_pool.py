"""``run_pgtasks --pool process`` against hostile handlers, and ``kill -9`` of the worker.

Every handler here records each of its runs (``tests.testapp.tasks.record_run``): its pid, its
parent's (the fork server's), and how many processes of the task's earlier runs still ran when
it started. No two runs of a task overlap: each starts once the last one's process is gone
(``alive=0``), and after that run's end was recorded (its entry in ``Task.errors``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.models import Status, Task, WorkerProcess
from tests.helpers import Output, stop_processes, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _runs(task: Task) -> list[dict[str, Any]]:
    """The runs ``task``'s handler recorded, in order."""
    runs = []
    for row in Execution.objects.filter(task_id=task.pk).order_by("pk"):
        fields = dict(re.findall(r"(\w+)=(\d+)", row.worker))
        runs.append({"pid": int(fields["pid"]), "ppid": int(fields["ppid"]),
                     "alive": int(fields["alive"]), "at": row.created_at})
    return runs


def _assert_no_overlap(task: Task, runs: list[dict[str, Any]]) -> None:
    """Each run started once the process of the one before was gone, and after that run's
    end was recorded."""
    assert [run["alive"] for run in runs] == [0] * len(runs), runs
    assert len({run["pid"] for run in runs}) == len(runs), runs  # a new child each time
    ends = [datetime.fromisoformat(error["at"]) for error in task.errors]
    for end, next_run in zip(ends, runs[1:], strict=False):
        assert end <= next_run["at"], (end, next_run)


def _start(start_command, name: str, *options: str) -> tuple[subprocess.Popen, Output]:
    process = start_command("run_pgtasks", "--pool", "process", "--worker-id", name,
                            "--poll-interval", "0.2", *options)
    return process, Output(process)


def _stop(process: subprocess.Popen, runs: list[dict[str, Any]]) -> str:
    """Stop the worker (SIGTERM); check that it exits 0 and leaves no process behind."""
    output = stop_processes([process])[0]
    assert process.returncode == 0, output
    leftovers = {run["pid"] for run in runs} | {run["ppid"] for run in runs}
    assert all(tasks.process_is_gone(pid) for pid in leftovers), output
    return output


def _ended(task: Task, status: str = Status.FAILED, timeout: float = 90) -> Task:
    wait_until(lambda: Task.objects.get(pk=task.pk).status == status, timeout=timeout,
               what=f"task {task.pk} to end {status}")
    return Task.objects.get(pk=task.pk)


@pytest.mark.parametrize("how", ["sleep", "busy"])
def test_a_handler_over_its_time_limit_is_stopped_with_sigterm_and_retried_after_it_is_gone(
        start_command, how: str) -> None:
    """``time.sleep(3600)`` (hung in C) and ``while True: pass`` (pure Python) alike."""
    process, out = _start(start_command, f"limit-{how}")
    task = _ended(Task.objects.enqueue(tasks.hostile, how))
    runs = _runs(task)
    assert (task.attempt, len(runs)) == (2, 2), (task.errors, out.text)
    for error, run in zip(task.errors, runs, strict=True):
        assert error["error"] == (
            f"django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit of 1s; "
            f"its child process {run['pid']} was stopped with SIGTERM (killed by SIGTERM).")
    _assert_no_overlap(task, runs)
    _stop(process, runs)


def test_a_handler_that_ignores_sigterm_is_killed_after_the_grace(start_command) -> None:
    process, _ = _start(start_command, "limit-ignored")
    task = _ended(Task.objects.enqueue(tasks.hostile, "ignore_term", max_attempts=1))
    [run] = _runs(task)
    assert task.error_text == (
        f"django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit of 1s; its "
        f"child process {run['pid']} was stopped with SIGKILL, 5s after a SIGTERM it did not "
        f"end on.")
    _stop(process, [run])


@pytest.mark.parametrize(("how", "death"), [
    ("segfault", "was killed by SIGSEGV"),  # ctypes.string_at(0)
    ("exit", "exited with code 3"),  # os._exit(3)
    ("kill", "was killed by SIGKILL"),  # as by the out-of-memory killer
])
def test_a_child_that_dies_ends_its_run_as_an_interruption_within_the_budget(
        start_command, how: str, death: str) -> None:
    process, out = _start(start_command, f"dies-{how}")
    task = _ended(Task.objects.enqueue(tasks.hostile, how))
    runs = _runs(task)
    budget = pgtasks_settings.MAX_INTERRUPTIONS
    # Each death is an interruption (the attempt given back); one past the budget fails it.
    assert (task.attempt, task.interruptions, len(runs)) == (1, budget + 1, budget + 1), \
        out.text
    for error, run in zip(task.errors, runs, strict=True):
        assert error["error"] == (
            f"django_pgtasks.exceptions.ChildProcessDied: The child process {run['pid']} "
            f"running the task {death} before the run ended.")
    assert task.error_text.startswith("django_pgtasks.exceptions.TooManyInterruptions: ")
    assert task.error_text.endswith(f"The last interruption ({budget + 1}): "
                                    f"{task.errors[-1]['error']}")
    _assert_no_overlap(task, runs)
    # The worker lives on, and so does its pool.
    after = _ended(Task.objects.enqueue(tasks.add, 1, 2), Status.SUCCESSFUL)
    assert after.result == 3
    _stop(process, runs)


def test_a_memory_hog_gets_its_child_replaced(start_command) -> None:
    process, out = _start(start_command, "hog", "--max-memory-per-child", "150")
    hog = _ended(Task.objects.enqueue(tasks.hog, 200), Status.SUCCESSFUL)
    after = _ended(Task.objects.enqueue(tasks.where_am_i), Status.SUCCESSFUL)
    assert after.result["pid"] != hog.result
    out.wait_for(rf"Replacing child process {hog.result} of the process pool: \d+ MiB "
                 rf"resident after its last task \(max_memory_per_child 150 MiB\)")
    _stop(process, _runs(hog))


def test_kill_9_of_the_worker_takes_its_children_with_it(start_command, tmp_path) -> None:
    gate = tmp_path / "gate"
    first, _ = _start(start_command, "killed")
    task = Task.objects.enqueue(tasks.records_and_waits, str(gate))
    wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(),
               what="the handler to start")
    [run] = _runs(task)
    assert run["ppid"] != first.pid  # the child of the fork server, itself the worker's
    assert _parent_of(run["ppid"]) == first.pid
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    # No orphan runs on: the fork server and its child die with the worker.
    wait_until(lambda: tasks.process_is_gone(run["pid"]) and tasks.process_is_gone(run["ppid"]),
               timeout=30, what="the worker's child and fork server to be gone")
    assert Task.objects.get(pk=task.pk).status == Status.RUNNING  # not rescued yet
    gate.touch()  # the next run ends at once
    second, _ = _start(start_command, "rescuer")
    task = _ended(task, Status.SUCCESSFUL)
    runs = _runs(task)
    assert (task.attempt, task.interruptions, len(runs)) == (1, 1, 2)
    assert task.errors[0]["error"].startswith("django_pgtasks.exceptions.WorkerLost: worker "
                                              "killed stopped")
    assert task.worker_ids == ["rescuer"]
    _assert_no_overlap(task, runs)
    assert WorkerProcess.objects.filter(name="rescuer").exists()
    _stop(second, runs)


def test_a_worker_stopped_past_its_grace_leaves_no_child_running(start_command,
                                                                tmp_path) -> None:
    process, out = _start(start_command, "grace", "--shutdown-grace", "0.5")
    task = Task.objects.enqueue(tasks.records_and_waits, str(tmp_path / "never"))
    wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(),
               what="the handler to start")
    [run] = _runs(task)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 1, out.text
    assert tasks.process_is_gone(run["pid"])
    assert tasks.process_is_gone(run["ppid"])
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.READY, 0, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.WorkerShutdown: ")


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[1])
