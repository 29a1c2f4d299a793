"""Retry delay policies (``retry.py``): exponential, linear and constant backoff, their caps,
and the jitter that keeps tasks that failed together from retrying in lock-step."""

from __future__ import annotations

import random
import re
import statistics

import pytest

from django_pgtasks import retry
from django_pgtasks.retry import constant, exponential, linear, resolve


@pytest.fixture
def extreme_jitter(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``random.uniform`` returns the bound it is given, low or high as the test says."""
    sides: list[float] = []

    def uniform(low: float, high: float) -> float:
        return low if sides.pop(0) < 0 else high

    monkeypatch.setattr(retry.random, "uniform", uniform)
    return sides


@pytest.mark.parametrize(("attempt", "delay"), [(1, 10.0), (2, 20.0), (3, 40.0), (6, 320.0),
                                                (9, 2560.0), (10, 3600.0), (50, 3600.0)])
def test_exponential_doubles_from_its_base_up_to_its_cap(attempt: int, delay: float) -> None:
    assert exponential(base=10, maximum=3600, jitter=0)(attempt) == delay


@pytest.mark.parametrize("attempt", [63, 64, 1000, 10**9])
def test_exponential_never_overflows_on_a_huge_attempt(attempt: int) -> None:
    assert exponential(base=10, maximum=3600, jitter=0)(attempt) == 3600.0
    assert exponential(base=1, maximum=float("inf"), jitter=0)(attempt) == 2.0**62


@pytest.mark.parametrize(("attempt", "delay"), [(1, 5.0), (2, 10.0), (7, 35.0), (20, 60.0)])
def test_linear_grows_by_its_step_up_to_its_cap(attempt: int, delay: float) -> None:
    assert linear(step=5, maximum=60, jitter=0)(attempt) == delay


@pytest.mark.parametrize("attempt", [1, 2, 10, 1000])
def test_constant_is_the_same_before_every_retry(attempt: int) -> None:
    assert constant(7.5)(attempt) == 7.5


@pytest.mark.parametrize(("policy", "attempt", "base"), [
    (exponential(base=10, maximum=10_000, jitter=0.25), 3, 40.0),
    (linear(step=10, maximum=10_000, jitter=0.25), 3, 30.0),
])
def test_jitter_spreads_a_delay_by_at_most_its_fraction_either_way(
    extreme_jitter: list[float], policy: retry.Backoff, attempt: int, base: float,
) -> None:
    extreme_jitter.extend([-1, +1])
    assert policy(attempt) == base * 0.75
    assert policy(attempt) == base * 1.25


def test_jitter_spreads_delays_over_the_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry.random, "uniform", random.Random(20260105).uniform)
    policy = exponential(base=100, maximum=10_000, jitter=0.25)
    delays = [policy(1) for _ in range(2000)]
    assert all(75.0 <= d <= 125.0 for d in delays)
    assert min(delays) < 77.0
    assert max(delays) > 123.0
    assert abs(statistics.mean(delays) - 100.0) < 2.0  # centred on the delay
    assert len(set(delays)) > 1900  # no lock-step


def test_the_cap_holds_after_jitter(extreme_jitter: list[float]) -> None:
    extreme_jitter.extend([+1, +1])
    assert exponential(base=10, maximum=100, jitter=0.5)(4) == 100.0  # 80 * 1.5 capped
    assert linear(step=10, maximum=100, jitter=0.5)(10) == 100.0


def test_jitter_of_more_than_one_never_makes_a_negative_delay(
    extreme_jitter: list[float],
) -> None:
    extreme_jitter.extend([-1, -1])
    assert exponential(base=10, maximum=100, jitter=3.0)(1) == 0.0
    assert linear(step=10, maximum=100, jitter=3.0)(1) == 0.0


@pytest.mark.parametrize("jitter", [0, 0.0, -0.5])
def test_no_jitter_gives_the_exact_delay(jitter: float) -> None:
    assert {exponential(base=3, maximum=100, jitter=jitter)(2) for _ in range(20)} == {6.0}


def test_omitted_parameters_follow_the_settings_when_the_delay_is_computed(pgtasks) -> None:
    policy_e, policy_l = exponential(), linear()  # made before the settings change
    pgtasks(BACKOFF_BASE=2.0, BACKOFF_MAX=50.0, BACKOFF_JITTER=0)
    assert [policy_e(n) for n in (1, 2, 3, 6, 7)] == [2.0, 4.0, 8.0, 50.0, 50.0]
    assert [policy_l(n) for n in (1, 2, 25, 26)] == [2.0, 4.0, 50.0, 50.0]
    pgtasks(BACKOFF_BASE=3.0, BACKOFF_MAX=50.0, BACKOFF_JITTER=0)
    assert policy_e(2) == 6.0


def test_the_default_settings_are_ten_seconds_doubling_to_an_hour(settings) -> None:
    settings.PGTASKS = {"BACKOFF_JITTER": 0}  # the defaults otherwise (the tests' base is 0)
    policy = resolve(None)
    assert [policy(n) for n in (1, 2, 3, 10)] == [10.0, 20.0, 40.0, 3600.0]


def test_resolve_turns_names_callables_and_none_into_policies(pgtasks) -> None:
    pgtasks(BACKOFF="linear", BACKOFF_BASE=1.0, BACKOFF_JITTER=0)
    assert resolve(None)(3) == 3.0  # the BACKOFF setting
    assert resolve("exponential")(3) == 4.0
    own = constant(9)
    assert resolve(own) is own


def test_a_callable_backoff_setting_is_used_as_it_is(pgtasks) -> None:
    own = constant(1.5)
    pgtasks(BACKOFF=own)
    assert resolve(None) is own


@pytest.mark.parametrize("name", ["fibonacci", "", "Linear"])
def test_an_unknown_policy_name_is_refused_naming_the_known_ones(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(
            f"Unknown backoff policy {name!r}; use one of ['exponential', 'linear'] or a "
            f"callable.")):
        resolve(name)
