"""Task handlers: what ``@pgtask`` makes of a function, and what a running task sees.

:class:`TaskHandler` holds a function and its options and knows how to run it (sync or
async, with a time limit, cancellable); :class:`TaskContext` is what a handler that asks for
it receives. The names that map stored tasks to handlers live in
:mod:`django_pgtasks.definition.registry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import difflib
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from django.apps import apps

from django_pgtasks.definition import run_report
from django_pgtasks.retry import Backoff, resolve

if TYPE_CHECKING:
    from django_pgtasks.definition.recurrence import When
    from django_pgtasks.definition.task_row import TaskRow

MAX_NAME_LENGTH = 255
#: The callback of the tasks of ``TaskContext.run_tasks()`` (imported by its name where it
#: is enqueued and where it runs).
CHILDREN_ENDED = "django_pgtasks.definition.builtin_tasks.children_ended"
#: Shapes of calls (positional count, keyword names) whose fit a handler remembers.
SHAPES_KEPT = 64


def _tasks() -> Any:
    """The task manager, looked up in the app registry: handlers are defined at import time,
    before the models can be imported, and the registry sits below the models."""
    return apps.get_model("django_pgtasks", "Task").objects

logger = logging.getLogger("django_pgtasks")


class CancelSignal:
    """Set when a running task is asked to stop (thread-safe); runs callbacks once set.

    The worker keeps one per running task (:func:`cancel_signal`) and sets it when it learns
    of the cancellation, through ``NOTIFY`` or its next heartbeat.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback()

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when set (at once if set already); return a function that
        removes it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock, contextlib.suppress(ValueError):
                        self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None


def cancel_signal(task: TaskRow) -> CancelSignal:
    """The cancellation signal of a claimed ``task`` (created on first use)."""
    signal = task.__dict__.get("_cancel_signal")
    if signal is None:
        signal = task.__dict__.setdefault("_cancel_signal", CancelSignal())
    return signal


def cancel_was_signalled(task: TaskRow) -> bool:
    """Whether ``task``'s cancellation signal is set, without creating one: the worker asks
    this of every task it runs, and most never get a signal."""
    signal = task.__dict__.get("_cancel_signal")
    return signal is not None and signal.is_set()


@dataclass
class _StepState:
    """What a run's context knows of its steps."""

    #: The step names used in this run (each at most once).
    names: set[str] = field(default_factory=set)
    #: The task's kept steps by name, read from the claimed row at the first step.
    kept: dict[str, dict[str, Any]] | None = None
    #: The bytes their results take as JSON.
    used: int = 0
    #: The durable sleeps reached in this run.
    sleeps: int = 0


