"""How a run ended, as its span names it (``worker/tracing.py``). The spans themselves, with
the OpenTelemetry SDK and real workers, are tested in ``tests/integration/test_tracing.py``."""

from __future__ import annotations

import pytest

from django_pgtasks.lifecycle.transitions import (
    Cancelled,
    Failed,
    Interrupted,
    Snoozed,
    Succeeded,
    Suspended,
    Unstarted,
)
from django_pgtasks.worker.tracing import _description, outcome_name


@pytest.mark.parametrize(("status", "outcome", "expected"), [
    ("SUCCESSFUL", None, "successful"),
    ("AWAITING_RETRY", None, "retry"),
    ("FAILED", None, "failed"),
    ("CANCELLED", None, "cancelled"),
    ("READY", "interrupted", "interrupted"),
    ("READY", "snoozed", "snoozed"),
    ("READY", "suspended", "suspended"),
    ("READY", "succeeded", "rerun"),
    ("READY", "unstarted", "unstarted"),
    ("", None, "lost"),
    ("", "unstarted", "lost"),  # nothing recorded: whatever the outcome
    (None, None, "unrecorded"),
    (None, "succeeded", "unrecorded"),
])
def test_outcome_names(status: str | None, outcome: str | None, expected: str) -> None:
    made = {"interrupted": Interrupted("x"), "snoozed": Snoozed(1.0),
            "suspended": Suspended(None, True),
            "succeeded": Succeeded(None), "unstarted": Unstarted("refused"), None: None}[outcome]
    assert outcome_name(status, made) == expected


@pytest.mark.parametrize(("name", "outcome", "description"), [
    ("failed", Failed("ValueError: bad\n\nTraceback ..."), "ValueError: bad"),
    ("interrupted", Interrupted("django_pgtasks.exceptions.WorkerLost: gone\nmore"),
     "django_pgtasks.exceptions.WorkerLost: gone"),
    ("cancelled", Cancelled("TaskCancelled: stop"), "TaskCancelled: stop"),
    ("unstarted", Unstarted("too many clients\ndetail"), "too many clients"),
    ("lost", None, "The worker no longer held the task; the run's outcome was not recorded."),
    ("unrecorded", Succeeded(1), "The run's outcome could not be recorded; the task is "
                                 "given back."),
    ("successful", Succeeded(1), ""),
])
def test_the_spans_description_is_the_first_line_of_what_ended_it(
    name: str, outcome: object, description: str,
) -> None:
    assert _description(name, outcome) == description
