"""Times PostgreSQL holds and Python cannot (``database/timestamps.py``): the tolerant loader
reads them as :class:`OutOfRange` text instead of failing the whole page. Its use on a real
connection (the admin's pages) is tested in ``tests/integration/test_admin.py``."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.types.datetime import TimestamptzLoader

from django_pgtasks.database.timestamps import OutOfRange, _tolerant_loader

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid


@pytest.fixture
def loader() -> psycopg.adapt.Loader:
    """The text loader of ``timestamptz``, made tolerant, with no connection."""
    return _tolerant_loader(TimestamptzLoader)(TIMESTAMPTZ, None)


@pytest.mark.parametrize("text", [
    "infinity", "-infinity", "10000-01-01 00:00:00+00", "4000-01-01 00:00:00+00 BC",
    "294276-12-31 23:59:59+00",
])
def test_a_time_python_cannot_hold_is_read_as_out_of_range_text(
    loader: psycopg.adapt.Loader, text: str,
) -> None:
    value = loader.load(text.encode())
    assert isinstance(value, OutOfRange)
    assert isinstance(value, str)
    assert value == f"{text} (out of range)"
    assert value.text == text


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-02-29 12:30:00+00", datetime(2024, 2, 29, 12, 30, tzinfo=UTC)),
    ("9999-12-31 23:59:59+00", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ("0001-01-01 00:00:00+00", datetime(1, 1, 1, tzinfo=UTC)),
])
def test_a_time_python_can_hold_is_still_a_datetime(
    loader: psycopg.adapt.Loader, text: str, expected: datetime,
) -> None:
    assert loader.load(text.encode()) == expected


def test_without_the_tolerant_loader_the_same_time_fails() -> None:
    with pytest.raises(psycopg.DataError):
        TimestamptzLoader(TIMESTAMPTZ, None).load(b"infinity")


def test_one_tolerant_class_per_loader_it_extends() -> None:
    tolerant = _tolerant_loader(TimestamptzLoader)
    assert _tolerant_loader(TimestamptzLoader) is tolerant
    assert issubclass(tolerant, TimestamptzLoader)

