"""Periodic tasks: schedules declared in code produce runs, each planned run exactly once.

A schedule is declared with ``@pgtask(schedule=...)`` or in ``PGTASKS["SCHEDULE"]``; its
state lives in one ``pgtasks_schedule`` row (see :class:`~django_pgtasks.models.Schedule`).
Every worker runs the scheduler job (a :mod:`~django_pgtasks.base.maintenance` job, every
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, connections, transaction

from django_pgtasks.base import maintenance
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.exceptions import InvalidTaskError

if TYPE_CHECKING:
    from django_pgtasks.models import Task

from django_pgtasks.base.schedules import (
    CATCH_UP_LIMIT,
    ENTRY_KEYS,
    MAX_NAME_LENGTH,
    RESERVED_KWARGS,
    When,
    default_timezone,
    format_period,
    parse_when,
    zone,
)

logger = logging.getLogger("django_pgtasks.scheduling")

@dataclass(frozen=True)
class Declaration:
    """One schedule as declared in code: what to run, when, and where."""

    name: str
    task: str
    when: When
    timezone: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    enabled: bool = True

    @property
    def spec(self) -> str:
        return self.when.spec

    @property
    def tz(self) -> ZoneInfo:
        return zone(self.timezone)

    @property
    def row(self) -> tuple[str, str, str, bool]:
        """The columns of ``pgtasks_schedule`` that the declaration decides."""
        return (self.task, self.spec, self.timezone, self.enabled)

    def build(self, planned: datetime) -> Task:
        """An unsaved, validated task for the run planned at ``planned``."""
        from django_pgtasks.models import Task

        task = Task.objects.build(self.task, *self.args, queue=self.queue, **self.kwargs)
        task.metadata = {"schedule": self.name, "planned_at": planned.astimezone(UTC).isoformat()}
        return task


@dataclass(frozen=True)
class Problem:
    """Something wrong with a declaration; reported by the system checks."""

    id: str
    message: str
    hint: str | None = None


def collect() -> tuple[dict[str, Declaration], list[Problem]]:
    """The schedules declared in this process, and what is wrong with the others.

    Sources: every registered handler with ``schedule=`` (named after the handler), then
    the entries of ``PGTASKS["SCHEDULE"]``. Declarations with problems are left out.
    """
    from django_pgtasks.base.registry import get_handler, registered_names

    declarations: dict[str, Declaration] = {}
    problems: list[Problem] = []
    default_tz = default_timezone()
    for name in registered_names():
        handler = get_handler(name)
        when = getattr(handler, "schedule", None)
        if when is None:
            continue
        timezone = getattr(when, "timezone", None) or default_tz
        declarations[name] = Declaration(name=name, task=name, when=when, timezone=timezone)
    entries = pgtasks_settings.SCHEDULE
    if not isinstance(entries, Mapping):
        problems.append(Problem(
            "E030", "PGTASKS['SCHEDULE'] must be a dict of schedule name -> options.",
        ))
        return declarations, problems
    for name, entry in entries.items():
        try:
            declaration = _from_entry(name, entry, default_tz)
        except _EntryError as exc:
            problems.append(exc.problem)
            continue
        if declaration.name in declarations:
            problems.append(Problem(
                "E030", f"The schedule {name!r} is declared twice: in PGTASKS['SCHEDULE'] "
                f"and by @pgtask(schedule=...) on the task of that name.",
                hint="Rename the PGTASKS['SCHEDULE'] entry.",
            ))
            continue
        declarations[declaration.name] = declaration
    return declarations, problems


class _EntryError(Exception):
    def __init__(self, id: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.problem = Problem(id, message, hint)


def _from_entry(name: Any, entry: Any, default_tz: str) -> Declaration:
    from django_pgtasks.base.registry import get_handler

    where = f"PGTASKS['SCHEDULE'][{name!r}]"
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise _EntryError("E030", f"Schedule name {name!r} must be a string of 1 to "
                                  f"{MAX_NAME_LENGTH} characters.")
    if not isinstance(entry, Mapping):
        raise _EntryError("E030", f"{where} must be a dict with at least 'task' and "
                                  f"'schedule'.")
    unknown = sorted(map(str, set(entry) - ENTRY_KEYS))
    if unknown:
        raise _EntryError("E030", f"{where} has unknown key(s): {', '.join(unknown)}.",
                          hint=f"Valid keys: {', '.join(sorted(ENTRY_KEYS))}.")
    task = entry.get("task")
    if not isinstance(task, str) or not task:
        raise _EntryError("E030", f"{where}['task'] must be the name of a task handler.")
    if "schedule" not in entry:
        raise _EntryError("E032", f"{where} has no 'schedule' (a period or cron expression).")
    try:
        when = parse_when(entry["schedule"])
        timezone = entry.get("timezone") or getattr(when, "timezone", None) or default_tz
        zone(timezone)
    except ImproperlyConfigured as exc:
        raise _EntryError("E032", f"{where}: {exc}") from None
    args, kwargs = entry.get("args", ()), entry.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise _EntryError("E030", f"{where}: 'args' must be a list and 'kwargs' a dict.")
    if reserved := sorted(RESERVED_KWARGS & set(kwargs)):
        raise _EntryError("E030", f"{where}['kwargs'] uses reserved name(s): "
                                  f"{', '.join(reserved)}.",
                          hint="Set the queue with the entry's own 'queue' key.")
    queue = entry.get("queue")
    if queue is not None and not isinstance(queue, str):
        raise _EntryError("E030", f"{where}['queue'] must be a queue name.")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _EntryError("E030", f"{where}['enabled'] must be True or False.")
    try:
        get_handler(task)
    except InvalidTaskError as exc:
        raise _EntryError("E031", f"{where}: {exc}",
                          hint="Use the registered name of a @pgtask handler.") from None
    return Declaration(name=name, task=task, when=when, timezone=timezone, args=tuple(args),
                       kwargs=dict(kwargs), queue=queue, enabled=enabled)


def check() -> list[Problem]:
    """Every problem with the declared schedules; used by ``manage.py check``.

    Beyond :func:`collect`, each run is built once (unsaved), which validates its queue and
    that its arguments are plain JSON.
    """
    declarations, problems = collect()
    for declaration in declarations.values():
        try:
            declaration.build(datetime.now(UTC))
        except InvalidTaskError as exc:
            problems.append(Problem("E034", f"Schedule {declaration.name!r}: {exc}"))
    interval = pgtasks_settings.SCHEDULER_INTERVAL
    for declaration in declarations.values():
        period = getattr(declaration.when, "period", None)
        if (period is not None and isinstance(interval, int | float) and interval > 0
                and period.total_seconds() < interval):
            problems.append(Problem(
                "W030", f"Schedule {declaration.name!r} runs every "
                f"{format_period(period)}, more often than the scheduler looks "
                f"(SCHEDULER_INTERVAL = {interval}s): runs will be late and count as missed.",
                hint="Lower PGTASKS['SCHEDULER_INTERVAL'] or lengthen the period.",
            ))
    return problems


def planned_at(task: Task) -> datetime | None:
    """The planned time of a run a schedule produced (``None`` for other tasks)."""
    metadata = task.metadata if isinstance(task.metadata, dict) else {}
    value = metadata.get("planned_at")
    return datetime.fromisoformat(value) if isinstance(value, str) else None


# -- planning: which runs a due schedule produces -------------------------------------------


@dataclass(frozen=True)
class Plan:
    #: Planned times to enqueue a run for, oldest first (empty when skipped).
    runs: list[datetime]
    #: The schedule's next planned time (``None``: a cron expression that stops matching).
    next_run_at: datetime | None
    #: Whether planned times were missed (the one after ``planned`` had passed as well).
    missed: bool = False
    #: Whether the ``"all"`` policy stopped at :data:`CATCH_UP_LIMIT` and skipped the rest.
    truncated: bool = False


def plan(when: When, tz: ZoneInfo, planned: datetime, now: datetime, policy: str) -> Plan:
    """The runs to produce for a schedule due at ``planned``, seen at database time ``now``.

    On time (the planned time after ``planned`` is still in the future): one run, and the
    next planned time follows ``planned``. Behind (that one has passed as well, so runs were
    missed while no worker was running), by ``policy``:

    - ``"once"``: one run for ``planned`` stands for all the missed ones;
    - ``"skip"``: no run;
    - ``"all"``: one run per missed planned time, oldest first, at most
      :data:`CATCH_UP_LIMIT`.

    In every case the schedule continues on its own chain of planned times: the next one is
    the first of the chain that is later than ``now``, so catching up never shifts it.
    """
    following = when.next_after(planned, tz)
    if following is None or following > now:
        return Plan([planned], following)
    if policy == "skip":
        return Plan([], when.first_after(planned, now, tz), missed=True)
    if policy == "all":
        runs = [planned]
        while following is not None and following <= now and len(runs) < CATCH_UP_LIMIT:
            runs.append(following)
            following = when.next_after(following, tz)
        if following is not None and following <= now:
            return Plan(runs, when.first_after(following, now, tz), missed=True,
                        truncated=True)
        return Plan(runs, following, missed=True)
    return Plan([planned], when.first_after(planned, now, tz), missed=True)


# -- the scheduler job ---------------------------------------------------------------------

STATE_SQL = """
    SELECT name, task_name, spec, timezone, enabled, next_run_at, last_run_at,
           next_run_at <= now()
    FROM pgtasks_schedule WHERE name = ANY(%s)
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
        enabled = EXCLUDED.enabled, updated_at = now(),
        next_run_at = CASE
            WHEN (s.spec, s.timezone) IS DISTINCT FROM (EXCLUDED.spec, EXCLUDED.timezone)
                 OR (EXCLUDED.enabled AND NOT s.enabled)
            THEN EXCLUDED.next_run_at ELSE s.next_run_at END
    WHERE (s.task_name, s.spec, s.timezone, s.enabled)
          IS DISTINCT FROM (EXCLUDED.task_name, EXCLUDED.spec, EXCLUDED.timezone,
                            EXCLUDED.enabled)
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

    @property
    def definition(self) -> tuple[str, str, str, bool]:
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
    if not declarations:
        return []
    rows = _read_state(alias, declarations)
    if _sync(alias, declarations, rows):
        rows = _read_state(alias, declarations)
    created: list[int] = []
    policy = pgtasks_settings.MISSED_RUNS
    for name, declaration in declarations.items():
        row = rows.get(name)
        if (row is None or not row.due or not declaration.enabled
                or row.definition != declaration.row):
            continue
        try:
            created += produce(alias, declaration, policy) or []
        except (DatabaseError, InterfaceError):
            raise
        except Exception as exc:
            # A bad queue or payload (caught by ``manage.py check`` too) concerns this
            # schedule only; the worker loop must not die of it.
            _report(name, f"Schedule {name!r} could not enqueue its run: "
                          f"{type(exc).__name__}: {exc}")
    return created


def database_of(declaration: Declaration) -> str:
    """The database alias that holds the schedule's state and its runs (its queue's)."""
    from django_pgtasks.base.registry import get_handler
    from django_pgtasks.base.routing import database_for_queue

    queue = declaration.queue
    if queue is None:
        try:
            queue = get_handler(declaration.task).queue
        except Exception:  # an unknown task is reported by the checks and at each pass
            queue = None
    return database_for_queue(queue or pgtasks_settings.DEFAULT_QUEUE)


def _read_state(alias: str, declarations: Mapping[str, Declaration]) -> dict[str, _Row]:
    with connections[alias].cursor() as cursor:
        cursor.execute(STATE_SQL, [list(declarations)])
        return {row[0]: _Row(*row) for row in cursor.fetchall()}


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
        _sync(alias, declarations, _read_state(alias, declarations))


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


def declared_names() -> set[str]:
    """Names of the schedules this process declares (for the admin's "declared" column)."""
    return set(collect()[0])


maintenance.register(maintenance.Job(
    name="scheduler",
    interval=lambda: pgtasks_settings.SCHEDULER_INTERVAL,
    run=run_scheduler,
))
