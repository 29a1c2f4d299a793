"""Retention (docs/howto/retention.md): purge and archive of finished tasks, on PostgreSQL.

Ages are set in SQL relative to the database's ``now()``, since that is the clock the purge
reads. Every test runs in autocommit (``transaction=True``), as workers and commands do, so
each purge batch really is its own transaction.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from django_pgtasks.checks import check_retention
from django_pgtasks.management.commands.pgtasks_purge import Command as PurgeCommand
from django_pgtasks.models import ArchivedTask, Status, Task, TaskFields
from django_pgtasks.patterns import retention
from django_pgtasks.patterns.retention import PURGE_LOCK_KEY, purge, purge_turn
from django_pgtasks.worker.liveness import LOCK_NAMESPACE
from django_pgtasks.worker.loop import Worker
from tests.helpers import sessions_waiting_for_a_lock, wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("history_without_gaps")]

DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)
NOOP = "tests.testapp.tasks.noop"


def seed(count: int, status: str, age: timedelta, *, spread: timedelta = timedelta(0),
         name: str = NOOP) -> None:
    """``count`` tasks in ``status`` that finished ``age`` ago on the database clock; with
    ``spread``, the i-th one ``i * spread`` earlier still (so they have distinct ages)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      started_at, finished_at)
            SELECT %s, 'default', '[]', '{}', 100, %s, 1, 3, '', '{}', now() - %s - i * %s,
                   now() - %s - i * %s - interval '1 second', now() - %s - i * %s
            FROM generate_series(0, %s - 1) AS i
            """,
            [name, status, age, spread, age, spread, age, spread, count],
        )


def counts(table: str = "pgtasks_task") -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status, count(*) FROM {table} GROUP BY status")
        return dict(cursor.fetchall())


def server_connection(**kwargs: Any) -> psycopg.Connection:
    """A plain connection to the test database, outside Django (another client)."""
    s = connection.settings_dict
    params = {"host": s["HOST"], "port": s["PORT"], "user": s["USER"],
              "password": s["PASSWORD"]}
    return psycopg.connect(dbname=s["NAME"], autocommit=True,
                           **{k: str(v) for k, v in params.items() if v}, **kwargs)


@pytest.fixture
def purge_lock_held() -> Iterator[psycopg.Connection]:
    """Another session holding the purge lock (as a purge batch elsewhere would)."""
    with server_connection() as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_NAMESPACE, PURGE_LOCK_KEY])
        yield other


# -- ages ----------------------------------------------------------------------------------


def test_finished_tasks_are_purged_after_retention_on_the_database_clock(monkeypatch) -> None:
    for status in (Status.SUCCESSFUL, Status.CANCELLED, Status.FAILED):
        seed(3, status, 7 * DAY + MINUTE)
        seed(2, status, 7 * DAY - MINUTE)
    # The application server's clock plays no part: move it a year ahead.
    a_year_ahead = timezone.now() + 365 * DAY
    monkeypatch.setattr(timezone, "now", lambda: a_year_ahead)

    result = purge()

    assert result.deleted == {"SUCCESSFUL": 3, "CANCELLED": 3}
    assert (result.archived, result.complete, result.skipped) == ({}, True, False)
    # Failed tasks of the same age stay: they are kept for FAILED_RETENTION (30 days).
    assert counts() == {"SUCCESSFUL": 2, "CANCELLED": 2, "FAILED": 5}


def test_failed_tasks_are_kept_until_failed_retention() -> None:
    seed(4, Status.FAILED, 30 * DAY + MINUTE)
    seed(1, Status.FAILED, 30 * DAY - MINUTE)
    assert purge().deleted == {"FAILED": 4}
    assert counts() == {"FAILED": 1}


def test_retention_settings_take_seconds_timedeltas_or_none(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "RETENTION": 3600,
                        "FAILED_RETENTION": None}
    seed(2, Status.SUCCESSFUL, timedelta(minutes=61))
    seed(1, Status.SUCCESSFUL, timedelta(minutes=59))
    seed(3, Status.FAILED, 1000 * DAY)  # None: kept forever
    assert purge().deleted == {"SUCCESSFUL": 2}
    settings.PGTASKS = {**settings.PGTASKS, "RETENTION": timedelta(minutes=58)}
    assert purge().deleted == {"SUCCESSFUL": 1}
    assert counts() == {"FAILED": 3}


def test_older_than_replaces_every_retention_and_failed_older_than_the_failed_one() -> None:
    seed(2, Status.SUCCESSFUL, 2 * DAY)
    seed(2, Status.FAILED, 2 * DAY)
    seed(1, Status.FAILED, 4 * DAY)
    result = purge(older_than=DAY, failed_older_than=timedelta(days=3))
    assert result.deleted == {"SUCCESSFUL": 2, "FAILED": 1}
    assert purge(older_than=86400).deleted == {"FAILED": 2}  # seconds work too
    assert counts() == {}


def test_tasks_that_are_not_finished_are_never_purged() -> None:
    seed(1, Status.FAILED, 40 * DAY)
    old_failure = Task.objects.get()
    for status in (Status.READY, Status.RUNNING, Status.AWAITING_RETRY):
        seed(1, status, 40 * DAY)  # old finished_at of an earlier attempt, not finished
    # Requeued by an operator: waiting again, so no longer old enough to purge.
    assert Task.objects.filter(pk=old_failure.pk).retry_now() == 1
    assert purge(older_than=0).deleted == {}
    assert counts() == {"READY": 2, "RUNNING": 1, "AWAITING_RETRY": 1}


# -- batches -------------------------------------------------------------------------------


def test_oldest_tasks_go_first_in_batches_of_purge_batch(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PURGE_BATCH": 100}
    seed(250, Status.SUCCESSFUL, 8 * DAY, spread=MINUTE)
    seed(5, Status.SUCCESSFUL, DAY)
    oldest = list(Task.objects.order_by("finished_at").values_list("id", flat=True)[:100])

    first = purge(max_batches=1)

    assert (first.deleted, first.batches, first.complete) == ({"SUCCESSFUL": 100}, 1, False)
    assert not Task.objects.filter(pk__in=oldest).exists()
    sizes: list[int] = []
    rest = purge(on_batch=lambda kind, done: sizes.append(sum(done.values())))
    assert (rest.deleted, rest.complete) == ({"SUCCESSFUL": 150}, True)
    # Successes, then one batch each for failures and the archive (none old enough: a short
    # batch ends its kind), then the short last batch of successes.
    assert sizes == [100, 0, 0, 50]
    assert Task.objects.count() == 5


def test_kinds_of_batch_take_turns_so_a_bounded_purge_serves_each() -> None:
    seed(30, Status.SUCCESSFUL, 8 * DAY)
    seed(30, Status.FAILED, 31 * DAY)
    kinds: list[dict[str, int]] = []
    result = purge(batch_size=10, max_batches=4, on_batch=lambda kind, done: kinds.append(done))
    assert kinds == [{"SUCCESSFUL": 10}, {"FAILED": 10}, {}, {"SUCCESSFUL": 10}]
    assert not result.complete


def test_successes_after_long_kept_failures_are_reached_without_rereading_them() -> None:
    """The failures kept 30 days are in another history table than the successes due now,
    and each batch starts where the previous one ended: no batch reads a row it leaves."""
    seed(5000, Status.FAILED, 8 * DAY, spread=timedelta(seconds=1))
    seed(300, Status.SUCCESSFUL, 7 * DAY + MINUTE, spread=timedelta(milliseconds=10))
    batches: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "DELETE" in sql:
            batches.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        result = purge(batch_size=100)
    assert result.deleted == {"SUCCESSFUL": 300}
    assert counts() == {"FAILED": 5000}

    def rows_read_and_dropped(sql: str, params: Any) -> int:
        """Index entries the batch's scan read and dropped by status, re-run now (rolled back).

        The planner's choice between the index and a scan of the whole (small) partition
        depends on the statistics, which autovacuum may have gathered at any moment of the
        run (of the seeded rows, or of the emptied partition after the purge): the re-run
        leaves out the scans that read every row, so that it shows the index-backed plan of a
        large history, whatever the statistics of this small one."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            transaction.set_rollback(True)
        assert re.search(r"Index Scan using pgtasks_task_done_\w+_finished_at_idx", plan), plan
        assert "pgtasks_task_failed" not in plan, plan
        # Nor does the DELETE read the periods that cannot hold such old rows.
        assert "Subplans Removed" in plan, plan
        assert not re.search(r"Scan.* on pgtasks_task_done_after", plan), plan
        match = re.search(r"Rows Removed by Filter: (\d+)", plan)
        return int(match.group(1)) if match else 0

    first, *later = [b for b in batches if b[1]["age"] == 7 * 86400]
    assert first[1]["after"] is None
    assert all(params["after"] is not None for _sql, params in later)
    assert [rows_read_and_dropped(*b) for b in [first, *later]] == [0] * (len(later) + 1)


