"""The retry options of a Django task and of the backend (``backend/options.py``), refused
when the task is defined."""

from __future__ import annotations

from typing import Any

import pytest

compat = pytest.importorskip("django_pgtasks.definition.framework")

from django_pgtasks.backend.options import RetryableTask, retry_option_errors  # noqa: E402

InvalidTask = compat.InvalidTask
task = compat.task


def module_level() -> None:
    """A module-level function for tests that build tasks with invalid options."""


def two_arguments(exception: BaseException, task_result: Any) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 1000, not 0."),
        ({"max_attempts": "3"}, "max_attempts must be an integer from 1 to 1000, not '3'."),
        ({"backoff": "fibonacci"}, "backoff 'fibonacci' is not a retry policy"),
        ({"backoff": 30}, "backoff must be a policy name or a callable"),
        ({"backoff": lambda attempt: 10}, r"backoff must accept two arguments, \(exception, task"),
    ],
)
def test_invalid_retry_options_are_refused_when_the_task_is_defined(options: dict,
                                                                    message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        task(**options)(module_level)


@pytest.mark.parametrize(("max_attempts", "backoff"), [
    (None, None), (1, "linear"), (1000, "exponential"), (3, two_arguments),
    (2, lambda exception, task_result=None, *rest: None),
    (5, print),  # a builtin whose signature takes anything
])
def test_valid_retry_options_have_no_error(max_attempts: Any, backoff: Any) -> None:
    assert retry_option_errors(max_attempts, backoff) == []


@pytest.mark.parametrize("max_attempts", [0, 1001, True, 2.0, "3"])
def test_max_attempts_must_be_an_integer_in_range(max_attempts: Any) -> None:
    [error] = retry_option_errors(max_attempts, None)
    assert error == f"max_attempts must be an integer from 1 to 1000, not {max_attempts!r}."


def test_both_problems_are_reported_under_the_names_given() -> None:
    assert retry_option_errors(0, "fibonacci", ("OPTIONS['MAX_ATTEMPTS']",
                                                "OPTIONS['BACKOFF']")) == [
        "OPTIONS['MAX_ATTEMPTS'] must be an integer from 1 to 1000, not 0.",
        "OPTIONS['BACKOFF'] 'fibonacci' is not a retry policy; use one of ['exponential', "
        "'linear'] or a callable backoff(exception, task_result).",
    ]


def test_a_task_keeps_its_retry_options_through_using() -> None:
    defined = task(max_attempts=4, backoff="linear")(module_level)
    assert isinstance(defined, RetryableTask)
    moved = defined.using(priority=5)
    assert (moved.max_attempts, moved.backoff, moved.priority) == (4, "linear", 5)
