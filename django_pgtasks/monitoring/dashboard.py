"""The numbers of the admin dashboard, of ``manage.py pgtasks_stats`` and of the metrics view.

Everything here answers "what is stuck, what is failing and why, is the queue keeping up"
for one database alias, and each query is bounded by the rows it reports on, never by the
size of the task table:

- tasks waiting or running are counted through the partial indexes that hold only them
  (``pgtasks_task_claim_idx``, ``pgtasks_task_running_idx``);
- finished tasks are counted over a time window (the last ``hours``) through the partial index
  ``pgtasks_task_finished_idx``;
- tasks enqueued per hour are told by the ids handed out in each hour, found by a binary
  search over the primary key (an estimate: a few hundred index probes);
- numbers over the whole table (its size, the share of each status) come from PostgreSQL's
  statistics (``pg_class.reltuples``, ``pg_stats``) and are marked as estimates;
- the most recent workflows are found by stepping down the member table's primary key from
  its newest row (:data:`RECENT_WORKFLOWS_SQL`), and only their members are read.

:func:`database_snapshot` gathers them all; the admin renders it, the command prints it.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.timestamps import PYTHON_END_SQL
from django_pgtasks.definition.routing import queues_on
from django_pgtasks.lifecycle.leases import LOST_WORKER_SQL, lost_worker_params
from django_pgtasks.models import Task
from django_pgtasks.monitoring.errors import (
    DIGITS_PATTERN,
    ERROR_GROUP_LENGTH,
    ERROR_GROUP_SQL,
    HEX_WORD_PATTERN,
    error_group_expression,
)
from django_pgtasks.monitoring.report import (
    DatabaseSnapshot,
    ErrorGroup,
    FailingRelease,
    HourPoint,
    NameCounts,
    QueueRow,
    ReleaseSummary,
    StuckTask,
    TableEstimate,
    WorkerRow,
    seconds_text,
)

#: Error groups listed at most, commonest first.
MAX_ERROR_GROUPS = 20
#: Stuck tasks listed at most (all of them are counted).
MAX_STUCK = 50
#: Workers listed at most.
MAX_WORKERS = 200
#: Task names the table of counts per name and status shows at most.
MAX_NAMES = 100
#: Longest window the dashboard accepts, in hours (the default retention is 7 days).
MAX_HOURS = 24 * 31
#: Hours the chart covers, the current one included.
CHART_HOURS = 24
#: Workflows listed at most, the most recent first.
MAX_WORKFLOWS = 20
#: Tasks waiting for several parents (a group's callback) listed at most per workflow.
MAX_WORKFLOW_CALLBACKS = 10



# -- the pieces ------------------------------------------------------------------------------


# Per queue, tasks that ended since %s (the window start), by final state. An end that
# Python cannot hold ('infinity', after 9999: only raw SQL writes one) is left out: its hour
# could not be read.
QUEUE_FINISHED_SQL = f"""
    SELECT queue,
           count(*) FILTER (WHERE status = 'SUCCESSFUL'),
           count(*) FILTER (WHERE status = 'FAILED'),
           count(*) FILTER (WHERE status = 'CANCELLED')
    FROM pgtasks_task
    WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') AND finished_at >= %s
      AND finished_at < {PYTHON_END_SQL}
    GROUP BY queue
"""

# Per queue, name and state, the waiting tasks (claim index; due or not, and the oldest due
# one's age) and the running ones (running index; the longest one's age): queue sizes and
# counts per name from one pass over the live tasks. An infinite time (written by raw SQL)
# has no age: PostgreSQL 15 refuses to subtract it.
LIVE_SQL = """
    SELECT queue, name, status, run_after <= now(), count(*),
           CASE WHEN isfinite(min(run_after))
                THEN extract(epoch FROM now() - min(run_after))::float8 END
    FROM pgtasks_task WHERE status IN ('READY', 'AWAITING_RETRY') GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT queue, name, status, true, count(*),
           CASE WHEN isfinite(min(locked_at))
                THEN extract(epoch FROM now() - min(locked_at))::float8 END
    FROM pgtasks_task WHERE status = 'RUNNING' GROUP BY 1, 2, 3
    UNION ALL
    SELECT queue, name, status, false, count(*), NULL::float8
    FROM pgtasks_task WHERE status = 'WAITING' GROUP BY 1, 2, 3
