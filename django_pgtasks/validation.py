"""Checks of enqueue options, shared by ``@pgtask`` and the enqueue methods."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django.utils import timezone

from .conf import pgtasks_settings
from .exceptions import InvalidTaskError, UnknownQueueError

#: Native priority range: higher runs first; the default sits in the middle.
PRIORITY_MIN = 0
PRIORITY_MAX = 200
MAX_ATTEMPTS_LIMIT = 1000
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


def validate_options(
    *, priority: int | None = None, max_attempts: int | None = None, key: str | None = None,
    stage: str | None = None,
) -> None:
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        raise InvalidTaskError(
            f"Priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} "
            f"(higher runs first), not {priority!r}."
        )
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidTaskError(
            f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, "
            f"not {max_attempts!r}."
        )
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 255
                            or "\x00" in key):
        raise InvalidTaskError(f"key must be a string of 1 to 255 characters, not {key!r}.")
    if stage is not None and (not isinstance(stage, str) or not 1 <= len(stage) <= 100
                              or "\x00" in stage):
        raise InvalidTaskError(f"stage must be a string of 1 to 100 characters, not {stage!r}.")


def validate_queue(queue: str) -> str:
    if not isinstance(queue, str) or queue not in pgtasks_settings.queue_names:
        raise UnknownQueueError(
            f"Queue {queue!r} is not configured; add it to PGTASKS['QUEUES'] "
            f"(configured: {', '.join(pgtasks_settings.queue_names)})."
        )
    return queue


def delay_seconds(run_after: datetime | None, delay: timedelta | float | None) -> float | None:
    """Validate ``run_after``/``delay`` and return the delay relative to the database clock.

    ``run_after`` is kept absolute (returned as ``None`` here); ``delay`` becomes seconds that
    the INSERT adds to the database's ``now()``.
    """
    if run_after is not None and delay is not None:
        raise InvalidTaskError("Pass either run_after or delay, not both.")
    if run_after is not None:
        if not isinstance(run_after, datetime) or timezone.is_naive(run_after):
            raise InvalidTaskError(
                f"run_after must be a timezone-aware datetime, not {run_after!r}."
            )
        return None
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidTaskError(
            f"delay must be a non-negative number of seconds or a timedelta, not {delay!r}."
        )
    return float(seconds)
