"""The error texts stored on a task (``definition/error_text.py``): ``Type: message``, a
blank line and the traceback; storable (no NUL, no lone surrogate) and bounded, keeping the
head and the tail."""

from __future__ import annotations

import re

import pytest

from django_pgtasks.definition.error_text import (
    error_text,
    format_exception,
    qualified_name,
    reason_text,
    storable,
    truncate_error,
)
from django_pgtasks.exceptions import WorkerLost


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Outer:
    class Inner(Exception):
        pass


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as a handler's exception has one."""
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(("text", "stored"), [
    ("plain", "plain"),
    ("", ""),
    ("café ☕ 😀", "café ☕ 😀"),  # valid Unicode is kept as it is
    ("a\x00b", "a\\x00b"),
    ("\x00\x00", "\\x00\\x00"),
    ("file caf\udce9.txt", "file caf\\udce9.txt"),  # os.fsdecode() of b"caf\xe9"
    ("é\x00\ud800", "é\\x00\\ud800"),
])
def test_storable_spells_out_what_postgresql_cannot_store(text: str, stored: str) -> None:
    assert storable(text) == stored
    storable(text).encode()  # valid UTF-8


@pytest.mark.parametrize(("cls", "name"), [
    (ValueError, "builtins.ValueError"),
    (WorkerLost, "django_pgtasks.exceptions.WorkerLost"),
    (Outer.Inner, f"{__name__}.Outer.Inner"),
])
def test_qualified_name(cls: type, name: str) -> None:
    assert qualified_name(cls) == name


def test_the_type_and_message_come_first_then_the_traceback() -> None:
    text = format_exception(raised(KeyError("order 41")))
    head, _blank, rest = text.partition("\n\n")
    assert head == "KeyError: 'order 41'"
    assert rest.startswith("Traceback (most recent call last):")
    assert rest.rstrip().endswith("KeyError: 'order 41'")
    assert "in raised" in rest


def test_an_exception_without_a_traceback_is_formatted_too() -> None:
    assert format_exception(ValueError("bad")) == "ValueError: bad\n\nValueError: bad\n"


def test_a_chained_cause_is_part_of_the_traceback() -> None:
    try:
        try:
            raise OSError("disk")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as exc:
        text = format_exception(exc)
    assert text.startswith("RuntimeError: save failed\n\n")
    assert "OSError: disk" in text
    assert "direct cause of the following exception" in text


def test_an_exception_whose_str_fails_is_still_recorded() -> None:
    text = error_text(raised(Unprintable()))
    assert text.startswith(f"{__name__}.Unprintable")
    assert "<exception str() failed>" in text


def test_error_text_is_storable_and_bounded(pgtasks) -> None:
    pgtasks(ERROR_TEXT_LIMIT=200)
    text = error_text(raised(ValueError("bad\x00value caf\udce9 " + "x" * 1000)))
    assert len(text) == 200
    assert text.startswith("ValueError: bad\\x00value caf\\udce9 ")
    text.encode()


@pytest.mark.parametrize("limit", [50, 100, 999, 4000])
def test_a_long_text_keeps_a_third_of_its_head_and_the_rest_from_its_tail(
    pgtasks, limit: int,
) -> None:
    pgtasks(ERROR_TEXT_LIMIT=limit)
    original = "".join(f"{i:05d}" for i in range(2000))  # 10,000 characters, each place known
    cut = truncate_error(original)
    # Never longer than the limit; one shorter when the count of what was cut has a digit
    # fewer than the text's length, which the marker's room was reckoned with.
    assert limit - 1 <= len(cut) <= limit
    match = re.fullmatch(r"(\d*)\n\[\.\.\. (\d+) characters cut \.\.\.\]\n(\d*)", cut)
    assert match, cut
    head, cut_count, tail = match[1], int(match[2]), match[3]
    assert original.startswith(head)
    assert original.endswith(tail)
    assert len(head) + cut_count + len(tail) == len(original)  # the count is exact
    assert len(head) == (len(head) + len(tail)) // 3


def test_a_text_at_the_limit_is_kept_whole(pgtasks) -> None:
    pgtasks(ERROR_TEXT_LIMIT=100)
    assert truncate_error("x" * 100) == "x" * 100
    assert truncate_error("x" * 101) != "x" * 101


def test_the_limit_applies_to_the_storable_text(pgtasks) -> None:
    pgtasks(ERROR_TEXT_LIMIT=8)
    assert truncate_error("\x00\x00") == "\\x00\\x00"  # 8 characters once spelt out
    pgtasks(ERROR_TEXT_LIMIT=40)
    assert truncate_error("\x00" * 10) == "\\x00" * 10  # 40 once spelt out: kept whole
    cut = truncate_error("\x00" * 11)  # 44 once spelt out
    assert len(cut) == 40
    assert "[... 33 characters cut ...]" in cut


def test_the_default_limit_is_4000_characters() -> None:
    assert len(error_text(raised(RuntimeError("x" * 10_000)))) == 4000


def test_a_reason_names_the_class_and_has_no_traceback() -> None:
    assert reason_text(WorkerLost, "worker w1 stopped heart\x00beats") == (
        "django_pgtasks.exceptions.WorkerLost: worker w1 stopped heart\\x00beats")


@pytest.mark.parametrize("limit", [1, 5, 20, 30])
def test_a_limit_too_small_for_the_marker_keeps_the_head_within_the_limit(
    pgtasks, limit: int,
) -> None:
    pgtasks(ERROR_TEXT_LIMIT=limit)
    original = "ValueError: " + "y" * 500
    cut = truncate_error(original)
    assert cut == original[:limit]
