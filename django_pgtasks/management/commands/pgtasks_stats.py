"""``manage.py pgtasks_stats``: queue sizes, throughput and run times, once or refreshed."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from django_pgtasks import stats
from django_pgtasks.conf import pgtasks_settings

#: Moves the cursor home and clears the terminal, as ``watch`` and ``top`` do.
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, not {value}")
        return number

    parse.__name__ = kind.__name__
    return parse


def seconds_text(value: float | None) -> str:
    """A duration or an age for people: ``0.042s``, ``12.5s``, ``7m05s``, ``3h20m``, ``2d4h``."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.3f}s" if value < 10 else f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, numbers right."""
    cells = [list(headers), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                  for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Show django-pgtasks statistics: per queue the waiting, scheduled and running tasks "
        "and the oldest waiting age; per hour the tasks that ended; per task name the counts, "
        "failure rate and run-time percentiles."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--hours", type=_positive(int), default=24,
            help="Hours of history for throughput and run times, the current one included "
                 "(default: 24).",
        )
        parser.add_argument(
            "--json", action="store_true",
            help="Print one JSON document (one per line with --watch) instead of tables "
                 "(default: tables).",
        )
        parser.add_argument(
            "--watch", type=_positive(float), default=None, metavar="SECONDS",
            help="Refresh every SECONDS until interrupted, like top (default: print once).",
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
        watch = options["watch"]
        try:
            while True:
                snapshot = self.collect(database, options["hours"])
                if options["json"]:
                    self.stdout.write(json.dumps(snapshot, cls=DjangoJSONEncoder))
                else:
                    if watch and self.stdout.isatty():
                        self.stdout.write(CLEAR_SCREEN, ending="")
                    self.stdout.write(self.render(snapshot, options["hours"]))
                if not watch:
                    return
                self.stdout.flush()
                time.sleep(watch)
        except KeyboardInterrupt:  # the way out of --watch
            return

    def collect(self, database: str, hours: int) -> dict[str, Any]:
        """Everything shown, as plain data (what --json prints)."""
        return {
            "generated_at": timezone.now(),
            "hours": hours,
            "queues": [stats.as_dict(q) for q in stats.queue_sizes(database)],
            "throughput": [stats.as_dict(h) for h in stats.throughput(hours, database)],
            "durations": [stats.as_dict(d) for d in
                          stats.durations(timedelta(hours=hours), database)],
        }

    def render(self, snapshot: dict[str, Any], hours: int) -> str:
        queues = table(
            ["queue", "waiting", "scheduled", "running", "oldest waiting", "longest running"],
            [[q["queue"], q["waiting"], q["scheduled"], q["running"],
              seconds_text(q["oldest_waiting"]), seconds_text(q["longest_running"])]
             for q in snapshot["queues"]],
        )
        # Per hour, summed over task names (--json keeps them apart), most recent first.
        per_hour: dict[Any, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in snapshot["throughput"]:
            totals = per_hour[row["hour"]]
            for i, key in enumerate(("succeeded", "failed", "cancelled")):
                totals[i] += row[key]
        hourly = table(
            ["hour (UTC)", "succeeded", "failed", "cancelled"],
            [[hour.strftime("%Y-%m-%d %H:00"), *totals]
             for hour, totals in sorted(per_hour.items(), reverse=True)],
        )
        names = table(
            ["task", "succeeded", "failed", "cancelled", "failure rate", "avg", "p50", "p95",
             "p99", "max"],
            [[d["name"], d["succeeded"], d["failed"], d["cancelled"],
              "-" if d["failure_rate"] is None else f"{d['failure_rate']:.1%}",
              *(seconds_text(d[k]) for k in ("avg", "p50", "p95", "p99", "max"))]
             for d in snapshot["durations"]],
        )
        when = snapshot["generated_at"].strftime("%Y-%m-%d %H:%M:%S %Z")
        return (
            f"django-pgtasks at {when}\n\nQueues\n{queues}\n\n"
            f"Tasks ended per hour (last {hours} h)\n{hourly}\n\n"
            f"Tasks by name (last {hours} h; run time of the last attempt)\n{names}\n"
        )
