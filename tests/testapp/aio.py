"""Handlers for the async pool's tests (tests/integration/test_async_pool.py): ``async def``
handlers that record where and how many at once they ran, and sync ones beside them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from asgiref.sync import sync_to_async

from django_pgtasks import FatalError, pgtask
from django_pgtasks.definition.registry import TaskContext
from django_pgtasks.exceptions import Snooze, TaskCancelled

from .models import Execution
from .workload import wait_on_io


class Gauge:
    """How many handlers run at once, and the most seen (thread-safe: the thread pool runs
    async handlers on several threads at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        #: The names of the threads the handlers ran on.
        self.threads: set[str] = set()

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.threads.add(threading.current_thread().name)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1

    def reset(self) -> None:
        with self._lock:
            self.now = self.peak = 0
            self.threads = set()


#: The ``sleeps`` handlers running now, and the most that ran at once.
sleepers = Gauge()
#: Ids of the tasks whose coroutine saw its CancelledError (in-process workers only).
cancelled: list[int] = []


@pgtask
async def sleeps(seconds: float) -> None:
    """An I/O-bound task: waits ``seconds``."""
    sleepers.enter()
    try:
        await wait_on_io(seconds)
    finally:
        sleepers.leave()


#: Opened by a test to let the ``queries`` handlers finish.
gate = threading.Event()


@pgtask(context=True)
async def queries(ctx: TaskContext) -> int:
    """Uses the async ORM around a wait: a row written, a wait until the test opens the
    :data:`gate`, a count."""
    sleepers.enter()
    try:
        await Execution.objects.acreate(task_id=ctx.task_id, worker=ctx.worker_id,
                                        attempt=ctx.attempt)
        while not gate.is_set():
            await wait_on_io(0.02)
        return await Execution.objects.filter(task_id=ctx.task_id).acount()
    finally:
        sleepers.leave()


@pgtask
async def where() -> str:
    """The name of the thread it ran on."""
    return threading.current_thread().name


@pgtask
def where_sync() -> str:
    """The name of the thread it ran on (a sync handler)."""
    return threading.current_thread().name


@pgtask(atomic=True, context=True)
async def where_atomic(ctx: TaskContext) -> str:
    """An exactly-once async handler: its write commits with its completion."""
    await sync_to_async(Execution.objects.create)(task_id=ctx.task_id, attempt=ctx.attempt)
    return threading.current_thread().name


@pgtask(context=True, timeout=0.3, max_attempts=2)
async def overruns(ctx: TaskContext) -> None:
    """Waits far past its time limit; notes that its coroutine was cancelled."""
    await sync_to_async(Execution.objects.create)(task_id=ctx.task_id, attempt=ctx.attempt)
    try:
        await asyncio.Event().wait()  # until cancelled
    except asyncio.CancelledError:
        cancelled.append(ctx.task_id)
        raise


@pgtask(context=True, timeout=0.2, max_attempts=1)
async def ignores_its_time_limit(ctx: TaskContext) -> None:
    """Swallows the cancellation of its time limit and waits on; stops when cancelled
    again."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()  # until its time limit cancels it
    try:
        await asyncio.Event().wait()  # until cancelled again
    except asyncio.CancelledError:
        cancelled.append(ctx.task_id)
        raise


@pgtask(context=True, max_attempts=3, fatal=(LookupError,))
async def behaves(ctx: TaskContext, how: str) -> Any:
    """Ends the way ``how`` says, as a handler can: returns, raises (an error, a fatal one, a
    declared fatal one, ``SystemExit``), snoozes, cancels itself, returns what cannot be
    stored, or enqueues a next stage."""
    await asyncio.sleep(0)  # a coroutine that yields to its loop
    if how == "returns":
        return {"attempt": ctx.attempt}
    if how == "raises":
        raise RuntimeError(f"attempt {ctx.attempt} failed")
    if how == "fatal":
        raise FatalError("can never succeed")
    if how == "declared_fatal":
        raise KeyError("missing")
    if how == "exits":
        raise SystemExit(3)
    if how == "snoozes":
        if ctx.attempt == 1 and not ctx.task.metadata.get("snoozes"):
            ctx.snooze(0)
        return "woke up"
    if how == "snoozes_by_raising":
        raise Snooze(3600)
    if how == "cancels":
        raise TaskCancelled("changed my mind")
    if how == "unstorable":
        return object()
    if how == "then":
        ctx.then(behaves, "returns")
        return "first stage"
    raise ValueError(how)
