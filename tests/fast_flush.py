"""Emptying the test database after a transactional test with DELETE, not TRUNCATE, and
keeping what ``migrate`` put there.

Django empties the database after each transactional test (``transactional_db``,
``django_db(transaction=True)``) with one ``TRUNCATE`` of every table: each truncated table
(and each partition of the task table) gets new files, which costs 0.2 to 0.3 s on a quiet
machine and several seconds on a busy one, for tables that hold a few rows. Deleting those
rows takes about 15 ms. So after each such test, if no table holds more than
:data:`DELETE_AT_MOST` rows, its rows are deleted, in one transaction with triggers and
foreign-key checks off (``session_replication_role = replica``: the database is being
emptied, nothing must react to it).

The flush then sends ``post_migrate`` to put back the content types and permissions it
deleted, about three quarters of a quick test's teardown. Those tables (:data:`KEPT`) are
left as they are when they hold exactly what they held after the last ``post_migrate`` (an
``md5`` of their rows, compared in the same transaction): the signal would put back the very
same rows. A test that changed them gets the full treatment: every table emptied and the
signal sent.

Otherwise (a large table: deleting it would be slower and leave dead rows behind for the next
test's plans; a role not allowed to set ``session_replication_role``; a test with
``available_apps`` or a serialized rollback), Django's flush runs as before.
"""

from __future__ import annotations

from typing import Any

from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

#: The most rows a table may hold for it to be emptied with DELETE.
DELETE_AT_MOST = 2000

#: The tables ``post_migrate`` fills (content types, then the permissions that name them).
KEPT = ("django_content_type", "auth_permission")

#: Per database alias: the ``md5`` of the rows of :data:`KEPT` after the last
#: ``post_migrate`` this process sent.
_as_migrated: dict[str, str] = {}


def _kept_rows_sql(connection: Any, tables: list[str]) -> str:
    quote = connection.ops.quote_name
    return "SELECT md5(" + " || ".join(
        f"coalesce((SELECT string_agg(t::text, ',' ORDER BY t.id) FROM {quote(table)} t), '')"
        for table in tables) + ")"


def _emptied(alias: str) -> bool | None:
    """Delete the rows of the Django tables of ``alias`` if each holds at most
    :data:`DELETE_AT_MOST` rows. ``None`` if it did not (nothing changed), ``True`` if the
    tables of :data:`KEPT` were emptied too (``post_migrate`` must fill them again), ``False``
    if they were left as migrated."""
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True,
                                                          include_views=False)
    kept = [table for table in KEPT if table in tables]
    quote = connection.ops.quote_name
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("SELECT " + " OR ".join(
                f"EXISTS (SELECT FROM {quote(table)} OFFSET {DELETE_AT_MOST})"
                for table in tables))
            if cursor.fetchone()[0]:
                return None
            refill = True
            if kept and alias in _as_migrated:
                cursor.execute(_kept_rows_sql(connection, kept))
                refill = cursor.fetchone()[0] != _as_migrated[alias]
            for table in tables:
                if refill or table not in kept:
                    cursor.execute(f"DELETE FROM {quote(table)}")
    except DatabaseError:
        return None
    return refill


def _remember_as_migrated(alias: str) -> None:
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True,
                                                          include_views=False)
    kept = [table for table in KEPT if table in tables]
    if kept:
        with connection.cursor() as cursor:
            cursor.execute(_kept_rows_sql(connection, kept))
            _as_migrated[alias] = cursor.fetchone()[0]


def install() -> None:
    """Have every transactional test end with :func:`_emptied` where it can."""
    flush = TransactionTestCase._fixture_teardown

    def _fixture_teardown(self: Any) -> None:
        if self.available_apps is None and not self.serialized_rollback:
            aliases = list(self._databases_names(include_mirrors=False))
            emptied = {}
            for alias in aliases:
                emptied[alias] = _emptied(alias)
                if emptied[alias] is None:
                    break
            else:
                for alias in aliases:
                    if emptied[alias]:
                        emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)
                        _remember_as_migrated(alias)
                return
        _as_migrated.clear()  # the flush puts back the same rows under new ids
        flush(self)

    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]
