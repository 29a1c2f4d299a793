"""Exceptions raised by django-pgtasks, and the ones handlers raise to steer retries."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any


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
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not math.isfinite(seconds) or not 0 <= seconds <= MAX_SNOOZE_SECONDS):
            raise ValueError(f"Snooze takes 0 to {MAX_SNOOZE_SECONDS} seconds or a timedelta, "
                             f"not {seconds!r}.")
        self.seconds = float(seconds)
        super().__init__(f"Snoozed for {self.seconds:g}s.")


#: The longest snooze: one year.
MAX_SNOOZE_SECONDS = 366 * 24 * 3600


class TaskWaitTimeout(PgTasksError, TimeoutError):
    """``Task.objects.wait()`` gave up: the task had not finished within ``timeout`` seconds.

    ``task`` is the task as last read (still waiting or running); nothing was changed.
    """

    def __init__(self, message: str, task: Any = None) -> None:
        super().__init__(message)
        self.task = task
