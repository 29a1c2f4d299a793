"""Handlers of durable sleeps and waits for events, for tests/integration/test_durable_waits.py.

Each step's side effect is one ``Execution`` row (tests.testapp.durable.effect): a step run
exactly once leaves exactly one row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext
from django_pgtasks.exceptions import EventTimeout

from .durable import async_effect, effect


@pgtask(context=True, max_attempts=1)
def sleeps_between_steps(ctx: TaskContext, seconds: float) -> list:
    """Step a, a durable sleep, step b."""
    first = ctx.step("a", effect, ctx, "a")
    ctx.sleep(seconds)
    return [first, ctx.step("b", effect, ctx, "b")]


@pgtask(context=True, max_attempts=1)
def sleeps_until_later(ctx: TaskContext, seconds: float) -> str:
    """A sleep until ``seconds`` after *this run's* clock: only the first run's time counts."""
    ctx.sleep_until(timezone.now() + timedelta(seconds=seconds))
    return ctx.step("after", effect, ctx, "after")["step"]


@pgtask(context=True, max_attempts=1)
def sleeps_until(ctx: TaskContext, when: str) -> str:
    ctx.sleep_until(datetime.fromisoformat(when))
    return "awake"


@pgtask(context=True, max_attempts=1)
def waits_for_event(ctx: TaskContext, key: str, timeout: float | None = None) -> Any:
    """Step "before", the wait, step "after"; returns the event's payload."""
    ctx.step("before", effect, ctx, "before")
    payload = ctx.wait_for_event(key, timeout)
    ctx.step("after", effect, ctx, "after")
    return payload


@pgtask(context=True, max_attempts=2)
def waits_or_times_out(ctx: TaskContext, key: str, timeout: float, fail_after: bool = False) -> Any:
    """A wait with a timeout, caught; the first attempt fails after it if ``fail_after``."""
    try:
        outcome = {"payload": ctx.wait_for_event(key, timeout)}
    except EventTimeout as exc:
        outcome = {"timeout": str(exc)}
    if fail_after and ctx.attempt == 1:
        raise RuntimeError("fails after the wait")
    return outcome


@pgtask(context=True, max_attempts=1)
def waits_twice(ctx: TaskContext, key: str) -> None:
    ctx.wait_for_event(key)
    ctx.wait_for_event(key)


@pgtask(context=True, max_attempts=1)
async def async_sleeps_and_waits(ctx: TaskContext, key: str, seconds: float) -> Any:
    """An async handler: a step, a durable sleep, a wait for ``key``, a step."""
    await ctx.astep("a", async_effect, ctx, "a")
    await ctx.asleep(seconds)
    payload = await ctx.await_event(key)
    await ctx.astep("b", async_effect, ctx, "b")
    return payload


@pgtask(context=True, max_attempts=1)
def sleeps_once(ctx: TaskContext, seconds: float) -> str:
    """Only a durable sleep (for the tests of many sleeping tasks)."""
    ctx.sleep(seconds)
    return "slept"


@pgtask(context=True, max_attempts=1)
def waits_only(ctx: TaskContext, key: str) -> Any:
    """Only a wait (for the tests of many waiting tasks)."""
    return ctx.wait_for_event(key)


@pgtask(max_attempts=1)
def nothing() -> None:
    """A no-op task."""


@pgtask(context=True, max_attempts=2)
def reports_progress(ctx: TaskContext, items: int, fail: bool = False) -> int:
    """Works through ``items``, reporting its progress and logging; fails at the end of the
    first attempt if ``fail``."""
    import logging

    project_logger = logging.getLogger("tests.project")
    ctx.logger.info("starting %s items", items)
    for done in range(1, items + 1):
        ctx.progress(done, items, f"item {done}")
    project_logger.warning("a record of the project's own logger")
    logging.getLogger("django_pgtasks.worker").warning("not kept: the queue's own logger")
    project_logger.debug("not kept: below the level")
    if fail and ctx.attempt == 1:
        raise RuntimeError("fails after its progress")
    return items


@pgtask(context=True, max_attempts=1)
def logs_a_lot(ctx: TaskContext, records: int) -> None:
    for i in range(records):
        ctx.logger.info("record %s %s", i, "x\x00y")


@pgtask(context=True, max_attempts=1)
async def async_reports(ctx: TaskContext) -> str:
    ctx.logger.info("async record")
    await ctx.aprogress(1, 2, "half")
    await ctx.aprogress(2, 2, "all")
    return "done"


@pgtask(context=True, max_attempts=1)
def reports_until_cancelled(ctx: TaskContext) -> None:
    """Reports its progress every 20 ms until cancelled."""
    done = 0
    while not ctx.wait(0.02):
        done += 1
        ctx.progress(done, None, "still going")
    ctx.raise_if_cancelled()


@pgtask(context=True, max_attempts=1, atomic=True)
def sleeps_in_an_atomic_handler(ctx: TaskContext) -> None:
    ctx.sleep(60)


@pgtask(context=True, max_attempts=1)
def waits_in_a_transaction(ctx: TaskContext) -> None:
    from django.db import transaction

    with transaction.atomic():
        ctx.wait_for_event("in-a-transaction")


@pgtask(max_attempts=1)
def child(i: int) -> int:
    """A child of a fan-out: every seventh fails."""
    if i % 7 == 0:
        raise RuntimeError(f"child {i} fails")
    return i


@pgtask(context=True, max_attempts=2, backoff=lambda attempt: 0.0)
def fans_out(ctx: TaskContext, n: int, fail_after: bool = False) -> dict:
    """Runs ``n`` children and waits for them without holding a thread; the first attempt
    fails after the wait if ``fail_after`` (a retry must not enqueue them again)."""
    ctx.step("before", effect, ctx, "before")
    outcome = ctx.run_tasks("children", (child.build(i) for i in range(n)))
    if fail_after and ctx.attempt == 1:
        raise RuntimeError("fails after its children")
    return outcome["ended"]


@pgtask(context=True, max_attempts=1)
def loses_its_connection_before_its_last_report(ctx: TaskContext) -> str:
    """Reports its progress (written as the run ends), then its thread's session is
    terminated from another one: the last report cannot be written."""
    from django.db import connections

    from django_pgtasks.database.sessions import open_connection

    ctx.progress(1, 2, "half")
    alias = ctx.task._state.db or "default"
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with open_connection(alias) as other:
        other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
    return "done"
