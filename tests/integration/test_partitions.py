"""History partitions (migration 0014, django_pgtasks.patterns.partitions): where a task's row
lives through its life, periods made ahead and dropped whole, catch partitions, cut-off turns,
and every race of a row moving between partitions.

These tests run outside a test transaction: ``DETACH PARTITION … CONCURRENTLY`` cannot run
inside one, and the workers' own sessions must see the rows.
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import Count

from django_pgtasks.checks import _history_warnings
from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE, LIVE_TABLE
from django_pgtasks.models import ArchivedTask, Status, Task
from django_pgtasks.models.dependencies import Dependency
from django_pgtasks.patterns import partitions
from django_pgtasks.patterns.retention import purge, purge_turn
from django_pgtasks.worker.loop import Worker
from tests.helpers import first_period_start, run_workers, wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("history_without_gaps")]

DAY = timedelta(days=1)


def where(pk: int) -> str:
    """The partition that holds task ``pk`` now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM pgtasks_task WHERE id = %s", [pk])
        row = cursor.fetchone()
    return row[0] if row else ""


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def finished(status: str, at: datetime, count: int = 1, **fields) -> list[Task]:
    return Task.objects.bulk_create([
        Task(name="tests.testapp.tasks.noop", status=status, finished_at=at, attempt=1,
             **fields) for _ in range(count)])


# -- where a row lives ------------------------------------------------------------------------


def test_a_task_lives_in_the_live_partition_then_in_its_history_period() -> None:
    task = Task.objects.enqueue(tasks.noop)
    assert where(task.pk) == LIVE_TABLE
    Worker(burst=True, concurrency=1).run(install_signals=False)
    task.refresh_from_db()
    assert task.status == Status.SUCCESSFUL
    assert where(task.pk) == f"{DONE_TABLE}_p{task.finished_at:%Y%m%d}"
    # Everything that reads a finished task still finds it under the one table name.
    assert Task.objects.get(pk=task.pk).result is None
    assert list(Task.objects.finished().values_list("pk", flat=True)) == [task.pk]


def test_a_failed_task_goes_to_the_failed_history_and_a_retry_brings_it_back_awake() -> None:
    task = Task.objects.enqueue(tasks.always_fails, max_attempts=1)
    Worker(burst=True, concurrency=1).run(install_signals=False)
    assert where(task.pk).startswith(f"{FAILED_TABLE}_p")
    with psycopg.connect(**_conninfo(), autocommit=True) as listener:
        listener.execute("LISTEN pgtasks")
        assert Task.objects.filter(pk=task.pk).retry_now() == 1
        # The row came back from history: the workers of its queue are woken, as for any
        # task that becomes due (the trigger of the live partition's INSERT).
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == ["default"]
    assert where(task.pk) == LIVE_TABLE
    Worker(burst=True, concurrency=1).run(install_signals=False)
    assert Task.objects.get(pk=task.pk).status == Status.FAILED


def _conninfo() -> dict:
    s = connection.settings_dict
    return {"host": s["HOST"] or None, "port": s["PORT"] or None, "user": s["USER"] or None,
            "password": s["PASSWORD"] or None, "dbname": s["NAME"]}


def test_an_end_written_without_finished_at_still_finds_its_period() -> None:
    task = Task.objects.enqueue(tasks.noop)
    with connection.cursor() as cursor:  # operator SQL that forgets finished_at
        cursor.execute("UPDATE pgtasks_task SET status = 'CANCELLED' WHERE id = %s", [task.pk])
    task.refresh_from_db()
    assert task.finished_at is not None
    assert where(task.pk).startswith(f"{DONE_TABLE}_p")
    # And the ORM gives a finished task saved without one the current time.
    saved = Task.objects.create(name="tests.testapp.tasks.noop", status=Status.FAILED)
    assert saved.finished_at is not None
    assert where(saved.pk).startswith(f"{FAILED_TABLE}_p")


# -- made ahead, caught after -----------------------------------------------------------------


