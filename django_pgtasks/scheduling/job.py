"""Periodic tasks: schedules declared in code produce runs, each planned run exactly once.

A schedule is declared with ``@pgtask(schedule=...)`` or in ``PGTASKS["SCHEDULE"]``; its
state lives in one ``pgtasks_schedule`` row (see :class:`~django_pgtasks.models.Schedule`).
Every worker runs the scheduler job (a :mod:`~django_pgtasks.definition.maintenance_jobs` job, every
``PGTASKS["SCHEDULER_INTERVAL"]`` seconds). One pass:

1. reads the rows of the schedules this process declares (one query) and writes the ones
   that are missing, or whose declaration this process has not written yet, with
   ``INSERT … ON CONFLICT (name) DO UPDATE`` (a changed spec or time zone recomputes
   ``next_run_at``);
2. for each row that is due on the database clock (``next_run_at <= now()``), in one
   transaction: locks the row (``FOR UPDATE SKIP LOCKED``: a worker already on it is not
   waited for), enqueues the run, and advances the row with an UPDATE guarded on the
   ``next_run_at`` it planned from. A guard that matches no row means another worker
   produced that run first, and the transaction, task included, is rolled back.

The next planned time is computed from the previous *planned* time, never from the time the
pass happened to run, so runs do not drift. Only "is it due" is decided by the database
clock; stepping from one planned time to the next in the schedule's time zone is calendar
arithmetic, done here in Python.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError, connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition import maintenance_jobs as maintenance

if TYPE_CHECKING:
    pass

from django_pgtasks.definition.recurrence import (
    CATCH_UP_LIMIT,
    default_timezone,
    zone,
)
from django_pgtasks.scheduling.declarations import (
    Declaration,
    collect,
    plan,
)

logger = logging.getLogger("django_pgtasks.scheduling")

# -- the scheduler job ---------------------------------------------------------------------

# One query per pass: the rows of the schedules this process declares, and the schedules
# made in the admin that are due on the database clock (with what they run).
STATE_SQL = """
    SELECT name, task_name, spec, timezone, enabled, next_run_at, last_run_at,
           next_run_at <= now(), source, args, kwargs, queue, priority
    FROM pgtasks_schedule
    WHERE name = ANY(%s) OR (source = 'database' AND enabled AND next_run_at <= now())
    ORDER BY next_run_at
"""

# Writes declarations. An unchanged row is not rewritten (the WHERE), so ``updated_at`` says
# when the declaration last changed; a changed spec or time zone, or a schedule enabled
# again, takes the ``next_run_at`` computed for it, and anything else keeps its own.
SYNC_SQL = """
    INSERT INTO pgtasks_schedule AS s (name, task_name, spec, timezone, enabled, next_run_at,
                                       created_at, updated_at)
    SELECT v.name, v.task_name, v.spec, v.timezone, v.enabled, v.next_run_at, now(), now()
    FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bool[], %s::timestamptz[])
         AS v(name, task_name, spec, timezone, enabled, next_run_at)
    ON CONFLICT (name) DO UPDATE SET
        task_name = EXCLUDED.task_name, spec = EXCLUDED.spec, timezone = EXCLUDED.timezone,
        enabled = EXCLUDED.enabled, updated_at = now(), source = 'code',
        next_run_at = CASE
            WHEN (s.spec, s.timezone) IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.timezone)
                 OR (EXCLUDED.enabled AND NOT s.enabled)
            THEN EXCLUDED.next_run_at ELSE s.next_run_at END
    WHERE (s.task_name, s.spec, s.timezone, s.enabled, s.source)
          IS DISTINCT FROM (EXCLUDED.task_name, EXCLUDED.spec, EXCLUDED.timezone,
                            EXCLUDED.enabled, 'code')
"""

# Takes a due schedule for this transaction. SKIP LOCKED: a worker already producing its
# run is not waited for. The definition must match this process's, so that two versions
# of the code (during a deploy) never plan the same schedule from different specs.
LOCK_DUE_SQL = """
    SELECT next_run_at, now() FROM pgtasks_schedule
    WHERE name = %s AND task_name = %s AND spec = %s AND timezone = %s
      AND enabled AND next_run_at <= now()
    FOR UPDATE SKIP LOCKED
"""

# The exactly-once guard: the row still plans the run we produced, and it is due. No match
# means another worker produced it; the caller then rolls back, the enqueued task with it.
ADVANCE_SQL = """
    UPDATE pgtasks_schedule SET
        next_run_at = %s,
        last_run_at = COALESCE(%s, last_run_at),
        last_task_id = COALESCE(%s, last_task_id),
        updated_at = now()
    WHERE name = %s AND spec = %s AND timezone = %s AND enabled
      AND next_run_at = %s AND next_run_at <= now()
