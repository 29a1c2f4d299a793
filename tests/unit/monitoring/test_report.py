"""What the dashboard reports (``monitoring/report.py``): durations and ages written for
people, and the rows' derived numbers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_pgtasks.management.commands import pgtasks_stats
from django_pgtasks.monitoring.report import NameCounts, QueueRow, StuckTask, WorkerRow
from django_pgtasks.monitoring.report import seconds_text as report_seconds_text


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.0421, "0.042s"), (12.54, "12.5s"), (425, "7m05s"), (12000, "3h20m"),
    (187200, "2d4h"),
])
def test_durations_are_shown_for_people(seconds: float | None, text: str) -> None:
    assert pgtasks_stats.seconds_text(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0.000s"),
    (0.0005, "0.001s"),  # rounded, not cut
    (9.9994, "9.999s"),
    (10, "10.0s"),  # three decimals below ten seconds, one from there
    (59.94, "59.9s"),
    (60, "1m00s"),
    (61.9, "1m01s"),  # whole seconds from a minute on
    (3599, "59m59s"),
    (3600, "1h00m"),
    (3660, "1h01m"),
    (86399, "23h59m"),
    (86400, "1d0h"),
    (90000, "1d1h"),
    (31 * 86400 + 5 * 3600, "31d5h"),
])
def test_each_unit_takes_over_at_its_boundary(seconds: float, text: str) -> None:
    assert report_seconds_text(seconds) == text


def test_the_command_shows_durations_as_the_dashboard_does() -> None:
    assert pgtasks_stats.seconds_text is report_seconds_text


def queue_row() -> QueueRow:
    return QueueRow(queue="default", waiting=1, scheduled=2, running=3, oldest_waiting=75.0,
                    longest_running=None, succeeded_last_hour=10, failed_last_hour=2,
                    cancelled_last_hour=1)


def test_a_queue_row_sums_what_it_finished_and_shows_its_ages() -> None:
    row = queue_row()
    assert row.finished_last_hour == 13
    assert row.oldest_waiting_text == "1m15s"
    assert row.longest_running_text == "-"


def test_a_names_total_is_the_sum_of_its_states() -> None:
    assert NameCounts("send", {"READY": 2, "FAILED": 3, "SUCCESSFUL": 10}).total == 15
    assert NameCounts("idle", {}).total == 0


def test_stuck_tasks_and_workers_show_their_ages() -> None:
    stuck = StuckTask(id=1, name="n", queue="q", worker=None, attempt=1, max_attempts=3,
                      running_for=7300.0)
    assert stuck.running_for_text == "2h01m"
    now = datetime(2026, 1, 1, tzinfo=UTC)
    worker = WorkerRow(name="w", hostname="h", pid=1, queues=["default"], concurrency=4,
                       started_at=now, last_seen_at=now, last_seen_ago=2.5, lost=False,
                       running=0)
    assert worker.last_seen_text == "2.500s"
