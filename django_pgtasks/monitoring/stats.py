"""Queue statistics for dashboards, alerts and ``manage.py pgtasks_stats``.

Three functions, each one SQL statement in autocommit (no transaction is left open), all
computed by PostgreSQL on its own clock:

- :func:`queue_sizes`: per queue, tasks waiting (due now), scheduled (due later), running,
  and the age of the oldest waiting task: the numbers to alert on;
- :func:`throughput`: per hour and task name, tasks that ended ``SUCCESSFUL``, ``FAILED`` or
  ``CANCELLED``;
- :func:`durations`: per task name, counts, failure rate and the mean and percentiles of
  the last attempt's run time (``finished_at - started_at``).

The cost of each is bounded by the rows it reports on, not by the size of the table:
``queue_sizes`` reads the partial indexes of waiting (``pgtasks_task_claim_idx``) and running
(``pgtasks_task_running_idx``) tasks; the other two read the time range they cover through
the partial index ``pgtasks_task_finished_idx``. They see the tasks that retention keeps in
the task table, not the archive.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from django_pgtasks.conf import pgtasks_settings

# -- queue sizes ----------------------------------------------------------------------------

# Index-backed parts glued by UNION ALL, rather than one scan with status IN (pending +
# running + waiting for parents), which no partial index covers: the pending part reads
# pgtasks_task_claim_idx (queue and run_after are in it, so an index-only scan suffices), the
# running part pgtasks_task_running_idx, the part waiting for parents pgtasks_task_waiting_idx.
# Ages are seconds on the database clock.
QUEUE_SIZES_SQL = """
    SELECT queue, sum(waiting)::bigint, sum(scheduled)::bigint, sum(running)::bigint,
           extract(epoch FROM now() - min(oldest_due))::float8,
           extract(epoch FROM now() - min(oldest_lock))::float8,
           sum(blocked)::bigint
    FROM (
        SELECT queue,
               count(*) FILTER (WHERE run_after <= now()) AS waiting,
               count(*) FILTER (WHERE run_after > now()) AS scheduled,
               0 AS running,
               min(run_after) FILTER (WHERE run_after <= now()) AS oldest_due,
               NULL::timestamptz AS oldest_lock,
               0 AS blocked
        FROM pgtasks_task WHERE status IN ('READY', 'AWAITING_RETRY')
        GROUP BY queue
        UNION ALL
        SELECT queue, 0, 0, count(*), NULL, min(locked_at), 0
        FROM pgtasks_task WHERE status = 'RUNNING'
        GROUP BY queue
        UNION ALL
        SELECT queue, 0, 0, 0, NULL, NULL, count(*)
        FROM pgtasks_task WHERE status = 'WAITING'
        GROUP BY queue
    ) AS parts
    GROUP BY queue
"""


@dataclass(frozen=True)
class QueueSize:
    queue: str
    #: Due now and not claimed: the backlog.
    waiting: int
    #: Waiting for a later ``run_after`` (delayed tasks, retries in backoff).
    scheduled: int
    running: int
    #: Seconds since the oldest waiting task became due; ``None`` when nothing waits. A value
    #: that keeps growing means the workers of this queue cannot keep up.
    oldest_waiting: float | None
    #: Seconds since the longest running task was claimed; ``None`` when nothing runs.
    longest_running: float | None
    #: Waiting for the tasks they depend on to end (workflows): not claimable yet.
    waiting_for_parents: int = field(default=0, kw_only=True)


def queue_sizes(using: str | None = None) -> list[QueueSize]:
    """Per queue: waiting, scheduled and running tasks, oldest waiting age, longest run, and
    tasks waiting for the tasks they depend on.

    Every queue in ``PGTASKS["QUEUES"]`` is listed (with zeros when empty), then any other
    queue that still has tasks, by name.
    """
    with connections[using or pgtasks_settings.DATABASE].cursor() as cursor:
        cursor.execute(QUEUE_SIZES_SQL)
        found = {row[0]: QueueSize(*row[:6], waiting_for_parents=row[6])
                 for row in cursor.fetchall()}
    configured = pgtasks_settings.queue_names
    names = configured + sorted(set(found) - set(configured))
    return [found.get(name) or QueueSize(name, 0, 0, 0, None, None) for name in names]


# -- throughput -----------------------------------------------------------------------------

# Hour buckets in UTC (date_trunc's zone argument, PostgreSQL 14+), so they do not depend on
# the session's time zone. The window starts at the top of the hour, hours - 1 hours before
# the current one, and reads that range of pgtasks_task_finished_idx.
THROUGHPUT_SQL = """
    SELECT date_trunc('hour', finished_at, 'UTC') AS hour, name,
           count(*) FILTER (WHERE status = 'SUCCESSFUL'),
           count(*) FILTER (WHERE status = 'FAILED'),
           count(*) FILTER (WHERE status = 'CANCELLED')
    FROM pgtasks_task
    WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
      AND finished_at >= date_trunc('hour', now(), 'UTC') - make_interval(hours => %s - 1)
    GROUP BY 1, 2
    ORDER BY 1, 2
