"""Outcomes waiting to be recorded in batches, and the callbacks' thread
(``worker/completion.py``)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from django_pgtasks.lifecycle.transitions import Succeeded
from django_pgtasks.worker.completion import (
    Callbacks,
    Completion,
    PendingOutcomes,
    _call_each,
)


def hand_in(pending: PendingOutcomes, *pks: int) -> None:
    for pk in pks:
        pending.add(SimpleNamespace(pk=pk, id=pk), Succeeded(pk), lambda status: None)


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


# The callbacks of a recorded batch run as one job: one that raises spoils none of the others.


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


# -- the worker's part that records them ------------------------------------------------------


class FakeRecorder:
    """Records nothing: answers each batch with the statuses it is told, or raises."""

    def __init__(self, statuses: dict[int, str | None] | Exception) -> None:
        self.statuses = statuses
        self.batches: list[list[int]] = []

    def record(self, runs: list) -> dict[int, str | None]:
        self.batches.append([task.pk for task, _outcome in runs])
        if isinstance(self.statuses, Exception):
            raise self.statuses
        return {pk: status for pk, status in self.statuses.items()
                if pk in self.batches[-1]}


class Completed:
    """A :class:`Completion` over a fake recorder, and what it told the loop."""

    def __init__(self, statuses: dict[int, str | None] | Exception, window: float = 0.0):
        self.recorder = FakeRecorder(statuses)
        self.wakeup = threading.Event()
        self.released: list[bool] = []
        self.lost: list[bool] = []
        self.done: list[tuple[int, str | None]] = []
        self.completion = Completion(
            self.recorder, window=window, wakeup=self.wakeup,  # type: ignore[arg-type]
            on_release=lambda: self.released.append(True), lost=lambda: self.lost.append(True))

    def hand_in(self, pk: int, has_dependents: bool = False) -> None:
        task = SimpleNamespace(pk=pk, id=pk, has_dependents=has_dependents)
        self.completion.hand_in(task, Succeeded(pk),
                                lambda status: self.done.append((pk, status)))

    def finish(self) -> None:
        assert self.completion.stop(timeout=10)


def test_handing_in_wakes_the_loop_and_lists_the_task() -> None:
    completed = Completed({1: "SUCCESSFUL"})
    completed.hand_in(1)
    assert completed.wakeup.is_set()
    assert completed.completion.ids() == {1}
    assert completed.completion.due_in() == 0.0


def test_a_batch_is_recorded_in_one_call_and_each_callback_gets_its_status() -> None:
    completed = Completed({1: "SUCCESSFUL", 2: "", 3: "AWAITING_RETRY"})
    for pk in (1, 2, 3):
        completed.hand_in(pk)
    completed.completion.record()
    completed.finish()
    assert completed.recorder.batches == [[1, 2, 3]]
    assert completed.done == [(1, "SUCCESSFUL"), (2, ""), (3, "AWAITING_RETRY")]
    assert completed.completion.ids() == set()
    assert completed.lost == []  # "" is a task no longer held, not an unrecorded outcome
    assert completed.released == []


def test_outcomes_inside_their_window_wait_unless_everything_is_asked_for() -> None:
    completed = Completed({1: "SUCCESSFUL"}, window=3600.0)
    completed.hand_in(1)
    completed.completion.record()
    assert completed.recorder.batches == []
    completed.completion.record(everything=True)
    completed.finish()
    assert completed.recorder.batches == [[1]]


def test_an_outcome_that_could_not_be_recorded_tells_the_loop() -> None:
    completed = Completed({1: "SUCCESSFUL", 2: None})
    completed.hand_in(1)
    completed.hand_in(2)
    completed.completion.record()
    completed.finish()
    assert completed.lost == [True]
    assert completed.done == [(1, "SUCCESSFUL"), (2, None)]


def test_a_recorder_that_fails_loses_the_batch_but_not_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completed = Completed(RuntimeError("a defect"))
    completed.hand_in(1)
    with caplog.at_level(logging.ERROR, logger="django_pgtasks.worker"):
        completed.completion.record()
    completed.finish()
    assert "Error while recording 1 outcome(s)." in caplog.text
    assert completed.lost == [True]  # the orphan check takes over
    assert completed.done == [(1, None)]
    assert completed.completion.ids() == set()


def test_a_task_with_dependents_asks_for_a_release() -> None:
    completed = Completed({1: "SUCCESSFUL", 2: "SUCCESSFUL"})
    completed.hand_in(1)
    completed.hand_in(2, has_dependents=True)
    completed.completion.record()
    completed.finish()
    assert completed.released == [True]  # once for the batch


def test_outcomes_added_by_many_threads_are_each_taken_once_in_each_threads_order() -> None:
    """Without a lock: 8 threads hand in 2,000 outcomes each while one thread (the loop's)
    takes and forgets them; every outcome is taken once, each thread's in the order it handed
    them in, and no id is left listed."""
    pending = PendingOutcomes(window=0.0, max_batch=50)
    threads_done = threading.Event()
    taken: list[int] = []

    def loop() -> None:
        while True:
            finished = threads_done.is_set()  # read before the last take
            while pending.due_in() is not None:
                entries = pending.take()
                taken.extend(task.pk for task, *_ in entries)
                pending.forget(entries)
            if finished:
                return

    def hand_in_many(thread: int) -> None:
        hand_in(pending, *(thread * 100_000 + i for i in range(2_000)))

    taker = threading.Thread(target=loop)
    taker.start()
    workers = [threading.Thread(target=hand_in_many, args=(n,)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    threads_done.set()
    taker.join()
    assert sorted(taken) == sorted(n * 100_000 + i for n in range(8) for i in range(2_000))
    for n in range(8):
        mine = [pk for pk in taken if pk // 100_000 == n]
        assert mine == sorted(mine)
    assert pending.ids() == set()
    assert pending.due_in() is None
