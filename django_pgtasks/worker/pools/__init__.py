"""Execution pools: where a worker runs the handlers of the tasks it claimed.

The loop claims and records; a pool runs. Every pool has the interface of
:class:`~.threads.ThreadPool` (:class:`Pool`), so the loop, the watchdog and the shutdown
treat them alike:

- ``thread`` (:mod:`.threads`): ``--concurrency`` threads of the worker process. The
  default: no start-up cost per task, and a handler shares the warmed-up process.
- ``process`` (:mod:`.processes`): each task in a child process, so that a time limit
  really stops it, and a memory leak or a crash takes one task with it, never the worker.
- ``async`` (:mod:`.coroutines`): ``async def`` handlers on one event loop, hundreds at a
  time; sync handlers on threads beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from django_pgtasks.conf import is_seconds

if TYPE_CHECKING:
    from django_pgtasks.models import Task
    from django_pgtasks.worker.executor import Executor

#: The kinds of pool, as ``run_pgtasks --pool`` and ``PGTASKS["POOL"]`` name them.
POOL_KINDS = ("thread", "process", "async")


@dataclass(frozen=True)
class PoolOptions:
    """What a pool is built with, beyond the executor: its size and its limits."""

    kind: str = "thread"
    size: int = 1
    #: ``process`` only: replace a child after this many tasks (``None``: never).
    max_tasks_per_child: int | None = None
    #: ``process`` only: replace a child whose resident memory after a task exceeds this
    #: many MiB (``None``: never).
    max_memory_per_child: int | None = None
    #: ``process`` only: seconds a handler still running after its task's cancellation came
    #: in has before its child is stopped and the task ends ``CANCELLED`` (``None``: never
    #: stopped; the cancellation stays cooperative, as on the other pools).
    cancel_grace: float | None = 10.0


class Pool(Protocol):
    """What the loop, the watchdog and the shutdown ask of a pool."""

    @property
    def busy(self) -> int: ...
    @property
    def started(self) -> int: ...
    @property
    def resting(self) -> int: ...
    @property
    def stuck(self) -> int: ...
    def rest(self, seconds: float) -> None: ...
    def get(self, pk: int) -> Task | None: ...
    def running(self) -> list[Task]: ...
    def ids(self) -> set[int]: ...
    def submit(self, task: Task, limit: float | None = None) -> None: ...
    def take_waiting(self) -> list[Task]: ...
    def overdue(self) -> list[tuple[Task, float]]: ...
    def abandon(self, task: Task) -> None: ...
    def shutdown(self) -> None: ...
    def terminate(self) -> None: ...


def check_options(options: PoolOptions) -> str | None:
    """What is wrong with ``options``, in words for the command line and the checks, or
    ``None``."""
    if options.kind not in POOL_KINDS:
        return f"unknown pool {options.kind!r}; choose one of {', '.join(POOL_KINDS)}"
    for name in ("max_tasks_per_child", "max_memory_per_child"):
        value = getattr(options, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be a whole number of at least 1, not {value!r}"
        if options.kind != "process":
            return f"{name} applies to the process pool only (this worker's pool is " \
                   f"{options.kind!r})"
    grace = options.cancel_grace
    if grace is not None and not is_seconds(grace):
        return f"cancel_grace must be None or a number of seconds of at least 0, not {grace!r}"
    if options.kind == "process":
        from django_pgtasks.worker.pools.forkserver import supported

        return supported()
    return None


def connection_holders(kind: str, size: int) -> int:
    """How many parts of one worker process of pool ``kind`` and ``size`` (``--concurrency``)
    may each hold a connection to the task database, besides the process's own: one per
    thread (``thread``) or child process (``process``); for ``async``, the event loop's
    database thread and the threads of its sync handlers (:mod:`.coroutines`), however many
    coroutines run."""
    if kind == "async":
        from django_pgtasks.worker.pools.coroutines import sync_threads

        return 1 + sync_threads(size)
    return size


def make_pool(options: PoolOptions, executor: Executor, slot_freed: threading.Event,
              on_crash: Callable[[Task, BaseException], None] | None = None,
              stop: Callable[[int], None] | None = None) -> Pool:
    """The pool ``options`` describe, running ``executor``'s tasks. ``stop(exit_code)``: the
    pool can run nothing any more (the process pool's fork server died).

    Called before the worker starts its other threads: the process pool forks its fork
    server here, from a process of one thread."""
    problem = check_options(options)
    if problem:
        raise ValueError(problem)
    if options.kind == "thread":
        from django_pgtasks.worker.pools.threads import ThreadPool

        return ThreadPool(options.size, executor.execute, slot_freed, on_crash=on_crash)
    if options.kind == "process":
        from django_pgtasks.worker.pools.processes import ProcessPool

        return ProcessPool(options, executor, slot_freed, on_crash=on_crash, stop=stop)
    if options.kind == "async":
        from django_pgtasks.worker.pools.coroutines import AsyncPool

        return AsyncPool(options.size, executor, slot_freed, on_crash=on_crash)
    raise NotImplementedError(f"the {options.kind!r} pool is not available yet")
