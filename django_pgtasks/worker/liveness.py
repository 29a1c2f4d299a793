"""Worker liveness and the rescue of abandoned tasks.

Every worker process registers a row in ``pgtasks_worker`` and, on a dedicated connection (not
one the ORM uses for tasks), takes a *session-level advisory lock* keyed by that row. It then
refreshes ``last_seen_at`` every ``HEARTBEAT_INTERVAL`` seconds — one small UPDATE per worker,
never per task.

A running task is **abandoned** when one of these holds (``leases.ABANDONED_SQL``):

(a) its worker's lock is gone *and* the worker has been silent for ``RESCUE_GRACE`` seconds.
    PostgreSQL drops a session's locks the moment its connection ends, so a killed process,
    a crashed host (once TCP notices) or a terminated backend is detected within seconds,
    with no per-task traffic. The grace lets a worker ride out a database restart, during
    which every lock vanishes at once: it reconnects, re-takes its lock and heartbeats again;
(b) its worker has been silent for ``WORKER_TIMEOUT`` seconds, lock or not: a hung but still
    connected process, or a worker using ``LIVENESS = "heartbeat"`` (implied by ``POOLER =
    "transaction"``: behind PgBouncer in transaction mode session-level locks are meaningless);
(c) no registered worker has its ``locked_by`` and the lease (``locked_at``) is older than
    ``WORKER_TIMEOUT``: tasks claimed by code that is not a ``run_pgtasks`` worker.

Rescue runs inside the workers every ``RESCUE_INTERVAL`` seconds, one worker at a time (a
transaction-level advisory lock), and as ``manage.py pgtasks_rescue``. Each abandoned task's
run was *interrupted* (``transitions.RESCUE_SQL``): the task goes back to its original place in
the queue without spending an attempt, up to ``MAX_INTERRUPTIONS`` times.
The worker that lost the task cannot record an outcome for it any more: completions are
guarded by ``status = 'RUNNING' AND locked_by = <worker>``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass

import psycopg
from django.db import DatabaseError, InterfaceError, connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.partition_moves import retry_conflicts
from django_pgtasks.database.schema import is_missing_schema
from django_pgtasks.database.sessions import liveness_mode, open_connection
from django_pgtasks.database.sqlstates import is_transient
from django_pgtasks.definition import maintenance_jobs as maintenance
from django_pgtasks.lifecycle.claim import forget_bounds
from django_pgtasks.lifecycle.leases import (
    ABANDONED_SQL,
    LOCK_NAMESPACE,
    LOST_WORKER_SQL,
    abandoned_params,
    lock_key,
    lost_worker_params,
)
from django_pgtasks.lifecycle.transitions import (
    RESCUE_ONE_SQL,
    RESCUE_SQL,
    end_for_good,
    rescue_one_params,
    rescue_params,
)

logger = logging.getLogger("django_pgtasks.liveness")

#: Second key of the lock that serializes rescue passes (worker lock keys start at 1).
RESCUE_LOCK_KEY = 0

__all__ = ["LOCK_NAMESPACE", "LOST_WORKER_SQL", "Liveness", "lock_key", "rescue"]

#: Which of the given running tasks of a worker were asked to stop (heartbeat safety net).
CANCEL_REQUESTS_SQL = (
    "SELECT id FROM pgtasks_task WHERE id = ANY(%s) AND status = 'RUNNING' "
    "AND locked_by = %s AND cancel_requested"
)

# Rows of lost workers are removed once their tasks were rescued (in the same transaction).
FORGET_LOST_WORKERS_SQL = f"DELETE FROM pgtasks_worker w WHERE {LOST_WORKER_SQL} RETURNING name"


@dataclass(frozen=True)
class Rescued:
    id: int
    name: str
    worker: str
    status: str


def rescue(using: str | None = None, *, dry_run: bool = False) -> list[Rescued] | None:
    """Rescue abandoned tasks once; ``None`` if another rescue pass is running right now.

    With ``dry_run`` nothing changes and the abandoned tasks are listed as they are.
    """
    alias = using or pgtasks_settings.DATABASE
    # A task may end (move to history) while the pass waits for its lock: pass again.
    outcome = retry_conflicts(alias, lambda: _rescue_pass(alias, dry_run))
    if outcome is None:
        return None
    rescued, lost = outcome
    if dry_run:
        return rescued
    for name in lost:
        count = sum(1 for r in rescued if r.worker == name)
        logger.warning("Worker %s was lost; %d of its task(s) rescued.", name, count)
    for task in rescued:
        logger.warning("Task id=%s name=%s rescued from worker %s: now %s.", task.id, task.name,
                       task.worker, task.status)
    return rescued


def _rescue_pass(alias: str, dry_run: bool) -> tuple[list[Rescued], list[str]] | None:
    """One rescue pass in its own transaction: the tasks rescued (or, dry, abandoned) and the
    lost workers forgotten; ``None`` if another pass holds the lock."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)",
                       [LOCK_NAMESPACE, RESCUE_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return None
        if dry_run:
            cursor.execute(
                f"SELECT id, name, locked_by, status FROM pgtasks_task "
                f"WHERE status = 'RUNNING' AND ({ABANDONED_SQL}) ORDER BY id",
                abandoned_params())
            return [Rescued(*row) for row in cursor.fetchall()], []
        rescued = _rescue_rows(alias, cursor)
        if rescued:
            forget_bounds()  # back at their place in the queue: claim from the start again
        cursor.execute(FORGET_LOST_WORKERS_SQL, lost_worker_params())
        lost = [row[0] for row in cursor.fetchall()]
    return rescued, lost


def _rescue_rows(alias: str, cursor) -> list[Rescued]:
    """The rescue statement, in a savepoint; if the database refuses it (a fault in one row),
    each abandoned task is rescued on its own, and one that is refused even alone is ended
    by the simplest write (:func:`~django_pgtasks.lifecycle.transitions.end_for_good`): one
    row never keeps the others running for good."""
    try:
        with transaction.atomic(using=alias):
            cursor.execute(RESCUE_SQL, rescue_params())
            return [Rescued(*row) for row in cursor.fetchall()]
    except DatabaseError as exc:
        if is_transient(exc) or is_missing_schema(exc):  # not a row's fault: the pass's
            raise
        logger.error("The rescue of abandoned tasks failed (%s); rescuing them one by one.",
                     str(exc).strip().split("\n", 1)[0])
    cursor.execute(f"SELECT id FROM pgtasks_task WHERE status = 'RUNNING' AND "
                   f"({ABANDONED_SQL}) ORDER BY id", abandoned_params())
    rescued: list[Rescued] = []
    for (task_id,) in cursor.fetchall():
        try:
            with transaction.atomic(using=alias):
                cursor.execute(RESCUE_ONE_SQL, rescue_one_params(task_id))
                rescued.extend(Rescued(*row) for row in cursor.fetchall())
            continue
        except DatabaseError as exc:
            if is_transient(exc) or is_missing_schema(exc):
                raise
            refusal = exc
        try:
            with transaction.atomic(using=alias):
                ended = end_for_good(alias, task_id, refusal)
            if ended is not None:
                rescued.append(Rescued(*ended, "FAILED"))
        except DatabaseError as exc:
            logger.critical("Task id=%s: its rescue and even the simplest end were refused "
                            "(%s); it stays RUNNING.", task_id, exc)
    return rescued


class Liveness:
    """Registration, liveness lock and heartbeat of one worker, on a session of its own.

    The session is a dedicated psycopg connection (:func:`~django_pgtasks.database.sessions.
    open_connection`, never a pooled one: the lock lives as long as the session): opened here,
    or the worker's watchdog connection handed over with :meth:`use`. Every method survives
    database errors: it logs and closes the session; the next heartbeat (or the watchdog's
    reconnection) registers again.
    """

    def __init__(self, name: str, queues: list[str], concurrency: int, using: str) -> None:
        self.name = name
        self.queues = queues
        self.concurrency = concurrency
        self.using = using
        self.use_lock = liveness_mode() == "advisory_lock"
        self.pk: int | None = None
        self._connection: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def use(self, connection: psycopg.Connection) -> None:
        """Register on ``connection`` (a new session of the watchdog) from now on."""
        with self._lock:
            self._connection = connection
            self.pk = None
        self.register()

    def _cursor(self) -> psycopg.Cursor:
        if self._connection is None or self._connection.closed:
            self._connection = open_connection(self.using)
            self.pk = None
        return self._connection.cursor()

    def register(self) -> None:
        """Insert (or take over) this worker's row and take its liveness lock."""
        with self._lock, self._cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO pgtasks_worker (name, hostname, pid, queues, concurrency,
                                            backend_pid, started_at, last_seen_at)
                VALUES (%s, %s, %s, %s, %s, pg_backend_pid(), now(), now())
                ON CONFLICT (name) DO UPDATE SET backend_pid = EXCLUDED.backend_pid,
                    last_seen_at = now()
                RETURNING id
                """,
                [self.name, socket.gethostname()[:255], os.getpid(),
                 json.dumps(self.queues), self.concurrency],
            )
            pk = cursor.fetchone()[0]
            key = lock_key(pk) if self.use_lock else None
            if key is not None:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_NAMESPACE, key])
                if not cursor.fetchone()[0]:
                    # An old session of ours still lingers on the server; heartbeats keep us
                    # alive meanwhile, and the lock then counts as held by us.
                    logger.warning("Worker %s: liveness lock %s is held elsewhere.", self.name,
                                   key)
            cursor.execute("UPDATE pgtasks_worker SET lock_key = %s WHERE id = %s", [key, pk])
            self.pk = pk
        logger.debug("Worker %s registered as pgtasks_worker id=%s.", self.name, self.pk)

    def heartbeat(self) -> bool:
        """Refresh ``last_seen_at``; re-register if the row is gone. ``False`` on error."""
        try:
            if self.pk is None or self._connection is None or self._connection.closed:
                self.register()
                return True
            with self._lock, self._cursor() as cursor:
                cursor.execute(
                    "UPDATE pgtasks_worker SET last_seen_at = now() WHERE id = %s", [self.pk]
                )
                found = cursor.rowcount
            if not found:
                logger.warning(
                    "Worker %s had been given up as lost (its tasks were rescued); "
                    "registering again.", self.name,
                )
                self.register()
            return True
        except (psycopg.Error, DatabaseError, InterfaceError) as exc:
            logger.error("Worker %s: heartbeat failed: %s", self.name, exc)
            self.close()
            return False

    def cancel_requests(self, ids: list[int]) -> list[int]:
        """Which of the running tasks ``ids`` of this worker were asked to stop; on the
        liveness session (the safety net for a lost ``NOTIFY``). ``[]`` on error."""
        if not ids or self._connection is None:
            return []
        try:
            with self._lock, self._cursor() as cursor:
                cursor.execute(CANCEL_REQUESTS_SQL, [ids, self.name])
                return [row[0] for row in cursor.fetchall()]
        except (psycopg.Error, DatabaseError, InterfaceError) as exc:
            logger.error("Worker %s: could not look for cancelled tasks: %s", self.name, exc)
            self.close()
            return []

    def unregister(self) -> None:
        try:
            if self.pk is not None and self._connection is not None:
                with self._lock, self._cursor() as cursor:
                    cursor.execute("DELETE FROM pgtasks_worker WHERE id = %s", [self.pk])
        except (psycopg.Error, DatabaseError, InterfaceError) as exc:
            logger.warning("Worker %s could not unregister: %s", self.name, exc)
        finally:
            self.close()

    def close(self) -> None:
        """Close the liveness session (which releases the lock) without unregistering."""
        connection, self._connection = self._connection, None
        self.pk = None
        if connection is not None:
            with contextlib.suppress(psycopg.Error):
                connection.close()


maintenance.register(maintenance.Job(
    name="rescue",
    interval=lambda: pgtasks_settings.RESCUE_INTERVAL,
    run=rescue,
))
