"""Retention: delete finished tasks (or move them to the archive) once they are old enough.

A queue table should stay small: every finished row costs space, vacuum work and index
entries. Finished tasks are purged after ``PGTASKS["RETENTION"]`` (``SUCCESSFUL`` and
``CANCELLED``) or ``PGTASKS["FAILED_RETENTION"]`` (``FAILED``, kept longer so operators can
inspect them). With ``PGTASKS["ARCHIVE"]`` they are moved to ``pgtasks_task_archive``
instead, where ``PGTASKS["ARCHIVE_RETENTION"]`` applies in turn.

How it stays harmless on a busy table:

- the work is done in **batches** of ``PURGE_BATCH`` rows, each its own short transaction:
  no transaction holds row locks or pins the xmin horizon for longer than one batch;
- a batch takes the **oldest** rows first, reading the partial index
  ``pgtasks_task_finished_idx`` from its start, and skips rows another transaction has
  locked (``SKIP LOCKED``) instead of waiting for them;
- ages are measured on the **database clock** (``now()``), like every other time decision;
- every batch first takes a transaction-level advisory lock, so across all workers and
  commands **at most one purge batch runs at any moment**; a worker that finds it taken
  skips its turn (``pg_try_advisory_xact_lock``), ``manage.py pgtasks_purge`` waits for it.

Every worker runs a bounded purge turn every ``PGTASKS["PURGE_INTERVAL"]`` seconds (a
maintenance job, see :mod:`django_pgtasks.definition.maintenance_jobs`); :func:`purge` is the
public entry point and ``manage.py pgtasks_purge`` its command.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE
from django_pgtasks.definition import maintenance_jobs as maintenance
from django_pgtasks.lifecycle import events
from django_pgtasks.lifecycle.leases import LOCK_NAMESPACE
from django_pgtasks.models import Status
from django_pgtasks.models.task import archive_columns
from django_pgtasks.patterns import partitions

logger = logging.getLogger("django_pgtasks.retention")

#: Second key of the advisory lock that serializes purge batches. Negative, so it can never
#: equal a worker's liveness lock key (1 … 2**31 - 2); the value spells "purg".
PURGE_LOCK_KEY = -0x70757267
#: Bounds of one purge turn inside a worker, so the worker's other maintenance jobs (which run
#: on the same maintainer thread, never on the claim path) are not held up for long: at most
#: this many batches, and no new batch once this many seconds have passed.
TURN_MAX_BATCHES = 50
TURN_SECONDS = 1.0

#: What a batch did, reported to ``on_batch`` callbacks and summed in :class:`PurgeResult`.
DELETED, ARCHIVED, ARCHIVE_DELETED = "deleted", "archived", "archive_deleted"

Age = timedelta | float | int


def to_seconds(value: Age | None) -> float | None:
    """A retention setting or argument (seconds or ``timedelta``) in seconds; ``None`` stays."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"A retention age must be a non-negative number of seconds or a "
                         f"timedelta, not {value!r}.")
    return float(seconds)


# -- the statements -----------------------------------------------------------------------
#
# Each batch is one statement. The inner SELECT reads the oldest candidates in index order
# (``ORDER BY <time> LIMIT n``) and locks them with SKIP LOCKED, so a row that a claim, a
# requeue or another purge holds is left for a later batch rather than waited for; the outer
# DELETE removes exactly the rows it locked. Status lists are inlined as literals (they are
# constants, never user input) so the planner can prove the partial index's predicate even
# with server-side parameter binding. The batch reports how many rows of each status it took
# and the newest time among them.
#
# That time is the next batch's lower bound (``%(after)s``, NULL for the first batch): rows
# of that status older than it were all taken by the earlier batches, save rows locked at the
# time, which the next purge takes; so no batch walks again past rows it leaves. ``%(below)s``
# (the workers' turn) leaves the rows of the history's periods to the partition drops.
#
# The history is partitioned by finished_at: the same range and the statuses stand on the
# DELETE itself too, so that it reaches only the partitions that hold the rows (the ids the
# subquery finds say nothing of the partition; without them every id is looked up in every
# period of the table).
_RANGE = """status IN ({statuses}) AND finished_at < now() - make_interval(secs => %(age)s)
      AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND finished_at < coalesce(%(below)s::timestamptz, 'infinity')"""

_OLDEST_FINISHED = f"""
    SELECT id FROM pgtasks_task
    WHERE {_RANGE}
    ORDER BY finished_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
"""

