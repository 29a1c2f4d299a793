"""Dedicated database sessions, outside Django's connection handling.

Some work needs a session of its own that no other code shares: ``LISTEN`` (notifications go
to the session that listens), and a worker's session-level advisory lock (held as long as the
session lives, which is how the others know the worker is alive). Such a session must never
come from Django's pool (``OPTIONS["pool"]``), where it would go back with its lock and its
``LISTEN`` to other code.
"""

from __future__ import annotations

import psycopg
from django.db import connections


def open_connection(using: str) -> psycopg.Connection:
    """A new autocommit psycopg connection to database ``using``, with the settings of its
    ``DATABASES`` entry but outside Django's connections and pool."""
    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)
