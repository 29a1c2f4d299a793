"""``manage.py demo``: a whole tour in one command.

1. Create the database if it does not exist, and migrate it.
2. Seed a week of orders for a few dozen customers, and queue their tasks: a confirmation
   email per order, a report rebuild per day, a review per order. A few customers write from
   ``@flaky.example`` (their first delivery attempt fails and is retried) and a few orders are
   withdrawn before they are confirmed (their confirmation fails for good).
3. Run a worker until every task has finished, then print what became of them.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, connection, connections, transaction
from django.db.models import Count
from django.utils import timezone
from psycopg import sql

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.models import Task
from django_pgtasks.worker import Worker
from shop.models import Customer, Order
from shop.tasks import (
    FLAKY_DOMAIN,
    rebuild_daily_report,
    review_order,
    send_order_confirmation,
)

DEFAULT_ORDERS = 150
DEFAULT_SEED = 1
#: Seconds between two looks at the queue while waiting for it to drain.
DRAIN_CHECK_INTERVAL = 0.2

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


class Command(BaseCommand):
    help = (
        "Create and migrate the database, seed orders with their tasks, and run a worker "
        "until every task has finished."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orders", type=int, default=DEFAULT_ORDERS, metavar="N",
            help=f"Orders to seed; each gets a confirmation task and (unless withdrawn) a "
                 f"review task, and each day they fall on a report rebuild "
                 f"(default: {DEFAULT_ORDERS}).",
        )
        parser.add_argument(
            "--concurrency", "-c", type=int, default=None,
            help=f"Worker threads (default: PGTASKS['CONCURRENCY'], "
                 f"{pgtasks_settings.CONCURRENCY}).",
        )
        parser.add_argument(
            "--forever", action="store_true",
            help="Keep the worker running after the queue is drained, until Ctrl-C "
                 "(default: stop once every task has finished).",
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
        verbosity = options["verbosity"]

        name = connection.settings_dict["NAME"]
        if ensure_database(connection.settings_dict):
            self.stdout.write(f"Created database {name!r}.")
        call_command("migrate", interactive=False, verbosity=verbosity)

        if not options["no_seed"]:
            started = time.monotonic()
            seeded = seed(options["orders"], random.Random(options["seed"]))
            self.stdout.write(
                f"Seeded {seeded.orders} orders for {seeded.customers} customers "
                f"({seeded.withdrawn} withdrawn) and queued {seeded.tasks} tasks "
                f"in {time.monotonic() - started:.2f}s."
            )

        worker = Worker(concurrency=options["concurrency"], burst=False)
        started = time.monotonic()
        code = worker.run() if options["forever"] else drain(worker)
        self.stdout.write(
            f"Worker ran {worker.processed} attempts in {time.monotonic() - started:.2f}s."
        )
        self.print_summary()
        if code:
            raise CommandError(f"The worker stopped with running tasks left (exit code {code}).")

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
        retried = Task.objects.filter(attempt__gt=1).values("name").annotate(count=Count("id"))
        for row in retried.order_by("name"):
            self.stdout.write(f"Retried: {row['count']} x {row['name']}")
        for task in Task.objects.failed().order_by("id")[:20]:
            reason = task.error_text.partition("\n")[0]
            self.stdout.write(f"Failed: task {task.pk} {task.name}: {reason}")


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
            [send_order_confirmation.build(order.pk) for order in orders]
            + [rebuild_daily_report.build(day.isoformat()) for day in days]
        )

    # Customers change their minds: these orders are gone before anyone confirms them. The
    # rebuilds queued above have not run yet, so the reports will not count them either.
    withdrawn = rng.sample(orders, min(len(orders), max(1, order_count // 25)))
    Order.objects.filter(pk__in=[order.pk for order in withdrawn]).delete()

    # The nightly review batch covers the orders that remain.
    withdrawn_ids = {order.pk for order in withdrawn}
    reviews = Task.objects.enqueue_many(
        review_order.build(order.pk) for order in orders if order.pk not in withdrawn_ids
    )
    return Seeded(
        customers=len(customers), orders=len(orders), withdrawn=len(withdrawn),
        tasks=len(tasks) + len(reviews),
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


def drain(worker: Worker) -> int:
    """Run ``worker`` until no task is waiting, awaiting a retry or running, then stop it.

    ``Worker(burst=True)`` stops as soon as nothing is *due*, which would leave behind the
    confirmations that wait a second for their retry. A watcher thread stops the worker
    instead, through ``Worker.stop()``, once the queue holds nothing that will ever run.
    """
    finished = threading.Event()

    def watch() -> None:
        try:
            while not finished.wait(DRAIN_CHECK_INTERVAL):
                try:
                    busy = (
                        Task.objects.pending() | Task.objects.held_by(worker.worker_id)
                    ).exists()
                except (DatabaseError, InterfaceError):
                    # The worker reports and rides out database errors; look again later.
                    connections.close_all()
                    continue
                if not busy:
                    worker.stop()
                    return
        finally:
            connections.close_all()  # this thread's connections only

    watcher = threading.Thread(target=watch, name="demo-drain-watcher", daemon=True)
    watcher.start()
    try:
        return worker.run()
    finally:
        finished.set()
        watcher.join()


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
            f"PGPASSWORD variables at one."
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
