"""The connection budget: how many PostgreSQL connections the workers need, and whether they fit.

``run_pgtasks --processes P --concurrency T`` runs P worker processes of T threads each (for
every database that holds queues it serves). Each process opens, to its database:

- **4 connections of its own**, for its whole life: the main loop's (claims, completions),
  a dedicated one for liveness (the advisory lock and heartbeats) and ``LISTEN``, the
  maintainer's (rescue, partitions, purge, scheduler: :mod:`django_pgtasks.worker.maintainer`)
  and the releaser's (workflow children: :mod:`django_pgtasks.worker.releaser`);
- **1 per pool thread** whose handler touches the database, or whose failure must be
  recorded; a thread keeps its connection once it has opened one, so up to T. It is opened
  before the handler starts (``worker/connecting.py``): a refusal then gives the task back
  unspent, and the thread rests.

That is ``P * (4 + T)``: ``--processes 4 --concurrency 25`` needs up to 4 * 29 = 116
connections, more than PostgreSQL's default ``max_connections = 100``.

With ``--pool async`` the coroutines share one thread for their database calls, and the
sync handlers run on at most four threads beside them: T is then ``1 + min(T, 4)``, however
many coroutines run (the worker computes it: ``connection_holders()`` of
``django_pgtasks.worker.pools``).

With Django's connection pool (``DATABASES[alias]["OPTIONS"]["pool"]``, Django 5.1 or later,
``pip install "psycopg[pool]"``) a thread takes a connection from the pool for each task and
gives it back afterwards, so the threads of one process hold at most the pool's ``max_size``
between them: ``P * (4 + min(T, max_size))``. The process's own four are counted on top of the
pool, which keeps the figure an upper bound however they are opened. ``"pool": True`` uses
psycopg's defaults, ``min_size = 4`` and ``max_size`` equal to ``min_size``.

The server accepts ``max_connections`` minus the connections it keeps for superusers
(``superuser_reserved_connections``, 3 by default) and, from PostgreSQL 16, for roles
granted ``pg_use_reserved_connections`` (``reserved_connections``). The web processes,
scripts and ``psql`` sessions share what is left with the workers.

Everything here is arithmetic on numbers the caller supplies: the system check
(``django_pgtasks.W050``) and ``run_pgtasks`` read the server's settings with
:data:`SERVER_LIMITS_SQL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Connections a worker process holds besides its threads' (main loop; liveness and LISTEN;
#: maintenance).
PROCESS_CONNECTIONS = 4
#: psycopg_pool's ``min_size`` default, which is also its ``max_size`` when none is given.
DEFAULT_POOL_SIZE = 4

#: ``(max_connections, superuser_reserved_connections, reserved_connections)`` of the server.
#: ``current_setting(..., true)`` is ``NULL`` for a setting the server does not have
#: (``reserved_connections`` before PostgreSQL 16), where ``SHOW`` would fail.
SERVER_LIMITS_SQL = (
    "SELECT current_setting('max_connections')::int, "
    "current_setting('superuser_reserved_connections')::int, "
    "coalesce(current_setting('reserved_connections', true), '0')::int"
)


def pool_max_size(database: Mapping[str, Any]) -> int | None:
    """The most connections Django's pool keeps for one ``DATABASES`` entry; ``None`` when it
    has no pool (or one Django would reject, which then cannot hold any connection either)."""
    options = database.get("OPTIONS") or {}
    pool = options.get("pool") if isinstance(options, Mapping) else None
    if not pool:  # Django also treats an empty dict as "no pool"
        return None
    if pool is True:
        return DEFAULT_POOL_SIZE
    if not isinstance(pool, Mapping):
        return None
    size = pool.get("max_size")
    if size is None:
        size = pool.get("min_size", DEFAULT_POOL_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return None
    return size


def connections_per_process(threads: int, pool_size: int | None = None) -> int:
    """Connections one worker process of ``threads`` threads needs at most, its threads
    sharing a pool of ``pool_size`` connections (``None``: no pool, one per thread)."""
    held_by_threads = threads if pool_size is None else min(threads, pool_size)
    return PROCESS_CONNECTIONS + held_by_threads


def connections_needed(
    processes: int, threads: int, database: Mapping[str, Any] | None = None
) -> int:
    """Connections ``processes`` worker processes of ``threads`` threads need at most, on the
    database whose ``DATABASES`` entry is ``database`` (which tells whether it has a pool)."""
    return processes * connections_per_process(threads, pool_max_size(database or {}))


def available_connections(
    max_connections: int, superuser_reserved: int, reserved: int = 0
) -> int:
    """Connections a server accepts from ordinary roles (the workers' and the web's)."""
    return max(max_connections - superuser_reserved - reserved, 0)


def advice(alias: str, processes: int, available: int) -> str:
    """What to change so that ``processes`` worker processes fit in ``available``
    connections: one sentence, with the largest thread count or pool size that fits."""
    per_process = available // processes - PROCESS_CONNECTIONS
    if per_process >= 1:
        ways = [
            f"run at most {per_process} thread(s) per process",
            f"give DATABASES[{alias!r}]['OPTIONS'] a connection pool of at most "
            f"{per_process} ({{'pool': {{'max_size': {per_process}}}}}, which needs "
            f"psycopg[pool])",
        ]
    else:
        ways = ["run fewer processes"]
    ways.append("raise the server's max_connections")
    return (f"To fit, {', '.join(ways[:-1])}, or {ways[-1]}; web processes and other "
            f"clients need connections of their own too.")
