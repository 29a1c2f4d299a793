"""Task instances from the rows a claim returns, built at a fraction of ``raw()``'s cost.

A claim returns whole rows (``RETURNING t.*``), and the worker turns each into a ``Task``:
handlers, signal receivers and Django's task results read any of its fields, so none is left
deferred (a deferred field would cost a query per task when read). ``Manager.raw()`` builds
them correctly but slowly, and on a no-op task the claim's decoding was half of the worker's
CPU. Three costs are avoided here, with the same instances as a result (the enqueue
statements, whose rows carry two time stamps each, read them through :func:`fast_cursor`
too):

- Django reads every ``timestamptz`` through its own loader, a Python subclass of psycopg's
  that parses the text in Python (a task row has six). When the session's time zone is UTC
  and Django expects UTC (``USE_TZ`` with the default database ``TIME_ZONE``, which is what
  Django sets the session to), psycopg's own loader, in C, gives the same aware datetimes,
  so the claim's cursor uses it;
- ``RawQuerySet`` maps columns and applies converters row by row, through several layers;
  here the mapping and the converters (the JSON fields' ``from_db_value``) are worked out
  once per statement;
- each instance is built positionally, the fast path ``Model.from_db()`` takes when it is
  given every field in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any

from django.db import connections
from django.db.backends.utils import CursorWrapper
from django.db.models.expressions import Col
from psycopg.types.datetime import TimestamptzLoader


@contextmanager
def fast_cursor(db: str) -> Iterator[CursorWrapper]:
    """A cursor of ``db``'s connection (Django's, so query logging and ``execute_wrapper``
    see its statements) that reads ``timestamptz`` with psycopg's C loader when that gives
    what Django's would: Django and the session both in UTC."""
    connection = connections[db]
    with connection.cursor() as cursor:
        raw = cursor.cursor
        if connection.timezone is UTC and raw.connection.info.timezone is UTC:
            raw.adapters.register_loader("timestamptz", TimestamptzLoader)
        yield cursor


def load_rows(model: type, db: str, sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` (whose rows are whole rows of ``model``'s table, plus any extra columns)
    on ``db`` and return them as ``model`` instances, as ``raw()`` would; an extra column
    becomes an attribute of the same name."""
    connection = connections[db]
    with fast_cursor(db) as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    if not rows:
        return []
    fields = model._meta.concrete_fields
    position = {name: i for i, name in enumerate(columns)}
    order = [position[field.column] for field in fields]
    table = model._meta.db_table
    converters = [
        (i, converter, Col(table, field))
        for i, field in enumerate(fields)
        for converter in field.get_db_converters(connection)
    ]
    known = {field.column for field in fields}
    extra = [(name, i) for name, i in position.items() if name not in known]
    instances = []
    for row in rows:
        values = [row[i] for i in order]
        for i, converter, expression in converters:
            values[i] = converter(values[i], expression, connection)
        instance = model.from_db(db, None, values)
        for name, i in extra:
            setattr(instance, name, row[i])
        instances.append(instance)
    return instances
