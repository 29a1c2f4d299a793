"""Schedules made in the admin (``Schedule.source = "database"``): what they run, how a new
or changed one is checked, and how it is written without disturbing the scheduler.

The scheduler (:mod:`django_pgtasks.scheduling.job`) reads these rows at every pass, so a
change applies within ``PGTASKS["SCHEDULER_INTERVAL"]`` seconds, without restarting the
workers. Each planned run is still produced once: the same row lock and guarded advance as
for the schedules declared in code.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.options import validate_options, validate_queue
from django_pgtasks.definition.payload import serialize_payload
from django_pgtasks.definition.recurrence import (
    MAX_NAME_LENGTH,
    RESERVED_KWARGS,
    When,
    parse_spec,
    zone,
)
from django_pgtasks.definition.registry import get_handler
from django_pgtasks.exceptions import (
    HandlerImportError,
    InvalidPayloadError,
    InvalidTaskError,
    UnknownQueueError,
    UnknownTaskError,
)
from django_pgtasks.models import Schedule
from django_pgtasks.scheduling.declarations import Declaration, declared_names

#: The fields of a row that a change in the admin may write (``next_run_at`` is derived).
DEFINITION_FIELDS = ("task_name", "spec", "timezone", "enabled", "args", "kwargs", "queue",
                     "priority")


def declaration_of(name: str, task: str, spec: str, timezone: str, args: Any, kwargs: Any,
                   queue: str | None, priority: int | None,
                   enabled: bool = True) -> Declaration:
    """The :class:`Declaration` of a row made in the admin (JSON columns as text or values)."""
    args = json.loads(args) if isinstance(args, str) else args
    kwargs = json.loads(kwargs) if isinstance(kwargs, str) else kwargs
    return Declaration(name=name, task=task, when=parse_spec(spec), timezone=timezone,
                       args=tuple(args or ()), kwargs=dict(kwargs or {}), queue=queue or None,
                       enabled=enabled, priority=priority)


def problems(schedule: Schedule, skip: Collection[str] = ()) -> dict[str, list[str]]:
    """What is wrong with each field of a schedule made or changed in the admin, checked
    apart from the others so that a form shows every field's error at once. Fields named
    in ``skip`` (those a form already refused) are not checked."""
    errors: dict[str, list[str]] = {}

    def refuse(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    checked = set(("name", *DEFINITION_FIELDS)) - set(skip)
    if "name" in checked:
        if schedule.name in declared_names():
            refuse("name", f"A schedule named {schedule.name!r} is declared in code; choose "
                           f"another name.")
        if not schedule.name or len(schedule.name) > MAX_NAME_LENGTH:
            refuse("name", f"A schedule's name has 1 to {MAX_NAME_LENGTH} characters.")
    when = tz = None
    if "spec" in checked:
        try:
            when = parse_spec(schedule.spec)
        except ImproperlyConfigured as exc:
            refuse("spec", str(exc))
    if "timezone" in checked:
        try:
            tz = zone(schedule.timezone)
        except ImproperlyConfigured as exc:
            refuse("timezone", str(exc))
    if when is not None and tz is not None and (problem := _out_of_range(when, tz)):
        refuse("spec", problem)
    if "args" in checked:
        if not isinstance(schedule.args, list):
            refuse("args", "The positional arguments are a JSON array.")
        elif problem := _payload_problem(schedule.args, {}):
            refuse("args", problem)
    if "kwargs" in checked:
        if not isinstance(schedule.kwargs, dict):
            refuse("kwargs", "The keyword arguments are a JSON object.")
        elif reserved := sorted(RESERVED_KWARGS & set(schedule.kwargs)):
            refuse("kwargs", f"Reserved name(s): {', '.join(reserved)}; use the schedule's "
                             f"own fields.")
        elif problem := _payload_problem([], schedule.kwargs):
            refuse("kwargs", problem)
    if "task_name" in checked:
        try:
            get_handler(schedule.task_name)
        except (UnknownTaskError, HandlerImportError) as exc:
            # HandlerImportError: a name inside an installed app whose module does not
            # exist, or raises while being imported; for this form, a name that names no
            # task either.
            refuse("task_name", str(exc))
    if "queue" in checked and schedule.queue:
        try:
            validate_queue(schedule.queue)
        except UnknownQueueError as exc:
            refuse("queue", str(exc))
    if "priority" in checked:
        try:
            validate_options(priority=schedule.priority)
        except InvalidTaskError as exc:
            refuse("priority", str(exc))
    return errors


def validate(schedule: Schedule) -> Declaration:
    """Check a schedule made or changed in the admin as the scheduler would run it; raise
    ``ValidationError`` naming what is wrong with every field (:func:`problems`), then what
    is wrong with the run as a whole (arguments that do not fit the task). Nothing is
    written."""
    if errors := problems(schedule):
        raise ValidationError(errors)
    when = parse_spec(schedule.spec)
    declaration = Declaration(
        name=schedule.name, task=schedule.task_name, when=when, timezone=schedule.timezone,
        args=tuple(schedule.args), kwargs=dict(schedule.kwargs),
        queue=schedule.queue or None, enabled=schedule.enabled, priority=schedule.priority)
    try:
        # The run as the scheduler will build it: a registered task, arguments that fit its
        # signature and are plain JSON, a configured queue, a priority in range.
        task = declaration.build(datetime.now(UTC))
    except (UnknownTaskError, HandlerImportError) as exc:
        raise ValidationError({"task_name": [str(exc)]}) from None
    except UnknownQueueError as exc:
        raise ValidationError({"queue": [str(exc)]}) from None
    except InvalidTaskError as exc:
        field = "priority" if str(exc).lower().startswith("priority") else None
        raise ValidationError({field: [str(exc)]} if field else [str(exc)]) from None
    from django_pgtasks.definition.routing import database_for_queue

    alias = pgtasks_settings.DATABASE
    if database_for_queue(task.queue) != alias:
        raise ValidationError({"queue": [
            f"The queue {task.queue!r} is on database {database_for_queue(task.queue)!r}; "
            f"schedules made in the admin live in {alias!r} with their runs."]})
    return declaration


def _payload_problem(args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """Why PostgreSQL could not store these arguments unchanged (a NUL character, a lone
    surrogate, too deep, too large...; see :mod:`django_pgtasks.definition.payload`), or ``None``.
    Checked apart for each field, so that the form shows the error on the right one."""
    try:
        serialize_payload(args, kwargs)
    except InvalidPayloadError as exc:
        return str(exc)
    return None


def _out_of_range(when: When, tz: ZoneInfo) -> str | None:
    """Why the runs of ``when`` would fall outside the times Python and the scheduler can
    hold (a period of thousands of years), or ``None``. Nothing would fail on saving, but
    every scheduler pass would, on advancing the plan past year 9999."""
    now = datetime.now(UTC)
    try:
        first = when.first(now, tz)
        if first is not None:
            when.next_after(first, tz)
    except OverflowError:
        return (f"The schedule {when.spec!r} plans its next run after the year 9999; "
                f"choose a shorter period.")
    return None


def save(schedule: Schedule) -> None:
    """Write a schedule made or changed in the admin, planning its next run on the database
    clock.

    A new one is first due at once (a period) or at its next cron time. A change to its spec
    or time zone, or enabling it again, plans afresh from its last run; any other change
    keeps the planned time. The row is locked while it is written, so a scheduler pass that
    is producing its run finishes first (and one that comes meanwhile skips it); only the
    definition columns and the plan are written, never the scheduler's own columns.
    """
    alias = pgtasks_settings.DATABASE
    when, tz = parse_spec(schedule.spec), zone(schedule.timezone)
    schedule.source = Schedule.Source.DATABASE
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
        if schedule.pk is None:
            schedule.next_run_at = when.first(now, tz)
            schedule.save(using=alias, force_insert=True)
            return
        current = Schedule.objects.using(alias).select_for_update().get(pk=schedule.pk)
        if ((current.spec, current.timezone) != (schedule.spec, schedule.timezone)
                or (schedule.enabled and not current.enabled)):
            schedule.next_run_at = when.restart(current.last_run_at, now, tz)
        else:
            schedule.next_run_at = current.next_run_at
        schedule.updated_at = now
        schedule.save(using=alias, update_fields=[
            *DEFINITION_FIELDS, "source", "next_run_at", "updated_at"])