@dataclass(frozen=True)
class TaskContext:
    """Passed as the first argument to handlers registered with ``context=True``."""

    task: TaskRow
    worker_id: str
    _steps: _StepState = field(default_factory=_StepState, init=False, repr=False,
                               compare=False)

    @property
    def task_id(self) -> int:
        return self.task.pk

    @property
    def attempt(self) -> int:
        """The number of the attempt now running, starting at 1."""
        return self.task.attempt

    # -- cooperative cancellation ----------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether this task was cancelled while it runs (``Task.objects...cancel()``)."""
        return cancel_signal(self.task).is_set()

    def should_stop(self) -> bool:
        """Whether the handler should stop now: its task was cancelled.

        Check it between units of work and stop by raising (e.g. with
        :meth:`raise_if_cancelled`): the task then ends ``CANCELLED``. A handler that returns
        normally has done its work, and its task ends ``SUCCESSFUL``.
        """
        return self.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~django_pgtasks.exceptions.TaskCancelled` if the task was cancelled."""
        if self.cancelled:
            from django_pgtasks.exceptions import TaskCancelled

            raise TaskCancelled(f"Task {self.task_id} was cancelled while it ran.")

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` in this thread, waking early if the task is cancelled;
        return :meth:`should_stop`. For handlers that poll or back off between units of
        work, holding their thread; :meth:`sleep` frees it."""
        return cancel_signal(self.task).wait(seconds)

    # -- durable sleeps and waits for events -------------------------------------------------

    def sleep(self, seconds: float | timedelta) -> None:
        """Sleep durably for ``seconds`` (database clock): the run ends here, without
        spending an attempt and holding no thread and no connection, and the task runs
        again when the time is up; that run replays the kept steps and goes on after this
        call. Raises :class:`~django_pgtasks.exceptions.Suspend` to end the run: let it
        propagate. The sleeps of a run are told apart by their order, so the code before
        each must take the same path on every run (the handler's steps keep what varies).
        For a wait that keeps the thread (a short back-off), use :meth:`wait`."""
        from django_pgtasks.exceptions import seconds_within_a_year

        self._sleep(seconds_within_a_year(seconds, "sleep()"), None)

    def sleep_until(self, when: datetime) -> None:
        """:meth:`sleep` until ``when`` (an aware datetime), as given at the first run: a
        run that computes a later ``when`` (``now() + ...``) still wakes at the first one."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError(f"sleep_until() takes an aware datetime, not {when!r}.")
        self._sleep(None, when)

    async def asleep(self, seconds: float | timedelta) -> None:
        """:meth:`sleep` for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        await sync_to_async(self.sleep, thread_sensitive=True)(seconds)

    async def asleep_until(self, when: datetime) -> None:
        """:meth:`sleep_until` for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        await sync_to_async(self.sleep_until, thread_sensitive=True)(when)

    def _outside_transactions(self, what: str) -> None:
        """Raise :class:`~django_pgtasks.exceptions.StepError` if a transaction is open on
        the task's database: the run ends at a durable sleep or wait, and the exception that
        ends it would roll back what the sleep or wait kept (and an atomic handler's
        writes)."""
        from django.db import connections

        from django_pgtasks.exceptions import StepError

        if connections[_tasks().task_database(self.task)].in_atomic_block:
            raise StepError(f"{what} cannot run inside a transaction (an atomic handler, "
                            f"transaction.atomic(), an atomic step): the run ends there, "
                            f"and the transaction would be rolled back.")

    def _sleep(self, seconds: float | None, until: datetime | None) -> None:
        from django_pgtasks.definition import events
        from django_pgtasks.definition import steps as rules
        from django_pgtasks.exceptions import Suspend

        self._outside_transactions("A durable sleep")
        state = self._steps
        state.sleeps += 1
        name = events.slept(state.sleeps)
        done, kept = self._replayed(name, own=True)
        if not done:
            assert state.kept is not None  # set by _replayed()
            rules.check_count(len(state.kept), name)
            entry = _tasks().keep_sleep(self.task, name, seconds, until)
            self._kept(entry)
            if _instant(entry["result"]["until"]) <= _instant(entry["at"]):
                return
            kept = entry["result"]
        wake = _instant(kept["until"])
        if done and self.task.started_at is not None and wake <= self.task.started_at:
            return
        raise Suspend(wake)

    def wait_for_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """Wait durably for the event ``key`` and return its payload
        (``Task.objects.send_event(key, payload)``, from any process, with its caller's
        transaction). An event sent before the wait began is found at once. Otherwise the
        run ends here without spending an attempt, holding no thread (as :meth:`sleep`),
        and the task runs again within milliseconds of the sender's commit; that run
        replays its kept steps, and this call returns the payload (kept with the task: later
        runs get the same one).

        ``timeout`` (seconds or a ``timedelta``, database clock, from the first run's wait):
        past it, raises :class:`~django_pgtasks.exceptions.EventTimeout` here (and in any
        later run). A run waits for a key at most once."""
        from django_pgtasks.definition import events
        from django_pgtasks.exceptions import EventTimeout, Suspend, seconds_within_a_year

        key = events.check_key(key)
        limit = None if timeout is None else seconds_within_a_year(timeout, "wait_for_event()")
        self._outside_transactions("A wait for an event")
        done, payload = self._replayed(events.received(key), own=True)
        if done:
            return payload
        state = self._steps
        assert state.kept is not None  # set by _replayed()
        if events.timed_out(key) in state.kept:
            raise EventTimeout(key, limit)
        began = time.monotonic()
        with _tasks().event_check(self.task, key) as found:
            if found.sent:
                return self._keep(events.received(key), found.payload, began)
            deadline = state.kept.get(events.deadline(key))
            if deadline is not None:
                until = _instant(deadline["result"]["until"])
            elif limit is not None:
                until = found.now + timedelta(seconds=limit)
                self._keep(events.deadline(key), {"until": until.isoformat()}, began)
            else:
                until = None
            expired = until is not None and until <= found.now
            if expired:
                self._keep(events.timed_out(key), True, began)
                _tasks().end_wait(self.task)
        if expired:
            raise EventTimeout(key, limit)
        raise Suspend(until, key)

    def run_tasks(self, name: str, tasks: Iterable[TaskRow],
                  timeout: float | timedelta | None = None) -> dict[str, Any]:
        """Enqueue ``tasks`` (unsaved, from ``handler.build(...)``) once, as the atomic step
        ``name``, and wait durably until every one of them has ended, holding no thread (as
        :meth:`wait_for_event`); return ``{"ids": [their ids], "ended": {state: count}}``.

        They run as a group on their own queues, with a callback (on this task's queue)
        that sends the event this task waits for, once they have all ended whatever their
        outcomes; read how each ended with ``Task.objects.filter(pk__in=result["ids"])``.
        Later runs of this task enqueue nothing more and get the same result. ``timeout``:
        as for :meth:`wait_for_event` (``EventTimeout``)."""
        import uuid

        from django_pgtasks.definition import events

        key = events.children(self.task_id, name)
        manager = _tasks()

        def enqueue(members: list[TaskRow]) -> list[int]:
            if not members:
                return []
            callback = manager.build(CHILDREN_ENDED, key, queue=self.task.queue)
            manager.enqueue_linked(
                [*members, callback], [*([] for _ in members), members],
                on_parent_failure=[*("skip" for _ in members), "run"],
                workflow_id=uuid.uuid4(), using=manager.task_database(self.task))
            return [member.pk for member in members]

        ids = self.step(name, enqueue, list(tasks), atomic=True)
        if not ids:
            return {"ids": [], "ended": {}}
        return {"ids": ids, "ended": self.wait_for_event(key, timeout)}

    async def arun_tasks(self, name: str, tasks: Iterable[TaskRow],
                         timeout: float | timedelta | None = None) -> dict[str, Any]:
        """:meth:`run_tasks` for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.run_tasks, thread_sensitive=True)(name, tasks, timeout)

    async def await_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        """:meth:`wait_for_event` for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.wait_for_event, thread_sensitive=True)(key, timeout)

    # -- progress and log ------------------------------------------------------------------

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Report how far the run is: ``done`` of ``total`` (``None``: unknown), with a
        short ``message``. Shown in the admin (a progress bar); written to the task's row at
        most once a second, and when the run ends. ``ValueError`` for a negative or
        non-finite number, or a total of 0. In an ``async def`` handler, use
        :meth:`aprogress` (a write may happen)."""
        report = run_report.current()
        if report is None:  # called outside a run (the handler called directly)
            return
        run_report.set_progress(report, done, total, message)
        if report.due:
            _tasks().write_report(self.task, report)

    async def aprogress(self, done: float, total: float | None = None,
                        message: str = "") -> None:
        """:meth:`progress` for ``async def`` handlers."""
        from asgiref.sync import sync_to_async

        report = run_report.current()
        if report is None:
            return
        run_report.set_progress(report, done, total, message)
        if report.due:
            await sync_to_async(_tasks().write_report, thread_sensitive=True)(self.task, report)

    @property
    def logger(self) -> logging.LoggerAdapter:
        """A logger whose records are kept with the task (its log in the admin), and go to
        the project's logging as ``django_pgtasks.task`` with the task's id. The records of
        any other logger of the project emitted during the run are kept too, from
        ``PGTASKS["TASK_LOG_LEVEL"]`` up."""
        from django_pgtasks.definition.run_report import TASK_LOGGER

        return logging.LoggerAdapter(logging.getLogger(TASK_LOGGER),
                                     {"task_id": self.task_id, "task_name": self.task.name})

    # -- durable steps ---------------------------------------------------------------------

    def step(self, name: str, func: Callable[..., Any], /, *args: Any, atomic: bool = False,
             **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` as the step ``name`` of this task, once: its result
        is kept with the task when it returns, and when the task runs again (a retry, a
        rescue after its worker died, a re-run from a step) a step kept already returns
        its kept result without running.

        The result must be plain JSON within ``PGTASKS["MAX_RESULT_BYTES"]``, and is
        returned as it was kept (a tuple comes back as a list, on the first run too).
        ``atomic=True`` runs ``func`` in a transaction with the step's checkpoint: its
        database writes commit together with it, exactly once; otherwise a step that was
        interrupted before its checkpoint runs again (at least once). Names are unique
        within a run (:class:`~django_pgtasks.exceptions.StepError`). If the run lost the
        task meanwhile (rescued, cancelled), the checkpoint raises
        :class:`~django_pgtasks.exceptions.LeaseLostError` (and an atomic step's writes are
        rolled back). In an ``async def`` handler, use :meth:`astep` (the checkpoint is a
        database write).
        """
        done, value = self._replayed(name)
        if done:
            return value
        began = time.monotonic()
        if atomic:
            from django.db import transaction

            with transaction.atomic(using=_tasks().task_database(self.task)):
                return self._keep(name, func(*args, **kwargs), began)
        return self._keep(name, func(*args, **kwargs), began)

    async def astep(self, name: str, func: Callable[..., Any], /, *args: Any,
                    atomic: bool = False, **kwargs: Any) -> Any:
        """:meth:`step` for ``async def`` handlers: ``await ctx.astep(name, func, ...)``.

        ``func`` may be an ``async def`` function (awaited) or a plain one (run on the
        database thread, ``sync_to_async``); the checkpoint is written there too. An atomic
        step's transaction cannot span awaits: with ``atomic=True``, ``func`` must be a plain
        function, and the whole step runs on the database thread
        (:class:`~django_pgtasks.exceptions.StepError` otherwise).
        """
        from asgiref.sync import sync_to_async

        from django_pgtasks.exceptions import StepError

        if atomic:
            if inspect.iscoroutinefunction(func):
                raise StepError(f"Step {name!r}: an atomic step runs in one database "
                                f"transaction, which cannot span awaits; give it a plain "
                                f"function (astep runs it on the database thread).")
            return await sync_to_async(self.step, thread_sensitive=True)(
                name, func, *args, atomic=True, **kwargs)
        done, value = self._replayed(name)
        if done:
            return value
        began = time.monotonic()
        if inspect.iscoroutinefunction(func):
            value = await func(*args, **kwargs)
        else:
            value = await sync_to_async(func, thread_sensitive=True)(*args, **kwargs)
        return await sync_to_async(self._keep, thread_sensitive=True)(name, value, began)

    def _replayed(self, name: str, *, own: bool = False) -> tuple[bool, Any]:
        """Check step ``name`` for this run; ``(True, its kept result)`` if it was kept.
        ``own``: an entry of the context's own (a sleep, a wait), named by it."""
        from django_pgtasks.definition import steps as rules
        from django_pgtasks.exceptions import StepError

        if not own:
            name = rules.check_name(name)
        state = self._steps
        if name in state.names:
            raise StepError(f"Step {name!r} ran already in this run of task {self.task_id}: "
                            f"step names are unique within a run.")
        state.names.add(name)
        if state.kept is None:
            state.kept = rules.completed(self.task.steps)
            state.used = rules.results_bytes(self.task.steps)
        entry = state.kept.get(name)
        if entry is None:
            return False, None
        return True, copy.deepcopy(entry.get("result"))

    def _keep(self, name: str, value: Any, began: float) -> Any:
        """Keep step ``name``, which returned ``value`` (it began at ``began``); return the
        result as kept."""
        from django_pgtasks.definition import steps as rules

        state = self._steps
        assert state.kept is not None  # set by _replayed()
        text = rules.stored_result(value, name, len(state.kept), state.used)
        self._kept(_tasks().checkpoint_step(self.task, name, text,
                                            (time.monotonic() - began) * 1000))
        state.used += len(text)
        return json.loads(text)

    def _kept(self, entry: dict[str, Any]) -> None:
        """Note ``entry``, just kept, in what this run knows of its task's steps."""
        assert self._steps.kept is not None  # set by _replayed()
        self._steps.kept[entry["name"]] = entry
        self.task.steps = [*self.task.steps, entry]

    # -- workflows -------------------------------------------------------------------------

    def parents(self) -> list[Any]:
        """How each task this one depends on ended (``depends_on``, a chain's previous step,
        a group's members for its callback), in the order they were given: a list of
        :class:`~django_pgtasks.lifecycle.dependencies.ParentOutcome` (``id``, ``name``,
        ``status``, ``result``, ``error_text``, ``succeeded``). Read from the database on
        each call."""
        return _tasks().parent_outcomes(self.task)

    def parent_result(self) -> Any:
        """The result of the one task this one depends on (a chain's previous step).

        Raises ``LookupError`` unless it depends on exactly one task."""
        parents = self.parents()
        if len(parents) != 1:
            raise LookupError(f"Task {self.task_id} depends on {len(parents)} tasks, not one; "
                              f"read them with parents().")
        return parents[0].result

    # -- snooze ----------------------------------------------------------------------------

    def snooze(self, seconds: float | timedelta) -> NoReturn:
        """Stop this attempt and run the task again after ``seconds`` (database clock)
        without using up an attempt: raises :class:`~django_pgtasks.exceptions.Snooze`."""
        from django_pgtasks.exceptions import Snooze

        raise Snooze(seconds)

    def then(
        self, handler: TaskHandler | str, *args: Any, stage: str | None = None,
        **options_and_kwargs: Any,
    ) -> TaskRow:
        """Enqueue the next stage of a pipeline *together with this task's success*.

        The follow-up task is inserted in the same transaction that records this task as
        SUCCESSFUL, so it exists if and only if this stage succeeded: a crash in between
        neither skips the next stage nor enqueues it twice. ``stage`` names it (shown in the
        admin; default: the handler's function name); other keyword arguments are the usual
        enqueue options (queue, priority, delay, ...) and the handler's keyword arguments.
        Follow-ups of an attempt that fails are discarded with it.
        """
        from django_pgtasks.exceptions import InvalidTaskError
        if "key" in options_and_kwargs:
            raise InvalidTaskError("A pipeline stage cannot have a deduplication key.")
        followup = _tasks().build(handler, *args, **options_and_kwargs)
        followup.stage = stage or followup.name.rsplit(".", 1)[-1]
        root = self.task.metadata.get("pipeline", self.task.pk)
        followup.metadata = {**followup.metadata, "pipeline": root, "parent": self.task.pk}
        self.task.followups.append(followup)
        return followup