"""

# The tasks that ended since %(since)s, in one pass over that range of the finished index:
# per hour (UTC), name, queue, state and whether in the last hour (since %(last_hour)s); and
# the failed ones per hour and error group (see error_group_expression). GROUPING() tells
# the two apart.
FINISHED_WINDOW_SQL = f"""
    SELECT hour, name, queue, status, last_hour, error_group, count(*), max(finished_at),
           GROUPING(error_group)
    FROM (
        SELECT date_trunc('hour', finished_at, 'UTC') AS hour, name, queue, status,
               finished_at >= %(last_hour)s AS last_hour,
               CASE WHEN status = 'FAILED' THEN {ERROR_GROUP_SQL} END AS error_group,
               finished_at
        FROM pgtasks_task
        WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') AND finished_at >= %(since)s
          AND finished_at < {PYTHON_END_SQL}
    ) AS ended
    GROUP BY GROUPING SETS ((hour, name, queue, status, last_hour), (hour, error_group))
"""

# For each time in %(marks)s, the first id of the tasks created at or after it, found by a
# binary search over the primary key (about 20 index probes per time on a million rows):
# ids are handed out in the order tasks are enqueued, so the tasks enqueued between two
# times are the ids between their boundaries. Reads a few hundred index entries, however
# many tasks the hours hold. Ids of rolled-back inserts count too, hence an estimate.
#
# The task table is partitioned (live tasks, and history by finished_at): a lookup by id
# probes every partition. Only tasks created since the first time can be an answer, and
# those are live or ended since then, so the search reads the live partition and the history
# periods from %(since)s on (a finished task ended after it was created); the tasks it leaves
# out were created before every time, so they neither answer nor lie between two answers.
# Each lookup is two, each an ordered index scan pruned on its own partition key, and the
# nearer answer wins: one condition joining the two with OR could prune neither level of
# the table, and a UNION of the two as one relation would be sorted whole.


def _nearest(where: str, order: str = "id") -> str:
    """The first task by ``order`` among the live ones and those ended since the first
    time, with ``where``."""
    return f"""(
        SELECT id, created_at FROM (
            (SELECT id, created_at FROM pgtasks_task_live WHERE {where}
             ORDER BY {order} LIMIT 1)
            UNION ALL
            (SELECT id, created_at FROM pgtasks_task
             WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') AND finished_at >= %(since)s
               AND {where}
             ORDER BY {order} LIMIT 1)
        ) AS two ORDER BY {order} LIMIT 1)"""


ENQUEUED_BOUNDARIES_SQL = f"""
    WITH RECURSIVE
    bounds AS (SELECT (SELECT id FROM {_nearest("true")} AS f) AS lo,
                      (SELECT id FROM {_nearest("true", "id DESC")} AS l) + 1 AS hi),
    search AS (
        SELECT m.t, b.lo, b.hi
        FROM unnest(%(marks)s::timestamptz[]) AS m(t), bounds b
        WHERE b.lo IS NOT NULL
        UNION ALL
        SELECT s.t,
               CASE WHEN r.created_at >= s.t THEN s.lo ELSE r.id + 1 END,
               CASE WHEN r.created_at >= s.t THEN (s.lo + s.hi) / 2 ELSE s.hi END
        FROM search s
        CROSS JOIN LATERAL {_nearest("id >= (s.lo + s.hi) / 2")} AS r
        WHERE s.lo < s.hi
    )
    SELECT t, lo, (SELECT hi FROM bounds) FROM search WHERE lo >= hi
"""

SNAPSHOT_SETTINGS_SQL = "SET LOCAL work_mem = '32MB'; SET LOCAL jit = off"

WORKERS_SQL = f"""
    SELECT w.name, w.hostname, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen_at,
           extract(epoch FROM now() - w.last_seen_at)::float8,
           ({LOST_WORKER_SQL}) AS lost,
           (SELECT count(*) FROM pgtasks_task t
            WHERE t.status = 'RUNNING' AND t.locked_by = w.name)
    FROM pgtasks_worker w
    ORDER BY w.name
    LIMIT {MAX_WORKERS}
