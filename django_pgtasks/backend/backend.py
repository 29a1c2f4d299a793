"""PgTasksBackend: Django's Tasks API on the django-pgtasks queue."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils import timezone

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import explain_missing_schema
from django_pgtasks.definition.framework import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from django_pgtasks.definition.options import check_run_after
from django_pgtasks.definition.payload import normalize_payload
from django_pgtasks.definition.registry import MAX_NAME_LENGTH
from django_pgtasks.definition.routing import database_for_queue
from django_pgtasks.exceptions import (
    InvalidPayloadError,
    InvalidTaskError,
)
from django_pgtasks.retry import resolve as resolve_policy
from django_pgtasks.signals import task_enqueued as native_task_enqueued
from django_pgtasks.telemetry import tracing

if TYPE_CHECKING:
    from django_pgtasks.models import Task as TaskRow

from django_pgtasks.backend.errors import InvalidTaskArguments
from django_pgtasks.backend.importing import import_task
from django_pgtasks.backend.options import (
    METADATA_KEY,
    OPTION_DEFAULTS,
    PRIORITY_OFFSET,
    RetryableTask,
    retry_option_errors,
)
from django_pgtasks.backend.resolver import handler_for
from django_pgtasks.backend.results import (
    backend_alias,
    parse_result_id,
    parse_result_location,
    result_from_row,
)

logger = logging.getLogger("django_pgtasks.backend")

class PgTasksBackend(BaseTaskBackend):
    """Stores Django tasks in the django-pgtasks table; ``run_pgtasks`` runs them."""

    task_class = RetryableTask
    #: What the worker checks before it runs a row this backend wrote (the backend may have
    #: been reconfigured since).
    stores_in_pgtasks = True

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
        """Insert one row (in the caller's transaction, if any) and return its result.

        Raises Django's ``InvalidTask`` for a task this backend cannot run, and
        :class:`~django_pgtasks.backend.InvalidTaskArguments` (an ``InvalidTask`` and a
        ``TypeError``) for arguments that would not survive JSON or that the function cannot
        take, before any SQL; :class:`~django_pgtasks.exceptions.NotMigratedError` (a
        ``ProgrammingError``) when the database lacks the task table."""
        self.validate_task(task)
        row = self._build_row(task, args, kwargs)
        # Traced like Task.objects.enqueue() (django_pgtasks.telemetry.tracing).
        database = database_for_queue(row.queue)
        with (tracing.enqueueing((row.name,), (row.queue,)) as span,
              explain_missing_schema(database)):
            span.inject((row,))
            type(row).objects.insert(row, database)
            span.sent([row])
        result = result_from_row(row, task, self.alias)
        native_task_enqueued.send(sender=type(row), task=row)
        task_enqueued.send(sender=type(self), task_result=result)
        return result

    async def aenqueue(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult:
        """Like :meth:`enqueue`; only the INSERT leaves the event loop (as ``Model.asave``
        does: the same INSERT, on the thread Django runs database work on)."""
        self.validate_task(task)
        row = self._build_row(task, args, kwargs)
        database = database_for_queue(row.queue)
        with (tracing.enqueueing((row.name,), (row.queue,)) as span,
              explain_missing_schema(database)):
            span.inject((row,))
            await sync_to_async(type(row).objects.insert)(row, database)
            span.sent([row])
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
        handler = handler_for(task)
        # Arguments the function cannot take would fail every attempt in the worker: refused
        # here, as @pgtask refuses them, naming every unexpected keyword.
        problem = handler.argument_problem(clean_args, clean_kwargs, context=task.takes_context)
        if problem is not None:
            raise InvalidTaskArguments(handler.misfit_message(problem))
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            # Django allows naive datetimes only with USE_TZ = False: they mean local time.
            run_after = timezone.make_aware(run_after)
        try:
            row = TaskRow.objects.build(
                handler,
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
            with explain_missing_schema(database):
                row = TaskRow.objects.using(database).filter(pk=pk).first()
        return self._result_or_error(result_id, row)

    async def aget_result(self, result_id: str) -> TaskResult:
        """See :meth:`get_result`."""
        from django_pgtasks.models import Task as TaskRow

        pk, database = parse_result_location(result_id)
        row = None
        if pk is not None:
            with explain_missing_schema(database):
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
            task = task.using(
                priority=row.priority - PRIORITY_OFFSET,
                queue_name=row.queue,
                backend=self.alias,
            )
            # Not through using(), which keeps the task's own run_after when given None: the
            # task object this process last enqueued may carry another enqueue's run_after.
            return dataclasses.replace(task, run_after=run_after)
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