@dataclass(eq=False)
class TaskHandler:
    """A registered task function plus its defaults. Call it to run the function directly."""

    func: Callable[..., Any]
    name: str
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    backoff: str | Backoff | None = None
    fatal: tuple[type[BaseException], ...] = ()
    atomic: bool = False
    takes_context: bool = False
    timeout: float | None = None
    #: When the scheduler enqueues runs of this handler (``@pgtask(schedule=...)``).
    schedule: When | None = None
    #: Default concurrency key of its tasks: a string, or a callable that takes the task's
    #: arguments and returns one (or ``None``); and the default limit for that key.
    concurrency_key: str | Callable[..., str | None] | None = None
    concurrency_limit: int | None = None
    is_async: bool = field(init=False)
    #: The function's signature, read once; ``None`` when it cannot be read.
    signature: inspect.Signature | None = field(init=False, repr=False)
    #: Per shape of a call checked by :meth:`check_arguments`: why it does not fit, or
    #: ``None`` when it does.
    _misfits: dict[tuple[int, frozenset[str], bool], str | None] = field(
        init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.func)
        try:
            self.signature = inspect.signature(self.func)
        except (TypeError, ValueError):  # some builtins and C callables have none
            self.signature = None
        self.__doc__ = self.func.__doc__
        self.__wrapped__ = self.func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskHandler {self.name}>"

    def check_arguments(self, args: tuple | list, kwargs: dict[str, Any]) -> None:
        """Raise :class:`~django_pgtasks.exceptions.InvalidTaskError` if the function could
        not be called with ``args`` and ``kwargs`` (after the context, for a handler that
        takes one): refused at enqueue, not failed at run time attempt after attempt."""
        problem = self.argument_problem(args, kwargs)
        if problem is not None:
            from django_pgtasks.exceptions import InvalidTaskError

            raise InvalidTaskError(self.misfit_message(problem))

    def argument_problem(self, args: tuple | list, kwargs: dict[str, Any], *,
                         context: bool | None = None) -> str | None:
        """Why the function could not be called with ``args`` and ``kwargs``, or ``None``
        when it could (or its signature cannot be read). With ``context`` (default: the
        handler's ``takes_context``) a first argument is left for the context.

        Every unexpected keyword is named, with the parameter it may be a misspelling of,
        even where Python reports only a missing argument: ``usr_id=1`` for ``user_id`` is
        "missing a required argument: 'user_id'; got an unexpected keyword argument 'usr_id'
        (did you mean 'user_id'?)".

        Whether a call fits a signature depends only on its shape (how many positional
        arguments, which keyword names), so the answer is kept per shape: ``enqueue_bulk()``
        of many calls binds once."""
        if self.signature is None:
            return None
        context = self.takes_context if context is None else context
        shape = (len(args), frozenset(kwargs), context)
        problem = self._misfits.get(shape, "")
        if problem == "":
            problem = argument_problem(self.signature, args, kwargs, context=context)
            if len(self._misfits) < SHAPES_KEPT:
                self._misfits[shape] = problem
        return problem

    def misfit_message(self, problem: str) -> str:
        """The full sentence for arguments that do not fit (see :meth:`argument_problem`)."""
        return (f"Task {self.name}: the arguments do not match "
                f"{self.func.__qualname__}{self.signature}: {problem}.")

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(resolve(self.backoff)(attempt))

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether ``exc`` fails the task at once instead of scheduling a retry."""
        from django_pgtasks.exceptions import FatalError

        return isinstance(exc, (FatalError, *self.fatal))

    def retry_after(self, task: TaskRow, exc: BaseException | None) -> float | None:
        """Seconds until the next attempt of ``task``, whose attempt just failed with ``exc``
        (``None`` for a time-out seen from outside), or ``None`` when the failure is final.

        The worker calls it once per failed attempt, on the thread that ran the attempt; the
        transition fails the task for good anyway once ``max_attempts`` are spent.
        """
        if exc is not None and self.is_fatal(exc):
            return None
        return self.retry_delay(task.attempt)

    # -- how the worker runs it (extension points for adapters, e.g. the django.tasks one) --

    def call(self, task: TaskRow, worker_id: str) -> Any:
        """Run the function for ``task`` and return its result as plain JSON.

        Raises whatever the function raises. A malformed stored payload raises
        :class:`~django_pgtasks.FatalError`; a return value PostgreSQL cannot store unchanged
        (not plain JSON, a NUL character or a lone surrogate anywhere, an integer too large
        for JSON, more than ``PGTASKS["MAX_RESULT_BYTES"]``) raises
        :class:`~django_pgtasks.exceptions.UnstorableResultError`, a ``FatalError``.

        An ``async def`` function runs on an event loop of its own (``async_to_sync``),
        with the time limit and the cancellation of :meth:`acall`.
        """
        args = self._arguments(task, worker_id)
        if self.is_async:
            from asgiref.sync import async_to_sync

            result = reported(task, async_to_sync(self._awaited), task, args)
        else:
            result = reported(task, self.func, *args, **task.kwargs)
        return storable_result(result)

    async def acall(self, task: TaskRow, worker_id: str) -> Any:
        """:meth:`call` of an ``async def`` function on the running event loop (the async
        pool's), in the current asyncio task: cancelled at the handler's ``timeout``
        (:class:`~django_pgtasks.exceptions.TaskTimeoutError`) or once the task's cancellation
        is signalled (:class:`~django_pgtasks.exceptions.TaskCancelled`); see
        :func:`await_handler`. Only for handlers whose :attr:`is_async` is true."""
        args = self._arguments(task, worker_id)
        return storable_result(await areported(task, self._awaited(task, args)))

    async def _awaited(self, task: TaskRow, args: list[Any]) -> Any:
        return await await_handler(self.func(*args, **task.kwargs), task, self.timeout)

    def _arguments(self, task: TaskRow, worker_id: str) -> list[Any]:
        """The positional arguments of a run of ``task`` (its context first, for a handler
        that takes one); :class:`~django_pgtasks.FatalError` for a malformed stored
        payload."""
        if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
            from django_pgtasks.exceptions import FatalError

            raise FatalError(
                f"Malformed stored payload: args must be a JSON array and kwargs a JSON object "
                f"(got {type(task.args).__name__} and {type(task.kwargs).__name__})."
            )
        args = list(task.args)
        if self.takes_context:
            args.insert(0, TaskContext(task=task, worker_id=worker_id))
        return args

    def started(self, task: TaskRow, worker_id: str) -> None:
        """Called in the worker thread just before :meth:`call`."""

    def finished(self, task: TaskRow, worker_id: str, exception: BaseException | None) -> None:
        """Called after the outcome is recorded; on failure from inside the ``except`` block."""

    def enqueue(
        self,
        *args: Any,
        queue: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> TaskRow:
        """Enqueue a run of this handler; see :meth:`TaskManager.enqueue`."""
        return _tasks().enqueue(
            self, *args, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, using=using, key=key, **kwargs,
        )

    def build(self, *args: Any, **kwargs: Any) -> TaskRow:
        """An unsaved, validated task for :meth:`TaskManager.enqueue_many`."""
        return _tasks().build(self, *args, **kwargs)


def reported(task: TaskRow, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, the run of ``task``, with what it reports (its progress
    and log records, :mod:`django_pgtasks.definition.run_report`) collected and written
    as it ends."""
    report, token = run_report.begin()
    try:
        return func(*args, **kwargs)
    finally:
        run_report.end(token)
        if report.pending:
            _write_last_report(task, report)


async def areported(task: TaskRow, awaitable: Awaitable[Any]) -> Any:
    """:func:`reported` for a run on the event loop: the last write on the database
    thread."""
    from asgiref.sync import sync_to_async

    report, token = run_report.begin()
    try:
        return await awaitable
    finally:
        run_report.end(token)
        if report.pending:
            await sync_to_async(_write_last_report, thread_sensitive=True)(task, report)


def _write_last_report(task: TaskRow, report: Any) -> None:
    """Write what the run reported last, as it ends; a failure to write it is logged, never
    raised (the run's outcome matters more)."""
    try:
        _tasks().write_report(task, report)
    except Exception:
        logger.warning("Task id=%s: its last progress and log records could not be written.",
                       task.pk, exc_info=True)


def _instant(value: Any) -> datetime:
    """A time kept in a step's entry (ISO 8601 text, as ``jsonb`` writes it) as an aware
    datetime."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def storable_result(result: Any) -> Any:
    """``result`` as plain JSON PostgreSQL can store, else
    :class:`~django_pgtasks.exceptions.UnstorableResultError`."""
    if result is None:  # what most handlers return: stored as NULL, nothing to check
        return None
    from django_pgtasks.definition.payload import normalize_result
    from django_pgtasks.exceptions import InvalidPayloadError, UnstorableResultError

    try:
        return normalize_result(result)
    except InvalidPayloadError as exc:
        raise UnstorableResultError(str(exc)) from exc


async def await_handler(awaitable: Awaitable[Any], task: TaskRow,
                        timeout: float | None) -> Any:
    """Await a handler's coroutine in the current asyncio task, the way the worker runs one.

    After ``timeout`` seconds the coroutine is cancelled and the run raises
    :class:`~django_pgtasks.exceptions.TaskTimeoutError`; once ``task``'s cancellation is
    signalled (:func:`cancel_signal`, set by the worker from any thread) it is cancelled and
    the run raises :class:`~django_pgtasks.exceptions.TaskCancelled`. A coroutine that
    swallows its ``CancelledError`` and returns ends with what it returned. A cancellation of
    the current task from elsewhere (a pool shutting down) propagates as ``CancelledError``.

    The coroutine runs in the current task, not in one of its own, so that ``SystemExit`` or
    ``KeyboardInterrupt`` raised by the handler reaches the caller like any exception instead
    of escaping the event loop (a long-lived one, in the async pool).
    """
    from django_pgtasks.exceptions import TaskCancelled, TaskTimeoutError

    current = asyncio.current_task()
    if current is None:  # pragma: no cover - only ever awaited inside a task
        raise RuntimeError("await_handler() must be awaited inside an asyncio task")
    loop = asyncio.get_running_loop()
    signal = cancel_signal(task)
    # Read and written on the loop's thread only: a cancellation scheduled from another
    # thread is dropped once the handler is done (it would hit the caller's next await).
    state = {"running": True, "cancelled": False}

    def cancel_here() -> None:
        if state["running"] and not state["cancelled"]:
            state["cancelled"] = True
            current.cancel()

    remove = signal.add_callback(lambda: loop.call_soon_threadsafe(cancel_here))
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await awaitable
    except asyncio.CancelledError:
        if not state["cancelled"]:
            raise
        raise TaskCancelled("The task was cancelled while it ran; its coroutine was "
                            "cancelled.") from None
    except TimeoutError:
        if not deadline.expired():
            raise  # the handler's own TimeoutError
        raise TaskTimeoutError(
            f"Task exceeded its time limit of {timeout:g}s and was cancelled.") from None
    finally:
        state["running"] = False
        remove()
        if state["cancelled"]:
            current.uncancel()  # handled here: not a cancellation of the caller's task


def argument_problem(signature: inspect.Signature, args: tuple | list, kwargs: dict[str, Any],
                     *, context: bool = False) -> str | None:
    """Why a function of ``signature`` could not be called with ``args`` and ``kwargs`` (after
    a first argument for the context, with ``context``), or ``None`` when it could. Names
    every unexpected keyword argument, not only the first problem Python finds."""
    try:
        signature.bind(*((None,) if context else ()), *args, **kwargs)
    except TypeError as exc:
        problem = str(exc)
    else:
        return None
    unexpected = unexpected_keywords(signature, kwargs)
    if not unexpected:
        return problem
    # Python names the first problem it meets; a misspelt keyword is often reported only as
    # the argument it was meant for ("missing a required argument: 'user_id'").
    parts = [] if problem.startswith("got an unexpected keyword argument") else [problem]
    keywords = [p.name for p in signature.parameters.values() if p.kind in _BY_KEYWORD]
    for name in unexpected:
        close = difflib.get_close_matches(name, keywords, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        parts.append(f"got an unexpected keyword argument {name!r}{hint}")
    return "; ".join(parts)


#: Kinds of parameters a keyword argument binds to.
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def unexpected_keywords(signature: inspect.Signature, kwargs: dict[str, Any]) -> list[str]:
    """The keyword arguments no parameter of ``signature`` takes, in their order."""
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [name for name in kwargs
            if name not in parameters or parameters[name].kind not in _BY_KEYWORD]
