"""The INSERT statements of enqueue, and the fast way to make the unsaved task they save.

Enqueue is on the hot path of every web request that starts work, so it does not go through
``Model.save()``, which compiles a 29-column INSERT per call. One named statement per way of
enqueueing is written here instead, with the columns an enqueue sets; the database fills in
the rest (defaults and ``db_default``). They insert into the live partition of the task table
(migration 0014), where a new task belongs: no routing, and the key's unique index is there.
``Task.objects.enqueue()`` still sends ``pre_save`` and ``post_save`` for a task without a
key, as ``save()`` did, when they have receivers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models.expressions import DatabaseDefault

from django_pgtasks.base.payload import task_payload_json
from django_pgtasks.base.rows import TaskRow
from django_pgtasks.lifecycle.rows import fast_cursor

# One task. run_after is the given time, else the delay from the statement's time, else that
# time itself (as the column's default, Django's Now(), gives).
ENQUEUE_ONE_SQL = """
    INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, max_attempts, run_after,
                              metadata, stage, concurrency_key, concurrency_limit, status,
                              attempt, error_text)
    VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s,
            COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s::float8),
                     statement_timestamp()),
            %s::jsonb, %s, %s, %s::smallint, 'READY', 0, '')
    RETURNING id, run_after, created_at
"""

def _insert_many_sql(linked: bool = False) -> str:
    """Many tasks: one per element of the column arrays (so the statement's size and parse
    time do not grow with a parameter per value); run_after as for one task. The arrays are
    sent in binary (%b): psycopg builds a text array literal in Python, escaping every
    element, at a third of the client's time per task. ``linked``: the tasks of a workflow,
    with two more arrays, each task's state (``WAITING`` for those with parents) and whether
    others depend on it (models/dependencies.py)."""
    status, has_dependents = ("v.status", "v.has_dependents") if linked else ("'READY'", "false")
    more_arrays, more_columns = (", %b::text[], %b::bool[]", ", status, has_dependents") \
        if linked else ("", "")
    return f"""
    INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, max_attempts, run_after,
                              metadata, key, stage, concurrency_key, concurrency_limit, status,
                              attempt, error_text, has_dependents)
    SELECT v.name, v.queue, v.args::jsonb, v.kwargs::jsonb, v.priority, v.max_attempts,
           COALESCE(v.run_after, statement_timestamp() + make_interval(secs => v.delay),
                    statement_timestamp()),
           v.metadata::jsonb, v.key, v.stage, v.concurrency_key, v.concurrency_limit, {status},
           0, '', {has_dependents}
    FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::smallint[], %b::int[],
                %b::timestamptz[], %b::float8[], %b::text[], %b::text[], %b::text[], %b::text[],
                %b::smallint[]{more_arrays})
         AS v(name, queue, args, kwargs, priority, max_attempts, run_after, delay, metadata,
              key, stage, concurrency_key, concurrency_limit{more_columns})
    RETURNING id, run_after, created_at
"""


ENQUEUE_MANY_SQL = _insert_many_sql()
ENQUEUE_LINKED_SQL = _insert_many_sql(linked=True)

# Enqueue with a deduplication key: insert, or fold the request into the live task that has
# the key (the partial unique index pgtasks_task_live_key_uniq is the arbiter). A waiting task
# takes the new arguments, the higher priority and the earlier run_after; a running one is
# marked to run once more when its attempt ends. A live task of another name is left alone
# and nothing is returned.
UPSERT_KEYED_SQL = """
    INSERT INTO pgtasks_task_live AS t (name, queue, args, kwargs, priority, max_attempts,
                                        run_after, metadata, key, stage, concurrency_key,
                                        concurrency_limit, status, attempt, error_text)
    VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s,
            COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s),
                     statement_timestamp()),
            %s::jsonb, %s, %s, %s, %s::smallint, 'READY', 0, '')
    ON CONFLICT (key)
        WHERE key IS NOT NULL AND status IN ('READY', 'AWAITING_RETRY', 'RUNNING')
    DO UPDATE SET
        args = EXCLUDED.args,
        kwargs = EXCLUDED.kwargs,
        priority = GREATEST(t.priority, EXCLUDED.priority),
        run_after = CASE WHEN t.status = 'RUNNING' THEN t.run_after
                         ELSE LEAST(t.run_after, EXCLUDED.run_after) END,
        rerun_requested = t.rerun_requested OR t.status = 'RUNNING',
        updated_at = now()
    WHERE t.name = EXCLUDED.name
    RETURNING t.*, (t.xmax = 0) AS inserted
