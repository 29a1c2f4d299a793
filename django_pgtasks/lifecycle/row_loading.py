"""The cursor of the statements every task passes through, and the claimed rows as ``Task``
instances, built at a fraction of ``raw()``'s cost.

A claim returns whole rows (``RETURNING t.*``), and the worker turns each into a ``Task``:
handlers, signal receivers and Django's task results read any of its fields, so none is left
deferred (a deferred field would cost a query per task when read). ``Manager.raw()`` builds
them correctly but slowly: on a no-op task, the claim's decoding was half of the worker's
CPU. What is avoided here, with the same instances as a result:

- Django reads every ``timestamptz`` through its own loader, a Python subclass of psycopg's
  that parses the text in Python (a task row has six). When the session's time zone is UTC
  and Django expects UTC (``USE_TZ`` with the default database ``TIME_ZONE``, which is what
  Django sets the session to), psycopg's own loader, in C, gives the same aware datetimes,
  so :func:`fast_cursor` uses it;
- Django's cursor writes parameters into the statement as literals (client-side binding);
  :class:`ServerBindingCursor` sends them apart;
- ``RawQuerySet`` maps columns and applies converters row by row, through several layers;
  here the mapping and the converters (the JSON fields' ``from_db_value``) are worked out
  once per statement;
- each instance is built as ``Model.from_db()`` builds it when given every field in order,
  with its attributes set directly (as long as the model keeps Django's ``__init__`` and
  nobody listens to ``pre_init``/``post_init``), and the JSON columns' most common values
  (``[]``, ``{}``) are made without a parse.

The enqueue INSERTs and the outcome statements use :func:`fast_cursor` too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC
from operator import itemgetter
from typing import Any

import psycopg
from django.core.signals import setting_changed
from django.db import DatabaseError, connections
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from django.db.models import JSONField, Model
from django.db.models.base import ModelState
from django.db.models.expressions import Col
from django.db.models.signals import post_init, pre_init
from psycopg.types.datetime import TimestamptzLoader

from django_pgtasks.database.schema import is_missing_schema, not_migrated


class ServerBindingCursor(psycopg.Cursor):
    """A psycopg cursor that sends parameters apart from the statement and never prepares it.

    Django's default cursor binds client-side: it writes every parameter into the statement
    as an SQL literal, quoting each element of an array, and that was a tenth of a worker's
    CPU on the claim and the batched outcome statements. Sent apart, arrays go as arrays.
    Nothing is prepared on the server: a pooler in transaction mode (PgBouncer before 1.21)
    may hand the next statement to another server session, where a prepared statement does
    not exist.
    """

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=bool(prepare), binary=binary)


@contextmanager
def fast_cursor(db: str) -> Iterator[CursorWrapper]:
    """A cursor of ``db``'s connection for the statements every task passes through (the
    claim, the outcomes, the enqueue INSERTs): a :class:`ServerBindingCursor` in Django's
    wrapper (so query logging and ``execute_wrapper`` see its statements), reading
    ``timestamptz`` with psycopg's C loader where that gives what Django's loader would:
    Django and the session both in UTC. Elsewhere it reads them as Django's own cursor does."""
    connection = connections[db]
    # As Django's own cursor() opens one: health check, connection, errors wrapped.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)
    if connection.timezone is UTC and raw.connection.info.timezone is UTC:
        raw.adapters.register_loader("timestamptz", TimestamptzLoader)
    else:
        register_tzloader(connection.timezone, raw)
    with connection._prepare_cursor(raw) as cursor:
        try:
            yield cursor
        except DatabaseError as exc:
            # "relation pgtasks_task does not exist": say to run migrate (database/schema.py).
            if is_missing_schema(exc):
                raise not_migrated(db) from exc
            raise


#: How rows of one shape become instances, per (model, database alias, column names): worked
#: out once, not per claim (reading a cursor's description builds an object per column).
_plans: dict[tuple[type, str, tuple[bytes, ...]],
             tuple[Callable[[Any], tuple], list[int], list, list]] = {}

_decode_json = json.JSONDecoder().decode  # what json.loads(text) calls


def _json_value(value: Any, expression: Any, connection: Any) -> Any:
    """``JSONField.from_db_value`` of a field without a custom decoder, with the values most
    task columns hold (``[]``, ``{}``) made without a parse: nine JSON columns per claimed
    row."""
    if value is None:
        return None
    if value == "[]":
        return []
    if value == "{}":
        return {}
    try:
        return _decode_json(value)
    except json.JSONDecodeError:
        return value


def _converter(field: Any, converter: Any) -> Any:
    """``converter`` of ``field``, or the same conversion done faster."""
    if (isinstance(field, JSONField) and field.decoder is None
            and type(field).from_db_value is JSONField.from_db_value
            and getattr(converter, "__func__", None) is JSONField.from_db_value):
        return _json_value
    return converter


