"""The connection budget: the warning ``run_pgtasks`` logs at start, from the server's own
limits. Its arithmetic is in ``tests/unit/database/test_connection_budget.py``."""

from __future__ import annotations

import pytest

from django_pgtasks.database.connection_budget import (
    advice,
    available_connections,
)

# -- run_pgtasks ---------------------------------------------------------------------------


def server_limits() -> tuple[int, int]:
    from django.db import connection

    from django_pgtasks.database.connection_budget import SERVER_LIMITS_SQL

    with connection.cursor() as cursor:
        cursor.execute(SERVER_LIMITS_SQL)
        max_connections, superuser_reserved, reserved = cursor.fetchone()
    return max_connections, available_connections(max_connections, superuser_reserved, reserved)


@pytest.mark.slow
def test_run_pgtasks_warns_at_start_when_its_processes_cannot_all_connect(run_command) -> None:
    max_connections, available = server_limits()
    assert available < 4 * 34, "the test expects a server that cannot take 136 clients"
    result = run_command("run_pgtasks", "--burst", "--processes", "4", "--concurrency", "30")
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "Connection budget" in line]
    assert " WARNING " in line
    assert (f"Connection budget exceeded: database=default processes=4 concurrency=30 need "
            f"up to 136 connections, but the server accepts {available} "
            f"(max_connections={max_connections} minus") in line
    assert advice("default", 4, available) in line


@pytest.mark.slow
def test_run_pgtasks_within_the_budget_says_nothing_about_it(run_command) -> None:
    result = run_command("run_pgtasks", "--burst", "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert "Worker" in result.stderr  # it did log, just not about connections
    assert "Connection budget" not in result.stderr