def test_the_maintenance_makes_periods_ahead_once_under_concurrent_workers(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "HISTORY_PREMAKE": 5}
    results: list[bool] = []

    def turn() -> None:
        try:
            results.append(partitions.maintain("default"))
        finally:
            connection.close()

    threads = [threading.Thread(target=turn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert True in results
    for table in (DONE_TABLE, FAILED_TABLE):
        parts = partitions.partitions("default", table)
        periods = [p for p in parts if p.is_period]
        # Contiguous periods from the first to at least five days past now, then _after.
        assert all(a.end == b.start for a, b in itertools.pairwise(periods))
        assert periods[-1].end >= db_now() + 5 * DAY
        assert parts[-1].name == f"{table}_after"
        assert parts[-1].start == periods[-1].end
        assert parts[0].name == f"{table}_before"
    assert partitions.maintain("default") is True  # nothing left to make: a no-op
    assert not _history_warnings("default")


def test_a_task_that_ends_past_the_periods_is_kept_and_moved_into_its_period(settings) -> None:
    far = db_now() + 10 * DAY
    [task] = finished(Status.SUCCESSFUL, far)
    assert where(task.pk) == f"{DONE_TABLE}_after"
    # Further ahead than the maintenance makes periods (HISTORY_PREMAKE 3 days): W072.
    warnings = _history_warnings("default")
    assert [w.id for w in warnings] == ["django_pgtasks.W072"]
    assert "1 finished task(s)" in warnings[0].msg
    assert "raise PGTASKS['HISTORY_PREMAKE']" in warnings[0].hint
    settings.PGTASKS = {**settings.PGTASKS, "HISTORY_PREMAKE": 12}
    # Within its reach now: W070, whose hint (run a worker) the next turn makes true.
    warnings = _history_warnings("default")
    assert [w.id for w in warnings] == ["django_pgtasks.W070"]
    assert "moves these rows" in warnings[0].hint
    assert partitions.maintain("default")
    assert where(task.pk) == f"{DONE_TABLE}_p{far:%Y%m%d}"
    assert not _history_warnings("default")


def test_ends_far_in_the_future_stay_until_corrected_as_w072_says() -> None:
    # Written by raw SQL: a year ahead, in 9999, 'infinity'; no maintenance turn moves them.
    year, last_year, infinite = finished(Status.SUCCESSFUL, db_now(), count=3)
    [failed_task] = finished(Status.FAILED, db_now())
    with connection.cursor() as cursor:
        for task, end in ((year, "now() + interval '1 year'"),
                          (last_year, "'9999-06-01 00:00:00+00'"),
                          (infinite, "'infinity'"), (failed_task, "'9999-12-31 00:00:00+00'")):
            cursor.execute(f"UPDATE pgtasks_task SET finished_at = {end} WHERE id = %s",
                           [task.pk])
    assert {where(t.pk) for t in (year, last_year, infinite)} == {f"{DONE_TABLE}_after"}
    assert where(failed_task.pk) == f"{FAILED_TABLE}_after"
    assert partitions.maintain("default")
    assert where(year.pk) == f"{DONE_TABLE}_after"
    [warning] = _history_warnings("default")
    assert warning.id == "django_pgtasks.W072"
    assert warning.msg.startswith("4 finished task(s) in 'default' ended further in the future")
    assert "the latest at infinity" in warning.msg
    assert f"{DONE_TABLE}_after, {FAILED_TABLE}_after" in warning.msg
    # What the hint says to do: an UPDATE of the end moves each row into its period.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task SET finished_at = now() WHERE id = ANY(%s)",
                       [[year.pk, last_year.pk, infinite.pk, failed_task.pk]])
    assert where(infinite.pk).startswith(f"{DONE_TABLE}_p")
    assert where(failed_task.pk).startswith(f"{FAILED_TABLE}_p")
    assert not _history_warnings("default")


def test_a_turn_cut_off_after_detaching_after_is_finished_by_the_next(settings) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {DONE_TABLE} DETACH PARTITION {DONE_TABLE}_after")
    # Meanwhile a task ends: it has its period (made ahead), nothing is lost.
    task = Task.objects.enqueue(tasks.noop)
    Worker(burst=True, concurrency=1).run(install_signals=False)
    assert where(task.pk).startswith(f"{DONE_TABLE}_p")
    assert partitions.maintain("default")
    assert partitions.partitions("default", DONE_TABLE)[-1].name == f"{DONE_TABLE}_after"


def test_a_short_reach_is_reported() -> None:
    with connection.cursor() as cursor:
        for p in partitions.partitions("default", DONE_TABLE):
            if p.is_period and p.start > db_now():
                cursor.execute(f"ALTER TABLE {DONE_TABLE} DETACH PARTITION {p.name}")
                cursor.execute(f"DROP TABLE {p.name}")
        cursor.execute(f"ALTER TABLE {DONE_TABLE} DETACH PARTITION {DONE_TABLE}_after")
        end = max(p.end for p in partitions.partitions("default", DONE_TABLE) if p.is_period)
        cursor.execute(f"ALTER TABLE {DONE_TABLE} ATTACH PARTITION {DONE_TABLE}_after "
                       f"FOR VALUES FROM (%s) TO (MAXVALUE)", [end])
    assert "django_pgtasks.W071" in [w.id for w in _history_warnings("default")]
    assert partitions.maintain("default")
    assert not _history_warnings("default")


# -- dropped whole ------------------------------------------------------------------------------


def test_an_expired_period_is_dropped_whole_with_its_workflow_rows(past_period) -> None:
    yesterday = first_period_start(DONE_TABLE) + DAY / 2  # inside the older past period
    old = finished(Status.SUCCESSFUL, yesterday, 3) + finished(Status.CANCELLED, yesterday)
    old_failed = finished(Status.FAILED, yesterday, 2)
    recent = finished(Status.SUCCESSFUL, db_now())
    parent = Task.objects.enqueue(tasks.noop)
    child = Task.objects.enqueue(tasks.noop, depends_on=[parent])
    with connection.cursor() as cursor:  # the workflow's rows belong to an old task
        cursor.execute("UPDATE pgtasks_dependency SET child_id = %s", [old[0].pk])
    assert where(old[0].pk) == past_period[DONE_TABLE]

    result = purge_turn("default")  # RETENTION 7 days, FAILED_RETENTION 30 days by default
    assert result.deleted == {}
    result = purge(older_than=timedelta(hours=1), exact=False)
    assert result.deleted == {"SUCCESSFUL": 3, "CANCELLED": 1, "FAILED": 2}
    assert not table_exists(past_period[DONE_TABLE])
    assert not table_exists(past_period[FAILED_TABLE])
    assert not Task.objects.filter(pk__in=[t.pk for t in old + old_failed]).exists()
    assert Task.objects.filter(pk=recent[0].pk).exists()  # its period has not ended
    assert not Dependency.objects.filter(child_id=old[0].pk).exists()
    assert Task.objects.filter(pk__in=[parent.pk, child.pk]).count() == 2


def test_an_expired_period_goes_to_the_archive_first(past_period, settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "ARCHIVE": True}
    yesterday = first_period_start(DONE_TABLE) + DAY / 2  # inside the older past period
    old = finished(Status.SUCCESSFUL, yesterday, 2, result={"n": 1})
    result = purge(older_than=timedelta(hours=1), exact=False)
    assert result.archived == {"SUCCESSFUL": 2}
    assert sorted(ArchivedTask.objects.values_list("id", "result")) == sorted(
        (t.pk, {"n": 1}) for t in old)


def test_periods_are_made_and_dropped_while_workers_drain(past_period, settings,
                                                         monkeypatch) -> None:
    """DETACH … CONCURRENTLY and ATTACH take no lock that stops outcomes: workers end 400
    tasks (each moving to history) while a period is dropped and periods are made."""
    settings.PGTASKS = {**settings.PGTASKS, "HISTORY_PREMAKE": 6}
    # Waits long enough for a loaded machine: what is tested is that the workers go on
    # meanwhile, not that the partition work gets its locks within a second.
    monkeypatch.setattr(partitions, "DETACH_TIMEOUT_MS", 30_000)
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT_MS", 10_000)
    yesterday = first_period_start(DONE_TABLE) + DAY / 2  # inside the older past period
    finished(Status.SUCCESSFUL, yesterday, 50)
    Task.objects.enqueue_many([tasks.noop.build() for _ in range(400)])
    done = threading.Event()
    outcomes: list[object] = []

    def maintenance() -> None:
        try:
            wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() > 100)
            outcomes.append(purge(older_than=timedelta(hours=1), exact=False))
            # The workers' own maintainers make periods too, under the same lock: this turn
            # runs once theirs is not holding it.
            wait_until(lambda: partitions.maintain("default"), 60,
                       "a partition turn of this thread")
            outcomes.append("periods made")
        finally:
            done.set()
            connection.close()

    thread = threading.Thread(target=maintenance)
    thread.start()
    run_workers([Worker(concurrency=4) for _ in range(2)],
                until=lambda: done.is_set() and not Task.objects.exclude(
                    status=Status.SUCCESSFUL).exists())
    thread.join(60)
    assert outcomes[0].deleted == {"SUCCESSFUL": 50}
    assert outcomes[1:] == ["periods made"]  # the thread's partition turn ran to its end
    assert not table_exists(past_period[DONE_TABLE])
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 400


