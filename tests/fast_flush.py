"""Emptying the test database after a transactional test with DELETE, not TRUNCATE.

Django empties the database after each transactional test (``transactional_db``,
``django_db(transaction=True)``) with one ``TRUNCATE`` of every table: each truncated table
(and each partition of the task table) gets new files, which costs 0.2 to 0.3 s on a quiet
machine and several seconds on a busy one, for tables that hold a few rows. Deleting those
rows takes about 15 ms. So after each such test, if no table holds more than
:data:`DELETE_AT_MOST` rows, its rows are deleted, in one transaction with triggers and
foreign-key checks off (``session_replication_role = replica``: the database is being
emptied, nothing must react to it); then ``post_migrate`` is sent, as the flush sends it
(content types and permissions come back). Otherwise (a large table: deleting it would be
slower and leave dead rows behind for the next test's plans; a role not allowed to set
``session_replication_role``; a test with ``available_apps`` or a serialized rollback),
Django's flush runs as before.
"""

from __future__ import annotations

from typing import Any

from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

#: The most rows a table may hold for it to be emptied with DELETE.
DELETE_AT_MOST = 2000


def _deleted(alias: str) -> bool:
    """Delete every row of the Django tables of ``alias`` if each holds at most
    :data:`DELETE_AT_MOST` rows; whether it did (else nothing changed)."""
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True,
                                                          include_views=False)
    quote = connection.ops.quote_name
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("SELECT " + " OR ".join(
                f"EXISTS (SELECT FROM {quote(table)} OFFSET {DELETE_AT_MOST})"
                for table in tables))
            if cursor.fetchone()[0]:
                return False
            for table in tables:
                cursor.execute(f"DELETE FROM {quote(table)}")
    except DatabaseError:
        return False
    return True


def install() -> None:
    """Have every transactional test end with :func:`_deleted` where it can."""
    flush = TransactionTestCase._fixture_teardown

    def _fixture_teardown(self: Any) -> None:
        if self.available_apps is None and not self.serialized_rollback:
            aliases = list(self._databases_names(include_mirrors=False))
            if all(_deleted(alias) for alias in aliases):
                for alias in aliases:
                    emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)
                return
        flush(self)

    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]
