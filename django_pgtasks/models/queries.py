"""Named queries on the task table: which tasks wait, run, are stuck; operator actions on a
selection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.utils import timezone

from django_pgtasks.definition.options import validate_options
from django_pgtasks.definition.status import (
    CLAIM_ORDER,
    FINISHED,
    PENDING,
    Status,
)
from django_pgtasks.definition.steps import check_name
from django_pgtasks.lifecycle import leases, operations


class CancelResult(int):
    """What :meth:`TaskQuerySet.cancel` did: an ``int``, the number of tasks cancelled."""

    cancelled: int
    #: Running tasks whose worker was asked to stop them.
    stopping: int
    #: Selected tasks left alone: already finished (or gone meanwhile).
    skipped: int

    def __new__(cls, cancelled: int, stopping: int = 0, skipped: int = 0) -> CancelResult:
        result = super().__new__(cls, cancelled)
        result.cancelled, result.stopping, result.skipped = cancelled, stopping, max(skipped, 0)
        return result

    def __repr__(self) -> str:
        return (f"CancelResult(cancelled={self.cancelled}, stopping={self.stopping}, "
                f"skipped={self.skipped})")


def ended_now(task: Any) -> None:
    """Give a finished task saved without ``finished_at`` the current time: finished tasks
    live in history partitioned by it, where a row without one has no place."""
    if task.status in FINISHED and task.finished_at is None:
        task.finished_at = timezone.now()


class TaskQuerySet(models.QuerySet):
    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        objs = list(objs)
        for task in objs:
            ended_now(task)
        return super().bulk_create(objs, *args, **kwargs)

    def pending(self) -> TaskQuerySet:
        """Tasks waiting for their first or next attempt, due or not."""
        return self.filter(status__in=PENDING)

    def due(self) -> TaskQuerySet:
        """Pending tasks whose ``run_after`` has passed on the database clock."""
        return self.pending().filter(run_after__lte=Now())

    def waiting(self) -> TaskQuerySet:
        """Tasks waiting for the tasks they depend on to end (not claimable yet)."""
        return self.filter(status=Status.WAITING)

    def ready(self) -> TaskQuerySet:
        return self.filter(status=Status.READY)

    def running(self) -> TaskQuerySet:
        return self.filter(status=Status.RUNNING)

    def awaiting_retry(self) -> TaskQuerySet:
        return self.filter(status=Status.AWAITING_RETRY)

    def succeeded(self) -> TaskQuerySet:
        return self.filter(status=Status.SUCCESSFUL)

    def failed(self) -> TaskQuerySet:
        return self.filter(status=Status.FAILED)

    def cancelled(self) -> TaskQuerySet:
        return self.filter(status=Status.CANCELLED)

    def finished(self) -> TaskQuerySet:
        return self.filter(status__in=FINISHED)

    def claimable(self, queue: str) -> TaskQuerySet:
        """Due tasks of one queue in claim order: the range the claim index serves."""
        return self.due().filter(queue=queue).order_by(*CLAIM_ORDER)

    def held_by(self, worker_id: str) -> TaskQuerySet:
        """Running tasks whose lease belongs to ``worker_id``."""
        return self.running().filter(locked_by=worker_id)

    def stuck(self) -> TaskQuerySet:
        """Running tasks whose worker is lost or whose lease expired: what rescue takes back.

        See :mod:`django_pgtasks.worker.liveness` for the rules.
        """
        abandoned = RawSQL(leases.ABANDONED_SQL, leases.abandoned_params(),
                           output_field=models.BooleanField())
        return self.running().filter(abandoned)

    # -- operator actions: guarded UPDATEs; only cancel() touches a RUNNING task (flags it) ---

    def retry_now(self) -> int:
        """Make pending, failed or cancelled tasks due now; return how many changed.

        A task whose attempts are used up gets one more (``max_attempts = attempt + 1``), and
        its interruption budget starts afresh.
        Running and successful tasks are left alone, and so is a finished task whose key now
        belongs to another live task. (:func:`django_pgtasks.lifecycle.operations.retry_now`)
        """
        return operations.retry_now(self)

    def retry_from_step(self, name: str) -> int:
        """Run the tasks that kept step ``name`` (``ctx.step()``) again from that step: the
        steps before it stay kept, it and the later ones run again. Waiting, failed,
        cancelled and successful tasks; running ones are left alone. Returns how many
        changed. (:func:`django_pgtasks.lifecycle.operations.retry_from_step`)"""
        return operations.retry_from_step(self, check_name(name))

    def cancel(self, *, running: bool = True) -> CancelResult:
        """Cancel tasks; return how many were cancelled, asked to stop, and skipped.

        Waiting tasks (ready, awaiting retry, or waiting for the tasks they depend on) end
        ``CANCELLED`` at once and never start; their own dependents see a parent that did
        not succeed.
        Running tasks (unless ``running=False``) are asked to stop: ``cancel_requested`` is
        set, which tells their worker at once (``NOTIFY``) or at its next heartbeat; the
        handler sees it through ``TaskContext.should_stop()`` (an async handler is cancelled)
        and the task ends ``CANCELLED`` if the handler stops by raising, or ``SUCCESSFUL`` if
        it finishes its work anyway (see ``docs/howto/cancel-snooze-wait.md``). Finished tasks
        are skipped. The result is an ``int`` (the number cancelled) with the attributes
        ``cancelled``, ``stopping`` and ``skipped``.
        """
        return CancelResult(*operations.cancel(self, running=running))

    def set_priority(self, priority: int) -> int:
        """Change the priority of waiting tasks (effective on the next claim); return how many."""
        validate_options(priority=priority)
        return operations.set_priority(self, priority)

    def make_due(self) -> int:
        """Make the pending tasks due later due now; return how many changed."""
        return operations.make_due(self)

    def delete_finished(self) -> int:
        """Delete the finished tasks (running and waiting ones are left); return how many."""
        return operations.delete_finished(self)
