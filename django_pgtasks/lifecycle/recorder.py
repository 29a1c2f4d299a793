"""The invariant, enforced: every outcome handed to the :class:`Recorder` is recorded, or its
task goes back to the queue.

It writes outcomes with :func:`~django_pgtasks.lifecycle.transitions.write`, retries what is
transient, splits a batch the database refuses until the culprit is alone, and records a
storable failure for an outcome that cannot be stored.
"""


from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, connections

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.partition_moves import is_conflict, retry_conflicts
from django_pgtasks.database.sqlstates import is_transient
from django_pgtasks.definition.error_text import reason_text
from django_pgtasks.lifecycle.transitions import (
    Claimed,
    Failed,
    Interrupted,
    Outcome,
    Unstarted,
    end_for_good,
    unstorable,
    write,
)

logger = logging.getLogger("django_pgtasks.worker")

T = TypeVar("T")


class Recorder:
    """Records outcomes so that every claimed task ends recorded or back in the queue.

    - A *transient* database error
      (:func:`~django_pgtasks.database.sqlstates.is_transient`: connection lost or refused,
      serialization failure, lock or statement timeout) closes the connection and tries again
      after a pause (doubling up to ``ERROR_PAUSE_MAX``), at most ``tries`` times, and not once
      ``give_up`` is set. Runs still unrecorded then are reported as such: the worker gives
      them back (:meth:`Worker._give_back_orphans`).
    - Any other error means the statement will fail the same way again: a batch is split in
      halves until the culprit is alone, so the other runs are recorded; the culprit's
      outcome is replaced by a failure that says what could not be stored
      (:func:`unstorable`); if even that fails, the task is interrupted (given back, within
      its interruption budget); if even that fails, it is ended ``FAILED`` by the simplest
      write there is (:func:`end_for_good`, logged at CRITICAL), so that a fault in
      recording never runs a handler again and again; only if that fails too is it left
      to the rescue.

    Nothing is swallowed without a log line. Thread-safe: each thread uses its own Django
    connection to ``using``.
    """

    def __init__(self, using: str, *, give_up: threading.Event | None = None,
                 tries: int = 8) -> None:
        self.using = using
        self.give_up = give_up or threading.Event()
        self.tries = tries

    def record(self, runs: Iterable[tuple[Claimed, Outcome]]) -> dict[int, str | None]:
        """Record ``runs``; return each task's new status, ``""`` if it was no longer held
        (nothing changed), ``None`` if nothing could be recorded (the database stayed
        unreachable)."""
        by_kind: dict[type, list[tuple[Claimed, Outcome]]] = {}
        for task, outcome in runs:
            by_kind.setdefault(type(outcome), []).append((task, outcome))
        statuses: dict[int, str | None] = {}
        for group in by_kind.values():
            statuses.update(self._record(group))
        return statuses

    def _record(self, runs: list[tuple[Claimed, Outcome]]) -> dict[int, str | None]:
        try:
            written = self._with_retries(runs)
        except Exception as exc:  # refused: the same statement would fail again
            if len(runs) > 1:
                middle = len(runs) // 2
                return {**self._record(runs[:middle]), **self._record(runs[middle:])}
            return self._fallback(runs[0], exc)
        if written is None:
            return {task.id: None for task, _ in runs}
        for task, _ in runs:
            if task.id not in written:
                logger.warning(
                    "Task id=%s name=%s was no longer held by worker %s when its run ended; "
                    "its outcome was not recorded.", task.id, task.name, task.locked_by)
        return {task.id: written.get(task.id, "") for task, _ in runs}

    def _fallback(self, run: tuple[Claimed, Outcome], exc: Exception) -> dict[int, str | None]:
        task, outcome = run
        kind = type(outcome).__name__.lower()
        logger.error("Task id=%s name=%s: its outcome (%s) could not be recorded: %r",
                     task.id, task.name, kind, exc, exc_info=exc)
        replacements: list[Outcome] = []
        # A run that never started is not the handler's failure: only given back, or
        # interrupted.
        if not isinstance(outcome, Failed | Interrupted | Unstarted):
            replacements.append(unstorable(exc))
        if not isinstance(outcome, Interrupted):
            replacements.append(Interrupted(reason_text(
                type(exc), f"recording the outcome of this run failed ({kind}): {exc}")))
        for replacement in replacements:
            try:
                written = self._with_retries([(task, replacement)])
            except Exception as again:
                logger.error("Task id=%s: recording %s instead failed too: %r", task.id,
                             type(replacement).__name__, again, exc_info=again)
                continue
            if written is None:
                return {task.id: None}
            return {task.id: written.get(task.id, "")}
        if isinstance(outcome, Unstarted):  # never ran: never ended without running
            logger.error("Task id=%s name=%s stays RUNNING until the rescue of abandoned tasks "
                         "takes it back.", task.id, task.name)
            return {task.id: None}
        # Nothing else could be written: the simplest end there is, so that the run is never
        # given back to run again for a fault in its recording.
        try:
            ended = self.attempt(lambda: end_for_good(self.using, task.id, exc, lease=task) or ())
        except Exception as again:
            logger.critical("Task id=%s name=%s: even the simplest end was refused (%r); it "
                            "stays RUNNING until the rescue of abandoned tasks takes it.",
                            task.id, task.name, again, exc_info=again)
            return {task.id: None}
        if ended is None:
            return {task.id: None}
        return {task.id: "FAILED" if ended else ""}

    def _with_retries(self, runs: list[tuple[Claimed, Outcome]]) -> dict[int, str] | None:
        """:func:`write`, tried again on transient errors; ``None`` if it never succeeded."""
        return self.attempt(lambda: write(self.using, runs), len(runs))

    def attempt(self, action: Callable[[], T], count: int = 1) -> T | None:
        """Run ``action`` (which records ``count`` outcomes) and return its value; on a
        transient database error close the connection, pause and try again, at most
        ``tries`` times; ``None`` if it never succeeded. Other errors are raised.

        Inside a transaction (the in-test runner), ``action`` runs in a savepoint, so that a
        refused statement leaves the transaction usable for the fallback, and a transient
        error is not retried (the transaction is lost with the connection).
        """
        connection = connections[self.using]
        if connection.in_atomic_block:
            try:
                return retry_conflicts(self.using, action)
            except (DatabaseError, InterfaceError) as exc:
                if not is_transient(exc):
                    raise
                logger.error("Database error while recording %d outcome(s): %s", count, exc)
                return None
        pause = pgtasks_settings.ERROR_PAUSE
        for attempt in range(1, self.tries + 1):
            try:
                # One statement in autocommit mode: atomic by itself, one round trip.
                return action()
            except (DatabaseError, InterfaceError) as exc:
                if not is_transient(exc):
                    raise
                if is_conflict(exc) and attempt < self.tries:
                    # A task of the batch moved partitions under a concurrent end (a rescue):
                    # the next try sees where it is now. Nothing is wrong with the session.
                    continue
                logger.warning("Database error while recording %d outcome(s) (try %d of %d): "
                               "%s", count, attempt, self.tries, exc)
                close_connection(self.using)
            if attempt == self.tries or self.give_up.wait(pause):
                break
            pause = min(pause * 2, pgtasks_settings.ERROR_PAUSE_MAX)
        logger.error("Could not record %d outcome(s); the tasks will be given back.", count)
        return None


def close_connection(alias: str) -> None:
    """Close this thread's connection to ``alias``, ignoring errors (it may be broken)."""
    with contextlib.suppress(DatabaseError, InterfaceError):
        connections[alias].close()
