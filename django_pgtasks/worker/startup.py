"""Starting workers for ``run_pgtasks``: which worker runs on which database, and how many.

The command parses and checks its options, then calls :func:`worker_groups` and :func:`run`.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.connection_budget import (
    SERVER_LIMITS_SQL,
    advice,
    available_connections,
    connections_needed,
)
from django_pgtasks.database.schema import missing_migrations, not_migrated
from django_pgtasks.database.sessions import open_connection
from django_pgtasks.definition.routing import database_for_queue, queue_databases, queues_on
from django_pgtasks.worker.pools import connection_holders
from django_pgtasks.worker.process_count import default_processes
from django_pgtasks.worker.supervisor import configure_logging

logger = logging.getLogger("django_pgtasks.run_pgtasks")

#: application_name of every database session a run_pgtasks process opens.
WORKER_APPLICATION_NAME = "pgtasks worker"


def preflight(alias: str, processes: int, threads: int, pool: str = "thread", *,
              automatic: bool = False) -> int:
    """Before any worker starts on ``alias``: raise
    :class:`~django_pgtasks.exceptions.NotMigratedError` when the database lacks migrations
    of django-pgtasks, and check that ``processes`` worker processes of ``threads``
    concurrency (with their ``pool``) fit in the connections its server accepts
    (:mod:`django_pgtasks.database.connection_budget`). Returns the number of processes to
    start: ``processes``, or for an ``automatic`` count (``PROCESSES = "auto"``) at most as
    many as fit in half of those connections (the web and other clients need theirs), at
    least one; an explicit count that does not fit is kept, with a WARNING. A database that
    cannot be reached is left to the workers, which wait for it (and stop with the same error
    if it comes back unmigrated)."""
    if connections[alias].vendor != "postgresql":
        return processes  # the worker refuses such a database itself (check E002 says so)
    try:
        # A connection of its own, closed at once: nothing opened here outlives the start-up
        # or is shared with the workers (or with a pool they would inherit).
        with open_connection(alias) as conn:
            missing = missing_migrations(conn.cursor())
            max_connections, superuser_reserved, reserved = conn.execute(
                SERVER_LIMITS_SQL
            ).fetchone()
    except psycopg.Error as exc:
        logger.info("Start-up checks skipped: database=%s could not be read: %s",
                    alias, str(exc).strip())
        return processes
    if missing:
        raise not_migrated(alias, missing)
    if pgtasks_settings.POOLER is not None:
        return processes  # the pooler's pool size bounds the server connections
    available = available_connections(max_connections, superuser_reserved, reserved)
    holders = connection_holders(pool, threads)
    settings_dict = connections[alias].settings_dict
    if automatic:
        per_process = connections_needed(1, holders, settings_dict)
        fitting = max(1, min(processes, available // 2 // per_process))
        if fitting < processes:
            logger.info(
                "PROCESSES 'auto': %d worker process(es) on database=%s rather than one per "
                "CPU (%d): %d connections each, and the server accepts %d.",
                fitting, alias, processes, per_process, available,
            )
        processes = fitting
    needed = connections_needed(processes, holders, settings_dict)
    if needed > available:
        logger.warning(
            "Connection budget exceeded: database=%s processes=%d concurrency=%d need up to "
            "%d connections, but the server accepts %d (max_connections=%d minus %d "
            "reserved); busy workers may fail with 'too many clients'. %s",
            alias, processes, threads, needed, available, max_connections,
            superuser_reserved + reserved, advice(alias, processes, available),
        )
    return processes


def worker_groups(worker_options: dict[str, Any], database: str | None,
                  note: Callable[[str], object]) -> list[dict[str, Any]]:
    """The worker options for each database to serve (one entry per database).

    ``database``: serve only that alias (``--database``); ``note`` reports a remark to the
    operator. Raises ``ImproperlyConfigured`` for a queue on an alias that does not exist.
    """
    queues = worker_options["queues"]
    if database:
        database = worker_options["using"]
            # The queues this database holds; one that holds none serves them all (for tasks
        # put there with ``enqueue(..., using=...)``).
        held = queues_on(database)
        if queues is None:
            worker_options["queues"] = held or None
        elif held and (elsewhere := [q for q in queues if q not in held]):
            # Allowed, for the tasks a queue left behind when it moved to another database.
            note(
                f"Queue(s) {', '.join(elsewhere)} are configured on another database than "
                f"{database!r} (PGTASKS['QUEUES']); serving the tasks they have there."
            )
        return [worker_options]
    selected = queues or pgtasks_settings.queue_names
    groups = []
    for database in queue_databases():
        on_database = [q for q in selected if database_for_queue(q) == database]
        if on_database:
            groups.append(dict(worker_options, using=database, queues=on_database))
    for group in groups:
        if group["using"] not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"Queue(s) {', '.join(group['queues'])} are on database "
                f"{group['using']!r}, which is not an alias in DATABASES "
                f"({', '.join(settings.DATABASES)})."
            )
    return groups or [worker_options]


def dump_threads(signum: int, frame: Any) -> None:
    """Print every thread's stack to stderr (the handler of SIGUSR1).

    A Python handler, run by the main thread between two bytecodes: it holds the GIL while
    it walks the stacks, so no other thread changes its frames meanwhile. (A C-level
    handler, ``faulthandler.register``, runs in whatever thread the signal lands on, while
    the others go on running Python code, and its walk of their frames can crash the
    process.)"""
    faulthandler.dump_traceback(all_threads=True)


def run(groups: list[dict[str, Any]], processes: int | None, log_level: str) -> int:
    """Run the workers of ``groups`` (``processes`` per database; ``None``: as
    ``PGTASKS["PROCESSES"]`` says) until they stop; return the exit code. One group of one
    process runs in this process; more run under a supervisor."""
    configure_logging(log_level)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: what a stuck worker is doing,
    # without stopping it (the supervisor's children inherit it).
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, dump_threads)
    # Name the worker's database sessions (libpq reads PGAPPNAME) so that operators can
    # tell them apart in pg_stat_activity.
    os.environ.setdefault("PGAPPNAME", WORKER_APPLICATION_NAME)
    automatic = processes is None and pgtasks_settings.PROCESSES == "auto"
    if processes is None:
        processes = default_processes(pgtasks_settings.PROCESSES)
    processes = min(
        preflight(
            group["using"], processes, group["concurrency"] or pgtasks_settings.CONCURRENCY,
            group.get("pool") or pgtasks_settings.POOL, automatic=automatic,
        )
        for group in groups
    )
    if processes > 1 or len(groups) > 1:
        from django_pgtasks.worker.supervisor import Supervisor

        code = Supervisor(processes, groups, log_level).run()
    else:
        from django_pgtasks.worker.loop import Worker

        code = Worker(**groups[0]).run()
        if code:
            # Handler threads past the grace period cannot be joined; leave without them.
            logging.shutdown()
            os._exit(code)
    return code
