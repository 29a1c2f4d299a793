"""The async pool (``worker/pools/coroutines.py``) keeps count of what runs on its loop and
on its threads, without a database: a stand-in executor runs the tasks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskHandler
from django_pgtasks.models import Task
from django_pgtasks.worker.pools import connection_holders
from django_pgtasks.worker.pools.coroutines import (
    SYNC_THREADS,
    AsyncPool,
    runs_on_loop,
    sync_threads,
)
from tests.helpers import wait_until


class Gates:
    """A stand-in executor: each task runs until its gate opens (:meth:`open`); where each
    one ran, and which coroutines were cancelled."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        #: The coroutines' gates, opened on their loop.
        self.events: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self.ran: dict[int, str] = {}
        self.cancelled: list[int] = []

    def gate(self, pk: int) -> threading.Event:
        return self.gates.setdefault(pk, threading.Event())

    def open(self, pk: int) -> None:
        self.gate(pk).set()
        if pk in self.events:  # else the coroutine sees the gate open when it starts
            loop, event = self.events[pk]
            with contextlib.suppress(RuntimeError):  # its loop is closed: it ended
                loop.call_soon_threadsafe(event.set)

    async def execute_async(self, task: Task) -> None:
        event = asyncio.Event()
        self.events[task.pk] = (asyncio.get_running_loop(), event)
        self.ran[task.pk] = threading.current_thread().name
        try:
            if not self.gate(task.pk).is_set():
                await event.wait()
        except asyncio.CancelledError:
            self.cancelled.append(task.pk)
            raise

    def execute(self, task: Task) -> None:
        self.ran[task.pk] = threading.current_thread().name
        self.gate(task.pk).wait(30)


@pytest.fixture
def names(temporary_handlers: None) -> dict[str, str]:
    async def on_loop() -> None:
        """An async def handler."""

    def on_thread() -> None:
        """A sync handler."""

    return {"async": pgtask(name="tests.unit.on_loop")(on_loop).name,
            "sync": pgtask(name="tests.unit.on_thread")(on_thread).name}


@pytest.fixture
def pool() -> Iterator[Callable[..., AsyncPool]]:
    """Make async pools running a :class:`Gates`; every gate opens and every pool stops at
    the end of the test."""
    made: list[tuple[AsyncPool, Gates]] = []

    def make(size: int, executor: Gates, threads: int | None = None) -> AsyncPool:
        made.append((AsyncPool(size, executor, threading.Event(),  # type: ignore[arg-type]
                               threads=threads), executor))
        return made[-1][0]

    yield make
    for p, executor in made:
        for pk in list(executor.gates):
            executor.open(pk)
        p.terminate()


def test_async_tasks_run_on_the_loop_at_most_size_at_once_sync_ones_on_threads(
        names: dict[str, str], pool: Any) -> None:
    executor = Gates()
    p = pool(2, executor, threads=1)
    for pk in (1, 2, 3):
        p.submit(Task(pk=pk, name=names["async"]))
    p.submit(Task(pk=9, name=names["sync"]))
    wait_until(lambda: {1, 2, 9} <= set(executor.ran), timeout=10, what="three to start")
    assert (p.busy, p.started, p.ids()) == (4, 3, {1, 2, 3, 9})
    assert executor.ran[1] == executor.ran[2] == "pgtasks-loop"
    assert executor.ran[9] != "pgtasks-loop"
    assert 3 not in executor.ran  # waits for a slot
    executor.open(1)
    wait_until(lambda: 3 in executor.ran, timeout=10, what="the third to take the slot")
    assert p.get(1) is None
    assert p.get(3).pk == 3
    for pk in (2, 3, 9):
        executor.open(pk)
    wait_until(lambda: p.busy == 0, timeout=10, what="every task to end")
    p.shutdown()


def test_waiting_tasks_are_taken_back_and_never_run(names: dict[str, str], pool: Any) -> None:
    executor = Gates()
    p = pool(1, executor)
    for pk in (1, 2, 3):
        p.submit(Task(pk=pk, name=names["async"]))
    wait_until(lambda: 1 in executor.ran, timeout=10, what="the first to start")
    assert sorted(t.pk for t in p.take_waiting()) == [2, 3]
    assert (p.busy, p.ids()) == (1, {1})
    executor.open(1)
    wait_until(lambda: p.busy == 0, timeout=10, what="the first to end")
    p.shutdown()
    assert set(executor.ran) == {1}


def test_an_overdue_coroutine_is_reported_then_abandoned_cancelled_and_its_slot_freed(
        names: dict[str, str], pool: Any) -> None:
    executor = Gates()
    p = pool(1, executor)
    p.submit(Task(pk=1, name=names["async"]), limit=0.05)
    p.submit(Task(pk=2, name=names["async"]))
    wait_until(lambda: p.overdue(), timeout=10, what="the first to be overdue")
    [(task, limit)] = p.overdue()
    assert (task.pk, limit) == (1, 0.05)
    p.abandon(task)
    wait_until(lambda: 2 in executor.ran and executor.cancelled == [1], timeout=10,
               what="the slot handed on and the first cancelled")
    assert (p.busy, p.started, p.stuck, p.overdue()) == (1, 1, 0, [])
    executor.open(2)
    wait_until(lambda: p.busy == 0, timeout=10, what="the second to end")
    p.shutdown()


def test_terminate_cancels_the_coroutines_still_running_and_waits_for_them(
        names: dict[str, str], pool: Any) -> None:
    executor = Gates()
    p = pool(5, executor)
    for pk in (1, 2):
        p.submit(Task(pk=pk, name=names["async"]))
    wait_until(lambda: len(executor.ran) == 2, timeout=10, what="both to start")
    p.terminate()
    assert sorted(executor.cancelled) == [1, 2]  # ended before terminate() returned
    assert not p._thread.is_alive()


def test_which_handlers_run_on_the_loop() -> None:
    async def coroutine() -> None:
        """An async def function."""

    def function() -> None:
        """A sync function."""

    class CallOnly(TaskHandler):
        def call(self, task: Any, worker_id: str) -> Any:
            return super().call(task, worker_id)

    class Both(TaskHandler):
        def call(self, task: Any, worker_id: str) -> Any:
            return super().call(task, worker_id)

        async def acall(self, task: Any, worker_id: str) -> Any:
            return await super().acall(task, worker_id)

    assert runs_on_loop(TaskHandler(func=coroutine, name="a"))
    assert not runs_on_loop(TaskHandler(func=function, name="s"))
    assert not runs_on_loop(TaskHandler(func=coroutine, name="x", atomic=True))
    assert not runs_on_loop(CallOnly(func=coroutine, name="c"))
    assert runs_on_loop(Both(func=coroutine, name="b"))


def test_the_connections_a_worker_may_hold_besides_its_own() -> None:
    assert sync_threads(500) == SYNC_THREADS
    assert sync_threads(2) == 2
    assert connection_holders("async", 500) == 1 + SYNC_THREADS
    assert connection_holders("thread", 500) == 500