"""

# Per partition of the task table (the live one and every history period): its rows and
# its statuses' frequencies, as autovacuum's ANALYZE of each keeps them (the partitioned
# table's own statistics are never kept up by autovacuum). -1 rows: never analyzed.
ESTIMATE_SQL = """
    SELECT c.reltuples::float8, s.most_common_vals::text::text[], s.most_common_freqs
    FROM pg_partition_tree('pgtasks_task') p
    JOIN pg_class c ON c.oid = p.relid
    LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname
                        AND s.attname = 'status'
    WHERE p.isleaf
"""

#: Below this many rows by the statistics (or with none), the whole table is counted
#: exactly instead: a small table may not have been analyzed yet (a partitioned table's
#: estimate is 0, or -1, until then), and counting it costs little.
EXACT_COUNT_LIMIT = 10_000

# The statuses of at most EXACT_COUNT_LIMIT + 1 rows: a count whose cost is bounded however
# large the table (and whatever its statistics say), exact when it comes to the limit or less.
BOUNDED_COUNT_SQL = """
    SELECT status, count(*) FROM (SELECT status FROM pgtasks_task LIMIT %s) AS head
    GROUP BY status
"""


# The most recent workflows, newest first: the workflow of the newest member row (the member
# table's primary key is the task id, handed out in enqueue order), then, stepping down the
# same index from there, the next member row of a workflow not found yet, %(limit)s times.
# Each step reads on from where the one before stopped, so the statement reads the member
# rows above the last workflow's newest one, every one of which belongs to a workflow it
# lists: what it reports on, never the whole table.
RECENT_WORKFLOWS_SQL = """
    WITH RECURSIVE found (n, task_id, workflow_id, seen) AS (
        (SELECT 1, task_id, workflow_id, ARRAY[workflow_id]
         FROM pgtasks_workflow_member ORDER BY task_id DESC LIMIT 1)
        UNION ALL
        SELECT f.n + 1, m.task_id, m.workflow_id, f.seen || m.workflow_id
        FROM found f
        CROSS JOIN LATERAL (
            SELECT w.task_id, w.workflow_id FROM pgtasks_workflow_member w
            WHERE w.task_id < f.task_id AND w.workflow_id <> ALL (f.seen)
            ORDER BY w.task_id DESC LIMIT 1
        ) m
        WHERE f.n < %(limit)s
    )
    SELECT workflow_id FROM found ORDER BY n
"""

# The members of the workflows %(workflows)s per state (the workflow index, then one primary
# key probe per member).
WORKFLOW_COUNTS_SQL = """
    SELECT m.workflow_id, t.status, count(*)
    FROM pgtasks_workflow_member m JOIN pgtasks_task t ON t.id = m.task_id
    WHERE m.workflow_id = ANY (%(workflows)s::uuid[])
    GROUP BY 1, 2
"""

# The members of the workflows %(workflows)s that wait (or waited) for more than one parent,
# a group's callback, with how many of their parents ended: the first %(limit)s of each
# workflow in id order, and how many there are. Edges are counted through the dependency
# table's unique index, which leads with the child.
WORKFLOW_CALLBACKS_SQL = """
    SELECT c.workflow_id, c.task_id, t.name, t.status, c.parents, c.ended, c.callbacks
    FROM (
        SELECT m.workflow_id, m.task_id, e.parents, e.ended,
               row_number() OVER (PARTITION BY m.workflow_id ORDER BY m.task_id) AS rank,
               count(*) OVER (PARTITION BY m.workflow_id) AS callbacks
        FROM pgtasks_workflow_member m
        CROSS JOIN LATERAL (
            SELECT count(*) AS parents, count(*) FILTER (WHERE d.resolved) AS ended
            FROM pgtasks_dependency d WHERE d.child_id = m.task_id
        ) e
        WHERE m.workflow_id = ANY (%(workflows)s::uuid[]) AND e.parents > 1
    ) c
    JOIN pgtasks_task t ON t.id = c.task_id
    WHERE c.rank <= %(limit)s
    ORDER BY c.workflow_id, c.task_id
