"""Task handlers (``definition/handlers.py``): binding arguments to the function's signature
at enqueue, the handler's options (retries, fatal errors, time limits), running it for a
claimed row, and the cancellation signal a running task sees."""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from datetime import timedelta
from typing import Any

import pytest

from django_pgtasks.definition.handlers import (
    SHAPES_KEPT,
    CancelSignal,
    TaskContext,
    TaskHandler,
    argument_problem,
    cancel_signal,
    cancel_was_signalled,
    unexpected_keywords,
)
from django_pgtasks.exceptions import (
    FatalError,
    InvalidPayloadError,
    InvalidTaskError,
    Snooze,
    TaskCancelled,
    TaskTimeoutError,
    UnstorableResultError,
)
from django_pgtasks.models import Task


def add(a: int, b: int) -> int:
    return a + b


def with_options(a: int, /, b: int, *, c: int = 3, **extra: Any) -> int:
    return a + b + c


def keyword_only(*, user_id: int, notify: bool = False) -> None:
    pass


def variadic(*args: Any) -> None:
    pass


def with_context(ctx: TaskContext, item: int) -> int:
    return item


def handler_of(func: Any, **options: Any) -> TaskHandler:
    return TaskHandler(func=func, name=f"tests.unit.{func.__name__}", **options)


def row(**fields: Any) -> Task:
    """An unsaved claimed row: what the worker hands a handler."""
    fields.setdefault("args", [])
    fields.setdefault("kwargs", {})
    fields.setdefault("attempt", 1)
    return Task(pk=fields.pop("pk", 7), name="tests.unit.row", **fields)


# -- argument binding -------------------------------------------------------------------------

def positional_only(a: int, /) -> None:
    pass


def exact(text: str) -> str:
    return re.escape(text)


#: Python words some of these differently from one version to the next.
MISSING_USER_ID = r"missing a required (keyword-only )?argument: 'user_id'"
POSITIONAL_ONLY_A = (r"('a' parameter is positional only, but was passed as a keyword"
                     r"|got some positional-only arguments passed as keyword arguments: 'a')")

#: (id, function, args, kwargs, the problem as a regular expression, or None)
BINDINGS = [
    ("fits", add, (1, 2), {}, None),
    ("fits by keyword", add, (), {"a": 1, "b": 2}, None),
    ("one too many", add, (1, 2, 3), {}, exact("too many positional arguments")),
    ("one missing", add, (1,), {}, exact("missing a required argument: 'b'")),
    ("an unknown keyword", add, (), {"a": 1, "b": 2, "c": 3},
     exact("got an unexpected keyword argument 'c'")),
    # Python reports only the missing 'b'; the misspelt 'bb' is named as well.
    ("a misspelt keyword", add, (), {"a": 1, "bb": 2},
     exact("missing a required argument: 'b'; got an unexpected keyword argument 'bb' "
           "(did you mean 'b'?)")),
    ("two unknown keywords", add, (), {"a": 1, "b": 2, "c": 3, "d": 4},
     exact("got an unexpected keyword argument 'c'; got an unexpected keyword argument 'd'")),
    ("given twice", add, (1,), {"a": 1, "b": 2}, exact("multiple values for argument 'a'")),
    # A positional-only parameter takes no keyword: no suggestion to use it as one either.
    ("positional-only by keyword", positional_only, (), {"a": 1},
     POSITIONAL_ONLY_A + exact("; got an unexpected keyword argument 'a'")),
    ("extra keywords taken by **extra", with_options, (1, 2), {"z": 1, "c": 4}, None),
    ("keyword-only given positionally", keyword_only, (5,), {},
     exact("too many positional arguments")),
    ("keyword-only missing", keyword_only, (), {"notify": True}, MISSING_USER_ID),
    ("keyword-only misspelt", keyword_only, (), {"usr_id": 1},
     MISSING_USER_ID + exact("; got an unexpected keyword argument 'usr_id' "
                             "(did you mean 'user_id'?)")),
    ("nothing close to suggest", keyword_only, (), {"user_id": 1, "zzz": 2},
     exact("got an unexpected keyword argument 'zzz'")),
    ("any number of positionals", variadic, (1, 2, 3, 4), {}, None),
    ("no keyword for *args", variadic, (), {"x": 1},
     exact("got an unexpected keyword argument 'x'")),
]


