"""Schedules as values: periods, cron expressions, and the calendar arithmetic that steps
from one planned time to the next in a time zone, across DST gaps and overlaps."""

from __future__ import annotations

import itertools
import re
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_pgtasks import pgtask
from django_pgtasks.definition import registry
from django_pgtasks.definition.recurrence import (
    Cron,
    Every,
    cron,
    default_timezone,
    every,
    format_period,
    parse_spec,
    parse_when,
    zone,
)

UTC_ZONE = zone("UTC")


def chain(when: Every | Cron, tz: str, start: datetime, n: int) -> list[datetime]:
    """``n`` planned times after ``start``, each computed from the previous planned one."""
    times, planned = [], start
    for _ in range(n):
        planned = when.next_after(planned, zone(tz))
        times.append(planned)
    return times


def local(moment: datetime, tz: str) -> str:
    """``moment`` as wall-clock time in ``tz``, with its offset: ``2025-03-30 03:00+02:00``."""
    return moment.astimezone(zone(tz)).isoformat(sep=" ", timespec="minutes")


# -- periods -----------------------------------------------------------------------------------


def test_periods_are_given_several_ways_and_shown_compactly() -> None:
    assert every(minutes=5) == Every(timedelta(minutes=5)) == parse_when(300)
    assert parse_when(timedelta(hours=1)) == every(hours=1)
    assert every(minutes=90).spec == "every 1h30m"
    assert every(0.5).spec == "every 0.5s"
    assert every(days=1, seconds=1.25).spec == "every 1d1.25s"
    assert parse_when("0  3 * * *") == Cron("0 3 * * *")
    assert cron("@daily").spec == "0 0 * * *"


@pytest.mark.parametrize(("period", "text"), [
    (timedelta(seconds=90), "1m30s"),
    (timedelta(hours=1, minutes=30), "1h30m"),
    (timedelta(days=2, hours=4), "2d4h"),
    (timedelta(days=1, seconds=1), "1d1s"),
    (timedelta(milliseconds=250), "0.25s"),
    (timedelta(0), "0s"),
    (timedelta(weeks=1), "7d"),
])
def test_format_period_writes_each_unit_once(period: timedelta, text: str) -> None:
    assert format_period(period) == text


@pytest.mark.parametrize("period", [
    timedelta(seconds=1), timedelta(seconds=0.5), timedelta(minutes=90),
    timedelta(days=3, hours=2, minutes=1, seconds=7), timedelta(days=400),
])
def test_a_period_spec_reads_back_as_the_same_period(period: timedelta) -> None:
    assert parse_spec(Every(period).spec) == Every(period)


@pytest.mark.parametrize(("spec", "expected"), [
    ("every 1h30m", Every(timedelta(hours=1, minutes=30))),
    ("every 90s", Every(timedelta(seconds=90))),
    ("every 0.5s", Every(timedelta(seconds=0.5))),
    ("  every 1d 2h ", Every(timedelta(days=1, hours=2))),
    ("@hourly", Cron("0 * * * *")),
    ("EVERY 90S", Every(timedelta(seconds=90))),
    ("every 1h 1h", Every(timedelta(hours=2))),  # repeated units add up
    ("every 1.5h", Every(timedelta(minutes=90))),
])
def test_specs_as_typed(spec: str, expected: Any) -> None:
    assert parse_spec(spec) == expected
    assert parse_spec(expected.spec) == expected  # what is stored reads back the same


