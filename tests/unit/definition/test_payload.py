"""Payloads and results: plain JSON that PostgreSQL stores unchanged, bounded in size and
depth, refused with an error that names the offending value (``definition/payload.py``).

The database-side proof (what is accepted comes back unchanged from ``jsonb``; a refused
enqueue leaves the caller's transaction usable) is in
``tests/integration/test_boundary_validation.py``."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import json
import math
import uuid
from typing import Any

import pytest

from django_pgtasks.definition.payload import (
    MAX_INT_DIGITS,
    normalize_payload,
    normalize_result,
    normalize_value,
    serialize_payload,
    task_payload_json,
)
from django_pgtasks.exceptions import InvalidPayloadError, InvalidTaskError

NUL_KEY = "a\x00b"
SURROGATE = "x\ud800y"  # as os.fsdecode() gives for the bytes b"x\xed\xa0\x80y"
BIG_INT = 10**5000  # 5,001 digits
JUST_TOO_BIG_INT = 10**MAX_INT_DIGITS  # one digit more than JSON carries back to Python
LARGEST_INT = 10**MAX_INT_DIGITS - 1


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    ADA = "ada"


def nested(depth: int) -> Any:
    """``depth`` lists, one inside the other."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def refused(args: Any = (), kwargs: Any = None) -> str:
    with pytest.raises(InvalidPayloadError) as excinfo:
        normalize_payload(args, kwargs or {})
    message = str(excinfo.value)
    message.encode()  # printable and loggable: no raw surrogate in the message itself
    assert message.endswith("."), message
    return message


# -- what is refused, and where --------------------------------------------------------------

#: (id, args, kwargs, place, problem)
BAD_ARGUMENTS = [
    ("NUL in a value", ("a\x00",), {}, "Task argument args[0]", "contains a NUL character"),
    ("NUL in a dict key", ({NUL_KEY: 1},), {}, "Task argument args[0]['a\\x00b'] is a dict key",
     "contains a NUL character"),
    ("NUL in a nested dict key", (), {"name": [{"ok": {NUL_KEY: 1}}]},
     "Task argument 'name'[0]['ok']['a\\x00b'] is a dict key", "contains a NUL character"),
    ("NUL in a kwarg name", (), {NUL_KEY: 1}, "Task argument name 'a\\x00b'",
     "contains a NUL character"),
    ("NUL in a non-ASCII value", ("é\x00",), {}, "Task argument args[0]",
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
    ("NaN", (math.nan,), {}, "Task argument args[0] is nan",
     "NaN and Infinity are not valid JSON"),
    ("Infinity", (), {"x": {"y": math.inf}}, "Task argument 'x'['y'] is inf",
     "NaN and Infinity are not valid JSON"),
    ("-Infinity", (-math.inf,), {}, "is -inf", "NaN and Infinity are not valid JSON"),
    ("float jsonb gives back as an int", (), {"x": [1e16]}, "Task argument 'x'[0] is 1e+16",
     "a float that PostgreSQL's jsonb gives back as an integer"),
    ("negative float jsonb gives back as an int", (-2.5e300,), {}, "is -2.5e+300",
     "gives back as an integer"),
    ("int dict key", ({"a": {1: 2}},), {},
     "Task argument args[0]['a'] has a dict key 1 of type int",
     "JSON object keys must be strings"),
    ("tuple dict key", ({(1, 2): 2},), {}, "has a dict key (1, 2) of type tuple",
     "JSON object keys must be strings"),
    ("int kwarg name", (), {1: "one"}, "Task argument name 1 is of type int",
     "keyword argument names must be strings"),
]


@pytest.mark.parametrize(("args", "kwargs", "place", "problem"),
                         [case[1:] for case in BAD_ARGUMENTS],
                         ids=[case[0] for case in BAD_ARGUMENTS])
def test_bad_arguments_are_refused_naming_the_place(
    args: tuple, kwargs: dict, place: str, problem: str,
) -> None:
    message = refused(args, kwargs)
    assert place in message
    assert problem in message


@pytest.mark.parametrize(("value", "type_name"), [
    (datetime.date(2020, 1, 1), "date"),
    (datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), "datetime"),
    (decimal.Decimal("1.5"), "Decimal"),
    (uuid.UUID(int=1), "UUID"),
    (b"bytes", "bytes"),
    (bytearray(b"bytes"), "bytearray"),
    ({1, 2}, "set"),
    (frozenset(), "frozenset"),
    (object(), "object"),
    (Colour.RED, "Colour"),
    (1 + 2j, "complex"),
])
def test_a_value_of_a_non_json_type_is_refused_with_a_hint(value: Any, type_name: str) -> None:
    message = refused((value,))
    assert f"Task argument args[0] of type {type_name} is not JSON-serializable" in message
    assert "pass plain data (for example an id or an ISO 8601 string) instead" in message


