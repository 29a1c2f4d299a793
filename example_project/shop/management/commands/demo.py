"""``manage.py demo``: the whole tour in one command.

1. Create the database if it does not exist, and migrate it. Without a PostgreSQL server
   (and without ``DATABASE_URL``), the settings start an embedded one first
   (``django_pgtasks_dev``).
2. Create the demo login of the admin (``demo`` / ``demo``).
3. Seed a week of orders for a few dozen customers and queue their tasks: a confirmation
   email per order, a report rebuild per day, a review per order, the fulfilment pipeline
   (pick, pack, ship) for every third order, and a loyalty coupon for returning customers
   (written with Django's ``@task``). A few customers write from ``@flaky.example`` (their
   first delivery attempt fails and is retried) and a few orders are withdrawn before they
   are confirmed (their confirmation fails for good). A periodic task refreshes today's
   report every minute.
4. Serve the site and the admin, run a worker, and show its progress on one live line.
5. Once every task has finished, print what became of them. Then keep serving and working
   (orders placed in the browser are processed at once) until Ctrl-C, or exit at once with
   ``--exit-when-done``.
"""

from __future__ import annotations

import errno
import logging
import random
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any, TextIO

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.servers.basehttp import (
    ThreadedWSGIServer,
    WSGIRequestHandler,
    get_internal_wsgi_application,
)
from django.db import DatabaseError, InterfaceError, connection, connections, transaction
from django.db.models import Count, Max
from django.utils import timezone
from psycopg import sql

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.models import Schedule, Status, Task
from django_pgtasks.worker.loop import Worker
from django_pgtasks.workflows import group
from django_pgtasks_dev import is_embedded
from shop.models import Customer, Order
from shop.tasks import (
    FLAKY_DOMAIN,
    pick_order,
    rebuild_daily_report,
    review_order,
    send_loyalty_coupon,
    send_order_confirmation,
    summarize_reports,
)

DEFAULT_ORDERS = 150
DEFAULT_SEED = 1
DEFAULT_ADDRPORT = "127.0.0.1:8000"
#: Other ports tried, one after the other, when the requested one is taken.
PORT_ATTEMPTS = 20
#: The admin login the demo creates (and resets) for a local tour. Never deploy it.
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "demo"
#: Every third order goes through the fulfilment pipeline.
PIPELINE_EVERY = 3
#: Customers with at least this many orders get a loyalty coupon.
COUPON_MIN_ORDERS = 4
#: Seconds between two looks at the queue while it drains (live line on a terminal).
DRAIN_CHECK_INTERVAL = 0.2
#: Seconds between two progress lines when the output is not a terminal.
LOG_PROGRESS_INTERVAL = 2.0
#: Width of the progress bar, in characters.
BAR_WIDTH = 12

FIRST_NAMES = ["Ada", "Alan", "Barbara", "Cecilia", "Donald", "Edsger", "Frances", "Grace",
               "Hedy", "John", "Katherine", "Leslie", "Margaret", "Niklaus", "Radia", "Tim"]
LAST_NAMES = ["Lovelace", "Turing", "Liskov", "Shannon", "Knuth", "Dijkstra", "Allen",
              "Hopper", "Lamarr", "Backus", "Johnson", "Lamport", "Hamilton", "Wirth",
              "Perlman", "Berners-Lee"]
DOMAINS = ["example.com", "example.org", "example.net"]

#: Options Django uses itself; everything else in OPTIONS is a libpq connection parameter.
DJANGO_ONLY_OPTIONS = {"pool", "server_side_binding", "isolation_level", "assume_role"}


@dataclass
class Seeded:
    customers: int
    orders: int
    withdrawn: int
    tasks: int
    pipelines: int
    coupons: int


@dataclass
class Progress:
    """Task counts of the whole table, as the live line shows them."""

    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s, 0) for s in (Status.SUCCESSFUL, Status.FAILED,
                                                   Status.CANCELLED))

    def line(self, elapsed: float) -> str:
        total, finished = self.total, self.finished
        filled = BAR_WIDTH * finished // total if total else BAR_WIDTH
        c = self.counts
        return (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {finished}/{total} done, "
            f"{c.get(Status.FAILED, 0)} failed; {c.get(Status.RUNNING, 0)} running, "
            f"{c.get(Status.READY, 0)} ready, {c.get(Status.AWAITING_RETRY, 0)} retrying; "
            f"{elapsed:.1f}s"
        )