"""


class Blueprint:
    """Makes unsaved instances of a task model fast.

    ``Model(**kwargs)`` looks up a default for each of the 29 fields on every call; a
    blueprint reads the defaults once and builds each instance positionally (Django's own
    fast path, the one ``Model.from_db`` takes), with fresh copies of the mutable ones.
    """

    def __init__(self, model: type) -> None:
        self.model = model
        fields = model._meta.concrete_fields
        prototype = model()
        self.defaults = [getattr(prototype, f.attname) for f in fields]
        self.index = {f.attname: i for i, f in enumerate(fields)}
        self.mutable = [(i, type(v)) for i, v in enumerate(self.defaults)
                        if isinstance(v, list | dict)]

    def make(self, **values: Any) -> Any:
        row = self.defaults.copy()
        for i, kind in self.mutable:
            row[i] = kind()
        index = self.index
        for name, value in values.items():
            row[index[name]] = value
        return self.model(*row)


_blueprints: dict[type, Blueprint] = {}


def blueprint(model: type) -> Blueprint:
    found = _blueprints.get(model)
    if found is None:
        found = _blueprints[model] = Blueprint(model)
    return found


def _saved(task: Any, db: str, pk: int, run_after: datetime, created_at: datetime) -> None:
    """Give an inserted task what the row got from the database (straight into its
    ``__dict__``: this runs once per task of an ``enqueue_many()``)."""
    values = task.__dict__
    values["id"], values["run_after"] = pk, run_after
    values["created_at"] = values["updated_at"] = created_at
    for name in ("worker_ids", "errors"):
        if isinstance(values.get(name), DatabaseDefault):
            values[name] = []
    state = task._state
    state.adding = False
    state.db = db


def _metadata_json(metadata: Any) -> str:
    return json.dumps(metadata) if metadata else "{}"  # most tasks have none


def insert_one(task: TaskRow, db: str) -> None:
    """Insert one unsaved task without a key (:data:`ENQUEUE_ONE_SQL`); the task gets its id
    and database times."""
    args, kwargs = task_payload_json(task)
    run_after = task.run_after if isinstance(task.run_after, datetime) else None
    with fast_cursor(db) as cursor:
        cursor.execute(ENQUEUE_ONE_SQL, [
            task.name, task.queue, args, kwargs, task.priority, task.max_attempts, run_after,
            getattr(task, "_delay_seconds", None), _metadata_json(task.metadata), task.stage,
            task.concurrency_key, task.concurrency_limit])
        _saved(task, db, *cursor.fetchone())


def insert_many(tasks: list[TaskRow], db: str, *, linked: bool = False) -> None:
    """Insert unsaved tasks in one statement (:data:`ENQUEUE_MANY_SQL`); each gets its id and
    database times. ``linked``: the tasks of a workflow (:data:`ENQUEUE_LINKED_SQL`), each
    with its ``status`` and ``has_dependents`` as set on it."""
    payloads = [task_payload_json(t) for t in tasks]
    columns = [
        [t.name for t in tasks],
        [t.queue for t in tasks],
        [args for args, _ in payloads],
        [kwargs for _, kwargs in payloads],
        [t.priority for t in tasks],
        [t.max_attempts for t in tasks],
        [t.run_after if isinstance(t.run_after, datetime) else None for t in tasks],
        [getattr(t, "_delay_seconds", None) for t in tasks],
        [_metadata_json(t.metadata) for t in tasks],
        [t.key for t in tasks],
        [t.stage for t in tasks],
        [t.concurrency_key for t in tasks],
        [t.concurrency_limit for t in tasks],
    ]
    if linked:
        columns += [[t.status for t in tasks], [t.has_dependents for t in tasks]]
    with fast_cursor(db) as cursor:
        cursor.execute(ENQUEUE_LINKED_SQL if linked else ENQUEUE_MANY_SQL, columns)
        rows = cursor.fetchall()
    for task, row in zip(tasks, rows, strict=True):
        _saved(task, db, *row)
