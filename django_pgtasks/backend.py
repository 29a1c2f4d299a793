"""The ``django.tasks`` backend: Django's Tasks API on the django-pgtasks queue.

::

    TASKS = {
        "default": {
            "BACKEND": "django_pgtasks.backend.PgTasksBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF": "exponential"},
        }
    }

A ``@task`` enqueued through this backend becomes one row of the ``pgtasks_task`` table that
``@pgtask`` handlers use, so one ``run_pgtasks`` worker, one admin and one set of operator
actions serve both APIs. The row's ``name`` is the task's module path and its ``metadata``
holds ``{"django_tasks": {"backend": <alias>}}``. A worker finds the function through
:func:`resolve`, which returns a handler only for a module path that imports to a
``django.tasks.Task``; that handler refuses to run any row this backend did not write.

How Django's values map onto the native ones:

- priority: native = Django + 100, so Django's -100..100 becomes 0..200, the order is kept
  and both defaults (0 and 100) meet;
- status: READY and AWAITING_RETRY → READY, RUNNING → RUNNING, SUCCESSFUL → SUCCESSFUL,
  FAILED and CANCELLED → FAILED;
- result id: the row's primary key as a decimal string; for a row on another database than
  ``PGTASKS["DATABASE"]`` (a queue with a ``"database"`` option), ``<pk>@<alias>``, since
  primary keys repeat across databases.

This module is imported with the first ``tasks.py`` that uses it, before the app registry is
ready: it imports models lazily and reads no setting at import time.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import inspect
import logging
import math
import re
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils import timezone

from django_pgtasks.base import registry
from django_pgtasks.base.compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgtasks.base.payload import normalize_payload, normalize_result
from django_pgtasks.base.registry import MAX_NAME_LENGTH, TaskHandler
from django_pgtasks.base.routing import database_for_queue
from django_pgtasks.base.validation import MAX_ATTEMPTS_LIMIT, check_run_after
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.exceptions import (
    FatalError,
    InvalidPayloadError,
    InvalidTaskError,
    UnstorableResultError,
)
from django_pgtasks.retry import POLICIES
from django_pgtasks.retry import resolve as resolve_policy
from django_pgtasks.signals import task_enqueued as native_task_enqueued

if TYPE_CHECKING:
    from django_pgtasks.models import Task as TaskRow

logger = logging.getLogger("django_pgtasks.backend")

#: A row's native priority is its Django priority plus this offset.
PRIORITY_OFFSET = 100
#: The key of ``Task.metadata`` under which the backend marks the rows it writes.
METADATA_KEY = "django_tasks"
#: ``OPTIONS`` keys and their defaults. One attempt is Django's behaviour: no retries.
OPTION_DEFAULTS: dict[str, Any] = {"MAX_ATTEMPTS": 1, "BACKOFF": None}

#: A retry policy in the shape of Django's retry proposal: seconds (or a timedelta) to wait
#: before the next attempt, or ``None`` to stop retrying.
Backoff = Callable[[BaseException, TaskResult], "float | timedelta | None"]

_STATUS = {
    "READY": TaskResultStatus.READY,
    "AWAITING_RETRY": TaskResultStatus.READY,
    "RUNNING": TaskResultStatus.RUNNING,
    "SUCCESSFUL": TaskResultStatus.SUCCESSFUL,
    "FAILED": TaskResultStatus.FAILED,
    "CANCELLED": TaskResultStatus.FAILED,
}
_FINISHED = ("SUCCESSFUL", "FAILED", "CANCELLED")


class InvalidTaskArguments(InvalidTask, InvalidPayloadError):
    """Task arguments that would not come back unchanged from JSON, or that PostgreSQL would
    refuse; nothing was enqueued.

    Django's ``InvalidTask``, and the ``InvalidPayloadError`` that ``@pgtask`` handlers
    raise for the same arguments (a ``TypeError``, as Django raises for arguments that cannot
    be serialized, and a ``ValueError``).
    """


class InvalidReturnValue(UnstorableResultError):
    """A task returned something PostgreSQL cannot store unchanged as its result; the task
    fails without a retry (an ``UnstorableResultError``: a ``FatalError`` and a
    ``TypeError``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryableTask(Task):
    """A ``django.tasks.Task`` with retry options: the ``task_class`` of :class:`PgTasksBackend`.

    ``@task(max_attempts=5, backoff="linear")`` creates one on Django 6.1 and later and with
    the backport (Django 6.0's decorator does not pass extra arguments on). The names follow
    Django's proposal for a retry API; ``using()`` keeps them and cannot change them.
    """

    #: Attempts in all, the first included (1: never retried). ``None``: the backend's
    #: ``OPTIONS["MAX_ATTEMPTS"]`` (default 1).
    max_attempts: int | None = None
    #: ``"exponential"``, ``"linear"``, or ``backoff(exception, task_result)`` returning the
    #: seconds (or a timedelta) to wait, or ``None`` to stop retrying. ``None``: the backend's
    #: ``OPTIONS["BACKOFF"]``, then ``PGTASKS["BACKOFF"]``.
    backoff: str | Backoff | None = None


class PgTasksBackend(BaseTaskBackend):
    """Stores Django tasks in the django-pgtasks table; ``run_pgtasks`` runs them."""

    task_class = RetryableTask

    # run_after becomes the row's run_after: no worker claims the task before then.
    supports_defer = True
    # ``async def`` task functions run in the worker, through async_to_sync.
    supports_async_task = True
    # Results are rows of the task table, readable from any process.
    supports_get_result = True
    # Django's -100..100 maps onto the native 0..200 (native = Django + 100); higher first.
    supports_priority = True

    # -- validation ------------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks, then: a queue that workers serve, a storable name, retry options,
        a ``run_after`` the database can hold (naive ones are checked once made aware)."""
        super().validate_task(task)
        queues = pgtasks_settings.queue_names
        if task.queue_name not in queues:
            raise InvalidTask(
                f"Queue {task.queue_name!r} is not in PGTASKS['QUEUES'] ({', '.join(queues)}), "
                f"so no worker would run the task."
            )
        if len(task.module_path) > MAX_NAME_LENGTH:
            raise InvalidTask(
                f"The task's module path is longer than {MAX_NAME_LENGTH} characters: "
                f"{task.module_path!r}."
            )
        errors = retry_option_errors(
            getattr(task, "max_attempts", None), getattr(task, "backoff", None)
        )
        if errors:
            raise InvalidTask(errors[0])
        if task.run_after is not None and timezone.is_aware(task.run_after):
            try:
                check_run_after(task.run_after)
            except InvalidTaskError as exc:
                raise InvalidTask(str(exc)) from exc

    # -- enqueueing ------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Insert one row (in the caller's transaction, if any) and return its result."""
        self.validate_task(task)
        row = self._build_row(task, args, kwargs)
        row.save(force_insert=True, using=database_for_queue(row.queue))
        result = result_from_row(row, task, self.alias)
        native_task_enqueued.send(sender=type(row), task=row)
        task_enqueued.send(sender=type(self), task_result=result)
        return result

    async def aenqueue(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult:
        """Like :meth:`enqueue`; only the INSERT leaves the event loop (``Model.asave``)."""
        self.validate_task(task)
        row = self._build_row(task, args, kwargs)
        await row.asave(force_insert=True, using=database_for_queue(row.queue))
        result = result_from_row(row, task, self.alias)
        await native_task_enqueued.asend(sender=type(row), task=row)
        await task_enqueued.asend(sender=type(self), task_result=result)
        return result

    def _build_row(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskRow:
        """A validated, unsaved row; raises Django's ``InvalidTask`` and writes nothing."""
        from django_pgtasks.models import Task as TaskRow

        try:
            clean_args, clean_kwargs = normalize_payload(args, kwargs)
        except InvalidPayloadError as exc:
            raise InvalidTaskArguments(str(exc)) from exc
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            # Django allows naive datetimes only with USE_TZ = False: they mean local time.
            run_after = timezone.make_aware(run_after)
        try:
            row = TaskRow.objects.build(
                handler_for(task),
                queue=task.queue_name,
                priority=int(task.priority) + PRIORITY_OFFSET,
                run_after=run_after,
                max_attempts=self._max_attempts(task),
            )
        except InvalidTaskError as exc:
            raise InvalidTask(str(exc)) from exc
        row.args, row.kwargs = clean_args, clean_kwargs
        row.metadata = {METADATA_KEY: {"backend": self.alias}}
        return row

    def _max_attempts(self, task: Task) -> int:
        value = getattr(task, "max_attempts", None)
        return self.options.get("MAX_ATTEMPTS", 1) if value is None else value

    # -- results ---------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The result stored under ``result_id``; ``TaskResultDoesNotExist`` if there is none."""
        from django_pgtasks.models import Task as TaskRow

        pk, database = parse_result_location(result_id)
        row = None
        if pk is not None:
            row = TaskRow.objects.using(database).filter(pk=pk).first()
        return self._result_or_error(result_id, row)

    async def aget_result(self, result_id: str) -> TaskResult:
        """See :meth:`get_result`."""
        from django_pgtasks.models import Task as TaskRow

        pk, database = parse_result_location(result_id)
        row = None
        if pk is not None:
            row = await TaskRow.objects.using(database).filter(pk=pk).afirst()
        return self._result_or_error(result_id, row)

    def wait_result(
        self, result_id: str, timeout: float | None = None, *, poll_interval: float = 5.0
    ) -> TaskResult:
        """Block until the result is finished and return it (see :meth:`get_result`).

        Wakes on the completion's ``NOTIFY`` (see :mod:`django_pgtasks.lifecycle.waiting`); raises
        :class:`~django_pgtasks.exceptions.TaskWaitTimeout` (a ``TimeoutError``) after
        ``timeout`` seconds and ``TaskResultDoesNotExist`` for an unknown id.
        ``django_pgtasks.lifecycle.waiting.wait_for_result(result)`` waits and refreshes a result.
        """
        from django_pgtasks.lifecycle.waiting import wait_for_task
        from django_pgtasks.models import Task as TaskRow

        pk = parse_result_id(result_id)
        self.get_result(result_id)  # TaskResultDoesNotExist unless it is one of ours
        with contextlib.suppress(TaskRow.DoesNotExist):  # purged meanwhile: get_result() says
            wait_for_task(pk, timeout, using=pgtasks_settings.DATABASE,
                          poll_interval=poll_interval)
        return self.get_result(result_id)

    def _result_or_error(self, result_id: str, row: TaskRow | None) -> TaskResult:
        if row is None or backend_alias(row) != self.alias:
            raise TaskResultDoesNotExist(
                f"There is no task result with id {result_id!r} in the backend {self.alias!r}."
            )
        task = import_task(row.name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"Task result {result_id!r} belongs to {row.name!r}, which no longer imports "
                f"to a task."
            )
        return result_from_row(row, self.task_for_row(task, row), self.alias)

    def task_for_row(self, task: Task, row: TaskRow) -> Task:
        """``task`` as the row was enqueued: its priority, queue, run_after and this backend."""
        run_after = row.run_after if row.run_after != row.created_at else None
        try:
            return task.using(
                priority=row.priority - PRIORITY_OFFSET,
                queue_name=row.queue,
                run_after=run_after,
                backend=self.alias,
            )
        except InvalidTask:
            # The settings changed since (e.g. the queue was removed): the stored facts stay
            # on the row and the result; only the task object keeps its defaults.
            return task

    # -- retries ---------------------------------------------------------------------------

    def retry_delay(self, task: Task, exception: BaseException,
                    task_result: TaskResult, attempt: int) -> float | None:
        """Seconds to wait before retrying ``task`` after failed attempt ``attempt``, or
        ``None`` to fail it now. ``task_result`` already shows the failed attempt."""
        backoff = getattr(task, "backoff", None)
        if backoff is None:
            backoff = self.options.get("BACKOFF")
        try:
            if backoff is None or isinstance(backoff, str):
                return float(resolve_policy(backoff)(attempt))
            value = backoff(exception, task_result)
        except Exception:
            logger.exception(
                "Task id=%s name=%s: its backoff raised, so the task is not retried.",
                task_result.id, task.module_path,
            )
            return None
        if value is None:
            return None
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or math.isnan(seconds) or seconds < 0):
            logger.error(
                "Task id=%s name=%s: its backoff returned %r, not a non-negative number of "
                "seconds, a timedelta or None, so the task is not retried.",
                task_result.id, task.module_path, value,
            )
            return None
        # PGTASKS["BACKOFF_MAX"] bounds every retry delay (and keeps run_after in range).
        return float(min(seconds, pgtasks_settings.BACKOFF_MAX))

    # -- system checks ---------------------------------------------------------------------

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        obj = f"TASKS[{self.alias!r}]"
        name = type(self).__name__
        if not apps.is_installed("django_pgtasks"):
            yield checks.Error(
                f"{name} stores tasks in the django-pgtasks table, but 'django_pgtasks' is not "
                f"in INSTALLED_APPS.",
                hint="Add 'django_pgtasks' to INSTALLED_APPS.",
                obj=obj, id="django_pgtasks.E101",
            )
        database = pgtasks_settings.DATABASE
        if database not in settings.DATABASES:
            yield checks.Error(
                f"{name} uses the database {database!r} (PGTASKS['DATABASE']), which is not an "
                f"alias in DATABASES.",
                obj=obj, id="django_pgtasks.E102",
            )
        elif connections[database].vendor != "postgresql":
            yield checks.Error(
                f"{name} needs PostgreSQL, but the database {database!r} (PGTASKS['DATABASE']) "
                f"uses the {connections[database].vendor!r} backend.",
                hint="Point PGTASKS['DATABASE'] at a PostgreSQL alias.",
                obj=obj, id="django_pgtasks.E102",
            )
        missing = sorted(self.queues - set(pgtasks_settings.queue_names))
        if missing:
            yield checks.Error(
                f"The queues {', '.join(map(repr, missing))} of {obj} are not in "
                f"PGTASKS['QUEUES'], so no worker would run their tasks.",
                hint="List every queue of TASKS in PGTASKS['QUEUES'] as well.",
                obj=obj, id="django_pgtasks.E103",
            )
        for key in sorted(set(self.options) - set(OPTION_DEFAULTS)):
            yield checks.Error(
                f"{obj}['OPTIONS'] has an unknown key {key!r}.",
                hint=f"The valid keys are {', '.join(OPTION_DEFAULTS)}.",
                obj=obj, id="django_pgtasks.E104",
            )
        for message in retry_option_errors(
            self.options.get("MAX_ATTEMPTS"), self.options.get("BACKOFF"),
            (f"{obj}['OPTIONS']['MAX_ATTEMPTS']", f"{obj}['OPTIONS']['BACKOFF']"),
        ):
            yield checks.Error(message, obj=obj, id="django_pgtasks.E105")


# -- the worker side ---------------------------------------------------------------------

#: Attribute of a claimed row that carries its run from ``started()`` to ``finished()``.
_RUN_ATTR = "_django_tasks_run"
#: The retry decision for the exception a task just raised, per worker thread: computed in
#: ``call()`` (which has the task, the result and the exception), read by ``is_fatal()``
#: and ``retry_delay()`` (which the worker then calls with less).
_decisions = threading.local()


@dataclasses.dataclass(frozen=True)
class _Run:
    backend: PgTasksBackend
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
        if not isinstance(backend, PgTasksBackend):
            raise FatalError(
                f"Task id={row.pk} was enqueued through the task backend {alias!r}, whose class "
                f"is now {type(backend).__name__}, not a PgTasksBackend."
            )
        # HandlerImportError (an interruption) if the task's module is in an installed app
        # but cannot be imported now; a path outside installed apps is never imported.
        task = import_task(row.name, missing_ok=False)
        if task is None:
            raise FatalError(
                f"{row.name!r} names no django.tasks Task of an installed app, so it is not run."
            )
        task = backend.task_for_row(task, row)
        return cls(backend, task, result_from_row(row, task, alias))


class DjangoTaskHandler(TaskHandler):
    """Runs the ``django.tasks`` Task named by a row, for rows :class:`PgTasksBackend` wrote.

    The worker calls ``started()``, ``call()``, and on failure ``is_fatal()`` and
    ``retry_delay()`` (all from the same thread), then ``finished()``: on failure from inside
    its ``except`` block, as Django's logging of ``task_finished`` expects.
    """

    def started(self, task: TaskRow, worker_id: str) -> None:
        """Send Django's ``task_started``. Never raises: ``call()`` reports any problem."""
        _decisions.__dict__.clear()
        try:
            run = _Run.for_row(task)
        except Exception:
            return
        task.__dict__[_RUN_ATTR] = run
        task_started.send_robust(sender=type(run.backend), task_result=run.result)

    def call(self, task: TaskRow, worker_id: str) -> Any:
        """Run the Django task with the row's arguments; return its value as plain JSON."""
        run = task.__dict__.get(_RUN_ATTR) or _Run.for_row(task)
        if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
            raise FatalError(
                f"Malformed stored payload: args must be a JSON array and kwargs a JSON object "
                f"(got {type(task.args).__name__} and {type(task.kwargs).__name__})."
            )
        args = list(task.args)
        if run.task.takes_context:
            args.insert(0, TaskContext(task_result=run.result))
        try:
            value = run.task.call(*args, **task.kwargs)
        except BaseException as exc:
            _decisions.decision = (exc, _retry_decision(run, task, exc))
            raise
        try:
            value = normalize_result(value)
        except InvalidPayloadError as exc:
            raise InvalidReturnValue(str(exc)) from exc
        return value

    def is_fatal(self, exc: BaseException) -> bool:
        if isinstance(exc, FatalError):
            return True
        decision = getattr(_decisions, "decision", None)
        return decision is not None and decision[0] is exc and decision[1] is None

    def retry_delay(self, attempt: int) -> float:
        decision = _decisions.__dict__.pop("decision", None)
        if decision is not None and decision[1] is not None:
            return decision[1]
        return super().retry_delay(attempt)

    def finished(self, task: TaskRow, worker_id: str, exception: BaseException | None) -> None:
        """Send Django's ``task_finished``; pass a ``KeyboardInterrupt`` on to the main thread.

        A ``KeyboardInterrupt`` raised by a task is recorded as that attempt's failure like
        any exception (the worker catches everything in its threads), then raised again
        where Python raises interrupts: in the main thread, as Ctrl+C would. ``run_pgtasks``
        treats it as Ctrl+C: it stops claiming, lets running tasks finish, and exits.
        """
        _decisions.__dict__.clear()
        run = task.__dict__.pop(_RUN_ATTR, None)
        try:
            result = _finished_result(run, task, exception) if run is not None else None
            if result is not None:
                task_finished.send_robust(sender=type(run.backend), task_result=result)
        finally:
            if isinstance(exception, KeyboardInterrupt):
                _thread.interrupt_main()


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


# -- the registry resolver ---------------------------------------------------------------

_MODULE_PATH_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
_handlers: dict[str, DjangoTaskHandler] = {}
#: The Task objects this process enqueued (through :func:`handler_for`), by module path: found
#: without importing anything, wherever their module is.
_tasks: dict[str, Task] = {}


def resolve(name: str) -> DjangoTaskHandler | None:
    """Registry resolver: a handler for ``name`` if it is the module path of a Django task.

    Nothing but a ``django.tasks.Task`` instance is ever turned into a handler, and the
    handler runs only rows that a :class:`PgTasksBackend` enqueued. Only the tasks this
    process enqueued and the modules of installed apps are looked at (see
    :func:`import_task`); a module there that fails to import raises
    :class:`~django_pgtasks.exceptions.HandlerImportError`.
    """
    handler = _handlers.get(name)
    if handler is None:
        task = import_task(name)
        if task is not None:
            handler = _handlers.setdefault(name, DjangoTaskHandler(func=task.func, name=name))
    return handler


registry.add_resolver(resolve)


def handler_for(task: Task) -> DjangoTaskHandler:
    """The handler that runs ``task`` (as the worker will resolve it by name).

    Also remembers ``task``, so that this process finds it by name without an import. A task
    whose module is in no installed app is logged once: a worker process never imports such
    a module because a row names it, so only a worker in this process can run the task.
    """
    name = task.module_path
    handler = _handlers.get(name)
    if handler is None:
        _tasks.setdefault(name, task)
        handler = _handlers.setdefault(name, DjangoTaskHandler(func=task.func, name=name))
        if registry.installed_module_of(name) is None:
            logger.warning(
                "Task name=%s is in no installed app: a worker process does not import its "
                "module and fails the task as unknown. Move it into an installed app's module.",
                name,
            )
    return handler


def import_task(path: str, *, missing_ok: bool = True) -> Task | None:
    """The ``django.tasks.Task`` at module path ``path``, or ``None`` if there is none.

    Looks only at the tasks this process enqueued and, importing it if need be, at a module
    of an installed app, checked before anything is imported: a stored path such as
    ``"this.s"`` imports nothing. If that module raises while being imported, the error is
    logged with its traceback and :class:`~django_pgtasks.exceptions.HandlerImportError`
    raised; if it does not exist, ``None`` is returned, or with ``missing_ok=False`` the same
    ``HandlerImportError`` (a task enqueued by newer code than this process runs).
    """
    if not _MODULE_PATH_RE.match(path):
        return None
    task = _tasks.get(path)
    if task is not None:
        return task
    module_name = registry.installed_module_of(path)
    if module_name is None:
        return None
    module = registry.import_handler_module(module_name, path, missing_ok=missing_ok)
    if module is None:
        return None
    value = getattr(module, path.rpartition(".")[2], None)
    return value if isinstance(value, Task) else None


# -- conversions -------------------------------------------------------------------------


def backend_alias(row: TaskRow) -> str | None:
    """The alias of the backend that enqueued ``row``; ``None`` for a native task."""
    marker = row.metadata.get(METADATA_KEY) if isinstance(row.metadata, dict) else None
    alias = marker.get("backend") if isinstance(marker, dict) else None
    return alias if isinstance(alias, str) else None


def parse_result_id(result_id: Any) -> int | None:
    """The primary key a result id stands for, or ``None`` if it cannot be one."""
    if not isinstance(result_id, str) or not result_id.isascii() or not result_id.isdigit():
        return None
    pk = int(result_id)
    # Only the canonical spelling ("42", not "042") and values a bigint can hold.
    return pk if str(pk) == result_id and 0 < pk < 2**63 else None


def parse_result_location(result_id: Any) -> tuple[int | None, str]:
    """The primary key and the database alias a result id stands for (see the module doc).

    The key is ``None`` if the id cannot be one, or names a database that holds no queue.
    """
    from django_pgtasks.base.routing import queue_databases

    primary = pgtasks_settings.DATABASE
    if isinstance(result_id, str) and "@" in result_id:
        result_id, database = result_id.split("@", 1)
        if database == primary or database not in queue_databases():
            return None, primary
        return parse_result_id(result_id), database
    return parse_result_id(result_id), primary


def result_id_for(row: TaskRow) -> str:
    """The result id of a saved row: its key, with ``@<alias>`` off the primary database."""
    database = row._state.db or pgtasks_settings.DATABASE
    return str(row.pk) if database == pgtasks_settings.DATABASE else f"{row.pk}@{database}"


def result_from_row(row: TaskRow, task: Task, alias: str) -> TaskResult:
    """The ``TaskResult`` a row stands for (database times; see the module docstring)."""
    result = TaskResult(
        task=task,
        id=result_id_for(row),
        status=_STATUS[row.status],
        enqueued_at=row.created_at,
        # The row keeps the start of its latest attempt only.
        started_at=row.started_at,
        last_attempted_at=row.started_at,
        finished_at=row.finished_at if row.status in _FINISHED else None,
        args=row.args,
        kwargs=row.kwargs,
        backend=alias,
        errors=[error_from_text(e["error"]) for e in row.errors
                if isinstance(e, dict) and isinstance(e.get("error"), str)],
        worker_ids=[str(worker_id) for worker_id in row.worker_ids],
    )
    if row.status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", row.result)
    return result


def error_from_exception(exc: BaseException) -> TaskError:
    cls = type(exc)
    return TaskError(
        exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


# The first line of ``traceback.format_exception_only()``: the exception's type, qualified
# by its module unless that is builtins, then ": message" unless the message is empty.
_EXCEPTION_LINE_RE = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(?::\s|$)")
_TRACEBACK_START = "\n\nTraceback (most recent call last):"


def error_from_text(text: str) -> TaskError:
    """A ``TaskError`` from a stored error: the type and message, a blank line, then the
    traceback (see ``django_pgtasks.base.errors.format_exception``), possibly cut in the middle."""
    path = "builtins.Exception"
    for line in text.split("\n\n", 1)[0].splitlines():
        if match := _EXCEPTION_LINE_RE.match(line):
            path = match["path"]
            break
    if "." not in path:
        path = f"builtins.{path}"
    start = text.find(_TRACEBACK_START)
    return TaskError(
        exception_class_path=path,
        traceback=text[start + 2:] if start >= 0 else text,
    )


def retry_option_errors(
    max_attempts: Any, backoff: Any, names: tuple[str, str] = ("max_attempts", "backoff")
) -> list[str]:
    """Full-sentence problems with retry options; ``names`` says where they were set."""
    errors = []
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        errors.append(
            f"{names[0]} must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, not {max_attempts!r}."
        )
    if isinstance(backoff, str) and backoff not in POLICIES:
        errors.append(
            f"{names[1]} {backoff!r} is not a retry policy; use one of {sorted(POLICIES)} or a "
            f"callable backoff(exception, task_result)."
        )
    elif backoff is not None and not isinstance(backoff, str) and not callable(backoff):
        errors.append(
            f"{names[1]} must be a policy name or a callable backoff(exception, task_result), "
            f"not {backoff!r}."
        )
    elif callable(backoff) and not _accepts_two_arguments(backoff):
        errors.append(
            f"{names[1]} must accept two arguments, (exception, task_result), and return "
            f"seconds, a timedelta, or None to stop retrying."
        )
    return errors


def _accepts_two_arguments(func: Callable[..., Any]) -> bool:
    try:
        inspect.signature(func).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (some builtins): trust it
        return True
    return True


__all__ = [
    "Backoff",
    "DjangoTaskHandler",
    "InvalidReturnValue",
    "InvalidTaskArguments",
    "PgTasksBackend",
    "RetryableTask",
    "resolve",
]