"""


@dataclass(frozen=True)
class WorkflowCallback:
    """A task of a workflow that waits (or waited) for more than one parent."""

    id: int
    name: str
    status: str
    #: Its parents, and how many of them ended.
    parents: int
    ended: int


@dataclass(frozen=True)
class WorkflowRow:
    """One workflow: its members per state and its callbacks."""

    id: uuid.UUID
    #: Status value -> members in it.
    counts: dict[str, int]
    #: The first :data:`MAX_WORKFLOW_CALLBACKS` callbacks, in id order.
    callbacks: list[WorkflowCallback] = field(default_factory=list)
    #: How many callbacks the workflow has (listed or not).
    callback_count: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _cursor(using: str) -> Any:
    return connections[using].cursor()


def db_now(using: str) -> datetime:
    with _cursor(using) as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def queue_rows(using: str, now: datetime) -> list[QueueRow]:
    """Per queue of ``using``: waiting, scheduled and running tasks with their ages, and
    what the queue finished in the hour before ``now``."""
    with _cursor(using) as cursor:
        cursor.execute(QUEUE_FINISHED_SQL, [now - timedelta(hours=1)])
        finished = {row[0]: list(row[1:]) for row in cursor.fetchall()}
    return _queue_rows(using, _read_live(using), finished)


@dataclass
class _Live:
    """The live tasks of one database, from one pass (:data:`LIVE_SQL`)."""

    #: queue -> [waiting, scheduled, running, oldest waiting age, longest running age,
    #: waiting for parents]
    queues: dict[str, list[Any]]
    #: name -> status -> count
    names: dict[str, dict[str, int]]


def _read_live(using: str) -> _Live:
    queues: dict[str, list[Any]] = defaultdict(lambda: [0, 0, 0, None, None, 0])
    names: dict[str, dict[str, int]] = defaultdict(dict)
    with _cursor(using) as cursor:
        cursor.execute(LIVE_SQL)
        for queue, name, status, due, n, age in cursor.fetchall():
            row = queues[queue]
            names[name][status] = names[name].get(status, 0) + n
            if status == "RUNNING":
                row[2] += n
                row[4] = age if row[4] is None else max(row[4], age or 0)
            elif status == "WAITING":
                row[5] += n
            elif due:
                row[0] += n
                row[3] = age if row[3] is None else max(row[3], age or 0)
            else:
                row[1] += n
    return _Live(queues, names)


@dataclass
class _Finished:
    """The tasks of one database that ended in a window (:data:`FINISHED_WINDOW_SQL`)."""

    #: (hour, name, status, count)
    by_hour: list[tuple[datetime, str, str, int]]
    #: queue -> [succeeded, failed, cancelled] in the last hour
    last_hour: dict[str, list[int]]
    #: (hour, error group, count, last failed at)
    errors: list[tuple[datetime, str, int, datetime]]


def _read_finished(using: str, since: datetime, last_hour: datetime) -> _Finished:
    by_hour: dict[tuple[datetime, str, str], int] = defaultdict(int)
    queues: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    errors = []
    column = {"SUCCESSFUL": 0, "FAILED": 1, "CANCELLED": 2}
    params = {"since": since, "last_hour": last_hour, "hex": HEX_WORD_PATTERN,
              "digits": DIGITS_PATTERN}
    with _cursor(using) as cursor:
        cursor.execute(FINISHED_WINDOW_SQL, params)
        for hour, name, queue, status, recent, group, n, last, grouping in cursor.fetchall():
            hour = _as_utc_hour(hour)
            if grouping == 0:  # grouped by error group (the second grouping set)
                if group is not None:
                    errors.append((hour, group, n, last))
                continue
            by_hour[hour, name, status] += n
            if recent:
                queues[queue][column[status]] += n
    return _Finished([(*key, n) for key, n in by_hour.items()], queues, errors)


def _queue_rows(using: str, live: _Live, last_hour: dict[str, list[int]]) -> list[QueueRow]:
    """The queues of ``using`` (configured ones first, then any other that has tasks)."""
    configured = queues_on(using)
    others = sorted((set(live.queues) | set(last_hour)) - set(configured))
    rows = []
    for queue in configured + others:
        waiting, scheduled, running, oldest, longest, blocked = live.queues.get(
            queue, [0, 0, 0, None, None, 0])
        rows.append(QueueRow(queue, waiting, scheduled, running, oldest, longest,
                             *last_hour.get(queue, (0, 0, 0)), waiting_for_parents=blocked))
    return rows


def _error_groups(finished: _Finished, since: datetime) -> list[ErrorGroup]:
    counts: dict[str, int] = defaultdict(int)
    last: dict[str, datetime] = {}
    for hour, group, n, at in finished.errors:
        if hour >= since:
            counts[group] += n
            last[group] = max(last.get(group, at), at)
    ordered = sorted(counts, key=lambda g: (-counts[g], g))[:MAX_ERROR_GROUPS]
    return [ErrorGroup(g, counts[g], last[g]) for g in ordered]


def failed_in_group(using: str, group: str, since: datetime | None = None) -> Any:
    """Failed tasks whose normalized first error line is ``group``: those that ended since
    ``since`` (a range of the finished index), or of any time."""
    tasks = Task.objects.using(using).failed()
    if since is not None:
        tasks = tasks.filter(finished_at__gte=since)
    return tasks.alias(error_group=error_group_expression()).filter(error_group=group)


def stuck_tasks(using: str) -> tuple[list[StuckTask], int]:
    """Running tasks whose worker is lost or whose lease expired (what rescue takes back)."""
    stuck = Task.objects.using(using).stuck()
    rows = list(stuck.order_by("locked_at", "id").values_list(
        "id", "name", "queue", "locked_by", "attempt", "max_attempts", "locked_at")[:MAX_STUCK])
    count = len(rows) if len(rows) < MAX_STUCK else stuck.count()
    now = db_now(using) if rows else None
    return [StuckTask(pk, name, queue, worker, attempt, max_attempts,
                      # Not a datetime: a time out of Python's range, read by the admin
                      # as such (django_pgtasks.database.timestamps); it has no age.
                      (now - locked_at).total_seconds()
                      if isinstance(locked_at, datetime) and now else None)
            for pk, name, queue, worker, attempt, max_attempts, locked_at in rows], count


# The pending releases in one pass over their (small) table: its rows live from a parent's
# end to its release, milliseconds unless a release fails.
RELEASES_SQL = """
    SELECT count(*), extract(epoch FROM now() - min(created_at)),
           count(*) FILTER (WHERE failures > 0)
    FROM pgtasks_pending_release