"""


@dataclass(frozen=True)
class HourlyCount:
    #: Start of the hour (UTC).
    hour: datetime
    name: str
    succeeded: int
    failed: int
    cancelled: int

    @property
    def total(self) -> int:
        return self.succeeded + self.failed + self.cancelled


def throughput(hours: int = 24, using: str | None = None) -> list[HourlyCount]:
    """Tasks that ended per hour and task name, over the current hour and ``hours - 1`` before.

    A task counts once, in the hour it ended, by its final state: a task that failed twice
    and then succeeded is one success. Hours without any ended task are left out.
    """
    if isinstance(hours, bool) or not isinstance(hours, int) or hours < 1:
        raise ValueError(f"hours must be a positive integer, not {hours!r}.")
    with connections[using or pgtasks_settings.DATABASE].cursor() as cursor:
        cursor.execute(THROUGHPUT_SQL, [hours])
        return [HourlyCount(*row) for row in cursor.fetchall()]


# -- durations ------------------------------------------------------------------------------

# Run time of the last attempt, in seconds, of tasks that ran: cancelled tasks are counted but
# have no run time (finished_at is when they were cancelled). percentile_cont interpolates
# between the two nearest values and ignores NULLs. The failure rate is FAILED among the
# tasks that ended SUCCESSFUL or FAILED.
DURATIONS_SQL = """
    SELECT name,
           count(*) FILTER (WHERE status = 'SUCCESSFUL'),
           count(*) FILTER (WHERE status = 'FAILED'),
           count(*) FILTER (WHERE status = 'CANCELLED'),
           avg(run_time)::float8,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY run_time),
           max(run_time)::float8,
           (count(*) FILTER (WHERE status = 'FAILED'))::float8
               / nullif(count(*) FILTER (WHERE status <> 'CANCELLED'), 0)
    FROM (
        SELECT name, status,
               CASE WHEN status <> 'CANCELLED'
                    THEN extract(epoch FROM finished_at - started_at)::float8 END AS run_time
        FROM pgtasks_task
        WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') AND finished_at >= {since}
    ) AS ended
    GROUP BY name
    ORDER BY name
"""


@dataclass(frozen=True)
class DurationStats:
    name: str
    succeeded: int
    failed: int
    cancelled: int
    #: Seconds the last attempt ran (mean, median, 95th and 99th percentile, longest), over
    #: the tasks that ended SUCCESSFUL or FAILED; ``None`` if none did.
    avg: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None
    #: ``failed / (succeeded + failed)``; ``None`` if none ended either way.
    failure_rate: float | None


def durations(
    since: datetime | timedelta = timedelta(hours=24), using: str | None = None,
) -> list[DurationStats]:
    """Per task name, for tasks that ended since ``since``: counts, failure rate, run times.

    ``since`` is an aware datetime, or a ``timedelta`` back from the database's ``now()``.
    """
    if isinstance(since, timedelta):
        sql, params = DURATIONS_SQL.format(since="now() - %s"), [since]
    elif isinstance(since, datetime):
        sql, params = DURATIONS_SQL.format(since="%s"), [since]
    else:
        raise TypeError(f"since must be a datetime or a timedelta, not {since!r}.")
    with connections[using or pgtasks_settings.DATABASE].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        DurationStats(name, ok, failed, cancelled, avg, *(percentiles or (None,) * 3), longest,
                      rate)
        for name, ok, failed, cancelled, avg, percentiles, longest, rate in rows
    ]


def as_dict(row: QueueSize | HourlyCount | DurationStats) -> dict[str, Any]:
    """A row as a plain dict (for JSON: datetimes are left to the caller's encoder)."""
    data = asdict(row)
    if isinstance(row, HourlyCount):
        data["total"] = row.total
    return data
