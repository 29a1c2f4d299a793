"""Instant wake-ups: LISTEN for new work on a dedicated connection.

Triggers on the task table (``sql/notify.sql``) notify the channel ``pgtasks`` at commit whenever
a task becomes claimable (payload: its queue) or pending for later (payload:
``"<queue>@<seconds from now>"``). A :class:`Listener` thread per worker process receives them
and sets the worker's wake-up event, so an idle worker starts a new task within milliseconds
instead of at its next poll, and sleeps until the earliest delayed task it heard of instead of
polling for it. The worker still polls every ``POLL_INTERVAL`` seconds as a safety net:
notifications are lost while nobody listens, and not all poolers pass them through.

The listener of a worker also LISTENs on ``pgtasks_cancel``: a trigger (``sql/notify.sql``)
notifies it with ``"<task id> <worker id>"`` when a running task is asked to stop, and the
listener hands the ids meant for its worker to ``on_cancel``. A lost notification delays the
stop until the worker's next heartbeat, which looks for such requests too.

``PGTASKS["LISTEN"] = False`` turns this off. PgBouncer in transaction mode cannot LISTEN:
with ``POOLER = "transaction"`` a worker listens on ``LISTEN_DATABASE`` (a direct connection,
on a listener thread of its own) or not at all (:func:`~django_pgtasks.database.sessions.
listen_database`).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable

import psycopg

from django_pgtasks.database.sessions import open_connection

logger = logging.getLogger("django_pgtasks.listener")

CHANNEL = "pgtasks"
#: Requests to stop running tasks: ``"<task id> <worker id>"``.
CANCEL_CHANNEL = "pgtasks_cancel"
#: The payload on ``pgtasks`` of a task with dependents that ended: a release is due
#: (``sql/workflows.sql``). No queue name starts with ``@``.
RELEASE_PAYLOAD = "@release"
#: Delayed tasks a listener keeps track of; beyond that the poll finds them.
MAX_REMEMBERED = 10_000


__all__ = ["CANCEL_CHANNEL", "CHANNEL", "RELEASE_PAYLOAD", "Listener", "open_connection"]


class Listener:
    """Listens for notifications about ``queues`` and sets ``wakeup`` when one matters.

    Its thread is also the worker's *watchdog*: with ``on_tick``, it calls ``on_tick(conn)``
    every ``tick`` seconds with its own connection (heartbeats, time limits), ``on_connect``
    after each (re)connection and ``on_stop`` before it ends, so a worker's liveness and its
    notifications share one session. ``listen=False`` (poolers that cannot ``LISTEN``) keeps
    the session and the ticks without listening.
    """

    def __init__(
        self,
        using: str,
        queues: Iterable[str],
        wakeup: threading.Event,
        *,
        worker_id: str | None = None,
        on_cancel: Callable[[int], None] | None = None,
        on_release: Callable[[], None] | None = None,
        timeout: float | None = None,
        listen: bool = True,
        tick: float | None = None,
        on_connect: Callable[[psycopg.Connection], object] | None = None,
        on_tick: Callable[[psycopg.Connection], object] | None = None,
        on_stop: Callable[[psycopg.Connection], object] | None = None,
    ) -> None:
        self.using = using
        self.worker_id = worker_id
        self.on_cancel = on_cancel
        #: Called when a task with dependents ended (a release is due).
        self.on_release = on_release
        self.queues = set(queues)
        self.wakeup = wakeup
        #: Seconds one wait for notifications lasts at most (``None``: until a notification
        #: arrives or :meth:`stop` interrupts it, which it does at once either way).
        self.timeout = timeout
        self.listen = listen
        self.tick = tick
        self.on_connect = on_connect
        self.on_tick = on_tick
        self.on_stop = on_stop
        self._stopped = threading.Event()
        # The sending end of the socket pair that interrupts the thread's wait; set while the
        # thread runs (see _run), guarded by _interrupt_lock.
        self._interrupt_sender: socket.socket | None = None
        self._interrupt_lock = threading.Lock()
        # time.monotonic() of each delayed task heard of (a heap: the earliest first).
        self._due: list[float] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pgtasks-listener", daemon=True)
        #: Set while connected (and listening, with ``listen``); set after the wake-up that
        #: follows each connection, so that once it is seen set that wake-up has been given.
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; returns once the thread has ended (its wait is interrupted, not
        waited out), or after 5 seconds if it is stuck connecting."""
        self._stopped.set()
        with self._interrupt_lock:
            if self._interrupt_sender is not None:
                # A full buffer means that a byte is pending already: the wait ends anyway.
                with contextlib.suppress(OSError):
                    self._interrupt_sender.send(b"\0")
        self._thread.join(timeout=5)

    def seconds_until_due(self) -> float | None:
        """Seconds until the earliest delayed task heard of (``None`` if none)."""
        with self._lock:
            if not self._due:
                return None
            return max(self._due[0] - time.monotonic(), 0.0)

    def claimed_all_due(self) -> None:
        """The worker found nothing more to claim: forget delayed tasks that are due by now."""
        now = time.monotonic()
        with self._lock:
            while self._due and self._due[0] <= now:
                heapq.heappop(self._due)

    def _handle_cancel(self, payload: str) -> None:
        task_id, _, worker_id = payload.partition(" ")
        if self.on_cancel is None or worker_id != self.worker_id:
            return
        try:
            pk = int(task_id)
        except ValueError:
            return
        try:
            self.on_cancel(pk)
        except Exception:
            logger.exception("Error while stopping cancelled task id=%s.", pk)

    def _handle(self, payload: str) -> None:
        if payload == RELEASE_PAYLOAD:
            if self.on_release is not None:
                self.on_release()
            return
        queue, _, delay = payload.partition("@")
        if queue not in self.queues:
            return
        if not delay:
            self.wakeup.set()
            return
        try:
            due = time.monotonic() + float(delay)
        except ValueError:
            return
        with self._lock:
            heapq.heappush(self._due, due)
            if len(self._due) > MAX_REMEMBERED:  # keep the earliest; the poll covers the rest
                self._due = heapq.nsmallest(MAX_REMEMBERED // 2, self._due)
        self.wakeup.set()  # let the worker shorten its sleep to the new deadline

    def _connect(self) -> psycopg.Connection:
        conn = open_connection(self.using)
        try:
            if self.listen:
                if self.on_cancel is not None:
                    conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                # Last: what pg_stat_activity shows for the session.
                conn.execute(f"LISTEN {CHANNEL}")
            if self.on_connect is not None:
                self.on_connect(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self) -> None:
        # A threading.Event cannot be waited on together with a socket: the thread waits on
        # the connection and on one end of a socket pair, into which stop() writes a byte.
        receiver, sender = socket.socketpair()
        sender.setblocking(False)
        with self._interrupt_lock:
            self._interrupt_sender = sender
        try:
            self._listen(receiver)
        finally:
            with self._interrupt_lock:
                self._interrupt_sender = None
            sender.close()
            receiver.close()

    def _listen(self, interrupt: socket.socket) -> None:
        """Connect, LISTEN and dispatch notifications until stopped, reconnecting when the
        connection is lost."""
        pause = 0.5
        while not self._stopped.is_set():
            try:
                conn = self._connect()
            except psycopg.Error as exc:
                logger.warning("Listener could not connect: %s; retrying in %.1fs.", exc, pause)
                self._stopped.wait(pause)
                # As a watchdog, come back quickly: the worker's liveness depends on it.
                pause = min(pause * 2, 2.0 if self.on_tick is not None else 30.0)
                continue
            pause = 0.5
            # Anything sent while we were not listening is lost: look for work once.
            self.wakeup.set()
            self.connected.set()
            try:
                with conn, selectors.DefaultSelector() as selector:
                    selector.register(conn.fileno(), selectors.EVENT_READ)
                    selector.register(interrupt, selectors.EVENT_READ)
                    next_tick = time.monotonic()
                    while not self._stopped.is_set():
                        # What has arrived, without waiting: notifications received along
                        # with a command's result are already buffered, and the socket
                        # would not show them as readable.
                        for notification in conn.notifies(timeout=0):
                            if notification.channel == CANCEL_CHANNEL:
                                self._handle_cancel(notification.payload)
                            else:
                                self._handle(notification.payload)
                        wait = self.timeout
                        if self.on_tick is not None:
                            now = time.monotonic()
                            if now >= next_tick:
                                self.on_tick(conn)
                                next_tick = now + (self.tick or 1.0)
                            until_tick = max(next_tick - time.monotonic(), 0.0)
                            wait = until_tick if wait is None else min(wait, until_tick)
                        # Until the server sends something (or closes), stop() writes, or
                        # the next tick.
                        selector.select(wait)
                    if self.on_stop is not None:
                        self.on_stop(conn)
            except psycopg.Error as exc:
                self.connected.clear()
                if not self._stopped.is_set():
                    logger.warning("Listener connection lost: %s; reconnecting.", exc)
