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


@pytest.mark.django_db
def test_auto_processes_fit_in_half_of_the_servers_connections(caplog) -> None:
    """PROCESSES "auto" on a machine with more CPUs than the database can serve: as many
    processes as fit in half of the connections the server accepts (the web needs some too),
    said at INFO; an explicit count is kept, with the budget's WARNING."""
    import logging

    from django_pgtasks.worker.startup import preflight

    _, available = server_limits()
    per_process = 4 + 4  # its own connections, and one per thread
    fitting = available // 2 // per_process
    assert 1 < fitting < 64
    with caplog.at_level(logging.INFO, logger="django_pgtasks"):
        assert preflight("default", 64, 4, automatic=True) == fitting
        assert preflight("default", 2, 4, automatic=True) == 2
        assert preflight("default", 64, 4) == 64
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("PROCESSES 'auto'")] == [
        f"PROCESSES 'auto': {fitting} worker process(es) on database=default rather than one "
        f"per CPU (64): {per_process} connections each, and the server accepts {available}."]
    assert sum("Connection budget exceeded" in m for m in messages) == 1
