"""Handlers of durable tasks (``context.step()``) for tests/integration/test_steps.py.

Each step's side effect is one ``Execution`` row whose ``worker`` is the step's name: a
step run exactly once leaves exactly one row.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from django_pgtasks import pgtask
from django_pgtasks.database.sessions import open_connection
from django_pgtasks.definition.registry import TaskContext

from .models import Execution


def effect(ctx: TaskContext, name: str) -> dict[str, Any]:
    """A step's side effect: one row; returns what the step keeps (which claim of the task
    ran it)."""
    Execution.objects.create(task_id=ctx.task_id, attempt=ctx.attempt, worker=name)
    return {"step": name, "claim": ctx.task.claims}


def _no_backoff(attempt: int) -> float:
    return 0.0


@pgtask(context=True, max_attempts=3, backoff=_no_backoff)
def three_steps(ctx: TaskContext, fail_after: str = "", atomic: bool = False) -> list:
    """Steps a, b, c; the first attempt fails after step ``fail_after``."""
    results = []
    for name in ("a", "b", "c"):
        results.append(ctx.step(name, effect, ctx, name, atomic=atomic))
        if name == fail_after and ctx.attempt == 1:
            raise RuntimeError(f"the first attempt fails after step {name}")
    return results


@pgtask(context=True, max_attempts=3, backoff=_no_backoff)
def fails_inside_an_atomic_step(ctx: TaskContext) -> Any:
    """Step "write" writes its row, then (first attempt) fails before its checkpoint."""
    def write() -> str:
        effect(ctx, "write")
        if ctx.attempt == 1:
            raise RuntimeError("fails inside the step, after its write")
        return "written"

    return ctx.step("write", write, atomic=True)


@pgtask(context=True, max_attempts=1)
def same_step_twice(ctx: TaskContext) -> None:
    ctx.step("once", effect, ctx, "once")
    ctx.step("once", effect, ctx, "once")


@pgtask(context=True, max_attempts=3)
def step_returns(ctx: TaskContext, what: str) -> Any:
    """A step that returns ``what`` names: a tuple, an unstorable object, too large a value."""
    values = {"tuple": lambda: (1, "two", [3]), "object": lambda: object(),
              "nul": lambda: "a\x00b"}
    return ctx.step("value", values[what])


@pgtask(context=True, max_attempts=1)
def loses_its_task(ctx: TaskContext, atomic: bool) -> None:
    """A step during which the task is taken away (as a rescue would: another worker's
    lease, committed on a connection of its own)."""
    def taken_away() -> str:
        effect(ctx, "taken")
        with open_connection(ctx.task._state.db or "default") as conn:
            conn.execute("UPDATE pgtasks_task SET locked_by = 'elsewhere', claims = claims + 1 "
                         "WHERE id = %s", [ctx.task_id])
        return "done"

    ctx.step("taken", taken_away, atomic=atomic)


@pgtask(context=True, max_attempts=3)
def dies_in_the_middle(ctx: TaskContext, where: str, steps: int = 3) -> list:
    """Atomic steps s0..s{steps-1}. On the task's first claim, its worker process is killed
    (SIGKILL) in the middle of step s1 after its write (``where="inside"``: the step's
    transaction never commits) or between s1 and s2 (``"between"``)."""
    first_claim = ctx.task.claims == 1

    def run(name: str) -> dict[str, Any]:
        kept = effect(ctx, name)
        if name == "s1" and where == "inside" and first_claim:
            os.kill(os.getpid(), signal.SIGKILL)
        return kept

    results = []
    for i in range(steps):
        results.append(ctx.step(f"s{i}", run, f"s{i}", atomic=True))
        if i == 1 and where == "between" and first_claim:
            os.kill(os.getpid(), signal.SIGKILL)
    return results


@pgtask(context=True, max_attempts=10)
def many_atomic_steps(ctx: TaskContext, steps: int) -> int:
    """``steps`` atomic steps, each with its effect: the chaos test kills its workers."""
    for i in range(steps):
        ctx.step(f"s{i}", effect, ctx, f"s{i}", atomic=True)
    return steps


@pgtask(context=True)
def changes_under_its_key(ctx: TaskContext) -> int:
    """Step "a"; on its first claim, enqueued again under its own key while it runs (its
    source changed): the re-run starts afresh, step "a" included."""
    from django_pgtasks.models import Task

    ctx.step("a", effect, ctx, "a")
    if ctx.task.claims == 1:
        Task.objects.enqueue(changes_under_its_key, key=ctx.task.key)
    return ctx.task.claims


async def async_effect(ctx: TaskContext, name: str) -> dict[str, Any]:
    """:func:`effect`, awaited."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(effect)(ctx, name)


@pgtask(context=True, max_attempts=3, backoff=_no_backoff)
async def async_steps(ctx: TaskContext, fail_after: str = "") -> list:
    """An async handler's steps: a awaited, b atomic (a plain function on the database
    thread), c a plain function; the first attempt fails after step ``fail_after``."""
    results = [await ctx.astep("a", async_effect, ctx, "a")]
    if fail_after == "a" and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after step a")
    results.append(await ctx.astep("b", effect, ctx, "b", atomic=True))
    if fail_after == "b" and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails after step b")
    results.append(await ctx.astep("c", effect, ctx, "c"))
    return results


@pgtask(context=True, max_attempts=1)
async def async_atomic_coroutine(ctx: TaskContext) -> Any:
    return await ctx.astep("x", async_effect, ctx, "x", atomic=True)
