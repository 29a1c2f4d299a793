"""``Task.objects.build()`` (``models/manager.py``): a validated, unsaved task, every option
resolved (the call's, else the handler's, else the settings'), before any SQL. What the
enqueue methods then write is tested in ``tests/integration/test_enqueue.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_pgtasks import pgtask
from django_pgtasks.exceptions import (
    InvalidPayloadError,
    InvalidTaskError,
    UnknownQueueError,
    UnknownTaskError,
)
from django_pgtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.usefixtures("temporary_handlers")


def plain_function(x: int) -> int:
    return x


def test_a_built_task_is_unsaved_with_the_settings_defaults() -> None:
    task = Task.objects.build(tasks.add, 1, b=2)
    assert task.pk is None
    assert task._state.adding
    assert (task.name, task.queue, task.args, task.kwargs) == (tasks.add.name, "default", [1],
                                                               {"b": 2})
    assert (task.priority, task.max_attempts) == (100, 3)  # DEFAULT_PRIORITY, MAX_ATTEMPTS
    assert (task.key, task.stage, task.concurrency_key, task.concurrency_limit) == (
        None, None, None, None)


def test_the_calls_options_win_over_the_handlers_which_win_over_the_settings(pgtasks) -> None:
    pgtasks(DEFAULT_QUEUE="urgent", DEFAULT_PRIORITY=50, MAX_ATTEMPTS=9)
    handler = pgtask(name="tests.unit.opinionated", queue="emails", priority=150,
                     max_attempts=2)(plain_function)
    built = Task.objects.build(tasks.add, 1, 2)
    assert (built.queue, built.priority, built.max_attempts) == ("urgent", 50, 9)
    built = Task.objects.build(handler, 1)
    assert (built.queue, built.priority, built.max_attempts) == ("emails", 150, 2)
    built = Task.objects.build(handler, 1, queue="default", priority=0, max_attempts=1)
    assert (built.queue, built.priority, built.max_attempts) == ("default", 0, 1)


def test_a_registered_name_builds_like_its_handler() -> None:
    assert Task.objects.build(tasks.add.name, 1, 2).name == tasks.add.name


@pytest.mark.parametrize(("target", "error", "words"), [
    (plain_function, UnknownTaskError, "is not a task: decorate the function with @pgtask"),
    ("nowhere.missing", UnknownTaskError, "No task handler is registered"),
    (42, UnknownTaskError, "42 is not a task"),
])
def test_what_is_not_a_task_is_refused(target: Any, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        Task.objects.build(target, 1)


@pytest.mark.parametrize(("options", "error", "words"), [
    ({"queue": "nope"}, UnknownQueueError, "Queue 'nope' is not configured"),
    ({"priority": 201}, InvalidTaskError, "Priority must be an integer from 0 to 200"),
    ({"max_attempts": 0}, InvalidTaskError, "max_attempts must be an integer from 1 to 1000"),
    ({"key": ""}, InvalidTaskError, "key must be a string of 1 to 255 characters"),
    ({"stage": "s" * 101}, InvalidTaskError, "stage must be a string of 1 to 100 characters"),
    ({"delay": -1}, InvalidTaskError, "delay must be a non-negative number of seconds"),
    ({"run_after": datetime(2030, 1, 1)}, InvalidTaskError, "timezone-aware datetime"),
    ({"concurrency_limit": 2}, InvalidTaskError, "concurrency_limit needs a concurrency_key"),
])
def test_bad_options_are_refused_before_any_sql(options: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        Task.objects.build(tasks.add, 1, 2, **options)


def test_arguments_are_checked_against_the_payload_rules_and_the_signature() -> None:
    with pytest.raises(InvalidPayloadError, match="Task argument args\\[0\\] is nan"):
        Task.objects.build(tasks.add, float("nan"), 2)
    with pytest.raises(InvalidTaskError, match="missing a required argument: 'b'"):
        Task.objects.build(tasks.add, 1)


def test_run_after_is_kept_and_a_delay_is_left_to_the_database_clock() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert Task.objects.build(tasks.add, 1, 2, run_after=when).run_after == when
    delayed = Task.objects.build(tasks.add, 1, 2, delay=timedelta(minutes=5))
    assert delayed._delay_seconds == 300.0
    assert not isinstance(delayed.run_after, datetime)  # now() + 5 minutes, in the INSERT
    assert "_delay_seconds" not in Task.objects.build(tasks.add, 1, 2, delay=0).__dict__


def test_the_validated_json_is_kept_for_the_insert() -> None:
    task = Task.objects.build(tasks.add, 1, b=(2,))
    assert task.kwargs == {"b": [2]}  # made plain JSON
    assert task._payload_json[2:] == ("[1]", '{"b":[2]}')


def test_a_concurrency_key_gets_a_limit_of_one() -> None:
    task = Task.objects.build(tasks.add, 1, 2, concurrency_key="user-1")
    assert (task.concurrency_key, task.concurrency_limit) == ("user-1", 1)


def test_built_tasks_share_no_mutable_default() -> None:
    first, second = Task.objects.build(tasks.add, 1, 2), Task.objects.build(tasks.add, 3, 4)
    first.metadata["x"] = 1
    assert second.metadata == {}
    assert first.args is not second.args