@pytest.mark.parametrize(("spec", "message"), [
    ("every 5x", "'every 5x' is not a period: write it as 'every 1d2h30m'"),
    ("every", "'every' is not a period"),
    ("every 99999999999999d", "The period of 'every 99999999999999d' is too long."),
    ("every 0s", "must be positive, not 0 seconds"),
    (42, "A schedule must be text, not 42."),
])
def test_a_spec_that_is_no_schedule_says_why(spec: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        parse_spec(spec)


def test_a_spec_that_is_not_a_period_is_read_as_cron() -> None:
    assert parse_spec("*/5 * * * *") == Cron("*/5 * * * *")
    assert parse_spec("@hourly") == Cron("0 * * * *")


@pytest.mark.parametrize(("value", "message"), [
    (0, "must be positive, not 0 seconds"),
    (-1, "must be positive, not -1 seconds"),
    (timedelta(seconds=-5), "must be positive"),
    (True, "must be a period"),
    (None, "must be a period"),
    (b"60", "must be a period"),
    ([60], "must be a period"),
])
def test_a_value_that_is_no_period_is_refused(value: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        parse_when(value)


def test_every_takes_a_period_or_units_not_both() -> None:
    with pytest.raises(ImproperlyConfigured, match="a period or keyword units, not both"):
        every(60, minutes=1)
    with pytest.raises(ImproperlyConfigured, match="must be positive"):
        every()  # no unit at all is a zero period
    assert every(hours=1, minutes=30) == every(timedelta(minutes=90)) == every(5400)


def test_a_period_instance_checks_its_own_type() -> None:
    with pytest.raises(ImproperlyConfigured, match="must be a timedelta, not 60"):
        Every(60)  # type: ignore[arg-type]


def test_a_period_runs_exactly_its_length_apart_in_elapsed_time() -> None:
    """``every(days=1)`` is 24 real hours: across Paris's spring gap it moves from 09:00 to
    10:00 local time (a cron expression keeps the local time instead)."""
    daily = every(days=1)
    start = datetime(2025, 3, 29, 8, 0, tzinfo=UTC)  # 09:00 CET
    times = chain(daily, "Europe/Paris", start, 2)
    assert times == [start + timedelta(days=1), start + timedelta(days=2)]
    assert [local(t, "Europe/Paris") for t in times] == [
        "2025-03-30 10:00+02:00", "2025-03-31 10:00+02:00"]


def test_a_new_period_schedule_is_due_at_once() -> None:
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert every(minutes=5).first(now, UTC_ZONE) == now


@pytest.mark.parametrize(("elapsed", "expected"), [
    (timedelta(0), timedelta(minutes=5)),  # exactly on a planned time: the next one
    (timedelta(seconds=1), timedelta(minutes=5)),
    (timedelta(minutes=5), timedelta(minutes=10)),
    (timedelta(minutes=12, seconds=30), timedelta(minutes=15)),
    (timedelta(days=1), timedelta(days=1, minutes=5)),
])
def test_the_first_time_after_now_stays_on_the_chain_of_planned_times(
    elapsed: timedelta, expected: timedelta,
) -> None:
    planned = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    every_five = every(minutes=5)
    assert every_five.first_after(planned, planned + elapsed, UTC_ZONE) == planned + expected


def test_a_planned_time_still_ahead_is_its_own_first_time() -> None:
    planned = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    assert every(minutes=5).first_after(planned, planned - timedelta(hours=1),
                                        UTC_ZONE) == planned


def test_a_restarted_period_schedule_resumes_its_period_or_now() -> None:
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    hourly = every(hours=1)
    assert hourly.restart(None, now, UTC_ZONE) == now
    # Last planned 10 minutes ago: the next is 50 minutes away, not now.
    assert hourly.restart(now - timedelta(minutes=10), now, UTC_ZONE) == now + timedelta(
        minutes=50)
    # Last planned long ago: at once.
    assert hourly.restart(now - timedelta(days=3), now, UTC_ZONE) == now


# -- cron expressions --------------------------------------------------------------------------


def test_cron_expressions_take_five_or_six_fields_or_an_alias() -> None:
    start = datetime(2026, 1, 5, 12, 0, 1, tzinfo=UTC)  # a Monday
    assert cron("*/10 * * * * *").next_after(start, UTC_ZONE) == start + timedelta(seconds=9)
    assert cron("15 * * * *").next_after(start, UTC_ZONE) == datetime(2026, 1, 5, 12, 15,
                                                                       tzinfo=UTC)
    assert cron("@hourly").next_after(start, UTC_ZONE) == datetime(2026, 1, 5, 13, tzinfo=UTC)
    assert cron("@weekly").next_after(start, UTC_ZONE) == datetime(2026, 1, 11, tzinfo=UTC)
    assert cron("@monthly").spec == "0 0 1 * *"


@pytest.mark.parametrize(("alias", "expression"), [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"), ("@DAILY", "0 0 * * *"), ("  @hourly ", "0 * * * *"),
])
def test_cron_aliases_are_stored_as_their_five_fields(alias: str, expression: str) -> None:
    assert cron(alias).spec == expression
    assert cron(alias) == Cron(expression)


def test_whitespace_inside_an_expression_is_normalised() -> None:
    assert cron(" 0\t3  *  * * ").spec == "0 3 * * *"


@pytest.mark.parametrize(("expression", "message"), [
    ("61 * * * *", "Invalid cron expression '61 * * * *': Bad minute."),
    ("0 25 * * *", "Invalid cron expression '0 25 * * *': Bad hour."),
    ("0 0 30 2 *", "Invalid cron expression '0 0 30 2 *': Bad day-of-month."),
    ("0 0 31 4 *", "Bad day-of-month"),  # April has 30 days
    ("0 0 * 13 *", "Bad month"),
    ("0 0 * * 8", "Bad day-of-week"),
    ("* * *", "Wrong number of fields"),
    ("* * * * * * *", "Wrong number of fields"),
    ("", "Wrong number of fields"),
    ("@reboot", "Wrong number of fields"),  # no time to plan
    ("a b c d e", "Bad minute"),
])
def test_an_invalid_cron_expression_names_the_bad_field(expression: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        cron(expression)


def test_a_cron_expression_must_be_text() -> None:
    with pytest.raises(ImproperlyConfigured, match="must be a string, not 5"):
        Cron(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "message"), [
    ("61 * * * *", "Invalid cron expression '61 * * * *': Bad minute."),
    ("* * *", "Wrong number of fields"),
    ("0 0 30 2 *", "Bad day-of-month"),
    (0, "must be positive"),
    (timedelta(seconds=-5), "must be positive"),
    (True, "must be a period"),
    ("", "Wrong number of fields"),
])
def test_an_invalid_schedule_fails_when_the_decorator_runs(
    value: Any, message: str, temporary_handlers: None
) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        pgtask(name="tests.invalid_schedule", schedule=value)(lambda: None)
    assert "tests.invalid_schedule" not in registry.registered_names()


@pytest.mark.parametrize(("name", "message"), [
    ("Mars/Olympus", "Unknown time zone 'Mars/Olympus'"),
    ("", "Invalid time zone ''"),
    ("Europe/" + "x" * 60, "Invalid time zone"),  # longer than the column
    ("../etc/passwd", "Unknown time zone"),
])
def test_an_unknown_time_zone_fails_at_declaration(name: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        cron("0 9 * * *", timezone=name)


def test_zone_refuses_what_is_not_a_name() -> None:
    with pytest.raises(ImproperlyConfigured, match="Invalid time zone None"):
        zone(None)  # type: ignore[arg-type]
    assert zone("Europe/Paris") is zone("Europe/Paris")  # looked up once


def test_the_default_time_zone_is_the_time_zone_setting(settings: Any) -> None:
    settings.TIME_ZONE = "America/New_York"
    assert default_timezone() == "America/New_York"
    settings.TIME_ZONE = None
    assert default_timezone() == "UTC"


def test_a_cron_schedule_without_cronsim_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # makes `import cronsim` fail
    with pytest.raises(ImproperlyConfigured, match="pip install cronsim"):
        cron("7 7 7 7 *")  # an expression no other test validates (the result is cached)
    assert every(minutes=1).period == timedelta(minutes=1)  # periods do not need it


def test_cron_times_come_back_in_utc() -> None:
    nine = cron("0 9 * * *")
    after = nine.next_after(datetime(2025, 6, 1, 12, 0, tzinfo=UTC), zone("Asia/Tokyo"))
    assert after.tzinfo is UTC
    assert after == datetime(2025, 6, 2, 0, 0, tzinfo=UTC)  # 09:00 in Tokyo (UTC+9)


def test_the_last_day_of_the_month_follows_leap_years() -> None:
    last = cron("0 0 L * *")
    times = chain(last, "UTC", datetime(2024, 1, 31, 12, 0, tzinfo=UTC), 3)
    assert [t.date().isoformat() for t in times] == ["2024-02-29", "2024-03-31", "2024-04-30"]
    times = chain(last, "UTC", datetime(2025, 1, 31, 12, 0, tzinfo=UTC), 1)
    assert times[0].date().isoformat() == "2025-02-28"


def test_weekdays_only_skip_the_weekend() -> None:
    weekdays = cron("0 9 * * 1-5")
    times = chain(weekdays, "UTC", datetime(2026, 1, 8, 10, 0, tzinfo=UTC), 3)  # a Thursday
    assert [t.strftime("%a %d") for t in times] == ["Fri 09", "Mon 12", "Tue 13"]


def test_a_cron_first_time_is_its_next_match_after_now() -> None:
    now = datetime(2026, 1, 5, 12, 7, tzinfo=UTC)
    quarter = cron("*/15 * * * *")
    assert quarter.first(now, UTC_ZONE) == datetime(2026, 1, 5, 12, 15, tzinfo=UTC)
    assert quarter.restart(now - timedelta(days=1), now, UTC_ZONE) == datetime(
        2026, 1, 5, 12, 15, tzinfo=UTC)
    # Planned long before now: the first match after now, not the one after planned.
    assert quarter.first_after(now - timedelta(hours=5), now, UTC_ZONE) == datetime(
        2026, 1, 5, 12, 15, tzinfo=UTC)
    # Planned after now: the first match after planned.
    assert quarter.first_after(now + timedelta(hours=1), now, UTC_ZONE) == datetime(
        2026, 1, 5, 13, 15, tzinfo=UTC)


# -- across DST changes --------------------------------------------------------------------


@pytest.mark.parametrize("tz", ["Europe/Paris", "Europe/Berlin"])
def test_a_daily_cron_in_the_spring_gap_runs_right_after_the_jump(tz: str) -> None:
    """2025-03-30: clocks jump from 02:00 to 03:00, so 02:30 does not exist that day."""
    daily = cron("30 2 * * *", timezone=tz)
    times = chain(daily, tz, datetime(2025, 3, 29, 1, 30, tzinfo=UTC), 3)
    assert [local(t, tz) for t in times] == [
        "2025-03-30 03:00+02:00",  # right after the jump
        "2025-03-31 02:30+02:00",
        "2025-04-01 02:30+02:00",
    ]


@pytest.mark.parametrize("tz", ["Europe/Paris", "Europe/Berlin"])
def test_a_daily_cron_in_the_autumn_overlap_runs_once(tz: str) -> None:
    """2025-10-26: clocks go back from 03:00 to 02:00, so 02:30 happens twice: one run."""
    daily = cron("30 2 * * *", timezone=tz)
    times = chain(daily, tz, datetime(2025, 10, 25, 0, 30, tzinfo=UTC), 3)
    assert times == [
        datetime(2025, 10, 26, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first 02:30
        datetime(2025, 10, 27, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2025, 10, 28, 1, 30, tzinfo=UTC),
    ]


def test_a_daily_cron_in_new_yorks_spring_gap_runs_at_three() -> None:
    """2025-03-09: 02:00 EST becomes 03:00 EDT."""
    times = chain(cron("30 2 * * *"), "America/New_York",
                  datetime(2025, 3, 8, 12, 0, tzinfo=UTC), 3)
    assert [local(t, "America/New_York") for t in times] == [
        "2025-03-09 03:00-04:00", "2025-03-10 02:30-04:00", "2025-03-11 02:30-04:00"]


def test_a_daily_cron_in_new_yorks_autumn_overlap_runs_once_at_the_first() -> None:
    """2025-11-02: 02:00 EDT becomes 01:00 EST, so 01:30 happens twice."""
    times = chain(cron("30 1 * * *"), "America/New_York",
                  datetime(2025, 11, 1, 12, 0, tzinfo=UTC), 3)
    assert times == [
        datetime(2025, 11, 2, 5, 30, tzinfo=UTC),  # 01:30 EDT
        datetime(2025, 11, 3, 6, 30, tzinfo=UTC),  # 01:30 EST
        datetime(2025, 11, 4, 6, 30, tzinfo=UTC),
    ]


def test_a_daily_cron_keeps_its_local_time_when_new_york_changes_to_summer_time() -> None:
    nine = cron("0 9 * * *", timezone="America/New_York")
    times = chain(nine, "America/New_York", datetime(2025, 3, 7, 15, 0, tzinfo=UTC), 3)
    assert times == [
        datetime(2025, 3, 8, 14, 0, tzinfo=UTC),  # 09:00 EST
        datetime(2025, 3, 9, 13, 0, tzinfo=UTC),  # 09:00 EDT
        datetime(2025, 3, 10, 13, 0, tzinfo=UTC),
    ]


@pytest.mark.parametrize(("tz", "start", "day", "hours"), [
    ("Europe/Berlin", datetime(2025, 10, 25, 21, 59, tzinfo=UTC), 26, 25),  # fall back
    ("Europe/Paris", datetime(2025, 3, 29, 22, 59, tzinfo=UTC), 30, 23),  # spring forward
    ("America/New_York", datetime(2025, 11, 2, 3, 59, tzinfo=UTC), 2, 25),
    ("America/New_York", datetime(2025, 3, 9, 4, 59, tzinfo=UTC), 9, 23),
])
def test_hourly_cron_runs_every_real_hour_across_a_dst_change(
    tz: str, start: datetime, day: int, hours: int,
) -> None:
    """Every real hour has its run, so the long day has 25 of them and the short one 23."""
    times = chain(cron("0 * * * *"), tz, start, 26)
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(times))
    local_days = Counter(t.astimezone(zone(tz)).date().day for t in times)
    assert local_days[day] == hours


def test_a_half_hourly_cron_runs_every_real_half_hour_through_the_overlap() -> None:
    times = chain(cron("*/30 * * * *"), "America/New_York",
                  datetime(2025, 11, 2, 4, 50, tzinfo=UTC), 6)
    assert [local(t, "America/New_York") for t in times] == [
        "2025-11-02 01:00-04:00", "2025-11-02 01:30-04:00",  # EDT
        "2025-11-02 01:00-05:00", "2025-11-02 01:30-05:00",  # the same times again, EST
        "2025-11-02 02:00-05:00", "2025-11-02 02:30-05:00",
    ]
