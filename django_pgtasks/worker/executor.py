"""The executor: one claimed task on a pool thread. It calls the task's handler, turns what
it returned or raised into an outcome, hands the outcome in to be recorded, then runs the
callbacks (the handler's ``finished()``, ``task_finished``, the outcome's log line).

:class:`Executor` is the worker's part that the pool threads run; the worker's loop
(:mod:`~django_pgtasks.worker.loop`) builds it with the callbacks it needs, and the in-test
runner of :mod:`django_pgtasks.testing` runs a variant of it on the caller's thread. The async
pool awaits the same run on its event loop (:meth:`Executor.execute_async`): the steps before
and after the handler are shared, only the call of the handler differs.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.sqlstates import is_connection_loss
from django_pgtasks.definition.error_text import (
    error_text,
    format_exception,
    qualified_name,
    reason_text,
    truncate_error,
)
from django_pgtasks.definition.registry import TaskHandler, cancel_was_signalled, get_handler
from django_pgtasks.exceptions import (
    ConnectionLost,
    LeaseLostError,
    PgTasksError,
    Snooze,
    Suspend,
    TaskCancelled,
    TaskInterrupted,
    UnknownTaskError,
)
from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.transitions import (
    Cancelled,
    Failed,
    Interrupted,
    Outcome,
    Snoozed,
    Succeeded,
    Suspended,
    Unstarted,
    unstorable,
    write,
)
from django_pgtasks.models import Status, Task
from django_pgtasks.signals import task_finished, task_started
from django_pgtasks.worker.connecting import ThreadConnections, opened_in_thread
from django_pgtasks.worker.tracing import end_run, leave, start_run

logger = logging.getLogger("django_pgtasks.worker")

R = TypeVar("R")


@dataclass
class RunReport:
    """How a run in another process ended, as that process tells the worker
    (:meth:`Executor.ended_elsewhere`). Picklable: it crosses a socket."""

    #: The run's outcome (``None``: nothing to record or to report).
    outcome: Outcome | None = None
    #: Whether the run's process recorded the outcome itself (``atomic=True``, or a
    #: pipeline's next stages: in the handler's transaction); then :attr:`status` is the
    #: task's new state (``""``: no longer held; ``None``: nothing could be recorded).
    recorded: bool = False
    status: str | None = None
    #: The handler's run, in seconds.
    duration: float = 0.0
    #: What the handler raised, or a picklable stand-in for it.
    error: BaseException | None = None
    #: Handed in without the callbacks (a run whose handler never started, an internal
    #: error): as :meth:`Executor.crashed` and a refused connection hand theirs in.
    quiet: bool = False
    #: The whole run in seconds, for the loop's prefetch (``None``: not counted).
    ran: float | None = None
    #: Seconds the run's slot takes no task (the database refused the run a connection).
    rest: float = 0.0


#: What to call once a handed-in outcome is recorded, with the task's new status (``""``: no
#: longer held; ``None``: nothing could be recorded).
Done = Callable[[str | None], object]


class Executor:
    """Runs one claimed task on the calling thread (a pool thread): gets the thread's
    connection, calls the handler, turns what it returned or raised into an outcome, hands the
    outcome in to be recorded (or records it itself), then calls the handler's ``finished()``
    and sends ``task_finished``. Thread-safe: every pool thread runs :meth:`execute`; the
    async pool's event loop awaits :meth:`execute_async` for ``async def`` handlers.

    It owns the pool threads' connections (:attr:`thread_connections`: opened before a
    handler starts, reset after it) and the count of the runs it ended (:attr:`processed`).
    It talks to the rest of the worker only through what it is given:

    - ``recorder``: records an outcome on this thread (unbatched, or with a pipeline's next
      stages);
    - ``hand_in(task, outcome, done)``: hands an outcome to the loop, which records it with
      others and then calls ``done(status)``;
    - ``batched``: whether the handlers' outcomes are handed in (else recorded here);
    - ``rest(seconds)``: this thread takes no task for a while (its connection was refused);
    - ``ran(seconds)``: a run's length, for the loop's prefetch;
    - ``lost()``: outcomes could not be recorded (the loop gives those tasks back);
    - ``request_stop(reason)``: a handler raised ``KeyboardInterrupt``;
    - ``task_pause`` and ``stopping``: the pause after each task, cut short once ``stopping``
      is set.

    A run's milestones go through :meth:`announce` (the handler starts), :meth:`end` (its
    outcome, to be recorded) and :meth:`finish` (recorded: the callbacks). The process pool's
    children run a variant that sends them to the worker instead
    (:class:`~django_pgtasks.worker.pools.processes.ChildExecutor`), where
    :meth:`ended_elsewhere` takes them up.
    """

    def __init__(self, *, using: str, worker_id: str, recorder: Recorder,
                 hand_in: Callable[[Task, Outcome, Done], None], batched: bool,
                 concurrency: int = 1, rest: Callable[[float], None] = lambda seconds: None,
                 ran: Callable[[float], None] = lambda seconds: None,
                 lost: Callable[[], None] = lambda: None,
                 request_stop: Callable[[str], None] = lambda reason: None,
                 task_pause: float = 0.0, stopping: threading.Event | None = None) -> None:
        self.using = using
        self.worker_id = worker_id
        self.recorder = recorder
        self.batched = batched
        self.task_pause = task_pause
        self._hand_in = hand_in
        self._rest = rest
        self._ran = ran
        self._lost = lost
        self._request_stop = request_stop
        self._stopping = stopping or threading.Event()
        #: The pool threads' connections, got before a handler starts.
        self.thread_connections = ThreadConnections(using, worker_id, concurrency)
        #: Runs ended (their outcome recorded, or found no longer held).
        self.processed = 0

    def execute(self, task: Task) -> None:
        """Run one claimed task on this thread and have its outcome recorded (never raises:
        an internal error is for :meth:`crashed`)."""
        # The run's span (when tracing is on) is current while the task runs here; it ends
        # when the outcome is recorded (finish()), maybe later and on another thread.
        token = start_run(task, self.worker_id)
        if token is None:
            self.run(task)
            return
        try:
            self.run(task)
        finally:
            leave(token)

    def crashed(self, task: Task, exc: BaseException) -> None:
        """An internal error escaped :meth:`execute`: hand it in as a failure (else the task
        is given back), so that it does not stay RUNNING under this live worker."""
        outcome = Failed(reason_text(type(exc), f"Internal error while running the task: "
                                                f"{exc}"), None)
        self._hand_in(task, outcome, lambda status: end_run(task, status, outcome, exc))

    def run(self, task: Task) -> None:
        """:meth:`execute` without the run's span: for a pool that opens it elsewhere (the
        process pool opens it in the worker, and runs this in a child process)."""
        started = time.monotonic()
        handler = self._prepare(task)
        if handler is None:
            return
        try:
            if self._cancelled_unstarted(task) or not self._connect_for(task, handler):
                return
            self.announce(task, handler)
            # The run's duration (log line, task_finished, the metrics' histogram): the
            # handler's run, not the signals before it nor the wait for its recording after.
            began = time.monotonic()
            if handler.atomic:
                self._run_atomic(task, handler, began)
            else:
                self._run(task, handler, began)
            self._ran(time.monotonic() - started)
        finally:
            self._after_task()

    def _prepare(self, task: Task) -> TaskHandler | None:
        """Log the run's start and find its handler (``None``: there is none, and the run
        ended here as failed, or interrupted if its module failed to import)."""
        started = time.monotonic()
        logger.info(
            "Task id=%s name=%s queue=%s state=%s attempt=%d/%d",
            task.id, task.name, task.queue, Status.RUNNING, task.attempt, task.max_attempts,
        )
        try:
            handler = get_handler(task.name)
        except PgTasksError as exc:  # unknown (fatal), or its module failed to import
            self._end(task, None, started, outcome_of(task, None, exc), exc)
            return None
        task.followups = []  # next pipeline stages, filled by TaskContext.then()
        return handler

    def _cancelled_unstarted(self, task: Task) -> bool:
        """End the run as cancelled before the handler starts, if its cancellation was
        requested (``True``): cancelled after the claim (e.g. while prefetched), or rescued
        after its cancellation was requested. It never starts."""
        if not (task.cancel_requested or cancel_was_signalled(task)):
            return False
        exc = TaskCancelled(f"Task {task.pk} was cancelled before attempt {task.attempt} "
                            f"started.")
        self._end(task, None, time.monotonic(), Cancelled(error_text(exc)), None)
        return True

    def _connect_for(self, task: Task, handler: TaskHandler) -> bool:
        """Get this thread's connection to the task database before the handler starts
        (:mod:`django_pgtasks.worker.connecting`). ``False``: the database refused it, so the
        handler does not start and the task goes back to the queue unspent, handed in to be
        recorded on the loop's connection; this thread rests before it takes another task."""
        threads = self.thread_connections
        if not threads.needed(task.name, handler.atomic, self.batched):
            return True
        exc = threads.connect()
        if exc is None:
            return True
        pause = threads.refusal(exc)
        logger.info("Task id=%s name=%s queue=%s given back unstarted: its thread could not "
                    "connect (%s); the thread rests %.1fs.", task.pk, task.name, task.queue,
                    _one_line(exc), pause)
        outcome = Unstarted(reason_text(type(exc), f"The database refused the run's "
                                                   f"connection: {_one_line(exc)}"))
        self._rest(pause)
        self._hand_in(task, outcome, lambda status: end_run(task, status, outcome, None))
        return False

    def _run(self, task: Task, handler: TaskHandler, started: float) -> None:
        """At-least-once mode: the handler, then the completion (batched or on its own)."""
        try:
            with self.thread_connections.watching(task.name):
                result = self._call(handler, task)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler: a failure
            self._conclude(task, handler, started, None, exc)
            return
        self._conclude(task, handler, started, result, None)

    def _conclude(self, task: Task, handler: TaskHandler, started: float, result: Any,
                  exc: BaseException | None) -> None:
        """At-least-once mode, once the handler returned ``result`` or raised ``exc``: its
        outcome (with the next pipeline stages, if any) handed in or recorded. ``started``:
        when the handler began."""
        if exc is not None:
            self._end(task, handler, started, outcome_of(task, handler, exc), exc)
        elif task.followups:
            self._succeed_with_followups(task, handler, result, started)
        else:
            self._end(task, handler, started, Succeeded(result), None)

    def _succeed_with_followups(self, task: Task, handler: TaskHandler, result: Any,
                                started: float) -> None:
        """The success and the next pipeline stages, in one transaction."""
        duration = time.monotonic() - started

        def succeed() -> dict[int, str]:
            with transaction.atomic(using=self.using):
                written = write(self.using, [(task, Succeeded(result))])
                if written:
                    _enqueue_followups(task.followups, self.using)
            return written

        try:
            written = self.recorder.attempt(succeed)
        except Exception as exc:  # refused, not unreachable: e.g. a stage that cannot be stored
            logger.error("Task id=%s: its next stages could not be enqueued: %r", task.pk, exc)
            self._end(task, handler, started, unstorable(exc), exc)
            return
        status = None if written is None else written.get(task.pk, "")
        if status is None:
            self._lost()
        self.finish(task, handler, duration, status, Succeeded(result), None)

    def _run_atomic(self, task: Task, handler: TaskHandler, started: float) -> None:
        """Exactly-once mode: the handler's writes and the completion commit together."""
        try:
            with transaction.atomic(using=self.using):
                result = self._call(handler, task)
                if not write(self.using, [(task, Succeeded(result))]):
                    raise LeaseLostError(f"Task {task.pk} is no longer held by this worker.")
                if task.followups:
                    _enqueue_followups(task.followups, self.using)
        except LeaseLostError as exc:
            logger.warning("Task id=%s name=%s was no longer held by worker %s when it "
                           "finished; its writes were rolled back.", task.pk, task.name,
                           self.worker_id)
            self.finish(task, handler, time.monotonic() - started, "", None, exc)
            return
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler: a failure
            self._end(task, handler, started, outcome_of(task, handler, exc), exc)
            return
        self.finish(task, handler, time.monotonic() - started, Status.SUCCESSFUL,
                    Succeeded(result), None)

    def _call(self, handler: TaskHandler, task: Task) -> Any:
        """Run the handler for ``task`` (the hook the in-test runner wraps)."""
        return handler.call(task, self.worker_id)

    def _end(self, task: Task, handler: TaskHandler | None, started: float, outcome: Outcome,
             exc: BaseException | None) -> None:
        """:meth:`end` for a handler that began at ``started`` (its run ends now)."""
        self.end(task, handler, time.monotonic() - started, outcome, exc)

    # -- where a run's milestones go (a variant that runs in another process overrides them) -

    def announce(self, task: Task, handler: TaskHandler) -> None:
        """The handler is about to be called: send ``task_started`` and call the handler's
        ``started()``."""
        task_started.send(sender=Task, task=task, worker_id=self.worker_id)
        handler.started(task, self.worker_id)

    def end(self, task: Task, handler: TaskHandler | None, duration: float, outcome: Outcome,
            exc: BaseException | None) -> None:
        """Hand ``outcome`` in to be recorded by the loop (or, unbatched, record it on this
        thread), then run the callbacks (:meth:`finish`) once it is recorded. ``duration``:
        the handler's run, in seconds."""

        def done(status: str | None) -> None:
            self.finish(task, handler, duration, status, outcome, exc)

        if self.batched:
            self._hand_in(task, outcome, done)
            return
        status = self.recorder.record([(task, outcome)])[task.pk]
        if status is None:
            self._lost()
        done(status)

    def finish(self, task: Task, handler: TaskHandler | None, duration: float,
               status: str | None, outcome: Outcome | None,
               exc: BaseException | None) -> None:
        """After the outcome was recorded (``status``: the task's new state; ``""`` or
        ``None``: nothing recorded): update the in-memory task, call the handler's
        ``finished()`` and send ``task_finished``. ``duration``: the handler's run, in
        seconds."""
        end_run(task, status, outcome, exc)
        if status:
            task.status = status
            if isinstance(outcome, Succeeded):
                task.result = outcome.result
            elif isinstance(outcome, Failed | Cancelled | Interrupted):
                task.error_text = truncate_error(outcome.error)
            if isinstance(outcome, Snoozed | Suspended):
                task.attempt = max(task.attempt - 1, 0)
        if handler is not None:
            try:
                _while_handling(exc, lambda: handler.finished(task, self.worker_id, exc))
            except Exception:
                logger.exception("Task id=%s: error in the handler's finished() callback.",
                                 task.pk)
        self._finished(task, duration, exc)
        if isinstance(exc, KeyboardInterrupt):
            # Recorded as the attempt's failure like any exception; then the worker stops the
            # way Ctrl+C stops it (pool threads cannot raise it in the main thread).
            self._request_stop(f"Task id={task.pk} raised KeyboardInterrupt")

    # -- the worker's side of a run in another process ---------------------------------------

    def ended_elsewhere(self, task: Task, report: RunReport) -> None:
        """A run of ``task`` ended in another process (the process pool's child), which
        reports it: have its outcome recorded (unless the child recorded it itself, in the
        handler's transaction) and run the callbacks here, in the worker, as for a run on a
        pool thread."""
        if report.ran is not None:
            self._ran(report.ran)
        outcome = report.outcome
        if report.quiet:  # never started, or an internal error: only the span ends after
            if outcome is not None:
                self._hand_in(task, outcome,
                              lambda status: end_run(task, status, outcome, report.error))
            return
        handler = _handler_or_none(task.name)
        if report.recorded:
            if report.status is None:
                self._lost()
            self.finish(task, handler, report.duration, report.status, outcome, report.error)
        elif outcome is not None:
            self.end(task, handler, report.duration, outcome, report.error)

    def _finished(self, task: Task, duration: float, exception: BaseException | None) -> None:
        """Log the outcome and send ``task_finished`` (once it is recorded)."""
        logger.info(
            "Task id=%s name=%s queue=%s state=%s attempt=%d/%d duration=%.3fs%s",
            task.id, task.name, task.queue, task.status, task.attempt, task.max_attempts,
            duration, f" error={_one_line(exception)}" if exception else "",
        )
        self.processed += 1
        task_finished.send(
            sender=Task, task=task, worker_id=self.worker_id, status=task.status,
            duration=duration, exception=exception,
        )

    def _after_task(self) -> None:
        """Reset this thread's connections for the next task, then pause (``task_pause``)."""
        self._reset_connections()
        if self.task_pause:
            self._stopping.wait(self.task_pause)

    def _reset_connections(self) -> None:
        """Reset this thread's connections for the next task."""
        # A handler may have broken its connection (or left a transaction open): reset it so
        # the next task in this thread starts clean. Healthy connections are kept for reuse,
        # except pooled ones (OPTIONS["pool"]), which go back to the pool between tasks so
        # that threads share a bounded number of connections.
        # Only connections opened in this thread can need it (a transaction left open, or
        # errors, imply an opened connection): not every alias's, each a thread-local lookup.
        aliases = opened_in_thread()
        if not aliases:
            return
        for alias in list(aliases):
            conn = connections[alias]
            if conn.in_atomic_block:
                # A transaction the handler left open (atomic() entered, never exited):
                # close() alone would only mark it for rollback and keep the wrapper inside
                # it. Closing the database connection ends it on the server; the next task
                # gets a fresh wrapper, without the abandoned transaction's bookkeeping.
                try:
                    conn._close()
                except Exception:
                    logger.exception("Closing a connection left in a transaction failed.")
                conn.connection = None
                del connections[alias]
            elif conn.connection is None:
                # Closed (by the handler, or below): nothing to reset until this thread opens
                # it again (connection_created lists it again), so later tasks skip it.
                aliases.discard(alias)
            elif (getattr(conn, "pool", None) is not None
                    or (conn.errors_occurred and not conn.is_usable())):
                conn.close()

    # -- the async pool: a run awaited on its event loop -----------------------------------

    async def execute_async(self, task: Task) -> None:
        """Run one claimed task whose handler is an ``async def`` function (not ``atomic``)
        on the running event loop, and have its outcome recorded: the async pool's
        (:mod:`~django_pgtasks.worker.pools.coroutines`) counterpart of :meth:`execute`.

        The same steps, shared with :meth:`execute` (start, outcome, callbacks, connection
        reset), but the handler is awaited (``handler.acall()``) in the current asyncio task,
        and each step that may use the database runs through
        ``sync_to_async(thread_sensitive=True)``: on the one thread the pool's loop gives
        thread-sensitive code (as it gives the handlers' async ORM calls), never on the loop.
        No connection is got before the handler starts: a coroutine has no thread (and no
        connection) of its own. Never raises but ``CancelledError`` when the current task is
        cancelled from outside (the pool at shutdown): then no outcome is handed in, and the
        task is the worker's to give back.
        """
        token = start_run(task, self.worker_id)
        try:
            await self._execute_coroutine(task)
        finally:
            if token is not None:
                leave(token)

    async def _execute_coroutine(self, task: Task) -> None:
        started = time.monotonic()
        handler = await _on_thread(self._open)(task)
        if handler is None:
            return
        began = time.monotonic()
        result: Any = None
        error: BaseException | None = None
        try:
            result = await handler.acall(task, self.worker_id)
        except asyncio.CancelledError as exc:
            if _cancelling():  # the pool's, not the handler's own: the run ends unrecorded
                await _on_thread(self._reset_connections)()
                raise
            error = exc
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler: a failure
            error = exc
        await _on_thread(self._close)(task, handler, began, result, error)
        self._ran(time.monotonic() - started)
        if self.task_pause:
            await self._pause()

    def _open(self, task: Task) -> TaskHandler | None:
        """The start of a run on the event loop, in one call on the database thread: its
        handler (``None``: the run ended before it started)."""
        handler = self._prepare(task)
        if handler is None:
            return None
        opened = False
        try:
            if not self._cancelled_unstarted(task):
                self.announce(task, handler)
                opened = True
        finally:
            if not opened:
                self._reset_connections()
        return handler if opened else None

    def _close(self, task: Task, handler: TaskHandler, began: float, result: Any,
               exc: BaseException | None) -> None:
        """The end of a run on the event loop, in one call on the database thread: its
        outcome, then the connection reset."""
        try:
            self._conclude(task, handler, began, result, exc)
        finally:
            self._reset_connections()

    async def _pause(self) -> None:
        """``task_pause`` after a run on the event loop, cut short once ``stopping`` is set."""
        end = time.monotonic() + self.task_pause
        while not self._stopping.is_set() and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.1))


