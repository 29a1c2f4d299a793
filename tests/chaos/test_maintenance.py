"""Maintenance never holds up the claim: a purge waiting on a lock costs the tasks nothing,
and a long job holds up neither the claims nor the worker's shutdown.

A read transaction left open on the history keeps a ``DETACH PARTITION … CONCURRENTLY`` of an
expired period waiting. The worker's maintenance (its own thread and session) gives up at its
short lock timeout and tries again at its next turn; meanwhile new tasks start at once, and
once the reader is gone the period is dropped.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import psycopg
import pytest
from django.db import connection, connections

from django_pgtasks.database.schema import DONE_TABLE
from django_pgtasks.definition import maintenance_jobs as maintenance
from django_pgtasks.models import Status, Task
from django_pgtasks.patterns import partitions
from django_pgtasks.worker.loop import Worker
from django_pgtasks.worker.maintainer import STOP_WAIT
from tests.helpers import DAY, conninfo, first_period_start, wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.usefixtures("history_without_gaps")]

#: How long a detach waits for the open transaction in the purge test (its give-up, then
#: the next turn's wait): what a claim held up behind it would wait.
DETACH_WAIT_MS = 5_000
#: How long tasks wait, from their enqueue to their start (database clock), at the median,
#: and at the most: far below the detach's wait (5 s) that a claim waiting behind
#: maintenance would show, with room for a loaded CI machine (4 test processes on 2 cores).
START_WITHIN = 1.0
START_AT_MOST = 2.5
#: Tasks enqueued one at a time, each while a detach waits for the reader.
ROUNDS = 4



def detach_waiting(watcher: psycopg.Connection) -> bool:
    """A session of this database waits for a lock in a DETACH PARTITION statement."""
    return watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query ILIKE %s", ["%DETACH PARTITION%"],
    ).fetchone()[0] > 0


def table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def gave_up(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "gave up" in r.getMessage()]


def test_a_purge_held_up_by_an_open_transaction_never_delays_a_claim(
        past_period, settings, caplog, monkeypatch) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PURGE_INTERVAL": 0.5, "RETENTION": 3600}
    monkeypatch.setattr(partitions, "DETACH_TIMEOUT_MS", DETACH_WAIT_MS)
    expired = past_period[DONE_TABLE]
    old_end: datetime = first_period_start(DONE_TABLE) + DAY
    Task.objects.bulk_create([
        Task(name=tasks.noop.name, status=Status.SUCCESSFUL, attempt=1,
             finished_at=first_period_start(DONE_TABLE) + DAY / 2) for _ in range(3)])
    worker = Worker(worker_id="unblocked", concurrency=2)
    thread = threading.Thread(target=lambda: (worker.run(install_signals=False),
                                              connections.close_all()))
    delays: list[float] = []
    with (psycopg.connect(**conninfo()) as reader,
          psycopg.connect(**conninfo(), autocommit=True) as watcher,
          caplog.at_level(logging.WARNING, logger="django_pgtasks")):
        # A report reading the expired period, its transaction left open.
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert reader.execute(f"SELECT count(*) FROM {DONE_TABLE} WHERE finished_at < %s",
                              [old_end]).fetchone()[0] == 3
        thread.start()
        try:
            for turn in range(ROUNDS):
                # Each task is enqueued while a purge turn's detach waits for the reader, one
                # turn after another (each turn gives up, the next one waits again).
                wait_until(lambda turn=turn: len(gave_up(caplog)) >= turn
                           and detach_waiting(watcher), 60, "a detach waiting for a lock")
                task = Task.objects.enqueue(tasks.noop)
                wait_until(lambda pk=task.pk: Task.objects.get(pk=pk).status
                           == Status.SUCCESSFUL, 60, "the task to succeed")
                task.refresh_from_db()
                delays.append((task.started_at - task.created_at).total_seconds())
                assert delays[-1] < START_AT_MOST, delays
            assert statistics.median(delays) < START_WITHIN, delays
            assert table_exists(expired)  # the reader still holds it
            reader.rollback()
            # The purge, retried at its next turns, drops the period once the reader is gone.
            wait_until(lambda: not table_exists(expired), 60, "the expired period to go")
            assert Task.objects.filter(status=Status.SUCCESSFUL).count() == ROUNDS
        finally:
            worker.stop()
            thread.join(30)
    assert not thread.is_alive()
    # Each give-up is one line (no traceback) saying the job tries again.
    lines = gave_up(caplog)
    assert len(lines) >= ROUNDS - 1, caplog.text
    assert all(r.exc_info is None and r.levelno == logging.WARNING for r in lines)
    # (A lock or statement timeout: the detach is bounded by both.)
    assert lines[0].getMessage().startswith("Maintenance job purge gave up (canceling "
                                            "statement due to "), lines[0].getMessage()
    assert "; next turn in 0.5s." in lines[0].getMessage()


@pytest.fixture
def slow_job() -> Iterator[str]:
    """A maintenance job whose turn runs a minute-long statement (a purge batch on a huge
    table, say), registered for the test's workers."""
    def sleep(alias: str) -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_sleep(60)")

    job = maintenance.Job(name="tests.slow", interval=lambda: 3600.0, run=sleep)
    maintenance.register(job)
    yield job.name
    maintenance._jobs.pop(job.name, None)


def sleeping_backends() -> int:
    """Backends running the slow job's statement now. ``query`` stays the last statement
    of an idle session too (a cancelled one, until its connection is gone): only an active
    one still runs it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND query = 'SELECT pg_sleep(60)' "
                       "AND state = 'active'")
        return cursor.fetchone()[0]


def test_a_long_maintenance_job_delays_neither_claims_nor_the_shutdown(slow_job, caplog) -> None:
    worker = Worker(worker_id="stops-promptly", concurrency=1)
    thread = threading.Thread(target=lambda: (worker.run(install_signals=False),
                                              connections.close_all()))
    thread.start()
    try:
        wait_until(lambda: sleeping_backends() == 1, 30, "the slow job to run")
        task = Task.objects.enqueue(tasks.noop)
        wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL, 30,
                   "the task to succeed")
        task.refresh_from_db()
        # Far under the job's minute-long statement, far over a loaded machine's delays.
        assert (task.started_at - task.created_at).total_seconds() < 10
        with caplog.at_level(logging.DEBUG, logger="django_pgtasks.worker"):
            stopping = time.monotonic()
            worker.stop()
            thread.join(30)
            took = time.monotonic() - stopping
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    # The job had its grace (STOP_WAIT), then its statement was cancelled: cut off, not failed.
    assert took < STOP_WAIT + 20, took  # not the statement's minute
    assert sleeping_backends() == 0
    assert "Maintenance job tests.slow cut off by the worker's stop" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
