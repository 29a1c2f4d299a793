"""Queue controls kept in the database: one row per paused or rate-limited queue, one per
rate-limited concurrency key. The claim reads them; :mod:`django_pgtasks.patterns.controls`
changes them."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgtasks.models.fields import TimestampArrayField

#: Largest rate limit (starts per period). The claim keeps the time of the last ``limit``
#: starts in the limit's row, so the row grows with the limit.
MAX_RATE_LIMIT = 10_000


class QueueControl(models.Model):
    """The run-time state of one queue: paused or not, and its rate limit."""

    queue = models.CharField(_("queue"), max_length=100, primary_key=True)
    paused = models.BooleanField(
        _("paused"), default=False, db_default=False,
        help_text=_("Workers start no task of a paused queue; running tasks finish."),
    )
    paused_at = models.DateTimeField(_("paused since"), null=True, blank=True)
    rate_limit = models.PositiveIntegerField(
        _("rate limit"), null=True, blank=True,
        help_text=_("At most this many tasks of the queue start per rate period."),
    )
    rate_period = models.DurationField(_("rate period"), null=True, blank=True)
    rate_starts = TimestampArrayField(
        _("recent starts"), default=list, blank=True, editable=False,
        help_text=_("Start times of the latest tasks, kept by the claim for the rate limit."),
    )
    updated_at = models.DateTimeField(_("updated"), db_default=Now())

    class Meta:
        db_table = "pgtasks_queue"
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering = ["queue"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(rate_limit__isnull=True, rate_period__isnull=True)
                           | Q(rate_limit__gte=1, rate_limit__lte=MAX_RATE_LIMIT,
                               rate_period__gt=timedelta(0))),
                name="pgtasks_queue_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.queue


class KeyRateLimit(models.Model):
    """A rate limit on the tasks of one concurrency key (``Task.concurrency_key``)."""

    key = models.CharField(_("concurrency key"), max_length=255, primary_key=True)
    rate_limit = models.PositiveIntegerField(
        _("rate limit"), help_text=_("At most this many tasks of the key start per period."),
    )
    rate_period = models.DurationField(_("rate period"))
    rate_starts = TimestampArrayField(
        _("recent starts"), default=list, blank=True, editable=False,
        help_text=_("Start times of the latest tasks, kept by the claim for the rate limit."),
    )
    updated_at = models.DateTimeField(_("updated"), db_default=Now())

    class Meta:
        db_table = "pgtasks_key_rate"
        verbose_name = _("key rate limit")
        verbose_name_plural = _("key rate limits")
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_limit__gte=1, rate_limit__lte=MAX_RATE_LIMIT,
                            rate_period__gt=timedelta(0)),
                name="pgtasks_key_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.key
