"""Every change of a claimed task's state: what happens to a task when its run ends.

A claimed task is ``RUNNING`` under a *lease*: the worker's id (``locked_by``) and the number
of the claim (``claims``, raised by every claim, so it never repeats). Each statement here
ends a run and is *guarded* by that lease: it changes the row only if it is still ``RUNNING``
under the same lease, and returns the ids (and new states) it changed. A worker whose task
was rescued, cancelled or requeued meanwhile changes nothing, and a task can never be both
failed and succeeded. Every statement takes arrays, so one round trip records one run or a
batch.

How a run can end, kept apart:

- **succeeded** (:data:`SUCCEED_SQL`): the handler returned; its result is stored;
- **failed** (:data:`FAIL_SQL`): the handler raised; the attempt is spent, and the task waits
  for its retry (``statement_timestamp() + delay``) while attempts are left, else ends ``FAILED``;
- **cancelled** (:data:`CANCEL_SQL`), **snoozed** (:data:`SNOOZE_SQL`) and **suspended**
  (:data:`SUSPEND_SQL`): the handler stopped on request, or asked to run again later (or
  when an event is sent: a durable sleep or wait) without spending the attempt;
- **interrupted** (:data:`INTERRUPT_SQL`, and :data:`RESCUE_SQL` for the tasks of a lost
  worker): the run was cut off — its worker died, shut down or lost its connection. That is
  not the handler's failure: the attempt is given back and the task returns to its original
  place in the queue (its ``run_after`` is kept), counting one interruption; past
  ``PGTASKS["MAX_INTERRUPTIONS"]`` it ends ``FAILED`` (a task that kills its worker cannot
  loop forever);
- **given back unstarted** (:data:`UNCLAIM_SQL`, the outcome :class:`Unstarted`): claimed but
  never started (prefetched tasks of a stopping worker, a claim whose reply was lost, a run
  whose thread the database refused a connection before its handler started): as if never
  claimed.

The re-run rule (pattern "re-run when the source changes") is written once, in
:func:`_unless_rerun`: a task whose key was enqueued again while it ran goes back to
``READY``, due now, with its attempts counted afresh, whatever the run's outcome.

:class:`~django_pgtasks.lifecycle.recorder.Recorder` keeps the invariant that a claimed
task always ends in a recorded outcome or goes back to the queue, whatever the handler
returned or raised and whatever the database refuses (see its docstring).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.db import connections

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import RUNNING
from django_pgtasks.definition.error_text import qualified_name, reason_text, truncate_error
from django_pgtasks.exceptions import TooManyInterruptions, UnstorableResultError
from django_pgtasks.lifecycle.claim import forget_bounds
from django_pgtasks.lifecycle.leases import ABANDONED_SQL, abandoned_params
from django_pgtasks.lifecycle.row_loading import fast_cursor

logger = logging.getLogger("django_pgtasks.worker")


#: Failed attempts kept in ``Task.errors`` (the oldest are dropped first).
ERROR_HISTORY_LENGTH = 20
#: Longest retry delay written (100 years): a backoff policy that returns more is capped.
MAX_RETRY_DELAY = 100 * 366 * 24 * 3600.0


class Claimed(Protocol):
    """What the transitions need of a claimed task: its id and its lease."""

    #: The primary key, read as ``id`` on the paths every task takes (``Model.pk`` is a
    #: property that looks the primary key's field up on each read).
    id: int
    name: str
    locked_by: str | None
    #: The lease: the number of the claim this run holds.
    claims: int


def append_error_sql(error: str = "%s", table: str = "pgtasks_task") -> str:
    """SQL for ``errors`` plus one ``{"attempt", "error", "at"}`` entry for the attempt that
    just ended, keeping the last ERROR_HISTORY_LENGTH entries; ``at`` is the database clock.
    ``error`` is a placeholder or an SQL expression giving the (already bounded) text."""
    return (
        f"jsonb_path_query_array({table}.errors || jsonb_build_array(jsonb_build_object("
        f"'attempt', {table}.attempt, 'error', ({error})::text, 'at', statement_timestamp())), "
        f"'$[last - {ERROR_HISTORY_LENGTH - 1} to last]')"
    )


def _unless_rerun(status: str, attempt: str = "t.attempt", run_after: str = "t.run_after",
                  worker_ids: str = "t.worker_ids") -> str:
    """The SET clauses every end of a run shares, with the re-run rule: a task enqueued again
    under its key while it ran (``rerun_requested``) is due again now, attempts and steps
    afresh."""
    return f"""
        status = CASE WHEN t.rerun_requested THEN 'READY' ELSE {status} END,
        attempt = CASE WHEN t.rerun_requested THEN 0 ELSE {attempt} END,
        run_after = CASE WHEN t.rerun_requested THEN statement_timestamp() ELSE {run_after} END,
        worker_ids = CASE WHEN t.rerun_requested THEN '[]'::jsonb ELSE {worker_ids} END,
        steps = CASE WHEN t.rerun_requested THEN '[]'::jsonb ELSE t.steps END,
        rerun_requested = false, finished_at = statement_timestamp(), locked_at = NULL,
        updated_at = statement_timestamp()"""


#: The worker ids of a task's attempts without the last one: for an attempt given back.
_WITHOUT_LAST_WORKER = "t.worker_ids - (jsonb_array_length(t.worker_ids) - 1)"

# The outcome statements below take one array per column, sent in binary (%b): psycopg
# builds a text array literal in Python, escaping every element. They run on
# rows.fast_cursor(), which binds parameters on the server (the only binding that takes %b).

#: The lease guard: still RUNNING under the worker and claim that the arrays name.
_LEASED = ("t.id = v.id AND t.status = 'RUNNING' AND t.locked_by = v.worker "
           "AND t.claims = v.lease")
#: The same guard for a small batch: its rows found by primary key, one lookup per run.
#: ``status = 'RUNNING'`` lets the planner read the partial index of running tasks instead,
#: which suits a large batch, but that index keeps a dead entry for every run ended while an
#: older transaction is open anywhere in the database (a long report, a session idle in a
#: transaction): under such a snapshot, a statement of 4 runs read 3,800 pages of it after
#: 50,000 runs, against 59 by primary key. A large batch keeps the index: looking up a
#: thousand ids one by one, the planner would rather read the whole live partition. (Steering
#: it with ``t.id = ANY(ids)`` does not help: it then ran that whole lookup once per run, in a
#: nested loop, and the server's CPU per task went from 38 to 110 us.)
_LEASED_BY_ID = _LEASED.replace("t.status = 'RUNNING'", f"t.{RUNNING}")
#: The largest batch whose rows are found by primary key (:data:`_LEASED_BY_ID`). Large
#: enough for what the defaults record at a time (about 90 runs per statement when no-op
#: tasks drain): at 64, under a held snapshot, those statements read the running index's
#: dead entries: the defaults kept 69% of their rate at 100,000 tasks in the benchmark
#: (bench/results/2026-11-27-vm-5.json), and 87% at 256 (2026-11-27-vm-6.json). The
#: loop's session costs random page reads low enough (worker/loop.py) that the planner looks
#: 256 ids up one by one on a live partition of 20,000 tasks; on a smaller one it may read
#: the whole partition instead, which is then what costs least.
BY_ID_AT_MOST = 256

# Successes: the (JSON text) result of each run; NULL for None.
SUCCEED_SQL = f"""
    UPDATE pgtasks_task t SET {_unless_rerun("'SUCCESSFUL'")},
        result = v.result::jsonb, error_text = ''
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[])
         AS v(id, worker, lease, result)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# Failed attempts: the error text, and the retry delay in seconds (NULL: fatal, no retry).