class Command(BaseCommand):
    help = (
        "Create and migrate the database, seed orders with their tasks, then serve the site "
        "and the admin while a worker runs the tasks, with a live progress line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders", type=int, default=DEFAULT_ORDERS, metavar="N",
            help=f"Orders to seed; each gets a confirmation task and (unless withdrawn) a "
                 f"review task, every third one the three-stage fulfilment pipeline, and each "
                 f"day they fall on a report rebuild (default: {DEFAULT_ORDERS}).",
        )
        parser.add_argument(
            "--concurrency", "-c", type=int, default=None,
            help=f"Worker threads (default: PGTASKS['CONCURRENCY'], "
                 f"{pgtasks_settings.CONCURRENCY}).",
        )
        parser.add_argument(
            "--exit-when-done", action="store_true",
            help="Stop the worker and the web server and exit once every task has finished "
                 "(default: keep both running until Ctrl-C).",
        )
        parser.add_argument(
            "--no-web", action="store_true",
            help="Do not serve the site and the admin; only run the worker.",
        )
        parser.add_argument(
            "--addrport", default=DEFAULT_ADDRPORT, metavar="IP:PORT",
            help=f"Where the site and the admin are served; when the port is taken, the "
                 f"next free one is used (default: {DEFAULT_ADDRPORT}).",
        )
        parser.add_argument(
            "--no-seed", action="store_true",
            help="Seed nothing; only run the tasks already queued, e.g. orders placed in the "
                 "browser (default: seed).",
        )
        parser.add_argument(
            "--seed", type=int, default=DEFAULT_SEED,
            help=f"Random seed of the generated orders (default: {DEFAULT_SEED}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["orders"] < 0:
            raise CommandError("--orders must not be negative.")
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        host, _, port = options["addrport"].rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--addrport must look like 127.0.0.1:8000, not "
                               f"{options['addrport']!r}.")
        verbosity = options["verbosity"]
        self.started = time.monotonic()

        name = connection.settings_dict["NAME"]
        self.stdout.write(f"Database: {name!r} on {describe_server(connection.settings_dict)}.")
        if ensure_database(connection.settings_dict):
            self.stdout.write(f"Created database {name!r}.")
        call_command("migrate", interactive=False, verbosity=max(verbosity - 1, 0))
        self.stdout.write("Migrated.")
        ensure_demo_user()

        # Progress counts the tasks of this run: those seeded now, and those that follow.
        since_id = Task.objects.aggregate(last=Max("id"))["last"] or 0
        if not options["no_seed"]:
            started = time.monotonic()
            seeded = seed(options["orders"], random.Random(options["seed"]))
            self.stdout.write(
                f"Seeded {seeded.orders} orders for {seeded.customers} customers "
                f"({seeded.withdrawn} withdrawn) and queued {seeded.tasks} tasks "
                f"({seeded.pipelines} fulfilment pipelines, {seeded.coupons} loyalty coupons) "
                f"in {time.monotonic() - started:.2f}s."
            )

        server = None
        if not options["no_web"]:
            server = start_web_server(host, int(port))
            url = f"http://{host}:{server.server_port}"
            self.stdout.write(
                f"Shop:  {url}/\n"
                f"Admin: {url}/admin/  (login: {DEMO_USERNAME} / password: {DEMO_PASSWORD})\n"
                f"Tasks: {url}/admin/django_pgtasks/task/"
            )

        if verbosity < 2:
            # After the web server: its WSGI handler sets up Django, logging included, again.
            quiet_logs()
        worker = Worker(concurrency=options["concurrency"], burst=False)
        self.stdout.write(
            f"Worker: {worker.concurrency} threads on queues {', '.join(worker.queues)}; "
            + ("it stops once every task has finished." if options["exit_when_done"]
               else "Ctrl-C stops the demo.")
        )
        self.stdout.flush()
        started = time.monotonic()
        self.keep_running = not options["exit_when_done"]
        self.site_url = None if server is None else f"http://{host}:{server.server_port}/"
        reporter = ProgressReporter(self.stdout, self.started, on_drained=self.drained)
        try:
            code = run_until_drained(worker, reporter, since_id=since_id,
                                     exit_when_done=options["exit_when_done"])
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
        self.stdout.write(
            f"Worker ran {worker.processed} attempts in {time.monotonic() - started:.2f}s."
        )
        self.print_summary()
        if code:
            raise CommandError(f"The worker stopped with running tasks left (exit code {code}).")

    def drained(self, first_finished: float | None) -> None:
        """Called once, when the seeded tasks have all finished."""
        if first_finished is not None:
            self.stdout.write(
                f"First task finished {first_finished - self.started:.2f}s after the demo "
                f"started."
            )
        self.stdout.write(
            f"Every task has finished, {time.monotonic() - self.started:.1f}s after the "
            f"demo started."
        )
        if self.keep_running:
            where = f"place orders at {self.site_url} and " if self.site_url else ""
            self.stdout.write(
                f"The worker keeps running: {where}watch their tasks in the admin. "
                f"Ctrl-C stops the demo."
            )
        self.stdout.flush()

    def print_summary(self) -> None:
        rows = list(
            Task.objects.values("queue", "status").annotate(count=Count("id"))
            .order_by("queue", "status")
        )
        by_status: dict[str, int] = {}
        for row in rows:
            by_status[row["status"]] = by_status.get(row["status"], 0) + row["count"]
        self.stdout.write(f"Tasks by status ({sum(by_status.values())} in the table):")
        for status, count in sorted(by_status.items()):
            self.stdout.write(f"  {status:<16}{count:>6}")
        self.stdout.write("Tasks by queue:")
        for row in rows:
            self.stdout.write(f"  {row['queue']:<10}{row['status']:<16}{row['count']:>6}")
        self.stdout.write("Tasks by name:")
        names = Task.objects.values("name").annotate(count=Count("id")).order_by("name")
        for row in names:
            self.stdout.write(f"  {row['name']:<42}{row['count']:>6}")
        retried = Task.objects.filter(attempt__gt=1).values("name").annotate(count=Count("id"))
        for row in retried.order_by("name"):
            self.stdout.write(f"Retried: {row['count']} x {row['name']}")
        for schedule in Schedule.objects.order_by("name"):
            self.stdout.write(
                f"Periodic: {schedule.name} ({schedule.spec}), next run "
                f"{timezone.localtime(schedule.next_run_at):%H:%M:%S}"
                if schedule.next_run_at else f"Periodic: {schedule.name} ({schedule.spec})"
            )
        for task in Task.objects.failed().order_by("id")[:10]:
            reason = task.error_text.partition("\n")[0]
            self.stdout.write(f"Failed: task {task.pk} {task.name}: {reason}")


