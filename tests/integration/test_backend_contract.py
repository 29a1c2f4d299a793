"""One behavioural contract, run against PgTasksBackend and against Django's ImmediateBackend.

Every test here describes behaviour the two backends share, so a divergence of
PgTasksBackend from Django's own semantics fails a test. "Running" a task means, for
PgTasksBackend, draining the queue with an in-process burst worker and refreshing the result;
ImmediateBackend has already run it inside ``enqueue()``. Behaviour that only PgTasksBackend
has (results from another process, deferral, retries, stricter JSON) is in test_backend.py.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync

compat = pytest.importorskip("django_pgtasks.definition.framework")

from django_pgtasks.backend import PgTasksBackend  # noqa: E402
from django_pgtasks.models import Task as Row  # noqa: E402
from django_pgtasks.worker.loop import Worker  # noqa: E402
from tests.testapp import dj_tasks  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

InvalidTask = compat.InvalidTask
TaskResultStatus = compat.TaskResultStatus


@pytest.fixture(params=["default", "immediate"], ids=["pgtasks", "immediate"])
def alias(request: pytest.FixtureRequest) -> str:
    """The TASKS alias under test: "default" is PgTasksBackend, "immediate" Django's own."""
    return request.param


def run(result: Any) -> Any:
    """Let the backend run what was enqueued; return the result as it is then."""
    if isinstance(result.task.get_backend(), PgTasksBackend):
        assert Worker(burst=True, concurrency=2).run(install_signals=False) == 0
        result.refresh()
    return result


def test_enqueue_returns_a_result_for_the_task(alias: str) -> None:
    result = dj_tasks.add.using(backend=alias).enqueue(2, b=3)
    assert isinstance(result.id, str)
    assert 0 < len(result.id) < 64
    assert result.task.func is dj_tasks.add.func
    assert (result.backend, result.args, result.kwargs) == (alias, [2], {"b": 3})
    assert result.enqueued_at is not None


def test_a_successful_task_has_its_return_value(alias: str) -> None:
    result = run(dj_tasks.add.using(backend=alias).enqueue(2, 3))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert (result.errors, result.attempts, len(result.worker_ids)) == ([], 1, 1)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_a_failing_task_records_its_exception_and_traceback(alias: str) -> None:
    result = run(dj_tasks.fails.using(backend=alias).enqueue("disk full"))
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    [error] = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.rstrip().endswith("ValueError: disk full")
    assert result.finished_at is not None


def test_system_exit_from_a_task_is_a_failure_not_an_exit(alias: str) -> None:
    result = run(dj_tasks.exits.using(backend=alias).enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is SystemExit


def test_async_tasks_run(alias: str) -> None:
    result = run(dj_tasks.async_add.using(backend=alias).enqueue(20, 22))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_a_task_that_takes_context_gets_its_running_result(alias: str) -> None:
    result = run(dj_tasks.context_info.using(backend=alias).enqueue())
    assert result.return_value == {
        "id": result.id, "attempt": 1, "status": "RUNNING", "worker_ids": result.worker_ids,
        "backend": alias,
    }


def test_arguments_arrive_as_they_come_back_from_json(alias: str) -> None:
    args = (1, -2**62, 2.5, "é\u2603", None, True, (1, (2, 3)), {"k": [1, {"n": None}]})
    result = run(dj_tasks.echo.using(backend=alias).enqueue(*args, kw=("a", "b")))
    assert result.return_value == [
        [1, -2**62, 2.5, "é\u2603", None, True, [1, [2, 3]], {"k": [1, {"n": None}]}],
        {"kw": ["a", "b"]},
    ]
    assert result.args[6] == [1, [2, 3]]  # the result shows the arguments as stored


def test_documented_tuple_round_trip_failure(alias: str) -> None:
    """Django's docs: ``double_dictionary.enqueue((1, 2, 3))`` fails, as the tuple arrives as
    a list, which cannot be a dict key."""
    result = run(dj_tasks.double_dictionary.using(backend=alias).enqueue((1, 2, 3)))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].traceback.rstrip().endswith("TypeError: unhashable type: 'list'")


def test_documented_unserializable_argument_raises_type_error(alias: str) -> None:
    """Django's docs: ``process_data.enqueue(datetime.now())`` raises ``TypeError``."""
    with pytest.raises(TypeError):
        dj_tasks.process_data.using(backend=alias).enqueue(datetime.now())
    assert not Row.objects.exists()


