"""The worker's fixed pool of threads that run claimed tasks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from django_pgtasks.worker.pools.slots import Run, SlotPool, Task

logger = logging.getLogger("django_pgtasks.worker")


@dataclass(eq=False)
class _Slot(Run):
    thread: threading.Thread | None = None
    deadline: float | None = None


class ThreadPool(SlotPool):
    """A fixed set of threads that run ``target(task)`` for submitted tasks.

    Unlike ``concurrent.futures.ThreadPoolExecutor``: each thread closes its own database
    connections when the pool shuts down (Django connections belong to the thread that opened
    them); the pool knows which tasks run right now and since when, so it can enforce time
    limits; a thread stuck in a timed-out handler can be abandoned and replaced; and threads
    are daemons, so a forced exit never waits for a stuck handler.
    """

    def __init__(self, size: int, target: Callable[[Task], None],
                 slot_freed: threading.Event,
                 on_crash: Callable[[Task, BaseException], None] | None = None) -> None:
        super().__init__(slot_freed)
        self._target = target
        self._on_crash = on_crash
        self._active: set[threading.Thread] = set()
        self._abandoned: set[threading.Thread] = set()
        self._started = 0
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"pgtasks-{self._started}",
                                  daemon=True)
        self._started += 1
        self._active.add(thread)
        thread.start()

    def _new_run(self, task: Task, limit: float | None) -> _Slot:
        return _Slot(task, limit)

    @property
    def stuck(self) -> int:
        """Threads still running a handler whose task timed out."""
        with self._lock:
            return sum(1 for t in self._abandoned if t.is_alive())

    def overdue(self) -> list[tuple[Task, float]]:
        now = time.monotonic()
        with self._lock:
            return [(slot.task, slot.limit) for slot in self._running.values()
                    if isinstance(slot, _Slot) and slot.deadline is not None
                    and now > slot.deadline]

    def abandon(self, task: Task) -> None:
        """Give up on a timed-out task: free its slot and replace the thread running it."""
        with self._lock:
            slot = self._running.pop(task.pk, None)
            if not isinstance(slot, _Slot) or slot.thread is None:
                return
            self._active.discard(slot.thread)
            self._abandoned.add(slot.thread)
            self._start_thread()
        self._slot_freed.set()

    def shutdown(self) -> None:
        """Stop the threads once they ran what is queued."""
        with self._lock:
            active = list(self._active)
        self._closing.set()
        self._end_slots(len(active))
        for thread in active:
            thread.join()

    def terminate(self) -> None:
        """Past the worker's shutdown grace: nothing to do (a thread cannot be stopped; its
        late outcome is refused by the lease guard)."""

    def _starting(self, run: Run) -> None:
        if isinstance(run, _Slot):
            run.thread = threading.current_thread()
            if run.limit is not None:
                run.deadline = time.monotonic() + run.limit

    def _keeps_slot(self, run: Run) -> bool:
        me = threading.current_thread()
        if me in self._abandoned:  # timed out: a replacement thread has taken over the slot
            self._abandoned.discard(me)
            return False
        return True

    def _loop(self) -> None:
        try:
            while (run := self._next()) is not None:
                task = run.task
                try:
                    self._target(task)
                except BaseException as exc:  # keep the thread (and its slot) alive
                    logger.exception("Internal error while running task id=%s.", task.pk)
                    if self._on_crash is not None:
                        try:  # the task must not stay RUNNING under a live worker
                            self._on_crash(task, exc)
                        except BaseException:
                            logger.exception("Task id=%s: the internal error could not be "
                                             "recorded; the task waits for the rescue.",
                                             task.pk)
                rest = self._finished(run)
                if rest is None:  # abandoned: a replacement thread has taken over the slot
                    return
                if rest:
                    self._rest_for(rest)
        finally:
            connections.close_all()