"""


@dataclass
class _Row:
    name: str
    task_name: str
    spec: str
    timezone: str
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    due: bool
    source: str

    @property
    def definition(self) -> tuple[str, ...]:
        """What a declaration in code decides; a row made in the admin matches none (a
        schedule declared in code under its name takes it over)."""
        if self.source != "code":
            return ("made in the admin",)
        return (self.task_name, self.spec, self.timezone, self.enabled)


#: Declarations this process has written, by (database alias, schedule name). A row that
#: differs from a declaration written already was changed by another version of the code;
#: it is left alone rather than rewritten on every pass (see :func:`run_scheduler`).
_written: dict[tuple[str, str], tuple[str, str, str, bool]] = {}
#: Problems already logged, so that a broken schedule logs once, not on every pass.
_reported: set[tuple[str, str]] = set()


class _AlreadyProduced(Exception):
    """Raised inside the run's transaction to roll it back when the guard matched nothing."""


def run_scheduler(using: str | None = None) -> list[int]:
    """One scheduler pass; returns the ids of the tasks it enqueued.

    Any number of workers may run it at the same time: each planned run is enqueued once.
    Database errors propagate (the worker logs them and retries at the next turn); any other
    error concerns one schedule, is logged once, and does not stop the others.
    """
    alias = using or pgtasks_settings.DATABASE
    declarations, problems = collect()
    for problem in problems:
        _report(problem.id, problem.message)
    # A schedule's state lives in the database of its queue, with the runs it enqueues (one
    # transaction); workers of the other databases leave it alone.
    declarations = {name: declaration for name, declaration in declarations.items()
                    if database_of(declaration) == alias}
    rows, runtime_due = _read_state(alias, declarations)
    if _sync(alias, declarations, rows):
        rows, runtime_due = _read_state(alias, declarations)
    due: list[Declaration] = []
    for name, declaration in declarations.items():
        row = rows.get(name)
        if (row is not None and row.due and declaration.enabled
                and row.definition == declaration.row):
            due.append(declaration)
    due += runtime_due
    created: list[int] = []
    policy = pgtasks_settings.MISSED_RUNS
    for declaration in due:
        try:
            created += produce(alias, declaration, policy) or []
        except (DatabaseError, InterfaceError):
            raise
        except Exception as exc:
            # A bad queue or payload (caught by ``manage.py check`` or the admin's form too)
            # concerns this schedule only; the worker loop must not die of it.
            _report(declaration.name, f"Schedule {declaration.name!r} could not enqueue its "
                                      f"run: {type(exc).__name__}: {exc}")
    return created


def database_of(declaration: Declaration) -> str:
    """The database alias that holds the schedule's state and its runs (its queue's)."""
    from django_pgtasks.definition.registry import get_handler
    from django_pgtasks.definition.routing import database_for_queue

    queue = declaration.queue
    if queue is None:
        try:
            queue = get_handler(declaration.task).queue
        except Exception:  # an unknown task is reported by the checks and at each pass
            queue = None
    return database_for_queue(queue or pgtasks_settings.DEFAULT_QUEUE)


def _read_state(alias: str, declarations: Mapping[str, Declaration],
                ) -> tuple[dict[str, _Row], list[Declaration]]:
    """The rows of ``declarations`` by name, and the due schedules made in the admin (read
    afresh at every pass: an edit applies from the next pass on, without a restart)."""
    from django_pgtasks.scheduling.runtime import declaration_of

    with connections[alias].cursor() as cursor:
        cursor.execute(STATE_SQL, [list(declarations)])
        fetched = cursor.fetchall()
    rows: dict[str, _Row] = {}
    runtime_due: list[Declaration] = []
    for row in fetched:
        name, task, spec, timezone, enabled, *_plan, due, source = row[:9]
        if name in declarations:
            rows[name] = _Row(*row[:9])
        elif source == "database" and due:
            try:
                runtime_due.append(declaration_of(name, task, spec, timezone, *row[9:],
                                                  enabled=enabled))
            except Exception as exc:  # a row changed by other code than the admin's form
                _report(name, f"Schedule {name!r} cannot run: {exc}")
    return rows, runtime_due


def sync(using: str | None = None) -> None:
    """Write every declared schedule to ``pgtasks_schedule`` now (workers do it on their own).

    Useful in a deploy step or a test; declarations this process wrote before are written
    again if their row differs.
    """
    alias = using or pgtasks_settings.DATABASE
    declarations, _problems = collect()
    for name in declarations:
        _written.pop((alias, name), None)
    if declarations:
        _sync(alias, declarations, _read_state(alias, declarations)[0])


