"""The classic exactly-once run at 100 threads, within a server's default connection limit.

4 worker processes x 25 threads, 5,000 tasks in exactly-once mode (each handler logs its
execution in the transaction that records its success). Each thread would hold a connection
of its own, 100 in all plus the workers' own, past PostgreSQL's default ``max_connections =
100``; with Django's connection pool (``OPTIONS["pool"]``) threads hand their connection back
between tasks and each process holds at most the pool's size plus its own three. Every task
must run exactly once, and none may fail for want of a connection.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connection, connections
from django.db.models import Count

from django_pgtasks.models import Task
from tests.helpers import stop_processes, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Enough for every thread to run dozens of tasks and the connection count to reach its
# steady state; PGTASKS_TEST_BUDGET_TASKS=100000 runs the larger classic.
N_TASKS = int(os.environ.get("PGTASKS_TEST_BUDGET_TASKS", 5_000))
PROCESSES = 4
THREADS = 25
POOL_SIZE = 10


def backends_of(database: str) -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database])
        return cursor.fetchone()[0]


@pytest.mark.timeout(900)
def test_100_threads_run_each_task_exactly_once_within_the_connection_limit(
        start_command, subprocess_env) -> None:
    database = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        max_connections = int(cursor.fetchone()[0])
    Task.objects.enqueue_bulk(tasks.chaos_exactly_once, [()] * N_TASKS)
    subprocess_env["PGTASKS_TEST_POOL"] = str(POOL_SIZE)
    processes = [
        start_command("run_pgtasks", "--concurrency", str(THREADS), "--worker-id", f"p{i}",
                      "--log-level", "WARNING")
        for i in range(PROCESSES)
    ]
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        try:
            while not done.wait(0.2):
                peak[0] = max(peak[0], backends_of(database))
        finally:
            connections.close_all()

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        wait_until(lambda: Task.objects.succeeded().count() == N_TASKS, timeout=800,
                   what="every task to succeed")
    finally:
        elapsed = time.monotonic() - started
        done.set()
        sampler.join()
        outputs = stop_processes(processes)
    assert [p.returncode for p in processes] == [0] * PROCESSES, outputs
    assert not Task.objects.exclude(status="SUCCESSFUL").exists()
    runs = Execution.objects.aggregate(n=Count("id"), tasks=Count("task_id", distinct=True))
    assert runs == {"n": N_TASKS, "tasks": N_TASKS}  # each task ran exactly once
    # Each process: the pool plus the loop's and the watchdog's own connections.
    assert peak[0] <= PROCESSES * (POOL_SIZE + 4) + 2 < max_connections
    print(f"\n{PROCESSES} processes x {THREADS} threads: {N_TASKS} tasks exactly once in "
          f"{elapsed:.0f}s ({N_TASKS / elapsed:.0f}/s), peak {peak[0]} backends on the test "
          f"database (max_connections {max_connections})")
