"""``manage.py pgtasks_stats``: the admin dashboard's numbers in the terminal, once or refreshed.

Per database that holds queues: queue sizes with the oldest waiting age and the last hour's
throughput, tasks ended per hour, counts and run times per task name, failures grouped by
error, stuck tasks and workers.
"""

from __future__ import annotations

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

from django_pgtasks.definition import routing
from django_pgtasks.management.arguments import positive
from django_pgtasks.monitoring import dashboard, stats
from django_pgtasks.monitoring.dashboard import seconds_text

#: Moves the cursor home and clears the terminal, as ``watch`` and ``top`` do.
CLEAR_SCREEN = "\x1b[H\x1b[2J"



def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """Columns padded to their widest cell. ``align`` has one letter per column, ``l`` or
    ``r``; by default the first column is left-aligned and the others (numbers) right."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [list(headers), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                  for c, w, a in zip(row, widths, align, strict=True)).rstrip()
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Show django-pgtasks statistics: per queue the waiting, scheduled and running tasks, "
        "the oldest waiting age and the last hour's throughput; per hour the tasks that "
        "ended; per task name the counts, failure rate and run-time percentiles; failures "
        "grouped by error; stuck tasks; workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--hours", type=positive(int), default=24,
            help="Hours of history for throughput and run times, the current one included "
                 "(default: 24).",
        )
        parser.add_argument(
            "--json", action="store_true",
            help="Print one JSON document (one per line with --watch) instead of tables "
                 "(default: tables).",
        )
        parser.add_argument(
            "--watch", type=positive(float), default=None, metavar="SECONDS",
            help="Refresh every SECONDS until interrupted, like top (default: print once).",
        )
        parser.add_argument(
            "--database", default=None,
            help="Database alias of the task table (default: every database that holds "
                 "queues, PGTASKS['DATABASE'] first).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        database = options["database"]
        if database is not None and database not in settings.DATABASES:
            raise CommandError(f"--database {database!r} is not an alias in DATABASES.")
        databases = [database] if database else routing.queue_databases()
        if options["hours"] > dashboard.MAX_HOURS:
            raise CommandError(f"--hours must be at most {dashboard.MAX_HOURS}.")
        watch = options["watch"]
        try:
            while True:
                snapshot = self.collect(databases, options["hours"])
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

    def collect(self, databases: list[str], hours: int) -> dict[str, Any]:
        """Everything shown, as plain data (what --json prints)."""
        return {
            "generated_at": timezone.now(),
            "hours": hours,
            "databases": [self.collect_database(alias, hours) for alias in databases],
        }

    def collect_database(self, database: str, hours: int) -> dict[str, Any]:
        snapshot = dashboard.database_snapshot(database, hours)
        data = dashboard.jsonable(snapshot)
        return {
            "database": database,
            "queues": data["queues"],
            "throughput": [stats.as_dict(h) for h in stats.throughput(hours,
                                                                      database)],
            "durations": [stats.as_dict(d) for d in
                          stats.durations(timedelta(hours=hours), database)],
            "names": data["names"],
            "error_groups": data["error_groups"],
            "stuck_count": data["stuck_count"],
            "stuck": data["stuck"],
            "workers": data["workers"],
            "chart": data["chart"],
            "estimate": data["estimate"],
        }

    def render(self, snapshot: dict[str, Any], hours: int) -> str:
        when = snapshot["generated_at"].strftime("%Y-%m-%d %H:%M:%S %Z")
        several = len(snapshot["databases"]) > 1
        parts = [f"django-pgtasks at {when}\n"]
        for data in snapshot["databases"]:
            if several:
                parts.append(f"== Database {data['database']} ==\n")
            parts.append(self.render_database(data, hours))
        return "\n".join(parts)

    def render_database(self, data: dict[str, Any], hours: int) -> str:
        queues = table(
            ["queue", "waiting", "scheduled", "running", "on parents", "oldest waiting",
             "longest running", "ok/1h", "failed/1h"],
            [[q["queue"], q["waiting"], q["scheduled"], q["running"], q["waiting_for_parents"],
              seconds_text(q["oldest_waiting"]), seconds_text(q["longest_running"]),
              q["succeeded_last_hour"], q["failed_last_hour"]]
             for q in data["queues"]],
        )
        # Per hour, summed over task names (--json keeps them apart), most recent first.
        per_hour: dict[Any, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in data["throughput"]:
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
             for d in data["durations"]],
        )
        errors = table(
            ["failed", "error (first line; numbers and ids as N)"],
            [[g["count"], g["text"] or "(no error text)"] for g in data["error_groups"]],
            align="rl",
        ) if data["error_groups"] else "(none)"
        stuck = table(
            ["id", "task", "queue", "worker", "attempt", "running for"],
            [[s["id"], s["name"], s["queue"], s["worker"] or "-",
              f"{s['attempt']}/{s['max_attempts']}", seconds_text(s["running_for"])]
             for s in data["stuck"]],
            align="rlllrr",
        ) if data["stuck"] else "(none)"
        workers = table(
            ["worker", "queues", "threads", "running", "last seen", "state"],
            [[w["name"], ",".join(w["queues"]), w["concurrency"], w["running"],
              f"{seconds_text(w['last_seen_ago'])} ago", "LOST" if w["lost"] else "alive"]
             for w in data["workers"]],
            align="llrrrl",
        ) if data["workers"] else "(no worker registered)"
        estimate = data["estimate"]
        size = (f"\nWhole task table: ~{estimate['rows']} rows (estimate from PostgreSQL's "
                f"statistics)\n" if estimate["rows"] is not None else "")
        return (
            f"Queues\n{queues}\n\n"
            f"Tasks ended per hour (last {hours} h)\n{hourly}\n\n"
            f"Tasks by name (last {hours} h; run time of the last attempt)\n{names}\n\n"
            f"Failed tasks by error (last {hours} h)\n{errors}\n\n"
            f"Stuck tasks: {data['stuck_count']}\n{stuck}\n\n"
            f"Workers\n{workers}\n{size}"
        )