@pytest.mark.slow
def test_archive_expiry_reads_the_archived_at_index() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task_archive (id, name, queue, args, kwargs, priority, status,
                attempt, max_attempts, error_text, metadata, run_after, archived_at)
            SELECT i, %s, 'default', '[]', '{}', 100, 'SUCCESSFUL', 1, 3, '', '{}', now(),
                   now() - i * interval '1 minute' + interval '30 seconds'
            FROM generate_series(1, 200000) AS i
            """,
            [NOOP],
        )
        cursor.execute("ANALYZE pgtasks_task_archive")
        cursor.execute(f"EXPLAIN (COSTS OFF) {retention.ARCHIVE_EXPIRE_SQL}",
                       {"age": 90 * 86400, "after": None, "limit": 1000})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using pgtasks_archive_at_idx" in plan, plan
    assert "Seq Scan on pgtasks_task_archive pgtasks_task_archive_1" not in plan, plan
    assert purge().archive_deleted == {"SUCCESSFUL": 200000 - 90 * 24 * 60}


def test_a_worker_turn_is_bounded(settings, monkeypatch) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PURGE_BATCH": 100}
    monkeypatch.setattr(retention, "TURN_MAX_BATCHES", 5)
    # Bounded by its batches here, not by its time (a loaded machine can take a second for
    # one batch).
    monkeypatch.setattr(retention, "TURN_SECONDS", 3600.0)
    seed(1000, Status.SUCCESSFUL, 8 * DAY)
    result = purge_turn("default")
    # Five batches: successes, failures and archive (both empty), successes twice more.
    assert (result.deleted, result.batches, result.complete) == ({"SUCCESSFUL": 300}, 5, False)
    monkeypatch.setattr(retention, "TURN_SECONDS", 0.0)
    assert purge_turn("default").batches == 0  # out of time before the first batch


def test_dry_run_counts_and_changes_nothing(settings) -> None:
    seed(3, Status.SUCCESSFUL, 8 * DAY)
    seed(2, Status.FAILED, 31 * DAY)
    seed(1, Status.FAILED, 8 * DAY)
    result = purge(dry_run=True)
    assert (result.deleted, result.batches, result.dry_run) == (
        {"SUCCESSFUL": 3, "FAILED": 2}, 0, True)
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    assert purge(dry_run=True).archived == {"SUCCESSFUL": 3, "FAILED": 2}
    assert counts() == {"SUCCESSFUL": 3, "FAILED": 3}
    assert counts("pgtasks_task_archive") == {}


def test_purge_refuses_to_run_inside_a_transaction() -> None:
    seed(1, Status.SUCCESSFUL, 8 * DAY)
    with transaction.atomic(), pytest.raises(TransactionManagementError, match="outside"):
        purge()
    with transaction.atomic():
        assert purge(dry_run=True).deleted == {"SUCCESSFUL": 1}  # counting is fine


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"older_than": -1}, "non-negative"),
        ({"failed_older_than": timedelta(seconds=-1)}, "non-negative"),
        ({"older_than": "7d"}, "non-negative number of seconds or a timedelta"),
    ],
)
def test_invalid_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        purge(**kwargs)


# -- a large purge, observed from outside ----------------------------------------------------

LARGE = 100_000


@pytest.mark.slow
def test_a_100k_row_purge_keeps_every_transaction_short_and_blocks_no_claim() -> None:
    """100,000 old rows purged while another client enqueues and claims without pause.

    An observer polls pg_stat_activity for the purging backend every millisecond or so and
    records how long its open transaction has lasted; the longest it ever sees must be a
    small fraction of the whole purge. The client's enqueue-claim-complete cycles must go on
    during the purge, each fast, and never wait for a lock the purge holds.
    """
    seed(LARGE, Status.SUCCESSFUL, 8 * DAY, spread=timedelta(milliseconds=10))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
        cursor.execute("SELECT pg_backend_pid()")
        purger = cursor.fetchone()[0]
    stop = threading.Event()
    longest_xact = [0.0]
    lock_waits: list[str] = []
    cycles: list[float] = []
    claimer_pid: list[int] = []

    def observe() -> None:
        with server_connection() as conn:
            while not stop.is_set():
                # A claim may wait for locks the purge has nothing to do with (the server-wide
                # NOTIFY queue lock that every notifying commit takes, which other databases'
                # clients on the same server take too): only a wait on the purger counts.
                rows = conn.execute(
                    "SELECT pid, extract(epoch FROM clock_timestamp() - xact_start)::float8, "
                    "wait_event, %s = ANY(pg_blocking_pids(pid)) FROM pg_stat_activity "
                    "WHERE pid = ANY(%s)",
                    [purger, [purger, *claimer_pid]],
                ).fetchall()
                for pid, age, wait, on_purger in rows:
                    if pid == purger and age is not None:
                        longest_xact[0] = max(longest_xact[0], age)
                    if pid != purger and on_purger:
                        lock_waits.append(wait)

    def claim_all_the_time() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                claimer_pid.append(cursor.fetchone()[0])
            while not stop.is_set():
                began = time.monotonic()
                Task.objects.enqueue(tasks.noop)
                [task] = Task.objects.claim("claimer")
                assert Task.objects.mark_succeeded(task)
                cycles.append(time.monotonic() - began)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=observe), threading.Thread(target=claim_all_the_time)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(cycles) >= 5)
    batches: list[int] = []
    cycles_before = len(cycles)
    began = time.monotonic()
    result = purge(on_batch=lambda kind, done: batches.append(sum(done.values())))
    elapsed = time.monotonic() - began
    cycles_during = len(cycles) - cycles_before
    stop.set()
    for thread in threads:
        thread.join(30)

    assert result.deleted == {"SUCCESSFUL": LARGE}
    # PURGE_BATCH (1000) rows a transaction; the kinds with nothing to do took one empty batch.
    assert batches.count(1000) == LARGE // 1000
    assert set(batches) == {0, 1000}
    assert Task.objects.filter(finished_at__lt=timezone.now() - 7 * DAY).count() == 0
    figures = (f"{LARGE} rows in {elapsed:.2f}s ({LARGE / elapsed:,.0f} rows/s), longest "
               f"purge transaction {longest_xact[0] * 1000:.1f} ms, {cycles_during} claim "
               f"cycles during the purge, slowest {max(cycles) * 1000:.1f} ms")
    # Bounds relative to the whole purge, not clock times (a loaded machine stretches every
    # transaction alike): one transaction for all the rows, or a claim that waited for it,
    # would take most of the purge's time; half leaves room for a stall of the machine in
    # one of the hundred.
    assert 0 < longest_xact[0] < elapsed / 2, figures
    assert cycles_during >= 10, figures
    assert max(cycles) < elapsed / 2, figures
    assert lock_waits == [], figures


# -- one purge at a time ---------------------------------------------------------------------


def test_a_purge_skips_while_another_holds_the_lock_or_waits_for_it(purge_lock_held) -> None:
    seed(5, Status.SUCCESSFUL, 8 * DAY)
    result = purge(wait=False)
    assert (result.skipped, result.complete, result.batches, result.total) == (True, False, 0, 0)

    done: list[retention.PurgeResult] = []

    def purge_and_wait() -> None:
        try:
            done.append(purge(wait=True))
        finally:
            connections["default"].close()

    thread = threading.Thread(target=purge_and_wait)
    thread.start()
    wait_until(lambda: sessions_waiting_for_a_lock("advisory") == 1, 30,
               "the purge to wait for the lock")
    assert not done  # waiting for the lock
    assert counts() == {"SUCCESSFUL": 5}
    purge_lock_held.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_NAMESPACE,
                                                                 PURGE_LOCK_KEY])
    thread.join(10)
    assert done[0].deleted == {"SUCCESSFUL": 5}


def run_worker(worker_id: str) -> tuple[Worker, threading.Thread]:
    worker = Worker(worker_id=worker_id, concurrency=1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    return worker, thread


@pytest.fixture
def fast_purge(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PURGE_INTERVAL": 0.2, "RETENTION": 60}


def test_workers_purge_by_themselves(fast_purge, caplog) -> None:
    """A worker's turn deletes old rows outside the history periods (the ``_before``
    partition, where an upgrade puts the older history) and leaves the current period whole
    (it is dropped whole once its end is past the retention: test_partitions.py)."""
    caplog.set_level("INFO", logger="django_pgtasks.retention")
    seed(20, Status.SUCCESSFUL, 2 * DAY)
    seed(3, Status.SUCCESSFUL, timedelta(minutes=2))
    worker, thread = run_worker("purger")
    try:
        wait_until(lambda: Task.objects.count() == 3)
        Task.objects.update(finished_at=Task.objects.first().finished_at - 2 * DAY)
        wait_until(lambda: Task.objects.count() == 0)  # later turns go on purging
    finally:
        worker.stop()
        thread.join(10)
    assert "Purge deleted=20 archived=0 archive_deleted=0 batches=" in caplog.text


def test_a_worker_skips_its_purge_turns_while_another_purge_holds_the_lock(
    fast_purge, purge_lock_held,
) -> None:
    seed(10, Status.SUCCESSFUL, 2 * DAY)
    worker, thread = run_worker("polite")
    try:
        # Three turns, each of which would have purged the rows had it taken the lock.
        wait_until(lambda: worker.maintainer.turns["purge"] >= 3, 30, "three purge turns")
        assert Task.objects.count() == 10
        assert worker.maintainer.gave_up["purge"] == 0  # skipped, not timed out
        purge_lock_held.execute("SELECT pg_advisory_unlock_all()")
        wait_until(lambda: Task.objects.count() == 0)
    finally:
        worker.stop()
        thread.join(10)


@pytest.mark.parametrize("interval", [0, None])
def test_purge_interval_zero_or_none_turns_the_worker_purge_off(settings, interval) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PURGE_INTERVAL": interval, "RETENTION": 60}
    seed(10, Status.SUCCESSFUL, 2 * DAY)  # what a purge turn deletes (the test above)
    worker, thread = run_worker("idle")
    try:
        # Three rounds of the maintainer (the rescue runs every 0.25s in tests/settings.py),
        # the first of which runs every enabled job: the purge had its chances.
        wait_until(lambda: worker.maintainer.turns["rescue"] >= 3, 30, "three rescue turns")
    finally:
        worker.stop()
        thread.join(10)
    assert worker.maintainer.turns["purge"] == 0
    assert Task.objects.count() == 10


# -- archive ---------------------------------------------------------------------------------

TASK_COLUMNS = [f.attname for f in TaskFields._meta.concrete_fields]


def test_archive_moves_rows_with_every_column(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    tasks_ = [Task.objects.enqueue(tasks.add, 2, b=3, queue="emails", priority=7) for _ in "ab"]
    with connection.cursor() as cursor:
        # Every column away from its default, as a task that ran, failed and was edited.
        cursor.execute(
            """
            UPDATE pgtasks_task SET status = 'FAILED', attempt = 2, max_attempts = 2,
                locked_by = 'w1', locked_at = now() - interval '40 days',
                started_at = now() - interval '40 days 1 second',
                finished_at = now() - interval '40 days', error_text = 'boom',
                result = '{"partial": [1, 2]}', worker_ids = '["w0", "w1"]',
                errors = '[{"attempt": 1, "error": "boom"}]', key = 'k-' || id,
                stage = 'second', metadata = '{"trace": "abc"}', rerun_requested = true,
                created_at = now() - interval '41 days', updated_at = now() - interval '40 days'
            """
        )
    before = {row["id"]: row for row in Task.objects.values(*TASK_COLUMNS)}
    assert len(before) == 2

    result = purge()

    assert (result.archived, result.deleted) == ({"FAILED": 2}, {})
    assert Task.objects.count() == 0
    after = {row["id"]: row for row in ArchivedTask.objects.values(*TASK_COLUMNS)}
    assert after == before
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(clock_timestamp() - archived_at) FROM pgtasks_task_archive")
        assert cursor.fetchone()[0] < timedelta(seconds=30)
    assert {t.pk for t in tasks_} == set(after)


def test_the_archive_has_its_own_retention(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    seed(6, Status.SUCCESSFUL, 8 * DAY)
    assert purge().archived == {"SUCCESSFUL": 6}
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task_archive SET archived_at = now() - "
                       "CASE WHEN id % 2 = 0 THEN interval '91 days' ELSE interval '89 days' END")
    assert purge().archive_deleted == {"SUCCESSFUL": 3}  # ARCHIVE_RETENTION, 90 days
    assert ArchivedTask.objects.count() == 3
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE_RETENTION": None}
    assert purge(older_than=0).archive_deleted == {}  # None: kept forever
    assert purge(archive_older_than=DAY).archive_deleted == {"SUCCESSFUL": 3}


def test_the_archive_retention_applies_when_archiving_is_off() -> None:
    """Turning ARCHIVE off stops archiving; what was archived still expires."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO pgtasks_task_archive (id, name, queue, args, kwargs, priority, status,
                attempt, max_attempts, error_text, metadata, run_after, archived_at)
            VALUES (1, %s, 'default', '[]', '{}', 100, 'SUCCESSFUL', 1, 3, '', '{}', now(),
                    now() - interval '100 days')
        """, [NOOP])
    assert purge().archive_deleted == {"SUCCESSFUL": 1}


def test_archiving_an_id_already_in_the_archive_replaces_the_old_copy(settings) -> None:
    """A task restored by hand from the archive (same id) and archived again."""
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    seed(1, Status.SUCCESSFUL, 8 * DAY)
    purge()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgtasks_task (id, name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, run_after, finished_at, error_text, metadata) "
            "SELECT id, name, queue, args, kwargs, priority, 'FAILED', attempt, max_attempts, "
            "run_after, finished_at, 'again', metadata FROM pgtasks_task_archive")
    assert purge(older_than=DAY).archived == {"FAILED": 1}
    assert list(ArchivedTask.objects.values_list("status", "error_text")) == [
        ("FAILED", "again")]


# -- settings checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pgtasks", "expected"),
    [
        ({"RETENTION": -1}, "django_pgtasks.E020"),
        ({"FAILED_RETENTION": "30 days"}, "django_pgtasks.E020"),
        ({"ARCHIVE_RETENTION": timedelta(days=-1)}, "django_pgtasks.E020"),
        ({"PURGE_INTERVAL": -5}, "django_pgtasks.E010"),
        ({"PURGE_INTERVAL": float("nan")}, "django_pgtasks.E010"),
        ({"RETENTION": float("inf")}, "django_pgtasks.E020"),
        ({"PURGE_BATCH": 0}, "django_pgtasks.E009"),
        ({"PURGE_BATCH": 10.5}, "django_pgtasks.E009"),
        ({"ARCHIVE": "yes"}, "django_pgtasks.E012"),
    ],
)
def test_invalid_retention_settings_are_check_errors(settings, pgtasks, expected) -> None:
    settings.PGTASKS = pgtasks
    assert [e.id for e in check_retention()] == [expected]


@pytest.mark.parametrize(
    "pgtasks",
    [{}, {"RETENTION": 0, "FAILED_RETENTION": None, "ARCHIVE_RETENTION": None,
          "PURGE_INTERVAL": None, "ARCHIVE": True},
     {"RETENTION": 3600, "FAILED_RETENTION": 86400.0, "PURGE_INTERVAL": 0}],
)
def test_valid_retention_settings_pass_the_checks(settings, pgtasks) -> None:
    settings.PGTASKS = pgtasks
    assert check_retention() == []


# -- manage.py pgtasks_purge -----------------------------------------------------------------


def purge_command(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("pgtasks_purge", *args, stdout=out)
    return out.getvalue()


def test_command_purges_and_reports_per_status() -> None:
    seed(3, Status.SUCCESSFUL, 8 * DAY)
    seed(2, Status.FAILED, 31 * DAY)
    output = purge_command()
    assert "SUCCESSFUL: 3 deleted" in output
    assert "FAILED: 2 deleted" in output
    assert re.search(r"5 task\(s\) deleted, 0 archived, 0 deleted from the archive, in "
                     r"\d+ batch\(es\)", output)
    assert counts() == {}


def test_command_dry_run_counts_only() -> None:
    seed(3, Status.SUCCESSFUL, 8 * DAY)
    output = purge_command("--dry-run")
    assert "SUCCESSFUL: 3 would be deleted" in output
    assert "3 task(s) would be purged" in output
    assert counts() == {"SUCCESSFUL": 3}


def test_command_older_than_batch_size_archive_and_progress() -> None:
    seed(25, Status.SUCCESSFUL, timedelta(hours=2))
    seed(5, Status.FAILED, timedelta(hours=2))
    seed(4, Status.SUCCESSFUL, timedelta(minutes=30))
    output = purge_command("--older-than", "1h", "--failed-older-than", "3h",
                           "--batch-size", "10", "--archive", "-v", "2")
    assert output.count("Batch: archived 10") == 2
    assert "SUCCESSFUL: 25 archived" in output
    assert counts() == {"SUCCESSFUL": 4, "FAILED": 5}
    assert counts("pgtasks_task_archive") == {"SUCCESSFUL": 25}
    assert "FAILED: 5 deleted" in purge_command("--older-than", "5400", "--no-archive")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "'soon' is not an age"),
        (["--older-than=-3d"], "'-3d' is not an age"),
        (["--failed-older-than", "1y"], "'1y' is not an age"),
        (["--batch-size", "0"], "must be at least 1, not 0"),
        (["--batch-size", "many"], "'many' is not an integer"),
        (["--database", "nowhere"], "--database 'nowhere' is not an alias in DATABASES."),
    ],
)
def test_command_option_errors_are_clear(args: list[str], message: str) -> None:
    seed(1, Status.SUCCESSFUL, 8 * DAY)
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("pgtasks_purge", *args)
    assert Task.objects.count() == 1


@pytest.mark.parametrize(("text", "seconds"), [
    ("3600", 3600), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800),
    ("2w", 1209600), ("1.5h", 5400), ("P2D", 172800), ("1 02:00:00", 93600),
])
def test_command_ages(text: str, seconds: int) -> None:
    from django_pgtasks.management.commands.pgtasks_purge import parse_age

    assert parse_age(text) == timedelta(seconds=seconds)


def test_every_command_option_says_its_default() -> None:
    parser = PurgeCommand().create_parser("manage.py", "pgtasks_purge")
    own = [a for a in parser._actions
           if {"--dry-run", "--older-than", "--failed-older-than", "--archive",
               "--batch-size", "--database"} & set(a.option_strings)]
    assert len(own) == 6
    for action in own:
        assert "(default: " in action.help, action.option_strings
    help_text = parser.format_help()
    assert "PGTASKS['RETENTION'], 7 days" in help_text
    assert "PGTASKS['FAILED_RETENTION'], 30 days" in help_text
    assert "PGTASKS['PURGE_BATCH'], 1000" in help_text
