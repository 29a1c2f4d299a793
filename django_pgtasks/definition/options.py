"""Checks of enqueue options, shared by ``@pgtask`` and the enqueue methods.

Whatever PostgreSQL would refuse is refused here first, with an error that says what was wrong
and where: an error raised by the database inside the caller's ``transaction.atomic()`` block
would leave that transaction unusable.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.utils import timezone

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.exceptions import InvalidTaskError, UnknownQueueError

#: Native priority range: higher runs first; the default sits in the middle.
PRIORITY_MIN = 0
PRIORITY_MAX = 200
MAX_ATTEMPTS_LIMIT = 1000
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
#: The longest ``delay``: a century. ``now() + delay`` must stay a time that both PostgreSQL
#: and Python's ``datetime`` (up to the year 9999) can hold; anything longer is a mistake,
#: often milliseconds passed as seconds.
MAX_DELAY_SECONDS = 36525 * 24 * 3600


def text_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` in a text or ``jsonb`` column, as the end of a
    sentence ("contains a NUL character, ..."), or ``None`` if it can.

    PostgreSQL refuses the NUL character in text and the escaped ``\\u0000`` in ``jsonb``.
    A surrogate code point (U+D800 to U+DFFF, as ``os.fsdecode()`` and the
    ``surrogateescape`` error handler produce for undecodable bytes) is not valid Unicode: it
    cannot be encoded as UTF-8, and ``jsonb`` refuses it as a ``\\udXXX`` escape.
    """
    if "\x00" in value:
        return "contains a NUL character, which PostgreSQL cannot store"
    if value.isascii():  # the usual case, and the cheapest test: no surrogate possible
        return None
    try:
        value.encode()  # fails on surrogates only; much faster than a regular expression
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate ({value[exc.start]!r} at index {exc.start}), which is "
            f"not valid Unicode and which PostgreSQL cannot store; decode bytes with "
            f"errors='replace', or pass them as base64"
        )
    return None


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
    if key is not None:
        check_string_option("key", key, 255)
    if stage is not None:
        check_string_option("stage", stage, 100)


def check_string_option(name: str, value: object, max_length: int) -> None:
    """Refuse an option that is not a string of 1 to ``max_length`` storable characters."""
    problem = text_problem(value) if isinstance(value, str) else None
    if not isinstance(value, str) or not 1 <= len(value) <= max_length or problem:
        raise InvalidTaskError(
            f"{name} must be a string of 1 to {max_length} characters, not {value!r}"
            + (f": it {problem}." if problem else ".")
        )


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
        check_run_after(run_after)
        return None
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    # The chained comparison is False for NaN too; it compares a huge int exactly, where
    # float() would overflow.
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_DELAY_SECONDS):
        raise InvalidTaskError(
            f"delay must be a non-negative number of seconds or a timedelta, at most a century "
            f"({MAX_DELAY_SECONDS} seconds), not {delay!r}."
        )
    return float(seconds)


def check_run_after(run_after: datetime) -> None:
    """Refuse a ``run_after`` that is not an aware datetime the database can give back."""
    if not isinstance(run_after, datetime) or timezone.is_naive(run_after):
        raise InvalidTaskError(f"run_after must be a timezone-aware datetime, not {run_after!r}.")
    try:
        # Stored in UTC and read back as UTC: near datetime.min or .max, a time zone offset
        # can push it outside the years 1 to 9999 that a datetime can hold.
        run_after.astimezone(UTC)
    except OverflowError:
        raise InvalidTaskError(
            f"run_after {run_after!r} is outside the years 1 to 9999 in UTC."
        ) from None


#: Largest per-key concurrency limit (the column is a smallint).
MAX_CONCURRENCY_LIMIT = 32767


class ConcurrencyDefaults(Protocol):
    """A handler's defaults for :func:`resolve_concurrency` (a ``TaskHandler`` has them)."""

    concurrency_key: str | Callable[..., str | None] | None
    concurrency_limit: int | None


def resolve_concurrency(
    handler: ConcurrencyDefaults,
    concurrency_key: str | None,
    concurrency_limit: int | None,
    args: list[Any],
    kwargs: dict[str, Any],
) -> tuple[str | None, int | None]:
    """The ``(concurrency_key, concurrency_limit)`` a new task gets; raise
    ``InvalidTaskError`` when they are not valid.

    The enqueue call's values win over the handler's defaults (``@pgtask(concurrency_key=...,
    concurrency_limit=...)``); a handler's ``concurrency_key`` may be a callable that receives
    the task's arguments and returns the key (or ``None``). With a key the limit defaults to
    1; without one there is no limit.
    """
    if concurrency_key is None:
        default = handler.concurrency_key
        concurrency_key = default(*args, **kwargs) if callable(default) else default
    if concurrency_key is None:
        if concurrency_limit is not None:
            raise InvalidTaskError("concurrency_limit needs a concurrency_key.")
        return None, None
    check_string_option("concurrency_key", concurrency_key, 255)
    limit = concurrency_limit if concurrency_limit is not None else handler.concurrency_limit
    limit = 1 if limit is None else limit
    if (isinstance(limit, bool) or not isinstance(limit, int)
            or not 1 <= limit <= MAX_CONCURRENCY_LIMIT):
        raise InvalidTaskError(
            f"concurrency_limit must be an integer from 1 to {MAX_CONCURRENCY_LIMIT}, not "
            f"{limit!r}."
        )
    return concurrency_key, limit
