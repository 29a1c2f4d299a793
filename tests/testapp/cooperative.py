"""Handlers for the cancellation, snooze and wait tests (importable by worker processes).

Each one logs an Execution row as soon as it starts, so a test (in this process or another)
knows the handler is running before it cancels it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from asgiref.sync import sync_to_async

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext
from django_pgtasks.exceptions import Snooze

from .models import Execution
from .workload import pause, wait_for_gate

#: Seconds a handler waits for a cancellation that a test is about to request.
LONG = 600.0
#: Ids of tasks whose coroutine saw its CancelledError (in-process workers only).
coroutines_cancelled: list[int] = []


def _log(ctx: TaskContext, worker: str | None = None) -> None:
    Execution.objects.create(task_id=ctx.task_id, worker=worker or ctx.worker_id,
                             attempt=ctx.attempt)


@pgtask(context=True, max_attempts=3)
def stoppable(ctx: TaskContext) -> str:
    """Works (sleeps) until cancelled, then stops by raising TaskCancelled."""
    _log(ctx)
    ctx.wait(LONG)
    ctx.raise_if_cancelled()
    return "never cancelled"


@pgtask(context=True, max_attempts=3)
def polls_should_stop(ctx: TaskContext) -> str:
    """A busy loop that checks should_stop() between units of work."""
    import time

    _log(ctx)
    deadline = time.monotonic() + LONG
    while time.monotonic() < deadline:
        if ctx.should_stop():
            ctx.raise_if_cancelled()
        pause(0.01)  # a unit of work
    return "never cancelled"


@pgtask(context=True, max_attempts=3)
def ignores_cancel(ctx: TaskContext) -> str:
    """Sees the cancellation, and finishes its work anyway."""
    _log(ctx)
    seen = ctx.wait(LONG)
    return f"finished anyway (saw the cancellation: {seen})"


@pgtask(context=True, timeout=4, max_attempts=3)
def runs_on_into_its_time_limit(ctx: TaskContext, gate: str) -> str:
    """Sees the cancellation, then runs on (until the file ``gate`` exists) into its 4 s
    time limit."""
    _log(ctx)
    if ctx.wait(LONG):
        _log(ctx, "saw the cancellation")
    wait_for_gate(gate)
    return "finished"


@pgtask(context=True, max_attempts=3)
def fails_after_cancel(ctx: TaskContext) -> None:
    """Stops with an ordinary error once cancelled."""
    _log(ctx)
    ctx.wait(LONG)
    raise RuntimeError("cleanup failed while stopping")


@pgtask(context=True, max_attempts=3)
async def async_stoppable(ctx: TaskContext) -> str:
    """Awaits forever; cancellation cancels its coroutine. The log row is written inside the
    ``try``: the test cancels once it sees the row, which may be before the coroutine has
    resumed from that await."""
    try:
        await sync_to_async(_log)(ctx)
        await asyncio.sleep(LONG)
    except asyncio.CancelledError:
        coroutines_cancelled.append(ctx.task_id)
        raise
    return "never cancelled"


@pgtask(context=True, max_attempts=1)
def snoozes(ctx: TaskContext, times: int, seconds: float) -> int:
    """Snoozes ``times`` times for ``seconds`` each, then returns how often it snoozed."""
    _log(ctx)
    done = ctx.task.metadata.get("snoozes", 0)
    if done < times:
        ctx.snooze(seconds)
    return done


@pgtask(max_attempts=1)
def snoozes_by_raising(minutes: int) -> None:
    raise Snooze(timedelta(minutes=minutes))


@pgtask(context=True, max_attempts=1)
def snoozes_until_cancelled(ctx: TaskContext) -> None:
    """Snoozes once cancelled: the cancellation wins."""
    _log(ctx)
    ctx.wait(LONG)
    ctx.snooze(0)


@pgtask(context=True)
def quick(ctx: TaskContext, value: int) -> int:
    _log(ctx)
    return value * 2


@pgtask(context=True)
def slow_double(ctx: TaskContext, value: int, seconds: float) -> int:
    _log(ctx)
    pause(seconds)
    return value * 2


@pgtask(context=True)
def gated_double(ctx: TaskContext, value: int, gate: str) -> int:
    """Doubles ``value`` once the file ``gate`` exists."""
    _log(ctx)
    wait_for_gate(gate)
    return value * 2