class ProgressReporter:
    """Shows the live progress line: redrawn in place on a terminal; elsewhere (a log file,
    CI) printed every few seconds when something changed."""

    def __init__(self, out: Any, started: float,
                 on_drained: Callable[[float | None], None]) -> None:
        self.stream: TextIO = getattr(out, "_out", sys.stdout)
        self.tty = self.stream.isatty()
        self.started = started
        self.on_drained = on_drained
        self.first_finished: float | None = None
        self.drained = False
        self._last: Progress | None = None
        self._logged: Progress | None = None
        self._logged_at = 0.0
        self._open = False  # a live line is on the terminal, without its newline yet

    def show(self, progress: Progress) -> None:
        now = time.monotonic()
        if self.first_finished is None and progress.finished:
            self.first_finished = now
        self._last = progress
        if self.tty:
            # Redrawn in place: never wider than the terminal, or it would wrap.
            width = shutil.get_terminal_size().columns - 1
            self.stream.write(f"\r\033[K{progress.line(now - self.started)[:width]}")
            self.stream.flush()
            self._open = True
        elif now - self._logged_at >= LOG_PROGRESS_INTERVAL:
            self._log(progress, now)

    def _log(self, progress: Progress, now: float) -> None:
        if self._logged is None or progress.counts != self._logged.counts:
            self.stream.write(progress.line(now - self.started) + "\n")
            self.stream.flush()
            self._logged, self._logged_at = progress, now

    def end_line(self) -> None:
        """Finish the live line, so that other output starts on a line of its own."""
        if self.tty:
            if self._open:
                self.stream.write("\n")
                self.stream.flush()
                self._open = False
        elif self._last is not None:
            self._log(self._last, time.monotonic())

    def mark_drained(self) -> None:
        self.end_line()
        self.drained = True
        self.on_drained(self.first_finished)


