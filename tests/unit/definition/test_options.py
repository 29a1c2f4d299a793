"""Enqueue options checked at the boundary (``definition/options.py``): priority, attempts,
keys and stages, queues, delays and ``run_after``, concurrency keys and limits."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from django_pgtasks.definition.options import (
    MAX_ATTEMPTS_LIMIT,
    MAX_CONCURRENCY_LIMIT,
    MAX_DELAY_SECONDS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_NAME_RE,
    check_run_after,
    check_string_option,
    delay_seconds,
    resolve_concurrency,
    text_problem,
    validate_options,
    validate_queue,
)
from django_pgtasks.exceptions import InvalidTaskError, UnknownQueueError

SURROGATE = "x\ud800y"
TOO_LATE = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))  # 10000 in UTC
TOO_EARLY = datetime(1, 1, 1, 1, tzinfo=timezone(timedelta(hours=5)))  # year 0 in UTC


# -- text PostgreSQL can store ----------------------------------------------------------------


@pytest.mark.parametrize(("value", "problem"), [
    ("plain", None),
    ("", None),
    ("café ☕ 😀 日本語", None),
    ("\x00", "contains a NUL character, which PostgreSQL cannot store"),
    ("é\x00", "contains a NUL character"),
    (SURROGATE, "contains a lone surrogate ('\\ud800' at index 1), which is not valid Unicode"),
    ("ok\udcff", "contains a lone surrogate ('\\udcff' at index 2)"),
    ("\ud83d\ude00", "contains a lone surrogate ('\\ud83d' at index 0)"),  # a split pair
])
def test_text_problem_says_what_postgresql_would_refuse(value: str, problem: str | None) -> None:
    found = text_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)


def test_a_surrogate_problem_says_how_to_pass_bytes() -> None:
    assert "decode bytes with errors='replace', or pass them as base64" in text_problem(SURROGATE)


# -- priority and attempts --------------------------------------------------------------------


@pytest.mark.parametrize("priority", [PRIORITY_MIN, 1, 100, PRIORITY_MAX])
def test_a_priority_in_range_is_accepted(priority: int) -> None:
    validate_options(priority=priority)


@pytest.mark.parametrize("priority", [-1, PRIORITY_MAX + 1, 2**15, 1.0, "5", True, False])
def test_a_priority_out_of_range_or_not_an_int_is_refused(priority: Any) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(
            f"Priority must be an integer from 0 to 200 (higher runs first), not {priority!r}.")):
        validate_options(priority=priority)


@pytest.mark.parametrize("attempts", [1, 3, MAX_ATTEMPTS_LIMIT])
def test_max_attempts_in_range_is_accepted(attempts: int) -> None:
    validate_options(max_attempts=attempts)


@pytest.mark.parametrize("attempts", [0, -3, MAX_ATTEMPTS_LIMIT + 1, 2**31, 2.0, True, "3"])
def test_max_attempts_out_of_range_or_not_an_int_is_refused(attempts: Any) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(
            f"max_attempts must be an integer from 1 to 1000, not {attempts!r}.")):
        validate_options(max_attempts=attempts)


def test_no_option_at_all_is_valid() -> None:
    validate_options()


# -- keys and stages --------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "limit"), [("key", 255), ("stage", 100)])
def test_keys_and_stages_are_one_to_their_column_length_of_characters(
    option: str, limit: int,
) -> None:
    validate_options(**{option: "k"})
    validate_options(**{option: "é" * limit})  # characters, not bytes
    for bad in ("", "k" * (limit + 1)):
        with pytest.raises(InvalidTaskError,
                           match=f"{option} must be a string of 1 to {limit} characters"):
            validate_options(**{option: bad})


@pytest.mark.parametrize("value", [42, b"key", ["k"], SURROGATE, "a\x00b"])
def test_a_key_that_is_not_storable_text_is_refused(value: Any) -> None:
    with pytest.raises(InvalidTaskError) as excinfo:
        validate_options(key=value)
    message = str(excinfo.value)
    assert message.startswith(f"key must be a string of 1 to 255 characters, not {value!r}")
    assert message.endswith(".")
    message.encode()


def test_an_unstorable_option_says_why_after_the_rule() -> None:
    with pytest.raises(InvalidTaskError) as excinfo:
        check_string_option("stage", SURROGATE, 100)
    assert str(excinfo.value) == (
        "stage must be a string of 1 to 100 characters, not 'x\\ud800y': it contains a lone "
        "surrogate ('\\ud800' at index 1), which is not valid Unicode and which PostgreSQL "
        "cannot store; decode bytes with errors='replace', or pass them as base64.")


# -- queues -----------------------------------------------------------------------------------


def test_a_configured_queue_is_returned() -> None:
    assert validate_queue("emails") == "emails"


@pytest.mark.parametrize("queue", ["nope", "", "Default", SURROGATE, None, 1])
def test_a_queue_not_configured_is_refused_listing_the_configured_ones(queue: Any) -> None:
    with pytest.raises(UnknownQueueError) as excinfo:
        validate_queue(queue)
    assert str(excinfo.value) == (
        f"Queue {queue!r} is not configured; add it to PGTASKS['QUEUES'] "
        f"(configured: default, emails, urgent).")
    assert isinstance(excinfo.value, LookupError)


def test_queues_follow_the_settings(pgtasks) -> None:
    pgtasks(QUEUES={"alpha": {}, "beta": {"database": "other"}})
    assert validate_queue("beta") == "beta"
    with pytest.raises(UnknownQueueError, match=r"\(configured: alpha, beta\)"):
        validate_queue("default")


@pytest.mark.parametrize(("name", "valid"), [
    ("default", True), ("emails.high", True), ("a:b-c_d", True), ("9", True),
    ("x" * 100, True), ("x" * 101, False), ("", False), ("-leading", False),
    ("bad queue!", False), ("café", False), ("a/b", False),
])
def test_queue_names_the_settings_check_accepts(name: str, valid: bool) -> None:
    assert bool(QUEUE_NAME_RE.match(name)) is valid


# -- delays and run_after ---------------------------------------------------------------------


@pytest.mark.parametrize(("delay", "seconds"), [
    (None, None),
    (0, 0.0),
    (1.5, 1.5),
    (timedelta(minutes=2), 120.0),
    (MAX_DELAY_SECONDS, float(MAX_DELAY_SECONDS)),
    (timedelta(days=36525), float(MAX_DELAY_SECONDS)),  # the longest: a century
])
def test_a_delay_becomes_seconds_from_the_database_clock(delay: Any, seconds: Any) -> None:
    assert delay_seconds(None, delay) == seconds


@pytest.mark.parametrize(("delay", "shown"), [
    (1e13, "10000000000000.0"),
    (1e20, "1e+20"),
    (math.nan, "nan"),
    (math.inf, "inf"),
    (-1, "-1"),
    (timedelta(seconds=-1), "datetime.timedelta(days=-1, seconds=86399)"),
    (MAX_DELAY_SECONDS + 1, str(MAX_DELAY_SECONDS + 1)),
    (timedelta(days=73_050), "datetime.timedelta(days=73050)"),
    (timedelta(days=999_999_999), "datetime.timedelta(days=999999999)"),
    (10**400, "1" + "0" * 400),  # compared exactly, where float() would overflow
    (True, "True"),
    ("60", "'60'"),
])
def test_a_delay_out_of_range_or_of_the_wrong_type_is_refused(delay: Any, shown: str) -> None:
    with pytest.raises(InvalidTaskError) as excinfo:
        delay_seconds(None, delay)
    assert str(excinfo.value) == (
        f"delay must be a non-negative number of seconds or a timedelta, at most a century "
        f"(3155760000 seconds), not {shown}.")


def test_run_after_is_kept_absolute() -> None:
    assert delay_seconds(datetime(2030, 1, 1, tzinfo=UTC), None) is None


def test_run_after_and_delay_together_are_refused() -> None:
    with pytest.raises(InvalidTaskError, match=r"Pass either run_after or delay, not both\."):
        delay_seconds(datetime(2030, 1, 1, tzinfo=UTC), 5)


@pytest.mark.parametrize("run_after", [
    datetime(2030, 1, 1), "2030-01-01T00:00:00+00:00", 1893456000,
])
def test_run_after_must_be_an_aware_datetime(run_after: Any) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(
            f"run_after must be a timezone-aware datetime, not {run_after!r}.")):
        check_run_after(run_after)


@pytest.mark.parametrize("run_after", [TOO_LATE, TOO_EARLY], ids=["after 9999", "before 1"])
def test_a_run_after_outside_the_years_python_holds_in_utc_is_refused(
    run_after: datetime,
) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(
            f"run_after {run_after!r} is outside the years 1 to 9999 in UTC.")):
        delay_seconds(run_after, None)


@pytest.mark.parametrize("run_after", [
    datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
    datetime(1, 1, 1, 0, 0, tzinfo=UTC),
    datetime(9999, 12, 31, 18, tzinfo=timezone(timedelta(hours=-5))),  # 23:00 UTC
])
def test_the_extreme_times_that_stay_in_range_are_accepted(run_after: datetime) -> None:
    check_run_after(run_after)


# -- concurrency keys and limits --------------------------------------------------------------


def handler(key: Any = None, limit: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(concurrency_key=key, concurrency_limit=limit)


@pytest.mark.parametrize(("defaults", "key", "limit", "expected"), [
    (handler(), None, None, (None, None)),
    (handler(), "k", None, ("k", 1)),  # a key alone: one at a time
    (handler(), "k", 5, ("k", 5)),
    (handler("default-key"), None, None, ("default-key", 1)),
    (handler("default-key", 3), None, None, ("default-key", 3)),
    (handler("default-key", 3), "mine", None, ("mine", 3)),  # the call's key, the limit kept
    (handler("default-key", 3), "mine", 7, ("mine", 7)),
    (handler(lambda user, n: f"user-{user}"), None, None, ("user-42", 1)),
    (handler(lambda user, n: None), None, None, (None, None)),  # the callable may decline
    (handler(), "k", MAX_CONCURRENCY_LIMIT, ("k", MAX_CONCURRENCY_LIMIT)),
])
def test_the_call_wins_over_the_handlers_concurrency_defaults(
    defaults: SimpleNamespace, key: Any, limit: Any, expected: tuple,
) -> None:
    assert resolve_concurrency(defaults, key, limit, [42, 1], {}) == expected


def test_a_callable_key_receives_the_tasks_arguments() -> None:
    seen = []

    def key(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return "k"

    resolve_concurrency(handler(key), None, None, [1, 2], {"x": 3})
    assert seen == [((1, 2), {"x": 3})]


def test_a_limit_without_a_key_is_refused() -> None:
    with pytest.raises(InvalidTaskError, match=r"concurrency_limit needs a concurrency_key\."):
        resolve_concurrency(handler(), None, 2, [], {})


@pytest.mark.parametrize("limit", [0, -1, MAX_CONCURRENCY_LIMIT + 1, 1.5, True, "2"])
def test_a_limit_out_of_smallint_range_is_refused(limit: Any) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(
            f"concurrency_limit must be an integer from 1 to 32767, not {limit!r}.")):
        resolve_concurrency(handler(), "k", limit, [], {})


def test_a_handlers_callable_key_is_checked_like_a_given_one() -> None:
    # A key made from a file name's bytes, the way os.fsdecode() decodes them.
    from_bytes = handler(lambda name: bytes.fromhex(name).decode(errors="surrogateescape"))
    assert resolve_concurrency(from_bytes, None, None, ["6f6b"], {}) == ("ok", 1)
    with pytest.raises(InvalidTaskError, match=re.escape(
            "concurrency_key must be a string of 1 to 255 characters, not '\\udcff': it "
            "contains a lone surrogate")):
        resolve_concurrency(from_bytes, None, None, ["ff"], {})
