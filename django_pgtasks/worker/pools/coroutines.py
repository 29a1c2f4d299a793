"""The async pool: ``async def`` handlers as coroutines of one event loop, hundreds at a time;
the other handlers on a few threads beside it.

The thread pool runs an ``async def`` handler on one of its threads, on an event loop of its
own (``async_to_sync``): 500 concurrent I/O-bound tasks need 500 threads. This pool runs them
as coroutines of one event loop, on one thread of the worker process, ``size``
(``--concurrency``) at a time. Where a task runs is decided when it is submitted, by its
handler (:func:`runs_on_loop`):

- an ``async def`` handler (``@pgtask`` or Django's ``@task``), unless ``atomic=True``: a
  coroutine of the pool's event loop (:meth:`Executor.execute_async
  <django_pgtasks.worker.executor.Executor.execute_async>`), in an asyncio task of its own;
- any other (sync handlers; ``atomic=True`` async handlers, whose writes commit with their
  completion in one transaction, which needs a thread of its own; a name with no handler,
  which fails as usual): on the pool's threads, as the thread pool runs it
  (:class:`~.threads.ThreadPool`, ``min(size, SYNC_THREADS)`` threads).

Database connections. Code on the event loop must not use Django's (sync) database API; a
handler's async ORM calls (``await Model.objects.aget(...)``) and the executor's steps that
may use the database (the start's signals, an unbatched outcome, the next pipeline stages,
the connection reset after each run) go through ``sync_to_async(thread_sensitive=True)``,
which the loop sends to one thread (an asgiref ``ThreadSensitiveContext`` held by the loop
for its lifetime). So however many coroutines run, they share one connection per database
they use; the worker's connections are its own four (loop, watchdog, maintainer, releaser),
that one, and one per sync thread whose handler uses the database: at most
``5 + SYNC_THREADS``, not one per task. The price: the coroutines' database calls run one
at a time on that thread; the pool suits handlers that mostly wait on other I/O.

Time limits. ``@pgtask(timeout=...)`` cancels the coroutine at the limit (``asyncio``'s
timeout; :func:`~django_pgtasks.definition.handlers.await_handler`): the attempt fails with
``TaskTimeoutError`` and is retried by the handler's policy. A coroutine that does not stop
within ``ASYNC_CANCEL_MARGIN`` more (it swallowed its ``CancelledError``, or waits on a sync
call) is reported by :meth:`AsyncPool.overdue`: the watchdog fails its task as it fails a
thread's, and the pool frees its slot and cancels it again (:meth:`AsyncPool.abandon`).
Threads stuck in timed-out sync handlers count as :attr:`AsyncPool.stuck`; coroutines never
do (an abandoned coroutine holds no thread).

Cancellation. When a running task's cancellation is requested, its coroutine is cancelled
(the run ends ``CANCELLED``), besides the cooperative ``TaskContext.cancelled``.

Shutdown. The worker's loop gives back the tasks that wait for a slot (:meth:`take_waiting`),
waits for the running ones within its grace and then calls :meth:`AsyncPool.shutdown`; past
the grace it calls :meth:`AsyncPool.terminate`, which cancels the coroutines still running
(their runs end unrecorded), and records their tasks as interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import connections

from django_pgtasks.definition.registry import TaskHandler, get_handler
from django_pgtasks.exceptions import PgTasksError
from django_pgtasks.worker.pools.threads import ThreadPool

if TYPE_CHECKING:
    from django_pgtasks.worker.executor import Executor

logger = logging.getLogger("django_pgtasks.worker")

#: A claimed task as the pool sees it: its id and name are all the pool reads.
Task = Any

#: Most threads for the handlers that do not run on the event loop (sync ones, ``atomic``
#: async ones): a worker of ``--pool async`` is meant for ``async def`` handlers; one that
#: mostly runs sync handlers is better served by ``--pool thread``.
SYNC_THREADS = 4
#: Seconds the loop waits, when it stops, for the coroutines it cancelled and for its
#: database thread to close its connections.
STOP_WAIT = 5.0


def sync_threads(size: int) -> int:
    """The threads of an async pool of ``size`` coroutines for its other handlers."""
    return min(size, SYNC_THREADS)


def runs_on_loop(handler: TaskHandler) -> bool:
    """Whether the async pool runs ``handler``'s tasks on its event loop: an ``async def``
    function, not ``atomic``, of a handler class whose ``acall()`` is defined beside its
    ``call()`` (an adapter that overrides only ``call()`` keeps its runs on threads, where
    ``call()`` is what runs)."""
    return handler.is_async and not handler.atomic and _awaits_acall(type(handler))


@functools.cache
def _awaits_acall(cls: type[TaskHandler]) -> bool:
    """Whether the class that defines ``cls``'s ``call()`` defines its ``acall()`` too."""
    for klass in cls.__mro__:
        if "call" in vars(klass):
            return "acall" in vars(klass)
    return False  # pragma: no cover - TaskHandler defines both