# The candidates are a CTE, read once: as a subquery of the DELETE, the planner may run it
# again for every row of the range it scans (a semi join), and each run takes LIMIT rows more.
DELETE_SQL = """
    WITH oldest AS MATERIALIZED ({oldest}),
    gone AS (
        DELETE FROM pgtasks_task WHERE id IN (SELECT id FROM oldest) AND {prune}
        RETURNING status, finished_at
    )
    SELECT status, count(*), max(finished_at) FROM gone GROUP BY status
"""

# Moving to the archive is the same DELETE feeding an INSERT in the same statement, so a row
# is never in both tables nor in neither. A task restored from the archive by hand (same id)
# and archived again replaces its old archived copy instead of failing every later batch.
ARCHIVE_SQL = """
    WITH oldest AS MATERIALIZED ({oldest}),
    moved AS (
        DELETE FROM pgtasks_task WHERE id IN (SELECT id FROM oldest) AND {prune}
        RETURNING {columns}
    ), archived AS (
        INSERT INTO pgtasks_task_archive ({columns}, archived_at)
        SELECT {columns}, now() FROM moved
        ON CONFLICT (id) DO UPDATE SET {updates}, archived_at = EXCLUDED.archived_at
        RETURNING status, finished_at
    )
    SELECT status, count(*), max(finished_at) FROM archived GROUP BY status
"""

# The archive's own retention counts from archived_at (its index, pgtasks_archive_at_idx).
ARCHIVE_EXPIRE_SQL = """
    WITH gone AS (
        DELETE FROM pgtasks_task_archive WHERE id IN (
            SELECT id FROM pgtasks_task_archive
            WHERE archived_at < now() - make_interval(secs => %(age)s)
              AND archived_at >= coalesce(%(after)s::timestamptz, '-infinity')
            ORDER BY archived_at LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        )
        RETURNING status, archived_at
    )
    SELECT status, count(*), max(archived_at) FROM gone GROUP BY status
"""

COUNT_FINISHED_SQL = """
    SELECT status, count(*) FROM pgtasks_task
    WHERE status IN ({statuses}) AND finished_at < now() - make_interval(secs => %(age)s)
    GROUP BY status
"""

COUNT_ARCHIVE_SQL = """
    SELECT status, count(*) FROM pgtasks_task_archive
    WHERE archived_at < now() - make_interval(secs => %(age)s)
    GROUP BY status
"""


def _literals(statuses: tuple[str, ...]) -> str:
    return ", ".join(f"'{status}'" for status in statuses)


def _move_sql(statuses: tuple[str, ...], archive: bool) -> str:
    oldest = _OLDEST_FINISHED.format(statuses=_literals(statuses))
    # The statuses again on the DELETE itself, so that it reaches the history table of these
    # statuses alone (the ids found by the subquery say nothing of the partition).
    prune = _RANGE.format(statuses=_literals(statuses))
    if not archive:
        return DELETE_SQL.format(oldest=oldest, prune=prune)
    columns, updates = archive_columns()
    return ARCHIVE_SQL.format(oldest=oldest, prune=prune, columns=columns, updates=updates)


# -- the purge ----------------------------------------------------------------------------


@dataclass
class PurgeResult:
    """What one :func:`purge` call did (or, with ``dry_run``, would do), by task status."""

    #: Rows deleted from the task table.
    deleted: dict[str, int] = field(default_factory=dict)
    #: Rows moved from the task table to the archive.
    archived: dict[str, int] = field(default_factory=dict)
    #: Rows deleted from the archive (``ARCHIVE_RETENTION``).
    archive_deleted: dict[str, int] = field(default_factory=dict)
    #: Batches run, each its own transaction (0 for a dry run).
    batches: int = 0
    dry_run: bool = False
    #: Another purge held the lock when this one started (``wait=False`` only); nothing done.
    skipped: bool = False
    #: ``False`` when a bound (``max_batches``, ``time_limit``) or a busy lock ended the purge
    #: early: more rows may be old enough, for the next turn.
    complete: bool = True

    @property
    def total(self) -> int:
        """Rows taken out of the task table (deleted or archived)."""
        return sum(self.deleted.values()) + sum(self.archived.values())

    def _add(self, kind: str, counts: dict[str, int]) -> None:
        target: dict[str, int] = getattr(self, kind)
        for status, count in counts.items():
            target[status] = target.get(status, 0) + count


@dataclass(frozen=True)
class _Step:
    """One kind of batch: its statement, parameters (age in seconds) and what it reports."""

    kind: str
    sql: str
    seconds: float
    #: The history tables its rows are in (None: the archive).
    tables: tuple[str, ...] | None = None
    #: Rows from this time on are left to the partition drops (the workers' turn).
    below: datetime | None = None