"""
FAILING_RELEASES_SQL = """
    SELECT parent_id, parent_status, failures,
           greatest(extract(epoch FROM due_at - now()), 0), last_error
    FROM pgtasks_pending_release WHERE failures > 0
    ORDER BY due_at, parent_id LIMIT %s
"""


def releases(using: str) -> ReleaseSummary:
    """The releases of workflow children still to do, and those that failed."""
    with _cursor(using) as cursor:
        cursor.execute(RELEASES_SQL)
        pending, oldest, failing_count = cursor.fetchone()
        failing: list[FailingRelease] = []
        if failing_count:
            cursor.execute(FAILING_RELEASES_SQL, [MAX_STUCK])
            failing = [FailingRelease(pk, status, failures, float(due), error)
                       for pk, status, failures, due, error in cursor.fetchall()]
    return ReleaseSummary(pending, None if oldest is None else float(oldest), failing_count,
                          failing)


def workers(using: str) -> list[WorkerRow]:
    """Registered worker processes, with their liveness by the rescue's rules."""
    with _cursor(using) as cursor:
        cursor.execute(WORKERS_SQL, lost_worker_params())
        rows = cursor.fetchall()
    # jsonb arrives as text on a plain cursor.
    return [WorkerRow(name, host, pid, json.loads(queues) if isinstance(queues, str) else queues,
                      *rest)
            for name, host, pid, queues, *rest in rows]


