"""The process pool's side of a child's socket, without a child process: what a slot reads
after it stopped a child, and what starts a cancellation's grace.

A child stopped at its time limit or past its cancellation's grace may have ended its run on
its own a moment before: its report, sent before it went, is the run's outcome (an
``atomic=True`` handler's is recorded already), not the stop. And only the cancellation of
the run a slot waits for starts the grace: a wake-up left over from its last run does not."""

from __future__ import annotations

import socket
import time
from multiprocessing.connection import Connection

from django_pgtasks.definition.registry import cancel_signal
from django_pgtasks.lifecycle.transitions import Succeeded
from django_pgtasks.models import Task
from django_pgtasks.worker.executor import RunReport
from django_pgtasks.worker.pools.processes import (
    ProcessPool,
    _Child,
    _Stopped,
    _Waker,
    late_report,
)


def _pair() -> tuple[_Child, Connection]:
    ours, theirs = socket.socketpair()
    return _Child(0, ours), Connection(theirs.detach())


def test_a_report_sent_before_the_child_went_is_read_past_its_other_messages() -> None:
    child, sent = _pair()
    sent.send(("started",))
    sent.send(("ended", RunReport(outcome=Succeeded(3)), 4096))
    sent.close()
    report, rss = late_report(child)
    assert (report.outcome, rss) == (Succeeded(3), 4096)


def test_a_child_stopped_before_it_ended_its_run_sent_no_report() -> None:
    child, sent = _pair()
    sent.send(("started",))
    sent.close()
    assert late_report(child) is None


def test_a_child_that_sent_nothing_yet_is_not_waited_for() -> None:
    child, sent = _pair()
    assert late_report(child) is None  # returns at once: nothing is there to read
    sent.close()


def _slot_waiting(grace: float) -> ProcessPool:
    """A pool as far as a slot's wait needs it: its grace (no fork server, no slots)."""
    pool = ProcessPool.__new__(ProcessPool)
    pool._cancel_grace = grace
    return pool


def test_a_wake_up_left_over_from_the_last_run_starts_no_grace() -> None:
    child, sent = _pair()
    waker = _Waker()
    waker.wake()  # the last run's cancellation, its callback late: this run is not cancelled
    deadline = time.monotonic() + 0.2  # its time limit, the only end of this wait
    report = _slot_waiting(0.0)._wait_for_report(child, Task(pk=2, name="unknown.task"),
                                                 deadline, waker)
    assert report is _Stopped.TIME_LIMIT  # not stopped as cancelled, at once
    sent.send(("ended", RunReport(outcome=Succeeded(1)), 0))
    assert _slot_waiting(0.0)._wait_for_report(
        child, Task(pk=2, name="unknown.task"), None, waker) == (
        RunReport(outcome=Succeeded(1)), 0)  # the wake-up was used up
    sent.close()
    waker.close()


def test_the_cancellation_of_the_run_waited_for_starts_its_grace() -> None:
    child, sent = _pair()
    waker = _Waker()
    task = Task(pk=3, name="unknown.task")
    cancel_signal(task).set()
    waker.wake()
    assert _slot_waiting(0.0)._wait_for_report(child, task, None, waker) is _Stopped.CANCELLED
    sent.close()
    waker.close()