@pytest.mark.parametrize(("value", "base"), [(Level.HIGH, "int"), (Name.ADA, "str")])
def test_a_subclass_of_a_json_type_is_refused_as_it_would_come_back_plain(
    value: Any, base: str,
) -> None:
    message = refused((), {"level": value})
    assert f"of type {type(value).__name__} would come back from JSON as a plain {base}" in (
        message)
    assert f"pass {base}('level') instead" in message


def test_a_float_subclass_is_refused_too() -> None:
    class Celsius(float):
        pass

    assert "would come back from JSON as a plain float" in refused((Celsius(20.5),))


def test_a_bool_is_kept_as_a_bool_not_read_as_an_int() -> None:
    assert normalize_payload([True, False, None], {"b": True}) == ([True, False, None],
                                                                   {"b": True})


# -- limits: integers, floats, depth, size ----------------------------------------------------


@pytest.mark.parametrize("value", [LARGEST_INT, -LARGEST_INT, 2**63, -(2**63) - 1])
def test_the_largest_integers_json_carries_back_are_accepted(value: int) -> None:
    clean, _, args_json, _ = serialize_payload([value], {})
    assert clean == [value]
    assert json.loads(args_json) == [value]


@pytest.mark.parametrize("value", [9999999999999998.0, -9999999999999998.0, 1e-7, 2.5e-300,
                                   0.1, -0.0])
def test_floats_below_1e16_are_accepted_and_read_back_the_same(value: float) -> None:
    _, _, args_json, _ = serialize_payload([value], {})
    [back] = json.loads(args_json)
    assert back == value
    assert type(back) is float


@pytest.mark.parametrize(("depth", "accepted"), [(1, True), (2, True), (3, False), (10, False)])
def test_nesting_is_bounded_by_max_payload_depth_counting_the_arguments(
    pgtasks, depth: int, accepted: bool,
) -> None:
    """The arguments list is the first level: with a depth of 3, an argument may hold two
    nested lists."""
    pgtasks(MAX_PAYLOAD_DEPTH=3)
    if accepted:
        assert normalize_payload([nested(depth)], {}) == ([nested(depth)], {})
    else:
        assert 'is nested more than 3 levels deep (PGTASKS["MAX_PAYLOAD_DEPTH"])' in refused(
            [nested(depth)])


def test_the_default_depth_refuses_deep_nesting_and_names_the_path() -> None:
    assert normalize_payload([nested(31)], {})  # 32 levels with the arguments list
    message = refused([nested(32)])
    assert message.startswith("Task argument args[0]" + "[0]" * 31 + " is nested more than 32")


def test_deep_nesting_of_dicts_counts_as_well(pgtasks) -> None:
    pgtasks(MAX_PAYLOAD_DEPTH=2)
    assert normalize_payload([], {"a": {"b": 1}}) == ([], {"a": {"b": 1}})
    assert "Task argument 'a'['b'] is nested more than 2 levels deep" in refused(
        (), {"a": {"b": {"c": 1}}})


def test_a_value_nested_past_the_limit_is_refused_before_python_runs_out_of_stack() -> None:
    message = refused([nested(100_000)])
    assert "is nested more than 32 levels deep" in message


@pytest.mark.parametrize(("value", "accepted"), [
    ("x" * 10, True),   # [] and {"a":"xxxxxxxxxx"}: 2 + 18 = 20 bytes
    ("x" * 11, False),
    ("é" * 2, False),   # stored as \u00e9: 6 bytes each
])
def test_the_size_limit_counts_the_json_text_as_stored(
    pgtasks, value: str, accepted: bool,
) -> None:
    pgtasks(MAX_PAYLOAD_BYTES=20)
    if accepted:
        assert normalize_payload([], {"a": value}) == ([], {"a": value})
    else:
        message = refused((), {"a": value})
        assert "more than the limit of 20 bytes (PGTASKS[\"MAX_PAYLOAD_BYTES\"])" in message
        assert "store large data elsewhere and pass its id" in message


def test_the_default_size_limit_is_256_kib() -> None:
    message = refused((), {"a": "x" * 300_000})
    assert "Task arguments take 300010 bytes as JSON, more than the limit of 262144" in message


def test_an_explicit_limit_overrides_the_settings(pgtasks) -> None:
    pgtasks(MAX_PAYLOAD_BYTES=10, MAX_PAYLOAD_DEPTH=1)
    clean = serialize_payload(["x" * 100], {"a": [[1]]}, max_bytes=1000, max_depth=10)
    assert clean[0] == ["x" * 100]
    with pytest.raises(InvalidPayloadError, match="limit of 50 bytes"):
        serialize_payload(["x" * 100], {}, max_bytes=50)


# -- what comes out ---------------------------------------------------------------------------


def test_tuples_and_sequences_become_lists_and_mappings_dicts() -> None:
    args, kwargs = normalize_payload(
        ((1, (2, 3)),), {"o": collections.OrderedDict(a=(4,)), "r": range(3)})
    assert args == [[1, [2, 3]]]
    assert kwargs == {"o": {"a": [4]}, "r": [0, 1, 2]}
    assert type(kwargs["o"]) is dict


