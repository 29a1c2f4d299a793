"""How a run that raised ends (``worker/executor.outcome_of``): cancelled, snoozed,
interrupted or failed, with its error text and retry decision. The runs themselves, on real
workers, are tested in ``tests/integration/test_worker.py``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import psycopg.errors
import pytest

from django_pgtasks.definition.handlers import TaskHandler, cancel_signal
from django_pgtasks.exceptions import (
    FatalError,
    HandlerImportError,
    Snooze,
    Suspend,
    TaskCancelled,
    UnknownTaskError,
    WorkerShutdown,
)
from django_pgtasks.lifecycle.transitions import (
    Cancelled,
    Failed,
    Interrupted,
    Snoozed,
    Suspended,
)
from django_pgtasks.models import Task
from django_pgtasks.worker.executor import _one_line, outcome_of, retry_after


def handler(**options: object) -> TaskHandler:
    return TaskHandler(func=lambda: None, name="tests.unit.executed", **options)


def task(attempt: int = 1) -> Task:
    return Task(pk=9, name="tests.unit.executed", attempt=attempt)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.fixture(autouse=True)
def linear_backoff(pgtasks) -> None:
    pgtasks(BACKOFF="linear", BACKOFF_BASE=10.0, BACKOFF_JITTER=0, BACKOFF_MAX=3600.0)


def test_a_failure_is_retried_after_the_handlers_delay_with_its_error_text() -> None:
    outcome = outcome_of(task(attempt=2), handler(), raised(ValueError("bad input 41")))
    assert isinstance(outcome, Failed)
    assert outcome.retry_delay == 20.0
    assert outcome.error.startswith("ValueError: bad input 41\n\nTraceback (most recent call")


@pytest.mark.parametrize("exc", [FatalError("never works"), KeyError("gone")])
def test_a_fatal_error_fails_for_good(exc: BaseException) -> None:
    outcome = outcome_of(task(), handler(fatal=(LookupError,)), raised(exc))
    assert outcome == Failed(outcome.error, None)


def test_an_unknown_task_or_no_handler_fails_for_good() -> None:
    unknown = raised(UnknownTaskError("No task handler is registered under the name 'x'"))
    assert outcome_of(task(), handler(), unknown).retry_delay is None
    assert outcome_of(task(), None, raised(RuntimeError("x"))).retry_delay is None


def test_a_cancellation_ends_cancelled_whatever_was_raised() -> None:
    assert isinstance(outcome_of(task(), handler(), raised(TaskCancelled("stop"))), Cancelled)
    requested = task()
    cancel_signal(requested).set()
    outcome = outcome_of(requested, handler(), raised(RuntimeError("stopped half-way")))
    assert isinstance(outcome, Cancelled)
    assert outcome.error.startswith("RuntimeError: stopped half-way")


@pytest.mark.parametrize(("seconds", "stored"), [(30, 30.0), (timedelta(hours=1), 3600.0)])
def test_a_snooze_is_snoozed_for_its_seconds(seconds: object, stored: float) -> None:
    assert outcome_of(task(), handler(), raised(Snooze(seconds))) == Snoozed(stored)


@pytest.mark.parametrize("exc", [
    HandlerImportError("The module 'app.tasks' raised while being imported"),
    WorkerShutdown("shut down"),
])
def test_an_interruption_is_not_the_handlers_failure(exc: BaseException) -> None:
    outcome = outcome_of(task(), handler(), raised(exc))
    assert isinstance(outcome, Interrupted)
    assert outcome.error.startswith(f"django_pgtasks.exceptions.{type(exc).__name__}: ")


@pytest.mark.parametrize("sqlstate", ["08006", "57P01", "53300"])
def test_a_lost_connection_interrupts_the_run_naming_the_database_error(sqlstate: str) -> None:
    error = psycopg.errors.lookup(sqlstate)("server closed the connection")
    outcome = outcome_of(task(), handler(), raised(error))
    assert isinstance(outcome, Interrupted)
    header = outcome.error.partition("\n")[0]
    assert header == (f"django_pgtasks.exceptions.ConnectionLost: The run lost its database "
                      f"connection ({type(error).__module__}.{type(error).__qualname__}: "
                      f"server closed the connection).")


def test_a_database_error_that_is_no_loss_is_a_failure() -> None:
    error = psycopg.errors.lookup("23505")("duplicate key")
    assert isinstance(outcome_of(task(), handler(), raised(error)), Failed)


def test_the_error_text_is_bounded_and_storable(pgtasks) -> None:
    pgtasks(ERROR_TEXT_LIMIT=100, BACKOFF="linear", BACKOFF_JITTER=0)
    outcome = outcome_of(task(), handler(), raised(ValueError("nul\x00 " + "x" * 500)))
    assert len(outcome.error) <= 100
    assert outcome.error.startswith("ValueError: nul\\x00 ")


def test_a_backoff_that_raises_retries_after_the_longest_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(attempt: int) -> float:
        raise ZeroDivisionError("oops")

    with caplog.at_level(logging.ERROR, logger="django_pgtasks.worker"):
        assert retry_after(handler(backoff=broken), task(), ValueError("x")) == 3600.0
    assert "its backoff policy failed; retrying after BACKOFF_MAX" in caplog.text


def test_a_log_line_shows_one_bounded_line_of_the_error() -> None:
    assert _one_line(raised(KeyError("k"))) == "KeyError: 'k'"
    long = _one_line(raised(ValueError("v" * 1000)))
    assert len(long) == 300
    assert long.endswith("...")


def test_a_durable_sleep_or_wait_is_suspended_not_failed() -> None:
    until = datetime(2030, 1, 2, tzinfo=UTC)
    assert outcome_of(task(), handler(), raised(Suspend(until))) == Suspended(until, False)
    assert outcome_of(task(), handler(), raised(Suspend(None, "k"))) == Suspended(None, True)
    cancelled = task()
    cancel_signal(cancelled).set()  # a cancellation requested meanwhile wins
    assert isinstance(outcome_of(cancelled, handler(), raised(Suspend(until))), Cancelled)
