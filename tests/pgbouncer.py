"""A PgBouncer of the test's own, in transaction mode, in front of the test's PostgreSQL server
(``tests/process/test_pgbouncer.py``).

Debian's ``pgbouncer`` package (``.ci/install-pgbouncer``) provides the binary; a service the
package may have started is not used. :class:`PgBouncer` writes an ini file into a temporary
folder, starts ``pgbouncer`` on a free local port (as ``nobody`` when the tests run as root:
PgBouncer refuses to run as root) and stops it at the end, which closes its server sessions.
``pool_mode = transaction`` with a small pool (:data:`POOL_SIZE` server sessions per database
and user) makes transactions of one client move between server sessions.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

#: Server sessions PgBouncer keeps per database and user: fewer than a worker's connections.
POOL_SIZE = 4
#: System user PgBouncer runs as when the tests run as root.
UNPRIVILEGED_USER = "nobody"


def binary() -> str | None:
    """The ``pgbouncer`` executable, or ``None`` if it is not installed."""
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(path)),
        None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """One ``pgbouncer`` process in transaction mode for the server of ``database`` (a Django
    ``DATABASES`` entry); every database name a client asks for is passed through."""

    def __init__(self, database: dict[str, Any]) -> None:
        self.user = database["USER"] or "postgres"
        self.password = database["PASSWORD"] or ""
        host = database["HOST"] or ("/var/run/postgresql" if os.path.isdir(
            "/var/run/postgresql") else "127.0.0.1")
        self.server = (host, str(database["PORT"] or 5432))
        self.dir = Path(tempfile.mkdtemp(prefix="pgtasks-pgbouncer-"))
        self.port = 0
        self.process: subprocess.Popen | None = None

    def _write_config(self) -> Path:
        (self.dir / "userlist.txt").write_text(f"{_quote(self.user)} {_quote(self.password)}\n")
        host, port = self.server
        config = self.dir / "pgbouncer.ini"
        config.write_text("\n".join([
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.dir / 'userlist.txt'}",
            f"admin_users = {self.user}",
            "pool_mode = transaction",
            f"default_pool_size = {POOL_SIZE}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            "max_client_conn = 500",
            f"logfile = {self.dir / 'pgbouncer.log'}",
            f"pidfile = {self.dir / 'pgbouncer.pid'}",
            "",
        ]))
        return config

    def start(self, timeout: float = 30) -> None:
        """Start PgBouncer and wait until it accepts connections; a port taken meanwhile by
        another process is replaced by another free one."""
        command = [binary() or "pgbouncer"]
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(UNPRIVILEGED_USER)
            except KeyError:
                raise RuntimeError(f"PgBouncer refuses to run as root, and there is no user "
                                   f"{UNPRIVILEGED_USER!r} to run it as.") from None
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            command += ["-u", UNPRIVILEGED_USER]
        for _ in range(5):
            self.port = _free_port()
            config = self._write_config()
            for path in self.dir.iterdir():
                if os.geteuid() == 0:
                    os.chown(path, user.pw_uid, user.pw_gid)
            self.process = subprocess.Popen([*command, str(config)], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT)
            if self._wait_until_up(timeout):
                return
            self.stop()
        raise RuntimeError(f"pgbouncer did not start; its log:\n{self.log()}")

    def _wait_until_up(self, timeout: float) -> bool:
        """Until the process started last accepts connections (``True``), or has exited or
        not within ``timeout`` (``False``)."""
        from tests.helpers import wait_until  # not at import: it needs Django's apps

        up = [False]

        def answered_or_exited() -> bool:
            if self.process.poll() is not None:
                return True
            try:
                with self.admin() as conn:
                    conn.execute("SHOW VERSION")
            except psycopg.OperationalError:
                return False
            up[0] = True
            return True

        with contextlib.suppress(AssertionError):
            wait_until(answered_or_exited, timeout, "PgBouncer to accept connections")
        return up[0]

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def admin(self) -> psycopg.Connection:
        """A connection to PgBouncer's admin console (simple query protocol only, hence the
        client-side binding cursor)."""
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer",
                               user=self.user, autocommit=True,
                               cursor_factory=psycopg.ClientCursor)

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW <what>`` on the admin console, each row as a dict."""
        with self.admin() as conn, conn.cursor() as cursor:
            cursor.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def connect(self, dbname: str) -> psycopg.Connection:
        """A client session of PgBouncer to ``dbname`` (nothing prepared on the server)."""
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname=dbname,
                               user=self.user, password=self.password, autocommit=True,
                               prepare_threshold=None)

    def stop(self) -> None:
        """Immediate shutdown (SIGTERM): every client and server session is closed."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def remove(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)
