"""``manage.py pgtasks_rescue``: give abandoned tasks back now (workers also do it themselves)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.liveness import rescue


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
            help=f"Database alias of the task table (default: PGTASKS['DATABASE'], "
                 f"{pgtasks_settings.DATABASE!r}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        database = options["database"] or pgtasks_settings.DATABASE
        if database not in settings.DATABASES:
            raise CommandError(f"--database {database!r} is not an alias in DATABASES.")
        result = rescue(database, dry_run=options["dry_run"])
        if result is None:
            raise CommandError("Another rescue pass is running right now; try again.")
        verb = "would be rescued" if options["dry_run"] else "rescued"
        for task in result:
            self.stdout.write(f"Task id={task.id} name={task.name} worker={task.worker} "
                              f"status={task.status}")
        self.stdout.write(f"{len(result)} task(s) {verb}.")
