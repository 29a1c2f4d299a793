"""The INSERT statements of enqueue, and the fast way to make the unsaved task they save.

Enqueue is on the hot path of every web request that starts work, so it does not go through
``Model.save()``, which compiles a 29-column INSERT per call. One named statement per way of
enqueueing is written here instead, with the columns an enqueue sets; the database fills in
the rest (defaults and ``db_default``). They write into the live partition of the task table
(migration 0014), where a new task belongs: no routing, and the key's unique index is there.
A single task goes through a function of the database (``sql/enqueue.sql``), many through
``COPY``.
``Task.objects.enqueue()`` still sends ``pre_save`` and ``post_save`` for a task without a
key, as ``save()`` did, when they have receivers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models.expressions import DatabaseDefault

from django_pgtasks.database.schema import ID_SEQUENCE, LIVE_TABLE
from django_pgtasks.definition.payload import task_payload_json
from django_pgtasks.definition.status import Status
from django_pgtasks.definition.task_row import TaskRow
from django_pgtasks.lifecycle.row_loading import fast_cursor

# One task without a key: the INSERT of pgtasks_enqueue_one() (sql/enqueue.sql) (a PL/pgSQL
# function keeps its plan for the session, where a plain INSERT would be planned anew on
# every call, Django preparing nothing on the server). run_after is the given time, else the
# delay in seconds from the statement's time, else that time itself.
ENQUEUE_ONE_SQL = """
    SELECT id, run_after, created_at
    FROM pgtasks_enqueue_one(%s, %s, %s::jsonb, %s::jsonb, %s::smallint, %s::integer,
                             %s::timestamptz, %s::float8, %s::jsonb, %s, %s, %s::smallint)
"""

# Ids for tasks about to be written by COPY (which returns nothing), in one statement: as many
# values of the id sequence as tasks, in order, and the statement's time (the database clock),
# which the tasks take as their creation time. The sequence is named: looked up with
# pg_get_serial_sequence() it would be looked up once per row, several times the cost.
NEW_IDS_SQL = f"""
    SELECT statement_timestamp(), array_agg(nextval('{ID_SEQUENCE}'))
    FROM generate_series(1, %s)
"""

# Many tasks, through COPY into the live partition: PostgreSQL's fastest way in, cheaper on
# the server than an INSERT … SELECT FROM unnest(…) of the same rows. Every column an
# enqueue sets is written, the ids from NEW_IDS_SQL included, so nothing needs returning.
# Triggers fire as for an INSERT (the statement's NOTIFY wakes the workers).
COPY_MANY_SQL = f"""
    COPY {LIVE_TABLE} (id, name, queue, args, kwargs, priority, max_attempts, run_after,
                       created_at, updated_at, metadata, key, stage, concurrency_key,
                       concurrency_limit, status, attempt, error_text, has_dependents)
    FROM STDIN
"""

# enqueue_bulk(): tasks of one handler and options, due at once; the database fills in the
# times (the transaction's, as the columns' defaults give).
COPY_BULK_SQL = f"""
    COPY {LIVE_TABLE} (id, name, queue, args, kwargs, priority, max_attempts, status, attempt,
                       error_text, metadata, concurrency_key, concurrency_limit)
    FROM STDIN
"""


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
    for name in ("worker_ids", "errors", "steps", "log"):
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


def new_ids(cursor: Any, count: int) -> tuple[datetime, list[int]]:
    """Take ``count`` ids from the id sequence (:data:`NEW_IDS_SQL`); also return the
    database's time."""
    cursor.execute(NEW_IDS_SQL, [count])
    now, ids = cursor.fetchone()
    return now, ids


def insert_many(tasks: list[TaskRow], db: str, payloads: list[tuple[str, str]] | None = None,
                *, linked: bool = False) -> None:
    """Insert unsaved tasks through ``COPY`` (:data:`COPY_MANY_SQL`); each gets its id and
    database times. ``payloads``: the tasks' validated JSON (:func:`task_payload_json`), when
    the caller has it. ``linked``: the tasks of a workflow, each written with the ``status``
    and ``has_dependents`` set on it (models/dependencies.py); others are ``READY``.

    This runs once per task of an ``enqueue_many()``, so it reads the instances'
    ``__dict__`` directly."""
    if payloads is None:
        payloads = [task_payload_json(t) for t in tasks]
    with fast_cursor(db) as cursor:
        now, ids = new_ids(cursor, len(tasks))
        # COPY sends text: the database's time written out once, not once per column and row
        # (formatting a datetime was a third of the rows' cost).
        now_text = now.isoformat()
        timestamps = []
        with copying(cursor, db, COPY_MANY_SQL) as copy:
            write = copy.write_row
            for task, pk, (args, kwargs) in zip(tasks, ids, payloads, strict=True):
                values = task.__dict__
                run_after = values["run_after"]
                if not isinstance(run_after, datetime):
                    # Relative to the database's clock (read with the ids), as an INSERT's is.
                    delay = values.get("_delay_seconds")
                    run_after = now + timedelta(seconds=delay) if delay else now
                timestamps.append(run_after)
                write((pk, values["name"], values["queue"], args, kwargs, values["priority"],
                       values["max_attempts"], now_text if run_after is now else run_after,
                       now_text, now_text,
                       _metadata_json(values["metadata"]), values["key"],
                       values["stage"], values["concurrency_key"],
                       values["concurrency_limit"],
                       values["status"] if linked else Status.READY, 0, "",
                       values["has_dependents"] if linked else False))
    for task, pk, run_after in zip(tasks, ids, timestamps, strict=True):
        _saved(task, db, pk, run_after, now)


@contextmanager
def copying(cursor: Any, db: str, sql: str) -> Iterator[Any]:
    """``cursor.copy(sql)``, its errors raised as Django's (an ``IntegrityError`` for a
    duplicate key, as from an INSERT)."""
    with connections[db].wrap_database_errors, cursor.copy(sql) as copy:
        yield copy


def copy_bulk(cursor: Any, db: str, rows: Iterable[tuple]) -> None:
    """Write the rows of :meth:`~django_pgtasks.models.manager.TaskManager.enqueue_bulk`
    (:data:`COPY_BULK_SQL`, in its column order) on ``cursor``."""
    with copying(cursor, db, COPY_BULK_SQL) as copy:
        write = copy.write_row
        for row in rows:
            write(row)