def outcome_of(task: Task, handler: TaskHandler | None, exc: BaseException) -> Outcome:
    """How a run that raised ``exc`` ends: cancelled (its cancellation was requested, or
    it raised ``TaskCancelled``), snoozed, suspended (a durable sleep or wait), interrupted
    (its connection was lost, or its code could not be imported: not the handler's
    failure), or failed."""
    if isinstance(exc, TaskCancelled) or cancel_was_signalled(task):
        return Cancelled(error_text(exc))
    if isinstance(exc, Suspend):
        return Suspended(exc.until, exc.event is not None)
    if isinstance(exc, Snooze):
        return Snoozed(exc.seconds)
    if isinstance(exc, TaskInterrupted):
        return Interrupted(error_text(exc))
    if is_connection_loss(exc):
        header = format_exception(exc).partition("\n")[0]
        return Interrupted(truncate_error(
            f"{qualified_name(ConnectionLost)}: The run lost its database connection "
            f"({header}).\n\n{format_exception(exc)}"))
    if handler is None or isinstance(exc, UnknownTaskError):
        return Failed(error_text(exc), None)
    return Failed(error_text(exc), retry_after(handler, task, exc))

def _handler_or_none(name: str) -> TaskHandler | None:
    try:
        return get_handler(name)
    except PgTasksError:
        return None