def test_an_unserializable_return_value_fails_the_task_with_a_type_error(alias: str) -> None:
    result = run(dj_tasks.returns_object.using(backend=alias).enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert issubclass(result.errors[0].exception_class, TypeError)


@pytest.fixture
def mailoutbox(mailoutbox: list, settings: Any) -> list:
    """pytest-django's outbox, with a mailer configured (Django 6.1 warns when none is)."""
    settings.MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    return mailoutbox


def test_documented_email_example(alias: str, mailoutbox: list) -> None:
    result = run(dj_tasks.email_users.using(backend=alias).enqueue(
        emails=["user@example.com"],
        subject="You have a message",
        message="Hello there!",
    ))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 1)
    [message] = mailoutbox
    assert (message.subject, message.to) == ("You have a message", ["user@example.com"])


def test_documented_email_example_with_context_and_options(alias: str, mailoutbox: list,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    caplog.set_level("DEBUG", logger="tests.testapp.dj_tasks")
    first = run(dj_tasks.email_users_with_context.using(backend=alias).enqueue(
        emails=["a@example.com"], subject="One", message="Hello"))
    second = run(dj_tasks.email_users_on_the_emails_queue.using(backend=alias).enqueue(
        emails=["b@example.com"], subject="Two", message="Hello"))
    assert (first.return_value, second.return_value) == (1, 1)
    assert second.task.queue_name == "emails"
    assert second.task.priority == 2
    assert f"Attempt 1 to send user email. Task result id: {first.id}." in caplog.text
    assert sorted(m.subject for m in mailoutbox) == ["One", "Two"]


def test_documented_using_example() -> None:
    assert dj_tasks.email_users.priority == 0
    assert dj_tasks.email_users.using(priority=10).priority == 10


@pytest.mark.parametrize("priority", [-101, 101, 1.5])
def test_a_priority_out_of_range_is_invalid(alias: str, priority: float) -> None:
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and"):
        dj_tasks.add.using(backend=alias, priority=priority)


def test_the_priority_bounds_are_valid(alias: str) -> None:
    """The lowest and the highest priority are accepted, kept with the task (also when its
    result is read back) and run."""
    for priority in (-100, 100):
        task = dj_tasks.add.using(backend=alias, priority=priority)
        assert task.priority == priority
        result = run(task.enqueue(priority, 1))
        assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL,
                                                        priority + 1)
        assert result.task.priority == priority
        if compat.task_backends[alias].supports_get_result:
            assert task.get_result(result.id).task.priority == priority


def test_an_unknown_queue_is_invalid(alias: str) -> None:
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid for backend"):
        dj_tasks.add.using(backend=alias, queue_name="nope")
    assert not Row.objects.exists()


def test_a_task_function_must_be_defined_at_module_level(alias: str) -> None:
    def local() -> None: ...

    with pytest.raises(InvalidTask, match="Task function must be defined at a module level"):
        compat.task(backend=alias)(local)


def test_takes_context_needs_a_context_argument(alias: str) -> None:
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        compat.task(backend=alias, takes_context=True)(module_level_without_context)


def module_level_without_context(x: int) -> None: ...


@pytest.fixture
def signals_seen() -> Iterator[list[tuple[str, Any, str, str, Any]]]:
    """(signal, sender, result id, status, exception being handled) for each signal sent."""
    seen: list[tuple[str, Any, str, str, Any]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, task_result.id, str(task_result.status),
                         sys.exc_info()[0]))
        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    compat.task_enqueued.connect(receivers["enqueued"])
    compat.task_started.connect(receivers["started"])
    compat.task_finished.connect(receivers["finished"])
    yield seen
    compat.task_enqueued.disconnect(receivers["enqueued"])
    compat.task_started.disconnect(receivers["started"])
    compat.task_finished.disconnect(receivers["finished"])


def test_signals_are_sent_with_the_backend_class_as_sender(alias: str, signals_seen: list
                                                           ) -> None:
    good = dj_tasks.add.using(backend=alias).enqueue(1, 2)
    bad = dj_tasks.fails.using(backend=alias).enqueue()
    run(good)
    run(bad)
    sender = type(good.task.get_backend())
    per_result = {
        result.id: [(name, s, status, exc) for name, s, rid, status, exc in signals_seen
                    if rid == result.id]
        for result in (good, bad)
    }
    assert per_result[good.id] == [
        ("enqueued", sender, "READY", None),
        ("started", sender, "RUNNING", None),
        ("finished", sender, "SUCCESSFUL", None),
    ]
    # task_finished for a failure is sent while the exception is being handled, so that
    # receivers such as Django's own logging can attach its traceback.
    assert per_result[bad.id] == [
        ("enqueued", sender, "READY", None),
        ("started", sender, "RUNNING", None),
        ("finished", sender, "FAILED", ValueError),
    ]


