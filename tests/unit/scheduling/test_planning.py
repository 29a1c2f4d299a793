"""Which runs a due schedule produces: on time, late, and after missed runs under each policy
(``scheduling.declarations.plan``). Pure calculation: the database only says what is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_pgtasks.definition.recurrence import CATCH_UP_LIMIT, cron, every, zone
from django_pgtasks.scheduling import plan

P = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
MINUTE = every(minutes=1)
UTC_ZONE = zone("UTC")


def test_a_run_that_is_late_by_less_than_a_period_plans_the_next_from_its_planned_time() -> None:
    late = plan(MINUTE, UTC_ZONE, P, P + timedelta(seconds=42.5), "once")
    assert late.runs == [P]
    assert late.next_run_at == P + timedelta(minutes=1)  # not 42.5 s later: no drift
    assert not late.missed


def test_missed_runs_once_skip_and_all() -> None:
    now = P + timedelta(minutes=10, seconds=5)  # the runs at P, P+1m, ..., P+10m are due
    expected_next = P + timedelta(minutes=11)  # still on the chain that starts at P

    once = plan(MINUTE, UTC_ZONE, P, now, "once")
    assert (once.runs, once.next_run_at, once.missed) == ([P], expected_next, True)

    skip = plan(MINUTE, UTC_ZONE, P, now, "skip")
    assert (skip.runs, skip.next_run_at, skip.missed) == ([], expected_next, True)

    everything = plan(MINUTE, UTC_ZONE, P, now, "all")
    assert everything.runs == [P + timedelta(minutes=k) for k in range(11)]
    assert everything.next_run_at == expected_next
    assert not everything.truncated


@pytest.mark.parametrize("policy", ["once", "skip", "all"])
def test_on_time_every_policy_produces_the_one_run(policy: str) -> None:
    result = plan(MINUTE, UTC_ZONE, P, P, policy)
    assert result.runs == [P]
    assert result.next_run_at == P + timedelta(minutes=1)
    assert not result.missed
    assert not result.truncated


@pytest.mark.parametrize("policy", ["once", "skip", "all"])
def test_the_next_planned_time_after_missed_runs_is_the_same_under_every_policy(
    policy: str,
) -> None:
    now = P + timedelta(hours=3, seconds=1)
    assert plan(every(minutes=7), UTC_ZONE, P, now, policy).next_run_at == (
        P + timedelta(minutes=7 * 26))  # the first of P + 7k after now


def test_a_planned_time_exactly_one_period_ago_counts_as_missed() -> None:
    result = plan(MINUTE, UTC_ZONE, P, P + timedelta(minutes=1), "all")
    assert result.runs == [P, P + timedelta(minutes=1)]
    assert result.missed
    assert result.next_run_at == P + timedelta(minutes=2)


def test_catching_up_all_missed_runs_is_bounded() -> None:
    now = P + timedelta(days=30)  # 43,200 runs missed
    result = plan(MINUTE, UTC_ZONE, P, now, "all")
    assert result.runs == [P + timedelta(minutes=k) for k in range(CATCH_UP_LIMIT)]
    assert result.truncated
    assert result.next_run_at == now + timedelta(minutes=1)  # on the chain, in the future


def test_catching_up_exactly_the_limit_is_not_truncated() -> None:
    now = P + timedelta(minutes=CATCH_UP_LIMIT - 1, seconds=30)
    result = plan(MINUTE, UTC_ZONE, P, now, "all")
    assert len(result.runs) == CATCH_UP_LIMIT
    assert not result.truncated
    assert result.next_run_at == P + timedelta(minutes=CATCH_UP_LIMIT)


def test_missed_cron_runs_continue_at_the_next_cron_time() -> None:
    quarterly = cron("*/15 * * * *")
    now = P + timedelta(hours=2, minutes=1)
    result = plan(quarterly, UTC_ZONE, P, now, "once")
    assert result.runs == [P]
    assert result.next_run_at == P + timedelta(hours=2, minutes=15)


def test_missed_daily_runs_across_a_dst_change_keep_their_local_time() -> None:
    """A worker down over Paris's spring change: the runs it catches up are each at 09:00
    local time, 23 real hours apart across the change."""
    paris = zone("Europe/Paris")
    first = datetime(2025, 3, 28, 8, 0, tzinfo=UTC)  # 09:00 CET
    now = datetime(2025, 4, 1, 12, 0, tzinfo=UTC)
    result = plan(cron("0 9 * * *"), paris, first, now, "all")
    assert [t.astimezone(paris).strftime("%d %H:%M") for t in result.runs] == [
        "28 09:00", "29 09:00", "30 09:00", "31 09:00", "01 09:00"]
    assert result.runs[2] - result.runs[1] == timedelta(hours=23)
    assert result.next_run_at == datetime(2025, 4, 2, 7, 0, tzinfo=UTC)  # 09:00 CEST


def test_an_unknown_policy_acts_as_once() -> None:
    now = P + timedelta(minutes=5, seconds=1)
    assert plan(MINUTE, UTC_ZONE, P, now, "twice") == plan(MINUTE, UTC_ZONE, P, now, "once")
