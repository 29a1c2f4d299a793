"""Validation at the enqueue boundary: whatever PostgreSQL would refuse (a NUL character or a
lone surrogate anywhere, numbers JSON cannot carry back, options out of range) is refused by
django-pgtasks itself before any SQL runs, at every entry point, with an error that names the
place. The caller's transaction stays usable and nothing is written. A handler's return value
that PostgreSQL cannot store raises ``UnstorableResultError``."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction

from django_pgtasks.definition.registry import TaskHandler
from django_pgtasks.exceptions import (
    FatalError,
    InvalidPayloadError,
    InvalidTaskError,
    UnknownQueueError,
    UnknownTaskError,
    UnstorableResultError,
)
from django_pgtasks.models import Task
from tests.testapp import tasks

try:
    from django_pgtasks.definition import framework as compat
except ImportError:  # neither django.tasks nor the django-tasks backport
    compat = None

needs_django_tasks = pytest.mark.skipif(
    compat is None, reason="needs django.tasks or the django-tasks backport")

# A real commit at the end of each transaction.atomic() block, not a savepoint of the test's.
pytestmark = pytest.mark.django_db(transaction=True)

NUL_KEY = "a\x00b"
SURROGATE = "x\ud800y"  # as os.fsdecode() gives for the bytes b"x\xed\xa0\x80y"
BIG_INT = 10**5000  # 5,001 digits
JUST_TOO_BIG_INT = 10**4300  # 4,301 digits: one more than JSON carries back to Python


# -- entry points: each takes the bad call's positional and keyword arguments and options ----


def via_enqueue(args: tuple, kwargs: dict, **options: Any) -> Any:
    return Task.objects.enqueue(tasks.add, *args, **options, **kwargs)


def via_keyed_enqueue(args: tuple, kwargs: dict, **options: Any) -> Any:
    # The upsert path (INSERT ... ON CONFLICT).
    options.setdefault("key", "same")
    return Task.objects.enqueue(tasks.add, *args, **options, **kwargs)


def via_enqueue_many(args: tuple, kwargs: dict, **options: Any) -> Any:
    good = Task.objects.build(tasks.add, 1, 2)
    return Task.objects.enqueue_many([good, Task.objects.build(tasks.add, *args, **options,
                                                               **kwargs)])


def via_enqueue_bulk(args: tuple, kwargs: dict, **options: Any) -> Any:
    # A good item first: nothing of it may be written either.
    return Task.objects.enqueue_bulk(tasks.add, [[1, 2], list(args) if args else kwargs],
                                     **options)


def via_handler_enqueue(args: tuple, kwargs: dict, **options: Any) -> Any:
    return tasks.add.enqueue(*args, **options, **kwargs)


def via_handler_build(args: tuple, kwargs: dict, **options: Any) -> Any:
    return Task.objects.enqueue_many([tasks.add.build(*args, **options, **kwargs)])


ALL_OPTIONS = frozenset({"queue", "priority", "run_after", "delay", "max_attempts", "key",
                         "stage", "concurrency_key", "concurrency_limit"})
#: Each entry point and the options it takes (the others would be task arguments).
ENTRY_POINTS: dict[str, tuple[Callable[..., Any], frozenset[str]]] = {
    "enqueue": (via_enqueue, ALL_OPTIONS),
    "keyed enqueue": (via_keyed_enqueue, ALL_OPTIONS),
    "enqueue_many": (via_enqueue_many, ALL_OPTIONS),
    "enqueue_bulk": (via_enqueue_bulk, frozenset({"queue", "priority", "max_attempts",
                                                  "concurrency_key", "concurrency_limit"})),
    "handler.enqueue": (via_handler_enqueue, frozenset({"queue", "priority", "run_after",
                                                        "delay", "max_attempts", "key"})),
    "handler.build": (via_handler_build, ALL_OPTIONS),
}


def assert_refused(call: Callable[[], Any], error: type[Exception], place: str,
                   problem: str) -> Exception:
    """``call()`` raises exactly ``error``, naming ``place`` and ``problem``, inside the
    caller's transaction, which stays usable and commits; no task of the call is written."""
    before = set(Task.objects.values_list("pk", flat=True))
    with transaction.atomic():
        with pytest.raises(error) as excinfo:
            call()
        # The same transaction can still query and write, then commit.
        assert Task.objects.filter(name=tasks.noop.name).count() == 0
        marker = Task.objects.enqueue(tasks.noop)
    assert type(excinfo.value) is error
    message = str(excinfo.value)
    assert place in message, message
    assert problem in message, message
    assert message.endswith("."), message
    message.encode()  # printable and loggable: no raw surrogate in the message itself
    new = set(Task.objects.values_list("pk", flat=True)) - before
    assert new == {marker.pk}  # committed, and nothing of the refused call
    return excinfo.value


