"""``manage.py pgtasks_rescue``: give abandoned tasks back now (workers also do it themselves)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.routing import queue_databases
from django_pgtasks.worker.liveness import rescue


class Command(BaseCommand):
    help = (
        "Rescue tasks left RUNNING by lost workers (killed, disconnected or hung): each goes "
        "back for another attempt, or to FAILED when it has none left. Running workers do "
        "this every PGTASKS['RESCUE_INTERVAL'] seconds; this command does it once, now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true",
            help="List the abandoned tasks without changing them (default: rescue them).",
        )
        parser.add_argument(
            "--database", default=None,
            help=f"Database alias of the task table (default: every database that holds "
                 f"a queue, PGTASKS['DATABASE'] ({pgtasks_settings.DATABASE!r}) first).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        databases = [options["database"]] if options["database"] else queue_databases()
        for database in databases:
            if database not in settings.DATABASES:
                raise CommandError(f"--database {database!r} is not an alias in DATABASES.")
        verb = "would be rescued" if options["dry_run"] else "rescued"
        busy = []
        for database in databases:
            # With several databases, each line names the one it is about.
            where = f" database={database}" if len(databases) > 1 else ""
            result = rescue(database, dry_run=options["dry_run"])
            if result is None:
                busy.append(database)
                continue
            for task in result:
                self.stdout.write(f"Task id={task.id} name={task.name} worker={task.worker} "
                                  f"status={task.status}{where}")
            on = f" on {database}" if len(databases) > 1 else ""
            self.stdout.write(f"{len(result)} task(s) {verb}{on}.")
        if busy:
            on = f" on {', '.join(busy)}" if len(databases) > 1 else ""
            raise CommandError(f"Another rescue pass is running right now{on}; try again.")