def recent_workflows(using: str, limit: int = MAX_WORKFLOWS) -> list[WorkflowRow]:
    """The ``limit`` most recent workflows of ``using`` (by their newest member), newest
    first, each with its members per state and its callbacks: three statements, however
    many workflows (see :data:`RECENT_WORKFLOWS_SQL`)."""
    if limit < 1:
        return []
    with _cursor(using) as cursor:
        cursor.execute(RECENT_WORKFLOWS_SQL, {"limit": limit})
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        counts: dict[uuid.UUID, dict[str, int]] = {pk: {} for pk in ids}
        cursor.execute(WORKFLOW_COUNTS_SQL, {"workflows": ids})
        for workflow_id, status, n in cursor.fetchall():
            counts[workflow_id][status] = n
        callbacks: dict[uuid.UUID, list[WorkflowCallback]] = defaultdict(list)
        callback_counts: dict[uuid.UUID, int] = {}
        cursor.execute(WORKFLOW_CALLBACKS_SQL,
                       {"workflows": ids, "limit": MAX_WORKFLOW_CALLBACKS})
        for workflow_id, pk, name, status, parents, ended, total in cursor.fetchall():
            callbacks[workflow_id].append(WorkflowCallback(pk, name, status, parents, ended))
            callback_counts[workflow_id] = total
    return [WorkflowRow(pk, counts[pk], callbacks.get(pk, []), callback_counts.get(pk, 0))
            for pk in ids]


def enqueued_boundaries(using: str, marks: list[datetime]) -> dict[datetime, int]:
    """For each time, the first task id enqueued at or after it (see the SQL above); the
    newest id plus one for times after the newest task."""
    with _cursor(using) as cursor:
        cursor.execute(ENQUEUED_BOUNDARIES_SQL, {"marks": marks, "since": min(marks, default=None)})
        return {t: boundary for t, boundary, _ in cursor.fetchall()}


def hourly_chart(
    using: str, now: datetime, hours: int, live_now: int,
    finished: list[tuple[datetime, str, str, int]],
) -> list[HourPoint]:
    """One point per hour, oldest first, the current (partial) hour last; ``finished`` is
    (hour, name, status, count) of the tasks that ended.

    Tasks enqueued per hour are told by the ids handed out in it (an estimate: ids of
    rolled-back inserts count too). The backlog is not stored anywhere: it is derived
    backwards from the tasks waiting or running now, adding back each later hour's ended
    tasks and taking away its enqueued ones. Tasks deleted while waiting and finished tasks
    requeued since are not in that account, which is why it is an estimate too.
    """
    current = now.replace(minute=0, second=0, microsecond=0)
    start = current - timedelta(hours=hours - 1)
    ended: dict[datetime, list[int]] = defaultdict(lambda: [0, 0, 0])
    column = {"SUCCESSFUL": 0, "FAILED": 1, "CANCELLED": 2}
    for hour, _name, status, n in finished:
        if hour >= start:
            ended[hour][column[status]] += n
    hours_list = [start + timedelta(hours=i) for i in range(hours)]
    boundaries = enqueued_boundaries(using, hours_list)
    points: list[HourPoint] = []
    backlog = live_now
    for i in reversed(range(hours)):
        hour = hours_list[i]
        if hour not in boundaries:  # an empty table
            new = 0
        elif i + 1 < hours:
            new = boundaries[hours_list[i + 1]] - boundaries[hour]
        else:
            new = _next_id(using) - boundaries[hour]
        ok, failed, cancelled = ended.get(hour, (0, 0, 0))
        points.append(HourPoint(hour, new, ok, failed, cancelled, max(backlog, 0)))
        backlog = backlog - new + ok + failed + cancelled  # the end of the hour before
    points.reverse()
    return points


def _next_id(using: str) -> int:
    with _cursor(using) as cursor:
        cursor.execute("SELECT COALESCE(max(id), 0) + 1 FROM pgtasks_task")
        return cursor.fetchone()[0]


def _as_utc_hour(value: datetime) -> datetime:
    # date_trunc(..., 'UTC') returns a timestamp without time zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def table_estimate(using: str) -> TableEstimate:
    """Rows of the task table and per status, from the planner's statistics; counted
    exactly when the statistics know no rows or fewer than :data:`EXACT_COUNT_LIMIT`
    (``exact`` then says so)."""
    with _cursor(using) as cursor:
        cursor.execute(ESTIMATE_SQL)
        partitions = [row for row in cursor.fetchall() if row[0] is not None and row[0] >= 0]
        estimate = _estimate(partitions)
        if estimate.rows is None or estimate.rows < EXACT_COUNT_LIMIT:
            cursor.execute(BOUNDED_COUNT_SQL, [EXACT_COUNT_LIMIT + 1])
            counts = dict(cursor.fetchall())
            if sum(counts.values()) <= EXACT_COUNT_LIMIT:
                return TableEstimate(sum(counts.values()), counts, exact=True)
    return estimate