def test_the_json_text_is_compact_ascii_and_reads_back_to_the_clean_values() -> None:
    values = ["café ☕ 😀", {"clé": ["日本語"]}, 1.5, None]
    clean_args, clean_kwargs, args_json, kwargs_json = serialize_payload(values, {"k": (1,)})
    assert args_json == json.dumps(values, separators=(",", ":"))  # compact, ASCII only
    assert args_json.isascii()
    assert kwargs_json == '{"k":[1]}'
    assert json.loads(args_json) == clean_args == values
    assert json.loads(kwargs_json) == clean_kwargs


def test_no_arguments_serialize_to_the_empty_constants() -> None:
    assert serialize_payload([], {}) == ([], {}, "[]", "{}")


def test_the_input_is_not_changed() -> None:
    kwargs = {"a": (1, 2)}
    normalize_payload([], kwargs)
    assert kwargs == {"a": (1, 2)}


def test_refused_arguments_are_invalid_task_errors_and_type_errors() -> None:
    with pytest.raises(InvalidPayloadError) as excinfo:
        normalize_payload([object()], {})
    assert isinstance(excinfo.value, InvalidTaskError)
    assert isinstance(excinfo.value, TypeError)


# -- results ----------------------------------------------------------------------------------

#: (id, return value, place, problem)
BAD_RESULTS = [
    ("NUL in a dict key", {NUL_KEY: 1}, "The task's return value['a\\x00b'] is a dict key",
     "contains a NUL character"),
    ("NUL in a value", ["a\x00"], "The task's return value[0]", "contains a NUL character"),
    ("surrogate", SURROGATE, "The task's return value",
     "contains a lone surrogate ('\\ud800' at index 1)"),
    ("5000-digit int", BIG_INT, "The task's return value",
     "is an integer of more than 4300 digits"),
    ("float jsonb gives back as an int", [2.5e300], "The task's return value[0] is 2.5e+300",
     "gives back as an integer"),
    ("NaN", {"score": math.nan}, "The task's return value['score'] is nan",
     "NaN and Infinity"),
    ("a datetime", datetime.datetime(2020, 1, 1), "The task's return value of type datetime",
     "is not JSON-serializable"),
    ("more than MAX_RESULT_BYTES", "x" * 2**20, "The task's return value takes 1048578 bytes",
     'more than the limit of 1048576 bytes (PGTASKS["MAX_RESULT_BYTES"])'),
]


@pytest.mark.parametrize(("value", "place", "problem"), [case[1:] for case in BAD_RESULTS],
                         ids=[case[0] for case in BAD_RESULTS])
def test_an_unstorable_result_is_refused_naming_the_place(
    value: Any, place: str, problem: str,
) -> None:
    with pytest.raises(InvalidPayloadError) as excinfo:
        normalize_result(value)
    assert place in str(excinfo.value)
    assert problem in str(excinfo.value)


def test_the_result_limit_is_max_result_bytes(pgtasks) -> None:
    pgtasks(MAX_RESULT_BYTES=1000)
    at_limit = "x" * 998  # 1,000 bytes with its quotes
    assert normalize_result(at_limit) == at_limit
    with pytest.raises(InvalidPayloadError, match="takes 1001 bytes as JSON, more than the "
                                                  "limit of 1000 bytes"):
        normalize_result(at_limit + "x")


def test_a_result_is_validated_from_the_top_level_and_named_by_the_caller() -> None:
    assert normalize_result(nested(32)) == nested(32)  # a result has no arguments list
    with pytest.raises(InvalidPayloadError, match=r"^The step's value\[0\]"):
        normalize_result([math.inf], "The step's value")
    with pytest.raises(InvalidPayloadError, match=r"^Metadata is nan"):
        normalize_value(math.nan, "Metadata")


# -- the JSON text kept on an unsaved task ---------------------------------------------------


class Unsaved:
    """What ``task_payload_json`` reads of a task: ``args``, ``kwargs`` and its ``__dict__``."""

    def __init__(self, args: Any, kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def test_the_validated_text_is_kept_and_reused() -> None:
    task = Unsaved((1, (2,)), {"a": "é"})
    assert task_payload_json(task) == ('[1,[2]]', '{"a":"\\u00e9"}')
    assert task.args == [1, [2]]  # replaced by the clean values
    kept = task._payload_json
    assert task_payload_json(task) == ('[1,[2]]', '{"a":"\\u00e9"}')
    assert task._payload_json is kept  # not validated again


def test_arguments_replaced_after_validation_are_validated_again() -> None:
    task = Unsaved([1], {})
    task_payload_json(task)
    task.kwargs = {"name": {NUL_KEY: 1}}
    with pytest.raises(InvalidPayloadError, match="is a dict key that contains a NUL"):
        task_payload_json(task)
    task.kwargs = {"b": 2}
    assert task_payload_json(task) == ("[1]", '{"b":2}')
