"""What a step of a durable task is: its name, its stored entry, and the bounds both keep.

A handler that takes a context runs parts of its work as *steps*
(:meth:`~django_pgtasks.definition.handlers.TaskContext.step`). Each step that completes is
kept in the task's ``steps`` column as one entry::

    {"name": "charge", "result": {...}, "attempt": 1, "at": "2026-…", "ms": 12.5}

in the order the steps completed. When the task runs again (a retry, a rescue after its
worker died, a re-run from a chosen step), a step whose name has an entry returns the stored
result without running. This module holds the pure part (no database): the rules for names,
reading the entries of a claimed task, and the bounds; the checkpoint itself is written by
:mod:`django_pgtasks.lifecycle.steps`.
"""

from __future__ import annotations

from typing import Any

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.payload import result_json
from django_pgtasks.exceptions import InvalidPayloadError, StepError, UnstorableResultError

#: The longest step name, in characters.
MAX_STEP_NAME = 200
#: The most steps one task keeps: one more fails the task (``StepError``).
MAX_STEPS = 1000
#: The most bytes (as JSON) all of a task's step results may take, in units of
#: ``PGTASKS["MAX_RESULT_BYTES"]``: the row stays bounded however many steps it has.
STEPS_RESULT_FACTOR = 4


#: The first character of the names the context gives its own entries (durable sleeps and
#: waits for events: ``@sleep 1``, ``@event <key>``, ...); a step's name cannot start with it.
RESERVED = "@"


def check_name(name: Any) -> str:
    """``name`` if it can name a step: a non-empty string of at most
    :data:`MAX_STEP_NAME` characters with no NUL character and no lone surrogate (stored in
    PostgreSQL as is), not starting with :data:`RESERVED`; else
    :class:`~django_pgtasks.exceptions.StepError`."""
    name = check_label(name, "A step name", MAX_STEP_NAME, StepError)
    if name.startswith(RESERVED):
        raise StepError(f"A step name cannot start with {RESERVED!r} (the names of durable "
                        f"sleeps and waits for events do): {name!r}.")
    return name


def check_label(value: Any, what: str, limit: int, error: type[Exception]) -> str:
    """``value`` if it is a non-empty string of at most ``limit`` characters with no NUL
    character and no lone surrogate (stored in PostgreSQL as is); else ``error`` saying
    what is wrong with ``what``."""
    if not isinstance(value, str) or not value:
        raise error(f"{what} must be a non-empty string, not {value!r}.")
    if len(value) > limit:
        raise error(f"{what} has at most {limit} characters; {value[:40]!r}… has "
                    f"{len(value)}.")
    if "\x00" in value:
        raise error(f"{what} cannot contain a NUL character: {value!r}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{what} cannot contain a lone surrogate: {value!r}.") from None
    return value


def completed(steps: Any) -> dict[str, dict[str, Any]]:
    """The entries of a task's ``steps`` column by name (the last one, should a name repeat
    across re-runs); anything that is not an entry is ignored."""
    if not isinstance(steps, list):
        return {}
    return {entry["name"]: entry for entry in steps
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)}


def steps_bytes_limit() -> int:
    """The most bytes all of a task's step results may take as JSON."""
    return STEPS_RESULT_FACTOR * int(pgtasks_settings.MAX_RESULT_BYTES)


def results_bytes(steps: Any) -> int:
    """The bytes (as JSON) the results of ``steps`` (a task's kept steps) take."""
    if not isinstance(steps, list):
        return 0
    return sum(len(result_json(entry.get("result"), "A kept step's result")[1])
               for entry in steps if isinstance(entry, dict))


def check_count(count: int, name: str) -> None:
    """:class:`~django_pgtasks.exceptions.StepError` if a task that keeps ``count`` entries
    (steps, sleeps, waits) may not keep one more, ``name``."""
    if count >= MAX_STEPS:
        raise StepError(f"A task keeps at most {MAX_STEPS} steps, sleeps and waits; "
                        f"{name!r} would be one more. Split the work into more tasks.")


def stored_result(value: Any, name: str, count: int, used: int) -> str:
    """The JSON text a step ``name`` that returned ``value`` keeps, beside ``count`` steps
    kept already whose results take ``used`` bytes; else
    :class:`~django_pgtasks.exceptions.UnstorableResultError` (not plain JSON PostgreSQL
    stores unchanged, more than ``PGTASKS["MAX_RESULT_BYTES"]``, or more than
    :func:`steps_bytes_limit` with the other steps' results) or
    :class:`~django_pgtasks.exceptions.StepError` (a step past :data:`MAX_STEPS`)."""
    check_count(count, name)
    try:
        _clean, text = result_json(value, f"The result of step {name!r}")
    except InvalidPayloadError as exc:
        raise UnstorableResultError(str(exc)) from exc
    limit = steps_bytes_limit()
    if used + len(text) > limit:
        raise UnstorableResultError(
            f"The results of the task's steps would take {used + len(text)} bytes as JSON "
            f"with step {name!r}, more than {limit} ({STEPS_RESULT_FACTOR} x "
            f'PGTASKS["MAX_RESULT_BYTES"]); store large data elsewhere and return its id.')
    return text
