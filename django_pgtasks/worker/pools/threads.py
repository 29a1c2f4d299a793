"""The worker's fixed pool of threads that run claimed tasks."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

logger = logging.getLogger("django_pgtasks.worker")

#: A claimed task as the pool sees it: its id is all the pool reads.
Task = Any


@dataclass
class _Slot:
    task: Task
    limit: float | None
    thread: threading.Thread | None = None
    deadline: float | None = None


class ThreadPool:
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
        self._target = target
        self._on_crash = on_crash
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._running: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        self._slot_freed = slot_freed
        self._active: set[threading.Thread] = set()
        self._abandoned: set[threading.Thread] = set()
        self._started = 0
        #: Threads resting after the database refused them a connection (rest()).
        self._resting = 0
        self._rest = threading.local()
        self._closing = threading.Event()
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"pgtasks-{self._started}",
                                  daemon=True)
        self._started += 1
        self._active.add(thread)
        thread.start()

    @property
    def busy(self) -> int:
        """Tasks submitted and not finished (or abandoned) yet."""
        return len(self._running)

    @property
    def started(self) -> int:
        """Tasks a thread has started and not finished (or abandoned): :attr:`busy` without
        the submitted tasks still waiting for a thread (prefetched)."""
        with self._lock:
            return sum(1 for slot in self._running.values() if slot.thread is not None)

    @property
    def resting(self) -> int:
        """Threads that take no task for now (:meth:`rest`)."""
        return self._resting

    def rest(self, seconds: float) -> None:
        """Called from a pool thread's target: once its current task returns, the thread
        takes no other for ``seconds`` (less if the pool shuts down). Its slot is free at
        once, and :attr:`resting` counts it meanwhile, so that nothing is claimed for it."""
        self._rest.seconds = seconds

    @property
    def stuck(self) -> int:
        """Threads still running a handler whose task timed out."""
        with self._lock:
            return sum(1 for t in self._abandoned if t.is_alive())

    def get(self, pk: int) -> Task | None:
        """The submitted (not finished or abandoned) task with id ``pk``, if any."""
        with self._lock:
            slot = self._running.get(pk)
            return slot.task if slot is not None else None

    def running(self) -> list[Task]:
        with self._lock:
            return [slot.task for slot in self._running.values()]

    def ids(self) -> set[int]:
        """Ids of the tasks submitted and not finished (or abandoned) yet."""
        with self._lock:
            return set(self._running)

    def submit(self, task: Task, limit: float | None = None) -> None:
        with self._lock:
            self._running[task.pk] = _Slot(task, limit)
        self._queue.put(task)

    def take_waiting(self) -> list[Task]:
        """Remove and return the submitted tasks no thread has started yet."""
        taken = []
        with self._lock:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._running.pop(item.pk, None)
                    taken.append(item)
        return taken

    def overdue(self) -> list[tuple[Task, float]]:
        now = time.monotonic()
        with self._lock:
            return [(slot.task, slot.limit) for slot in self._running.values()
                    if slot.deadline is not None and now > slot.deadline]

    def abandon(self, task: Task) -> None:
        """Give up on a timed-out task: free its slot and replace the thread running it."""
        with self._lock:
            slot = self._running.pop(task.pk, None)
            if slot is None or slot.thread is None:
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
        for _ in active:
            self._queue.put(None)
        for thread in active:
            thread.join()

    def terminate(self) -> None:
        """Past the worker's shutdown grace: nothing to do (a thread cannot be stopped; its
        late outcome is refused by the lease guard)."""

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while (task := self._queue.get()) is not None:
                with self._lock:
                    slot = self._running.get(task.pk)
                    if slot is not None:
                        slot.thread = me
                        if slot.limit is not None:
                            slot.deadline = time.monotonic() + slot.limit
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
                rest = getattr(self._rest, "seconds", 0.0)
                with self._lock:
                    abandoned = me in self._abandoned
                    if abandoned:
                        self._abandoned.discard(me)
                    elif self._running.get(task.pk) is slot:
                        # Only this run's slot: once its outcome is recorded, the same task
                        # may already be claimed again (a retry due at once) and submitted
                        # under the same id.
                        del self._running[task.pk]
                    if rest and not abandoned:
                        self._resting += 1  # counted before the slot is seen free
                if abandoned:  # timed out: a replacement thread has taken over the slot
                    return
                self._slot_freed.set()
                if rest:
                    self._rest.seconds = 0.0
                    self._closing.wait(rest)
                    with self._lock:
                        self._resting -= 1
                    self._slot_freed.set()  # a thread is there again to run a task
        finally:
            connections.close_all()

