"""Keeping the test process's database connections from one transactional test to the next,
each session reset as a new one would find it, instead of opening new ones.

Django closes every connection after each transactional test
(``TransactionTestCase._should_reload_connections``), so the next test opens a new one: a new
server process, whose first queries read the catalog again (the task table and its
partitions, their indexes and triggers) and compile each PL/pgSQL function they call again.
That is most of the teardown and setup of a quick transactional test, on both sides of the
connection.

Instead, after such a test, a PostgreSQL connection that is usable, in autocommit and outside
any atomic block is kept, and its session reset with what ``DISCARD ALL`` does (cursors,
session authorization, every setting, ``LISTEN``, advisory locks, cached plans, temporary
tables, sequence state) but for the prepared statements, which psycopg keeps track of; then
Django sets it up as it sets up a new connection (time zone, role). Any other connection, or
one whose reset fails (its backend terminated by the test, say), is closed, as Django closes
them all.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TransactionTestCase
from psycopg.pq import TransactionStatus

#: ``DISCARD ALL`` but for ``DEALLOCATE ALL`` (psycopg would still believe its prepared
#: statements there): each statement as the PostgreSQL documentation spells ``DISCARD ALL``.
RESET_SESSION = """
CLOSE ALL;
SET SESSION AUTHORIZATION DEFAULT;
RESET ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all();
DISCARD PLANS;
DISCARD TEMP;
DISCARD SEQUENCES
"""


def reset_session(connection: BaseDatabaseWrapper) -> bool:
    """Reset the session of ``connection`` as a new connection finds it; ``False`` where
    that cannot be done, or failed partway, and the connection must be closed instead."""
    if (connection.vendor != "postgresql" or connection.connection is None
            or connection.pool is not None
            or not connection.get_autocommit() or connection.in_atomic_block
            or connection.needs_rollback or connection.run_on_commit
            or connection.connection.info.transaction_status != TransactionStatus.IDLE):
        return False
    try:
        connection.connection.execute(RESET_SESSION)
        connection.init_connection_state()
    except (DatabaseError, connection.Database.Error):
        return False
    return True


def install() -> None:
    """Have every transactional test keep the connections it can reset (see above)."""

    def _should_reload_connections(self: Any) -> bool:
        # Django asks this once the database is emptied, and closes every connection when the
        # answer is True: the connections are reset or closed here, and the answer is False.
        for connection in connections.all(initialized_only=True):
            if not reset_session(connection):
                connection.close()
        return False

    TransactionTestCase._should_reload_connections = (  # type: ignore[method-assign]
        _should_reload_connections)
