"""The task table and the archive of finished tasks: columns, indexes, constraints."""

from __future__ import annotations

import functools
from typing import Any

from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgtasks.definition.options import PRIORITY_MAX, PRIORITY_MIN
from django_pgtasks.definition.status import CLAIM_ORDER, FINISHED, LIVE, PENDING, Status
from django_pgtasks.models.manager import TaskManager
from django_pgtasks.models.queries import CancelResult, ended_now


class TaskFields(models.Model):
    """The columns of a task, shared by the task table and its archive."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("task name"), max_length=255, help_text=_("Registered handler."))
    queue = models.CharField(_("queue"), max_length=100, default="default")
    args = models.JSONField(_("positional arguments"), default=list, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True)
    priority = models.SmallIntegerField(
        _("priority"), default=100, help_text=_("0 to 200; higher runs first; default 100.")
    )
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.READY
    )
    attempt = models.PositiveIntegerField(_("attempts started"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=3)
    run_after = models.DateTimeField(
        _("run after"), db_default=Now(), help_text=_("Not claimed before this time.")
    )
    locked_by = models.CharField(
        _("worker"), max_length=255, null=True, blank=True,
        help_text=_("Worker that holds (or last held) the task."),
    )
    locked_at = models.DateTimeField(_("lease taken"), null=True, blank=True)
    started_at = models.DateTimeField(_("attempt started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("attempt finished"), null=True, blank=True)
    error_text = models.TextField(_("error"), blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True)
    worker_ids = models.JSONField(
        _("workers per attempt"), default=list, db_default=Value([], models.JSONField()),
        blank=True,
        help_text=_("Id of the worker that ran each attempt, in order."),
    )
    errors = models.JSONField(
        _("errors per attempt"), default=list, db_default=Value([], models.JSONField()),
        blank=True,
        help_text=_("The last failed attempts: attempt number, bounded error text, time."),
    )
    steps = models.JSONField(
        _("completed steps"), default=list, db_default=Value([], models.JSONField()),
        blank=True,
        help_text=_("The steps of the task that completed (context.step()), in order: name, "
                    "result, attempt, time, duration. Kept across attempts: a step that "
                    "completed is not run again."),
    )
    progress = models.JSONField(
        _("progress"), null=True, blank=True, default=None,
        help_text=_("The last progress the task reported (context.progress()): done, total, "
                    "message, time."),
    )
    log = models.JSONField(
        _("log"), default=list, db_default=Value([], models.JSONField()), blank=True,
        help_text=_("The log records of the task's runs (context.logger and the project's "
                    "loggers), the last PGTASKS['TASK_LOG_LENGTH']: time, level, logger, "
                    "message."),
    )
    key = models.CharField(
        _("deduplication key"), max_length=255, null=True, blank=True, default=None
    )
    stage = models.CharField(_("stage"), max_length=100, null=True, blank=True, default=None)
    concurrency_key = models.CharField(
        _("concurrency key"), max_length=255, null=True, blank=True, default=None,
        help_text=_("Tasks sharing this key run at most concurrency_limit at a time."),
    )
    concurrency_limit = models.PositiveSmallIntegerField(
        _("concurrency limit"), null=True, blank=True, default=None,
        help_text=_("Most tasks of the concurrency key that may run at once (with the key)."),
    )
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)
    claims = models.PositiveIntegerField(
        _("claims"), default=0, db_default=0,
        help_text=_("Raised by every claim: the running attempt's lease."),
    )
    interruptions = models.PositiveSmallIntegerField(
        _("interruptions"), default=0, db_default=0,
        help_text=_("Runs cut off by a lost, stopped or disconnected worker; they spend no "
                    "attempt (at most PGTASKS['MAX_INTERRUPTIONS'])."),
    )
    rerun_requested = models.BooleanField(
        _("re-run requested"), default=False, db_default=False,
        help_text=_("Enqueued again under its key while running: runs once more after."),
    )
    cancel_requested = models.BooleanField(
        _("cancel requested"), default=False, db_default=False,
        help_text=_("Cancelled while running: its worker was asked to stop it."),
    )
    awaited = models.BooleanField(
        _("awaited"), default=False, db_default=False,
        help_text=_("Someone waits for this task to finish: its end is announced by NOTIFY."),
    )
    awaited_event = models.CharField(
        _("awaited event"), max_length=200, null=True, blank=True, default=None,
        help_text=_("The key of the event the task waits for (context.wait_for_event()): "
                    "sending it makes the task due at once."),
    )
    has_dependents = models.BooleanField(
        _("has dependents"), default=False, db_default=False,
        help_text=_("Other tasks wait for this one to end (django_pgtasks.models.dependencies)."),
    )
    created_at = models.DateTimeField(_("created"), db_default=Now())
    updated_at = models.DateTimeField(_("updated"), db_default=Now())

    class Meta:
        abstract = True


class Task(TaskFields):
    """One unit of work: which handler to run, with what arguments, and how it went."""

    objects = TaskManager()

    class Meta:
        db_table = "pgtasks_task"
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        indexes = [
            models.Index(
                fields=["queue", *CLAIM_ORDER],
                condition=Q(status__in=PENDING),
                name="pgtasks_task_claim_idx",
            ),
            models.Index(
                fields=["locked_at"],
                condition=Q(status=Status.RUNNING),
                name="pgtasks_task_running_idx",
            ),
            # Retention (purge oldest finished first) and statistics over time ranges.
            models.Index(
                fields=["finished_at"],
                condition=Q(status__in=FINISHED),
                name="pgtasks_task_finished_idx",
            ),
            # Tasks waiting for the tasks they depend on, per queue (statistics): empty
            # unless workflows are used.
            models.Index(
                fields=["queue"],
                condition=Q(status=Status.WAITING),
                name="pgtasks_task_waiting_idx",
            ),
            # Per-key concurrency (django_pgtasks.lifecycle.claim): the running tasks of a key, and
            # which queues hold waiting keyed tasks. Both are empty unless keys are used.
            models.Index(
                fields=["concurrency_key"],
                condition=Q(status=Status.RUNNING, concurrency_key__isnull=False),
                name="pgtasks_task_key_running_idx",
            ),
            # The tasks that wait for an event, by its key (Task.objects.send_event()):
            # empty unless events are used.
            models.Index(
                fields=["awaited_event"],
                condition=Q(status__in=(Status.READY, Status.RUNNING),
                            awaited_event__isnull=False),
                name="pgtasks_task_awaited_event_idx",
            ),
            models.Index(
                fields=["queue", "concurrency_key"],
                condition=Q(status__in=PENDING, concurrency_key__isnull=False),
                name="pgtasks_task_key_pending_idx",
            ),
        ]
        constraints = [
            # At most one live (waiting or running) task per deduplication key; enqueue with
            # key= relies on it through INSERT ... ON CONFLICT.
            models.UniqueConstraint(
                fields=["key"],
                condition=Q(key__isnull=False, status__in=LIVE),
                name="pgtasks_task_live_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="pgtasks_task_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="pgtasks_task_max_attempts_min"
            ),
            models.CheckConstraint(
                condition=Q(status__in=Status.values), name="pgtasks_task_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save as ``Model.save()`` does; a finished task saved without ``finished_at`` gets
        the current time, its place in the history (partitioned by it)."""
        ended_now(self)
        super().save(*args, **kwargs)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    def cancel(self) -> CancelResult:
        """Cancel this task if it waits, or ask its worker to stop it if it runs; see
        :meth:`TaskQuerySet.cancel`. The instance is not refreshed."""
        return Task.objects.using(self._state.db).filter(pk=self.pk).cancel()

    def wait(self, timeout: float | None = None, *, poll_interval: float = 5.0) -> Task:
        """Block until this task is finished and return it read afresh; see
        :meth:`TaskManager.wait`."""
        return Task.objects.wait(self, timeout, poll_interval=poll_interval)


