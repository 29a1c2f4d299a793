"""Helpers shared by the test modules: waiting for a condition, stopping worker processes."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable

from django_pgtasks.models import PENDING, Status, Task


def wait_until(condition: Callable[[], bool], timeout: float = 120, what: str = "") -> None:
    """Poll ``condition`` every 20 ms; fail the test if it is still false after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"Gave up waiting for {what or 'the condition'} "
                                 f"after {timeout:g}s.")
        time.sleep(0.02)


def all_finished() -> bool:
    """No task is waiting or running (in the default database)."""
    return not Task.objects.filter(status__in=[*PENDING, Status.RUNNING]).exists()


def stop_processes(processes: Iterable[subprocess.Popen], timeout: float = 120) -> list[str]:
    """SIGTERM each worker process, wait for it, and return what each one printed."""
    processes = list(processes)
    for process in processes:
        process.send_signal(signal.SIGTERM)
    return [process.communicate(timeout=timeout)[0] for process in processes]
