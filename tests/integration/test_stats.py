"""Statistics (docs/howto/monitoring.md): numbers on seeded data, index use, the command."""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from django_pgtasks.management.commands import pgtasks_stats
from django_pgtasks.models import Status
from django_pgtasks.monitoring import stats
from tests.helpers import assert_reads_only_the_window

pytestmark = pytest.mark.django_db(transaction=True)


def insert(count: int, *, name: str = "a", status: str = Status.SUCCESSFUL,
           queue: str = "default", ended: str = "now()", run_time: str = "interval '1 second'",
           run_after: str = "now()", locked_at: str = "NULL") -> None:
    """``count`` rows; the SQL fragments may use ``i`` (1..count) and run on the database."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      locked_at, started_at, finished_at)
            SELECT %s, %s, '[]', '{{}}', 100, %s, 1, 3, '', '{{}}', {run_after}, {locked_at},
                   ({ended}) - ({run_time}), {ended}
            FROM generate_series(1, %s) AS i
            """,
            [name, queue, status, count],
        )


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def percentile_cont(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the nearest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- queue sizes ---------------------------------------------------------------------------


def test_queue_sizes_count_waiting_scheduled_and_running_with_ages(
    django_assert_num_queries,
) -> None:
    # In "default": due 200, 400 and 600 s ago, due 2 minutes ago (a retry), three later.
    insert(3, status=Status.READY, run_after="now() - i * interval '200 seconds'")
    insert(1, status=Status.AWAITING_RETRY, run_after="now() - interval '2 minutes'")
    insert(2, run_after="now() + interval '1 hour'", status=Status.READY)
    insert(1, status=Status.AWAITING_RETRY, run_after="now() + interval '5 minutes'")
    insert(2, status=Status.RUNNING, locked_at="now() - i * interval '45 seconds'")
    insert(4, status=Status.SUCCESSFUL)  # finished: not counted
    insert(5, status=Status.WAITING)  # waiting for the tasks they depend on
    # A queue removed from QUEUES that still has a waiting task.
    insert(1, queue="legacy", status=Status.READY, run_after="now() - interval '1 hour'")
    for status in (Status.FAILED, Status.CANCELLED):
        insert(1, queue="emails", status=status)

    with django_assert_num_queries(1):
        sizes = {q.queue: q for q in stats.queue_sizes()}

    assert list(sizes) == ["default", "emails", "urgent", "legacy"]  # configured ones first
    default = sizes["default"]
    assert (default.waiting, default.scheduled, default.running) == (4, 3, 2)
    assert default.waiting_for_parents == 5
    assert default.oldest_waiting == pytest.approx(600, abs=5)
    assert default.longest_running == pytest.approx(90, abs=5)
    assert sizes["emails"] == stats.QueueSize("emails", 0, 0, 0, None, None)
    assert sizes["legacy"].waiting == 1
    assert sizes["legacy"].oldest_waiting == pytest.approx(3600, abs=5)


# -- throughput ----------------------------------------------------------------------------


def test_throughput_counts_ended_tasks_per_hour_and_name(django_assert_num_queries) -> None:
    for minutes, name, status in [(5, "a", Status.SUCCESSFUL), (6, "a", Status.SUCCESSFUL),
                                  (7, "a", Status.FAILED), (8, "b", Status.CANCELLED),
                                  (65, "a", Status.SUCCESSFUL), (185, "b", Status.FAILED),
                                  (22 * 60, "b", Status.SUCCESSFUL),
                                  (26 * 60, "a", Status.SUCCESSFUL)]:  # outside 24 hours
        insert(1, name=name, status=status, ended=f"now() - interval '{minutes} minutes'")
    # A failed attempt that will be retried has finished_at too, but has not ended.
    insert(1, status=Status.AWAITING_RETRY, ended="now() - interval '1 minute'")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, status, finished_at FROM pgtasks_task "
                       "WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')")
        ended = cursor.fetchall()

    for hours in (1, 24):
        with django_assert_num_queries(1):
            rows = stats.throughput(hours=hours)
        now = db_now()
        start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
        expected = Counter(
            (at.replace(minute=0, second=0, microsecond=0), name, status)
            for name, status, at in ended if at >= start
        )
        got = Counter()
        for row in rows:
            for status, n in ((Status.SUCCESSFUL, row.succeeded), (Status.FAILED, row.failed),
                              (Status.CANCELLED, row.cancelled)):
                if n:
                    got[(row.hour, row.name, status)] = n
        assert got == expected
        assert rows == sorted(rows, key=lambda r: (r.hour, r.name))
    assert sum(r.total for r in stats.throughput(hours=24)) == 7


# -- durations -----------------------------------------------------------------------------


