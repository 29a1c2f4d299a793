"""PgTasksBackend's own decisions (``backend/backend.py``), before any SQL: what it
supports, which tasks it refuses, its retry delays and its system checks. What it stores and
how workers run it is tested in ``tests/integration/test_backend.py``."""

from __future__ import annotations

import dataclasses
import logging
import math
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import override_settings

compat = pytest.importorskip("django_pgtasks.definition.framework")

from django_pgtasks.backend import PgTasksBackend, RetryableTask  # noqa: E402
from tests.testapp import dj_tasks  # noqa: E402

InvalidTask = compat.InvalidTask
RESULT = SimpleNamespace(id="7")  # what the retry delay passes on to a callable backoff


def backend(**options: Any) -> PgTasksBackend:
    return PgTasksBackend("default", {"QUEUES": ["default", "emails"], **options})


def check_ids(**tasks_options: Any) -> list[str]:
    return [message.id for message in backend(**tasks_options).check()]


def test_feature_flags_and_task_class() -> None:
    default = compat.task_backends["default"]
    assert isinstance(default, PgTasksBackend)
    assert (default.supports_defer, default.supports_priority, default.supports_get_result,
            default.supports_async_task) == (True, True, True, True)
    assert isinstance(dj_tasks.add, RetryableTask)


# -- tasks refused before any SQL -----------------------------------------------------------


def test_a_queue_of_tasks_but_not_of_pgtasks_is_invalid(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "QUEUES": ["default"]}
    with pytest.raises(InvalidTask, match=r"Queue 'emails' is not in PGTASKS\['QUEUES'\] "
                                          r"\(default\), so no worker would run the task\."):
        backend().validate_task(dj_tasks.add.using(queue_name="emails"))


TOO_LATE = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))  # 10000 in UTC


def test_a_run_after_outside_the_years_python_holds_is_invalid() -> None:
    with pytest.raises(InvalidTask, match="outside the years 1 to 9999 in UTC"):
        backend().validate_task(dj_tasks.add.using(run_after=TOO_LATE))
    backend().validate_task(dj_tasks.add.using(run_after=datetime(2030, 1, 1, tzinfo=UTC)))


def test_a_module_path_longer_than_the_name_column_is_refused_when_the_task_is_made() -> None:
    with pytest.raises(InvalidTask, match="module path is longer than 255 characters"):
        dataclasses.replace(dj_tasks.add, func=_renamed(dj_tasks.add.func, "f" * 260))


def _renamed(func: Any, name: str) -> Any:
    def renamed(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    renamed.__module__ = func.__module__
    renamed.__qualname__ = renamed.__name__ = name
    return renamed


# -- retry delays -----------------------------------------------------------------------------


@pytest.mark.parametrize(("backoff", "attempt", "delay"), [
    ("linear", 3, 30.0),
    ("exponential", 3, 40.0),
    (None, 2, 20.0),  # the backend's OPTIONS, then PGTASKS["BACKOFF"] (exponential)
    (lambda exception, result: 12.5, 1, 12.5),
    (lambda exception, result: timedelta(minutes=2), 1, 120.0),
    (lambda exception, result: 0, 1, 0.0),
    (lambda exception, result: math.inf, 1, 3600.0),  # BACKOFF_MAX bounds every delay
    (lambda exception, result: 10**9, 1, 3600.0),
])
def test_the_retry_delay_follows_the_tasks_backoff(
    pgtasks, backoff: Any, attempt: int, delay: float,
) -> None:
    pgtasks(BACKOFF_BASE=10.0, BACKOFF_JITTER=0, BACKOFF_MAX=3600.0)
    task = dataclasses.replace(dj_tasks.fails, backoff=backoff)
    assert backend().retry_delay(task, ValueError("x"), RESULT, attempt) == delay


@pytest.mark.parametrize("returned", [None, -1, "soon", math.nan, True, timedelta(seconds=-1)])
def test_a_backoff_that_returns_no_usable_delay_stops_the_retries(
    caplog: pytest.LogCaptureFixture, returned: Any,
) -> None:
    task = dataclasses.replace(dj_tasks.fails, backoff=lambda exception, result: returned)
    with caplog.at_level(logging.ERROR, logger="django_pgtasks.backend"):
        assert backend().retry_delay(task, ValueError("x"), RESULT, 1) is None
    if returned is None:  # None is the documented way to stop: nothing to log
        assert caplog.records == []
    else:
        assert f"its backoff returned {returned!r}, not a non-negative number" in caplog.text


def test_a_backoff_that_raises_stops_the_retries_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(exception: BaseException, task_result: Any) -> float:
        raise ZeroDivisionError("oops")

    task = dataclasses.replace(dj_tasks.fails, backoff=broken)
    with caplog.at_level(logging.ERROR, logger="django_pgtasks.backend"):
        assert backend().retry_delay(task, ValueError("x"), RESULT, 1) is None
    assert "Task id=7 name=tests.testapp.dj_tasks.fails: its backoff raised" in caplog.text


def test_the_backends_options_give_the_default_backoff(pgtasks) -> None:
    pgtasks(BACKOFF_BASE=4.0, BACKOFF_JITTER=0)
    seen: list[Any] = []

    def by_options(exception: BaseException, task_result: Any) -> float:
        seen.append((exception, task_result))
        return 9.0

    error = ValueError("x")
    assert backend(OPTIONS={"BACKOFF": "linear"}).retry_delay(
        dj_tasks.fails, error, RESULT, 2) == 8.0
    assert backend(OPTIONS={"BACKOFF": by_options}).retry_delay(
        dj_tasks.fails, error, RESULT, 2) == 9.0
    assert seen == [(error, RESULT)]


# -- system checks ----------------------------------------------------------------------------


def test_check_reports_a_non_postgresql_database(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "DATABASE": "not_postgres"}
    [error] = PgTasksBackend("default", {}).check()
    assert error.id == "django_pgtasks.E102"
    assert "needs PostgreSQL, but the database 'not_postgres'" in error.msg


def test_check_reports_an_unknown_database(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "DATABASE": "nowhere"}
    [error] = PgTasksBackend("default", {}).check()
    assert error.id == "django_pgtasks.E102"
    assert "'nowhere' (PGTASKS['DATABASE']), which is not an alias in DATABASES" in error.msg


def test_check_reports_a_missing_app() -> None:
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes", "tests.testapp"]):
        assert check_ids() == ["django_pgtasks.E101"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, []),
        ({"QUEUES": ["default", "bulk"]}, ["django_pgtasks.E103"]),
        ({"OPTIONS": {"MAX_ATTEMPT": 3}}, ["django_pgtasks.E104"]),
        ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, ["django_pgtasks.E105"]),
        ({"OPTIONS": {"BACKOFF": "fibonacci"}}, ["django_pgtasks.E105"]),
        ({"OPTIONS": {"MAX_ATTEMPTS": 5, "BACKOFF": "linear"}}, []),
    ],
)
def test_check_reports_queue_and_option_problems(params: dict, expected: list[str]) -> None:
    assert check_ids(**params) == expected