def test_a_drop_cut_off_after_the_detach_is_finished_by_the_next_purge(past_period) -> None:
    yesterday = first_period_start(DONE_TABLE) + DAY / 2  # inside the older past period
    finished(Status.SUCCESSFUL, yesterday, 2)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {DONE_TABLE} DETACH PARTITION {past_period[DONE_TABLE]}")
    result = purge(older_than=timedelta(days=365), exact=False)
    assert result.deleted == {"SUCCESSFUL": 2}  # the orphan goes, whatever the age
    assert not table_exists(past_period[DONE_TABLE])


# -- rows that move under a concurrent statement ------------------------------------------


def test_a_keyed_enqueue_waiting_for_the_end_of_the_keyed_task_succeeds() -> None:
    """The live task of a key ends (its row moves to history) while an enqueue of the key
    waits for its lock: the INSERT … ON CONFLICT starts over by itself and finds no live task
    of the key."""
    first = Task.objects.enqueue(tasks.noop, key="hot")

    def enqueue() -> Task:
        with transaction.atomic():
            return Task.objects.enqueue(tasks.noop, key="hot")

    [second] = _held_then_ended(first.pk, "ON CONFLICT", enqueue)
    assert isinstance(second, Task), second
    assert second.pk != first.pk
    assert Task.objects.get(pk=first.pk).status == Status.SUCCESSFUL
    assert Task.objects.get(pk=second.pk).status == Status.READY


