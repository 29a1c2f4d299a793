"""``manage.py run_pgtasks``: run workers. Parses options, then hands over to Worker/Supervisor.

Each worker process works against one database. Without ``--database`` the queues to serve
are grouped by the database that holds them
(:func:`django_pgtasks.base.routing.database_for_queue`):
queues on one database run as before; queues on several run under a supervisor, with
``--processes`` worker processes for each database.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgtasks.base.budget import (
    SERVER_LIMITS_SQL,
    advice,
    available_connections,
    connections_needed,
)
from django_pgtasks.base.routing import database_for_queue, queue_databases, queues_on
from django_pgtasks.base.sessions import open_connection
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.worker.supervisor import configure_logging

logger = logging.getLogger("django_pgtasks.run_pgtasks")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: application_name of every database session a run_pgtasks process opens.
WORKER_APPLICATION_NAME = "pgtasks worker"


def _positive_number(value: str) -> float:
    import argparse

    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return number


def warn_if_over_budget(alias: str, processes: int, threads: int) -> None:
    """Log a WARNING when ``processes`` worker processes of ``threads`` threads may need more
    connections to ``alias`` than its server accepts (:mod:`django_pgtasks.base.budget`)."""
    if connections[alias].vendor != "postgresql":
        return  # the worker refuses such a database itself (and check E002 reports it)
    try:
        # A connection of its own, closed at once: nothing opened here outlives the start-up
        # or is shared with the workers (or with a pool they would inherit).
        with open_connection(alias) as conn:
            max_connections, superuser_reserved, reserved = conn.execute(
                SERVER_LIMITS_SQL
            ).fetchone()
    except psycopg.Error as exc:
        logger.info("Connection budget not checked: database=%s could not be read: %s",
                    alias, str(exc).strip())
        return
    available = available_connections(max_connections, superuser_reserved, reserved)
    needed = connections_needed(processes, threads, connections[alias].settings_dict)
    if needed > available:
        logger.warning(
            "Connection budget exceeded: database=%s processes=%d concurrency=%d need up to "
            "%d connections, but the server accepts %d (max_connections=%d minus %d "
            "reserved); busy workers may fail with 'too many clients'. %s",
            alias, processes, threads, needed, available, max_connections,
            superuser_reserved + reserved, advice(alias, processes, available),
        )


class Command(BaseCommand):
    help = "Run django-pgtasks workers: claim due tasks and run them until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        s = pgtasks_settings
        parser.add_argument(
            "--queues", "-q", default=None,
            help="Comma-separated queues to serve (default: every queue in PGTASKS['QUEUES']).",
        )
        parser.add_argument(
            "--concurrency", "-c", type=int, default=None,
            help=f"Worker threads per process (default: PGTASKS['CONCURRENCY'], {s.CONCURRENCY}).",
        )
        parser.add_argument(
            "--prefetch", type=int, default=None,
            help=f"Tasks claimed beyond the free threads (default: PGTASKS['PREFETCH'], "
                 f"{s.PREFETCH}).",
        )
        parser.add_argument(
            "--processes", "-p", type=int, default=1,
            help="Worker processes under one supervisor that restarts any that die (default: 1).",
        )
        parser.add_argument(
            "--burst", action="store_true",
            help="Exit once no task is due and none is running (default: run until stopped).",
        )
        parser.add_argument(
            "--worker-id", default=None,
            help="Name shown in locked_by and logs (default: host:pid:random; "
                 "'-N' is appended per process with --processes).",
        )
        parser.add_argument(
            "--poll-interval", type=_positive_number, default=None,
            help=f"Seconds to wait when idle (default: PGTASKS['POLL_INTERVAL'], "
                 f"{s.POLL_INTERVAL}).",
        )
        parser.add_argument(
            "--task-pause", type=_positive_number, default=None,
            help=f"Seconds to pause between tasks per thread (default: {s.TASK_PAUSE}).",
        )
        parser.add_argument(
            "--shutdown-grace", type=_positive_number, default=None,
            help=f"Seconds running tasks get after SIGTERM (default: {s.SHUTDOWN_GRACE}).",
        )
        parser.add_argument(
            "--database", default=None,
            help="Serve only the queues held by this database alias (default: every "
                 "database that holds a queue to serve, each with its own worker processes; "
                 "see PGTASKS['QUEUES'] 'database' options).",
        )
        parser.add_argument(
            "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
            help="Log level of django_pgtasks loggers (default: INFO).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        groups = self._worker_groups(options)
        configure_logging(options["log_level"])
        # Name the worker's database sessions (libpq reads PGAPPNAME) so that operators can
        # tell them apart in pg_stat_activity.
        os.environ.setdefault("PGAPPNAME", WORKER_APPLICATION_NAME)
        processes = options["processes"]
        for group in groups:
            warn_if_over_budget(
                group["using"], processes, group["concurrency"] or pgtasks_settings.CONCURRENCY
            )
        if processes > 1 or len(groups) > 1:
            from django_pgtasks.worker.supervisor import Supervisor

            code = Supervisor(processes, groups, options["log_level"]).run()
        else:
            from django_pgtasks.worker.loop import Worker

            code = Worker(**groups[0]).run()
            if code:
                # Handler threads past the grace period cannot be joined; leave without them.
                logging.shutdown()
                os._exit(code)
        if code:
            raise SystemExit(code)

    def _worker_groups(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        """The worker options for each database to serve (one entry per database)."""
        worker_options = self._worker_options(options)
        queues = worker_options["queues"]
        if options["database"]:
            database = worker_options["using"]
            # The queues this database holds; one that holds none serves them all (for tasks
            # put there with ``enqueue(..., using=...)``).
            held = queues_on(database)
            if queues is None:
                worker_options["queues"] = held or None
            elif held and (elsewhere := [q for q in queues if q not in held]):
                # Allowed, for the tasks a queue left behind when it moved to another database.
                self.stderr.write(
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
                raise CommandError(
                    f"Queue(s) {', '.join(group['queues'])} are on database "
                    f"{group['using']!r}, which is not an alias in DATABASES "
                    f"({', '.join(settings.DATABASES)})."
                )
        return groups or [worker_options]

    def _worker_options(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if options["prefetch"] is not None and options["prefetch"] < 0:
            raise CommandError("--prefetch must be 0 or more.")
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1.")
        if options["poll_interval"] == 0:
            raise CommandError("--poll-interval must be greater than 0.")
        database = options["database"] or pgtasks_settings.DATABASE
        if database not in settings.DATABASES:
            raise CommandError(
                f"--database {database!r} is not an alias in DATABASES "
                f"({', '.join(settings.DATABASES)})."
            )
        queues = None
        if options["queues"]:
            queues = [q.strip() for q in options["queues"].split(",") if q.strip()]
            unknown = [q for q in queues if q not in pgtasks_settings.queue_names]
            if unknown or not queues:
                raise CommandError(
                    f"--queues names unknown queue(s) {', '.join(map(repr, unknown))}; "
                    f"configured: {', '.join(pgtasks_settings.queue_names)}."
                )
        return {
            "queues": queues,
            "concurrency": options["concurrency"],
            "worker_id": options["worker_id"],
            "burst": options["burst"],
            "poll_interval": options["poll_interval"],
            "task_pause": options["task_pause"],
            "shutdown_grace": options["shutdown_grace"],
            "using": database,
            "prefetch": options["prefetch"],
        }