# -- bad arguments ------------------------------------------------------------------------------

#: (id, args, kwargs, place, problem). Each has either args or kwargs, so that enqueue_bulk
#: can take it as one item.
BAD_ARGUMENTS = [
    ("NUL in a dict key", ({NUL_KEY: 1},), {}, "Task argument args[0]['a\\x00b'] is a dict key",
     "contains a NUL character"),
    ("NUL in a nested dict key", (), {"name": [{"ok": {NUL_KEY: 1}}]},
     "Task argument 'name'[0]['ok']['a\\x00b'] is a dict key", "contains a NUL character"),
    ("NUL in a kwarg name", (), {NUL_KEY: 1}, "Task argument name 'a\\x00b'",
     "contains a NUL character"),
    ("surrogate in a value", (SURROGATE,), {}, "Task argument args[0]",
     "contains a lone surrogate ('\\ud800' at index 1)"),
    ("surrogate in a nested value", (), {"files": ["ok.txt", "caf\udce9.txt"]},
     "Task argument 'files'[1]", "contains a lone surrogate ('\\udce9' at index 3)"),
    ("surrogate in a dict key", (), {"name": {SURROGATE: 1}},
     "Task argument 'name'['x\\ud800y'] is a dict key", "contains a lone surrogate"),
    ("surrogate in a kwarg name", (), {SURROGATE: 1}, "Task argument name 'x\\ud800y'",
     "contains a lone surrogate"),
    ("5000-digit int", (BIG_INT,), {}, "Task argument args[0]",
     "is an integer of more than 4300 digits"),
    ("4301-digit int, nested", (), {"n": {"big": [JUST_TOO_BIG_INT]}},
     "Task argument 'n'['big'][0]", "is an integer of more than 4300 digits"),
    ("negative 5000-digit int", (-BIG_INT,), {}, "Task argument args[0]",
     "is an integer of more than 4300 digits"),
    ("float jsonb gives back as an int", (), {"x": [1e16]}, "Task argument 'x'[0] is 1e+16",
     "a float that PostgreSQL's jsonb gives back as an integer"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("args", "kwargs", "place", "problem"),
                         [case[1:] for case in BAD_ARGUMENTS],
                         ids=[case[0] for case in BAD_ARGUMENTS])
def test_bad_arguments_are_refused_before_any_sql(
    entry: str, args: tuple, kwargs: dict, place: str, problem: str
) -> None:
    via, _ = ENTRY_POINTS[entry]
    assert_refused(lambda: via(args, kwargs), InvalidPayloadError, place, problem)


# -- arguments that do not fit the handler's signature --------------------------------------

#: (id, args, kwargs, problem) for tasks.add(a, b); each has either args or kwargs.
MISFITS = [
    ("one too many", (1, 2, 3), {}, "too many positional arguments"),
    ("one missing", (1,), {}, "missing a required argument: 'b'"),
    ("an unknown keyword", (), {"a": 1, "b": 2, "c": 3},
     "got an unexpected keyword argument 'c'"),
    # Python reports only the missing 'b'; the misspelt 'bb' is named as well.
    ("a misspelt keyword", (), {"a": 1, "bb": 2},
     "missing a required argument: 'b'; got an unexpected keyword argument 'bb' "
     "(did you mean 'b'?)"),
    ("two unknown keywords", (), {"a": 1, "b": 2, "c": 3, "d": 4},
     "got an unexpected keyword argument 'c'; got an unexpected keyword argument 'd'"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("args", "kwargs", "problem"), [case[1:] for case in MISFITS],
                         ids=[case[0] for case in MISFITS])
def test_arguments_that_do_not_fit_the_handler_are_refused_before_any_sql(
    entry: str, args: tuple, kwargs: dict, problem: str
) -> None:
    via, _ = ENTRY_POINTS[entry]
    assert_refused(lambda: via(args, kwargs), InvalidTaskError,
                   "Task tests.testapp.tasks.add: the arguments do not match "
                   "add(a: 'int', b: 'int') -> 'int'", problem)


def test_a_handler_that_takes_the_context_is_checked_without_it() -> None:
    assert Task.objects.enqueue(tasks.log_execution).pk  # the worker passes the context
    assert_refused(lambda: Task.objects.enqueue(tasks.log_execution, 1), InvalidTaskError,
                   "the arguments do not match log_execution(ctx", "too many positional")


@needs_django_tasks
@pytest.mark.parametrize("how", ["enqueue", "aenqueue"])
@pytest.mark.parametrize(("args", "kwargs", "problem"), [case[1:] for case in MISFITS],
                         ids=[case[0] for case in MISFITS])
def test_a_django_task_refuses_arguments_that_do_not_fit_before_any_sql(
    how: str, args: tuple, kwargs: dict, problem: str
) -> None:
    from asgiref.sync import async_to_sync

    from django_pgtasks.backend import InvalidTaskArguments
    from tests.testapp import dj_tasks

    enqueue = {"enqueue": dj_tasks.add.enqueue,
               "aenqueue": async_to_sync(dj_tasks.add.aenqueue)}[how]
    error = assert_refused(lambda: enqueue(*args, **kwargs), InvalidTaskArguments,
                           "Task tests.testapp.dj_tasks.add: the arguments do not match "
                           "add(a: 'int', b: 'int') -> 'int'", problem)
    # Django's own exception at the django.tasks boundary; a TypeError, as calling the
    # function with them would raise.
    assert isinstance(error, compat.InvalidTask)
    assert isinstance(error, TypeError)


@needs_django_tasks
def test_a_django_task_that_takes_the_context_is_checked_without_it() -> None:
    from django_pgtasks.backend import InvalidTaskArguments
    from tests.testapp import dj_tasks

    assert dj_tasks.context_info.enqueue().id  # the worker passes the context
    assert_refused(lambda: dj_tasks.context_info.enqueue(1), InvalidTaskArguments,
                   "the arguments do not match context_info(context", "too many positional")


def plain_function(x: int) -> int:
    return x


@pytest.mark.parametrize("call", [
    lambda: Task.objects.enqueue(plain_function, 1),
    lambda: Task.objects.build(plain_function, 1),
    lambda: Task.objects.enqueue_bulk(plain_function, [[1]]),
], ids=["enqueue", "build", "enqueue_bulk"])
def test_an_undecorated_function_is_refused_with_a_hint(call: Callable[[], Any]) -> None:
    error = assert_refused(call, UnknownTaskError, "plain_function",
                           "is not a task: decorate the function with @pgtask")
    assert isinstance(error, InvalidTaskError)


def test_enqueue_bulk_refuses_a_keyword_argument_name_that_is_not_a_string() -> None:
    assert_refused(lambda: Task.objects.enqueue_bulk(tasks.add, [{"a": 1, "b": 2}, {1: "one"}]),
                   InvalidPayloadError, "Task argument name 1 is of type int",
                   "keyword argument names must be strings")


def test_enqueue_many_validates_arguments_replaced_after_build() -> None:
    good = tasks.add.build(1, 2)
    replaced = tasks.add.build(3, 4)
    replaced.kwargs = {"name": {NUL_KEY: 1}}
    assert_refused(lambda: Task.objects.enqueue_many([good, replaced]), InvalidPayloadError,
                   "Task argument 'name'['a\\x00b'] is a dict key", "contains a NUL character")


def test_what_postgresql_can_store_comes_back_unchanged() -> None:
    largest = 10**4300 - 1  # 4,300 digits
    values = ["café ☕ 😀", {"clé": ["ünïcode", "日本語"]}, largest, -largest, 9999999999999998.0,
              1e-7, 2.5e-300]
    saved = [
        Task.objects.enqueue(tasks.takes_anything, *values, k=values),
        Task.objects.enqueue(tasks.takes_anything, *values, key="k", k=values),
        *Task.objects.enqueue_many([tasks.takes_anything.build(*values, k=values)]),
    ]
    ids = Task.objects.enqueue_bulk(tasks.takes_anything, [values, {"k": values}])
    for task in saved:
        task.refresh_from_db()
        assert (task.args, task.kwargs) == (values, {"k": values})
    bulk = Task.objects.in_bulk(ids)
    assert (bulk[ids[0]].args, bulk[ids[1]].kwargs) == (values, {"k": values})


# -- bad options --------------------------------------------------------------------------------

TOO_LATE = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))  # year 10000 in UTC
TOO_EARLY = datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5)))  # year 0 in UTC

