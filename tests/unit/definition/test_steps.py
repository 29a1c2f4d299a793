"""Steps of durable tasks, the part without a database (``definition/steps.py``): names,
reading the kept entries, the bounds of what a step keeps; and ``TaskContext.step()`` for a
step kept already (it returns without running and writes nothing). The checkpoint and the
runs through a worker are in ``tests/integration/test_steps.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from django_pgtasks.definition import events, steps
from django_pgtasks.definition.handlers import TaskContext
from django_pgtasks.exceptions import InvalidEventError, StepError, UnstorableResultError


@pytest.mark.parametrize(("name", "message"), [
    ("", "must be a non-empty string"),
    (None, "must be a non-empty string"),
    (3, "must be a non-empty string"),
    ("x" * 201, "at most 200 characters"),
    ("a\x00b", "NUL character"),
    ("a\ud800b", "lone surrogate"),
])
def test_a_bad_step_name_is_refused_with_the_reason(name: Any, message: str) -> None:
    with pytest.raises(StepError, match=message):
        steps.check_name(name)


def test_a_step_error_is_fatal() -> None:
    from django_pgtasks.exceptions import FatalError

    assert issubclass(StepError, FatalError)


def test_good_names_pass_unchanged() -> None:
    for name in ("charge", "x" * 200, "étape 2", "🚚"):
        assert steps.check_name(name) == name


def test_completed_reads_entries_by_name_and_ignores_the_rest() -> None:
    kept = [{"name": "a", "result": 1}, "junk", {"result": 2}, {"name": "b", "result": None}]
    assert steps.completed(kept) == {"a": kept[0], "b": kept[3]}
    assert steps.completed(None) == {}
    assert steps.completed({"name": "a"}) == {}


def test_stored_result_is_compact_json(settings: Any) -> None:
    assert steps.stored_result((1, "two", {"3": [4.5]}), "s", 0, 0) == '[1,"two",{"3":[4.5]}]'


@pytest.mark.parametrize("value", [object(), "a\x00b", float("nan"), {1: "non-string key"}])
def test_a_result_that_cannot_be_kept_is_refused(value: Any) -> None:
    with pytest.raises(UnstorableResultError, match="The result of step 's'"):
        steps.stored_result(value, "s", 0, 0)


def test_the_results_of_all_steps_are_bounded_together(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "MAX_RESULT_BYTES": 100}
    assert steps.steps_bytes_limit() == 400
    steps.stored_result("x" * 50, "s", 3, 340)  # 52 bytes: 392 in all
    with pytest.raises(UnstorableResultError, match=r"would take 402 bytes .* more than 400"):
        steps.stored_result("x" * 60, "s", 3, 340)
    with pytest.raises(UnstorableResultError, match="more than the limit of 100 bytes"):
        steps.stored_result("x" * 99, "s", 0, 0)


def test_a_task_keeps_at_most_max_steps() -> None:
    steps.stored_result(1, "s", steps.MAX_STEPS - 1, 0)
    with pytest.raises(StepError, match=f"at most {steps.MAX_STEPS} steps"):
        steps.stored_result(1, "s", steps.MAX_STEPS, 0)


def test_results_bytes_counts_the_kept_results() -> None:
    assert steps.results_bytes([{"name": "a", "result": [1, 2]}, {"name": "b"}]) == 9  # [1,2] null
    assert steps.results_bytes(None) == 0


def _context(kept: list) -> TaskContext:
    task = SimpleNamespace(pk=7, steps=kept, attempt=2, claims=3, locked_by="w")
    return TaskContext(task=task, worker_id="w")  # type: ignore[arg-type]


def test_a_kept_step_returns_its_result_without_running_or_writing() -> None:
    """No database here: a step kept already must neither run nor write (it would fail)."""
    ctx = _context([{"name": "charge", "result": {"id": "ch_1"}, "attempt": 1}])

    def never() -> None:
        raise AssertionError("a kept step ran again")

    first = ctx.step("charge", never)
    assert first == {"id": "ch_1"}
    first["id"] = "changed"  # the caller's copy: the kept entry is not touched
    assert ctx.task.steps[0]["result"] == {"id": "ch_1"}


def test_a_name_is_used_once_per_run_even_for_a_kept_step() -> None:
    ctx = _context([{"name": "charge", "result": 1}])
    ctx.step("charge", lambda: None)
    with pytest.raises(StepError, match="Step 'charge' ran already in this run of task 7"):
        ctx.step("charge", lambda: None)
    with pytest.raises(StepError, match="non-empty string"):
        ctx.step("", lambda: None)


def test_a_step_name_cannot_take_the_reserved_prefix_of_sleeps_and_waits() -> None:
    with pytest.raises(StepError, match="cannot start with '@'"):
        steps.check_name("@sleep 1")
    assert steps.check_name("a@b") == "a@b"


@pytest.mark.parametrize(("key", "message"), [
    ("", "must be a non-empty string"),
    (None, "must be a non-empty string"),
    ("k" * (events.MAX_EVENT_KEY + 1), "has at most 200 characters"),
    ("a\x00", "NUL character"),
    ("\udfff", "lone surrogate"),
])
def test_an_event_key_is_checked_before_any_sql(key: object, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        events.check_key(key)


def test_the_entries_of_sleeps_and_waits_have_reserved_names() -> None:
    names = [events.slept(1), events.received("k"), events.timed_out("k"), events.deadline("k")]
    assert names == ["@sleep 1", "@event k", "@timeout k", "@wait k"]
    for name in names:
        with pytest.raises(StepError):
            steps.check_name(name)


def test_a_log_message_is_cleaned_and_bounded_for_postgresql() -> None:
    from django_pgtasks.definition.run_report import MAX_MESSAGE, clean_text

    assert clean_text("a\x00b\ud800c") == "a\\x00b\\ud800c"
    long = clean_text("x" * (MAX_MESSAGE + 50))
    assert len(long) == MAX_MESSAGE
    assert long.endswith("…")


@pytest.mark.parametrize(("done", "total"), [(-1, None), (1, 0), (float("nan"), 2),
                                             (True, 2), ("1", 2), (1, float("inf"))])
def test_a_bad_progress_is_refused(done: Any, total: Any) -> None:
    from django_pgtasks.definition.run_report import RunReport, set_progress

    report = RunReport()
    with pytest.raises(ValueError, match="progress\\(\\) takes"):
        set_progress(report, done, total, "")
    assert report.progress is None
