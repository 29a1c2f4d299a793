"""``manage.py run_pgtasks``: run workers. Parses options, then hands over to Worker/Supervisor.

Each worker process works against one database. Without ``--database`` the queues to serve
are grouped by the database that holds them
(:func:`django_pgtasks.definition.routing.database_for_queue`):
queues on one database run as before; queues on several run under a supervisor, with
``--processes`` worker processes for each database.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgtasks.conf import is_seconds, pgtasks_settings
from django_pgtasks.exceptions import NotMigratedError
from django_pgtasks.worker import startup
from django_pgtasks.worker.pools import POOL_KINDS, PoolOptions, check_options

logger = logging.getLogger("django_pgtasks.run_pgtasks")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _positive_number(value: str) -> float:
    import argparse

    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    if not is_seconds(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of seconds")
    return number


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
            "--pool", choices=POOL_KINDS, default=None,
            help=f"Where handlers run: threads of the worker, a child process per task, or "
                 f"an event loop for async handlers (default: PGTASKS['POOL'], {s.POOL}).",
        )
        parser.add_argument(
            "--max-tasks-per-child", type=_at_least_one, default=None, metavar="N",
            help="--pool process: replace a child process after N tasks (default: "
                 "PGTASKS['MAX_TASKS_PER_CHILD'], never).",
        )
        parser.add_argument(
            "--max-memory-per-child", type=_at_least_one, default=None, metavar="MB",
            help="--pool process: replace a child whose resident memory after a task is "
                 "above MB MiB (default: PGTASKS['MAX_MEMORY_PER_CHILD'], never).",
        )
        parser.add_argument(
            "--cancel-grace", type=_positive_number, default=None, metavar="SECONDS",
            help=f"--pool process: seconds a cancelled task's handler has to stop before its "
                 f"child process is stopped (default: PGTASKS['CANCEL_GRACE'], "
                 f"{s.CANCEL_GRACE}).",
        )
        parser.add_argument(
            "--prefetch", type=_prefetch, default=None,
            help=f"Tasks claimed beyond the free threads: 'auto' or a number (default: "
                 f"PGTASKS['PREFETCH'], {s.PREFETCH}).",
        )
        parser.add_argument(
            "--processes", "-p", type=int, default=None,
            help="Worker processes per database, under one supervisor that restarts any that "
                 "die (default: PGTASKS['PROCESSES'], 'auto': one per CPU this process may "
                 "use, as many as fit in half the database's connections).",
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
        try:
            groups = startup.worker_groups(self._worker_options(options), options["database"],
                                           note=self.stderr.write)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        try:
            code = startup.run(groups, options["processes"], options["log_level"])
        except NotMigratedError as exc:
            raise CommandError(str(exc)) from exc
        if code:
            raise SystemExit(code)

    def _worker_options(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if options["processes"] is not None and options["processes"] < 1:
            raise CommandError("--processes must be at least 1.")
        if options["poll_interval"] == 0:
            raise CommandError("--poll-interval must be greater than 0.")
        database = options["database"] or pgtasks_settings.DATABASE
        if database not in settings.DATABASES:
            raise CommandError(
                f"--database {database!r} is not an alias in DATABASES "
                f"({', '.join(settings.DATABASES)})."
            )
        pool = PoolOptions(
            kind=options["pool"] or pgtasks_settings.POOL,
            max_tasks_per_child=_first(options["max_tasks_per_child"],
                                       pgtasks_settings.MAX_TASKS_PER_CHILD),
            max_memory_per_child=_first(options["max_memory_per_child"],
                                        pgtasks_settings.MAX_MEMORY_PER_CHILD),
            cancel_grace=_first(options["cancel_grace"], pgtasks_settings.CANCEL_GRACE),
        )
        problem = check_options(pool)
        if problem:
            raise CommandError(f"--pool: {problem}.")
        if options["cancel_grace"] is not None and pool.kind != "process":
            raise CommandError(f"--cancel-grace applies to the process pool only (this "
                               f"worker's pool is {pool.kind!r}).")
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
            "pool": pool.kind,
            "max_tasks_per_child": pool.max_tasks_per_child,
            "max_memory_per_child": pool.max_memory_per_child,
            "cancel_grace": options["cancel_grace"],
        }


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def _at_least_one(value: str) -> int:
    """A whole number of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def _prefetch(value: str) -> int | str:
    """``--prefetch``: ``auto`` or a whole number, 0 or more."""
    if value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither 'auto' nor a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError("must be 'auto' or 0 or more")
    return number
