"""Background work of the shop, one queue per kind of work.

- ``emails``: order confirmations. They talk to a mail server, so they run *at least once*:
  the handler's writes commit on their own, and an attempt that fails is retried.
- ``reports``: daily report rebuilds. They only write to this database, so they run *exactly
  once* (``atomic=True``): the report and the task's completion commit together. They form a
  workflow (``django_pgtasks.workflows.group``): once every rebuild of a batch has ended,
  ``summarize_reports`` runs once, with each rebuild's outcome.
- ``default``: order reviews, whose verdict is kept as the task's result, and the fulfilment
  pipeline (pick, pack, ship), one stage after the other.

Two more show the other ways in:

- ``refresh_todays_report`` runs every minute on its own (a periodic task: ``schedule=``);
- ``send_loyalty_coupon`` is written with Django's own ``@task`` API (``django.tasks``, or the
  ``django-tasks`` backport on Django 5.2) and runs on the same workers through
  ``django_pgtasks.backend.PgTasksBackend`` (see ``TASKS`` in the settings).

Handlers receive plain JSON arguments (ids, ISO dates) and load what they need, so a task
always sees the current state of the database rather than a copy taken at enqueue time.
"""

from __future__ import annotations

import logging
import time
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from django_pgtasks import FatalError, TaskContext, pgtask
from django_pgtasks.retry import exponential
from django_pgtasks.scheduling import every

from .models import Customer, Notification, Order, Report

logger = logging.getLogger(__name__)

#: Mail for this domain goes through a relay that drops the first connection of each message.
FLAKY_DOMAIN = "@flaky.example"
#: Seconds the simulated mail server takes to accept a message.
MAIL_LATENCY = 0.01
#: Orders at or above this total are flagged for review.
LARGE_ORDER_TOTAL = Decimal("500.00")
#: More orders than this by one customer within a day are flagged for review.
ORDERS_PER_DAY_LIMIT = 3


class MailServer:
    """Stands in for an SMTP connection; "sending" records a Notification row."""

    def send(self, customer: Customer, subject: str, body: str, *, attempt: int) -> Notification:
        time.sleep(MAIL_LATENCY)
        if customer.email.endswith(FLAKY_DOMAIN) and attempt == 1:
            # The error a real SMTP client raises when the relay hangs up: worth a retry.
            raise ConnectionError(f"Mail relay for {customer.email} closed the connection.")
        return Notification.objects.create(customer=customer, subject=subject, body=body)


def confirmation_subject(order_id: int) -> str:
    return f"Your order #{order_id} is confirmed"


# Retries start after about a second and double up to five minutes: a relay that hiccups is
# back almost at once, one that is down is not hammered.
@pgtask(queue="emails", max_attempts=5, backoff=exponential(base=1.0, maximum=300.0),
        context=True)
def send_order_confirmation(ctx: TaskContext, order_id: int) -> dict[str, Any]:
    """Email the customer that their order was received.

    The notification is recorded only once the mail server accepted the message, so an
    attempt that fails to connect leaves nothing behind and the retry sends exactly one.
    """
    try:
        order = Order.objects.select_related("customer").get(pk=order_id)
    except Order.DoesNotExist:
        # Retrying cannot bring the order back (it was withdrawn): fail now, once.
        raise FatalError(f"Order {order_id} no longer exists; nothing to confirm.") from None
    customer = order.customer
    body = (
        f"Hello {customer.name},\n\n"
        f"we received your order #{order.pk} of {order.total} EUR "
        f"placed on {timezone.localtime(order.created):%Y-%m-%d at %H:%M}.\n\n"
        f"Thank you for shopping with us."
    )
    notification = MailServer().send(
        customer, confirmation_subject(order.pk), body, attempt=ctx.attempt
    )
    return {"notification_id": notification.pk}


# ValueError is fatal: a malformed day stays malformed however often it is retried.
@pgtask(queue="reports", atomic=True, fatal=(ValueError,))
def rebuild_daily_report(day: str) -> dict[str, Any]:
    """Recompute the report of ``day`` (an ISO date such as ``"2025-03-01"``)."""
    report_day = date.fromisoformat(day)
    # Rebuilds of the same day may run side by side. Create the row if needed, then lock it:
    # the rebuilds of one day take turns, and each aggregate runs after the previous rebuild
    # committed (a fresh snapshot under READ COMMITTED), so a stale total can never be the
    # last one written.
    Report.objects.bulk_create([Report(day=report_day)], ignore_conflicts=True)
    report = Report.objects.select_for_update().get(day=report_day)
    start = timezone.make_aware(datetime.combine(report_day, datetime.min.time()))
    totals = Order.objects.filter(
        created__gte=start, created__lt=start + timedelta(days=1)
    ).aggregate(order_count=Count("id"), revenue=Sum("total", default=Decimal("0")))
    report.order_count = totals["order_count"]
    report.revenue = totals["revenue"]
    report.save(update_fields=["order_count", "revenue", "rebuilt_at"])
    return {"day": day, "order_count": report.order_count, "revenue": str(report.revenue)}