def _ages(older_than: Age | None, failed_older_than: Age | None) -> dict[str, float | None]:
    """The retention of each history table, in seconds (None: kept forever)."""
    s = pgtasks_settings
    finished = to_seconds(older_than if older_than is not None else s.RETENTION)
    failed = to_seconds(
        failed_older_than if failed_older_than is not None
        else older_than if older_than is not None else s.FAILED_RETENTION
    )
    return {DONE_TABLE: finished, FAILED_TABLE: failed}


def _steps(
    older_than: Age | None, failed_older_than: Age | None, archive_older_than: Age | None,
    archive: bool, dry_run: bool,
) -> list[_Step]:
    s = pgtasks_settings
    ages = _ages(older_than, failed_older_than)
    finished, failed = ages[DONE_TABLE], ages[FAILED_TABLE]
    expire = to_seconds(archive_older_than if archive_older_than is not None
                        else s.ARCHIVE_RETENTION)
    # Statuses sharing an age are taken in one index range; None means "keep forever".
    by_age: dict[float, tuple[str, ...]] = {}
    tables: dict[float, tuple[str, ...]] = {}
    for statuses, seconds, table in (
            ((Status.SUCCESSFUL, Status.CANCELLED), finished, DONE_TABLE),
            ((Status.FAILED,), failed, FAILED_TABLE)):
        if seconds is not None:
            by_age[seconds] = by_age.get(seconds, ()) + tuple(str(x) for x in statuses)
            tables[seconds] = (*tables.get(seconds, ()), table)
    kind = ARCHIVED if archive else DELETED
    steps = [
        _Step(kind, COUNT_FINISHED_SQL.format(statuses=_literals(statuses)) if dry_run
              else _move_sql(statuses, archive), seconds, tables[seconds])
        for seconds, statuses in by_age.items()
    ]
    if expire is not None:
        steps.append(_Step(ARCHIVE_DELETED, COUNT_ARCHIVE_SQL if dry_run else ARCHIVE_EXPIRE_SQL,
                           expire))
    return steps


