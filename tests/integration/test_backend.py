"""PgTasksBackend, the ``django.tasks`` backend: what it stores, how the worker runs it, what
only it does (results from other processes, deferral, priorities, retries, strict JSON), its
system checks, and worker processes draining Django tasks. Behaviour shared with Django's
ImmediateBackend is in test_backend_contract.py."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

compat = pytest.importorskip("django_pgtasks.definition.framework")

from asgiref.sync import async_to_sync  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import Count  # noqa: E402

from django_pgtasks import signals as native_signals  # noqa: E402
from django_pgtasks.backend import (  # noqa: E402
    DjangoTaskHandler,
    InvalidTaskArguments,
    PgTasksBackend,
    resolve,
)
from django_pgtasks.definition.registry import get_handler  # noqa: E402
from django_pgtasks.models import Status  # noqa: E402
from django_pgtasks.models import Task as Row  # noqa: E402
from django_pgtasks.worker.loop import Worker  # noqa: E402
from tests.testapp import dj_tasks, tasks  # noqa: E402
from tests.testapp.models import Execution  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist
TaskResultStatus = compat.TaskResultStatus
task = compat.task
default_backend = compat.task_backends["default"]


def drain(**options: Any) -> Worker:
    worker = Worker(burst=True, concurrency=options.pop("concurrency", 2), **options)
    assert worker.run(install_signals=False) == 0
    return worker


def module_level() -> None:
    """A module-level function for tests that build tasks with invalid options."""


# -- the backend and what it stores -------------------------------------------------------


def test_enqueue_is_one_insert_into_the_native_table(django_assert_num_queries) -> None:
    with django_assert_num_queries(1):
        result = dj_tasks.add.enqueue(1, b=2)
    row = Row.objects.get()
    assert (row.name, row.queue, row.args, row.kwargs) == (
        "tests.testapp.dj_tasks.add", "default", [1], {"b": 2})
    assert (row.status, row.priority, row.max_attempts, row.attempt) == (Status.READY, 100, 1, 0)
    assert row.metadata == {"django_tasks": {"backend": "default"}}
    assert result.id == str(row.pk)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == row.created_at  # returned by the INSERT: the database clock
    assert (result.started_at, result.finished_at, result.worker_ids) == (None, None, [])


def test_the_enqueue_signals_of_both_apis_are_sent() -> None:
    seen: list[tuple[str, Any]] = []

    def on_native(sender: Any, task: Row, **kwargs: Any) -> None:
        seen.append(("native", sender, task.name))

    def on_django(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(("django", sender, task_result.task.module_path))

    native_signals.task_enqueued.connect(on_native)
    compat.task_enqueued.connect(on_django)
    try:
        dj_tasks.add.enqueue(1, 2)
    finally:
        native_signals.task_enqueued.disconnect(on_native)
        compat.task_enqueued.disconnect(on_django)
    assert seen == [("native", Row, "tests.testapp.dj_tasks.add"),
                    ("django", PgTasksBackend, "tests.testapp.dj_tasks.add")]


def test_enqueue_happens_in_the_callers_transaction() -> None:
    with transaction.atomic():
        dj_tasks.add.enqueue(1, 2)
        transaction.set_rollback(True)
    assert not Row.objects.exists()
    # Django's documented on_commit pattern works unchanged.
    with transaction.atomic():
        transaction.on_commit(partial(dj_tasks.add.enqueue, a=1, b=2))
        assert not Row.objects.exists()
    assert Row.objects.get().kwargs == {"a": 1, "b": 2}


@pytest.mark.parametrize(("django", "native"),
                         [(-100, 0), (-1, 99), (0, 100), (2, 102), (100, 200)])
def test_priority_maps_to_native_plus_100(django: int, native: int) -> None:
    result = dj_tasks.add.using(priority=django).enqueue(1, 1)
    assert Row.objects.get().priority == native
    assert dj_tasks.add.get_result(result.id).task.priority == django


def test_higher_django_priority_runs_first_alongside_native_tasks() -> None:
    low = dj_tasks.add.using(priority=-50).enqueue(1, 1)
    native = tasks.add.enqueue(1, 1, priority=120)  # Django priority 20 in native terms
    high = dj_tasks.add.using(priority=50).enqueue(1, 1)
    claimed = Row.objects.claim("w", limit=3)
    assert [t.pk for t in claimed] == [int(high.id), native.pk, int(low.id)]


def test_queue_name_becomes_the_native_queue() -> None:
    dj_tasks.email_users_on_the_emails_queue.enqueue(emails=[], subject="s", message="m")
    assert (Row.objects.get().queue, Row.objects.get().priority) == ("emails", 102)


def test_a_queue_of_tasks_but_not_of_pgtasks_is_invalid(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "QUEUES": ["default"]}
    with pytest.raises(InvalidTask, match=r"Queue 'emails' is not in PGTASKS\['QUEUES'\]"):
        dj_tasks.add.using(queue_name="emails")
    assert not Row.objects.exists()


def test_run_after_defers_the_task() -> None:
    when = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    result = dj_tasks.add.using(run_after=when).enqueue(1, 2)
    assert Row.objects.get().run_after == when
    drain()  # nothing is due
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == when
    assert dj_tasks.add.get_result(result.id).task.run_after == when


def test_a_task_that_is_not_deferred_has_no_run_after() -> None:
    result = dj_tasks.add.enqueue(1, 2)
    assert dj_tasks.add.get_result(result.id).task.run_after is None


# -- strict JSON: what is refused at enqueue, with nothing written -------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((math.nan,), {}, r"Task argument args\[0\] is nan; NaN and Infinity are not valid JSON"),
        ((), {"x": math.inf}, "Task argument 'x' is inf; NaN and Infinity are not valid JSON"),
        (({1: "one"},), {}, "has a dict key 1 of type int; JSON object keys must be strings"),
        ((object(),), {}, r"args\[0\] of type object is not JSON-serializable"),
        ((b"bytes",), {}, r"args\[0\] of type bytes is not JSON-serializable"),
        (({1, 2},), {}, r"args\[0\] of type set is not JSON-serializable"),
        ((datetime(2030, 1, 1, tzinfo=UTC),), {}, "of type datetime is not JSON-serializable"),
        ((["a\x00b"],), {}, "contains a NUL character"),
        ((1e16,), {}, r"args\[0\] is 1e\+16, a float that PostgreSQL's jsonb gives back as an"),
        ((), {"x": {"y": [2.5e300]}}, r"Task argument 'x'\['y'\]\[0\] is 2.5e\+300"),
    ],
)
def test_arguments_that_would_not_come_back_unchanged_are_refused(
    args: tuple, kwargs: dict, message: str
) -> None:
    with pytest.raises(InvalidTaskArguments, match=message) as excinfo:
        dj_tasks.echo.enqueue(*args, **kwargs)
    assert isinstance(excinfo.value, InvalidTask)  # Django's exception ...
    assert isinstance(excinfo.value, TypeError)  # ... and what Django raises for such values
    assert str(excinfo.value).endswith(".")
    assert not Row.objects.exists()


def test_invalid_tasks_are_refused_with_djangos_exception_and_nothing_written() -> None:
    def local() -> None: ...

    cases: list[Callable[[], Any]] = [
        lambda: dj_tasks.add.using(priority=101),
        lambda: dj_tasks.add.using(priority=-101),
        lambda: dj_tasks.add.using(queue_name="unknown"),
        lambda: task(local),
        lambda: dj_tasks.add.using(run_after=datetime(2030, 1, 1)),  # naive, with USE_TZ
    ]
    for case in cases:
        with pytest.raises(InvalidTask):
            case()
    assert not Row.objects.exists()


# -- results --------------------------------------------------------------------------------


def test_get_result_rebuilds_the_task_so_identity_checks_pass() -> None:
    result = dj_tasks.add.enqueue(2, 3)
    drain()
    for fetched in (dj_tasks.add.get_result(result.id), default_backend.get_result(result.id),
                    async_to_sync(dj_tasks.add.aget_result)(result.id)):
        assert fetched.task.func is dj_tasks.add.func
        assert (fetched.id, fetched.status, fetched.return_value) == (
            result.id, TaskResultStatus.SUCCESSFUL, 5)
        assert (fetched.args, fetched.kwargs, fetched.backend) == ([2, 3], {}, "default")
    with pytest.raises(compat.TaskResultMismatch):
        dj_tasks.echo.get_result(result.id)


@pytest.mark.parametrize(
    "result_id",
    ["999999", "abc", "", "0", "-1", "1.0", "01", " 1", "1 ", "1e3", str(2**63), "\u0661"],
)
def test_unknown_and_malformed_ids_do_not_exist(result_id: str) -> None:
    dj_tasks.add.enqueue(1, 1)  # id "1" exists
    with pytest.raises(TaskResultDoesNotExist):
        default_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_backend.aget_result)(result_id)


def test_native_tasks_are_not_results_of_the_backend() -> None:
    native = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultDoesNotExist, match=f"no task result with id '{native.pk}'"):
        default_backend.get_result(str(native.pk))


def test_results_of_another_alias_are_not_found() -> None:
    result = dj_tasks.add.enqueue(1, 1)
    Row.objects.update(metadata={"django_tasks": {"backend": "other"}})
    with pytest.raises(TaskResultDoesNotExist):
        default_backend.get_result(result.id)


def test_a_running_task_that_ignores_its_cancellation_is_stopped_on_the_process_pool(
        tmp_path: Path) -> None:
    from tests.helpers import running_worker, wait_until

    started, gate = tmp_path / "started", tmp_path / "gate"  # the gate never opens
    result = dj_tasks.hangs_until.enqueue(str(started), str(gate))
    with running_worker(pool="process", concurrency=1, cancel_grace=0.2):
        wait_until(started.exists, what="the task to start")
        assert Row.objects.filter(pk=result.id).cancel().stopping == 1
        wait_until(lambda: Row.objects.get(pk=result.id).status == Status.CANCELLED,
                   timeout=30, what="the task to be stopped")
    got = default_backend.get_result(result.id)
    assert (got.status, got.is_finished) == (TaskResultStatus.FAILED, True)
    assert "its handler was still running 0.2s after the request (CANCEL_GRACE)" in \
        Row.objects.get(pk=result.id).error_text


def test_statuses_map_onto_djangos() -> None:
    ready = dj_tasks.add.enqueue(1, 1)
    running = dj_tasks.add.enqueue(1, 1)
    cancelled = dj_tasks.add.enqueue(1, 1)
    Row.objects.filter(pk=cancelled.id).cancel()
    Row.objects.claim("worker-x", limit=2)  # ready and running, in id order
    Row.objects.filter(pk=ready.id).update(status=Status.READY)
    got = {name: default_backend.get_result(r.id)
           for name, r in [("ready", ready), ("running", running), ("cancelled", cancelled)]}
    assert got["ready"].status == TaskResultStatus.READY
    assert (got["running"].status, got["running"].worker_ids) == (TaskResultStatus.RUNNING,
                                                                  ["worker-x"])
    assert got["running"].started_at is not None
    assert got["running"].finished_at is None
    assert (got["cancelled"].status, got["cancelled"].errors) == (TaskResultStatus.FAILED, [])
    assert got["cancelled"].is_finished


# -- retries ----------------------------------------------------------------------------------


def test_one_attempt_by_default_as_in_django() -> None:
    result = dj_tasks.fails.enqueue()
    drain()
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 1, 1)


def test_retries_until_success_keep_every_error_and_worker() -> None:
    result = dj_tasks.flaky.enqueue(2)
    assert Row.objects.get().max_attempts == 3
    drain()
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL, "ok", 3)
    assert [e.exception_class for e in result.errors] == [ConnectionError, ConnectionError]
    assert "ConnectionError: attempt 2 failed" in result.errors[1].traceback
    assert len(result.worker_ids) == 3
    assert list(Execution.objects.order_by("attempt").values_list("attempt", flat=True)) == [
        1, 2, 3]


def test_attempts_exhausted_ends_failed() -> None:
    result = dj_tasks.fails_with_default_backoff.enqueue()
    drain()
    result.refresh()
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 3, 3)


def test_a_failed_attempt_waiting_for_its_retry_is_ready_again() -> None:
    dj_tasks.seen_by_backoff.clear()
    result = dj_tasks.fails_as_told.enqueue("connection")
    drain()  # one attempt; the retry is an hour away
    result.refresh()
    assert Row.objects.get().status == Status.AWAITING_RETRY
    assert (result.status, result.is_finished, result.finished_at) == (
        TaskResultStatus.READY, False, None)
    assert [e.exception_class for e in result.errors] == [ConnectionError]
    fetched = dj_tasks.fails_as_told.get_result(result.id)  # refresh() keeps the old task
    assert fetched.task.run_after - fetched.last_attempted_at > timedelta(minutes=59)
    # The backoff saw the failed attempt already recorded in the result.
    assert dj_tasks.seen_by_backoff == [("ConnectionError", "FAILED", 1, 1)]


def test_backoff_returning_none_stops_retrying() -> None:
    dj_tasks.seen_by_backoff.clear()
    result = dj_tasks.fails_as_told.enqueue("value")
    drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert Row.objects.get().max_attempts == 5
    assert dj_tasks.seen_by_backoff == [("ValueError", "FAILED", 1, 1)]


def test_options_set_the_default_attempts_and_backoff(settings) -> None:
    settings.TASKS = {**settings.TASKS, "default": {
        **settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 2, "BACKOFF": "linear"}}}
    result = dj_tasks.fails.enqueue()
    explicit = dj_tasks.flaky.enqueue(0)  # its own max_attempts=3 wins
    assert dict(Row.objects.values_list("id", "max_attempts")) == {
        int(result.id): 2, int(explicit.id): 3}
    drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 2)


def test_each_state_change_is_logged_once_by_the_worker_and_once_by_django(caplog) -> None:
    # Django's tasks framework logs task_started/task_finished itself, on its own logger,
    # and every record reaches that logger's handlers; the worker logs every state change
    # once more on its own (with attempt, duration and error). run_pgtasks's console shows
    # the worker's line only (test_run_pgtasks.py::
    # test_the_console_shows_each_state_of_a_django_task_once).
    from django_pgtasks.definition.framework import TASKS_MODULE

    ok = dj_tasks.add.enqueue(1, 2)
    failed = dj_tasks.fails.enqueue()
    with caplog.at_level(logging.DEBUG):
        drain()
    lines = [(r.name, r.getMessage()) for r in caplog.records if "state=" in r.getMessage()]
    for result, final in ((ok, "SUCCESSFUL"), (failed, "FAILED")):
        for logger in ("django_pgtasks.worker", TASKS_MODULE):
            mine = [line for name, line in lines
                    if name == logger and line.startswith(f"Task id={result.id} ")]
            assert [line.split(" state=")[1].split()[0] for line in mine] == [
                "RUNNING", final], (logger, lines)
    assert {name for name, _ in lines} == {"django_pgtasks.worker", TASKS_MODULE}, lines


def test_a_backoff_that_raises_fails_the_task_and_is_logged(settings, caplog) -> None:
    def broken(exception: BaseException, task_result: Any) -> float:
        raise ZeroDivisionError("oops")

    settings.TASKS = {**settings.TASKS, "default": {
        **settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 4, "BACKOFF": broken}}}
    result = dj_tasks.fails.enqueue()
    drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert "its backoff raised, so the task is not retried" in caplog.text


@pytest.mark.parametrize(
    ("returned", "status", "delay"),
    [
        (timedelta(seconds=30), Status.AWAITING_RETRY, 30),
        (math.inf, Status.AWAITING_RETRY, 120),  # PGTASKS["BACKOFF_MAX"] bounds every delay
        (-1, Status.FAILED, None),
        ("soon", Status.FAILED, None),
        (math.nan, Status.FAILED, None),
    ],
)
def test_what_a_backoff_returns(settings, caplog, returned: Any, status: str,
                                delay: float | None) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "BACKOFF_MAX": 120.0}
    settings.TASKS = {**settings.TASKS, "default": {
        **settings.TASKS["default"],
        "OPTIONS": {"MAX_ATTEMPTS": 2, "BACKOFF": lambda exception, task_result: returned}}}
    dj_tasks.fails.enqueue()
    drain()
    row = Row.objects.get()
    assert (row.status, row.attempt) == (status, 1)
    if delay is None:
        assert "so the task is not retried" in caplog.text
    else:
        assert row.run_after - row.finished_at == timedelta(seconds=delay)


def test_a_non_serializable_return_value_is_not_retried() -> None:
    result = dj_tasks.returns_object.using().enqueue()
    Row.objects.update(max_attempts=3)
    drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert result.errors[0].exception_class_path == "django_pgtasks.backend.InvalidReturnValue"
    assert "The task's return value of type object is not JSON-serializable" in (
        result.errors[0].traceback)


# -- the worker and the resolver: only Django tasks the backend enqueued ever run ------------


def test_django_and_native_tasks_share_one_queue_and_worker() -> None:
    django_result = dj_tasks.add.enqueue(2, 3)
    native = tasks.add.enqueue(20, 30)
    drain()
    native.refresh_from_db()
    assert (native.status, native.result) == (Status.SUCCESSFUL, 50)
    assert dj_tasks.add.get_result(django_result.id).return_value == 5


def test_the_resolver_only_resolves_django_tasks() -> None:
    assert isinstance(resolve("tests.testapp.dj_tasks.add"), DjangoTaskHandler)
    assert isinstance(get_handler("tests.testapp.dj_tasks.add"), DjangoTaskHandler)
    for name in ("os.system", "tests.testapp.dj_tasks.give_up_on_value_errors",
                 "tests.testapp.tasks.add", "tests.testapp.dj_tasks.nothing", "not a path",
                 "tests.testapp.no_module.add", "add"):
        assert resolve(name) is None, name


def test_a_row_naming_a_plain_function_never_runs_it() -> None:
    dj_tasks.seen_by_backoff.clear()
    row = Row.objects.create(name="tests.testapp.dj_tasks.give_up_on_value_errors",
                             args=[None, None], metadata={"django_tasks": {"backend": "default"}})
    drain()
    row.refresh_from_db()
    assert (row.status, row.attempt) == (Status.FAILED, 1)
    assert "No task handler is registered under the name" in row.error_text
    assert dj_tasks.seen_by_backoff == []


def test_a_django_task_enqueued_through_the_native_api_is_not_run() -> None:
    row = Row.objects.enqueue("tests.testapp.dj_tasks.log_execution")
    drain()
    row.refresh_from_db()
    assert (row.status, row.attempt) == (Status.FAILED, 1)
    assert "was not enqueued through a django.tasks backend, so it is not run." in row.error_text
    assert not Execution.objects.exists()


def test_a_row_of_an_alias_that_is_not_this_backend_is_not_run() -> None:
    row = Row.objects.create(name="tests.testapp.dj_tasks.log_execution",
                             metadata={"django_tasks": {"backend": "immediate"}})
    gone = Row.objects.create(name="tests.testapp.dj_tasks.log_execution",
                              metadata={"django_tasks": {"backend": "gone"}})
    drain()
    row.refresh_from_db()
    gone.refresh_from_db()
    assert "whose class is now ImmediateBackend, not a PgTasksBackend" in row.error_text
    assert "'gone', which is not configured in TASKS any more" in gone.error_text
    assert not Execution.objects.exists()


def test_worker_signals_of_both_apis() -> None:
    seen: list[str] = []

    def native(sender: Any, task: Row, **kwargs: Any) -> None:
        seen.append(f"native {kwargs.get('status', task.status)}")

    def django(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(f"django {task_result.status}")

    pairs = [(native_signals.task_started, native), (native_signals.task_finished, native),
             (compat.task_started, django), (compat.task_finished, django)]
    for signal, receiver in pairs:
        signal.connect(receiver)
    try:
        dj_tasks.add.enqueue(1, 1)
        drain()
    finally:
        for signal, receiver in pairs:
            signal.disconnect(receiver)
    assert seen == ["native RUNNING", "django RUNNING", "django SUCCESSFUL",
                    "native SUCCESSFUL"]


def test_a_raising_signal_receiver_does_not_break_the_worker() -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    compat.task_started.connect(broken)
    compat.task_finished.connect(broken)
    try:
        result = dj_tasks.add.enqueue(1, 1)
        drain()
    finally:
        compat.task_started.disconnect(broken)
        compat.task_finished.disconnect(broken)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_aenqueue_inserts_with_the_async_orm() -> None:
    result = async_to_sync(dj_tasks.async_add.aenqueue)(1, 2)
    row = Row.objects.get()
    assert (result.id, result.status, result.enqueued_at) == (
        str(row.pk), TaskResultStatus.READY, row.created_at)
    drain()
    async_to_sync(result.arefresh)()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


def test_documented_migration_from_django_tasks_db() -> None:
    """The SQL in docs/django-tasks.md moves waiting django-tasks-db tasks, as printed there."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "django-tasks.md").read_text()
    [statement] = re.findall(r"```sql\n(.*?)```", docs, re.DOTALL)
    with connection.cursor() as cursor:
        # The columns of django-tasks-db's DBTaskResult that the statement reads.
        cursor.execute("""
            CREATE TABLE django_tasks_db_dbtaskresult (
                id uuid PRIMARY KEY, status varchar(10) NOT NULL,
                enqueued_at timestamptz NOT NULL, args_kwargs jsonb NOT NULL,
                priority integer NOT NULL, task_path text NOT NULL,
                queue_name varchar(32) NOT NULL, backend_name varchar(32) NOT NULL,
                run_after timestamptz NOT NULL)
        """)
        cursor.execute("""
            INSERT INTO django_tasks_db_dbtaskresult VALUES
            (gen_random_uuid(), 'READY', now() - interval '1 hour',
             '{"args": [2, 3], "kwargs": {}}', 0, 'tests.testapp.dj_tasks.add', 'default',
             'default', '9999-01-01 00:00:00+00'),
            (gen_random_uuid(), 'READY', now(), '{"args": [], "kwargs": {"a": 1, "b": 1}}',
             -5, 'tests.testapp.dj_tasks.add', 'emails', 'default', '2031-01-01 00:00:00+00'),
            (gen_random_uuid(), 'SUCCESSFUL', now(), '{"args": [], "kwargs": {}}', 0,
             'tests.testapp.dj_tasks.add', 'default', 'default', '9999-01-01 00:00:00+00')
        """)
        cursor.execute(statement)
        cursor.execute("SELECT status FROM django_tasks_db_dbtaskresult")
        assert cursor.fetchall() == [("SUCCESSFUL",)]
        cursor.execute("DROP TABLE django_tasks_db_dbtaskresult")
    drain()
    due, deferred = Row.objects.order_by("created_at")
    assert (due.queue, due.priority) == ("default", 100)
    assert (deferred.queue, deferred.priority) == ("emails", 95)
    result = dj_tasks.add.get_result(str(due.pk))
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert result.enqueued_at < result.started_at
    later = dj_tasks.add.get_result(str(deferred.pk))
    assert later.status == TaskResultStatus.READY
    assert later.task.run_after == datetime(2031, 1, 1, tzinfo=UTC)
    assert (later.kwargs, later.task.priority) == ({"a": 1, "b": 1}, -5)