def _plan(model: type, db: str,
          names: tuple[bytes, ...]) -> tuple[Callable[[Any], tuple], list[int], list, list]:
    """``(pick, json_columns, converters, extra)``: the row's values in field order, the
    positions of the JSON fields decoded inline (:func:`load_rows`), the other converters,
    and the extra columns."""
    key = (model, db, names)
    plan = _plans.get(key)
    if plan is None:
        connection = connections[db]
        columns = [name.decode() for name in names]
        fields = model._meta.concrete_fields
        position = {name: i for i, name in enumerate(columns)}
        order = [position[field.column] for field in fields]
        table = model._meta.db_table
        converters = [
            (i, _converter(field, converter), Col(table, field))
            for i, field in enumerate(fields)
            for converter in field.get_db_converters(connection)
        ]
        known = {field.column for field in fields}
        extra = [(name, i) for name, i in position.items() if name not in known]
        json_columns = [i for i, converter, _ in converters if converter is _json_value]
        others = [entry for entry in converters if entry[1] is not _json_value]
        # itemgetter() of one index gives the value, not a tuple of it.
        pick = itemgetter(*order) if len(order) > 1 else (lambda row: (row[order[0]],))
        plan = _plans[key] = (pick, json_columns, others, extra)
    return plan


def _instance_maker(model: type, db: str) -> Any:
    """A function of a row's values (every concrete field, in order) that returns the
    instance ``model.from_db(db, None, values)`` would: for a model that keeps Django's
    ``__init__`` and ``from_db``, with no ``pre_init``/``post_init`` receivers, it sets the
    attributes directly, as ``Model.__init__`` does for positional values."""
    attnames = _plain_attnames(model)
    if attnames is None or pre_init.has_listeners(model) or post_init.has_listeners(model):
        return lambda values: model.from_db(db, None, values)
    new = model.__new__

    def make(values: list[Any]) -> Any:
        instance = new(model)
        state = ModelState()
        state.adding = False
        state.db = db
        attributes = dict(zip(attnames, values, strict=True))
        attributes["_state"] = state
        instance.__dict__ = attributes
        return instance

    return make


#: Per model: its concrete fields' attribute names when instances can be built by setting
#: them directly (Django's ``__init__`` and ``from_db``, no data descriptor), else ``None``.
_attnames: dict[type, list[str] | None] = {}


def _plain_attnames(model: type) -> list[str] | None:
    if model not in _attnames:
        attnames = [field.attname for field in model._meta.concrete_fields]
        plain = (model.__init__ is Model.__init__
                 and model.from_db.__func__ is Model.from_db.__func__
                 # A field whose attribute is a data descriptor (a file field's) is set
                 # through it.
                 and not any(hasattr(type(getattr(model, name, None)), "__set__")
                             for name in attnames))
        _attnames[model] = attnames if plain else None
    return _attnames[model]


def _forget_plans(**kwargs: Any) -> None:
    _plans.clear()  # converters may depend on settings (USE_TZ), changed in tests


setting_changed.connect(_forget_plans, dispatch_uid="django_pgtasks.lifecycle.row_loading")


def load_rows(model: type, db: str, sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` (whose rows are whole rows of ``model``'s table, plus any extra columns)
    on ``db`` and return them as ``model`` instances, as ``raw()`` would; an extra column
    becomes an attribute of the same name."""
    with fast_cursor(db) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if not rows:
            return []
        result = cursor.pgresult
        names = tuple(result.fname(i) for i in range(result.nfields))
    pick, json_columns, others, extra = _plan(model, db, names)
    connection = connections[db]
    make = _instance_maker(model, db)
    instances = []
    #: JSON texts decoded in this result to a list of strings, which rows often share (the
    #: worker ids of a first attempt, in every row a claim returns): decoded once, then
    #: copied (a list of immutable items: the copy shares nothing that can change).
    string_lists: dict[str, list[str]] = {}
    for row in rows:
        values = list(pick(row))
        # The JSON columns with _json_value's common cases inline (nine per task row: a
        # call each was a measurable share of a short task's CPU).
        for i in json_columns:
            value = values[i]
            if value is None:
                continue
            if value == "[]":
                values[i] = []
            elif value == "{}":
                values[i] = {}
            elif (known := string_lists.get(value)) is not None:
                values[i] = known.copy()
            else:
                decoded = values[i] = _json_value(value, None, connection)
                if type(decoded) is list and all(type(item) is str for item in decoded):
                    string_lists[value] = decoded.copy()
        for i, converter, expression in others:
            values[i] = converter(values[i], expression, connection)
        instance = make(values)
        for name, i in extra:
            setattr(instance, name, row[i])
        instances.append(instance)
    return instances