def test_durations_give_counts_failure_rate_and_run_time_percentiles(
    django_assert_num_queries,
) -> None:
    # "a": 101 successes that ran 0..100 s, 4 failures that ran 1000 s, 2 cancellations.
    insert(101, ended="now() - interval '1 hour'", run_time="(i - 1) * interval '1 second'")
    insert(4, status=Status.FAILED, run_time="interval '1000 seconds'")
    insert(2, status=Status.CANCELLED, run_time="interval '5000 seconds'")
    # "b": only cancellations; "old": ended before the window.
    insert(3, name="b", status=Status.CANCELLED)
    insert(5, name="old", ended="now() - interval '3 days'")
    run_times = [float(i) for i in range(101)] + [1000.0] * 4

    with django_assert_num_queries(1):
        rows = {row.name: row for row in stats.durations()}

    assert list(rows) == ["a", "b"]
    a = rows["a"]
    assert (a.succeeded, a.failed, a.cancelled) == (101, 4, 2)
    assert a.failure_rate == pytest.approx(4 / 105)
    assert a.avg == pytest.approx(sum(run_times) / len(run_times))
    for fraction, value in ((0.5, a.p50), (0.95, a.p95), (0.99, a.p99)):
        assert value == pytest.approx(percentile_cont(run_times, fraction))
    assert a.max == 1000.0
    assert rows["b"] == stats.DurationStats("b", 0, 0, 3, None, None, None, None, None, None)


def test_durations_since_a_datetime_or_a_timedelta() -> None:
    insert(2, ended="now() - interval '30 minutes'")
    insert(3, ended="now() - interval '2 hours'")
    assert stats.durations(since=timedelta(hours=1))[0].succeeded == 2
    assert stats.durations(since=db_now() - timedelta(hours=3))[0].succeeded == 5
    with pytest.raises(TypeError, match="since must be a datetime or a timedelta"):
        stats.durations(since=3600)  # type: ignore[arg-type]


# -- index use on a large table ------------------------------------------------------------

FINISHED_ROWS = 300_000
PENDING_ROWS = 30_000


def explain(sql: str, params: list[Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.slow
def test_statistics_read_indexes_not_the_table_on_300k_finished_rows() -> None:
    """300k ended tasks over 30 days, 30k waiting, 600 running: each statistic reads its
    index range (the last 24 hours, the pending tasks, the running ones), never the table."""
    inserted_at = db_now()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      started_at, finished_at)
            SELECT 'n' || (i %% 20), (ARRAY['default','emails','urgent'])[1 + i %% 3], '[]',
                   '{}', 100, CASE WHEN i %% 10 = 0 THEN 'FAILED' WHEN i %% 10 = 1 THEN 'CANCELLED'
                               ELSE 'SUCCESSFUL' END,
                   1, 3, '', '{}', now() - interval '31 days',
                   now() - i * interval '8.64 seconds' - (i %% 7) * interval '1 second',
                   now() - i * interval '8.64 seconds'
            FROM generate_series(1, %s) AS i
            """,
            [FINISHED_ROWS],
        )
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after, locked_at)
            SELECT 'n1', (ARRAY['default','emails'])[1 + i %% 2], '[]', '{}', i %% 200,
                   CASE WHEN i %% 50 = 0 THEN 'RUNNING'
                        WHEN i %% 7 = 0 THEN 'AWAITING_RETRY' ELSE 'READY' END, 1, 3, '', '{}',
                   now() + (CASE WHEN i %% 2 = 0 THEN 1 ELSE -1 END) * interval '1 hour',
                   CASE WHEN i %% 50 = 0 THEN now() END
            FROM generate_series(1, %s) AS i
            """,
            [PENDING_ROWS],
        )
        cursor.execute("ANALYZE pgtasks_task")

    plans = {
        "throughput": explain(stats.THROUGHPUT_SQL, [24]),
        "durations": explain(stats.DURATIONS_SQL.format(since="now() - %s"),
                             [timedelta(hours=24)]),
        "durations since": explain(stats.DURATIONS_SQL.format(since="%s"),
                                   [db_now() - timedelta(hours=24)]),
        "queue sizes": explain(stats.QUEUE_SIZES_SQL, []),
    }
    # Each reads its window's periods (whole, if the planner likes: at most two days) and
    # the live partition, never the 30 days of history. The throughput's window starts on a
    # whole hour.
    now = db_now()
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    windows = {"throughput": hour - timedelta(hours=23), "durations": now - timedelta(hours=24),
               "durations since": now - timedelta(hours=24), "queue sizes": now}
    for what, since in windows.items():
        assert_reads_only_the_window(plans[what], since, now)
    for what in ("throughput", "durations", "durations since"):
        assert re.search(r"pgtasks_task_done_p\d{8}", plans[what]), plans[what]
    assert "pgtasks_task_done" not in plans["queue sizes"], plans["queue sizes"]
    assert "pgtasks_task_failed" not in plans["queue sizes"], plans["queue sizes"]

    # And the numbers on that table: 10,000 tasks ended in the 24 hours before the insert
    # (one every 8.64 s), less those the window has left behind since (the database clock
    # moves on while the plans above are made on a busy machine); 600 run now; the 15,000
    # odd-numbered pending ones are due.
    ended = sum(r.succeeded + r.failed + r.cancelled
                for r in stats.durations(timedelta(hours=24)))
    elapsed = (db_now() - inserted_at).total_seconds()
    assert 10_000 - elapsed / 8.64 - 1 <= ended <= 10_000, (ended, elapsed)
    sizes = {q.queue: q for q in stats.queue_sizes()}
    assert sum(q.running for q in sizes.values()) == 600
    assert sum(q.waiting for q in sizes.values()) == PENDING_ROWS // 2


