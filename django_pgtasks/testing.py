"""Helpers for testing code that enqueues tasks, and the handlers themselves.

::

    from django_pgtasks.testing import assert_enqueued, drain, run_eagerly

    def test_signup_sends_the_welcome_email(db):
        user = signup("ada@example.com")
        [task] = assert_enqueued(send_welcome_email, user.pk)
        result = drain()                        # runs it here, on the test's connection
        assert result.succeeded == 1

    @run_eagerly()                              # every enqueue runs its task at once
    def test_the_whole_flow(db): ...

Everything runs on the calling thread's database connection, inside whatever transaction the
test holds: :func:`drain` and :func:`run_eagerly` work in pytest-django's ``db`` tests (one
transaction rolled back at the end; nothing ever commits) as well as in ``transactional_db``
tests. Tasks run through the worker's own code path (claim, handler, guarded completion,
retries, snoozes, cancellation, pipelines), minus the thread pool. A handler that breaks the
test's transaction (a failed SQL statement) is rolled back to a savepoint taken just before
it, so the failure can be recorded and the test go on. See ``docs/testing.md``.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ContextDecorator
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from django_pgtasks.database.schema import LIVE_TABLE
from django_pgtasks.definition.payload import normalize_value
from django_pgtasks.definition.registry import TaskHandler
from django_pgtasks.definition.routing import queue_databases, queues_on
from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.lifecycle import dependencies, release
from django_pgtasks.signals import task_enqueued

__all__ = [
    "DrainResult",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued",
    "run_eagerly",
    "run_task",
]

#: ``drain()`` stops with an error after running this many tasks (a task that snoozes or is
#: re-enqueued forever would otherwise never let it return).
DRAIN_LIMIT = 10_000


@dataclass
class DrainResult:
    """The tasks :func:`drain` ran, in order, each as it ended (``task.status``)."""

    tasks: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tasks)

    def count(self, status: str) -> int:
        return sum(1 for task in self.tasks if task.status == status)

    @property
    def succeeded(self) -> int:
        return self.count("SUCCESSFUL")

    @property
    def failed(self) -> int:
        """Attempts that failed for good (``FAILED``)."""
        return self.count("FAILED")

    @property
    def retried(self) -> int:
        """Attempts that failed and left their task awaiting a retry."""
        return self.count("AWAITING_RETRY")

    @property
    def snoozed(self) -> int:
        return self.count("READY")

    @property
    def cancelled(self) -> int:
        return self.count("CANCELLED")


def drain(
    queues: Sequence[str] | None = None,
    *,
    delayed: bool = False,
    limit: int = DRAIN_LIMIT,
) -> DrainResult:
    """Run every due task of ``queues`` (default: all) here and now, until none is due.

    Tasks enqueued by the tasks it runs (follow-ups, retries due at once) run too. Tasks due
    later, retries with a backoff and snoozed tasks are left waiting, unless ``delayed=True``:
    then they are made due and run as well (repeatedly, until every task has ended). Raises
    ``RuntimeError`` after ``limit`` tasks, so a task that snoozes forever cannot hang a test.
    """
    from django_pgtasks.models import Task

    result = DrainResult()
    for alias in queue_databases():
        served = [q for q in queues_on(alias) if queues is None or q in queues]
        if not served:
            continue
        runner = _inline_executor(alias)
        ended_with_dependents = True  # marks left by anything before this call
        while True:
            if delayed:
                Task.objects.using(alias).filter(queue__in=served).make_due()
            _as_if_committed(alias)
            # What a worker's releaser does: the children of the tasks that ended, after a
            # task with dependents ran, and before giving up (an operator's end, a task that
            # gained dependents while it ran).
            if ended_with_dependents:
                release.release_all(alias)
            claimed = Task.objects.claim(runner.worker_id, served, limit=1, using=alias)
            if not claimed:
                if release.release_all(alias):
                    continue
                break
            if len(result) >= limit:
                raise RuntimeError(f"drain() ran {limit} tasks and there is still work due; "
                                   f"does a task snooze or enqueue itself forever?")
            runner.execute(claimed[0])
            ended_with_dependents = claimed[0].has_dependents
            result.tasks.append(claimed[0])
    return result


def run_task(task: Any, *, raise_errors: bool = False) -> Any:
    """Run one waiting task (a task or its id) now, whenever it is due; return it re-read.

    One attempt: a failure that may be retried leaves the task awaiting its retry. Queue
    pauses, rate limits and concurrency limits do not apply (``drain()`` respects them). With
    ``raise_errors=True`` the handler's exception is raised again once its outcome is
    recorded. A task that is not waiting (running, finished) is returned unchanged.
    """
    from django_pgtasks.models import PENDING, Task

    if isinstance(task, Task):
        pk, alias = task.pk, Task.objects._task_db(task, None)
    else:
        pk, alias = task, Task.objects._db_alias(None)
    runner = _inline_executor(alias)
    _as_if_committed(alias)
    with transaction.atomic(using=alias, savepoint=False):
        candidates = [Task.objects.using(alias).filter(pk=pk, status__in=PENDING)
                      .select_for_update(skip_locked=True)
                      .values_list("id", "priority", "run_after")[:1]]
        sql, params = claiming.claim_statement(
            connections[alias], LIVE_TABLE, candidates, 1)
        claimed = list(Task.objects.using(alias).raw(
            sql, [*params, runner.worker_id, runner.worker_id]))
    for row in claimed:
        runner.execute(row)
        if row.has_dependents:
            release.release_all(alias)
        if raise_errors and runner.exception is not None:
            raise runner.exception
    return Task.objects.using(alias).get(pk=pk)


class run_eagerly(ContextDecorator):
    """Run every task at once, in the enqueuing code, while active (a context manager or a
    decorator).

    Each ``enqueue()``, ``enqueue_many()`` and ``django.tasks`` ``enqueue()`` runs its task
    (one attempt, see :func:`run_task`) right after the INSERT, inside the caller's
    transaction and whatever its ``run_after``, and returns when the outcome is recorded;
    tasks the handler enqueues run the same way. ``enqueue_bulk()`` sends no signal, so its
    tasks wait for :func:`drain`. With ``raise_errors=True`` a failing handler's exception
    propagates out of the ``enqueue()`` call.

    Active for enqueues from every thread while the block runs.
    """

    def __init__(self, *, raise_errors: bool = False) -> None:
        self.raise_errors = raise_errors
        self._uid = f"django_pgtasks.testing.run_eagerly:{id(self)}"

    def __enter__(self) -> run_eagerly:
        from django_pgtasks.models import Task

        task_enqueued.connect(self._run, sender=Task, weak=False, dispatch_uid=self._uid)
        return self

    def __exit__(self, *exc_info: object) -> None:
        from django_pgtasks.models import Task

        task_enqueued.disconnect(sender=Task, dispatch_uid=self._uid)

    def _run(self, sender: Any, task: Any, **kwargs: Any) -> None:
        run_task(task, raise_errors=self.raise_errors)


# -- assertions ----------------------------------------------------------------------------


def enqueued(task: TaskHandler | str | Any | None = None, *args: Any, **kwargs: Any) -> list[Any]:
    """Waiting tasks (ready or awaiting retry, due or not), oldest first, optionally only those
    of handler ``task`` (a ``@pgtask`` handler, its registered name, or a ``django.tasks``
    task) called with ``args`` (all of them, exactly) and ``kwargs`` (these keys, with these
    values; others may be there too). Values compare as stored (tuples as lists)."""
    from django_pgtasks.models import Task

    name = _task_name(task) if task is not None else None
    want_args = normalize_value(list(args), "args") if args else None
    want_kwargs = normalize_value(dict(kwargs), "kwargs")
    found = []
    for alias in queue_databases():
        rows = Task.objects.using(alias).pending()
        if name is not None:
            rows = rows.filter(name=name)
        for row in rows.order_by("created_at", "id"):
            if want_args is not None and row.args != want_args:
                continue
            if not isinstance(row.kwargs, dict) or any(
                    k not in row.kwargs or row.kwargs[k] != v for k, v in want_kwargs.items()):
                continue
            found.append(row)
    return found


def assert_enqueued(task: TaskHandler | str | Any, *args: Any, **kwargs: Any) -> list[Any]:
    """Assert that a task of handler ``task`` waits with these arguments (matched as by
    :func:`enqueued`); return the matching tasks, oldest first."""
    found = enqueued(task, *args, **kwargs)
    if not found:
        raise AssertionError(
            f"No waiting task {_call_repr(_task_name(task), args, kwargs)}. "
            f"{_describe(enqueued(task))}"
        )
    return found


def assert_not_enqueued(task: TaskHandler | str | Any, *args: Any, **kwargs: Any) -> None:
    """Assert that no task of handler ``task`` waits with these arguments (matched as by
    :func:`enqueued`; with no arguments: none at all)."""
    found = enqueued(task, *args, **kwargs)
    if found:
        raise AssertionError(
            f"Expected no waiting task {_call_repr(_task_name(task), args, kwargs)}. "
            f"{_describe(found)}"
        )


def _task_name(task: Any) -> str:
    if isinstance(task, TaskHandler):
        return task.name
    if isinstance(task, str):
        return task
    module_path = getattr(task, "module_path", None)  # a django.tasks Task
    if isinstance(module_path, str):
        return module_path
    raise TypeError(f"Expected a @pgtask handler, a task name or a django.tasks task, not "
                    f"{task!r}.")


def _call_repr(name: str, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _describe(tasks: list[Any]) -> str:
    if not tasks:
        return "None of that task is waiting."
    shown = [f"#{t.pk} {_call_repr(t.name, t.args, t.kwargs)} on queue {t.queue!r}"
             for t in tasks[:10]]
    more = f" and {len(tasks) - 10} more" if len(tasks) > 10 else ""
    return f"Waiting: {'; '.join(shown)}{more}."


# -- the in-test runner --------------------------------------------------------------------


def _as_if_committed(alias: str) -> None:
    """Inside the test's transaction, which never commits: release the tasks whose parents
    ended before they were enqueued, as the commit would (models/dependencies.py)."""
    if connections[alias].in_atomic_block:
        dependencies.settle_ended_parents(alias)


@functools.cache
def _inline_executor_class() -> type:
    from django_pgtasks.lifecycle.recorder import Recorder
    from django_pgtasks.worker.executor import Executor

    class InlineExecutor(Executor):
        """The worker's executor on the calling thread and its connection: no pool, no loop.

        Each outcome is recorded at once, on the caller's connection (inside its transaction,
        if any); the handler runs within a savepoint when a transaction is open; the
        connection (and the test's transaction) stays open after the task; the handler's
        exception of the last run is kept in :attr:`exception`.
        """

        def __init__(self, using: str) -> None:
            super().__init__(using=using, worker_id=f"inline:{secrets.token_hex(4)}",
                             recorder=Recorder(using), hand_in=self._record_now, batched=False)
            self.exception: BaseException | None = None

        def _record_now(self, task: Any, outcome: Any, done: Any) -> None:
            """What the loop does with an outcome handed in, at once: no loop runs here."""
            done(self.recorder.record([(task, outcome)])[task.pk])

        def _call(self, handler: TaskHandler, task: Any) -> Any:
            connection = connections[self.using]
            if not connection.in_atomic_block:
                return super()._call(handler, task)
            # Inside the test's transaction: a failed statement in the handler would abort it
            # (and every statement after). Roll back to here only in that case, so that the
            # handler's writes before an ordinary exception stay, as they would in a worker.
            savepoint = _savepoint_create(using=self.using)
            try:
                result = super()._call(handler, task)
            except BaseException:
                if _transaction_failed(connection):
                    transaction.savepoint_rollback(savepoint, using=self.using)
                else:
                    transaction.savepoint_commit(savepoint, using=self.using)
                raise
            transaction.savepoint_commit(savepoint, using=self.using)
            return result

        def _after_task(self) -> None:
            """Keep the connection (and the test's transaction) open."""

        def _finished(self, task: Any, duration: float,
                      exception: BaseException | None) -> None:
            self.exception = exception
            super()._finished(task, duration, exception)

    return InlineExecutor


def _inline_executor(using: str) -> Any:
    """An in-test executor (its class is built on first use: the worker's modules need the
    app registry, and this module may be imported before it is ready)."""
    return _inline_executor_class()(using)


#: ``savepoint()`` is ``savepoint_create()`` from Django 6.1 on.
_savepoint_create = getattr(transaction, "savepoint_create", None) or transaction.savepoint


def _transaction_failed(connection: Any) -> bool:
    import psycopg

    raw = connection.connection
    return raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