def retry_after(handler: TaskHandler, task: Task, exc: BaseException | None) -> float | None:
    """The handler's retry decision for ``task`` (``None``: the failure is final)."""
    try:
        return handler.retry_after(task, exc)
    except Exception:
        logger.exception("Task id=%s name=%s: its backoff policy failed; retrying after "
                         "BACKOFF_MAX.", task.pk, task.name)
        return float(pgtasks_settings.BACKOFF_MAX)


def _while_handling(exc: BaseException | None, callback: Callable[[], object]) -> None:
    """Call ``callback`` while ``exc`` is being handled (``sys.exc_info()`` is set), as
    receivers of a failure's ``task_finished`` expect (Django's own logging attaches the
    traceback from there), even when it runs after the outcome was recorded elsewhere."""
    if exc is None:
        callback()
        return
    try:
        raise exc
    except BaseException:
        callback()


def _on_thread(func: Callable[..., R]) -> Callable[..., Awaitable[R]]:
    """``func`` awaitable from the event loop, run on the thread the loop gives
    thread-sensitive code (the async pool's database thread), with the other steps waiting
    there (:class:`_ThreadSteps`)."""

    async def call(*args: Any) -> R:
        loop = asyncio.get_running_loop()
        steps = _steps.get(loop)
        if steps is None:
            steps = _steps[loop] = _ThreadSteps()
        return await steps.run(func, args)

    return call


