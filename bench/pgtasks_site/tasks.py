"""The benchmark's handlers: a task that does nothing, so only the queue's own cost shows; tasks
of known length, one that sleeps (bench/pools.py) and one that awaits (bench/pools_async.py)."""

import asyncio

from django_pgtasks import pgtask


@pgtask(name="bench.noop")
def noop() -> None:
    """Does nothing."""


@pgtask(name="bench.async_noop")
async def async_noop() -> None:
    """Does nothing, as a coroutine: the async pool's no-op (bench/pools.py)."""


@pgtask(name="bench.collect", context=True)
def collect(context) -> int:
    """A workflow step that reads how the tasks it waited for ended (bench/workflows.py)."""
    return len(context.parents())


@pgtask(name="bench.sleep")
def sleep(ms: float) -> None:
    """Sleeps ``ms`` milliseconds: a task of known length (bench/pools.py)."""
    import time

    time.sleep(ms / 1000)


@pgtask(name="bench.await_sleep")
async def await_sleep(seconds: float) -> None:
    """Waits ``seconds`` without blocking its event loop: an I/O-bound task
    (bench/pools_async.py)."""
    await asyncio.sleep(seconds)


@pgtask(name="bench.steps", context=True)
def steps(context, count: int, atomic: bool = False) -> int:
    """``count`` durable steps that do nothing but return a number: what a step costs
    (bench/steps.py)."""
    for i in range(count):
        context.step(f"s{i}", int, i, atomic=atomic)
    return count


@pgtask(name="bench.durable_sleep", context=True)
def durable_sleep(context, seconds: float) -> None:
    """Sleeps ``seconds`` durably, holding no thread (bench/durable.py)."""
    context.sleep(seconds)


@pgtask(name="bench.wait_for_event", context=True)
def wait_for_event(context, key: str) -> object:
    """Waits durably for the event ``key`` (bench/durable.py)."""
    return context.wait_for_event(key)
