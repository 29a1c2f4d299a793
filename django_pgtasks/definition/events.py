"""What an event is, before any SQL: its key, its payload, a wait's timeout.

Events are sent with ``Task.objects.send_event(key, payload)`` and waited for by durable
tasks with ``context.wait_for_event(key, timeout)``; the database side is
:mod:`django_pgtasks.lifecycle.events`. What a run keeps of a wait is written in its
task's ``steps`` as entries of reserved names (:data:`~.steps.RESERVED`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django_pgtasks.definition.payload import result_json
from django_pgtasks.definition.steps import RESERVED, check_label
from django_pgtasks.exceptions import InvalidEventError, InvalidPayloadError

#: The longest event key, in characters.
MAX_EVENT_KEY = 200


def check_key(key: Any) -> str:
    """``key`` if it can be an event's key: a non-empty string of at most
    :data:`MAX_EVENT_KEY` characters, no NUL character, no lone surrogate."""
    return check_label(key, "An event key", MAX_EVENT_KEY, InvalidEventError)


def payload_json(payload: Any) -> str:
    """The JSON text of an event's payload: plain JSON PostgreSQL stores unchanged, within
    ``PGTASKS["MAX_RESULT_BYTES"]`` (the payload is kept with each task that receives it)."""
    try:
        return result_json(payload, "The event's payload")[1]
    except InvalidPayloadError as exc:
        raise InvalidEventError(str(exc)) from exc


def received(key: str) -> str:
    """The name of the entry that keeps the payload a wait for ``key`` received."""
    return f"{RESERVED}event {key}"


def timed_out(key: str) -> str:
    """The name of the entry that keeps that a wait for ``key`` timed out."""
    return f"{RESERVED}timeout {key}"


def deadline(key: str) -> str:
    """The name of the entry that keeps the deadline of a wait for ``key``
    (``{"until": <time>}``)."""
    return f"{RESERVED}wait {key}"


def slept(number: int) -> str:
    """The name of the entry of a run's ``number``-th durable sleep (``{"until": <time>}``)."""
    return f"{RESERVED}sleep {number}"


def children(task_id: int, name: str) -> str:
    """The key of the event that tells task ``task_id`` that the tasks of its
    ``run_tasks(name, ...)`` have all ended."""
    digest = hashlib.sha1(name.encode("utf-8"), usedforsecurity=False).hexdigest()[:16]
    return f"pgtasks:tasks:{task_id}:{digest}"