# With a delay and attempts left the task awaits its retry, else it ends FAILED.
_CAN_RETRY = "v.delay IS NOT NULL AND t.attempt < t.max_attempts"
FAIL_SQL = f"""
    UPDATE pgtasks_task t SET {_unless_rerun(
        f"CASE WHEN {_CAN_RETRY} THEN 'AWAITING_RETRY' ELSE 'FAILED' END",
        run_after=f"CASE WHEN {_CAN_RETRY} "
                  f"THEN statement_timestamp() + make_interval(secs => v.delay) "
                  f"ELSE t.run_after END")},
        error_text = v.error, errors = {append_error_sql("v.error", "t")}
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[], %b::float8[])
         AS v(id, worker, lease, error, delay)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# Runs that stopped because their cancellation was requested (or the handler raised
# TaskCancelled): CANCELLED for good, unless re-run under its key.
CANCEL_SQL = f"""
    UPDATE pgtasks_task t SET {_unless_rerun("'CANCELLED'")},
        cancel_requested = false,
        error_text = v.error,
        errors = CASE WHEN v.error = '' THEN t.errors
                      ELSE {append_error_sql("v.error", "t")} END
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[])
         AS v(id, worker, lease, error)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# Snoozed runs: due again after the given seconds, the attempt given back, the snooze counted
