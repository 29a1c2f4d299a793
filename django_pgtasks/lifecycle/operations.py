"""An operator's changes to a selection of tasks: retry now (or from a kept step), cancel,
change the priority, make due, delete the finished.

Each is a guarded ``UPDATE`` (or ``DELETE``) of the rows of a queryset of the task table that
the caller passes in (``Task.objects.filter(...)``: the querysets of ``models/`` delegate
here), and touches only the tasks it may: a running task is only ever flagged
(``cancel_requested``), never changed under its worker. Rows move between the live
partition and history (a retry brings a task back, a cancel ends it): a race with a worker
ending one of them is tried again (:mod:`django_pgtasks.database.partition_moves`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest, Now

from django_pgtasks.database.partition_moves import retry_conflicts

#: The states of a task that waits to run, and of one that has not started.
PENDING = ("READY", "AWAITING_RETRY")
UNSTARTED = ("WAITING", *PENDING)
LIVE = (*UNSTARTED, "RUNNING")
FINISHED = ("SUCCESSFUL", "FAILED", "CANCELLED")


def retry_now(tasks: Any) -> int:
    """Make the pending, failed or cancelled tasks of ``tasks`` due now; how many changed.

    A task whose attempts are used up gets one more (``max_attempts = attempt + 1``), and its
    interruption budget starts afresh. Running and successful tasks are left alone, and so is
    a finished task whose key now belongs to another live task (two live tasks cannot share
    a key). A retried task with dependents re-opens them (``sql/workflows.sql``).
    """
    return _make_due(tasks, [*PENDING, "FAILED", "CANCELLED"])


# A task's kept steps before the first one named %s (all of them if none is).
STEPS_BEFORE_SQL = """
    COALESCE((SELECT jsonb_agg(kept.value ORDER BY kept.ordinality)
              FROM jsonb_array_elements(steps) WITH ORDINALITY AS kept
              WHERE kept.ordinality < (
                  SELECT min(named.ordinality)
                  FROM jsonb_array_elements(steps) WITH ORDINALITY AS named
                  WHERE named.value ->> 'name' = %s)), '[]'::jsonb)
"""


def retry_from_step(tasks: Any, name: str) -> int:
    """Run the tasks of ``tasks`` that kept step ``name`` again from that step: the steps
    kept before it stay, it and the later ones are forgotten (they run again), and the task
    is due now, as with :func:`retry_now`. Successful tasks too (to redo their last steps);
    running tasks and those without that step are left alone. How many changed."""
    return _make_due(tasks.filter(steps__contains=[{"name": name}]),
                     [*PENDING, *FINISHED], steps=RawSQL(STEPS_BEFORE_SQL, [name]))


def _make_due(tasks: Any, states: list[str], **changes: Any) -> int:
    """The tasks of ``tasks`` in ``states`` due now, with ``changes``; see
    :func:`retry_now`."""
    taken_keys = tasks.model._default_manager.using(tasks.db).filter(
        status__in=LIVE, key__isnull=False).values("key")
    return retry_conflicts(tasks.db, lambda: tasks.filter(
        status__in=states
    ).exclude(
        Q(status__in=FINISHED) & Q(key__in=taken_keys)
    ).update(
        status="READY", run_after=Now(), updated_at=Now(),
        max_attempts=Greatest(F("max_attempts"), F("attempt") + 1),
        cancel_requested=False, interruptions=0, **changes,
    ))


def cancel(tasks: Any, *, running: bool = True) -> tuple[int, int, int]:
    """Cancel the tasks that have not started; ask the running ones to stop (unless
    ``running=False``). Returns how many were cancelled, asked to stop, and left alone."""
    def cancel_selected() -> tuple[int, int, int]:
        with transaction.atomic(using=tasks.db):
            selected = tasks.count()
            cancelled = tasks.filter(status__in=UNSTARTED).update(
                status="CANCELLED", finished_at=Now(), updated_at=Now())
            stopping = (tasks.filter(status="RUNNING").update(cancel_requested=True)
                        if running else 0)
        return cancelled, stopping, selected - cancelled - stopping

    return retry_conflicts(tasks.db, cancel_selected)


def set_priority(tasks: Any, priority: int) -> int:
    """Give the tasks that have not started ``priority`` (effective at the next claim)."""
    return tasks.filter(status__in=UNSTARTED).update(priority=priority, updated_at=Now())


def make_due(tasks: Any) -> int:
    """Make the pending tasks of ``tasks`` that are due later due now (the test helpers'
    ``drain(delayed=True)``); how many changed."""
    return tasks.filter(status__in=PENDING, run_after__gt=Now()).update(run_after=Now())


def delete_finished(tasks: Any) -> int:
    """Delete the finished tasks of ``tasks`` (their workflow rows go with them); running
    and waiting tasks are left alone. How many were deleted."""
    _, per_model = tasks.filter(status__in=FINISHED).delete()
    return per_model.get(tasks.model._meta.label, 0)
