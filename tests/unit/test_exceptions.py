"""The exceptions (``exceptions.py``): what callers may catch them as, and the values a
``Snooze`` takes."""

from __future__ import annotations

import math
import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, ProgrammingError

from django_pgtasks.exceptions import (
    MAX_SNOOZE_SECONDS,
    ConnectionLost,
    EventTimeout,
    FatalError,
    HandlerImportError,
    InvalidEventError,
    InvalidPayloadError,
    InvalidTaskError,
    NotMigratedError,
    PgTasksError,
    Snooze,
    Suspend,
    TaskInterrupted,
    TaskWaitTimeout,
    UnknownQueueError,
    UnknownTaskError,
    UnstorableResultError,
    WorkerLost,
    WorkerShutdown,
)


@pytest.mark.parametrize(("error", "also"), [
    (InvalidTaskError, (ValueError,)),
    (UnknownTaskError, (InvalidTaskError, LookupError)),
    (UnknownQueueError, (InvalidTaskError, LookupError)),
    (InvalidPayloadError, (InvalidTaskError, TypeError)),
    (UnstorableResultError, (FatalError, TypeError)),
    (WorkerLost, (TaskInterrupted,)),
    (WorkerShutdown, (TaskInterrupted,)),
    (ConnectionLost, (TaskInterrupted,)),
    (HandlerImportError, (TaskInterrupted,)),
    (TaskWaitTimeout, (TimeoutError,)),
    (NotMigratedError, (ProgrammingError, DatabaseError)),
])
def test_each_error_is_caught_as_what_callers_expect(error: type, also: tuple[type, ...]) -> None:
    assert issubclass(error, PgTasksError)
    for base in also:
        assert issubclass(error, base)


def test_an_interruption_is_not_a_failure() -> None:
    assert not issubclass(TaskInterrupted, FatalError)
    assert not issubclass(HandlerImportError, ImportError)


@pytest.mark.parametrize(("seconds", "stored", "message"), [
    (0, 0.0, "Snoozed for 0s."),
    (30, 30.0, "Snoozed for 30s."),
    (1.5, 1.5, "Snoozed for 1.5s."),
    (timedelta(minutes=5), 300.0, "Snoozed for 300s."),
    (MAX_SNOOZE_SECONDS, float(MAX_SNOOZE_SECONDS), "Snoozed for 3.16224e+07s."),
])
def test_a_snooze_keeps_its_seconds(seconds: Any, stored: float, message: str) -> None:
    snooze = Snooze(seconds)
    assert snooze.seconds == stored
    assert type(snooze.seconds) is float
    assert str(snooze) == message


@pytest.mark.parametrize("seconds", [-1, MAX_SNOOZE_SECONDS + 1, math.nan, math.inf, True,
                                     "60", None, timedelta(days=-1), timedelta(days=367)])
def test_a_snooze_of_no_usable_length_is_refused(seconds: Any) -> None:
    with pytest.raises(ValueError, match="Snooze takes 0 to 31622400 seconds or a timedelta"):
        Snooze(seconds)


def test_a_wait_timeout_carries_the_task_as_last_read() -> None:
    marker = object()
    error = TaskWaitTimeout("not finished within 1s", task=marker)
    assert error.task is marker
    assert str(error) == "not finished within 1s"


def test_not_migrated_names_its_database() -> None:
    error = NotMigratedError("run manage.py migrate", alias="queue_a")
    assert error.alias == "queue_a"
    assert str(error) == "run manage.py migrate"


@pytest.mark.parametrize("exc", [
    Snooze(30),
    Suspend(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
    Suspend(None, "order-7"),
    EventTimeout("order-7", 1.5),
    EventTimeout("order-7"),
], ids=repr)
def test_the_control_exceptions_cross_from_a_child_process_as_they_are(exc: Exception) -> None:
    """A process pool's child sends a handler's exception to the worker pickled: the worker
    must get the same snooze, sleep or wait back, not a stand-in error."""
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert vars(copy) == vars(exc)


def test_a_suspension_is_a_snooze_and_an_event_timeout_a_timeout() -> None:
    assert isinstance(Suspend(None), Snooze)
    assert isinstance(EventTimeout("k"), TimeoutError)
    assert isinstance(InvalidEventError("bad"), InvalidTaskError)
