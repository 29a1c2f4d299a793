"""The state of each periodic schedule: its next planned run and how the last one went."""

from __future__ import annotations

from django.db import models
from django.db.models import Value
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class Schedule(models.Model):
    """A periodic task: what it runs, when its next run is planned and how the last one went.

    A row comes from a schedule declared in code (``source = "code"``: written by the
    workers, read-only elsewhere) or was made in the admin (``source = "database"``: its task,
    arguments, queue, priority, spec and time zone live here, and the workers pick up a change
    at their next scheduler pass). ``next_run_at`` advances in the same transaction that
    enqueues the run, guarded on its previous value, so each planned run is enqueued exactly
    once however many workers race for it.
    """

    class Source(models.TextChoices):
        CODE = "code", _("declared in code")
        DATABASE = "database", _("made in the admin")

    name = models.CharField(_("schedule"), max_length=255, unique=True)
    task_name = models.CharField(_("task name"), max_length=255)
    spec = models.CharField(_("when"), max_length=255, help_text=_("Period or cron expression."))
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    next_run_at = models.DateTimeField(_("next run"), null=True, blank=True)
    last_run_at = models.DateTimeField(_("last planned run"), null=True, blank=True)
    last_task_id = models.BigIntegerField(_("last task"), null=True, blank=True)
    enabled = models.BooleanField(_("enabled"), default=True)
    source = models.CharField(_("source"), max_length=16, choices=Source.choices,
                              default=Source.CODE, db_default=Source.CODE)
    args = models.JSONField(_("positional arguments"), default=list, blank=True,
                            db_default=Value([], models.JSONField()))
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True,
                              db_default=Value({}, models.JSONField()))
    queue = models.CharField(_("queue"), max_length=100, null=True, blank=True,
                             help_text=_("Empty: the task's own queue."))
    priority = models.SmallIntegerField(_("priority"), null=True, blank=True,
                                        help_text=_("Empty: the task's own priority."))
    created_at = models.DateTimeField(_("created"), db_default=Now())
    updated_at = models.DateTimeField(_("updated"), db_default=Now())

    class Meta:
        db_table = "pgtasks_schedule"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")

    def __str__(self) -> str:
        return self.name