@pytest.mark.parametrize(("func", "args", "kwargs", "problem"),
                         [case[1:] for case in BINDINGS], ids=[case[0] for case in BINDINGS])
def test_argument_problem_names_every_misfit(
    func: Any, args: tuple, kwargs: dict, problem: str | None,
) -> None:
    found = argument_problem(inspect.signature(func), args, kwargs)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert re.fullmatch(problem, found), found


def test_a_suggestion_is_made_only_for_a_close_parameter_name() -> None:
    assert argument_problem(inspect.signature(keyword_only), (), {"user_id": 1, "zzz": 2}) == (
        "got an unexpected keyword argument 'zzz'")  # no "(did you mean ...)"


def test_unexpected_keywords_are_listed_in_call_order() -> None:
    assert unexpected_keywords(inspect.signature(add), {"z": 1, "a": 1, "y": 2}) == ["z", "y"]
    assert unexpected_keywords(inspect.signature(with_options), {"z": 1}) == []  # **extra
    # A positional-only parameter cannot be given by keyword (unless **extra takes it).
    assert unexpected_keywords(inspect.signature(positional_only), {"a": 1}) == ["a"]
    assert unexpected_keywords(inspect.signature(with_options), {"a": 1}) == []


def test_check_arguments_raises_a_sentence_naming_the_task_and_signature() -> None:
    handler = handler_of(add)
    handler.check_arguments((1, 2), {})
    with pytest.raises(InvalidTaskError) as excinfo:
        handler.check_arguments((1,), {"bb": 2})
    assert str(excinfo.value) == (
        "Task tests.unit.add: the arguments do not match add(a: 'int', b: 'int') -> 'int': "
        "missing a required argument: 'b'; got an unexpected keyword argument 'bb' (did you "
        "mean 'b'?).")


def test_a_handler_that_takes_the_context_is_checked_without_it() -> None:
    handler = handler_of(with_context, takes_context=True)
    handler.check_arguments([5], {})  # the worker passes the context first
    assert handler.argument_problem([], {}) == "missing a required argument: 'item'"
    assert handler.argument_problem([1, 2], {}) == "too many positional arguments"
    # Asked explicitly without the context, the first parameter is the context's.
    assert handler.argument_problem([None, 5], {}, context=False) is None


def test_the_answer_is_kept_per_shape_of_call() -> None:
    handler = handler_of(add)
    assert handler.argument_problem([1, 2], {}) is None
    assert handler.argument_problem([3, 4], {}) is None
    assert handler.argument_problem([1], {"b": 2}) is None
    assert handler.argument_problem([1], {"c": 2}) is not None
    assert set(handler._misfits) == {(2, frozenset(), False), (1, frozenset({"b"}), False),
                                     (1, frozenset({"c"}), False)}


def test_at_most_a_bounded_number_of_shapes_is_kept() -> None:
    handler = handler_of(variadic)
    for n in range(SHAPES_KEPT + 10):
        assert handler.argument_problem([0] * n, {}) is None
    assert len(handler._misfits) == SHAPES_KEPT


def test_a_function_without_a_readable_signature_takes_anything() -> None:
    handler = handler_of(ValueError)  # a builtin class: no signature to read
    assert handler.signature is None
    handler.check_arguments((1, 2, 3), {"x": 1})


# -- options ----------------------------------------------------------------------------------


def test_a_handler_calls_its_function_and_looks_like_it() -> None:
    def documented(x: int) -> int:
        """Doubles x."""
        return 2 * x

    handler = handler_of(documented)
    assert handler(4) == 8
    assert handler.__doc__ == "Doubles x."
    assert handler.__wrapped__ is documented
    assert repr(handler) == "<TaskHandler tests.unit.documented>"
    assert not handler.is_async
    assert handler_of(_async_add).is_async


@pytest.mark.parametrize(("backoff", "delays"), [
    ("linear", [10.0, 20.0, 30.0]),
    ("exponential", [10.0, 20.0, 40.0]),
    (lambda attempt: attempt * 0.5, [0.5, 1.0, 1.5]),
])
def test_the_retry_delay_follows_the_handlers_backoff(
    pgtasks, backoff: Any, delays: list[float],
) -> None:
    pgtasks(BACKOFF_BASE=10.0, BACKOFF_JITTER=0)
    handler = handler_of(add, backoff=backoff)
    assert [handler.retry_delay(attempt) for attempt in (1, 2, 3)] == delays