def test_floats_come_back_as_floats(alias: str) -> None:
    floats = [0.1, 1e-05, 2.0, 1234567890.125, -3.5e-200]
    result = run(dj_tasks.echo.using(backend=alias).enqueue(*floats))
    assert result.return_value[0] == floats
    assert all(type(x) is float for x in result.return_value[0])


# -- ported from Django's tests/tasks (test_immediate_backend.py, test_tasks.py) -------------
#
# What applies to a database backend: enqueue (sync and async), results, exceptions, signals.
# Django's own tests of the logging are elsewhere; what does not apply is listed, with the
# reason, in docs/django-tasks.md ("Django's contract tests").


def needs_results(alias: str) -> None:
    """Django's ImmediateBackend keeps no results (its test_cannot_get_result)."""
    if not compat.task_backends[alias].supports_get_result:
        pytest.skip(f"the backend {alias!r} keeps no results")


@pytest.mark.parametrize("task", [dj_tasks.noop, dj_tasks.async_noop], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
def test_enqueue_runs_sync_and_async_tasks(alias: str, task: Any, how: str) -> None:
    task = task.using(backend=alias)
    enqueue = task.enqueue if how == "enqueue" else async_to_sync(task.aenqueue)
    result = run(enqueue(1, two=3))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished is True
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.return_value is None
    assert result.task == task
    assert (result.args, result.kwargs, result.attempts) == ([1], {"two": 3}, 1)


def test_the_result_of_the_backend_enqueue_call(alias: str) -> None:
    backend = compat.task_backends[alias]
    result = run(backend.enqueue(dj_tasks.calculate_meaning_of_life.using(backend=alias), [], {}))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    result = run(async_to_sync(backend.aenqueue)(
        dj_tasks.calculate_meaning_of_life.using(backend=alias), [], {}))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_a_complex_exception_is_recorded(alias: str) -> None:
    result = run(dj_tasks.complex_exception.using(backend=alias).enqueue())
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert (result.args, result.kwargs) == ([], {})


def test_a_system_exit_is_recorded_with_its_message(alias: str) -> None:
    result = run(dj_tasks.exits.using(backend=alias).enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].traceback.rstrip().endswith("SystemExit: 3")
    assert result.started_at <= result.finished_at


def test_aenqueue_refuses_an_unserializable_argument(alias: str) -> None:
    with pytest.raises(TypeError):
        async_to_sync(dj_tasks.noop.using(backend=alias).aenqueue)(datetime.now())
    assert not Row.objects.exists()


@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
def test_the_task_is_validated_again_on_enqueue(alias: str, how: str) -> None:
    # A task whose queue became invalid after using() (Django's test_validate_on_enqueue).
    task = dj_tasks.noop.using(backend=alias)
    object.__setattr__(task, "queue_name", "unknown_queue")  # past the checks of using()
    enqueue = task.enqueue if how == "enqueue" else async_to_sync(task.aenqueue)
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        enqueue()
    assert not Row.objects.exists()


def test_a_task_gets_its_own_result_id_from_the_context(alias: str) -> None:
    result = run(dj_tasks.context_info.using(backend=alias).enqueue())
    assert result.return_value["id"] == result.id
    assert result.return_value["attempt"] == 1


@pytest.mark.parametrize("how", ["sync", "async"])
def test_get_result_returns_the_enqueued_result(alias: str, how: str) -> None:
    needs_results(alias)
    task = dj_tasks.noop.using(backend=alias)
    backend = task.get_backend()
    if how == "sync":
        result = backend.enqueue(task, (), {})
        fetched = task.get_result(result.id)
    else:
        result = async_to_sync(backend.aenqueue)(task, (), {})
        fetched = async_to_sync(task.aget_result)(result.id)
    assert fetched == result
    assert fetched.task == task
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs) == (
        result.id, TaskResultStatus.READY, [], {})


def test_get_result_of_a_missing_result_raises(alias: str) -> None:
    needs_results(alias)
    task = dj_tasks.noop.using(backend=alias)
    with pytest.raises(compat.TaskResultDoesNotExist):
        task.get_result("123")
    with pytest.raises(compat.TaskResultDoesNotExist):
        async_to_sync(task.aget_result)("123")


