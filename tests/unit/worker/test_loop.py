"""The callbacks of a recorded batch run as one pool job: one that raises spoils none of
the others."""

from __future__ import annotations

import logging

import pytest

from django_pgtasks.worker.completion import _call_each


def test_a_failing_callback_does_not_stop_the_others_of_its_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str | None] = []

    def broken(status: str | None) -> None:
        raise RuntimeError("broken receiver")

    with caplog.at_level(logging.ERROR, logger="django_pgtasks.worker"):
        _call_each([(seen.append, "SUCCESSFUL"), (broken, "FAILED"), (seen.append, None)])
    assert seen == ["SUCCESSFUL", None]
    assert "Error in a callback run after a task's outcome was recorded." in caplog.text
    assert "broken receiver" in caplog.text
