"""How long the pool lets a task run before the watchdog fails it (``worker/watchdog.py``)."""

from __future__ import annotations

import pytest

from django_pgtasks import pgtask
from django_pgtasks.models import Task
from django_pgtasks.worker.watchdog import ASYNC_CANCEL_MARGIN, time_limit

pytestmark = pytest.mark.usefixtures("temporary_handlers")


def test_a_handler_without_a_timeout_has_no_limit() -> None:
    pgtask(name="tests.unit.unlimited")(lambda: None)
    assert time_limit(Task(name="tests.unit.unlimited")) is None


def test_a_sync_handler_is_stopped_at_its_timeout() -> None:
    pgtask(name="tests.unit.bounded", timeout=2.5)(lambda: None)
    assert time_limit(Task(name="tests.unit.bounded")) == 2.5


def test_an_async_handler_gets_a_margin_to_cancel_itself_first() -> None:
    async def handler() -> None:
        pass

    pgtask(name="tests.unit.bounded_async", timeout=2)(handler)
    assert time_limit(Task(name="tests.unit.bounded_async")) == 2 + ASYNC_CANCEL_MARGIN


def test_a_task_of_an_unknown_name_has_no_limit() -> None:
    assert time_limit(Task(name="nowhere.unknown")) is None
