"""``manage.py pgtasks_queue``: pause, resume and rate-limit queues; show their state."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.exceptions import PgTasksError
from django_pgtasks.management.arguments import positive
from django_pgtasks.patterns import controls


class Command(BaseCommand):
    help = (
        "Pause or resume queues for every worker at once, set or clear rate limits of queues "
        "and concurrency keys, and show each queue's state. Changes apply to the next claims "
        "of all workers as soon as they are saved."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None,
            help="Database alias of the task table (default: the one that holds each queue; "
                 f"for key rate limits PGTASKS['DATABASE'] ({pgtasks_settings.DATABASE!r})).",
        )
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        pause = actions.add_parser(
            "pause", help="Stop starting tasks of these queues (running tasks finish).")
        pause.add_argument("queues", nargs="+", metavar="QUEUE")
        resume = actions.add_parser(
            "resume", help="Start tasks of these queues again, and wake idle workers.")
        resume.add_argument("queues", nargs="+", metavar="QUEUE")
        status = actions.add_parser(
            "status", help="Paused or not, rate limit, waiting and running tasks per queue.")
        status.add_argument("queues", nargs="*", metavar="QUEUE",
                            help="Default: every configured queue.")
        status.add_argument("--json", action="store_true", help="Print JSON.")
        limit = actions.add_parser(
            "rate-limit",
            help="At most LIMIT starts per PERIOD seconds, for a queue or a concurrency key.")
        target = limit.add_mutually_exclusive_group(required=True)
        target.add_argument("--queue")
        target.add_argument("--key", help="A concurrency key (Task.concurrency_key).")
        limit.add_argument("limit", type=int, metavar="LIMIT")
        limit.add_argument("period", type=positive(float), metavar="PERIOD",
                           help="Seconds.")
        clear = actions.add_parser("clear-rate-limit",
                                   help="Remove the rate limit of a queue or a key.")
        target = clear.add_mutually_exclusive_group(required=True)
        target.add_argument("--queue")
        target.add_argument("--key")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using is not None and using not in settings.DATABASES:
            raise CommandError(f"--database {using!r} is not an alias in DATABASES.")
        action = options["action"]
        try:
            if action == "pause":
                changed = controls.pause(*options["queues"], using=using)
                self.stdout.write(f"Paused {', '.join(options['queues'])} "
                                  f"({changed} were running).")
            elif action == "resume":
                changed = controls.resume(*options["queues"], using=using)
                self.stdout.write(f"Resumed {', '.join(options['queues'])} "
                                  f"({changed} were paused).")
            elif action == "status":
                self._status(options["queues"], using, as_json=options["json"])
            elif action == "rate-limit":
                controls.set_rate_limit(options["limit"], options["period"],
                                        queue=options["queue"], key=options["key"],
                                        using=using)
                what = f"queue {options['queue']}" if options["queue"] else \
                    f"key {options['key']}"
                self.stdout.write(f"Rate limit of {what}: {options['limit']} per "
                                  f"{options['period']:g}s.")
            else:
                had = controls.clear_rate_limit(queue=options["queue"], key=options["key"],
                                                using=using)
                what = f"queue {options['queue']}" if options["queue"] else \
                    f"key {options['key']}"
                self.stdout.write(f"Rate limit of {what} removed." if had
                                  else f"{what.capitalize()} had no rate limit.")
        except (PgTasksError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

    def _status(self, queues: list[str], using: str | None, as_json: bool) -> None:
        rows = controls.status(*queues, using=using)
        if as_json:
            data = [{
                "queue": r.queue, "paused": r.paused, "paused_at": r.paused_at,
                "rate_limit": r.rate_limit,
                "rate_period": r.rate_period.total_seconds() if r.rate_period else None,
                "rate_available": r.rate_available, "waiting": r.waiting, "running": r.running,
            } for r in rows]
            self.stdout.write(json.dumps(data, cls=DjangoJSONEncoder, indent=2))
            return
        headers = ["queue", "state", "rate limit", "starts left", "waiting", "running"]
        cells = [[r.queue, "paused" if r.paused else "running",
                  controls.describe_rate(r.rate_limit, r.rate_period),
                  "-" if r.rate_available is None else str(r.rate_available),
                  str(r.waiting), str(r.running)] for r in rows]
        widths = [max(len(row[i]) for row in [headers, *cells]) for i in range(len(headers))]
        for row in [headers, *cells]:
            padded = (c.ljust(w) if i < 3 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            self.stdout.write("  ".join(padded).rstrip())
        limits = controls.key_rate_limits(using=using)
        if limits:
            self.stdout.write("")
            self.stdout.write("key rate limits:")
            for key, (limit, period) in sorted(limits.items()):
                self.stdout.write(f"  {key}: {controls.describe_rate(limit, period)}")
