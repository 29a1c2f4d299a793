"""Outcomes waiting for the worker's loop to record them, in batches.

Recording each outcome in its own transaction costs one commit (one WAL flush) per task, and
a pool thread would wait for it before starting its next task, holding a database connection
for nothing but that. Instead a pool thread hands its task's outcome in here and moves on; the
worker's loop, on the connection it already has for claims, records everything handed in
within ``COMPLETION_WINDOW`` seconds (at most ``COMPLETION_BATCH`` per statement) through its
:class:`~django_pgtasks.lifecycle.recorder.Recorder`, which splits a batch the database refuses
so only the culprit fails. What follows an outcome (the handler's ``finished()``, the signals, the
log line) then runs at once on a thread of its own (:class:`Callbacks`). :class:`Completion`
is the worker's part that holds both.

So a worker's own work needs four connections whatever its number of threads: the loop's
(claims, outcomes), the watchdog's (liveness, notifications), the maintainer's (rescue,
partitions, purge, scheduler) and the releaser's (workflow children). A pool thread opens
one only if its handler uses the database, the callbacks' thread only if a receiver does.

The trade-off, and why it only applies to the default (at-least-once) mode: an outcome that
is waiting in the window when the worker process dies is not recorded, so that task is
rescued and runs again. That is the same outcome as a crash a moment earlier, inside the
handler, which the at-least-once mode already allows; the window (5 ms by default) only widens
it slightly. Handlers registered with ``atomic=True`` never go through here: their completion
commits with their own writes, exactly once. ``COMPLETION_WINDOW = 0`` records each outcome on
its own thread at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.transitions import Interrupted, Outcome
from django_pgtasks.worker.tracing import end_run

logger = logging.getLogger("django_pgtasks.worker")

#: Most outcomes recorded by one batched statement.
COMPLETION_BATCH = 500

#: An outcome handed in, what to call once it is recorded (with the task's new status: ``""``
#: if it was no longer held, ``None`` if nothing could be recorded), and when it came.
Entry = tuple[Any, Outcome, Callable[[str | None], None], float]


class Completion:
    """The worker's part that records the outcomes handed in, in batches, on the loop's
    thread and connection, then runs their callbacks on the callbacks' thread.

    It owns the outcomes waiting to be recorded (:class:`PendingOutcomes`) and the callbacks'
    thread (:class:`Callbacks`); it records through the ``recorder`` it is given, and talks
    back through ``wakeup`` (an outcome was handed in), ``on_release()`` (a task with
    dependents ended) and ``lost()`` (some outcome could not be recorded).
    """

    def __init__(self, recorder: Recorder, *, window: float, wakeup: threading.Event,
                 on_release: Callable[[], None], lost: Callable[[], None]) -> None:
        self.recorder = recorder
        self._pending = PendingOutcomes(window, COMPLETION_BATCH)
        self._callbacks = Callbacks()
        self._wakeup = wakeup
        self._on_release = on_release
        self._lost = lost

    def hand_in(self, task: Any, outcome: Outcome,
                done: Callable[[str | None], object] | None = None) -> None:
        """Take ``outcome`` to record it with the others (then ``done(status)`` runs on the
        callbacks' thread; by default, it ends the run's span), and wake the loop.
        Thread-safe: called by pool threads and the watchdog."""
        if done is None:
            def done(status: str | None) -> None:
                end_run(task, status, outcome, None)

        self._pending.add(task, outcome, done)
        # Set only if not set already: the loop clears the wake-up before it reads what it
        # was woken for (Worker._sleep), so a wake-up still pending covers this outcome too,
        # and set() takes a lock and notifies even when there is nothing to change.
        if not self._wakeup.is_set():
            self._wakeup.set()

    def due_in(self) -> float | None:
        """Seconds until the outcomes handed in should be recorded (``None``: none waits)."""
        return self._pending.due_in()

    def ids(self) -> set[int]:
        """Ids of the tasks whose outcome is handed in and not recorded yet."""
        return self._pending.ids()

    def record(self, everything: bool = False) -> int:
        """Record the outcomes handed in, once the oldest has waited ``COMPLETION_WINDOW``
        (or a batch is full; ``everything``: all of them now), then run their callbacks on
        the callbacks' thread (not a pool thread, which may be busy for hours). Returns how
        many outcomes were taken to be recorded."""
        taken = 0
        while (due := self._pending.due_in()) is not None and (everything or due <= 0):
            entries = self._pending.take()
            taken += len(entries)
            try:
                statuses = self.recorder.record([(task, outcome) for task, outcome, *_ in entries])
            except Exception:  # a defect in recording itself: the orphan check takes over
                logger.exception("Error while recording %d outcome(s).", len(entries))
                statuses = {}
            self._pending.forget(entries)
            if any(getattr(task, "has_dependents", False) for task, *_ in entries):
                self._on_release()  # the notification may be off or late
            if any(statuses.get(task.id) is None for task, *_ in entries):
                self._lost()
            # The batch's callbacks go to their thread as one job, not one each: a hand-off to
            # a thread costs more than a quick callback (signals, a log line).
            calls = [(done, statuses.get(task.id)) for task, _outcome, done, _at in entries]
            self._callbacks.call(lambda calls=calls: _call_each(calls))
        return taken

    def interrupt(self, tasks: list[Any], reason: str) -> None:
        """Record the runs of ``tasks`` as interrupted, now and on this thread: the worker
        exits without waiting for them (a shutdown past its grace)."""
        interrupted = Interrupted(reason)
        statuses = self.recorder.record([(task, interrupted) for task in tasks])
        for task in tasks:  # their threads may never finish: their spans end here
            end_run(task, statuses.get(task.id), interrupted, None)

    def stop(self, timeout: float) -> bool:
        """Let the callbacks called so far run, then end their thread; ``False`` if they
        still run after ``timeout`` seconds (see :meth:`Callbacks.stop`)."""
        return self._callbacks.stop(timeout)


class PendingOutcomes:
    """Thread-safe without a lock: pool threads (and the watchdog) add, and only the worker's
    loop takes. ``deque.append``/``popleft`` and a set's ``add``, copy and ``discard`` each
    happen in one step under the interpreter lock; a lock of its own, taken by every pool
    thread for every task, made threads wait for each other (and switch) for nothing."""

    def __init__(self, window: float, max_batch: int) -> None:
        self.window = window
        self.max_batch = max_batch
        self._entries: deque[Entry] = deque()
        self._ids: set[int] = set()

    def add(self, task: Any, outcome: Outcome, done: Callable[[str | None], None]) -> None:
        # The id first: the orphan check (ids()) reads it once the slot has let the task go.
        self._ids.add(task.id)
        self._entries.append((task, outcome, done, time.monotonic()))

    def ids(self) -> set[int]:
        """Ids of the tasks whose outcome is handed in and not recorded yet."""
        return self._ids.copy()

    def due_in(self) -> float | None:
        """Seconds until the waiting outcomes should be recorded (``None``: none waits). On
        the loop's thread, the only one that takes: what it saw waiting stays there."""
        entries = self._entries
        if not entries:
            return None
        if len(entries) >= self.max_batch:
            return 0.0
        return max(entries[0][3] + self.window - time.monotonic(), 0.0)

    def take(self) -> list[Entry]:
        """Remove and return up to ``max_batch`` waiting outcomes, the oldest first (on the
        loop's thread). Their ids stay listed until :meth:`forget` (the orphan check must not
        take them back)."""
        entries = self._entries
        return [entries.popleft() for _ in range(min(len(entries), self.max_batch))]

    def forget(self, entries: list[Entry]) -> None:
        ids = self._ids
        for task, *_ in entries:
            ids.discard(task.id)


