"""Leases and liveness: when a worker counts as lost and a running task as abandoned.

A worker holds a session-level advisory lock (``LOCK_NAMESPACE``, :func:`lock_key` of its
row) for as long as it lives, and a running task is leased to it (``locked_by``,
``locked_at``, ``claims``). The conditions below are what the rescue
(:mod:`django_pgtasks.lifecycle.transitions`), the dashboard, the stuck-task queries and the
maintenance jobs' own advisory locks (``LOCK_NAMESPACE``) share.
"""

from __future__ import annotations

from django_pgtasks.conf import pgtasks_settings

#: First key of every advisory lock django-pgtasks takes ("pgts"), so they are easy to tell
#: apart from an application's own advisory locks in pg_locks.
LOCK_NAMESPACE = 0x70677473
MAX_INT4 = 2**31 - 1


def lock_key(worker_pk: int) -> int:
    """The second advisory-lock key (an int4) of a worker's liveness lock, from its row id."""
    return (worker_pk - 1) % (MAX_INT4 - 1) + 1


# A worker is lost if (a) its liveness lock is not held by any session of this database and it
# has been silent for the grace period, or (b) it has been silent for the worker timeout.
# Takes RESCUE_GRACE and WORKER_TIMEOUT.
LOST_WORKER_SQL = f"""
    (w.last_seen_at < now() - make_interval(secs => %s)
     AND w.lock_key IS NOT NULL
     AND NOT EXISTS (
         SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid = {LOCK_NAMESPACE} AND l.objid = w.lock_key AND l.objsubid = 2))
    OR w.last_seen_at < now() - make_interval(secs => %s)
"""

# A running task is abandoned if its worker is lost, or (c) no registered worker has its name
# and its lease is older than the worker timeout. Reads only RUNNING rows (a partial index).
# Takes RESCUE_GRACE, WORKER_TIMEOUT, WORKER_TIMEOUT (abandoned_params()).
ABANDONED_SQL = f"""
    "pgtasks_task"."locked_by" IN (SELECT w.name FROM pgtasks_worker w WHERE {LOST_WORKER_SQL})
    OR (NOT EXISTS (SELECT 1 FROM pgtasks_worker w WHERE w.name = "pgtasks_task"."locked_by")
        AND "pgtasks_task"."locked_at" < now() - make_interval(secs => %s))
"""


def lost_worker_params() -> list[float]:
    s = pgtasks_settings
    return [float(s.RESCUE_GRACE), float(s.WORKER_TIMEOUT)]


def abandoned_params() -> list[float]:
    return [*lost_worker_params(), float(pgtasks_settings.WORKER_TIMEOUT)]
