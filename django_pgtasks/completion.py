"""Batched recording of successful tasks.

Recording each success in its own transaction costs one commit (one WAL flush) per task, and
the worker thread waits for it before starting the next task. A :class:`Completer` takes
successes from the pool threads, so they move straight on, and records everything that
arrived within ``COMPLETION_WINDOW`` seconds in one guarded UPDATE.

The trade-off, and why it only applies to the default (at-least-once) mode: a success that is
waiting in the window when the worker process dies is not recorded, so that task is rescued
and runs again. That is the same outcome as a crash a moment earlier, inside the handler,
which the at-least-once mode already allows; the window (5 ms by default) only widens it
slightly. Handlers registered with ``atomic=True`` never go through here: their completion
commits with their own writes, exactly once. ``COMPLETION_WINDOW = 0`` turns batching off.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from .models import Task

logger = logging.getLogger("django_pgtasks.worker")

#: A success waiting to be recorded, and what to call once it is (with "was it recorded?").
Entry = tuple[Task, Any, Callable[[bool], None]]


class Completer:
    def __init__(self, using: str, window: float, max_batch: int, pause: float,
                 max_pause: float, give_up: threading.Event) -> None:
        self.using = using
        self.window = window
        self.max_batch = max_batch
        self.pause = pause
        self.max_pause = max_pause
        self.give_up = give_up
        self._queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pgtasks-completer",
                                        daemon=True)
        self._thread.start()

    def add(self, task: Task, result: Any, done: Callable[[bool], None]) -> None:
        with self._lock:
            self._pending.add(task.pk)
        self._queue.put((task, result, done))

    def pending_ids(self) -> set[int]:
        """Ids of the successes not recorded yet."""
        with self._lock:
            return set(self._pending)

    def close(self, timeout: float | None = None) -> None:
        """Record what is still waiting, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            stopping = False
            while not stopping:
                entry = self._queue.get()
                if entry is None:
                    break
                batch = [entry]
                deadline = time.monotonic() + self.window
                while len(batch) < self.max_batch:
                    try:
                        entry = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
                    except queue.Empty:
                        break
                    if entry is None:
                        stopping = True
                        break
                    batch.append(entry)
                self._flush(batch)
        finally:
            connections.close_all()

    def _flush(self, batch: list[Entry]) -> None:
        outcomes = [(task, result) for task, result, _ in batch]
        pause = self.pause
        while True:
            try:
                recorded = Task.objects.mark_many_succeeded(outcomes, using=self.using)
                break
            except (DatabaseError, InterfaceError) as exc:
                logger.warning("Database error while recording %d success(es): %s",
                               len(batch), exc)
                connections[self.using].close()
            if self.give_up.wait(pause):
                logger.error("Exiting before %d success(es) could be recorded; those tasks "
                             "will be rescued and run again.", len(batch))
                recorded = set()
                break
            pause = min(pause * 2, self.max_pause)
        with self._lock:
            self._pending.difference_update(task.pk for task, _, _ in batch)
        for task, _, done in batch:
            try:
                done(task.pk in recorded)
            except Exception:
                logger.exception("Error after recording task id=%s.", task.pk)
