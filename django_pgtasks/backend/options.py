"""The backend's options and the retry options of a task, and their checks."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django_pgtasks.definition.framework import (
    Task,
    TaskResult,
)
from django_pgtasks.definition.options import MAX_ATTEMPTS_LIMIT
from django_pgtasks.retry import POLICIES

if TYPE_CHECKING:
    pass


logger = logging.getLogger("django_pgtasks.backend")

#: A row's native priority is its Django priority plus this offset.
PRIORITY_OFFSET = 100
#: The key of ``Task.metadata`` under which the backend marks the rows it writes.
METADATA_KEY = "django_tasks"
#: ``OPTIONS`` keys and their defaults. One attempt is Django's behaviour: no retries.
OPTION_DEFAULTS: dict[str, Any] = {"MAX_ATTEMPTS": 1, "BACKOFF": None}

#: A retry policy in the shape of Django's retry proposal: seconds (or a timedelta) to wait
#: before the next attempt, or ``None`` to stop retrying.
Backoff = Callable[[BaseException, TaskResult], "float | timedelta | None"]



@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryableTask(Task):
    """A ``django.tasks.Task`` with retry options: the ``task_class`` of :class:`PgTasksBackend`.

    ``@task(max_attempts=5, backoff="linear")`` creates one on Django 6.1 and later and with
    the backport (Django 6.0's decorator does not pass extra arguments on). The names follow
    Django's proposal for a retry API; ``using()`` keeps them and cannot change them.
    """

    #: Attempts in all, the first included (1: never retried). ``None``: the backend's
    #: ``OPTIONS["MAX_ATTEMPTS"]`` (default 1).
    max_attempts: int | None = None
    #: ``"exponential"``, ``"linear"``, or ``backoff(exception, task_result)`` returning the
    #: seconds (or a timedelta) to wait, or ``None`` to stop retrying. ``None``: the backend's
    #: ``OPTIONS["BACKOFF"]``, then ``PGTASKS["BACKOFF"]``.
    backoff: str | Backoff | None = None




def retry_option_errors(
    max_attempts: Any, backoff: Any, names: tuple[str, str] = ("max_attempts", "backoff")
) -> list[str]:
    """Full-sentence problems with retry options; ``names`` says where they were set."""
    errors = []
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        errors.append(
            f"{names[0]} must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, not {max_attempts!r}."
        )
    if isinstance(backoff, str) and backoff not in POLICIES:
        errors.append(
            f"{names[1]} {backoff!r} is not a retry policy; use one of {sorted(POLICIES)} or a "
            f"callable backoff(exception, task_result)."
        )
    elif backoff is not None and not isinstance(backoff, str) and not callable(backoff):
        errors.append(
            f"{names[1]} must be a policy name or a callable backoff(exception, task_result), "
            f"not {backoff!r}."
        )
    elif callable(backoff) and not _accepts_two_arguments(backoff):
        errors.append(
            f"{names[1]} must accept two arguments, (exception, task_result), and return "
            f"seconds, a timedelta, or None to stop retrying."
        )
    return errors


def _accepts_two_arguments(func: Callable[..., Any]) -> bool:
    try:
        inspect.signature(func).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (some builtins): trust it
        return True
    return True