def _held_then_ended(pk: int, waiting_for: str, action) -> list[object]:
    """Lock task ``pk`` in another session, run ``action`` in a thread until it waits for
    that lock (its statement contains ``waiting_for``), then end the task there (its row
    moves to history) and commit; return what ``action`` returned or raised."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(action())
        except BaseException as exc:
            result.append(exc)
        finally:
            connection.close()

    with psycopg.connect(**_conninfo()) as ending:
        ending.execute("SELECT 1 FROM pgtasks_task WHERE id = %s FOR UPDATE", [pk])
        thread = threading.Thread(target=run)
        thread.start()
        with psycopg.connect(**_conninfo(), autocommit=True) as watcher:
            wait_until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s", [f"%{waiting_for}%"]).fetchone()[0] == 1,
                what="the statement waiting for the task's lock")
        ending.execute("UPDATE pgtasks_task SET status = 'SUCCESSFUL', finished_at = now() "
                       "WHERE id = %s", [pk])
        ending.commit()
        thread.join(30)
    return result


def running_task(worker: str = "w-gone") -> Task:
    task = Task.objects.enqueue(tasks.noop)
    Task.objects.filter(pk=task.pk).update(status=Status.RUNNING, locked_by=worker,
                                           locked_at=db_now() - timedelta(hours=2))
    return task


def test_a_cancel_waiting_for_a_task_that_ends_meanwhile_skips_it() -> None:
    """An UPDATE that waited for a row that another transaction moved to history fails in
    PostgreSQL (40001: it cannot follow the row across partitions); the cancel is tried
    again, sees the task ended, and skips it."""
    task = running_task()
    [result] = _held_then_ended(task.pk, "cancel_requested",
                                lambda: Task.objects.filter(pk=task.pk).cancel())
    assert result == 0, result
    assert (result.cancelled, result.stopping, result.skipped) == (0, 0, 1)
    assert Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL


def test_cancels_racing_with_claims_never_fail() -> None:
    """Cancelling waiting tasks moves them to history while workers claim: neither the
    claims nor the cancels fail, and every task ends once."""
    ids = [t.pk for t in Task.objects.enqueue_many([tasks.noop.build() for _ in range(600)])]
    errors: list[BaseException] = []

    def canceller() -> None:
        try:
            for start in range(0, 600, 20):
                Task.objects.filter(pk__in=ids[start:start + 20]).cancel()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=canceller)
    thread.start()
    # The first cancels are in before the workers start (else they may claim every task
    # first); the others race with the claims.
    wait_until(lambda: Task.objects.filter(status=Status.CANCELLED).exists()
               or not thread.is_alive(), 30, "the first cancels")
    run_workers([Worker(concurrency=2) for _ in range(2)],
                until=lambda: not thread.is_alive() and not Task.objects.exclude(
                    status__in=[Status.SUCCESSFUL, Status.CANCELLED]).exists())
    thread.join(30)
    assert not errors, errors
    counts = dict(Task.objects.values_list("status").annotate(n=Count("id")))
    assert sum(counts.values()) == 600
    assert counts.get(Status.CANCELLED, 0) > 0



def test_the_dashboard_estimates_count_every_partition() -> None:
    from django_pgtasks.monitoring.dashboard import table_estimate

    Task.objects.enqueue_many([tasks.noop.build() for _ in range(30)])
    finished(Status.SUCCESSFUL, db_now(), 50)
    finished(Status.FAILED, db_now(), 20)
    with connection.cursor() as cursor:
        for table in (LIVE_TABLE, DONE_TABLE, FAILED_TABLE):
            cursor.execute(f"ANALYZE {table}")
    estimate = table_estimate("default")
    assert estimate.rows == 100
    assert estimate.by_status == {"READY": 30, "SUCCESSFUL": 50, "FAILED": 20}


def test_behind_a_transaction_pooler_a_turn_is_one_transaction(past_period, settings) -> None:
    """No session lock or session setting is left on a server session the worker does not
    own: the turn holds a transaction lock, and detaches plainly in its transaction."""
    settings.PGTASKS = {**settings.PGTASKS, "POOLER": "transaction", "HISTORY_PREMAKE": 6}
    yesterday = first_period_start(DONE_TABLE) + DAY / 2
    finished(Status.SUCCESSFUL, yesterday, 2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        timeout = cursor.fetchone()[0]
    assert purge(older_than=timedelta(hours=1), exact=False).deleted == {"SUCCESSFUL": 2}
    assert partitions.maintain("default")
    assert max(p.end for p in partitions.partitions("default", DONE_TABLE)
               if p.is_period) >= db_now() + 6 * DAY
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT current_setting('statement_timeout')")
        assert cursor.fetchone()[0] == timeout


def test_the_task_list_of_a_time_range_reads_only_its_periods(past_period, admin_client) -> None:
    from django.urls import reverse

    from django_pgtasks.admin.filters import FinishedFilter

    yesterday = first_period_start(DONE_TABLE) + DAY / 2
    old = finished(Status.SUCCESSFUL, yesterday, 2)
    recent = finished(Status.SUCCESSFUL, db_now() - timedelta(minutes=5))
    Task.objects.enqueue(tasks.noop)
    response = admin_client.get(reverse("admin:django_pgtasks_task_changelist"),
                                {"finished": "1h"})
    assert response.status_code == 200
    assert [t.pk for t in response.context["cl"].result_list] == [recent[0].pk]
    assert old[0].pk not in [t.pk for t in response.context["cl"].result_list]
    # The query reads neither yesterday's period nor the live partition.
    queryset = FinishedFilter(None, {"finished": ["24h"]}, Task, None).queryset(
        None, Task.objects.order_by("-id"))
    plan = queryset.explain()
    assert past_period[DONE_TABLE] not in plan, plan
    assert LIVE_TABLE not in plan, plan
    assert admin_client.get(reverse("admin:django_pgtasks_task_changelist"),
                            {"finished": "2h"}).status_code in (200, 302)
