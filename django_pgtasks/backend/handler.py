"""The worker's side: running the Django task a row names, with Django's signals."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from django_pgtasks.definition.framework import (
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from django_pgtasks.definition.handlers import TaskContext as Context
from django_pgtasks.definition.handlers import areported, await_handler, reported
from django_pgtasks.definition.payload import normalize_result
from django_pgtasks.definition.registry import TaskHandler
from django_pgtasks.exceptions import (
    FatalError,
    InvalidPayloadError,
)
from django_pgtasks.telemetry.console import worker_state_signal

if TYPE_CHECKING:
    from django_pgtasks.models import Task as TaskRow

from django_pgtasks.backend.errors import InvalidReturnValue
from django_pgtasks.backend.importing import import_task
from django_pgtasks.backend.results import (
    _STATUS,
    backend_alias,
    error_from_exception,
    result_from_row,
)

logger = logging.getLogger("django_pgtasks.backend")


def _send_state(signal: Any, sender: type, result: TaskResult) -> None:
    """``signal.send_robust()``: Django's receivers log the state change on its logger as
    they would with any backend; ``run_pgtasks``'s console shows the worker's line of it
    only (:mod:`django_pgtasks.telemetry.console`)."""
    with worker_state_signal():
        signal.send_robust(sender=sender, task_result=result)


#: Attribute of a claimed row that carries its run (the Django task and its result) from
#: ``started()`` through ``call()`` and ``retry_after()`` to ``finished()``.
_RUN_ATTR = "_django_tasks_run"


@dataclasses.dataclass(frozen=True)
class _Run:
    backend: Any  # a PgTasksBackend
    task: Task
    result: TaskResult

    @classmethod
    def for_row(cls, row: TaskRow) -> _Run:
        alias = backend_alias(row)
        if alias is None:
            raise FatalError(
                f"Task id={row.pk} names the Django task {row.name!r} but was not enqueued "
                f"through a django.tasks backend, so it is not run."
            )
        try:
            backend = task_backends[alias]
        except InvalidTaskBackend as exc:
            raise FatalError(
                f"Task id={row.pk} was enqueued through the task backend {alias!r}, which is "
                f"not configured in TASKS any more."
            ) from exc
        if not getattr(backend, "stores_in_pgtasks", False):
            raise FatalError(
                f"Task id={row.pk} was enqueued through the task backend {alias!r}, whose class "
                f"is now {type(backend).__name__}, not a PgTasksBackend."
            )
        # HandlerImportError (an interruption) if the task's module may be imported by name
        # but cannot be imported now; any other path is never imported.
        task = import_task(row.name, missing_ok=False)
        if task is None:
            raise FatalError(
                f"{row.name!r} names no django.tasks Task of an installed app, of the "
                f"project's package or of PGTASKS['TASK_MODULES'], so it is not run."
            )
        task = backend.task_for_row(task, row)
        return cls(backend, task, result_from_row(row, task, alias))


class DjangoTaskHandler(TaskHandler):
    """Runs the ``django.tasks`` Task named by a row, for rows :class:`PgTasksBackend` wrote.

    The worker calls ``started()``, ``call()``, on failure ``retry_after()``, then
    ``finished()``: on failure from inside its ``except`` block, as Django's logging of
    ``task_finished`` expects. The run travels with the claimed row.
    """

    def check_arguments(self, args: tuple | list, kwargs: dict[str, Any]) -> None:
        """Nothing to check here: Django's ``Task.enqueue()`` takes the arguments as Django
        defines it, and the function's context parameter is Django's to fill."""

    def started(self, task: TaskRow, worker_id: str) -> None:
        """Send Django's ``task_started``. Never raises: ``call()`` reports any problem."""
        try:
            run = _Run.for_row(task)
        except Exception:
            return
        task.__dict__[_RUN_ATTR] = run
        _send_state(task_started, type(run.backend), run.result)

    def call(self, task: TaskRow, worker_id: str) -> Any:
        """Run the Django task with the row's arguments; return its value as plain JSON."""
        run, args = self._run_and_arguments(task, worker_id)
        return _storable(reported(task, run.task.call, *args, **task.kwargs))

    async def acall(self, task: TaskRow, worker_id: str) -> Any:
        """:meth:`call` of an ``async def`` Django task on the running event loop (the async
        pool's), cancelled once the row's cancellation is signalled."""
        run, args = self._run_and_arguments(task, worker_id)
        return _storable(await areported(
            task, await_handler(run.task.acall(*args, **task.kwargs), task, None)))

    def _run_and_arguments(self, task: TaskRow, worker_id: str) -> tuple[_Run, list[Any]]:
        """The row's run (made by ``started()``, else now) and the positional arguments."""
        run = task.__dict__.get(_RUN_ATTR) or _Run.for_row(task)
        if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
            raise FatalError(
                f"Malformed stored payload: args must be a JSON array and kwargs a JSON object "
                f"(got {type(task.args).__name__} and {type(task.kwargs).__name__})."
            )
        args = list(task.args)
        if run.task.takes_context:
            args.insert(0, DurableTaskContext(
                task_result=run.result, durable=Context(task=task, worker_id=worker_id)))
        task.__dict__[_RUN_ATTR] = run
        return run, args

    def retry_after(self, task: TaskRow, exc: BaseException | None) -> float | None:
        """The backend's decision (``RetryableTask`` options, ``retry_delay()`` of a
        subclass) for the attempt that just raised ``exc``; ``None`` when it is final."""
        run = task.__dict__.get(_RUN_ATTR)
        if exc is None or run is None:
            return super().retry_after(task, exc)
        if isinstance(exc, FatalError):
            return None
        return _retry_decision(run, task, exc)

    def finished(self, task: TaskRow, worker_id: str, exception: BaseException | None) -> None:
        """Send Django's ``task_finished``.

        (A ``KeyboardInterrupt`` raised by a task is recorded as that attempt's failure like
        any exception; the worker then stops as Ctrl+C would stop it.)
        """
        run = task.__dict__.pop(_RUN_ATTR, None)
        result = _finished_result(run, task, exception) if run is not None else None
        if result is not None:
            _send_state(task_finished, type(run.backend), result)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DurableTaskContext(TaskContext):
    """Django's ``TaskContext`` (``task_result``, ``attempt``) for tasks defined with
    ``@task(takes_context=True)``, with the durable parts of django-pgtasks' own context:
    steps, durable sleeps and waits for events, cancellation. Each method is that of
    :class:`django_pgtasks.definition.handlers.TaskContext`."""

    durable: Context = dataclasses.field(repr=False, compare=False)

    def step(self, name: str, func: Callable[..., Any], /, *args: Any, atomic: bool = False,
             **kwargs: Any) -> Any:
        return self.durable.step(name, func, *args, atomic=atomic, **kwargs)

    async def astep(self, name: str, func: Callable[..., Any], /, *args: Any,
                    atomic: bool = False, **kwargs: Any) -> Any:
        return await self.durable.astep(name, func, *args, atomic=atomic, **kwargs)

    def sleep(self, seconds: float | timedelta) -> None:
        self.durable.sleep(seconds)

    def sleep_until(self, when: datetime) -> None:
        self.durable.sleep_until(when)

    async def asleep(self, seconds: float | timedelta) -> None:
        await self.durable.asleep(seconds)

    async def asleep_until(self, when: datetime) -> None:
        await self.durable.asleep_until(when)

    def wait_for_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        return self.durable.wait_for_event(key, timeout)

    async def await_event(self, key: str, timeout: float | timedelta | None = None) -> Any:
        return await self.durable.await_event(key, timeout)

    def run_tasks(self, name: str, tasks: Iterable[Any],
                  timeout: float | timedelta | None = None) -> dict[str, Any]:
        return self.durable.run_tasks(name, tasks, timeout)

    async def arun_tasks(self, name: str, tasks: Iterable[Any],
                         timeout: float | timedelta | None = None) -> dict[str, Any]:
        return await self.durable.arun_tasks(name, tasks, timeout)

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        self.durable.progress(done, total, message)

    async def aprogress(self, done: float, total: float | None = None,
                        message: str = "") -> None:
        await self.durable.aprogress(done, total, message)

    @property
    def logger(self) -> logging.LoggerAdapter:
        return self.durable.logger

    @property
    def cancelled(self) -> bool:
        return self.durable.cancelled

    def raise_if_cancelled(self) -> None:
        self.durable.raise_if_cancelled()