def run_until_drained(worker: Worker, reporter: ProgressReporter, *, since_id: int,
                      exit_when_done: bool) -> int:
    """Run ``worker`` in this thread while another one reports progress.

    The queue is drained once no task is waiting, awaiting a retry or running, and every
    schedule has produced its first run. ``Worker(burst=True)`` would stop as soon as nothing
    is *due*, leaving behind the confirmations that wait a second for their retry; the
    watcher stops the worker through ``Worker.stop()`` instead, when ``exit_when_done``.
    """
    finished = threading.Event()

    def watch() -> None:
        try:
            while not finished.wait(DRAIN_CHECK_INTERVAL):
                try:
                    progress = current_progress(since_id)
                    busy = progress.total != progress.finished or Schedule.objects.filter(
                        enabled=True, last_task_id__isnull=True
                    ).exists()
                except (DatabaseError, InterfaceError):
                    # The worker reports and rides out database errors; look again later.
                    connections.close_all()
                    continue
                reporter.show(progress)
                if not busy and not reporter.drained:
                    reporter.mark_drained()
                    if exit_when_done:
                        worker.stop()
                        return
        finally:
            connections.close_all()  # this thread's connections only

    watcher = threading.Thread(target=watch, name="demo-progress", daemon=True)
    watcher.start()
    try:
        return worker.run()
    finally:
        finished.set()
        watcher.join()
        reporter.end_line()


def current_progress(since_id: int) -> Progress:
    """Counts of the tasks created after ``since_id`` (those of this run of the demo)."""
    rows = (Task.objects.filter(id__gt=since_id).values_list("status")
            .annotate(count=Count("id")).order_by())
    return Progress(counts=dict(rows))


def quiet_logs() -> None:
    """Keep the terminal for the progress line: one log line per task would drown it.

    ``-v 2`` shows them all again.
    """
    for name in ("django_pgtasks", "shop", "django.server"):
        logging.getLogger(name).setLevel(logging.WARNING)


def describe_server(settings_dict: dict[str, Any]) -> str:
    if is_embedded(settings_dict):
        return f"the embedded development server (socket in {settings_dict['HOST']})"
    host = settings_dict.get("HOST") or "localhost"
    return f"the server at {host}:{settings_dict.get('PORT') or 5432}"


def ensure_demo_user() -> None:
    """Create the demo superuser, or give it back its demo password."""
    user, _ = get_user_model().objects.get_or_create(
        username=DEMO_USERNAME,
        defaults={"email": "demo@example.com", "is_staff": True, "is_superuser": True},
    )
    user.set_password(DEMO_PASSWORD)
    user.save(update_fields=["password"])


def start_web_server(host: str, port: int) -> ThreadedWSGIServer:
    """Serve the project (and, as ``runserver`` does with DEBUG, its static files) in a
    background thread, on ``port`` or the next free one."""
    application = get_internal_wsgi_application()
    if settings.DEBUG:
        application = StaticFilesHandler(application)
    for candidate in range(port, port + PORT_ATTEMPTS):
        try:
            server = ThreadedWSGIServer((host, candidate), WSGIRequestHandler)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or port == 0:
                raise CommandError(f"Cannot serve on {host}:{candidate}: {exc}") from None
    else:
        raise CommandError(f"Ports {port} to {port + PORT_ATTEMPTS - 1} are all taken; "
                           f"choose another with --addrport.")
    server.set_app(application)
    threading.Thread(target=server.serve_forever, name="demo-web", daemon=True).start()
    return server


