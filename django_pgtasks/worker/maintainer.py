"""The maintainer: the side jobs of a worker, on a thread and a session of their own.

Rescue (:mod:`~django_pgtasks.worker.liveness`), history partitions
(:mod:`~django_pgtasks.patterns.partitions`), the purge (:mod:`~django_pgtasks.patterns.
retention`) and the scheduler (:mod:`~django_pgtasks.scheduling.job`) register as
maintenance jobs (:mod:`django_pgtasks.definition.maintenance_jobs`). A worker runs them here,
never on the thread that claims: a job waiting for a lock (a detach waiting for a report's
transaction, say) delays other jobs at most, never a claim.

Its connection waits for a lock at most ``LOCK_TIMEOUT`` and runs a statement at most
``STATEMENT_TIMEOUT`` (session settings, not set behind a transaction pooler nor on a
connection of Django's pool, where they would stay with a session others use). A job that
gives up (a lock or statement timeout, a lost connection) is logged in one line and runs again
at its next turn; whatever it left half done, the next turn finishes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from django_pgtasks.database.sessions import give_back_pooled, transaction_pooler
from django_pgtasks.database.sqlstates import is_transient
from django_pgtasks.definition import maintenance_jobs as maintenance
from django_pgtasks.lifecycle.recorder import close_connection

# The jobs register themselves when their modules are imported: rescue (worker/liveness.py),
# partitions (imported by retention), purge and scheduler.
from django_pgtasks.patterns import retention  # noqa: F401
from django_pgtasks.scheduling import job as scheduler  # noqa: F401
from django_pgtasks.worker import liveness  # noqa: F401

logger = logging.getLogger("django_pgtasks.worker")

#: Session settings of the maintainer's connection: a job gives up on a lock held elsewhere
#: within a second (it tries again at its next turn) and on a statement within a minute.
SESSION_SQL = ("SELECT set_config('lock_timeout', %s, false), "
               "set_config('statement_timeout', %s, false)")
LOCK_TIMEOUT = "1s"
STATEMENT_TIMEOUT = "1min"
#: How long :meth:`Maintainer.join` lets a job in progress end by itself before cancelling
#: its statement (every job can be cut off: its next turn, in any worker, finishes the work).
STOP_WAIT = 2.0


class Maintainer:
    """Runs every maintenance job against database ``using`` when due, on a thread with its
    own connection, until stopped.

    ``on_error(exc)`` is asked first about every database error of a job; ``True`` means it
    was dealt with (the worker stops: the database lacks its tables) and ends the maintainer.
    """

    def __init__(self, using: str, *, on_error: Callable[[BaseException], bool],
                 name: str = "") -> None:
        self.using = using
        self.name = name
        self._on_error = on_error
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._first_round = threading.Event()
        self._thread: threading.Thread | None = None
        #: When each job is due next (``time.monotonic()``).
        self._next: dict[str, float] = {}
        #: The thread's psycopg connection, if any: what :meth:`join` cancels.
        self._connection: Any = None
        #: The connection that was given the session settings.
        self._prepared: Any = None
        #: Turns run per job, and those given up: what an operator's debugger or a test reads.
        self.turns: Counter[str] = Counter()
        self.gave_up: Counter[str] = Counter()

    # -- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; its first round runs every enabled job at once."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"pgtasks-maintainer {self.name}".strip())
        self._thread.start()

    def wait_first_round(self, timeout: float | None = None) -> bool:
        """Wait until every job has had its first turn (or the maintainer stopped)."""
        return self._first_round.wait(timeout)

    def wake(self) -> None:
        """Look at the jobs' schedule again now (thread-safe): an interval changed."""
        self._wake.set()

    def stop(self) -> None:
        """Run no further job (thread-safe; returns at once: :meth:`join` waits)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float = STOP_WAIT) -> None:
        """Stop, and wait for the thread: a job still running after ``timeout`` has its
        statement cancelled, and is waited for as long again."""
        self.stop()
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive() and self._connection is not None:
            with contextlib.suppress(Exception):  # a session closing meanwhile: nothing to do
                self._connection.cancel_safe(timeout=timeout)
            thread.join(timeout)
        if thread.is_alive():
            logger.warning("Worker %s: a maintenance job did not stop; leaving it behind.",
                           self.name)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.run_due()
                self._first_round.set()
                give_back_pooled(self.using)
                self._wake.wait(self._until_next())
                self._wake.clear()
        finally:
            self._first_round.set()
            self._connection = self._prepared = None
            connections.close_all()  # this thread's connections only

    def _until_next(self) -> float | None:
        """Seconds until the next job is due; ``None`` (until woken) when none is enabled."""
        if not self._next:
            return None
        return max(min(self._next.values()) - time.monotonic(), 0.001)

    # -- the jobs ----------------------------------------------------------------------------

    def run_due(self) -> None:
        """Run each job whose turn has come, once, on the calling thread."""
        for job in maintenance.jobs():
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now < self._next.get(job.name, 0.0):
                continue
            interval = job.interval()
            if not interval:
                self._next.pop(job.name, None)
                continue
            self._next[job.name] = now + interval
            self._turn(job, interval)

    def _turn(self, job: maintenance.Job, interval: float) -> None:
        try:
            self._prepare_session()
            job.run(self.using)
        except (DatabaseError, InterfaceError) as exc:
            close_connection(self.using)
            if self._on_error(exc):
                self.stop()
            elif self._stop.is_set():
                logger.debug("Maintenance job %s cut off by the worker's stop: %s", job.name,
                             exc)
            elif is_transient(exc):
                self.gave_up[job.name] += 1
                logger.warning("Maintenance job %s gave up (%s); next turn in %gs.", job.name,
                               _first_line(exc), interval)
            else:
                logger.error("Maintenance job %s failed: %s", job.name, exc)
        except Exception:  # a defect in a job: logged, and the other jobs go on
            logger.exception("Maintenance job %s failed.", job.name)
        finally:
            self.turns[job.name] += 1

    def _prepare_session(self) -> None:
        """Give the thread's connection its session settings, once per connection (not to
        a pooled one, nor behind a transaction pooler: see the module's docstring)."""
        connection = connections[self.using]
        connection.ensure_connection()
        self._connection = connection.connection
        if (self._connection is not self._prepared and not transaction_pooler()
                and getattr(connection, "pool", None) is None):
            with connection.cursor() as cursor:
                cursor.execute(SESSION_SQL, [LOCK_TIMEOUT, STATEMENT_TIMEOUT])
            self._prepared = self._connection


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