@pgtask(queue="reports", context=True)
def summarize_reports(ctx: TaskContext) -> dict[str, Any]:
    """The callback of a batch of rebuilds: runs once, when every rebuild has ended, and
    sums up what they found (``ctx.parents()``: each rebuild's status and result)."""
    outcomes = ctx.parents()
    rebuilt = [o.result for o in outcomes if o.succeeded]
    return {
        "days": len(rebuilt),
        "failed": len(outcomes) - len(rebuilt),
        "orders": sum(r["order_count"] for r in rebuilt),
        "revenue": str(sum((Decimal(r["revenue"]) for r in rebuilt), Decimal("0"))),
    }


# Periodic: every worker runs the scheduler, and each planned run is enqueued exactly once
# however many workers there are. The first run is enqueued as soon as a worker starts.
@pgtask(queue="reports", atomic=True, schedule=every(minutes=1))
def refresh_todays_report() -> dict[str, Any]:
    """Keep today's report current between the rebuilds that orders trigger."""
    # A handler is a plain function too: this runs the rebuild in this task's transaction.
    return rebuild_daily_report(timezone.localdate().isoformat())


@pgtask
def review_order(order_id: int) -> dict[str, Any]:
    """Screen an order for manual review; the verdict is stored as the task's result."""
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        raise FatalError(f"Order {order_id} no longer exists; nothing to review.")
    reasons = []
    if order.total >= LARGE_ORDER_TOTAL:
        reasons.append(f"total {order.total} is at least {LARGE_ORDER_TOTAL}")
    same_day = Order.objects.filter(
        customer_id=order.customer_id,
        created__gt=order.created - timedelta(days=1),
        created__lte=order.created,
    ).count()
    if same_day > ORDERS_PER_DAY_LIMIT:
        reasons.append(f"{same_day} orders by the same customer within a day")
    if reasons:
        logger.info("Order %s flagged for review: %s.", order.pk, "; ".join(reasons))
    return {"order_id": order.pk, "flagged": bool(reasons), "reasons": reasons}


# Fulfilment, a three-stage pipeline: pick -> pack -> ship. Each stage runs exactly once
# (atomic=True: its writes, its completion and the enqueue of the next stage commit
# together), so a worker dying between stages neither skips nor repeats one.
@pgtask(atomic=True, context=True, max_attempts=5)
def pick_order(ctx: TaskContext, order_id: int) -> dict[str, Any]:
    """Stage 1: reserve the goods of an order, then hand it to packing."""
    if not Order.objects.filter(pk=order_id).exists():
        raise FatalError(f"Order {order_id} no longer exists; nothing to pick.")
    ctx.then(pack_order, order_id, stage="pack")
    return {"order_id": order_id, "picked": True}


@pgtask(atomic=True, context=True, max_attempts=5)
def pack_order(ctx: TaskContext, order_id: int) -> dict[str, Any]:
    """Stage 2: pack the parcel, then hand it to shipping."""
    ctx.then(ship_order, order_id, stage="ship")
    return {"order_id": order_id, "parcels": 1}


@pgtask(atomic=True, max_attempts=5)
def ship_order(order_id: int) -> dict[str, Any]:
    """Stage 3: hand the parcel to the carrier and tell the customer, once."""
    order = Order.objects.select_related("customer").get(pk=order_id)
    Notification.objects.create(
        customer=order.customer, subject=f"Your order #{order.pk} has shipped",
        body=f"Hello {order.customer.name},\n\nyour order #{order.pk} is on its way.",
    )
    return {"order_id": order_id, "shipped": True}


# Django's Tasks framework: the same queue, workers and admin as the handlers above.
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task(queue_name="emails", priority=-10)
def send_loyalty_coupon(customer_id: int, percent: int) -> str:
    """Thank a returning customer with a coupon (Django's ``@task`` API)."""
    customer = Customer.objects.get(pk=customer_id)
    code = f"THANKS{percent}-{customer.pk:05d}"
    Notification.objects.create(
        customer=customer, subject=f"A {percent}% coupon for you",
        body=f"Hello {customer.name},\n\nthank you for your orders: use {code} next time.",
    )
    return code
