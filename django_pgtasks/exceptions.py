"""Exceptions raised by django-pgtasks, and the ones handlers raise to steer retries."""

from __future__ import annotations


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
