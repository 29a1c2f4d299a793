"""Awaiting a handler's coroutine the way the worker does (``definition/handlers.py``:
``await_handler``, ``TaskHandler.acall``): its time limit and its cancellation cancel it in the
current asyncio task, and nothing of either reaches the caller once the handler is done."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from django_pgtasks.definition.handlers import TaskHandler, await_handler, cancel_signal
from django_pgtasks.exceptions import (
    TaskCancelled,
    TaskTimeoutError,
    UnstorableResultError,
)
from django_pgtasks.models import Task


def row(**fields: Any) -> Task:
    fields.setdefault("args", [])
    fields.setdefault("kwargs", {})
    fields.setdefault("attempt", 1)
    return Task(pk=fields.pop("pk", 7), name="tests.unit.row", **fields)


def handler_of(func: Any, **options: Any) -> TaskHandler:
    return TaskHandler(func=func, name=f"tests.unit.{func.__name__}", **options)


def test_acall_awaits_the_function_with_the_rows_arguments_and_returns_plain_json() -> None:
    async def add(a: int, b: int) -> dict[str, int]:
        await asyncio.sleep(0)
        return {"sum": a + b}

    assert asyncio.run(handler_of(add).acall(row(args=[2], kwargs={"b": 3}), "w")) == {
        "sum": 5}


def test_acall_refuses_a_result_postgresql_cannot_store() -> None:
    async def unstorable() -> object:
        return object()

    with pytest.raises(UnstorableResultError):
        asyncio.run(handler_of(unstorable).acall(row(), "w"))


def test_the_time_limit_cancels_the_coroutine_and_raises_task_timeout_error() -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(TaskTimeoutError, match=r"time limit of 0\.05s and was cancelled"):
        asyncio.run(handler_of(slow, timeout=0.05).acall(row(), "w"))
    assert seen == ["cancelled"]


def test_a_timeout_error_of_the_handlers_own_is_left_as_it_is() -> None:
    async def times_out() -> None:
        raise TimeoutError("the remote API did not answer")

    with pytest.raises(TimeoutError, match="remote API") as raised:
        asyncio.run(handler_of(times_out, timeout=30).acall(row(), "w"))
    assert not isinstance(raised.value, TaskTimeoutError)


def test_a_cancellation_signalled_from_another_thread_cancels_the_coroutine() -> None:
    started = threading.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    task = row()
    threading.Thread(target=lambda: started.wait(10) and cancel_signal(task).set()).start()
    with pytest.raises(TaskCancelled, match="its coroutine was cancelled"):
        asyncio.run(handler_of(waits).acall(task, "w"))


def test_systemexit_of_the_handler_reaches_the_caller_and_the_loop_goes_on() -> None:
    async def exits() -> None:
        raise SystemExit(3)

    async def main() -> str:
        with pytest.raises(SystemExit):
            await handler_of(exits).acall(row(), "w")
        await asyncio.sleep(0)  # the loop still runs
        return "went on"

    assert asyncio.run(main()) == "went on"


def test_a_cancellation_signalled_after_the_handler_ended_does_not_reach_the_caller() -> None:
    async def quick() -> str:
        return "done"

    async def main() -> str:
        task = row()
        result = await await_handler(quick(), task, None)
        cancel_signal(task).set()  # too late: the run is over
        for _ in range(3):  # the loop runs what is due: a cancellation would land here
            await asyncio.sleep(0)
        return result

    assert asyncio.run(main()) == "done"


def test_a_handler_that_swallows_the_cancellation_ends_with_what_it_returns() -> None:
    task = row()

    async def stubborn() -> str:
        cancel_signal(task).set()  # while it runs
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    async def main() -> tuple[str, int]:
        result = await await_handler(stubborn(), task, None)
        return result, asyncio.current_task().cancelling()

    # The caller's task is not left marked as being cancelled.
    assert asyncio.run(main()) == ("finished anyway", 0)


def test_a_cancellation_of_the_callers_task_propagates_as_cancelled_error() -> None:
    async def main() -> int:
        started = asyncio.Event()

        async def waits() -> None:
            started.set()
            await asyncio.Event().wait()

        runner = asyncio.create_task(await_handler(waits(), row(), 30))
        await started.wait()
        runner.cancel()  # the pool's cancellation, not the task's
        with pytest.raises(asyncio.CancelledError):
            await runner
        return runner.cancelling()

    assert asyncio.run(main()) == 1
