"""Retry delay policies.

A policy maps the number of the attempt that just failed (1 for the first) to the seconds to
wait before the next one. The delay is added to the *database* clock when the task is put back
(``run_after = now() + delay``), so app-server clock skew never decides when a task may run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from django_pgtasks.conf import pgtasks_settings

#: A backoff policy: attempt number (1-based) -> delay in seconds.
Backoff = Callable[[int], float]


def _jittered(delay: float, jitter: float) -> float:
    if jitter <= 0:
        return delay
    return max(0.0, delay * (1 + random.uniform(-jitter, jitter)))


def exponential(base: float | None = None, maximum: float | None = None,
                jitter: float | None = None) -> Backoff:
    """``base * 2 ** (attempt - 1)`` seconds, capped at ``maximum``, with ± ``jitter`` spread.

    A broken dependency then sees a slowly decaying load instead of a retry storm, and the
    jitter keeps tasks that failed together from retrying in lock-step.
    """

    def policy(attempt: int) -> float:
        b = pgtasks_settings.BACKOFF_BASE if base is None else base
        cap = pgtasks_settings.BACKOFF_MAX if maximum is None else maximum
        j = pgtasks_settings.BACKOFF_JITTER if jitter is None else jitter
        return min(cap, _jittered(b * 2 ** min(attempt - 1, 62), j))

    return policy


def linear(step: float | None = None, maximum: float | None = None,
           jitter: float | None = None) -> Backoff:
    """``step * attempt`` seconds, capped at ``maximum``, with ± ``jitter`` spread."""

    def policy(attempt: int) -> float:
        s = pgtasks_settings.BACKOFF_BASE if step is None else step
        cap = pgtasks_settings.BACKOFF_MAX if maximum is None else maximum
        j = pgtasks_settings.BACKOFF_JITTER if jitter is None else jitter
        return min(cap, _jittered(s * attempt, j))

    return policy


def constant(seconds: float) -> Backoff:
    """The same delay before every retry."""
    return lambda attempt: seconds


POLICIES: dict[str, Callable[[], Backoff]] = {"exponential": exponential, "linear": linear}


def resolve(backoff: str | Backoff | None) -> Backoff:
    """Turn a policy name, a callable or ``None`` (the ``BACKOFF`` setting) into a policy."""
    if backoff is None:
        backoff = pgtasks_settings.BACKOFF
    if callable(backoff):
        return backoff
    try:
        return POLICIES[backoff]()
    except KeyError:
        raise ValueError(
            f"Unknown backoff policy {backoff!r}; use one of {sorted(POLICIES)} or a callable."
        ) from None