# -- system checks --------------------------------------------------------------------------


def check_ids(**tasks_options: Any) -> list[str]:
    backend = PgTasksBackend("default", {"QUEUES": ["default", "emails"], **tasks_options})
    return [message.id for message in backend.check()]


def test_checks_pass_with_the_test_settings() -> None:
    assert check_ids() == []
    call_command("check", "--database", "default")


# -- worker processes -----------------------------------------------------------------------


@pytest.mark.slow
def test_1000_django_tasks_drained_exactly_once_by_worker_processes(start_command) -> None:
    n = 1_000
    results = [dj_tasks.log_execution.enqueue() for _ in range(n)]
    processes = [
        start_command("run_pgtasks", "--burst", "--concurrency", "3", "--worker-id", f"proc-{i}",
                      "--log-level", "WARNING")
        for i in range(3)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    assert Execution.objects.count() == n
    assert Execution.objects.values("task_id").distinct().count() == n
    assert Row.objects.succeeded().count() == n
    per_worker = dict(Execution.objects.values_list("worker").annotate(n=Count("id")))
    assert len(per_worker) >= 2, per_worker
    sample = default_backend.get_result(results[n // 2].id)
    assert sample.status == TaskResultStatus.SUCCESSFUL
    assert sample.worker_ids == [Execution.objects.get(task_id=int(sample.id)).worker]


@pytest.mark.slow
def test_results_written_by_a_worker_process(start_command) -> None:
    added = dj_tasks.add.enqueue(2, 3)
    async_added = dj_tasks.async_add.enqueue(4, 5)
    flaky = dj_tasks.flaky.enqueue(2)
    failed = dj_tasks.fails.enqueue("from afar")
    context = dj_tasks.context_info.enqueue()
    process = start_command("run_pgtasks", "--burst", "--worker-id", "far-away",
                            "--log-level", "WARNING")
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    for result in (added, async_added, flaky, failed, context):
        result.refresh()  # read here, written by the other process
    assert (added.status, added.return_value, added.worker_ids) == (
        TaskResultStatus.SUCCESSFUL, 5, ["far-away"])
    assert added.enqueued_at <= added.started_at <= added.finished_at
    assert async_added.return_value == 9
    assert (flaky.return_value, flaky.attempts, len(flaky.errors)) == ("ok", 3, 2)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError
    assert failed.errors[0].traceback.rstrip().endswith("ValueError: from afar")
    assert context.return_value["id"] == context.id
    assert context.return_value["worker_ids"] == ["far-away"]


@pytest.mark.slow
def test_keyboard_interrupt_from_a_task_stops_the_worker_like_ctrl_c(start_command) -> None:
    interrupted = dj_tasks.raises_keyboard_interrupt.using(priority=10).enqueue()
    # Not --burst: without the interrupt this worker would wait for work forever.
    process = start_command("run_pgtasks", "--concurrency", "1", "--log-level", "INFO")
    started = time.monotonic()
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert time.monotonic() - started < 60
    assert "raised KeyboardInterrupt: finishing" in output
    interrupted.refresh()
    assert interrupted.status == TaskResultStatus.FAILED
    assert interrupted.errors[0].exception_class is KeyboardInterrupt
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgtasks_worker")
        assert cursor.fetchone() == (0,)  # the worker unregistered: a clean exit