class Callbacks:
    """The thread that runs what follows a recorded outcome (the handler's ``finished()``,
    the signals, the outcome's log line), in the order the outcomes were recorded.

    Not the pool's threads: with every one of them in a long handler, a quick task's
    callbacks would wait for the first to come free, seconds or hours after its outcome was
    recorded. Not the loop's thread: a slow receiver would hold up claims. A receiver that
    hangs holds up only the callbacks after it. The thread starts with the first callback.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, func: Callable[[], object]) -> None:
        """Run ``func`` on the callbacks' thread, after those called before it (from one
        thread: the worker's loop)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgtasks-callbacks",
                                            daemon=True)
            self._thread.start()
        self._queue.put(func)

    def stop(self, timeout: float) -> bool:
        """Run what was called, then end the thread; ``False`` if it is still running after
        ``timeout`` seconds (a receiver that hangs: the thread is a daemon, left behind)."""
        if self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while (func := self._queue.get()) is not None:
                try:
                    func()
                except Exception:
                    logger.exception("Error in a callback run after a task's outcome was "
                                     "recorded.")
                _give_back_connections()
        finally:
            connections.close_all()  # receivers may have used the database on this thread


def _give_back_connections() -> None:
    """Between two jobs, give back what this thread took from a connection pool
    (``OPTIONS["pool"]``) and close a broken connection: the thread may wait long for the
    next outcome, and the pool threads need the pooled connections meanwhile."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if (getattr(conn, "pool", None) is not None
                or (conn.errors_occurred and not conn.is_usable())):
            conn.close()


def _call_each(calls: list[tuple[Callable[[str | None], object], str | None]]) -> None:
    """Call each ``done(status)``; one that raises is logged and the others still run."""
    for done, status in calls:
        try:
            done(status)
        except Exception:
            logger.exception("Error in a callback run after a task's outcome was recorded.")