def test_without_a_backoff_the_setting_decides(pgtasks) -> None:
    pgtasks(BACKOFF="linear", BACKOFF_BASE=2.0, BACKOFF_JITTER=0)
    assert handler_of(add).retry_delay(3) == 6.0


class Gone(LookupError):
    pass


@pytest.mark.parametrize(("fatal", "exc", "is_fatal"), [
    ((), FatalError("x"), True),
    ((), UnstorableResultError("x"), True),  # a FatalError
    ((), KeyError("x"), False),
    ((LookupError,), KeyError("x"), True),  # a subclass of a listed type
    ((LookupError,), Gone(), True),
    ((ValueError,), KeyError("x"), False),
])
def test_fatal_errors_are_fatal_errors_and_the_listed_types(
    fatal: tuple, exc: BaseException, is_fatal: bool,
) -> None:
    assert handler_of(add, fatal=fatal).is_fatal(exc) is is_fatal


def test_retry_after_is_none_for_a_fatal_error_and_the_delay_otherwise(pgtasks) -> None:
    pgtasks(BACKOFF_BASE=1.0, BACKOFF_JITTER=0)
    handler = handler_of(add, backoff="linear", fatal=(KeyError,))
    assert handler.retry_after(row(attempt=4), KeyError("x")) is None
    assert handler.retry_after(row(attempt=4), RuntimeError("x")) == 4.0
    # A time-out seen from outside (no exception) is retried like any failure.
    assert handler.retry_after(row(attempt=2), None) == 2.0


# -- running a claimed row ---------------------------------------------------------------------


async def _async_add(a: int, b: int) -> int:
    return a + b


def test_call_runs_the_function_with_the_rows_arguments() -> None:
    assert handler_of(add).call(row(args=[1], kwargs={"b": 2}), "worker-1") == 3
    assert handler_of(_async_add).call(row(args=[2, 3]), "worker-1") == 5


def test_call_gives_a_context_first_to_a_handler_that_takes_one() -> None:
    seen: list[TaskContext] = []

    def takes(ctx: TaskContext, x: int) -> int:
        seen.append(ctx)
        return x

    task = row(pk=11, args=[9], attempt=2)
    assert handler_of(takes, takes_context=True).call(task, "worker-9") == 9
    [ctx] = seen
    assert (ctx.task_id, ctx.attempt, ctx.worker_id, ctx.task) == (11, 2, "worker-9", task)


@pytest.mark.parametrize(("args", "kwargs", "shown"), [
    ({"a": 1}, {}, "got dict and dict"),
    ([], [], "got list and list"),
    (None, {}, "got NoneType and dict"),
])
def test_a_malformed_stored_payload_is_fatal(args: Any, kwargs: Any, shown: str) -> None:
    with pytest.raises(FatalError, match=f"Malformed stored payload: .*\\({shown}\\)"):
        handler_of(add).call(row(args=args, kwargs=kwargs), "w")


def test_an_async_handler_past_its_timeout_is_cancelled() -> None:
    async def slow() -> None:
        await asyncio.Event().wait()  # never set

    with pytest.raises(TaskTimeoutError, match=r"time limit of 0\.05s and was cancelled"):
        handler_of(slow, timeout=0.05).call(row(), "w")


def test_an_async_handler_is_cancelled_when_its_task_is() -> None:
    started = threading.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    task = row()
    threading.Thread(target=lambda: started.wait(10) and cancel_signal(task).set()).start()
    with pytest.raises(TaskCancelled, match="its coroutine was cancelled"):
        handler_of(waits).call(task, "w")


SURROGATE = "x\ud800y"
BIG_INT = 10**5000  # 5,001 digits

