"""What the thread and the process pools share: a fixed number of slots that take the
submitted tasks from one queue, in order, and the bookkeeping of what was submitted, what
runs and which slots rest.

A slot is a thread of the pool (it runs the handler, or hands the task to its child
process). Its loop is::

    while (run := self._next()) is not None:
        ...run it...
        rest = self._finished(run)
        if rest:
            self._rest_for(rest)
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

#: A claimed task as a pool sees it: its id is all the bookkeeping reads.
Task = Any


@dataclass(eq=False)
class Run:
    """A submitted task: its time limit, and whether a slot has taken it."""

    task: Task
    limit: float | None
    started: bool = False


class SlotPool:
    """The Pool interface's bookkeeping over slots fed by one queue (see the module
    docstring). A subclass starts its slots, runs what :meth:`_next` gives, and may make
    richer runs (:meth:`_new_run`) or keep a slot from freeing (:meth:`_keeps_slot`)."""

    def __init__(self, slot_freed: threading.Event) -> None:
        self._slot_freed = slot_freed
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        #: The runs submitted and not finished (or abandoned), by task id.
        self._running: dict[int, Run] = {}
        self._lock = threading.Lock()
        #: Slots resting after the database refused them a connection (:meth:`rest`).
        self._resting = 0
        self._rest = threading.local()
        #: Set when the pool shuts down: ends every rest.
        self._closing = threading.Event()

    def _new_run(self, task: Task, limit: float | None) -> Run:
        return Run(task, limit)

    # -- the Pool interface ------------------------------------------------------------------

    @property
    def busy(self) -> int:
        """Tasks submitted and not finished (or abandoned) yet."""
        return len(self._running)

    @property
    def started(self) -> int:
        """Tasks a slot has taken and not finished: :attr:`busy` without the submitted tasks
        still waiting for a slot (prefetched)."""
        with self._lock:
            return sum(1 for run in self._running.values() if run.started)

    @property
    def resting(self) -> int:
        """Slots that take no task for now (:meth:`rest`)."""
        return self._resting

    def rest(self, seconds: float) -> None:
        """Called on a slot's thread: once its current task ends, the slot takes no other
        for ``seconds`` (less if the pool shuts down). Its task's slot is free at once, and
        :attr:`resting` counts it meanwhile, so that nothing is claimed for it."""
        self._rest.seconds = seconds

    def get(self, pk: int) -> Task | None:
        """The submitted (not finished or abandoned) task with id ``pk``, if any."""
        with self._lock:
            run = self._running.get(pk)
            return run.task if run is not None else None

    def running(self) -> list[Task]:
        with self._lock:
            return [run.task for run in self._running.values()]

    def ids(self) -> set[int]:
        """Ids of the tasks submitted and not finished (or abandoned) yet."""
        with self._lock:
            return set(self._running)

    def submit(self, task: Task, limit: float | None = None) -> None:
        with self._lock:
            self._running[task.id] = self._new_run(task, limit)
        self._queue.put(task)

    def take_waiting(self) -> list[Task]:
        """Remove and return the submitted tasks no slot has taken yet."""
        taken = []
        with self._lock:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._running.pop(item.id, None)
                    taken.append(item)
        return taken

    # -- for the slots ---------------------------------------------------------------------

    def _end_slots(self, count: int) -> None:
        """Tell ``count`` slots to stop once they took what is queued before."""
        for _ in range(count):
            self._queue.put(None)

    def _next(self) -> Run | None:
        """On a slot's thread: the next submitted run (marked started), or ``None`` when the
        slot is to stop. A task taken back meanwhile is skipped."""
        while (task := self._queue.get()) is not None:
            with self._lock:
                run = self._running.get(task.id)
                if run is not None:
                    run.started = True
                    self._starting(run)
                    return run
        return None

    def _starting(self, run: Run) -> None:
        """Called under the lock as a slot takes ``run``."""

    def _keeps_slot(self, run: Run) -> bool:
        """Called under the lock once ``run`` ended: whether its slot is still this
        thread's (the thread pool's is not once the run was abandoned)."""
        return True

    def _finished(self, run: Run) -> float | None:
        """On a slot's thread, once ``run`` ended: forget it and free its slot. Returns the
        seconds the slot is to rest first (0: none), or ``None`` if the slot is no longer
        this thread's."""
        rest = getattr(self._rest, "seconds", 0.0)
        with self._lock:
            if not self._keeps_slot(run):
                return None
            # Only this run: once its outcome is recorded, the same task may already be
            # claimed again (a retry due at once) and submitted under the same id.
            if self._running.get(run.task.id) is run:
                del self._running[run.task.id]
            if rest:
                self._resting += 1  # counted before the slot is seen free
        if not self._slot_freed.is_set():  # pending already: as in Completion.hand_in
            self._slot_freed.set()
        return rest

    def _rest_for(self, seconds: float) -> None:
        """On a slot's thread: rest (see :meth:`rest`), then free the slot again."""
        self._rest.seconds = 0.0
        self._closing.wait(seconds)
        with self._lock:
            self._resting -= 1
        self._slot_freed.set()  # a slot is there again to run a task
