"""The connection budget: its arithmetic, and the warning ``run_pgtasks`` logs at start."""

from __future__ import annotations

import pytest

from django_pgtasks.database.connection_budget import (
    DEFAULT_POOL_SIZE,
    PROCESS_CONNECTIONS,
    advice,
    available_connections,
    connections_needed,
    connections_per_process,
    pool_max_size,
)

# -- Arithmetic ----------------------------------------------------------------------------


def test_without_a_pool_every_thread_counts() -> None:
    # The loop's, the watchdog's (liveness, LISTEN) and the maintainer's.
    assert PROCESS_CONNECTIONS == 4
    assert connections_per_process(25) == 29
    # The example of the docs: more than PostgreSQL's default max_connections = 100.
    assert connections_needed(4, 25, {"ENGINE": "django.db.backends.postgresql"}) == 116
    assert connections_needed(1, 4) == 8


@pytest.mark.parametrize(
    ("options", "size"),
    [
        ({}, None),
        ({"pool": False}, None),
        ({"pool": {}}, None),  # Django: an empty dict is no pool
        ({"pool": True}, DEFAULT_POOL_SIZE),  # psycopg_pool: min_size 4, max_size = min_size
        ({"pool": {"min_size": 2, "max_size": 8}}, 8),
        ({"pool": {"min_size": 6}}, 6),
        ({"pool": {"timeout": 10}}, DEFAULT_POOL_SIZE),
        ({"pool": {"max_size": "8"}}, None),  # psycopg_pool would refuse it
        ({"pool": "yes"}, None),
    ],
)
def test_pool_size_as_django_and_psycopg_read_the_options(options: dict, size: int | None) -> None:
    assert pool_max_size({"OPTIONS": options}) == size


def test_a_pool_caps_what_the_threads_of_a_process_hold() -> None:
    pooled = {"OPTIONS": {"pool": {"min_size": 2, "max_size": 8}}}
    assert connections_needed(4, 25, pooled) == 4 * (4 + 8)
    # A pool larger than the thread count changes nothing: threads only take what they use.
    assert connections_needed(4, 3, pooled) == 4 * (4 + 3)
    assert connections_needed(2, 30, {"OPTIONS": {"pool": True}}) == 2 * (4 + 4)
    assert pool_max_size({}) is None  # no OPTIONS at all


def test_available_connections_leave_the_reserved_slots_out() -> None:
    assert available_connections(100, 3) == 97
    assert available_connections(100, 3, 5) == 92
    assert available_connections(3, 3, 2) == 0


def test_advice_names_the_largest_setting_that_fits() -> None:
    text = advice("default", 4, 97)  # 97 // 4 = 24 per process, 4 of them the process's own
    assert "at most 20 thread(s) per process" in text
    assert "{'pool': {'max_size': 20}}" in text
    assert "max_connections" in text
    assert text.endswith(".")
    assert "fewer processes" in advice("default", 50, 97)  # 1 per process: not even the three


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
