"""The schedules this process declares (``@pgtask(schedule=...)``, ``PGTASKS["SCHEDULE"]``),
their checks, and which runs a due schedule produces."""


from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ImproperlyConfigured

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.exceptions import HandlerImportError, InvalidTaskError

if TYPE_CHECKING:
    from django_pgtasks.models import Task

from django_pgtasks.definition.recurrence import (
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


@dataclass(frozen=True)
class Declaration:
    """One schedule: what to run, when, and where. Declared in code, or read from a row made
    in the admin (:func:`django_pgtasks.scheduling.runtime.declaration_of`)."""

    name: str
    task: str
    when: When
    timezone: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    enabled: bool = True
    priority: int | None = None

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

        task = Task.objects.build(self.task, *self.args, queue=self.queue,
                                  priority=self.priority, **self.kwargs)
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
    from django_pgtasks.definition.registry import get_handler, registered_names

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
    from django_pgtasks.definition.registry import get_handler

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
    except (InvalidTaskError, HandlerImportError) as exc:  # the latter: a module of an
        # installed app that does not exist or raises while being imported
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




def declared_names() -> set[str]:
    """Names of the schedules this process declares (for the admin's "declared" column)."""
    return set(collect()[0])
