"""Dedicated database sessions, outside Django's connection handling.

Some work needs a session of its own that no other code shares: ``LISTEN`` (notifications go
to the session that listens), and a worker's session-level advisory lock (held as long as the
session lives, which is how the others know the worker is alive). Such a session must never
come from Django's pool (``OPTIONS["pool"]``), where it would go back with its lock and its
``LISTEN`` to other code.

Behind a pooler in transaction mode (``PGTASKS["POOLER"] = "transaction"``) a session opened
to the task database is a session with the pooler only: each of its transactions may run on
another server session. Nothing that lives in a server session works there (``LISTEN``,
session-level locks and settings, prepared statements), so :func:`listen_database` names a
direct connection for ``LISTEN`` (or none: the workers poll) and :func:`liveness_mode` is
``"heartbeat"``.
"""

from __future__ import annotations

from typing import Literal

import psycopg
from django.db import connections

from django_pgtasks.conf import pgtasks_settings


def open_connection(using: str) -> psycopg.Connection:
    """A new autocommit psycopg connection to database ``using``, with the settings of its
    ``DATABASES`` entry but outside Django's connections and pool.

    Like Django's own connections it prepares no statement on the server unless
    ``OPTIONS["prepare_threshold"]`` asks for it: behind a pooler in transaction mode
    (PgBouncer before 1.21) a prepared statement may be missing from the server session the
    next transaction runs on."""
    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def transaction_pooler() -> bool:
    """The task databases are reached through a pooler in transaction mode."""
    return pgtasks_settings.POOLER == "transaction"


def liveness_mode() -> Literal["advisory_lock", "heartbeat"]:
    """How workers prove they are alive: ``LIVENESS``, always ``"heartbeat"`` behind a
    transaction pooler (a session-level lock would be held by a server session the worker
    does not own)."""
    return "heartbeat" if transaction_pooler() else pgtasks_settings.LIVENESS


def listen_database(using: str) -> str | None:
    """The database alias on which to ``LISTEN`` for notifications of task database
    ``using``: its ``LISTEN_DATABASE``, else ``using`` itself; ``None`` behind a transaction
    pooler with no ``LISTEN_DATABASE`` for it, where one can only poll. (Whether workers
    listen at all is ``PGTASKS["LISTEN"]``.)"""
    direct = pgtasks_settings.LISTEN_DATABASE
    if isinstance(direct, dict):
        direct = direct.get(using)
    elif direct is not None and using != pgtasks_settings.DATABASE:
        direct = None  # an alias alone stands for PGTASKS["DATABASE"] only
    if direct:
        return direct
    return None if transaction_pooler() else using


def give_back_pooled(using: str) -> None:
    """Give this thread's connection to ``using`` back to Django's connection pool
    (``OPTIONS["pool"]``) between two rounds of work of a side thread (maintainer, releaser):
    the pool threads need its connections meanwhile. A plain connection is kept."""
    connection = connections[using]
    if connection.connection is not None and getattr(connection, "pool", None) is not None:
        connection.close()