# in metadata. A cancellation requested meanwhile wins.
SNOOZE_SQL = f"""
    UPDATE pgtasks_task t SET {_unless_rerun(
        "CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'READY' END",
        attempt="greatest(t.attempt - 1, 0)",
        run_after="statement_timestamp() + make_interval(secs => v.seconds)",
        worker_ids=_WITHOUT_LAST_WORKER)},
        metadata = CASE WHEN jsonb_typeof(t.metadata) = 'object'
                        THEN t.metadata || jsonb_build_object(
                            'snoozes', coalesce((t.metadata ->> 'snoozes')::int, 0) + 1)
                        ELSE t.metadata END,
        cancel_requested = t.cancel_requested AND NOT t.rerun_requested
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::float8[])
         AS v(id, worker, lease, seconds)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# Suspended runs (a durable sleep, or a wait for an event): due again at the time given,
# the attempt given back, like a snooze but not counted as one. A run that waits for an
# event flagged its task (``awaited_event``, lifecycle/events.py) before it stopped; a
# sender that found the flag cleared it, and then the task is due now. A run that only
# sleeps clears a flag left from an earlier wait. No time given: a year (the run waits
# again if it wakes with nothing to do). A cancellation requested meanwhile wins.
SUSPEND_SQL = f"""
    UPDATE pgtasks_task t SET {_unless_rerun(
        "CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'READY' END",
        attempt="greatest(t.attempt - 1, 0)",
        run_after="CASE WHEN v.event AND t.awaited_event IS NULL THEN statement_timestamp() "
                  "ELSE coalesce(v.until, statement_timestamp() + interval '1 year') END",
        worker_ids=_WITHOUT_LAST_WORKER)},
        awaited_event = CASE WHEN v.event THEN t.awaited_event END,
        cancel_requested = t.cancel_requested AND NOT t.rerun_requested
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::timestamptz[], %b::bool[])
         AS v(id, worker, lease, until, event)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# An interrupted run (the worker died, shut down, or lost its connection) is not the
# handler's failure: the attempt is given back and run_after kept, so the task runs again in
# its original place in the queue. Past the interruption budget (the first placeholder) it
# ends FAILED with TooManyInterruptions (the second: its text, without the count); a
# cancellation requested meanwhile ends it CANCELLED. Shared by INTERRUPT_SQL and RESCUE_SQL,
# whose rows are aliased ``t`` and whose reason is ``v.error``.
_OVER_BUDGET = "t.interruptions >= %s"
_INTERRUPTED = f"""{_unless_rerun(
        f"CASE WHEN t.cancel_requested THEN 'CANCELLED' WHEN {_OVER_BUDGET} THEN 'FAILED' "
        f"WHEN t.attempt > 1 THEN 'AWAITING_RETRY' ELSE 'READY' END",
        attempt=f"CASE WHEN {_OVER_BUDGET} OR t.cancel_requested THEN t.attempt "
                f"ELSE greatest(t.attempt - 1, 0) END",
        worker_ids=_WITHOUT_LAST_WORKER)},
        interruptions = CASE WHEN t.rerun_requested THEN 0 ELSE t.interruptions + 1 END,
        cancel_requested = t.cancel_requested AND NOT t.rerun_requested,
        error_text = CASE WHEN {_OVER_BUDGET} AND NOT t.rerun_requested
                               AND NOT t.cancel_requested
                          THEN left(%s || ' The last interruption (' || (t.interruptions + 1)
                                    || '): ' || split_part(v.error, E'\n', 1), %s)
                          ELSE v.error END,
        errors = {append_error_sql("v.error", "t")}"""


def _interrupted_params() -> list[Any]:
    budget = int(pgtasks_settings.MAX_INTERRUPTIONS)
    over = reason_text(TooManyInterruptions, f"The task was interrupted more than {budget} "
                       f"times (PGTASKS['MAX_INTERRUPTIONS']); it may be what stops its worker "
                       f"(out of memory, a crash in native code).")
    return [budget, budget, budget, over, int(pgtasks_settings.ERROR_TEXT_LIMIT)]