#: (id, options, error, place, problem)
BAD_OPTIONS = [
    ("delay 1e13", {"delay": 1e13}, InvalidTaskError, "delay must be",
     "at most a century (3155760000 seconds), not 10000000000000.0."),
    ("delay 1e20", {"delay": 1e20}, InvalidTaskError, "delay must be", "not 1e+20."),
    ("delay NaN", {"delay": math.nan}, InvalidTaskError, "delay must be", "not nan."),
    ("delay Infinity", {"delay": math.inf}, InvalidTaskError, "delay must be", "not inf."),
    ("delay huge int", {"delay": 10**400}, InvalidTaskError, "delay must be", "not 1000"),
    ("delay huge timedelta", {"delay": timedelta(days=999_999_999)}, InvalidTaskError,
     "delay must be", "not datetime.timedelta(days=999999999)."),
    ("delay 200-year timedelta", {"delay": timedelta(days=73_050)}, InvalidTaskError,
     "delay must be", "not datetime.timedelta(days=73050)."),
    ("run_after after the year 9999", {"run_after": TOO_LATE}, InvalidTaskError,
     "run_after datetime.datetime(9999, 12, 31, 23, 0", "outside the years 1 to 9999 in UTC"),
    ("run_after before the year 1", {"run_after": TOO_EARLY}, InvalidTaskError,
     "run_after datetime.datetime(1, 1, 1, 1, 0", "outside the years 1 to 9999 in UTC"),
    ("stage with a surrogate", {"stage": SURROGATE}, InvalidTaskError,
     "stage must be a string of 1 to 100 characters, not 'x\\ud800y'",
     "contains a lone surrogate"),
    ("key with a surrogate", {"key": SURROGATE}, InvalidTaskError,
     "key must be a string of 1 to 255 characters, not 'x\\ud800y'", "contains a lone surrogate"),
    ("concurrency_key with a surrogate", {"concurrency_key": SURROGATE}, InvalidTaskError,
     "concurrency_key must be a string of 1 to 255 characters, not 'x\\ud800y'",
     "contains a lone surrogate"),
    ("concurrency_key with NUL", {"concurrency_key": NUL_KEY}, InvalidTaskError,
     "concurrency_key must be a string of 1 to 255 characters, not 'a\\x00b'",
     "contains a NUL character"),
    ("queue with a surrogate", {"queue": SURROGATE}, UnknownQueueError,
     "Queue 'x\\ud800y' is not configured", "PGTASKS['QUEUES']"),
    ("concurrency_limit beyond smallint", {"concurrency_key": "k", "concurrency_limit": 32768},
     InvalidTaskError, "concurrency_limit must be an integer from 1 to 32767", "not 32768."),
    ("concurrency_limit negative", {"concurrency_key": "k", "concurrency_limit": -1},
     InvalidTaskError, "concurrency_limit must be an integer from 1 to 32767", "not -1."),
    ("priority beyond smallint", {"priority": 2**15}, InvalidTaskError,
     "Priority must be an integer from 0 to 200", "not 32768."),
    ("max_attempts beyond integer", {"max_attempts": 2**31}, InvalidTaskError,
     "max_attempts must be an integer from 1 to 1000", "not 2147483648."),
]