def _batch(
    alias: str, step: _Step, after: datetime | None, batch_size: int, wait: bool,
) -> tuple[dict[str, int], datetime | None] | None:
    """Run one batch in its own transaction: the rows taken per status and the newest time
    among them. ``None`` if the lock was busy and ``not wait``."""
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                           [LOCK_NAMESPACE, PURGE_LOCK_KEY])
        else:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)",
                           [LOCK_NAMESPACE, PURGE_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return None
        cursor.execute(step.sql, {"age": step.seconds, "after": after, "below": step.below,
                                  "limit": batch_size})
        rows = cursor.fetchall()
    return {status: count for status, count, _newest in rows}, max(
        (newest for _status, _count, newest in rows), default=after)


def purge(
    using: str | None = None,
    *,
    older_than: Age | None = None,
    failed_older_than: Age | None = None,
    archive: bool | None = None,
    archive_older_than: Age | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    time_limit: float | None = None,
    wait: bool = True,
    dry_run: bool = False,
    on_batch: Callable[[str, dict[str, int]], object] | None = None,
    exact: bool = True,
) -> PurgeResult:
    """Delete (or archive) finished tasks older than their retention; return the counts.

    Ages are seconds or ``timedelta``, measured back from the database's ``now()`` against
    ``finished_at``. ``older_than`` replaces ``RETENTION`` *and* ``FAILED_RETENTION`` (every
    finished task older than it goes); ``failed_older_than`` replaces the age for ``FAILED``
    tasks alone. ``archive`` (default ``PGTASKS["ARCHIVE"]``) moves the rows to
    ``pgtasks_task_archive`` instead of deleting them; archived rows older than
    ``archive_older_than`` (default ``ARCHIVE_RETENTION``; ``None`` there keeps them forever)
    are deleted from the archive.

    Work is done in batches of ``batch_size`` rows (default ``PURGE_BATCH``), each in its own
    transaction, oldest first, until nothing old enough is left or ``max_batches`` batches
    ran or ``time_limit`` seconds passed. ``on_batch(kind, counts)`` is called after each
    batch commits. Each batch waits for a batch of another purge to end (``wait=True``) or,
    with ``wait=False``, the purge stops as soon as another one holds the lock. A dry run
    only counts, in one statement per kind, and changes nothing.

    Finished tasks are kept in history partitions of ``PGTASKS["HISTORY_PERIOD"]``
    (:mod:`~django_pgtasks.patterns.partitions`): a period older than its retention goes
    first, whole (detached and dropped, or archived then dropped), and only then are the
    remaining old enough rows deleted one by one. With ``exact=False`` (the workers' turn) only
    whole periods go, and rows outside the periods (the ``_before`` partitions); so a task is
    kept at most one period past its retention, and the purge writes no dead rows.

    Must not be called inside ``transaction.atomic()``: the batches would become one long
    transaction, which is exactly what they exist to avoid.
    """
    alias = using or pgtasks_settings.DATABASE
    archive = pgtasks_settings.ARCHIVE if archive is None else archive
    batch_size = pgtasks_settings.PURGE_BATCH if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
    if not dry_run and connections[alias].in_atomic_block:
        raise TransactionManagementError(
            "purge() runs each batch in its own transaction; call it outside "
            "transaction.atomic()."
        )
    steps = _steps(older_than, failed_older_than, archive_older_than, archive, dry_run)
    result = PurgeResult(dry_run=dry_run)
    if dry_run:
        with connections[alias].cursor() as cursor:
            for step in steps:
                cursor.execute(step.sql, {"age": step.seconds})
                result._add(step.kind, dict(cursor.fetchall()))
        return result

    started = time.monotonic()
    deadline = None if time_limit is None else started + time_limit
    kind = ARCHIVED if archive else DELETED
    # Whole periods first (one worker at a time: another one making or dropping periods
    # right now leaves them to the next turn), then rows one batch at a time.
    with partitions.locked(alias, wait=wait) as acquired:
        for table, seconds in _ages(older_than, failed_older_than).items() if acquired else ():
            for dropped in partitions.drop_expired(alias, table, seconds, archive):
                result._add(kind, dropped.counts)
                if on_batch is not None:
                    on_batch(kind, dropped.counts)
    if not exact:
        starts = {table: min((p.start for p in partitions.partitions(alias, table)
                              if p.is_period), default=None)
                  for table in partitions.HISTORY_TABLES}
        steps = [dataclasses.replace(step, below=min(
                     (starts[t] for t in step.tables if starts[t] is not None),
                     default=None)) if step.tables else step
                 for step in steps]
    # Round robin over the kinds of batch, so a large backlog of one (say, successes) does not
    # starve the others within a bounded turn. A kind is done when a batch comes back short.
    pending = list(steps)
    after: dict[_Step, datetime | None] = dict.fromkeys(steps)
    while pending and result.complete:
        for step in list(pending):
            if ((max_batches is not None and result.batches >= max_batches)
                    or (deadline is not None and time.monotonic() >= deadline)):
                result.complete = False
                break
            done = _batch(alias, step, after[step], batch_size, wait)
            if done is None:
                result.skipped = result.batches == 0
                result.complete = False
                break
            counts, after[step] = done
            result.batches += 1
            result._add(step.kind, counts)
            if on_batch is not None:
                on_batch(step.kind, counts)
            if sum(counts.values()) < batch_size:
                pending.remove(step)

    if result.skipped:
        logger.debug("Purge skipped: another purge is running.")
    elif result.total or result.archive_deleted:
        logger.info(
            "Purge deleted=%d archived=%d archive_deleted=%d batches=%d complete=%s "
            "duration=%.3fs",
            sum(result.deleted.values()), sum(result.archived.values()),
            sum(result.archive_deleted.values()), result.batches, result.complete,
            time.monotonic() - started,
        )
    return result


def purge_turn(using: str) -> PurgeResult:
    """One bounded purge turn, as every worker runs it every ``PURGE_INTERVAL`` seconds:
    whole periods only (and rows before the first period)."""
    return purge(using, wait=False, max_batches=TURN_MAX_BATCHES, time_limit=TURN_SECONDS,
                 exact=False)


maintenance.register(maintenance.Job(
    name="purge",
    interval=lambda: pgtasks_settings.PURGE_INTERVAL,
    run=purge_turn,
))


def expire_events(using: str) -> int:
    """Delete the events sent longer than ``PGTASKS["EVENT_RETENTION"]`` ago (a bounded
    turn, as every worker runs it every ``PURGE_INTERVAL`` seconds); return how many."""
    age = to_seconds(pgtasks_settings.EVENT_RETENTION)
    if age is None:
        return 0
    deleted = 0
    for _ in range(TURN_MAX_BATCHES):
        batch = events.expire(using, age, pgtasks_settings.PURGE_BATCH)
        deleted += batch
        if batch < pgtasks_settings.PURGE_BATCH:
            break
    return deleted


maintenance.register(maintenance.Job(
    name="expire events",
    interval=lambda: pgtasks_settings.PURGE_INTERVAL,
    run=expire_events,
))
