"""Sample handlers for the periodic-task tests (``tests/integration/test_scheduling.py``).

Deliberately not named ``tasks.py``: nothing here is autodiscovered, and none of these
handlers declares a schedule, so no other test's workers ever produce periodic runs. The tests
declare schedules for them through ``PGTASKS["SCHEDULE"]``, or register a ``schedule=``
handler of their own for the duration of one test.
"""

from __future__ import annotations

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext

from .models import Execution


@pgtask(context=True)
def tick(ctx: TaskContext) -> None:
    """Logs each execution, so that a run executed twice shows up as a duplicate."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


@pgtask
def report(region: str, *, full: bool = False) -> str:
    """Takes arguments, to show that a schedule's args and kwargs reach the handler."""
    return f"{region}:{'full' if full else 'short'}"
