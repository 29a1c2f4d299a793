"""Outcomes waiting to be recorded in batches, and the callbacks' thread
(``worker/completion.py``)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from django_pgtasks.lifecycle.transitions import Succeeded
from django_pgtasks.worker.completion import Callbacks, PendingOutcomes


def hand_in(pending: PendingOutcomes, *pks: int) -> None:
    for pk in pks:
        pending.add(SimpleNamespace(pk=pk), Succeeded(pk), lambda status: None)


def test_nothing_waiting_is_never_due() -> None:
    assert PendingOutcomes(window=0.005, max_batch=10).due_in() is None


def test_the_first_outcome_is_due_a_window_after_it_came() -> None:
    pending = PendingOutcomes(window=3600.0, max_batch=10)
    hand_in(pending, 1)
    due = pending.due_in()
    assert due is not None
    assert 3590 < due <= 3600


def test_a_window_of_zero_is_due_at_once() -> None:
    pending = PendingOutcomes(window=0.0, max_batch=10)
    hand_in(pending, 1)
    assert pending.due_in() == 0.0


def test_a_full_batch_is_due_at_once_whatever_the_window() -> None:
    pending = PendingOutcomes(window=3600.0, max_batch=3)
    hand_in(pending, 1, 2)
    assert pending.due_in() > 0
    hand_in(pending, 3)
    assert pending.due_in() == 0.0


def test_take_gives_at_most_a_batch_the_oldest_first() -> None:
    pending = PendingOutcomes(window=0.0, max_batch=2)
    hand_in(pending, 1, 2, 3)
    first = pending.take()
    assert [task.pk for task, *_ in first] == [1, 2]
    assert [outcome for _, outcome, *_ in first] == [Succeeded(1), Succeeded(2)]
    assert [task.pk for task, *_ in pending.take()] == [3]
    assert pending.take() == []
    assert pending.due_in() is None


def test_ids_stay_listed_until_forgotten() -> None:
    """Taken but not yet recorded: the orphan check must not give them back meanwhile."""
    pending = PendingOutcomes(window=0.0, max_batch=10)
    hand_in(pending, 7, 8)
    taken = pending.take()
    assert pending.ids() == {7, 8}
    pending.forget(taken[:1])
    assert pending.ids() == {8}
    pending.forget(taken)
    assert pending.ids() == set()


def test_pool_threads_may_hand_in_at_the_same_time() -> None:
    pending = PendingOutcomes(window=0.0, max_batch=10_000)
    threads = [threading.Thread(target=hand_in, args=(pending, *range(i * 100, i * 100 + 100)))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pending.ids() == set(range(800))
    assert len(pending.take()) == 800


def test_callbacks_run_in_order_on_their_own_thread_and_one_failing_spoils_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callbacks = Callbacks()
    ran: list[tuple[int, str]] = []

    def record(n: int) -> None:
        ran.append((n, threading.current_thread().name))

    def broken() -> None:
        raise RuntimeError("broken receiver")

    with caplog.at_level(logging.ERROR, logger="django_pgtasks.worker"):
        callbacks.call(lambda: record(1))
        callbacks.call(broken)
        callbacks.call(lambda: record(2))
        assert callbacks.stop(timeout=10)
    assert ran == [(1, "pgtasks-callbacks"), (2, "pgtasks-callbacks")]
    assert "Error in a callback run after a task's outcome was recorded." in caplog.text


def test_callbacks_that_were_never_called_stop_at_once() -> None:
    assert Callbacks().stop(timeout=0)


def test_a_callback_that_hangs_is_left_behind_when_stopping() -> None:
    callbacks = Callbacks()
    release = threading.Event()
    callbacks.call(lambda: release.wait(30))
    try:
        assert not callbacks.stop(timeout=0.05)
    finally:
        release.set()