def _option_cases() -> list[Any]:
    cases = []
    for name, options, error, place, problem in BAD_OPTIONS:
        for entry, (_, accepted) in ENTRY_POINTS.items():
            if set(options) <= accepted:
                cases.append(pytest.param(entry, options, error, place, problem,
                                          id=f"{name}-{entry}"))
    return cases


@pytest.mark.parametrize(("entry", "options", "error", "place", "problem"), _option_cases())
def test_bad_options_are_refused_before_any_sql(
    entry: str, options: dict, error: type[Exception], place: str, problem: str
) -> None:
    via, _ = ENTRY_POINTS[entry]
    assert_refused(lambda: via((1, 2), {}, **options), error, place, problem)


def test_a_handlers_callable_concurrency_key_is_checked_too() -> None:
    # A key made from a file name's bytes, the way os.fsdecode() decodes them.
    handler = TaskHandler(
        func=tasks.add.func, name=tasks.add.name,
        concurrency_key=lambda name, n: bytes.fromhex(name).decode(errors="surrogateescape"))
    assert_refused(lambda: Task.objects.enqueue_bulk(handler, [["6f6b", 1], ["ff", 2]]),
                   InvalidTaskError, "concurrency_key must be a string of 1 to 255 characters, "
                   "not '\\udcff'", "contains a lone surrogate")


