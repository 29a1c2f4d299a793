"""The task manager: enqueue (one, many, bulk), claim, and the ends of a run.

The manager is the public face of :mod:`django_pgtasks.lifecycle`: it validates what it is
given, then calls the named statements there, passing itself in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, models, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.db.models.signals import post_save, pre_save

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import explain_missing_schema
from django_pgtasks.definition.options import (
    delay_seconds,
    resolve_concurrency,
    validate_options,
    validate_queue,
)
from django_pgtasks.definition.payload import serialize_payload, task_payload_json
from django_pgtasks.definition.registry import TaskHandler, get_handler
from django_pgtasks.definition.routing import database_for_queue, queues_on
from django_pgtasks.definition.status import Status
from django_pgtasks.definition.task_row import TaskRow
from django_pgtasks.exceptions import InvalidTaskError, LeaseLostError, UnknownTaskError
from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.lifecycle import (
    dependencies,
    events,
    inserts,
    reports,
    steps,
    transitions,
)
from django_pgtasks.lifecycle.row_loading import load_rows
from django_pgtasks.models.dependencies import OnParentFailure
from django_pgtasks.models.queries import TaskQuerySet
from django_pgtasks.signals import task_enqueued
from django_pgtasks.telemetry import tracing

logger = logging.getLogger("django_pgtasks")


class TaskManager(models.Manager.from_queryset(TaskQuerySet)):  # type: ignore[misc]
    def _db_alias(self, using: str | None, queue: str | None = None) -> str:
        """The database to use: ``using``, else the manager's (``db_manager()``), else the
        database of ``queue`` (:func:`~django_pgtasks.definition.routing.database_for_queue`), else
        ``PGTASKS["DATABASE"]``."""
        if using or self._db:
            return using or self._db
        return database_for_queue(queue) if queue else pgtasks_settings.DATABASE

    def _task_db(self, task: TaskRow, using: str | None) -> str:
        """The database that holds ``task``: ``using``, where it was read, or its queue's."""
        return using or self._db or task._state.db or database_for_queue(task.queue)

    # -- enqueueing ----------------------------------------------------------------------

    def build(
        self,
        name_or_handler: str | TaskHandler,
        *args: Any,
        queue: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        stage: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        **kwargs: Any,
    ) -> TaskRow:
        """Return a validated, unsaved task; raise ``InvalidTaskError`` if anything is wrong.

        Nothing is written. :meth:`enqueue` saves one; :meth:`enqueue_many` saves many.
        Everything PostgreSQL would refuse is refused here, so a refused task never leaves
        the caller's transaction unusable (see :mod:`django_pgtasks.definition.payload`).
        """
        handler = _handler(name_or_handler)
        validate_options(priority=priority, max_attempts=max_attempts, key=key, stage=stage)
        queue = validate_queue(queue or handler.queue or pgtasks_settings.DEFAULT_QUEUE)
        seconds = delay_seconds(run_after, delay)
        payload = serialize_payload(args, kwargs)
        clean_args, clean_kwargs = payload[0], payload[1]
        handler.check_arguments(clean_args, clean_kwargs)
        concurrency_key, concurrency_limit = resolve_concurrency(
            handler, concurrency_key, concurrency_limit, clean_args, clean_kwargs)
        task = inserts.blueprint(self.model).make(
            key=key,
            stage=stage,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            name=handler.name,
            queue=queue,
            args=clean_args,
            kwargs=clean_kwargs,
            priority=_first(priority, handler.priority, pgtasks_settings.DEFAULT_PRIORITY),
            max_attempts=_first(max_attempts, handler.max_attempts, pgtasks_settings.MAX_ATTEMPTS),
        )
        task._payload_json = payload  # the validated JSON text, for task_payload_json()
        if run_after is not None:
            task.run_after = run_after
        elif seconds:
            # Relative to the database clock, evaluated by the INSERT itself.
            task.run_after = Now() + Value(timedelta(seconds=seconds))
            task._delay_seconds = seconds
        return task

    def enqueue(
        self,
        name_or_handler: str | TaskHandler,
        *args: Any,
        queue: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
        key: str | None = None,
        stage: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        depends_on: Iterable[TaskRow | int] | None = None,
        on_parent_failure: str | None = None,
        **kwargs: Any,
    ) -> TaskRow:
        """Insert one task and return it.

        The INSERT runs on the caller's connection and inside the caller's transaction: if
        the caller rolls back, the task never existed, and no worker can see it before the
        caller commits. The connection is that of the queue's database
        (:func:`~django_pgtasks.definition.routing.database_for_queue`) unless ``using`` names
        one; a
        queue on another database than the caller's data is not atomic with it
        (docs/scaling.md). ``name_or_handler`` is a ``@pgtask`` handler or its registered name;
        ``args``/``kwargs`` must be plain JSON. ``run_after`` (aware datetime) or ``delay``
        (seconds or timedelta from the database's ``now()``) postpone the first attempt.

        With ``key`` there is at most one live task per key (the pattern "re-run when the
        source changes"): if a task with that key is waiting, it stays the only one — it takes
        the new arguments, the higher priority and the earlier ``run_after`` — and is
        returned; if it is running, it runs once more after the current attempt (with the new
        arguments); if none is live, a new task is inserted. Concurrent enqueues of one key
        are serialized by a unique index (``INSERT … ON CONFLICT``), never check-then-insert.
        ``task.deduplicated`` tells whether an existing task absorbed the request.

        With ``concurrency_key`` at most ``concurrency_limit`` (default 1) tasks of that key
        run at once, across all workers; the claim enforces it (see
        ``docs/howto/concurrency-limits.md``). ``@pgtask(concurrency_key=...,
        concurrency_limit=...)`` sets defaults.

        With ``depends_on`` (tasks or their ids) the task waits (``WAITING``) until every one
        of them has ended, and is released in the transaction that ends the last; if one
        did not succeed, ``on_parent_failure`` decides: ``"skip"`` (the default: it ends
        ``CANCELLED``), ``"fail"`` (it ends ``FAILED``) or ``"run"``. ``task.workflow_id``
        is then its workflow's id. See :meth:`enqueue_linked` and
        ``docs/howto/workflows.md``.
        """
        task = self.build(
            name_or_handler, *args, queue=queue, priority=priority, run_after=run_after,
            delay=delay, max_attempts=max_attempts, key=key, stage=stage,
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit, **kwargs,
        )
        if depends_on is not None or on_parent_failure is not None:
            self.enqueue_linked([task], [list(depends_on or ())],
                                on_parent_failure=on_parent_failure or OnParentFailure.SKIP,
                                using=using)
            return task
        db = self._db_alias(using, task.queue)
        # Inside a trace (and with tracing on), a span; the task stores its context, so that
        # the run continues the trace (django_pgtasks.telemetry.tracing).
        with tracing.enqueueing((task.name,), (task.queue,)) as span:
            span.inject((task,))
            if key is None:
                self.insert(task, db)
            else:
                task = self._upsert_keyed(task, db)
            span.sent([task])
        task_enqueued.send(sender=self.model, task=task)
        return task

    def insert(self, task: TaskRow, using: str) -> None:
        """Insert one built task without a key into database ``using`` (the INSERT of every
        single enqueue: :meth:`enqueue` and the ``django.tasks`` backend), with Django's
        model signals as ``save()`` would send them, only when someone listens. Sends no
        ``task_enqueued``: the caller does, once the task is what it returns."""
        model = self.model
        if pre_save.has_listeners(model):
            pre_save.send(sender=model, instance=task, raw=False, using=using,
                          update_fields=None)
        inserts.insert_one(task, using)
        task.deduplicated = False
        if post_save.has_listeners(model):
            post_save.send(sender=model, instance=task, created=True, update_fields=None,
                           raw=False, using=using)

    def _upsert_keyed(self, task: TaskRow, db: str) -> TaskRow:
        run_after = task.run_after if isinstance(task.run_after, datetime) else None
        params = [task.name, task.queue, *task_payload_json(task),
                  task.priority, task.max_attempts, run_after,
                  getattr(task, "_delay_seconds", None), json.dumps(task.metadata), task.key,
                  task.stage, task.concurrency_key, task.concurrency_limit]
        [row] = load_rows(self.model, db, inserts.UPSERT_KEYED_SQL, params) or [None]
        if row is None:
            raise InvalidTaskError(
                f"Key {task.key!r} belongs to a live task of another task name; keys are "
                f"unique across all tasks while they wait or run."
            )
        row.deduplicated = not row.inserted
        return row

    def enqueue_many(self, tasks: Iterable[TaskRow], using: str | None = None) -> list[TaskRow]:
        """Insert many tasks (built with :meth:`build` or ``handler.build()``) through ``COPY``.

        Validation happens while building, so a bad task raises before anything is written.
        One statement takes the tasks' ids from the id sequence and the database's time, then
        one ``COPY`` writes the rows (``django_pgtasks.lifecycle.inserts``), in the caller's
        transaction; the tasks come back saved, with their ids, in the order given. A
        delay is counted from the database's time, as for :meth:`enqueue`.
        """
        tasks = list(tasks)
        if not tasks:
            return []
        model, pk_name = self.model, self.model._meta.pk.attname
        # Every payload is known good before the first COPY (one per database).
        payloads = []
        for task in tasks:
            if not isinstance(task, model) or task.__dict__.get(pk_name) is not None:
                raise TypeError("enqueue_many() takes unsaved tasks from Task.objects.build().")
            payloads.append(task_payload_json(task))
        # Without ``using``, each task goes to its queue's database: one COPY per database
        # (not atomic together, unless the caller's transactions make them so).
        db_of = {queue: self._db_alias(using, queue) for queue in {t.queue for t in tasks}}
        if len(set(db_of.values())) == 1:
            groups = {next(iter(db_of.values())): (tasks, payloads)}
        else:
            groups = {}
            for task, payload in zip(tasks, payloads, strict=True):
                group = groups.setdefault(db_of[task.queue], ([], []))
                group[0].append(task)
                group[1].append(payload)
        # One span for the call, whose context every task stores (django_pgtasks.telemetry.tracing).
        with tracing.enqueueing((t.name for t in tasks), (t.queue for t in tasks),
                                len(tasks)) as span:
            span.inject(tasks)
            for db, (group, group_payloads) in groups.items():
                inserts.insert_many(group, db, group_payloads)
            span.sent(tasks)
        if task_enqueued.has_listeners(self.model):
            for task in tasks:
                task_enqueued.send(sender=self.model, task=task)
        return tasks

    def enqueue_linked(
        self,
        tasks: Sequence[TaskRow],
        parents: Sequence[Sequence[TaskRow | int]],
        *,
        on_parent_failure: str | Sequence[str] = OnParentFailure.SKIP,
        workflow_id: uuid.UUID | None = None,
        using: str | None = None,
    ) -> uuid.UUID:
        """Insert the tasks of a workflow, each waiting for its ``parents``, all or nothing;
        return the workflow's id.

        ``tasks`` are unsaved (from :meth:`build`); ``parents[i]`` are the tasks
        ``tasks[i]`` waits for: tasks of this call, saved tasks or their ids (which must
        exist, on the same database). A task with parents is inserted ``WAITING`` (not
        claimable) and released in the transaction that ends its last parent, whatever ends
        it; a parent that ended before counts as ended, even one that ends while this
        transaction runs (``django_pgtasks.models.dependencies``). ``on_parent_failure``
        (one for all, or one per task): ``"skip"``, ``"fail"`` or ``"run"`` when a parent did
        not succeed. Without ``workflow_id`` the tasks join the workflow of the first parent
        of the first task, if it belongs to one, else a new one. Everything is checked before
        anything is written; the tasks come back saved, with their ids. Tasks with a
        deduplication key cannot take part (a key may fold a task into another one).
        """
        tasks = list(tasks)
        if len(parents) != len(tasks):
            raise TypeError("enqueue_linked() takes one list of parents per task.")
        policies = _policies(on_parent_failure, len(tasks))
        if workflow_id is not None and not isinstance(workflow_id, uuid.UUID):
            raise InvalidTaskError(f"workflow_id must be a UUID, not {workflow_id!r}.")
        for task in tasks:
            if task.pk is not None or not isinstance(task, self.model):
                raise TypeError("enqueue_linked() takes unsaved tasks from Task.objects.build().")
            if task.key is not None:
                raise InvalidTaskError(
                    f"Task {task.name} has a deduplication key; tasks of a workflow cannot "
                    f"have one.")
            task_payload_json(task)
        databases = {self._db_alias(using, task.queue) for task in tasks}
        if len(databases) > 1:
            raise InvalidTaskError(
                f"The tasks of a workflow must share one database, not "
                f"{', '.join(sorted(databases))} (their queues' databases).")
        db = databases.pop()
        links = dependencies.parent_refs(tasks, parents, self.model, db)
        external = sorted({pk for refs in links for kind, pk in refs if kind == "id"})
        absent = dependencies.missing(db, external)
        if absent:
            raise InvalidTaskError(
                f"depends_on names tasks that do not exist: "
                f"{', '.join(map(str, absent))}.")
        for task, refs in zip(tasks, links, strict=True):
            task.status = Status.WAITING if refs else Status.READY
            for kind, index in refs:
                if kind == "local":
                    tasks[index].has_dependents = True
        with tracing.enqueueing((t.name for t in tasks), (t.queue for t in tasks),
                                len(tasks)) as span, transaction.atomic(using=db):
            span.inject(tasks)
            inserts.insert_many(tasks, db, linked=True)
            workflows = dependencies.link(db, [
                dependencies.Link(
                    task.pk, [tasks[ref].pk if kind == "local" else ref for kind, ref in refs],
                    policy, any(kind == "id" for kind, _ in refs), workflow_id)
                for task, refs, policy in zip(tasks, links, policies, strict=True)])
            span.sent(tasks)
        for task in tasks:
            task.deduplicated = False
            task.workflow_id = workflows[task.pk]
        if task_enqueued.has_listeners(self.model):
            for task in tasks:
                task_enqueued.send(sender=self.model, task=task)
        return workflows[tasks[0].pk]

    def task_database(self, task: TaskRow) -> str:
        """The database alias that holds ``task``."""
        return self._task_db(task, None)

    def checkpoint_step(self, task: TaskRow, name: str, result_json: str,
                        ms: float) -> dict[str, Any]:
        """Keep step ``name`` of the running ``task`` as completed
        (:func:`django_pgtasks.lifecycle.steps.checkpoint`): what ``context.step()`` calls."""
        return steps.checkpoint(task, name, result_json, ms, self._task_db(task, None))

    def keep_sleep(self, task: TaskRow, name: str, seconds: float | None,
                   until: datetime | None) -> dict[str, Any]:
        """Keep the durable sleep ``name`` of the running ``task``
        (:func:`django_pgtasks.lifecycle.steps.keep_sleep`): what ``context.sleep()`` calls."""
        return steps.keep_sleep(task, name, seconds, until, self._task_db(task, None))

    def write_report(self, task: TaskRow, report: Any) -> bool:
        """Write what the running ``task`` reported (``report``, a
        :class:`~django_pgtasks.definition.run_report.RunReport`: its progress and log
        records), and empty it (:func:`django_pgtasks.lifecycle.reports.write`)."""
        progress, entries = report.take()
        return reports.write(task, progress, entries, self._task_db(task, None))

    @contextlib.contextmanager
    def event_check(self, task: TaskRow, key: str) -> Iterator[events.Check]:
        """A transaction in which the running ``task`` looks for the event ``key`` and is
        flagged as waiting for it if it was not sent
        (:func:`django_pgtasks.lifecycle.events.check`); what the run keeps of the wait
        commits with it. Raises
        :class:`~django_pgtasks.exceptions.LeaseLostError` if the run no longer holds the
        task."""
        using = self._task_db(task, None)
        with transaction.atomic(using=using):
            found = events.check(task, key, using)
            if not found.sent and not found.flagged:
                raise LeaseLostError(f"Task {task.pk} waits for the event {key!r}, but this "
                                     f"run no longer holds the task (it was rescued, "
                                     f"cancelled or changed meanwhile).")
            yield found

    def end_wait(self, task: TaskRow) -> None:
        """The wait of the running ``task`` timed out: it no longer waits (in the
        transaction of :meth:`event_check`; :func:`django_pgtasks.lifecycle.events.unflag`)."""
        events.unflag(task, self._task_db(task, None))

    def send_event(self, key: str, payload: Any = None, *, using: str | None = None) -> int:
        """Send the event ``key`` with ``payload`` (plain JSON): every task waiting for it
        (``context.wait_for_event(key)``) runs again at once, and a task that waits for it
        later gets it without waiting; the last payload sent under a key wins. Sent with the
        current transaction (on ``using``, by default the task database): rolled back, it
        was never sent. Returns the number of waiting tasks it woke.

        Raises :class:`~django_pgtasks.exceptions.InvalidEventError` for a bad key or
        payload, before any SQL."""
        from django_pgtasks.definition import events as rules

        key = rules.check_key(key)
        text = rules.payload_json(payload)
        return len(events.send(key, text, using or self.db))

    def parent_counts(self, task: TaskRow) -> dict[str, int]:
        """How many of the tasks ``task`` depends on ended in each state."""
        return dependencies.parent_counts(self._task_db(task, None), task.pk)

    def parent_outcomes(
        self, task: TaskRow | int, using: str | None = None
    ) -> list[dependencies.ParentOutcome]:
        """How each task that ``task`` (a task or its id) depends on ended, in the order
        they were given: id, name, status, result and error text."""
        if isinstance(task, self.model):
            return dependencies.parent_outcomes(self._task_db(task, using), task.pk)
        return dependencies.parent_outcomes(self._db_alias(using), task)

    def enqueue_bulk(
        self,
        name_or_handler: str | TaskHandler,
        calls: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> list[int]:
        """Enqueue one task per item of ``calls`` through ``COPY``; return the new ids.

        The fast path for very large batches (hundreds of thousands): no model instance is
        built per task. Each item is the positional arguments (a list or tuple) or the
        keyword arguments (a dict) of one run; every task shares the handler and options and
        is due at once. Every item is validated before anything is written; the rows are
        written in the caller's transaction, like :meth:`enqueue`, and notify workers the
        same way. No ``task_enqueued`` signal is sent (there is no task instance to send).
        ``concurrency_key``/``concurrency_limit`` apply to every task (a handler's callable
        ``concurrency_key`` default is called per item).
        """
        handler = _handler(name_or_handler)
        validate_options(priority=priority, max_attempts=max_attempts)
        queue = validate_queue(queue or handler.queue or pgtasks_settings.DEFAULT_QUEUE)
        priority = _first(priority, handler.priority, pgtasks_settings.DEFAULT_PRIORITY)
        max_attempts = _first(max_attempts, handler.max_attempts, pgtasks_settings.MAX_ATTEMPTS)
        # The limits are read once, not once per item.
        max_depth = pgtasks_settings.MAX_PAYLOAD_DEPTH
        max_bytes = pgtasks_settings.MAX_PAYLOAD_BYTES
        # Concurrency is the same for every item, unless the handler's default key is a
        # callable of the arguments.
        per_call = concurrency_key is None and callable(handler.concurrency_key)
        fixed = None if per_call else resolve_concurrency(
            handler, concurrency_key, concurrency_limit, [], {})
        # Whether a call fits the handler's signature depends on its shape only.
        shapes_fit: set[Any] = set()
        payloads = []
        for call in calls:
            kind = type(call)
            if kind is tuple or kind is list:
                args, kwargs = call, {}
                shape: Any = len(call)
            elif kind is dict or isinstance(call, Mapping):
                args, kwargs = (), call
                shape = frozenset(call)
            elif isinstance(call, list | tuple):
                args, kwargs = call, {}
                shape = len(call)
            else:
                raise InvalidTaskError(
                    f"Each item of enqueue_bulk() is one task's positional arguments (a list "
                    f"or tuple) or keyword arguments (a dict), not {type(call).__name__} "
                    f"{call!r:.50}."
                )
            clean_args, clean_kwargs, args_json, kwargs_json = serialize_payload(
                args, kwargs, max_depth=max_depth, max_bytes=max_bytes)
            if shape not in shapes_fit:
                handler.check_arguments(clean_args, clean_kwargs)
                shapes_fit.add(shape)
            payloads.append((args_json, kwargs_json, *(fixed or resolve_concurrency(
                handler, concurrency_key, concurrency_limit, clean_args, clean_kwargs))))
        if not payloads:
            return []
        db = self._db_alias(using, queue)
        # One span for the call, whose context every task stores (django_pgtasks.telemetry.tracing).
        span = tracing.enqueueing((handler.name,), (queue,), len(payloads))
        metadata = span.metadata_json()
        with span, explain_missing_schema(db), connections[db].cursor() as cursor:
            # Ids are taken from the id sequence first, since COPY returns none.
            _, ids = inserts.new_ids(cursor, len(payloads))
            name, ready = handler.name, Status.READY
            inserts.copy_bulk(cursor, db, (
                (pk, name, queue, args, kwargs, priority, max_attempts, ready, 0, "", metadata,
                 ckey, climit)
                for pk, (args, kwargs, ckey, climit) in zip(ids, payloads, strict=True)))
            span.sent(ids=ids)
        return ids

    # -- claiming ------------------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        queues: Sequence[str] | None = None,
        limit: int = 1,
        using: str | None = None,
    ) -> list[TaskRow]:
        """Atomically take up to ``limit`` due tasks for ``worker_id`` and mark them running.

        Candidates are read with ``select_for_update(skip_locked=True)`` in priority order
        (higher first), then oldest ``run_after``, then id; rows another worker is claiming
        at this moment are skipped rather than waited for, so no two workers ever take the
        same task. All of it is one short transaction; the tasks are returned in claim order.

        Without ``using``, the claim runs on the database of ``queues`` (they must share one:
        a claim is one transaction), or without ``queues`` on ``PGTASKS["DATABASE"]`` for the
        queues it holds.
        """
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}.")
        if queues:
            queues = tuple(queues)
            databases = {self._db_alias(using, queue) for queue in queues}
            if len(databases) > 1:
                raise ValueError(
                    f"Queues {', '.join(queues)} are on different databases "
                    f"({', '.join(sorted(databases))}); claim from one database at a time."
                )
            db = databases.pop()
        else:
            db = self._db_alias(using)
            queues = tuple(queues_on(db)) or tuple(pgtasks_settings.queue_names)
        # Plain or controlled (keys, rate limits, pauses): see django_pgtasks.lifecycle.claim.
        return claiming.claim(self, worker_id, queues, limit, db)

    # -- ending a run: thin faces of django_pgtasks.lifecycle.transitions, where each statement is
    #    written and explained once. All are guarded by the run's lease (the worker and the
    #    number of the claim, ``claims``): ``False`` (or a missing id) means the task was no
    #    longer held.

    def mark_succeeded(self, task: TaskRow, result: Any = None, using: str | None = None) -> bool:
        """Record success; ``False`` if the worker no longer held the task (nothing changed)."""
        return self._end(task, transitions.Succeeded(result), using)

    def mark_failed(
        self, task: TaskRow, error_text: str, *, retry_delay: float | None,
        using: str | None = None,
    ) -> bool:
        """Record a failed attempt.

        With ``retry_delay`` (seconds) and attempts left the task waits for retry until
        ``now() + retry_delay`` on the database clock; otherwise (``None``: a fatal error, or
        no attempts left) it ends ``FAILED``. ``False`` if the worker no longer held the task.
        """
        return self._end(task, transitions.Failed(error_text, retry_delay), using)

    def mark_many_succeeded(
        self, outcomes: Sequence[tuple[TaskRow, Any]], using: str | None = None
    ) -> set[int]:
        """Record several successes in one statement; return the ids that were recorded.

        Each row is guarded like :meth:`mark_succeeded`; ids missing from the result were not.
        """
        if not outcomes:
            return set()
        db = self._task_db(outcomes[0][0], using)
        runs = [(task, transitions.Succeeded(result)) for task, result in outcomes]
        return set(transitions.write(db, runs))

    def unclaim(self, tasks: Sequence[TaskRow], using: str | None = None) -> int:
        """Give back claimed tasks that never started, as if they had not been claimed.

        The attempt is not counted. Guarded like every completion; returns how many rows
        changed.
        """
        if not tasks:
            return 0
        return len(transitions.unclaim(self._task_db(tasks[0], using), tasks))

    def release(self, task: TaskRow, reason: str, using: str | None = None) -> bool:
        """Give a running task back because its run was interrupted (e.g. its worker shuts
        down): the attempt is not counted, the task keeps its place in the queue, and one
        interruption is counted (past ``PGTASKS["MAX_INTERRUPTIONS"]`` it ends ``FAILED``).
        ``reason`` is recorded as the attempt's error text."""
        return self._end(task, transitions.Interrupted(reason), using)

    def mark_cancelled(self, task: TaskRow, error_text: str = "", using: str | None = None) -> bool:
        """Record that a running task stopped because it was cancelled: it ends ``CANCELLED``
        (never retried). ``False`` if the worker no longer held the task (nothing changed)."""
        return self._end(task, transitions.Cancelled(error_text), using)

    def mark_snoozed(self, task: TaskRow, seconds: float, using: str | None = None) -> bool:
        """Put a running task back to wait ``seconds`` (database clock) without using up an
        attempt: ``attempt`` goes back down, ``metadata["snoozes"]`` counts the snoozes.

        A task whose cancellation was requested meanwhile ends ``CANCELLED`` instead; one whose
        key was enqueued again while it ran is due at once, like any re-run. ``False`` if the
        worker no longer held the task (nothing changed).
        """
        return self._end(task, transitions.Snoozed(seconds), using)

    def _end(self, task: TaskRow, outcome: transitions.Outcome, using: str | None) -> bool:
        recorded = transitions.write(self._task_db(task, using), [(task, outcome)])
        if not recorded:
            logger.warning(
                "Task id=%s name=%s was no longer held by worker %s when it finished; "
                "its outcome was not recorded.", task.pk, task.name, task.locked_by,
            )
        return bool(recorded)

    def wait(
        self,
        task: TaskRow | int,
        timeout: float | None = None,
        *,
        using: str | None = None,
        poll_interval: float = 5.0,
    ) -> TaskRow:
        """Block until ``task`` (a task or its id) is finished and return it, read afresh.

        Wakes on the ``NOTIFY`` its completion sends (only tasks someone waits for send one),
        with a check every ``poll_interval`` seconds as a safety net. Raises
        :class:`~django_pgtasks.exceptions.TaskWaitTimeout` (a ``TimeoutError``) after
        ``timeout`` seconds (``None``: no limit) and ``Task.DoesNotExist`` for an unknown id.
        See :mod:`django_pgtasks.lifecycle.waiting`.
        """
        from django_pgtasks.lifecycle.waiting import wait_for_task

        pk = task.pk if isinstance(task, self.model) else task
        db = self._task_db(task, using) if isinstance(task, self.model) else self._db_alias(using)
        return wait_for_task(pk, timeout, using=db, poll_interval=poll_interval)


def _handler(name_or_handler: str | TaskHandler) -> TaskHandler:
    """The handler to enqueue: a ``@pgtask`` handler, or the one registered under a name."""
    if isinstance(name_or_handler, TaskHandler):
        return name_or_handler
    if isinstance(name_or_handler, str):
        return get_handler(name_or_handler)
    raise UnknownTaskError(
        f"{name_or_handler!r} is not a task: decorate the function with @pgtask (from "
        f"django_pgtasks import pgtask) and enqueue the decorated function, or pass the "
        f"name of a registered task."
    )


def _policies(on_parent_failure: str | Sequence[str], count: int) -> list[str]:
    """One ``on_parent_failure`` per task, each checked."""
    policies = ([on_parent_failure] * count if isinstance(on_parent_failure, str)
                else list(on_parent_failure))
    if len(policies) != count:
        raise TypeError("enqueue_linked() takes one on_parent_failure, or one per task.")
    for policy in policies:
        if policy not in OnParentFailure.values:
            raise InvalidTaskError(
                f"on_parent_failure must be one of {', '.join(OnParentFailure.values)}, "
                f"not {policy!r}.")
    return policies


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)