def _storable(value: Any) -> Any:
    """A Django task's return value as plain JSON, else :class:`InvalidReturnValue`."""
    try:
        return normalize_result(value)
    except InvalidPayloadError as exc:
        raise InvalidReturnValue(str(exc)) from exc


def _retry_decision(run: _Run, row: TaskRow, exc: BaseException) -> float | None:
    """Seconds until the retry of the attempt that just raised ``exc``, or ``None``."""
    if isinstance(exc, FatalError) or row.attempt >= row.max_attempts:
        return None
    failed = dataclasses.replace(
        run.result, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
        errors=[*run.result.errors, error_from_exception(exc)],
    )
    return run.backend.retry_delay(run.task, exc, failed, row.attempt)


def _finished_result(run: _Run, row: TaskRow, exception: BaseException | None
                     ) -> TaskResult | None:
    """The result as the worker just recorded it (times from this process's clock), or
    ``None`` if nothing was recorded (the worker no longer held the task)."""
    if exception is None:
        if row.status != "SUCCESSFUL":
            return None
        result = dataclasses.replace(run.result, status=TaskResultStatus.SUCCESSFUL,
                                     finished_at=timezone.now())
        object.__setattr__(result, "_return_value", row.result)
        return result
    if row.status not in _STATUS or row.status == "RUNNING":
        return None
    status = _STATUS[row.status]
    return dataclasses.replace(
        run.result, status=status,
        finished_at=timezone.now() if status == TaskResultStatus.FAILED else None,
        errors=[*run.result.errors, error_from_exception(exception)],
    )
