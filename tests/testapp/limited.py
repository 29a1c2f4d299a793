"""Handlers for the tests of concurrency keys, rate limits and pauses.

They live in the test app so that worker *processes* can import them by name. Concurrency is
measured by a gauge in the database, one row per name: a handler raises it by one when it
starts and lowers it when it ends, each in its own autocommitted ``UPDATE``, and ``peak``
keeps the highest value it ever reached. The row lock makes every change atomic across
threads and processes, so ``peak`` is the true largest number of handlers that ran at once.
"""

from __future__ import annotations

from django.db import connection

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext

from .workload import pause

GAUGE_TABLE = "tests_limit_gauge"


def create_gauge_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {GAUGE_TABLE} "
                       f"(name text PRIMARY KEY, now int NOT NULL DEFAULT 0, "
                       f"peak int NOT NULL DEFAULT 0, runs int NOT NULL DEFAULT 0)")
        cursor.execute(f"TRUNCATE {GAUGE_TABLE}")


def gauges() -> dict[str, tuple[int, int, int]]:
    """``{name: (now, peak, runs)}``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT name, now, peak, runs FROM {GAUGE_TABLE}")
        return {name: (now, peak, runs) for name, now, peak, runs in cursor.fetchall()}


@pgtask(max_attempts=1)
def hold(gauge: str, seconds: float = 0.02) -> None:
    """Raise the gauge, hold the shared resource for a moment, lower the gauge."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {GAUGE_TABLE} AS g (name, now, peak, runs) VALUES (%s, 1, 1, 1) "
            f"ON CONFLICT (name) DO UPDATE SET now = g.now + 1, "
            f"peak = greatest(g.peak, g.now + 1), runs = g.runs + 1",
            [gauge],
        )
    try:
        pause(seconds)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {GAUGE_TABLE} SET now = now - 1 WHERE name = %s", [gauge])


@pgtask(max_attempts=1, concurrency_key=lambda gauge, seconds=0.02: f"gauge:{gauge}",
        concurrency_limit=2)
def hold_keyed_by_default(gauge: str, seconds: float = 0.02) -> None:
    """:func:`hold` with a concurrency key derived from its argument by the handler."""
    hold(gauge, seconds)


@pgtask(max_attempts=1, context=True)
def record_start(ctx: TaskContext) -> int:
    """Does nothing but run; the test reads the task's started_at."""
    return ctx.task_id
