"""The watchdog: liveness that nothing in the worker's loop can block.

A thread with one database session of its own (the listener's): heartbeats, the
cancellation safety net, time limits and the supervisor check, every ``WATCH_TICK``.
With ``LISTEN_DATABASE`` the notifications come on a second thread and session, a direct one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.sessions import listen_database
from django_pgtasks.definition.error_text import reason_text
from django_pgtasks.definition.registry import cancel_signal, cancel_was_signalled, get_handler
from django_pgtasks.exceptions import (
    PgTasksError,
    TaskTimeoutError,
)
from django_pgtasks.lifecycle.transitions import Cancelled, Failed, Outcome
from django_pgtasks.models import Task
from django_pgtasks.worker.listener import Listener
from django_pgtasks.worker.liveness import Liveness
from django_pgtasks.worker.pools import Pool

logger = logging.getLogger("django_pgtasks.worker")

#: Seconds past an async handler's own timeout before the pool gives up on its thread.
ASYNC_CANCEL_MARGIN = 5.0
#: Seconds between two turns of the watchdog thread (time limits, heartbeats when due).
WATCH_TICK = 0.1


class Watchdog:
    """The worker's watchdog: a thread with one session of its own (the listener's) that
    every ``WATCH_TICK`` does what no claim waiting on a lock, slow job or shutdown grace may
    delay: heartbeats, the cancellation safety net, time limits and the supervisor check. The
    liveness lock is held by the same session, and it listens for notifications (unless
    ``LISTEN`` is off).

    It owns its threads and its state; it talks to the rest of the worker through the
    callbacks it is given: ``pool()`` (the tasks running now), ``wakeup`` (new work),
    ``on_release`` (a parent ended), ``hand_in(task, outcome)`` (a run it failed for its time
    limit), ``retry_after(handler, task, exc)`` (that failure's retry delay) and
    ``stop(exit_code)`` (the worker must stop).
    """

    def __init__(self, *, worker_id: str, using: str, queues: list[str], concurrency: int,
                 liveness: Liveness, wakeup: threading.Event,
                 pool: Callable[[], Pool | None],
                 on_release: Callable[[], None],
                 hand_in: Callable[[Task, Outcome], None],
                 retry_after: Callable[[Any, Task, BaseException | None], float | None],
                 stop: Callable[[int], None], parent_pid: int | None = None) -> None:
        self.worker_id = worker_id
        self.using = using
        self.queues = queues
        self.concurrency = concurrency
        self.liveness = liveness
        self.parent_pid = parent_pid
        self._wakeup = wakeup
        self._pool = pool
        self._on_release = on_release
        self._hand_in = hand_in
        self._retry_after = retry_after
        self._stop_worker = stop
        self._next_heartbeat = 0.0
        self._session: Listener | None = None
        #: The thread listening on ``LISTEN_DATABASE``, when that is not the task database.
        self._notifications: Listener | None = None
        #: The listener whose notifications wake the worker (``None`` until started).
        self.listener: Listener | None = None

    def start(self) -> None:
        """Start the watchdog and wait (briefly) until it registered the worker.

        Where notifications come through another database alias than the task database's
        (``LISTEN_DATABASE``: a direct connection past a pooler), a second thread listens
        there; :attr:`listener` is then that one. Losing it only slows wake-ups down to the
        poll: the heartbeats keep going through the task database."""
        registered = threading.Event()

        def on_connect(conn: Any) -> None:
            self.liveness.use(conn)
            registered.set()

        listen_on = listen_database(self.using) if pgtasks_settings.LISTEN else None
        session = self._session = Listener(
            self.using, self.queues, self._wakeup, worker_id=self.worker_id,
            on_cancel=self.stop_task, on_release=self._on_release,
            listen=listen_on == self.using, tick=WATCH_TICK,
            on_connect=on_connect, on_tick=self._watch,
            on_stop=lambda conn: self.liveness.unregister(),
        )
        # Set before the thread starts: whoever sees the worker registered sees its listener.
        self.listener = session
        if listen_on is not None and listen_on != self.using:
            self._notifications = Listener(listen_on, self.queues, self._wakeup,
                                           worker_id=self.worker_id, on_cancel=self.stop_task,
                                           on_release=self._on_release)
            self._notifications.start()
            self.listener = self._notifications
        session.start()
        registered.wait(timeout=5)

    def stop(self) -> None:
        """Stop the watchdog (which unregisters the worker) and the listener of its own."""
        if self._session is not None:
            self._session.stop()
        if self._notifications is not None:
            self._notifications.stop()

    def _watch(self, conn: Any) -> None:
        """One turn of the watchdog (on its thread; ``conn`` is its session)."""
        try:
            now = time.monotonic()
            if now >= self._next_heartbeat:
                self.liveness.heartbeat()
                self._next_heartbeat = now + pgtasks_settings.HEARTBEAT_INTERVAL
                self._look_for_cancellations()
            pool = self._pool()
            if pool is not None:
                for task, limit in pool.overdue():
                    self._time_out(pool, task, limit)
            self._check_parent()
        except Exception:  # never let a defect here end the watchdog (and the liveness)
            logger.exception("Worker %s: error in the watchdog.", self.worker_id)

    def stop_task(self, pk: int) -> None:
        """Ask the handler running task ``pk`` to stop (thread-safe; unknown ids ignored)."""
        pool = self._pool()
        task = pool.get(pk) if pool is not None else None
        if task is not None and not cancel_signal(task).is_set():
            logger.info("Task id=%s name=%s was cancelled; asking its handler to stop.",
                        task.pk, task.name)
            cancel_signal(task).set()

    def _look_for_cancellations(self) -> None:
        """With each heartbeat: stop running tasks whose cancellation was requested (the
        safety net for a lost or never-sent ``NOTIFY``), on the liveness connection. A
        primary-key lookup of the tasks this worker runs, only while it runs some."""
        pool = self._pool()
        if pool is None or not pool.busy:
            return
        ids = [pk for pk in pool.ids()
               if (task := pool.get(pk)) is not None and not cancel_signal(task).is_set()]
        for pk in self.liveness.cancel_requests(ids):
            self.stop_task(pk)

    def _time_out(self, pool: Pool, task: Task, limit: float) -> None:
        handler = get_handler(task.name)
        error = reason_text(TaskTimeoutError, (
            f"Task exceeded its time limit of {limit:g}s; its thread could not be interrupted "
            f"and was left to finish on its own (its outcome will be ignored)."))
        # Recorded by the loop like any outcome; the late finisher's own outcome is then
        # refused by the lease guard. After a cancellation it ends the task, as any failure
        # after one does.
        self._hand_in(task, Cancelled(error) if cancel_was_signalled(task)
                      else Failed(error, self._retry_after(handler, task, None)))
        pool.abandon(task)
        logger.warning("Task id=%s name=%s timed out after %gs; slot freed.", task.pk,
                       task.name, limit)
        if pool.stuck > self.concurrency:
            logger.error(
                "Worker %s has %d threads stuck in timed-out handlers; stopping so that the "
                "process (and those threads) can be replaced.", self.worker_id, pool.stuck,
            )
            self._stop_worker(1)

    def _check_parent(self) -> None:
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            logger.warning("Worker %s lost its supervisor; stopping.", self.worker_id)
            self._stop_worker(0)


def time_limit(task: Task) -> float | None:
    """Seconds the pool lets ``task`` run before it is failed and its slot freed."""
    try:
        handler = get_handler(task.name)
    except PgTasksError:
        return None
    if handler.timeout is None:
        return None
    # Async handlers cancel themselves at the limit; the pool only steps in if even the
    # cancellation hangs.
    return handler.timeout + (ASYNC_CANCEL_MARGIN if handler.is_async else 0.0)
