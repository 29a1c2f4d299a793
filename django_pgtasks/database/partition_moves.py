"""Statements that may meet a task row moved to another partition, tried again.

The task table is partitioned by state (migration 0014): a task's end moves its row from the
live partition to history, and a retry brings it back. PostgreSQL cannot follow a row across
partitions: a statement that waits for the lock of a row another transaction moves, or finds
it moved since its snapshot, fails with a serialization failure (SQLSTATE 40001, "tuple to be
locked was already moved to another partition due to concurrent update") where, within one
table, it would have re-read the row's new version. Tried again, the statement takes a fresh
snapshot and sees where the row is now, as it would have.

:func:`retry_conflicts` does that for the statements that can race with an end (a keyed
enqueue, a claim, a rescue, operator actions); inside a transaction each try runs in a
savepoint, so a failed try leaves the caller's transaction usable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections, transaction

from django_pgtasks.database.sqlstates import sqlstates

T = TypeVar("T")

#: serialization_failure, deadlock_detected: the statement lost a race; it may succeed alone.
CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
#: Tries before the conflict is raised (each conflict means another transaction progressed).
TRIES = 10


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost race (a row moved or changed under a concurrent update)."""
    return any(state in CONFLICT_SQLSTATES for state in sqlstates(exc))


def retry_conflicts(alias: str, action: Callable[[], T], *, tries: int = TRIES) -> T:
    """Run ``action`` (statements on ``alias``) and return its value; on a conflict run it
    again, at most ``tries`` times. Inside a transaction, each try runs in a savepoint."""
    in_transaction = connections[alias].in_atomic_block
    for attempt in range(1, tries + 1):
        try:
            if in_transaction:
                with transaction.atomic(using=alias):
                    return action()
            return action()
        except DatabaseError as exc:
            if attempt == tries or not is_conflict(exc):
                raise
    raise AssertionError("unreachable")
