"""``manage.py pgtasks_purge``: delete or archive old finished tasks now (workers also do it)."""

from __future__ import annotations

import argparse
import re
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_duration

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.routing import queue_databases
from django_pgtasks.patterns.retention import ARCHIVE_DELETED, ARCHIVED, DELETED, purge, to_seconds

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_age(value: str) -> timedelta:
    """``3600``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, or Django's duration formats."""
    match = AGE_RE.match(value)
    if match:
        number, unit = match.groups()
        return timedelta(seconds=float(number) * UNITS[unit.lower() or "s"])
    age = parse_duration(value)
    if age is None or age < timedelta(0):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an age; use seconds or a number with s, m, h, d or w (e.g. 7d)"
        )
    return age


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _describe(age: Any) -> str:
    """A retention setting for help texts: ``7 days``, ``12 hours``, ``kept forever``."""
    seconds = to_seconds(age)
    if seconds is None:
        return "kept forever"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


class Command(BaseCommand):
    help = (
        "Delete finished tasks older than their retention, or move them to the archive, in "
        "short batches, oldest first. Running workers do this every "
        "PGTASKS['PURGE_INTERVAL'] seconds in bounded turns; this command does it all, now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        s = pgtasks_settings
        parser.add_argument(
            "--dry-run", action="store_true",
            help="Count the tasks that would be purged, changing nothing (default: purge).",
        )
        parser.add_argument(
            "--older-than", type=parse_age, default=None, metavar="AGE",
            help=f"Purge finished tasks of every status that ended more than AGE ago: seconds, "
                 f"or a number with s, m, h, d or w, e.g. 7d (default: PGTASKS['RETENTION'], "
                 f"{_describe(s.RETENTION)}, for successful and cancelled tasks and "
                 f"PGTASKS['FAILED_RETENTION'], {_describe(s.FAILED_RETENTION)}, for failed "
                 f"ones).",
        )
        parser.add_argument(
            "--failed-older-than", type=parse_age, default=None, metavar="AGE",
            help="Age for failed tasks alone, in the same format (default: --older-than if "
                 "given, else PGTASKS['FAILED_RETENTION']).",
        )
        parser.add_argument(
            "--archive", action=argparse.BooleanOptionalAction, default=None,
            help=f"Move the tasks to pgtasks_task_archive instead of deleting them, or not "
                 f"(default: PGTASKS['ARCHIVE'], {s.ARCHIVE}). Archived tasks older than "
                 f"PGTASKS['ARCHIVE_RETENTION'] ({_describe(s.ARCHIVE_RETENTION)}) are "
                 f"deleted either way.",
        )
        parser.add_argument(
            "--batch-size", type=_positive_int, default=None, metavar="N",
            help=f"Rows per batch, each batch its own transaction (default: "
                 f"PGTASKS['PURGE_BATCH'], {s.PURGE_BATCH}).",
        )
        parser.add_argument(
            "--database", default=None,
            help=f"Database alias of the task table (default: every database that holds "
                 f"a queue, PGTASKS['DATABASE'] ({s.DATABASE!r}) first).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        databases = [options["database"]] if options["database"] else queue_databases()
        for database in databases:
            if database not in settings.DATABASES:
                raise CommandError(f"--database {database!r} is not an alias in DATABASES.")
        for database in databases:
            if len(databases) > 1:
                self.stdout.write(f"Database {database}:")
            self._purge(database, options)

    def _purge(self, database: str, options: dict[str, Any]) -> None:
        progress = options["verbosity"] >= 2

        def on_batch(kind: str, counts: dict[str, int]) -> None:
            if progress:
                self.stdout.write(f"Batch: {kind} {sum(counts.values())} "
                                  f"({', '.join(f'{k}={v}' for k, v in sorted(counts.items()))})")

        started = time.monotonic()
        result = purge(
            database, older_than=options["older_than"],
            failed_older_than=options["failed_older_than"], archive=options["archive"],
            batch_size=options["batch_size"], dry_run=options["dry_run"], on_batch=on_batch,
        )
        elapsed = time.monotonic() - started
        would = "would be " if result.dry_run else ""
        for kind, counts in ((DELETED, result.deleted), (ARCHIVED, result.archived),
                             (ARCHIVE_DELETED, result.archive_deleted)):
            for status, count in sorted(counts.items()):
                label = "deleted from the archive" if kind == ARCHIVE_DELETED else kind
                self.stdout.write(f"{status}: {count} {would}{label}")
        if result.dry_run:
            self.stdout.write(
                f"{result.total} task(s) would be purged, "
                f"{sum(result.archive_deleted.values())} archived task(s) deleted (dry run)."
            )
        else:
            self.stdout.write(
                f"{sum(result.deleted.values())} task(s) deleted, "
                f"{sum(result.archived.values())} archived, "
                f"{sum(result.archive_deleted.values())} deleted from the archive, in "
                f"{result.batches} batch(es), {elapsed:.1f}s."
            )