#: (id, return value, place, problem)
BAD_RESULTS = [
    ("NUL in a dict key", {"a\x00b": 1}, "The task's return value['a\\x00b'] is a dict key",
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
    ("not JSON", object(), "The task's return value of type object",
     "is not JSON-serializable"),
    ("more than MAX_RESULT_BYTES", "x" * 2**20, "The task's return value takes 1048578 bytes",
     'more than the limit of 1048576 bytes (PGTASKS["MAX_RESULT_BYTES"])'),
]


def returning(value: Any) -> TaskHandler:
    return TaskHandler(func=lambda: value, name="tests.unit.returning")


@pytest.mark.parametrize(("value", "place", "problem"), [case[1:] for case in BAD_RESULTS],
                         ids=[case[0] for case in BAD_RESULTS])
def test_an_unstorable_result_raises_unstorable_result_error(
    value: Any, place: str, problem: str
) -> None:
    handler = returning(value)
    with pytest.raises(UnstorableResultError) as excinfo:
        handler.call(Task.objects.build(handler), "worker-1")
    assert type(excinfo.value) is UnstorableResultError
    assert isinstance(excinfo.value, FatalError)  # fails the task without a retry
    assert isinstance(excinfo.value, TypeError)
    assert isinstance(excinfo.value.__cause__, InvalidPayloadError)
    message = str(excinfo.value)
    assert place in message, message
    assert problem in message, message
    assert message.endswith("."), message
    message.encode()


def test_max_result_bytes_is_the_limit(pgtasks) -> None:
    pgtasks(MAX_RESULT_BYTES=1000)
    at_limit = "x" * 998  # 1,000 bytes with its quotes
    assert returning(at_limit).call(Task.objects.build(returning(at_limit)), "w") == at_limit
    with pytest.raises(UnstorableResultError, match="takes 1001 bytes as JSON, more than the "
                                                    "limit of 1000 bytes"):
        returning(at_limit + "x").call(Task.objects.build(returning(None)), "w")


def test_storable_results_are_returned_as_plain_json() -> None:
    value = {"clé": ("日本語", 10**4300 - 1, 1e-7, None, True)}
    handler = returning(value)
    assert handler.call(Task.objects.build(handler), "w") == {
        "clé": ["日本語", 10**4300 - 1, 1e-7, None, True]}


# -- cancellation -----------------------------------------------------------------------------


def test_a_cancel_signal_runs_each_callback_once_even_if_one_fails() -> None:
    signal = CancelSignal()
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("ignored")

    signal.add_callback(broken)
    signal.add_callback(lambda: calls.append("second"))
    assert not signal.is_set()
    signal.set()
    signal.set()  # a second set calls nothing again
    assert calls == ["broken", "second"]
    assert signal.is_set()
    assert signal.wait(0)


def test_a_callback_added_after_the_signal_runs_at_once() -> None:
    signal = CancelSignal()
    signal.set()
    calls: list[int] = []
    remove = signal.add_callback(lambda: calls.append(1))
    assert calls == [1]
    remove()  # harmless


def test_a_removed_callback_is_not_called() -> None:
    signal = CancelSignal()
    calls: list[int] = []
    remove = signal.add_callback(lambda: calls.append(1))
    remove()
    remove()  # twice is harmless
    signal.set()
    assert calls == []


def test_a_rows_signal_is_made_once_and_only_when_asked_for() -> None:
    task = row()
    assert not cancel_was_signalled(task)
    assert "_cancel_signal" not in task.__dict__  # asking did not make one
    signal = cancel_signal(task)
    assert cancel_signal(task) is signal
    signal.set()
    assert cancel_was_signalled(task)


def test_the_context_reports_and_raises_a_cancellation() -> None:
    task = row(pk=5, attempt=3)
    ctx = TaskContext(task=task, worker_id="w")
    assert (ctx.task_id, ctx.attempt) == (5, 3)
    assert not ctx.cancelled
    assert not ctx.should_stop()
    ctx.raise_if_cancelled()
    assert ctx.wait(0) is False  # not cancelled: the full (zero) sleep
    cancel_signal(task).set()
    assert ctx.cancelled
    assert ctx.should_stop()
    assert ctx.wait(3600) is True  # returns at once once cancelled
    with pytest.raises(TaskCancelled, match=r"Task 5 was cancelled while it ran\."):
        ctx.raise_if_cancelled()


@pytest.mark.parametrize(("seconds", "stored"), [(30, 30.0), (timedelta(minutes=2), 120.0),
                                                 (0, 0.0)])
def test_snooze_raises_with_the_seconds(seconds: Any, stored: float) -> None:
    ctx = TaskContext(task=row(), worker_id="w")
    with pytest.raises(Snooze) as excinfo:
        ctx.snooze(seconds)
    assert excinfo.value.seconds == stored


def test_a_pipeline_stage_cannot_have_a_key() -> None:
    ctx = TaskContext(task=row(), worker_id="w")
    with pytest.raises(InvalidTaskError, match="A pipeline stage cannot have a deduplication"):
        ctx.then("tests.testapp.tasks.add", 1, 2, key="k")
