"""The worker's releaser: a thread that releases the children of ended parents.

Woken by the ``@release`` notification a parent's end sends (through the worker's listener),
by the worker itself when it recorded the end of a task with dependents, and at least every
``interval`` seconds (the safety net when notifications are lost or not listened to). Each
turn is :func:`django_pgtasks.lifecycle.release.release_some` on the thread's own connection:
a bounded transaction, so the loop never waits for a release, and a stopping worker waits at
most for one batch.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, InterfaceError

from django_pgtasks.database.sessions import give_back_pooled
from django_pgtasks.lifecycle import release
from django_pgtasks.lifecycle.recorder import close_connection

logger = logging.getLogger("django_pgtasks.worker")

#: Pause after a database error before the next turn (seconds, doubling up to 30).
ERROR_PAUSE = 1.0


class Releaser:
    """Releases due marks of ``using`` on a thread of its own until stopped."""

    def __init__(self, using: str, *, interval: float = 1.0,
                 batch: int = release.BATCH) -> None:
        self.using = using
        self.interval = interval
        self.batch = batch
        self.max_batch = batch
        #: Edges this releaser resolved (for tests and logs).
        self.released = 0
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgtasks-releaser", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A parent ended: look for due releases now."""
        self._wake.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the current batch."""
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _adapt(self, turn: release.Turn) -> None:
        """Smaller batches after one ran out of time (a loaded server, a short
        ``statement_timeout``), growing back to the full size while they succeed."""
        if turn.timed_out:
            self.batch = max(self.batch // 2, release.MIN_BATCH)
        elif turn.edges >= self.batch:
            self.batch = min(self.batch + self.batch // 4 + 1, self.max_batch)

    def _run(self) -> None:
        pause = ERROR_PAUSE
        try:
            while not self._stopped.is_set():
                try:
                    while not self._stopped.is_set():
                        turn = release.release_some(self.using, self.batch)
                        self.released += turn.edges
                        self._adapt(turn)
                        if not turn.more:
                            break
                    pause = ERROR_PAUSE
                except Exception as exc:  # never take the worker down with a release
                    if isinstance(exc, DatabaseError | InterfaceError):
                        logger.warning("Releaser: database error (%s); trying again in %.0fs.",
                                       str(exc).strip().split("\n", 1)[0], pause)
                    else:
                        logger.exception("Releaser: unexpected error; trying again in %.0fs.",
                                         pause)
                    close_connection(self.using)
                    if self._stopped.wait(pause):
                        break
                    pause = min(pause * 2, 30.0)
                    continue
                give_back_pooled(self.using)
                self._wake.wait(self.interval)
                self._wake.clear()
        finally:
            close_connection(self.using)

