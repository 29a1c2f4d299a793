"""Exceptions raised by django-pgtasks, and the ones handlers raise to steer retries."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.db import ProgrammingError


class PgTasksError(Exception):
    """Base class of every error django-pgtasks raises."""


class InvalidTaskError(PgTasksError, ValueError):
    """An enqueue was refused because something about the task is invalid.

    Nothing is written to the database when this is raised.
    """


class UnknownTaskError(InvalidTaskError, LookupError):
    """The task name is not registered with ``@pgtask`` (or importable as one)."""


class UnknownQueueError(InvalidTaskError, LookupError):
    """The queue is not listed in ``PGTASKS["QUEUES"]``."""


class InvalidPayloadError(InvalidTaskError, TypeError):
    """The arguments cannot be stored as plain JSON (or are too large / too deep)."""


class FatalError(PgTasksError):
    """Raise from a handler to fail the task at once, without further retries.

    Use it for errors that another attempt cannot fix (bad input, a deleted object).
    Handlers can also list their own exception types as fatal with ``@pgtask(fatal=(...))``.
    """


class StepError(FatalError, ValueError):
    """A step of a durable task (``context.step()``) was misused: a name that is not a
    non-empty string of at most 200 characters, or a name used twice in one run. Another
    attempt cannot fix that: the task fails at once."""


class LeaseLostError(PgTasksError):
    """The worker no longer holds the task it tried to finish.

    The task was rescued, cancelled or changed by an operator while this worker ran it, so
    its result was not recorded. In the exactly-once mode the handler's writes are rolled back.
    """


class TaskTimeoutError(PgTasksError):
    """A task ran longer than the ``timeout=`` of its handler.

    Async handlers are cancelled at the limit. A sync handler's thread cannot be interrupted
    in Python: the worker records the timeout, frees the slot for other work and leaves the
    thread to finish on its own (its late outcome is ignored).
    """


class TaskCancelled(PgTasksError):
    """The task was cancelled while it ran.

    :meth:`TaskContext.raise_if_cancelled` raises it; an async handler's coroutine is
    cancelled and the worker records this instead of the ``CancelledError``. A handler may
    also raise it on its own to end its task ``CANCELLED``. A task that stops with any
    exception after its cancellation was requested ends ``CANCELLED``, never retried.
    """


class Snooze(PgTasksError):
    """Raise from a handler to run the task again after ``seconds``, without using up an attempt.

    The task goes back to ``READY``, due ``seconds`` later on the database clock; its attempt
    number is given back and ``metadata["snoozes"]`` counts the snoozes. In the exactly-once
    mode (``atomic=True``) the handler's writes are rolled back, as for any exception.
    ``TaskContext.snooze(seconds)`` raises it for you.
    """

    def __init__(self, seconds: float | timedelta = 0) -> None:
        self.seconds = seconds_within_a_year(seconds, "Snooze")
        super().__init__(f"Snoozed for {self.seconds:g}s.")

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses from a process pool's child as itself (its message is not its argument).
        return type(self), (self.seconds,)


class Suspend(Snooze):
    """Raised by a durable sleep or wait (``ctx.sleep()``, ``ctx.sleep_until()``,
    ``ctx.wait_for_event()``): the run ends here, without spending an attempt, and the task
    is due again at ``until`` (the database clock), or as soon as the event ``event`` it
    waits for is sent. No thread and no connection is held meanwhile; the next run replays
    the steps kept so far and goes on after the sleep or the wait.

    Let it propagate: a handler that catches it (``except Exception``) and goes on does not
    sleep. Not an error: the run is recorded as suspended, not failed.
    """

    def __init__(self, until: datetime | None, event: str | None = None) -> None:
        self.until = until
        self.event = event
        PgTasksError.__init__(
            self, f"Waiting for the event {event!r}." if event is not None
            else f"Sleeping until {until.isoformat() if until else '?'}.")
        self.seconds = 0.0

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.until, self.event)


class EventTimeout(PgTasksError, TimeoutError):
    """Raised inside a handler by ``ctx.wait_for_event(key, timeout=...)`` when the event
    ``key`` was not sent within ``timeout`` seconds of the wait's start (database clock).

    Kept like a step: if the task runs again (a retry of a later failure), the same wait
    raises it again at once, even if the event was sent since; catch it to go on without
    the event, or let it fail the attempt like any error."""

    def __init__(self, key: str, timeout: float | None = None) -> None:
        self.key = key
        self.timeout = timeout
        after = f" within {timeout:g}s" if timeout is not None else ""
        super().__init__(f"The event {key!r} was not sent{after}.")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.key, self.timeout)


#: The longest snooze, durable sleep or wait for an event: one year.
MAX_SNOOZE_SECONDS = 366 * 24 * 3600


def seconds_within_a_year(seconds: Any, what: str) -> float:
    """``seconds`` (a number or a ``timedelta``) as a float from 0 to
    :data:`MAX_SNOOZE_SECONDS`, else ``ValueError`` naming ``what``."""
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or not 0 <= seconds <= MAX_SNOOZE_SECONDS):
        raise ValueError(f"{what} takes 0 to {MAX_SNOOZE_SECONDS} seconds or a timedelta, "
                         f"not {seconds!r}.")
    return float(seconds)


class InvalidEventError(InvalidTaskError, ValueError):
    """An event's key or payload was refused (``Task.objects.send_event()``,
    ``context.wait_for_event()``): nothing was written."""


class UnstorableResultError(FatalError, TypeError):
    """A handler returned a value PostgreSQL cannot store as the task's result.

    A NUL character or a lone surrogate anywhere in it (keys included), a number ``jsonb``
    cannot hold, or more than ``PGTASKS["MAX_RESULT_BYTES"]`` of JSON. The task ends
    ``FAILED`` with this error, naming what was wrong and where; it is not retried, since the
    same code would return the same value again.
    """


class TaskInterrupted(PgTasksError):
    """A run ended without its handler failing: the worker died, shut down, or lost its
    database connection, or the handler's code could not be imported.

    An interrupted task is run again in its original place in the queue without spending
    an attempt, up to ``PGTASKS["MAX_INTERRUPTIONS"]`` times; then it fails with
    :class:`TooManyInterruptions`. The subclasses name the cause in the recorded error.
    """


class WorkerLost(TaskInterrupted):
    """The worker running the task stopped (killed, host lost, connection gone, hung); the
    rescue of abandoned tasks gave the task back."""


class WorkerShutdown(TaskInterrupted):
    """The worker shut down (SIGTERM past its grace period) before the task finished."""


class ConnectionLost(TaskInterrupted):
    """The handler's database connection was lost or refused (the server restarted, the
    backend was terminated, too many clients)."""


class HandlerImportError(TaskInterrupted):
    """The module of the task's handler failed to import (a deploy in progress, a missing
    dependency). Logged with its traceback; the task runs again, with the interruption
    budget as its bound."""


class ChildProcessDied(TaskInterrupted):
    """The child process running the task (``--pool process``) died before the run ended:
    killed by a signal (a crash in native code, the out-of-memory killer) or exited (a
    handler's ``os._exit()``)."""


class TooManyInterruptions(PgTasksError):
    """The task was interrupted ``PGTASKS["MAX_INTERRUPTIONS"]`` times and ends ``FAILED``:
    it may be what kills its worker (out of memory, a crash in native code)."""


class ParentFailed(PgTasksError):
    """A task it depends on did not succeed, and its ``on_parent_failure`` policy is
    ``"skip"`` (it ends ``CANCELLED``) or ``"fail"`` (it ends ``FAILED``); its
    ``error_text`` names this class."""


class TaskWaitTimeout(PgTasksError, TimeoutError):
    """``Task.objects.wait()`` gave up: the task had not finished within ``timeout`` seconds.

    ``task`` is the task as last read (still waiting or running); nothing was changed.
    """

    def __init__(self, message: str, task: Any = None) -> None:
        super().__init__(message)
        self.task = task


class NotMigratedError(PgTasksError, ProgrammingError):
    """The database lacks django-pgtasks' tables or its newest migrations: run
    ``manage.py migrate``. ``alias`` is the database. A ``ProgrammingError``, so code that
    catches database errors catches it too; its cause is the database's own error, if any."""

    def __init__(self, message: str, alias: str) -> None:
        super().__init__(message)
        self.alias = alias