INTERRUPT_SQL = f"""
    UPDATE pgtasks_task t SET {_INTERRUPTED}
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[])
         AS v(id, worker, lease, error)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# Claims undone: tasks that never started go back as if they had not been claimed (the
# attempt and its worker id are taken back; nothing is counted, not even an interruption).
UNCLAIM_SQL = f"""
    UPDATE pgtasks_task t SET
        status = CASE WHEN t.attempt > 1 THEN 'AWAITING_RETRY' ELSE 'READY' END,
        attempt = t.attempt - 1, locked_at = NULL, started_at = NULL,
        updated_at = statement_timestamp(),
        worker_ids = {_WITHOUT_LAST_WORKER}, rerun_requested = false
    FROM unnest(%b::bigint[], %b::text[], %b::bigint[]) AS v(id, worker, lease)
    WHERE {_LEASED}
    RETURNING t.id, t.status
"""

# -- rescue: the runs of lost workers -------------------------------------------------------

# The rescue: the runs of lost workers are interrupted (the same rules as INTERRUPT_SQL).
RESCUE_SQL = f"""
    WITH v AS (
        SELECT id, 'django_pgtasks.exceptions.WorkerLost: worker ' || locked_by
               || ' stopped while running attempt ' || attempt || ' (process killed, '
               || 'connection lost or hung); the task was given back.' AS error
        FROM pgtasks_task WHERE status = 'RUNNING' AND ({ABANDONED_SQL})
        FOR UPDATE SKIP LOCKED
    )
    UPDATE pgtasks_task t SET {_INTERRUPTED}
    FROM v WHERE t.id = v.id
    RETURNING t.id, t.name, t.locked_by, t.status
