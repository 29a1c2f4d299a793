"""Waiting for a task to finish: ``Task.objects.wait()`` and :func:`wait_for_result`.

A waiter does not poll the task table in a tight loop. It opens a connection of its own,
``LISTEN``s on the channel ``pgtasks_finished``, marks the task ``awaited`` and sleeps; the
trigger of ``sql/notify.sql`` sends ``NOTIFY pgtasks_finished, '<id>'`` when an awaited task
reaches an end state, at the commit that records it. Tasks nobody waits for never notify, so
workers pay nothing for this (the trigger's WHEN clause is false for them).

The order makes it race-free: LISTEN first, then mark the task awaited, then read its state.
A completion committed before the mark is seen by the read; one committed after it finds the
mark and notifies. The waiter still reads the state every ``poll_interval`` seconds (5 by
default) in case a notification is lost. Behind a pooler in transaction mode it listens on
``LISTEN_DATABASE`` (a direct connection), or, without one, only polls.

The task must be committed: a worker cannot run a task that the waiting code's own open
transaction inserted, so ``wait()`` refuses it instead of sleeping until its timeout.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import psycopg
from django.apps import apps

from django_pgtasks.database.sessions import listen_database, open_connection
from django_pgtasks.exceptions import PgTasksError, TaskWaitTimeout

if TYPE_CHECKING:
    from django_pgtasks.definition.framework import TaskResult
    from django_pgtasks.definition.task_row import TaskRow

#: Channel on which the completion of awaited tasks is announced (payload: the task id).
FINISHED_CHANNEL = "pgtasks_finished"

# Marks a task awaited (only if it is not finished and not marked yet, so a finished task is
# never written to), then reads its state; both on the waiter's own autocommit connection.
MARK_AWAITED_SQL = (
    "UPDATE pgtasks_task SET awaited = true WHERE id = %s AND NOT awaited "
    "AND status NOT IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')"
)
STATUS_SQL = "SELECT status FROM pgtasks_task WHERE id = %s"
FINISHED = ("SUCCESSFUL", "FAILED", "CANCELLED")


def mark_awaited(conn: Any, pk: int) -> None:
    """Mark task ``pk`` awaited on the waiter's autocommit session. A task ending meanwhile
    moves to history under the mark (a conflict, django_pgtasks.database.partition_moves): it
    ended, so there is nothing to mark, and the status read that follows sees the end."""
    with contextlib.suppress(psycopg.errors.SerializationFailure):
        conn.execute(MARK_AWAITED_SQL, [pk])


def wait_for_task(
    pk: int,
    timeout: float | None = None,
    *,
    using: str,
    poll_interval: float = 5.0,
) -> TaskRow:
    """Block until task ``pk`` in database ``using`` is finished; return it, read afresh.

    Raises :class:`~django_pgtasks.exceptions.TaskWaitTimeout` once ``timeout`` seconds have
    passed (``None``: wait as long as it takes), ``Task.DoesNotExist`` if there is no such
    task, and :class:`~django_pgtasks.exceptions.PgTasksError` if the task is not committed.
    """
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None or 0 or more seconds, not {timeout!r}.")
    if poll_interval <= 0:
        raise ValueError(f"poll_interval must be positive, not {poll_interval!r}.")
    deadline = None if timeout is None else time.monotonic() + timeout
    task = _read(pk, using)
    if task.is_finished:
        return task
    listen_on = listen_database(using)
    # The direct connection of LISTEN_DATABASE reaches the same database: the mark and the
    # reads go there too, so that they follow the LISTEN on the same session.
    with open_connection(listen_on or using) as conn:
        if listen_on is not None:
            conn.execute(f"LISTEN {FINISHED_CHANNEL}")
            mark_awaited(conn, pk)
        while True:
            row = conn.execute(STATUS_SQL, [pk]).fetchone()
            if row is None:
                # Not visible to another session: inserted by the caller's open transaction
                # (no worker can see it either), or deleted meanwhile.
                task = _read(pk, using)
                if not task.is_finished:
                    raise PgTasksError(
                        f"Task {pk} is not committed yet, so no worker can run it: commit the "
                        f"transaction that enqueued it before waiting for it."
                    )
                return task
            if row[0] in FINISHED:
                return _read(pk, using)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TaskWaitTimeout(
                    f"Task {pk} did not finish within {timeout:g} seconds (it is {row[0]}).",
                    task=_read(pk, using),
                )
            _sleep(conn, str(pk), poll_interval if remaining is None
                   else min(remaining, poll_interval))


def _sleep(conn: psycopg.Connection, payload: str, seconds: float) -> bool:
    """Until a notification carrying ``payload`` arrives (``True``) or ``seconds`` pass."""
    return any(notification.payload == payload
               for notification in conn.notifies(timeout=seconds))


def _read(pk: int, using: str) -> TaskRow:
    Task = apps.get_model("django_pgtasks", "Task")
    task = Task.objects.using(using).filter(pk=pk).first()
    if task is None:
        raise Task.DoesNotExist(f"There is no task with id {pk!r} in the database {using!r}.")
    return task


def wait_for_result(
    result: TaskResult, timeout: float | None = None, *, poll_interval: float = 5.0
) -> TaskResult:
    """Block until a ``django.tasks`` result of a :class:`~django_pgtasks.backend.PgTasksBackend`
    is finished, then ``refresh()`` it and return it.

    The same wake-up on completion as :meth:`TaskManager.wait`; raises
    :class:`~django_pgtasks.exceptions.TaskWaitTimeout` (a ``TimeoutError``) after
    ``timeout`` seconds, the result left as it was.
    """
    backend: Any = result.task.get_backend()
    wait = getattr(backend, "wait_result", None)
    if wait is None:
        raise TypeError(f"The task backend {type(backend).__name__} of this result is not a "
                        f"PgTasksBackend; it cannot be waited for.")
    wait(result.id, timeout, poll_interval=poll_interval)
    result.refresh()
    return result
