"""The connection budget's arithmetic (``database/connection_budget.py``): how many
connections worker processes need, what a server accepts, and the advice when they do not
fit. The warnings ``run_pgtasks`` and the system check give from a real server's settings are
tested in ``tests/integration/test_budget.py`` and ``tests/integration/test_checks.py``."""

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


def test_without_a_pool_every_thread_counts() -> None:
    # The loop's, the watchdog's (liveness, LISTEN), the maintainer's and the releaser's.
    assert PROCESS_CONNECTIONS == 4
    assert connections_per_process(25) == 29
    # The example of the docs: more than PostgreSQL's default max_connections = 100.
    assert connections_needed(4, 25, {"ENGINE": "django.db.backends.postgresql"}) == 116
    assert connections_needed(1, 4) == 8


@pytest.mark.parametrize(("processes", "threads", "needed"), [
    (1, 1, 5), (1, 4, 8), (2, 4, 16), (4, 25, 116), (8, 50, 432), (0, 10, 0),
])
def test_processes_multiply_what_one_process_needs(
    processes: int, threads: int, needed: int,
) -> None:
    assert connections_needed(processes, threads) == needed
    assert needed == processes * connections_per_process(threads)


@pytest.mark.parametrize(
    ("options", "size"),
    [
        ({}, None),
        ({"pool": False}, None),
        ({"pool": None}, None),
        ({"pool": {}}, None),  # Django: an empty dict is no pool
        ({"pool": True}, DEFAULT_POOL_SIZE),  # psycopg_pool: min_size 4, max_size = min_size
        ({"pool": {"min_size": 2, "max_size": 8}}, 8),
        ({"pool": {"min_size": 6}}, 6),
        ({"pool": {"timeout": 10}}, DEFAULT_POOL_SIZE),
        ({"pool": {"max_size": "8"}}, None),  # psycopg_pool would refuse it
        ({"pool": {"max_size": 0}}, None),
        ({"pool": {"max_size": True}}, None),
        ({"pool": "yes"}, None),
        ({"pool": ["max_size", 8]}, None),
    ],
)
def test_pool_size_as_django_and_psycopg_read_the_options(options: dict, size: int | None) -> None:
    assert pool_max_size({"OPTIONS": options}) == size


def test_options_that_are_not_a_mapping_mean_no_pool() -> None:
    assert pool_max_size({}) is None  # no OPTIONS at all
    assert pool_max_size({"OPTIONS": None}) is None
    assert pool_max_size({"OPTIONS": "pool"}) is None


def test_a_pool_caps_what_the_threads_of_a_process_hold() -> None:
    pooled = {"OPTIONS": {"pool": {"min_size": 2, "max_size": 8}}}
    assert connections_needed(4, 25, pooled) == 4 * (4 + 8)
    # A pool larger than the thread count changes nothing: threads only take what they use.
    assert connections_needed(4, 3, pooled) == 4 * (4 + 3)
    assert connections_needed(2, 30, {"OPTIONS": {"pool": True}}) == 2 * (4 + 4)
    assert connections_per_process(10, pool_size=1) == 5


@pytest.mark.parametrize(("limits", "available"), [
    ((100, 3), 97),
    ((100, 3, 5), 92),  # PostgreSQL 16's reserved_connections too
    ((3, 3, 2), 0),  # never negative
    ((10, 0, 0), 10),
])
def test_available_connections_leave_the_reserved_slots_out(
    limits: tuple[int, ...], available: int,
) -> None:
    assert available_connections(*limits) == available


def test_advice_names_the_largest_setting_that_fits() -> None:
    text = advice("default", 4, 97)  # 97 // 4 = 24 per process, 4 of them the process's own
    assert "at most 20 thread(s) per process" in text
    assert "give DATABASES['default']['OPTIONS'] a connection pool of at most 20 " in text
    assert "{'pool': {'max_size': 20}}" in text
    assert "raise the server's max_connections" in text
    assert text.endswith("; web processes and other clients need connections of their own too.")


@pytest.mark.parametrize(("processes", "available", "threads"), [
    (1, 97, 93), (2, 97, 44), (4, 100, 21), (10, 50, 1), (1, 5, 1),
])
def test_the_advised_thread_count_fits_exactly(
    processes: int, available: int, threads: int,
) -> None:
    assert f"at most {threads} thread(s) per process" in advice("db", processes, available)
    assert connections_needed(processes, threads) <= available
    assert connections_needed(processes, threads + 1) > available


@pytest.mark.parametrize(("processes", "available"), [(50, 97), (1, 4), (3, 14), (2, 0)])
def test_when_not_even_the_processes_own_connections_fit_fewer_processes(
    processes: int, available: int,
) -> None:
    text = advice("db", processes, available)
    assert text == ("To fit, run fewer processes, or raise the server's max_connections; web "
                    "processes and other clients need connections of their own too.")