@dataclass(eq=False)
class _Run:
    """A task submitted to the event loop."""

    task: Task
    limit: float | None
    #: Running (or about to, on the loop): counted in ``started`` until it ends or is
    #: abandoned.
    started: bool = False
    abandoned: bool = False
    deadline: float | None = None
    #: Its asyncio task, once the loop made it (read and written on the loop's thread).
    future: asyncio.Task[None] | None = None


class AsyncPool:
    """``async def`` handlers as coroutines of one event loop (at most ``size`` at once), the
    others on a :class:`~.threads.ThreadPool` of ``threads`` threads (by default
    :func:`sync_threads`); see the module docstring.

    It owns the event loop's thread, the loop's database thread (and its connections, closed
    when the loop stops), the runs on the loop (submitted, waiting for a slot, running) and
    the thread pool beside it. It runs ``executor.execute_async`` on the loop and
    ``executor.execute`` on the threads, and talks back through ``slot_freed`` (a task ended)
    and ``on_crash(task, exc)`` (an internal error escaped a run). The interface is the
    thread pool's (:class:`~django_pgtasks.worker.pools.Pool`), over both sides.
    """

    def __init__(self, size: int, executor: Executor, slot_freed: threading.Event,
                 on_crash: Callable[[Task, BaseException], None] | None = None,
                 threads: int | None = None) -> None:
        self.size = size
        self._execute = executor.execute_async
        self._slot_freed = slot_freed
        self._on_crash = on_crash
        threads = sync_threads(size) if threads is None else threads
        #: The handlers that do not run on the loop.
        self._threads = ThreadPool(threads, executor.execute, slot_freed, on_crash=on_crash)
        self._lock = threading.Lock()
        #: Runs on the loop by task id: waiting for a slot, or started.
        self._runs: dict[int, _Run] = {}
        self._waiting: deque[_Run] = deque()
        self._started = 0
        self._stopping = False
        #: The asyncio tasks of the runs, abandoned ones too (loop's thread only).
        self._futures: dict[asyncio.Task[None], _Run] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._context: contextvars.Context | None = None
        self._closing: asyncio.Event | None = None
        self._cancel = False
        self._thread = threading.Thread(target=self._run_loop, name="pgtasks-loop",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(30):  # pragma: no cover - the thread failed to start
            raise RuntimeError("the async pool's event loop did not start")

    # -- what the loop and the watchdog ask (any thread) -----------------------------------

    @property
    def busy(self) -> int:
        """Tasks submitted and not finished (or abandoned) yet, on both sides."""
        return len(self._runs) + self._threads.busy

    @property
    def started(self) -> int:
        """Tasks running (not waiting for a slot or a thread), on both sides."""
        return self._started + self._threads.started

    @property
    def resting(self) -> int:
        """Threads that take no task for now (:meth:`rest`); the loop never rests."""
        return self._threads.resting

    @property
    def stuck(self) -> int:
        """Threads still running a sync handler whose task timed out."""
        return self._threads.stuck

    def rest(self, seconds: float) -> None:
        """Called from one of the pool's threads: see :meth:`ThreadPool.rest`."""
        self._threads.rest(seconds)

    def get(self, pk: int) -> Task | None:
        """The submitted (not finished or abandoned) task with id ``pk``, if any."""
        with self._lock:
            run = self._runs.get(pk)
        return run.task if run is not None else self._threads.get(pk)

    def running(self) -> list[Task]:
        with self._lock:
            tasks = [run.task for run in self._runs.values()]
        return tasks + self._threads.running()

    def ids(self) -> set[int]:
        """Ids of the tasks submitted and not finished (or abandoned) yet."""
        with self._lock:
            ids = set(self._runs)
        return ids | self._threads.ids()

    def submit(self, task: Task, limit: float | None = None) -> None:
        """Run ``task`` on the loop if its handler :func:`runs_on_loop` (at once, or when a
        slot is free), else on the threads."""
        try:
            handler: TaskHandler | None = get_handler(task.name)
        except PgTasksError:
            handler = None  # fails on a thread, as in the thread pool
        if handler is None or not runs_on_loop(handler):
            self._threads.submit(task, limit)
            return
        with self._lock:
            run = _Run(task, limit)
            self._runs[task.pk] = run
            self._waiting.append(run)
            self._start_waiting()

    def take_waiting(self) -> list[Task]:
        """Remove and return the submitted tasks that have not started yet."""
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
            for run in taken:
                del self._runs[run.task.pk]
        return [run.task for run in taken] + self._threads.take_waiting()

    def overdue(self) -> list[tuple[Task, float]]:
        """Tasks past their time limit: a thread's, or a coroutine's that did not stop when
        its handler's timeout cancelled it (its limit includes ``ASYNC_CANCEL_MARGIN``)."""
        now = time.monotonic()
        with self._lock:
            late = [(run.task, run.limit) for run in self._runs.values()
                    if run.deadline is not None and now > run.deadline]
        return self._threads.overdue() + late

    def abandon(self, task: Task) -> None:
        """Give up on a timed-out task: free its slot. A coroutine is cancelled again (its
        run then ends unrecorded: the watchdog recorded the time-out); a thread is
        replaced."""
        with self._lock:
            run = self._runs.get(task.pk)
            if run is None or not run.started:
                run = None
            else:
                del self._runs[task.pk]
                run.abandoned = True
                self._started -= 1
                self._start_waiting()
        if run is None:
            self._threads.abandon(task)
            return
        self._call_soon(self._cancel_run, run)
        self._slot_freed.set()

    def shutdown(self) -> None:
        """Stop the loop and the threads once the runs still going end (the worker calls it
        when none runs)."""
        self._stop_loop(cancel=False)
        self._thread.join(3 * STOP_WAIT)
        if self._thread.is_alive():
            logger.warning("The async pool's event loop did not stop within %gs.",
                           3 * STOP_WAIT)
        self._threads.shutdown()

    def terminate(self) -> None:
        """Past the worker's shutdown grace, before it gives the running tasks back: cancel
        the coroutines still running (their runs end without an outcome) and wait for them
        (at most ``STOP_WAIT`` seconds: a coroutine waiting on a sync call ends once that call
        returns). Threads cannot be stopped."""
        self._stop_loop(cancel=True)
        self._thread.join(STOP_WAIT)
        self._threads.terminate()

    def _stop_loop(self, cancel: bool) -> None:
        with self._lock:
            stopping, self._stopping = self._stopping, True
        if not stopping:
            self._call_soon(self._close, cancel)

    # -- the loop's side -------------------------------------------------------------------

    def _start_waiting(self) -> None:
        """(Under the lock.) Start waiting runs while there are free slots."""
        starting = []
        while self._waiting and self._started < self.size:
            run = self._waiting.popleft()
            run.started = True
            if run.limit is not None:
                run.deadline = time.monotonic() + run.limit
            self._started += 1
            starting.append(run)
        if starting:
            self._call_soon(self._start, starting)

    def _call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Have the loop call ``callback(*args)`` (from any thread; nothing once the loop
        stopped: the watchdog may still abandon a task after the shutdown)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(callback, *args)

    def _run_loop(self) -> None:
        """The loop's thread."""
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException:
            logger.exception("The async pool's event loop stopped on an internal error.")
        finally:
            self._loop.close()

    async def _main(self) -> None:
        """Hold the thread-sensitive context (the database thread) until the pool closes;
        then end what still runs and close the database thread's connections."""
        self._closing = asyncio.Event()
        async with ThreadSensitiveContext():
            # Every run starts in a copy of this context: its sync_to_async calls go to the
            # database thread of this ThreadSensitiveContext.
            self._context = contextvars.copy_context()
            self._ready.set()
            await self._closing.wait()
            if not self._cancel:  # the runs not abandoned end on their own
                live = [future for future, run in self._futures.items() if not run.abandoned]
                if live:
                    await asyncio.wait(live)
            for future in self._futures:
                future.cancel()
            if self._futures:
                await asyncio.wait(set(self._futures), timeout=STOP_WAIT)
            try:
                await asyncio.wait_for(
                    sync_to_async(connections.close_all, thread_sensitive=True)(), STOP_WAIT)
            except Exception:
                logger.exception("The async pool's database thread could not close its "
                                 "connections.")

    def _close(self, cancel: bool) -> None:
        """(On the loop.) Stop: after the runs end, or (``cancel``) cancelling them."""
        self._cancel = cancel
        if self._closing is not None:
            self._closing.set()

    def _start(self, runs: list[_Run]) -> None:
        """(On the loop.) Start ``runs``, each in an asyncio task of its own."""
        context = self._context if self._context is not None else contextvars.Context()
        for run in runs:
            if self._closing is not None and self._closing.is_set():
                continue  # stopped past the grace: the worker gave the task back already
            future = self._loop.create_task(self._run_one(run), context=context.copy())
            run.future = future
            self._futures[future] = run
            future.add_done_callback(self._forget)
            if run.abandoned:  # abandoned before the loop got to it
                future.cancel()

    def _forget(self, future: asyncio.Task[None]) -> None:
        self._futures.pop(future, None)

    def _cancel_run(self, run: _Run) -> None:
        """(On the loop.) Cancel ``run``'s coroutine, if it still runs."""
        if run.future is not None:
            run.future.cancel()

    async def _run_one(self, run: _Run) -> None:
        task = run.task
        try:
            await self._execute(task)
        except asyncio.CancelledError:
            pass  # by the pool (shutdown, abandon): the task's outcome is recorded elsewhere
        except BaseException as exc:  # keep the loop (and the other runs) going
            logger.exception("Internal error while running task id=%s.", task.pk)
            if self._on_crash is not None:
                try:  # the task must not stay RUNNING under a live worker
                    self._on_crash(task, exc)
                except BaseException:
                    logger.exception("Task id=%s: the internal error could not be recorded; "
                                     "the task waits for the rescue.", task.pk)
        finally:
            self._finished(run)

    def _finished(self, run: _Run) -> None:
        """(On the loop.) ``run`` ended: free its slot and start a waiting run."""
        with self._lock:
            if run.abandoned:
                return  # its slot was freed then
            # Only this run's entry: once its outcome is recorded, the same task may be
            # claimed again (a retry due at once) and submitted under the same id.
            if self._runs.get(run.task.pk) is run:
                del self._runs[run.task.pk]
            self._started -= 1
            self._start_waiting()
        self._slot_freed.set()