def seed(order_count: int, rng: random.Random) -> Seeded:
    """Create customers and orders and queue their tasks; return what was created."""
    customers = ensure_customers(min(max(order_count // 4, 3), 40))
    now = timezone.now()
    with transaction.atomic():
        orders = Order.objects.bulk_create(
            Order(
                # Round-robin, so every customer (and so every flaky address) gets orders.
                customer=customers[i % len(customers)],
                total=Decimal(rng.randint(500, 60_000)) / 100,
                created=now - timedelta(seconds=rng.randrange(7 * 24 * 3600)),
            )
            for i in range(order_count)
        )
        days = sorted({timezone.localdate(order.created) for order in orders})
        # Built and inserted in one statement, in the orders' transaction: no worker sees a
        # task before its order exists, and a failed import leaves neither behind.
        tasks = Task.objects.enqueue_many(
            send_order_confirmation.build(order.pk) for order in orders)
        # A workflow: the rebuilds run in parallel, and once all have ended the summary runs
        # once, with their outcomes (docs/howto/workflows.md).
        reports = group([rebuild_daily_report.build(day.isoformat()) for day in days],
                        then=summarize_reports.build()).enqueue()

    # Customers change their minds: these orders are gone before anyone confirms them. The
    # rebuilds queued above have not run yet, so the reports will not count them either.
    withdrawn = rng.sample(orders, min(len(orders), max(1, order_count // 25)))
    Order.objects.filter(pk__in=[order.pk for order in withdrawn]).delete()

    # The nightly review batch covers the orders that remain, and every third one goes to
    # the warehouse: a pipeline whose first stage enqueues the next when it succeeds.
    withdrawn_ids = {order.pk for order in withdrawn}
    remaining = [order for order in orders if order.pk not in withdrawn_ids]
    reviews = Task.objects.enqueue_many(review_order.build(order.pk) for order in remaining)
    pipelines = Task.objects.enqueue_many(
        pick_order.build(order.pk, stage="pick") for order in remaining[::PIPELINE_EVERY]
    )

    # Returning customers get a coupon, through Django's own task API this time.
    per_customer = Counter(order.customer_id for order in remaining)
    coupons = 0
    for customer_id, count in sorted(per_customer.items()):
        if count >= COUPON_MIN_ORDERS:
            send_loyalty_coupon.enqueue(customer_id, 5 if count < 2 * COUPON_MIN_ORDERS else 10)
            coupons += 1
    return Seeded(
        customers=len(customers), orders=len(orders), withdrawn=len(withdrawn),
        tasks=len(tasks) + len(reports.tasks) + len(reviews) + len(pipelines) + coupons,
        pipelines=len(pipelines), coupons=coupons,
    )


def ensure_customers(count: int) -> list[Customer]:
    """The first ``count`` demo customers, created if missing (reruns reuse them)."""
    wanted = []
    for i in range(count):
        first = FIRST_NAMES[i % len(FIRST_NAMES)]
        last = LAST_NAMES[(i * 7 + i // len(FIRST_NAMES)) % len(LAST_NAMES)]
        # Every sixth customer's mail goes through the flaky relay.
        domain = FLAKY_DOMAIN.lstrip("@") if i % 6 == 0 else DOMAINS[i % len(DOMAINS)]
        email = f"{first}.{last}.{i}@{domain}".lower()
        wanted.append(Customer(name=f"{first} {last}", email=email))
    Customer.objects.bulk_create(wanted, ignore_conflicts=True)
    by_email = Customer.objects.in_bulk([c.email for c in wanted], field_name="email")
    return [by_email[c.email] for c in wanted]


def libpq_params(settings_dict: dict[str, Any], dbname: str) -> dict[str, Any]:
    """Connection parameters of a Django database entry, for ``psycopg.connect``."""
    params = {
        key: value for key, value in settings_dict.get("OPTIONS", {}).items()
        if key not in DJANGO_ONLY_OPTIONS
    }
    params["dbname"] = dbname
    for key, setting in [("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"),
                         ("port", "PORT")]:
        if settings_dict.get(setting):
            params[key] = str(settings_dict[setting])
    # Fail in seconds, not minutes, when the host does not answer at all.
    params.setdefault("connect_timeout", 5)
    return params


def ensure_database(settings_dict: dict[str, Any]) -> bool:
    """Create the database of ``settings_dict`` unless it exists; ``True`` if it was created.

    The database is created from PostgreSQL's ``postgres`` maintenance database, with the
    same connection parameters.
    """
    name = settings_dict["NAME"]
    try:
        psycopg.connect(**libpq_params(settings_dict, name)).close()
        return False
    except psycopg.OperationalError as exc:
        target_error = exc
    try:
        maintenance = psycopg.connect(**libpq_params(settings_dict, "postgres"), autocommit=True)
    except psycopg.OperationalError:
        server = f"{settings_dict.get('HOST') or 'localhost'}:{settings_dict.get('PORT') or 5432}"
        raise CommandError(
            f"Cannot connect to the PostgreSQL server at {server}: {target_error}\n"
            f"Start a server there, or point DATABASE_URL "
            f"(postgres://USER:PASSWORD@HOST:PORT/{name}) or the PGHOST, PGPORT, PGUSER and "
            f"PGPASSWORD variables at one, or unset DATABASE_URL, PGHOST and PGPORT to use "
            f"the embedded development server."
        ) from None
    with maintenance:
        if maintenance.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone():
            raise CommandError(f"Database {name!r} exists but cannot be opened: {target_error}")
        try:
            maintenance.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # another process created it a moment ago
    return True