def _estimate(partitions: list[tuple[float, list[str] | None, list[float] | None]]
              ) -> TableEstimate:
    if not partitions:
        return TableEstimate(None, {})
    by_status: dict[str, float] = {}
    for rows, values, freqs in partitions:
        for value, freq in zip(values or (), freqs or (), strict=False):
            by_status[value] = by_status.get(value, 0.0) + rows * freq
    return TableEstimate(round(sum(row[0] for row in partitions)),
                         {status: round(n) for status, n in by_status.items()})


def window_start(now: datetime, hours: int) -> datetime:
    """The start of a window of ``hours`` hours: the current hour and ``hours - 1`` before
    it, on whole hours (UTC), as in :func:`django_pgtasks.monitoring.stats.throughput`."""
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(
        hours=hours - 1)


def database_snapshot(using: str | None = None, hours: int = 24) -> DatabaseSnapshot:
    """Everything the dashboard shows for one database alias, over the last ``hours``
    (the current hour and ``hours - 1`` whole hours before it).

    The heavy reading is two passes: one over the live tasks (:data:`LIVE_SQL`) and one over
    the window of finished ones (:data:`FINISHED_WINDOW_SQL`); the rest reads a few rows.
    """
    if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_HOURS:
        raise ValueError(f"hours must be an integer from 1 to {MAX_HOURS}, not {hours!r}.")
    using = using or pgtasks_settings.DATABASE
    # One transaction: every statement sees the same now(). Its settings are local to it:
    # enough memory to aggregate the window in a hash table rather than sort it on disk,
    # and no JIT compilation, which costs more than it saves on statements this short.
    with transaction.atomic(using=using), _cursor(using) as cursor:
        cursor.execute(SNAPSHOT_SETTINGS_SQL)
        return _snapshot(using, hours)


def _snapshot(using: str, hours: int) -> DatabaseSnapshot:
    now = db_now(using)
    since = window_start(now, hours)
    chart_start = window_start(now, CHART_HOURS)
    live = _read_live(using)
    finished = _read_finished(using, min(since, chart_start), now - timedelta(hours=1))
    queues = _queue_rows(using, live, finished.last_hour)
    by_name = live.names
    for hour, name, status, n in finished.by_hour:
        if hour >= since:
            by_name[name][status] = by_name[name].get(status, 0) + n
    names = sorted(by_name)
    stuck, stuck_count = stuck_tasks(using)
    live_now = sum(q.waiting + q.scheduled + q.running for q in queues)
    return DatabaseSnapshot(
        database=using, hours=hours, now=now, since=since, queues=queues,
        names=[NameCounts(name, by_name[name]) for name in names[:MAX_NAMES]],
        names_truncated=len(names) > MAX_NAMES, error_groups=_error_groups(finished, since),
        stuck=stuck, stuck_count=stuck_count, workers=workers(using),
        chart=hourly_chart(using, now, CHART_HOURS, live_now, finished.by_hour),
        estimate=table_estimate(using), releases=releases(using),
    )


def jsonable(snapshot: DatabaseSnapshot) -> dict[str, Any]:
    """A snapshot as plain data (datetimes left to the caller's JSON encoder)."""
    from dataclasses import asdict

    data = asdict(snapshot)
    for row, source in zip(data["queues"], snapshot.queues, strict=True):
        row["finished_last_hour"] = source.finished_last_hour
    for row, source in zip(data["names"], snapshot.names, strict=True):
        row["total"] = source.total
    return data


__all__ = [
    "ERROR_GROUP_LENGTH", "DatabaseSnapshot", "ErrorGroup", "HourPoint", "NameCounts",
    "QueueRow", "ReleaseSummary", "StuckTask", "TableEstimate", "WorkerRow", "WorkflowCallback",
    "WorkflowRow",
    "database_snapshot", "error_group_expression",
    "failed_in_group", "hourly_chart", "jsonable", "queue_rows", "recent_workflows", "releases",
    "seconds_text", "stuck_tasks", "table_estimate", "window_start", "workers",
]
