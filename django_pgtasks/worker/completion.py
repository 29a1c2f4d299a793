"""Outcomes waiting for the worker's loop to record them, in batches.

Recording each outcome in its own transaction costs one commit (one WAL flush) per task, and
a pool thread would wait for it before starting its next task, holding a database connection
for nothing but that. Instead a pool thread hands its task's outcome in here and moves on; the
worker's loop, on the connection it already has for claims, records everything handed in
within ``COMPLETION_WINDOW`` seconds (at most ``COMPLETION_BATCH`` per statement) through its
:class:`~django_pgtasks.lifecycle.recorder.Recorder`, which splits a batch the database refuses
so
only the culprit fails. The handler's callbacks then run on a pool thread again.

So a worker's own work needs four connections whatever its number of threads: the loop's
(claims, outcomes), the watchdog's (liveness, notifications), the maintainer's (rescue,
partitions, purge, scheduler) and the releaser's (workflow children). A pool thread opens
one only if its handler uses the database.

The trade-off, and why it only applies to the default (at-least-once) mode: an outcome that
is waiting in the window when the worker process dies is not recorded, so that task is
rescued and runs again. That is the same outcome as a crash a moment earlier, inside the
handler, which the at-least-once mode already allows; the window (5 ms by default) only widens
it slightly. Handlers registered with ``atomic=True`` never go through here: their completion
commits with their own writes, exactly once. ``COMPLETION_WINDOW = 0`` records each outcome on
its own thread at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django_pgtasks.lifecycle.transitions import Outcome

#: An outcome handed in, what to call once it is recorded (with the task's new status: ``""``
#: if it was no longer held, ``None`` if nothing could be recorded), and when it came.
Entry = tuple[Any, Outcome, Callable[[str | None], None], float]


class PendingOutcomes:
    """Thread-safe: pool threads (and the watchdog) add, the worker's loop takes."""

    def __init__(self, window: float, max_batch: int) -> None:
        self.window = window
        self.max_batch = max_batch
        self._entries: list[Entry] = []
        self._ids: set[int] = set()
        self._lock = threading.Lock()

    def add(self, task: Any, outcome: Outcome, done: Callable[[str | None], None]) -> None:
        with self._lock:
            self._entries.append((task, outcome, done, time.monotonic()))
            self._ids.add(task.pk)

    def ids(self) -> set[int]:
        """Ids of the tasks whose outcome is handed in and not recorded yet."""
        with self._lock:
            return set(self._ids)

    def due_in(self) -> float | None:
        """Seconds until the waiting outcomes should be recorded (``None``: none waits)."""
        with self._lock:
            if not self._entries:
                return None
            if len(self._entries) >= self.max_batch:
                return 0.0
            return max(self._entries[0][3] + self.window - time.monotonic(), 0.0)

    def take(self) -> list[Entry]:
        """Remove and return up to ``max_batch`` waiting outcomes, the oldest first. Their
        ids stay listed until :meth:`forget` (the orphan check must not take them back)."""
        with self._lock:
            taken, self._entries = (self._entries[:self.max_batch],
                                    self._entries[self.max_batch:])
            return taken

    def forget(self, entries: list[Entry]) -> None:
        with self._lock:
            self._ids.difference_update(task.pk for task, *_ in entries)