# -- manage.py pgtasks_stats -----------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stats_command(*args: str, out: io.StringIO | None = None) -> str:
    out = out or io.StringIO()
    call_command("pgtasks_stats", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def seeded() -> None:
    insert(3, run_after="now() - interval '10 minutes'", status=Status.READY)
    insert(1, status=Status.RUNNING, locked_at="now() - interval '2 minutes'")
    insert(9, name="mail.send", run_time="interval '2 seconds'")
    insert(1, name="mail.send", status=Status.FAILED, run_time="interval '2 seconds'")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task SET error_text = 'SMTPError: 451 busy, id 7f3a9\n..."
                       "' WHERE status = 'FAILED'")


def test_command_prints_readable_tables(seeded) -> None:
    output = stats_command()
    lines = output.splitlines()
    assert re.search(r"^default\s+3\s+0\s+1\s+0\s+10m0\ds\s+2m0\ds\s+9\s+1$", output,
                     re.MULTILINE), output
    assert re.search(r"^emails\s+0\s+0\s+0\s+0\s+-\s+-\s+0\s+0$", output,
                     re.MULTILINE), output
    assert re.search(r"^mail\.send\s+9\s+1\s+0\s+10\.0%\s+2\.000s", output, re.MULTILINE), output
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:00\s+9\s+1\s+0$", output, re.MULTILINE), output
    assert "Tasks ended per hour (last 24 h)" in lines
    # The dashboard's other numbers: failures by error, stuck tasks, workers.
    assert "Failed tasks by error (last 24 h)" in lines
    assert re.search(r"^\s*1\s+SMTPError: N busy, id N$", output, re.MULTILINE), output
    # The running task's lease is two minutes old and no registered worker holds it.
    assert "Stuck tasks: 1" in lines
    assert "(no worker registered)" in lines
    assert "== Database" not in output  # one database: no database headings


def test_command_json_has_the_api_numbers(seeded) -> None:
    document = json.loads(stats_command("--json", "--hours", "2"))
    assert document["hours"] == 2
    [data] = document["databases"]
    assert data["database"] == "default"
    assert data["queues"][0] == {"queue": "default", "waiting": 3, "scheduled": 0,
                                 "running": 1, "waiting_for_parents": 0,
                                 "oldest_waiting": pytest.approx(600, abs=5),
                                 "longest_running": pytest.approx(120, abs=5),
                                 "succeeded_last_hour": 9, "failed_last_hour": 1,
                                 "cancelled_last_hour": 0, "finished_last_hour": 10}
    [mail] = [d for d in data["durations"] if d["name"] == "mail.send"]
    assert (mail["succeeded"], mail["failed"], mail["failure_rate"]) == (9, 1, 0.1)
    assert sum(h["total"] for h in data["throughput"]) == 10
    datetime.fromisoformat(data["throughput"][0]["hour"])
    assert data["error_groups"] == [{"text": "SMTPError: N busy, id N", "count": 1,
                                     "last_failed_at": data["error_groups"][0]["last_failed_at"]}]
    assert data["stuck_count"] == 1
    assert data["workers"] == []
    assert len(data["chart"]) == 24
    assert sum(point["succeeded"] for point in data["chart"]) == 9
    assert set(data["estimate"]) == {"rows", "exact", "by_status"}


def test_command_watch_refreshes_until_interrupted(seeded, monkeypatch) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(pgtasks_stats.time, "sleep", sleep)
    output = stats_command("--watch", "2.5", out=Terminal())
    assert sleeps == [2.5, 2.5, 2.5]
    assert output.count(pgtasks_stats.CLEAR_SCREEN) == 3  # a terminal is redrawn, like top
    assert output.count("Queues\n") == 3

    sleeps.clear()
    lines = stats_command("--watch", "1", "--json").splitlines()  # not a terminal
    assert len(lines) == 3
    assert all(json.loads(line)["databases"][0]["queues"] for line in lines)
    assert pgtasks_stats.CLEAR_SCREEN not in "".join(lines)


def test_command_lists_workers(seeded) -> None:
    from django_pgtasks.models import WorkerProcess

    WorkerProcess.objects.create(name="web-1:42", hostname="web-1", pid=42, concurrency=8,
                                 queues=["default", "emails"])
    output = stats_command("--database", "default")
    assert re.search(r"^web-1:42\s+default,emails\s+8\s+0\s+\d+\.\d+s ago\s+alive$", output,
                     re.MULTILINE), output
    assert "== Database" not in output