"""


#: The rescue of one abandoned task (its id the last parameter): a batch the database refused
#: is rescued task by task, so that one row cannot keep the others running.
RESCUE_ONE_SQL = RESCUE_SQL.replace(
    "FOR UPDATE SKIP LOCKED", "AND id = %s FOR UPDATE SKIP LOCKED")


def rescue_params() -> list[Any]:
    """Parameters of :data:`RESCUE_SQL`."""
    return [*abandoned_params(), *_interrupted_params()]


def rescue_one_params(task_id: int) -> list[Any]:
    """Parameters of :data:`RESCUE_ONE_SQL`."""
    return [*abandoned_params(), task_id, *_interrupted_params()]


# -- outcomes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Succeeded:
    #: The handler's return value, already checked to be storable (plain JSON).
    result: Any = None


@dataclass(frozen=True)
class Failed:
    error: str
    #: Seconds until the retry; ``None``: fatal, never retried.
    retry_delay: float | None = None


@dataclass(frozen=True)
class Cancelled:
    error: str = ""


@dataclass(frozen=True)
class Snoozed:
    seconds: float


@dataclass(frozen=True)
class Suspended:
    """A durable sleep or wait ended the run: due again at ``until`` (``None``: a year),
    or at once if ``event`` and the event it waits for was sent meanwhile."""

    until: datetime | None
    event: bool = False


@dataclass(frozen=True)
class Interrupted:
    error: str


@dataclass(frozen=True)
class Unstarted:
    """The run never started (its handler was not called): the task goes back as if it had
    not been claimed (:data:`UNCLAIM_SQL`). ``reason`` is for logs and traces only: nothing
    of it is stored."""

    reason: str = ""


Outcome = Succeeded | Failed | Cancelled | Snoozed | Suspended | Interrupted | Unstarted


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False)


def _delay(seconds: float | None) -> float | None:
    if seconds is None:
        return None
    seconds = float(seconds)
    if seconds != seconds:  # NaN from a backoff policy: retry as late as allowed
        return MAX_RETRY_DELAY
    return min(max(seconds, 0.0), MAX_RETRY_DELAY)


#: Per kind of outcome: the statement and the extra columns for each run.
_STATEMENTS: dict[type, tuple[str, Callable[[Any], list[Any]]]] = {
    Succeeded: (SUCCEED_SQL, lambda o: [_json(o.result)]),
    Failed: (FAIL_SQL, lambda o: [truncate_error(o.error), _delay(o.retry_delay)]),
    Cancelled: (CANCEL_SQL, lambda o: [truncate_error(o.error)]),
    Snoozed: (SNOOZE_SQL, lambda o: [float(o.seconds)]),
    Suspended: (SUSPEND_SQL, lambda o: [o.until, o.event]),
    Interrupted: (INTERRUPT_SQL, lambda o: [truncate_error(o.error)]),
    Unstarted: (UNCLAIM_SQL, lambda o: []),
}
#: Per kind of outcome: its statement for a batch of at most :data:`BY_ID_AT_MOST` runs.
_BY_ID: dict[type, str] = {
    kind: sql.replace(f"WHERE {_LEASED}", f"WHERE {_LEASED_BY_ID}")
    for kind, (sql, _) in _STATEMENTS.items()
}


def statement_for(kind: type, runs: int) -> str:
    """The statement that records ``runs`` outcomes of ``kind`` (an :data:`Outcome` class)."""
    return _BY_ID[kind] if runs <= BY_ID_AT_MOST else _STATEMENTS[kind][0]


def write(using: str, runs: Sequence[tuple[Claimed, Outcome]]) -> dict[int, str]:
    """Record ``runs`` (all of one kind of outcome) in one statement; return the new status
    of each task recorded. A task missing from the result was no longer held (its lease was
    lost: rescued, cancelled or requeued meanwhile) and did not change.

    Raises what the database raises: use a :class:`~django_pgtasks.lifecycle.recorder.Recorder`
    to keep the invariant.
    """
    if not runs:
        return {}
    kind = type(runs[0][1])
    extra = _STATEMENTS[kind][1]
    sql = statement_for(kind, len(runs))
    # In id order, the order in which the enqueuing side locks parents at its commit
    # (models/dependencies.py): the two never wait for each other in a circle.
    ordered = sorted(runs, key=_by_id)
    if any(type(outcome) is not kind for _, outcome in ordered):
        raise TypeError("write() takes outcomes of one kind.")
    columns: list[list[Any]] = [[task.id for task, _ in ordered],
                                [task.locked_by for task, _ in ordered],
                                [task.claims for task, _ in ordered]]
    # The kind's own columns (none for a give-back), one list each.
    columns += map(list, zip(*[extra(outcome) for _, outcome in ordered], strict=True))
    params: list[Any] = _interrupted_params() if kind is Interrupted else []
    with fast_cursor(using) as cursor:
        cursor.execute(sql, [*params, *columns])
        written = dict(cursor.fetchall())
    if kind in (Interrupted, Unstarted) and written:
        forget_bounds()  # back at their place in the queue: claim from the start again
    return written


def _by_id(run: tuple[Claimed, Outcome]) -> int:
    return run[0].id


def unclaim(using: str, tasks: Sequence[Claimed]) -> dict[int, str]:
    """Give back claimed tasks that never started, as if they had not been claimed."""
    return write(using, [(task, Unstarted()) for task in tasks])


# The last resort, for a run whose every other end the database refused (a fault in a column,
# a trigger, a constraint): FAILED with a bounded text, and nothing else a fault could lie in
# (no result, no error history, no counters). Guarded by the lease, or (for the rescue, whose
# worker is gone) by the state alone.
END_FOR_GOOD_SQL = f"""
    UPDATE pgtasks_task SET status = 'FAILED', error_text = %s, locked_at = NULL,
        finished_at = statement_timestamp(), updated_at = statement_timestamp()
    WHERE id = %s AND {RUNNING}
      AND (%s::text IS NULL OR (locked_by = %s AND claims = %s))
    RETURNING id, name, locked_by
"""


def end_for_good(using: str, task_id: int, error: BaseException, *,
                 lease: Claimed | None = None) -> tuple[int, str, str] | None:
    """End a running task ``FAILED`` by the simplest write there is, after every other end
    of its run was refused; logged at CRITICAL with its id. Returns its id, name and worker
    if it ended (``None``: it was no longer running, or no longer under ``lease``)."""
    text = truncate_error(reason_text(UnstorableResultError, (
        f"Every end of this run was refused by the database; the task was ended by the "
        f"simplest write. The first refusal: {qualified_name(type(error))}: {error}")))
    worker = lease.locked_by if lease is not None else None
    claims = lease.claims if lease is not None else None
    with connections[using].cursor() as cursor:
        cursor.execute(END_FOR_GOOD_SQL, [text, task_id, worker, worker, claims])
        ended = cursor.fetchone()
    if ended is not None:
        logger.critical("Task id=%s was ended FAILED by the simplest write: the database refused "
                        "every other end of its run (%s: %s).", task_id,
                        qualified_name(type(error)), str(error).strip().split("\n", 1)[0])
    return ended


def unstorable(exc: BaseException) -> Failed:
    """The failure recorded for a run whose outcome the database refused to store."""
    return Failed(reason_text(UnstorableResultError, f"The task's outcome could not be "
                              f"stored: {qualified_name(type(exc))}: {exc}"), None)