def _sync(alias: str, declarations: Mapping[str, Declaration], rows: Mapping[str, _Row]) -> bool:
    """Write the declarations whose row is missing, or that this process has not written yet
    and differ from their row; return whether anything was written."""
    pending = []
    for name, declaration in declarations.items():
        row = rows.get(name)
        if row is not None and row.definition == declaration.row:
            _written[(alias, name)] = declaration.row
        elif row is None or _written.get((alias, name)) != declaration.row:
            pending.append(declaration)
        else:
            _report(name, f"Schedule {name!r} was changed by another version of the code "
                          f"(row: {row.definition}, here: {declaration.row}); this process "
                          f"leaves it alone until it restarts.", level=logging.WARNING)
    if not pending:
        return False
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
        columns: list[list[Any]] = [[], [], [], [], [], []]
        for declaration in pending:
            row = rows.get(declaration.name)
            if row is None:
                next_run_at = declaration.when.first(now, declaration.tz)
            else:
                next_run_at = declaration.when.restart(row.last_run_at, now, declaration.tz)
            values = [declaration.name, *declaration.row[:3], declaration.enabled, next_run_at]
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        cursor.execute(SYNC_SQL, columns)
    for declaration in pending:
        _written[(alias, declaration.name)] = declaration.row
        logger.info("Schedule name=%s task=%s spec=%r timezone=%s enabled=%s written.",
                    declaration.name, declaration.task, declaration.spec, declaration.timezone,
                    declaration.enabled)
    return True


def produce(using: str, declaration: Declaration, policy: str | None = None) -> list[int] | None:
    """Produce the due run(s) of one schedule, in one transaction; the new task ids.

    ``None`` if the schedule is not due, or another worker holds it right now.
    """
    policy = policy or pgtasks_settings.MISSED_RUNS
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(LOCK_DUE_SQL, [declaration.name, *declaration.row[:3]])
        row = cursor.fetchone()
        if row is None:
            return None
        planned, now = (_aware(value) for value in row)
        return _produce(using, declaration, planned, now, policy)


def _produce(using: str, declaration: Declaration, planned: datetime, now: datetime,
             policy: str) -> list[int] | None:
    """Enqueue the runs for ``planned`` and advance the row, guarded on ``planned``.

    ``None`` (and nothing written) if the row no longer plans ``planned``.
    """
    from django_pgtasks.models import Task

    runs = plan(declaration.when, declaration.tz, planned, now, policy)
    try:
        with transaction.atomic(using=using):
            tasks = Task.objects.enqueue_many(
                (declaration.build(when) for when in runs.runs), using=using
            )
            last = tasks[-1] if tasks else None
            with connections[using].cursor() as cursor:
                cursor.execute(ADVANCE_SQL, [
                    runs.next_run_at, runs.runs[-1] if runs.runs else None,
                    last.pk if last else None, declaration.name, declaration.spec,
                    declaration.timezone, planned,
                ])
                if cursor.rowcount != 1:
                    raise _AlreadyProduced
    except _AlreadyProduced:
        logger.debug("Schedule name=%s planned=%s: produced by another worker.",
                     declaration.name, planned.isoformat())
        return None
    if runs.missed:
        logger.warning(
            "Schedule name=%s missed planned runs from %s (policy %r): %d run(s) enqueued%s; "
            "next at %s.", declaration.name, planned.isoformat(), policy, len(tasks),
            f", the rest beyond {CATCH_UP_LIMIT} skipped" if runs.truncated else "",
            runs.next_run_at.isoformat() if runs.next_run_at else "never",
        )
    for task in tasks:
        logger.info("Schedule name=%s task=%s planned=%s enqueued task id=%s.",
                    declaration.name, declaration.task, task.metadata["planned_at"], task.pk)
    if runs.next_run_at is None:
        logger.warning("Schedule name=%s: its cron expression %r matches no time in the next "
                       "50 years; it stops.", declaration.name, declaration.spec)
    return [task.pk for task in tasks]


def _aware(value: datetime) -> datetime:
    """Datetimes come back naive when ``USE_TZ = False``: in the connection's time zone."""
    if value.tzinfo is None:
        return value.replace(tzinfo=zone(default_timezone()))
    return value


def _report(key: str, message: str, level: int = logging.ERROR) -> None:
    if (key, message) not in _reported:
        _reported.add((key, message))
        logger.log(level, message)


maintenance.register(maintenance.Job(
    name="scheduler",
    interval=lambda: pgtasks_settings.SCHEDULER_INTERVAL,
    run=run_scheduler,
))
