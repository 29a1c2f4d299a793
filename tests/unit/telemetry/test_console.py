"""``run_pgtasks``'s console (``telemetry/console.py``): Django's line of a state change the
worker logs itself is left out of the console only, while other handlers still get it."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from django_pgtasks.telemetry.console import (
    OneLinePerState,
    logged_by_the_worker,
    show_each_state_once,
    worker_state_signal,
)


def record(name: str = "django.tasks", func: str = "log_task_started") -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, "Task started", None, None,
                             func=func)


@pytest.mark.parametrize(("name", "func", "dropped"), [
    ("django.tasks", "log_task_started", True),
    ("django.tasks", "log_task_finished", True),
    ("django_tasks", "log_task_finished", True),  # the backport's logger
    ("django.tasks", "log_task_enqueued", False),
    ("myapp", "log_task_started", False),
    ("django_pgtasks.worker", "log_task_finished", False),
])
def test_only_djangos_state_lines_sent_by_the_worker_are_left_out(
    name: str, func: str, dropped: bool,
) -> None:
    assert not logged_by_the_worker(record(name, func))  # outside the worker's sending
    with worker_state_signal():
        assert logged_by_the_worker(record(name, func)) is dropped
        assert OneLinePerState().filter(record(name, func)) is not dropped
    assert not logged_by_the_worker(record(name, func))


def test_the_mark_is_cleared_even_if_a_receiver_raises() -> None:
    with pytest.raises(RuntimeError), worker_state_signal():
        raise RuntimeError("receiver")
    assert not logged_by_the_worker(record())


@pytest.fixture
def framework_logger() -> Iterator[logging.Logger]:
    """The logger of Django's tasks framework, and Python's last-resort handler, as they
    were before the test."""
    logger = logging.getLogger("django.tasks")
    saved = logger.handlers[:], logger.propagate
    last_resort = logging.lastResort.filters[:] if logging.lastResort else []
    yield logger
    logger.handlers[:], logger.propagate = saved
    if logging.lastResort:
        logging.lastResort.filters[:] = last_resort


def test_console_handlers_get_the_filter_and_others_do_not(
    framework_logger: logging.Logger,
) -> None:
    console = logging.StreamHandler(sys.stderr)
    to_file_like = logging.StreamHandler(io.StringIO())
    framework_logger.handlers[:] = [console, to_file_like]
    framework_logger.propagate = False
    show_each_state_once()
    show_each_state_once()  # once is enough: no second filter
    assert [type(f) for f in console.filters] == [OneLinePerState]
    assert to_file_like.filters == []
