"""Rows as Django's ``TaskResult`` (``backend/results.py``): result ids, statuses, and the
stored error texts turned back into ``TaskError``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import override_settings

compat = pytest.importorskip("django_pgtasks.definition.framework")

from django_pgtasks.backend.results import (  # noqa: E402
    backend_alias,
    error_from_exception,
    error_from_text,
    parse_result_id,
    parse_result_location,
    result_from_row,
    result_id_for,
)
from django_pgtasks.definition.error_text import format_exception  # noqa: E402
from django_pgtasks.models import Task as Row  # noqa: E402
from tests.testapp import dj_tasks  # noqa: E402

TaskResultStatus = compat.TaskResultStatus
SPREAD = {"QUEUES": {"default": {}, "emails": {"database": "queue_a"}}}


# -- result ids -------------------------------------------------------------------------------


@pytest.mark.parametrize(("result_id", "pk"), [
    ("1", 1),
    ("42", 42),
    (str(2**63 - 1), 2**63 - 1),  # the largest bigint
    (str(2**63), None),
    ("0", None),
    ("-1", None),
    ("01", None),  # only the canonical spelling
    (" 1", None),
    ("1 ", None),
    ("1.0", None),
    ("1e3", None),
    ("abc", None),
    ("", None),
    ("\u0661", None),  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit(), not to a bigint
    (1, None),  # not a string
    (None, None),
])
def test_a_result_id_stands_for_a_primary_key_or_for_nothing(result_id: Any, pk: Any) -> None:
    assert parse_result_id(result_id) == pk


@override_settings(PGTASKS=SPREAD)
@pytest.mark.parametrize(("result_id", "location"), [
    ("12", (12, "default")),
    ("12@queue_a", (12, "queue_a")),
    ("12@default", (None, "default")),  # the primary database is never spelt out
    ("12@nowhere", (None, "default")),  # a database that holds no queue
    ("x@queue_a", (None, "queue_a")),
    ("12@queue_a@x", (None, "default")),
])
def test_a_result_id_names_its_database_off_the_primary_one(
    result_id: str, location: tuple,
) -> None:
    assert parse_result_location(result_id) == location


@override_settings(PGTASKS=SPREAD)
def test_a_rows_result_id_names_its_database_unless_it_is_the_primary_one() -> None:
    row = Row(pk=12, name="n")
    assert result_id_for(row) == "12"  # not saved yet: the primary database
    row._state.db = "default"
    assert result_id_for(row) == "12"
    row._state.db = "queue_a"
    assert result_id_for(row) == "12@queue_a"
    assert parse_result_location(result_id_for(row)) == (12, "queue_a")


@pytest.mark.parametrize(("metadata", "alias"), [
    ({"django_tasks": {"backend": "default"}}, "default"),
    ({"django_tasks": {"backend": 5}}, None),
    ({"django_tasks": "default"}, None),
    ({}, None),
    (None, None),
    ([], None),
])
def test_the_backend_that_enqueued_a_row(metadata: Any, alias: str | None) -> None:
    assert backend_alias(Row(name="n", metadata=metadata)) == alias


# -- rows as results --------------------------------------------------------------------------


def row(status: str, **fields: Any) -> Row:
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    values = {"pk": 3, "name": dj_tasks.add.module_path, "status": status, "args": [1, 2],
              "kwargs": {}, "created_at": now, "started_at": now, "finished_at": now,
              "result": 3, "errors": [], "worker_ids": ["w1"]}
    values.update(fields)
    return Row(**values)


@pytest.mark.parametrize(("status", "expected", "finished"), [
    ("WAITING", TaskResultStatus.READY, False),
    ("READY", TaskResultStatus.READY, False),
    ("AWAITING_RETRY", TaskResultStatus.READY, False),
    ("RUNNING", TaskResultStatus.RUNNING, False),
    ("SUCCESSFUL", TaskResultStatus.SUCCESSFUL, True),
    ("FAILED", TaskResultStatus.FAILED, True),
    ("CANCELLED", TaskResultStatus.FAILED, True),
])
def test_statuses_map_onto_djangos(status: str, expected: Any, finished: bool) -> None:
    result = result_from_row(row(status), dj_tasks.add, "default")
    assert result.status == expected
    assert (result.finished_at is not None) is finished
    assert (result.id, result.args, result.kwargs, result.backend) == ("3", [1, 2], {},
                                                                       "default")
    assert result.worker_ids == ["w1"]


def test_only_a_successful_row_has_a_return_value() -> None:
    assert result_from_row(row("SUCCESSFUL"), dj_tasks.add, "default").return_value == 3
    with pytest.raises(ValueError, match="Task failed"):  # Django's: none unless successful
        _ = result_from_row(row("FAILED"), dj_tasks.add, "default").return_value


def test_each_stored_error_becomes_a_task_error_and_malformed_ones_are_skipped() -> None:
    errors = [{"attempt": 1, "error": "ValueError: first\n\nTraceback (most recent call "
                                      "last):\nValueError: first\n"},
              {"attempt": 2, "error": None}, "junk",
              {"attempt": 3, "error": "KeyError: 'x'"}]
    result = result_from_row(row("FAILED", errors=errors), dj_tasks.add, "default")
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError",
                                                               "builtins.KeyError"]


# -- errors -----------------------------------------------------------------------------------


def test_error_text_is_turned_back_into_task_errors() -> None:
    stored = ("django_pgtasks.exceptions.FatalError: no\n\nTraceback (most recent call last):\n"
              '  File "x.py", line 1, in f\ndjango_pgtasks.exceptions.FatalError: no\n')
    error = error_from_text(stored)
    assert error.exception_class_path == "django_pgtasks.exceptions.FatalError"
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert error_from_text("RuntimeError\n\nTraceback (most recent call last):\n").\
        exception_class is RuntimeError
    rescued = error_from_text("django_pgtasks.WorkerLost: worker w stopped while running "
                              "attempt 1 (process killed, connection lost or hung).")
    assert rescued.exception_class_path == "django_pgtasks.WorkerLost"
    assert rescued.traceback.startswith("django_pgtasks.WorkerLost: worker w stopped")


@pytest.mark.parametrize(("text", "path"), [
    ("ValueError: bad", "builtins.ValueError"),
    ("ValueError", "builtins.ValueError"),  # no message
    ("myapp.errors.PaymentDeclined: card 4242", "myapp.errors.PaymentDeclined"),
    ("myapp.Outer.Inner: nested class", "myapp.Outer.Inner"),
    ("", "builtins.Exception"),
    ("not an exception line at all", "builtins.Exception"),
    ("ValueError:no space", "builtins.Exception"),
    ("\n\nTraceback (most recent call last):\n", "builtins.Exception"),
])
def test_the_exception_class_is_read_from_the_first_line(text: str, path: str) -> None:
    assert error_from_text(text).exception_class_path == path


def test_a_text_cut_in_the_middle_keeps_its_class_and_the_tail_of_its_traceback() -> None:
    text = ("myapp.errors.Boom: x\n\nTraceback (most recent call last):\n"
            "\n[... 5000 characters cut ...]\n  File \"y.py\", line 2\nmyapp.errors.Boom: x\n")
    error = error_from_text(text)
    assert error.exception_class_path == "myapp.errors.Boom"
    assert error.traceback.endswith("myapp.errors.Boom: x\n")


def test_an_exception_round_trips_through_its_stored_text() -> None:
    try:
        raise KeyError("order 41")
    except KeyError as exc:
        direct = error_from_exception(exc)
        stored = error_from_text(format_exception(exc))
    assert direct.exception_class_path == stored.exception_class_path == "builtins.KeyError"
    assert stored.traceback == direct.traceback
