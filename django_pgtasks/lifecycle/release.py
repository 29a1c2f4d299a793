"""The release of a workflow's children, after their parent's end, in bounded batches.

A task with dependents that ends leaves a *mark* (``pgtasks_pending_release``, written by the
database in the transaction of its end: ``sql/workflows.sql``) and wakes the workers. The release
itself is done here, outside that transaction: each call of :func:`release_some` locks due
marks (``SKIP LOCKED``: workers share the work) and resolves at most ``batch`` of their edges
in one short transaction, so a fan-out of 100,000 children is a hundred transactions of a
thousand edges, each far below an ordinary ``statement_timeout``, and the parent's outcome
never waits for (or fails with) its children's release.

A batch that fails is split until the culprit mark is alone; that mark is given a back-off
(``failures``, ``due_at``, ``last_error``), logged, and tried again later. A release never
runs a handler again: the parent's end is recorded before any of this starts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, connections, transaction

from django_pgtasks.database.schema import is_missing_schema
from django_pgtasks.definition.error_text import reason_text, truncate_error

logger = logging.getLogger("django_pgtasks.worker")

#: Edges resolved per transaction (and marks locked per transaction) by default.
BATCH = 1000
#: Smallest batch a failing release is retried with before its mark is given a back-off.
MIN_BATCH = 10
#: Longest back-off of a mark whose release keeps failing (seconds).
MAX_BACKOFF = 300.0

# Due marks, oldest first, locked so that one worker at a time releases each. A batch is
# short: the lock timeout keeps it from waiting long behind a row an application holds.
LOCK_DUE_SQL = """
    SELECT parent_id FROM pgtasks_pending_release
    WHERE due_at <= statement_timestamp() AND (%s::bigint[] IS NULL OR parent_id = ANY (%s))
    ORDER BY due_at, parent_id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""
RELEASE_SQL = "SELECT pgtasks_release(%s::bigint[], %s)"
LOCK_TIMEOUT_SQL = "SET LOCAL lock_timeout = '2s'"

# A mark whose release failed: tried again after a back-off doubling from one second.
FAILED_SQL = """
    UPDATE pgtasks_pending_release SET
        failures = failures + 1,
        due_at = statement_timestamp()
                 + make_interval(secs => least(power(2, failures), %s)),
        last_error = %s
    WHERE parent_id = %s
"""

# The due marks, unlocked: what a failed batch is isolated over, one mark at a time.
DUE_MARKS_SQL = """
    SELECT parent_id FROM pgtasks_pending_release
    WHERE due_at <= statement_timestamp()
    ORDER BY due_at, parent_id
    LIMIT %s
"""


@dataclass
class Turn:
    """What one call of :func:`release_some` did."""

    #: Edges resolved.
    edges: int = 0
    #: Whether marks may still be due (call again).
    more: bool = False
    #: Whether the batch ran out of time (a statement timeout): the caller should take
    #: smaller batches for a while.
    timed_out: bool = False


def release_some(using: str, batch: int = BATCH) -> Turn:
    """Release at most ``batch`` edges of due marks, in one transaction (or, when it fails,
    in smaller ones that isolate the failing mark). Database errors that leave no mark to
    blame (a lost connection) are raised."""
    turn = Turn()
    try:
        marks, edges = _release(using, None, batch)
    except (DatabaseError, InterfaceError) as exc:
        # No mark to blame when the connection or the tables are gone (not migrated).
        if is_missing_schema(exc) or _connection_lost(using):
            raise
        logger.warning("Releasing the dependents of ended tasks failed (%s); isolating the "
                       "failing release.", _first_line(exc))
        turn.timed_out = _timed_out(exc)
        _isolate(using, batch, turn)
        turn.more = True
        return turn
    turn.edges = edges
    # Marks left (edges beyond the batch), more marks due than one batch locked, or new
    # marks of the children this batch ended: look again until none is due.
    turn.more = bool(marks)
    return turn


def release_all(using: str, batch: int = BATCH, limit: int = 1_000_000) -> int:
    """Release everything due now (the in-test runner, a burst worker); return the edges
    resolved. Marks that fail are left with their back-off."""
    total = 0
    for _ in range(limit):
        turn = release_some(using, batch)
        total += turn.edges
        if not turn.more:
            break
    return total


def _release(using: str, parents: Sequence[int] | None, batch: int) -> tuple[list[int], int]:
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(LOCK_TIMEOUT_SQL)
        ids = None if parents is None else list(parents)
        cursor.execute(LOCK_DUE_SQL, [ids, ids, batch])
        marks = [row[0] for row in cursor.fetchall()]
        if not marks:
            return marks, 0
        cursor.execute(RELEASE_SQL, [marks, batch])
        return marks, cursor.fetchone()[0]


def _isolate(using: str, batch: int, turn: Turn) -> None:
    """Release the due marks one at a time, each with smaller batches before it is blamed."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(DUE_MARKS_SQL, [batch])
        marks = [row[0] for row in cursor.fetchall()]
    for mark in marks:
        size = batch
        while True:
            try:
                _, edges = _release(using, [mark], size)
            except (DatabaseError, InterfaceError) as exc:
                if is_missing_schema(exc) or _connection_lost(using):
                    raise
                if size > MIN_BATCH and _timed_out(exc):  # too much for one statement
                    size = max(size // 4, MIN_BATCH)
                    continue
                _failed(using, mark, exc)
                break
            turn.edges += edges
            break


def _failed(using: str, mark: int, exc: BaseException) -> None:
    text = truncate_error(reason_text(type(exc), str(exc)))
    logger.error("Releasing the dependents of task id=%s failed: %s; it is tried again later "
                 "(no handler runs again).", mark, _first_line(exc))
    with connections[using].cursor() as cursor:
        cursor.execute(FAILED_SQL, [MAX_BACKOFF, text, mark])


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement timeout (or a cancel), which a smaller batch avoids."""
    return getattr(exc.__cause__, "sqlstate", None) == "57014"


def _connection_lost(using: str) -> bool:
    connection = connections[using]
    if connection.connection is None or connection.connection.closed:
        return True
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (DatabaseError, InterfaceError):
        return True
    return False


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0]