class _ThreadSteps:
    """The sync steps of the runs on one event loop, run in batches on the thread the loop
    gives thread-sensitive code (``sync_to_async(thread_sensitive=True)``).

    Passing a call to a thread and its result back costs more than most steps (a signal, an
    outcome handed in: microseconds), and hundreds of runs starting or ending at once would
    take one such hop each; here the steps waiting when the thread is free go in one hop, each
    in the context of the run that asked for it. Read and written on the loop's thread only.
    """

    def __init__(self) -> None:
        self._waiting: list[_Step] = []
        self._running = False
        #: The task that runs the waiting steps (kept referenced while it runs).
        self._runner: asyncio.Task[None] | None = None

    async def run(self, func: Callable[..., R], args: tuple[Any, ...]) -> R:
        loop = asyncio.get_running_loop()  # not kept: the loop is this object's weak key
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((contextvars.copy_context(), func, args, future))
        if not self._running:
            self._running = True
            # In the caller's context: its thread-sensitive context says which thread.
            self._runner = loop.create_task(self._run_waiting())
        return await future

    async def _run_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    results = await sync_to_async(_run_steps, thread_sensitive=True)(batch)
                except BaseException as exc:  # pragma: no cover - _run_steps catches all
                    results = [(False, exc)] * len(batch)
                for (_, _, _, future), (ok, value) in zip(batch, results, strict=True):
                    if future.done():  # its run was cancelled meanwhile
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._running = False
            self._runner = None