def test_the_longest_delay_is_accepted() -> None:
    task = Task.objects.enqueue(tasks.add, 1, 2, delay=timedelta(days=36525))
    task.refresh_from_db()
    assert task.run_after - task.created_at == timedelta(days=36525)


# -- the django.tasks backend -------------------------------------------------------------------


@needs_django_tasks
@pytest.mark.parametrize(("args", "kwargs", "place", "problem"),
                         [case[1:] for case in BAD_ARGUMENTS],
                         ids=[case[0] for case in BAD_ARGUMENTS])
def test_the_backend_refuses_bad_arguments_with_djangos_exception(
    args: tuple, kwargs: dict, place: str, problem: str
) -> None:
    from django_pgtasks.backend import InvalidTaskArguments
    from tests.testapp import dj_tasks

    exc = assert_refused(lambda: dj_tasks.echo.enqueue(*args, **kwargs), InvalidTaskArguments,
                         place, problem)
    # Django's exception, and the one the native entry points raise.
    assert isinstance(exc, compat.InvalidTask)
    assert isinstance(exc, InvalidPayloadError)


@needs_django_tasks
@pytest.mark.parametrize("run_after", [TOO_LATE, TOO_EARLY], ids=["after 9999", "before 1"])
def test_the_backend_refuses_a_run_after_out_of_range(run_after: datetime) -> None:
    from tests.testapp import dj_tasks

    assert_refused(lambda: dj_tasks.echo.using(run_after=run_after).enqueue(),
                   compat.InvalidTask, "run_after datetime.datetime(",
                   "outside the years 1 to 9999 in UTC")


# -- results ------------------------------------------------------------------------------------

#: (id, return value, place, problem). What a handler's call raises for each is tested in
#: tests/unit/definition/test_handlers.py; here, the backend's worker side on a stored row.
BAD_RESULTS = [
    ("NUL in a dict key", {NUL_KEY: 1}, "The task's return value['a\\x00b'] is a dict key",
     "contains a NUL character"),
    ("NUL in a value", ["a\x00"], "The task's return value[0]", "contains a NUL character"),
    ("surrogate", SURROGATE, "The task's return value",
     "contains a lone surrogate ('\\ud800' at index 1)"),
    ("surrogate in a dict key", {"files": {SURROGATE: 1}},
     "The task's return value['files']['x\\ud800y'] is a dict key", "contains a lone surrogate"),
    ("5000-digit int", BIG_INT, "The task's return value",
     "is an integer of more than 4300 digits"),
    ("nested 5000-digit int", {"n": [BIG_INT]}, "The task's return value['n'][0]",
     "is an integer of more than 4300 digits"),
    ("float jsonb gives back as an int", [2.5e300], "The task's return value[0] is 2.5e+300",
     "gives back as an integer"),
    ("more than MAX_RESULT_BYTES", "x" * 2**20, "The task's return value takes 1048578 bytes",
     'more than the limit of 1048576 bytes (PGTASKS["MAX_RESULT_BYTES"])'),
]


if compat is not None:
    #: What :func:`returns_bad_value` returns, by name.
    RESULTS = {case[0]: case[1] for case in BAD_RESULTS}

    @compat.task
    def returns_bad_value(name: str) -> Any:
        return RESULTS[name]


@needs_django_tasks
@pytest.mark.parametrize(("name", "place", "problem"),
                         [(case[0], *case[2:]) for case in BAD_RESULTS],
                         ids=[case[0] for case in BAD_RESULTS])
def test_the_backend_raises_invalid_return_value(name: str, place: str, problem: str) -> None:
    from django_pgtasks.backend import InvalidReturnValue, resolve

    result = returns_bad_value.enqueue(name)
    row = Task.objects.get(pk=int(result.id))
    with pytest.raises(InvalidReturnValue) as excinfo:
        resolve(row.name).call(row, "worker-1")
    assert isinstance(excinfo.value, UnstorableResultError)
    assert isinstance(excinfo.value, FatalError)
    assert isinstance(excinfo.value, TypeError)
    assert place in str(excinfo.value)
    assert problem in str(excinfo.value)