class Dashboard(Task):
    """The admin dashboard's entry in the admin index (a proxy: no table, no permissions of
    its own; viewing it takes the permission to view tasks)."""

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")


class ArchivedTask(TaskFields):
    """A finished task moved out of the task table by the purge (``PGTASKS["ARCHIVE"]``)."""

    id = models.BigIntegerField(primary_key=True)
    archived_at = models.DateTimeField(_("archived"), db_default=Now())

    class Meta:
        db_table = "pgtasks_task_archive"
        verbose_name = _("archived task")
        verbose_name_plural = _("archived tasks")
        indexes = [models.Index(fields=["archived_at"], name="pgtasks_archive_at_idx")]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk} (archived)"


def archive_columns() -> tuple[str, str]:
    """The column list of an INSERT into the archive, and its ON CONFLICT assignments."""
    columns = _task_columns()
    return (", ".join(f'"{c}"' for c in columns),
            ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in columns if c != "id"))


@functools.cache
def _task_columns() -> tuple[str, ...]:
    """Columns shared by the task table and its archive (``TaskFields``), in model order."""
    archive = {f.column for f in ArchivedTask._meta.concrete_fields}
    columns = tuple(f.column for f in Task._meta.concrete_fields)
    missing = set(columns) - archive
    if missing:  # a column added to Task alone would be lost on archiving
        raise RuntimeError(f"pgtasks_task_archive lacks the column(s) {sorted(missing)}.")
    return columns
