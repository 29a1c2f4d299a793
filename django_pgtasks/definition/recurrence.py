"""Schedules as values: ``every(...)`` periods and ``cron(...)`` expressions, and the calendar
arithmetic that steps from one planned time to the next in a time zone.

Pure: no table, no registry; :mod:`django_pgtasks.scheduling.job` runs them.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    pass

logger = logging.getLogger("django_pgtasks.scheduling")

#: Values of ``PGTASKS["MISSED_RUNS"]``; see :func:`plan`.
MISSED_RUNS_POLICIES = ("once", "skip", "all")
#: Most runs one catch-up enqueues under the ``"all"`` policy; older missed times beyond it
#: are skipped, so a schedule that was stopped for a long time cannot flood the queue.
CATCH_UP_LIMIT = 100
#: Keys a ``PGTASKS["SCHEDULE"]`` entry may have.
ENTRY_KEYS = frozenset({"task", "schedule", "args", "kwargs", "queue", "timezone", "enabled"})
#: Keyword arguments that ``Task.objects.build()`` takes as options, not as the handler's.
RESERVED_KWARGS = frozenset({"queue", "priority", "run_after", "delay", "max_attempts",
                             "using"})
#: The columns are ``CharField(max_length=255)`` / ``(max_length=64)``.
MAX_NAME_LENGTH = 255
MAX_TIMEZONE_LENGTH = 64

#: Shorthands that classic cron accepts and cronsim does not.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


# -- when: fixed periods and cron expressions -----------------------------------------------


@dataclass(frozen=True)
class Every:
    """A fixed period: runs are exactly ``period`` apart (elapsed time, not wall-clock time).

    The first run of a new schedule is due at once; each next one is planned ``period`` after
    the previous planned time. A period is an exact duration: ``every(days=1)`` moves by an
    hour of local time across a DST change. Use :class:`Cron` for "every day at 09:00".
    """

    period: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.period, timedelta):
            raise ImproperlyConfigured(
                f"A schedule's period must be a timedelta, not {self.period!r}."
            )
        if self.period <= timedelta(0):
            raise ImproperlyConfigured(
                f"A schedule's period must be positive, not {self.period.total_seconds():g} "
                f"seconds."
            )

    @property
    def spec(self) -> str:
        """The text stored in ``pgtasks_schedule.spec``, e.g. ``"every 1h30m"``."""
        return f"every {format_period(self.period)}"

    def next_after(self, planned: datetime, tz: ZoneInfo) -> datetime | None:
        return planned + self.period

    def first(self, now: datetime, tz: ZoneInfo) -> datetime | None:
        return now

    def first_after(self, planned: datetime, now: datetime, tz: ZoneInfo) -> datetime | None:
        """The first time of the chain ``planned + k * period`` that is later than ``now``."""
        if planned > now:
            return planned
        return planned + ((now - planned) // self.period + 1) * self.period

    def restart(self, last_planned: datetime | None, now: datetime,
                tz: ZoneInfo) -> datetime | None:
        """The next run after the spec changed or the schedule was enabled again."""
        if last_planned is None:
            return now
        return max(last_planned + self.period, now)


@dataclass(frozen=True)
class Cron:
    """A cron expression evaluated in the schedule's time zone (Debian cron semantics).

    Five fields (minute hour day-of-month month day-of-week), or six with seconds first, or
    one of ``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``. ``timezone`` (a
    zoneinfo name) defaults to ``settings.TIME_ZONE``, or UTC. Across DST changes it behaves
    like Debian's cron: a fixed local time that does not exist that day runs right after
    the clock jumps forward, one that exists twice runs once.
    """

    expression: str
    timezone: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ImproperlyConfigured(
                f"A cron expression must be a string, not {self.expression!r}."
            )
        expression = " ".join(self.expression.split())
        expression = CRON_ALIASES.get(expression.lower(), expression)
        object.__setattr__(self, "expression", expression)
        _validate_cron(expression)
        if self.timezone is not None:
            zone(self.timezone)

    @property
    def spec(self) -> str:
        return self.expression

    def next_after(self, planned: datetime, tz: ZoneInfo) -> datetime | None:
        """The first match strictly after ``planned``; ``None`` if none in the next 50 years."""
        cronsim = _cronsim()
        try:
            local = next(cronsim.CronSim(self.expression, planned.astimezone(tz)))
        except StopIteration:
            return None
        return local.astimezone(UTC)

    def first(self, now: datetime, tz: ZoneInfo) -> datetime | None:
        return self.next_after(now, tz)

    def first_after(self, planned: datetime, now: datetime, tz: ZoneInfo) -> datetime | None:
        # Cron times are a fixed set, so the first one after ``now`` is also the first one
        # of the chain that starts at ``planned``.
        return self.next_after(max(planned, now), tz)

    def restart(self, last_planned: datetime | None, now: datetime,
                tz: ZoneInfo) -> datetime | None:
        return self.next_after(now, tz)


When = Every | Cron


def every(
    period: timedelta | float | None = None, /, *, days: float = 0, hours: float = 0,
    minutes: float = 0, seconds: float = 0,
) -> Every:
    """A fixed period: ``every(minutes=5)``, ``every(timedelta(hours=1))``, ``every(30)``."""
    if period is not None:
        if days or hours or minutes or seconds:
            raise ImproperlyConfigured("Give every() a period or keyword units, not both.")
        return Every(_as_period(period))
    return Every(timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds))


def cron(expression: str, *, timezone: str | None = None) -> Cron:
    """A cron expression, e.g. ``cron("0 3 * * *", timezone="Europe/Paris")``."""
    return Cron(expression, timezone)


def parse_when(value: Any) -> When:
    """Turn a ``schedule=`` value into :class:`Every` or :class:`Cron`.

    Accepted: an :class:`Every` or :class:`Cron`, a ``timedelta`` or a number of seconds (a
    fixed period), or a string (a cron expression). Anything else, an invalid cron
    expression or a period that is not positive raises ``ImproperlyConfigured``.
    """
    if isinstance(value, Every | Cron):
        return value
    if isinstance(value, str):
        return Cron(value)
    return Every(_as_period(value))


#: A period as :attr:`Every.spec` writes it: ``every 1d2h30m``, ``every 90s``, ``every 0.5s``.
PERIOD_SPEC = re.compile(r"every\s+((?:\d+(?:\.\d+)?\s*[dhms]\s*)+)", re.IGNORECASE)
_PERIOD_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])", re.IGNORECASE)
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_spec(spec: str) -> When:
    """The schedule a stored or typed ``spec`` describes: ``every <period>`` (as
    :attr:`Every.spec` writes it, e.g. ``every 1h30m``) or a cron expression. Raises
    ``ImproperlyConfigured`` for anything else."""
    if not isinstance(spec, str):
        raise ImproperlyConfigured(f"A schedule must be text, not {spec!r}.")
    text = spec.strip()
    period = PERIOD_SPEC.fullmatch(text)
    if period:
        units: dict[str, float] = {}
        for number, unit in _PERIOD_PART.findall(period[1]):
            name = _UNITS[unit.lower()]
            units[name] = units.get(name, 0.0) + float(number)
        try:
            return Every(timedelta(**units))
        except OverflowError:
            raise ImproperlyConfigured(f"The period of {spec!r} is too long.") from None
    if text.lower().startswith("every"):
        raise ImproperlyConfigured(
            f"{spec!r} is not a period: write it as 'every 1d2h30m', 'every 90s' (days, "
            f"hours, minutes, seconds), or use a cron expression.")
    return Cron(text)


def _as_period(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise ImproperlyConfigured(
        f"A schedule must be a period (timedelta, seconds or every(...)) or a cron "
        f"expression (a string or cron(...)), not {value!r}."
    )


def format_period(period: timedelta) -> str:
    """``timedelta(hours=1, minutes=30)`` → ``"1h30m"``; fractions of a second kept."""
    days, rest = divmod(period, timedelta(days=1))
    hours, rest = divmod(rest, timedelta(hours=1))
    minutes, rest = divmod(rest, timedelta(minutes=1))
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    if rest or not parts:
        parts.append(f"{rest.total_seconds():g}s")
    return "".join(parts)


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError as exc:
        raise ImproperlyConfigured(
            "Cron schedules need the cronsim package, which django-pgtasks depends on; "
            "install it with `pip install cronsim` (or reinstall django-pgtasks)."
        ) from exc
    return cronsim


@functools.lru_cache(maxsize=256)
def _validate_cron(expression: str) -> None:
    """Raise ``ImproperlyConfigured`` unless ``expression`` parses and ever matches."""
    cronsim = _cronsim()
    start = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        next(cronsim.CronSim(expression, start))
    except cronsim.CronSimError as exc:
        raise ImproperlyConfigured(f"Invalid cron expression {expression!r}: {exc}.") from None
    except StopIteration:
        raise ImproperlyConfigured(
            f"The cron expression {expression!r} never matches."
        ) from None


@functools.lru_cache(maxsize=64)
def zone(name: str) -> ZoneInfo:
    """The zoneinfo time zone ``name``; ``ImproperlyConfigured`` if there is no such zone."""
    if not isinstance(name, str) or not name or len(name) > MAX_TIMEZONE_LENGTH:
        raise ImproperlyConfigured(f"Invalid time zone {name!r}.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"Unknown time zone {name!r}.") from None


def default_timezone() -> str:
    from django.conf import settings

    return getattr(settings, "TIME_ZONE", None) or "UTC"


# -- declarations -------------------------------------------------------------------------
