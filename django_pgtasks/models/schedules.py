"""The state of each periodic schedule: its next planned run and how the last one went."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class Schedule(models.Model):
    """A periodic task's state: when its next run is planned and how the last one went.

    Rows are created from the schedules declared in code; ``next_run_at`` advances in the same
    transaction that enqueues the run, guarded on its previous value, so each planned run is
    enqueued exactly once however many workers race for it.
    """

    name = models.CharField(_("schedule"), max_length=255, unique=True)
    task_name = models.CharField(_("task name"), max_length=255)
    spec = models.CharField(_("when"), max_length=255, help_text=_("Period or cron expression."))
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    next_run_at = models.DateTimeField(_("next run"), null=True, blank=True)
    last_run_at = models.DateTimeField(_("last planned run"), null=True, blank=True)
    last_task_id = models.BigIntegerField(_("last task"), null=True, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    created_at = models.DateTimeField(_("created"), db_default=Now())
    updated_at = models.DateTimeField(_("updated"), db_default=Now())

    class Meta:
        db_table = "pgtasks_schedule"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")

    def __str__(self) -> str:
        return self.name
