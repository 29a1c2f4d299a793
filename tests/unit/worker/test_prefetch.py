"""How many tasks the worker's loop claims at a time (``worker/prefetch.py``): enough to fill
its free threads, and with ``PREFETCH`` some more, ``"auto"`` following its run times."""

from __future__ import annotations

import pytest

from django_pgtasks.worker.prefetch import AUTO_PREFETCH_PER_THREAD, RUN_TIME_WEIGHT, Prefetch


@pytest.mark.parametrize(("threads", "busy", "wanted"), [
    (4, 0, 4), (4, 3, 1), (4, 4, 0), (4, 9, 0), (0, 0, 0),
])
def test_without_prefetch_a_claim_fills_the_free_threads(
    threads: int, busy: int, wanted: int,
) -> None:
    assert Prefetch(0, concurrency=4, horizon=0.1).wanted(threads, busy) == wanted


@pytest.mark.parametrize(("busy", "wanted"), [
    (0, 6),  # the threads and the prefetch
    (3, 3),
    (4, 2),  # every thread busy, the prefetch not yet all started: top it up
    (5, 0),  # a prefetched task still waits for a thread: nothing yet
    (10, 0),
])
def test_a_fixed_prefetch_claims_that_many_beyond_the_threads(busy: int, wanted: int) -> None:
    assert Prefetch(2, concurrency=4, horizon=0.1).wanted(4, busy) == wanted


def test_resting_threads_are_not_claimed_for_nor_prefetched_for_when_all_rest() -> None:
    prefetch = Prefetch(5, concurrency=4, horizon=0.1)
    assert prefetch.wanted(2, 0) == 7  # two threads take tasks
    assert prefetch.wanted(0, 0) == 0  # every thread rests: nothing to claim


def test_auto_prefetches_nothing_before_a_run_time_is_known() -> None:
    prefetch = Prefetch("auto", concurrency=4, horizon=0.1)
    assert prefetch.ahead() == 0
    assert prefetch.wanted(4, 0) == 4


@pytest.mark.parametrize(("mean", "ahead"), [
    (0.1, 4),  # each thread runs one task within the horizon
    (0.05, 8),
    (0.5, 0),  # tasks longer than the horizon: nothing waits for a thread
    (0.001, 4 * AUTO_PREFETCH_PER_THREAD),  # capped per thread
    (0.0, 4 * AUTO_PREFETCH_PER_THREAD),
])
def test_auto_holds_about_the_horizons_worth_of_work(mean: float, ahead: int) -> None:
    prefetch = Prefetch("auto", concurrency=4, horizon=0.1)
    prefetch.mean_run_time = mean
    assert prefetch.ahead() == ahead


def test_the_mean_run_time_follows_recent_runs() -> None:
    prefetch = Prefetch("auto", concurrency=1, horizon=0.1)
    prefetch.ran(2.0)
    assert prefetch.mean_run_time == 2.0  # the first run sets it
    prefetch.ran(1.0)
    assert prefetch.mean_run_time == pytest.approx(2.0 - RUN_TIME_WEIGHT)
    for _ in range(200):
        prefetch.ran(0.001)
    assert prefetch.mean_run_time == pytest.approx(0.001, abs=1e-6)
    assert prefetch.ahead() == AUTO_PREFETCH_PER_THREAD
