"""The process pool's side of a child's socket: what a slot reads after it stopped a child.

A child stopped at its time limit or past its cancellation's grace may have ended its run on
its own a moment before: its report, sent before it went, is the run's outcome (an
``atomic=True`` handler's is recorded already), not the stop."""

from __future__ import annotations

import socket
from multiprocessing.connection import Connection

from django_pgtasks.lifecycle.transitions import Succeeded
from django_pgtasks.worker.executor import RunReport
from django_pgtasks.worker.pools.processes import _Child, late_report


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
