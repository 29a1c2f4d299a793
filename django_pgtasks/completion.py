"""Batched recording of successful tasks.

Recording each success in its own transaction costs one commit (one WAL flush) per task, and
the worker thread waits for it before starting the next task. A :class:`Completer` takes
successes from the pool threads, so they move straight on, and records everything that
arrived within ``COMPLETION_WINDOW`` seconds in one guarded UPDATE, through the worker's
:class:`~django_pgtasks.transitions.Recorder` (so a batch holding one result the database
refuses is split, and only that task fails).

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

from django.db import connections

from .transitions import Recorder, Succeeded

logger = logging.getLogger("django_pgtasks.worker")

#: A success waiting to be recorded, and what to call once it is (with the task's new status:
#: ``""`` if it was no longer held, ``None`` if nothing could be recorded).
Entry = tuple[Any, Any, Callable[[str | None], None]]


class Completer:
    def __init__(self, window: float, max_batch: int, recorder: Recorder, *,
                 on_unrecorded: Callable[[], None]) -> None:
        self.window = window
        self.max_batch = max_batch
        self.recorder = recorder
        self.on_unrecorded = on_unrecorded
        self._queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pgtasks-completer",
                                        daemon=True)
        self._thread.start()

    def add(self, task: Any, result: Any, done: Callable[[str | None], None]) -> None:
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
        try:
            statuses = self.recorder.record(
                [(task, Succeeded(result)) for task, result, _ in batch])
        except Exception:  # a defect in recording itself: leave the tasks to the orphan check
            logger.exception("Error while recording %d success(es).", len(batch))
            statuses = {}
        with self._lock:
            self._pending.difference_update(task.pk for task, _, _ in batch)
        if any(statuses.get(task.pk) is None for task, _, _ in batch):
            self.on_unrecorded()
        for task, _, done in batch:
            try:
                done(statuses.get(task.pk))
            except Exception:
                logger.exception("Error after recording task id=%s.", task.pk)