def test_get_result_of_another_task_raises_a_mismatch(alias: str) -> None:
    needs_results(alias)
    backend = compat.task_backends[alias]
    result = backend.enqueue(dj_tasks.async_noop.using(backend=alias), (), {})
    noop = dj_tasks.noop.using(backend=alias)
    with pytest.raises(compat.TaskResultMismatch, match="Task does not match"):
        noop.get_result(result.id)
    with pytest.raises(compat.TaskResultMismatch, match="Task does not match"):
        async_to_sync(noop.aget_result)(result.id)


def test_refresh_of_an_unchanged_result_changes_nothing(alias: str) -> None:
    needs_results(alias)
    result = async_to_sync(dj_tasks.noop.using(backend=alias).aenqueue)()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_aenqueue_sends_task_enqueued(alias: str, signals_seen: list) -> None:
    result = async_to_sync(dj_tasks.noop.using(backend=alias).aenqueue)()
    sender = type(result.task.get_backend())
    assert signals_seen[0] == ("enqueued", sender, result.id, "READY", None)
# Django's log records of each task (Django's tests/tasks: test_enqueue_logs,
# test_started_finished_logs, test_failed_logs, test_complex_return_value): every record
# Django emits on its logger reaches its handlers, also from a worker.


@pytest.fixture
def framework_logs(caplog: pytest.LogCaptureFixture) -> Any:
    """The records on Django's tasks logger ("django.tasks"; the backport's "django_tasks"),
    as (level, message, exception class) for one result id, in order."""
    caplog.set_level(logging.DEBUG, logger=compat.TASKS_MODULE)

    def of(result: Any) -> list[tuple[int, str, Any]]:
        return [(r.levelno, r.getMessage(), r.exc_info[0] if r.exc_info else None)
                for r in caplog.records
                if r.name == compat.TASKS_MODULE and f"id={result.id} " in r.getMessage()]

    return of


def test_enqueue_logs(alias: str, framework_logs: Any) -> None:
    result = dj_tasks.add.using(backend=alias).enqueue(1, 2)
    level, message, _ = framework_logs(result)[0]
    assert level == logging.DEBUG
    assert "enqueued" in message
    assert f"backend={alias}" in message


def test_started_finished_logs(alias: str, framework_logs: Any) -> None:
    result = run(dj_tasks.add.using(backend=alias).enqueue(1, 2))
    assert [(level, message.rpartition(" ")[2], exc)
            for level, message, exc in framework_logs(result)] == [
        (logging.DEBUG, f"backend={alias}", None),
        (logging.INFO, "state=RUNNING", None),
        (logging.INFO, "state=SUCCESSFUL", None),
    ]
    assert "path=tests.testapp.dj_tasks.add" in framework_logs(result)[1][1]


def test_failed_logs(alias: str, framework_logs: Any) -> None:
    result = run(dj_tasks.fails.using(backend=alias).enqueue("disk full"))
    assert [(level, message.rpartition(" ")[2], exc)
            for level, message, exc in framework_logs(result)] == [
        (logging.DEBUG, f"backend={alias}", None),
        (logging.INFO, "state=RUNNING", None),
        (logging.ERROR, "state=FAILED", ValueError),  # with the task's traceback
    ]


def test_complex_return_value_logs_an_error(alias: str, framework_logs: Any) -> None:
    result = run(dj_tasks.returns_object.using(backend=alias).enqueue())
    assert result.status == TaskResultStatus.FAILED
    level, message, exc = framework_logs(result)[-1]
    assert (level, message.rpartition(" ")[2]) == (logging.ERROR, "state=FAILED")
    assert issubclass(exc, TypeError)


def test_a_handler_of_the_framework_logger_gets_every_record(alias: str) -> None:
    """What a project's LOGGING attaches to Django's tasks logger (a file, Sentry) gets the
    state changes of tasks run by a worker too: none is filtered out on the logger."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(compat.TASKS_MODULE)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        good = run(dj_tasks.add.using(backend=alias).enqueue(1, 2))
        bad = run(dj_tasks.fails.using(backend=alias).enqueue())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    states = [(r.getMessage().split()[1], r.getMessage().rpartition(" ")[2], r.levelname)
              for r in records]
    assert states == [
        (f"id={good.id}", f"backend={alias}", "DEBUG"),
        (f"id={good.id}", "state=RUNNING", "INFO"),
        (f"id={good.id}", "state=SUCCESSFUL", "INFO"),
        (f"id={bad.id}", f"backend={alias}", "DEBUG"),
        (f"id={bad.id}", "state=RUNNING", "INFO"),
        (f"id={bad.id}", "state=FAILED", "ERROR"),
    ]
