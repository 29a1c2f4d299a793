"""Periodic tasks: schedules declared in code produce runs, each planned run exactly once.

:mod:`django_pgtasks.definition.recurrence` holds the schedules as values and their calendar
arithmetic (pure, imported by the registry at definition time);
:mod:`.declarations` collects and checks the declared schedules and plans their runs;
:mod:`.job` is the scheduler job the workers run.
"""

from django_pgtasks.definition.recurrence import (
    MISSED_RUNS_POLICIES,
    Cron,
    Every,
    When,
    cron,
    every,
    format_period,
    parse_when,
)
from django_pgtasks.scheduling.declarations import (
    Declaration,
    Plan,
    Problem,
    collect,
    declared_names,
    plan,
    planned_at,
)
from django_pgtasks.scheduling.job import produce, run_scheduler, sync

__all__ = [
    "MISSED_RUNS_POLICIES", "Cron", "Declaration", "Every", "Plan", "Problem", "When",
    "collect", "cron", "declared_names", "every", "format_period", "parse_when", "plan",
    "planned_at", "produce", "run_scheduler", "sync",
]