#: A step waiting for the database thread: its run's context, the call, its future.
_Step = tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]

#: The steps of each event loop that runs coroutines of the async pool.
_steps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ThreadSteps] = (
    weakref.WeakKeyDictionary())


def _run_steps(batch: list[_Step]) -> list[tuple[bool, Any]]:
    """(On the database thread.) Each step of ``batch``, in its run's context; what it
    returned or raised. A step whose run was cancelled before it began is skipped, as
    ``sync_to_async`` skips a call not started yet."""
    results: list[tuple[bool, Any]] = []
    for context, func, args, future in batch:
        if future.cancelled():
            results.append((False, None))
            continue
        try:
            results.append((True, context.run(func, *args)))
        except BaseException as exc:  # handed to the run that asked, like any result
            results.append((False, exc))
    return results


def _cancelling() -> bool:
    """Whether the current asyncio task is being cancelled from outside."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line, for log lines."""
    header = format_exception(exc).partition("\n")[0]
    return header if len(header) <= 300 else header[:297] + "..."


def _enqueue_followups(tasks: list[Task], using: str) -> None:
    """Insert a pipeline's next stages. Those on the finishing task's database commit with its
    completion; a stage whose queue is on another database (``PGTASKS["QUEUES"]``) is
    written there, in that database's own transaction."""
    from django_pgtasks.definition.routing import queues_on

    # A database that holds no configured queue gets every stage (tasks put there by hand).
    Task.objects.enqueue_many(tasks, using=None if queues_on(using) else using)
