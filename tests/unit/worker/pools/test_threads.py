"""The worker's thread pool keeps count of what runs, even when a task comes straight back.

A retry that is due at once can be claimed again, and submitted under the same id, before the
thread that ran the failed attempt has cleared its slot. The pool must then still count the
new attempt as running: a worker in ``--burst`` mode that saw nothing running would exit and
give the new attempt back unstarted.
"""

from __future__ import annotations

import threading

from django_pgtasks.models import Task
from django_pgtasks.worker.pools.threads import ThreadPool
from tests.helpers import wait_until


def test_a_task_resubmitted_before_its_last_run_cleared_still_counts_as_running() -> None:
    resubmitted = threading.Event()
    release_second = threading.Event()
    runs: list[Task] = []
    pool: ThreadPool

    def target(task: Task) -> None:
        runs.append(task)
        if len(runs) == 1:
            # The attempt is recorded; before this thread clears its slot, the main loop
            # claims the retry and submits it under the same id.
            pool.submit(Task(pk=task.pk, name=task.name))
            resubmitted.set()
        else:
            release_second.wait(10)

    first_cleared = threading.Event()  # the pool sets it once a thread has freed its slot
    pool = ThreadPool(2, target, first_cleared)
    try:
        pool.submit(Task(pk=7, name="sample"))
        assert resubmitted.wait(10)
        # A second thread holds the second run while the first thread clears its slot:
        # the second run must still be counted.
        wait_until(lambda: len(runs) == 2, timeout=10, what="the second run")
        assert first_cleared.wait(10)
        assert pool.busy == 1
        assert pool.ids() == {7}
        release_second.set()
    finally:
        release_second.set()
        pool.shutdown()
    assert pool.busy == 0


def test_a_resting_thread_is_counted_and_takes_no_task_until_its_rest_ends() -> None:
    """A thread the database refused a connection rests: the loop sees it as resting no later
    than it sees its slot free (so it claims nothing for it), and the thread runs nothing
    meanwhile; shutting the pool down ends the rest."""
    ran: list[tuple[int, str]] = []
    seen_at_free: list[tuple[int, int]] = []
    pool: ThreadPool

    def target(task: Task) -> None:
        ran.append((task.pk, threading.current_thread().name))
        if task.pk == 1:
            pool.rest(60)

    class Freed(threading.Event):
        def set(self) -> None:
            seen_at_free.append((pool.busy, pool.resting))
            super().set()

    pool = ThreadPool(1, target, Freed())
    pool.submit(Task(pk=1, name="refused"))
    wait_until(lambda: pool.resting == 1, what="the thread to rest")
    assert seen_at_free[0] == (0, 1)  # free and resting at the same time, never free alone
    pool.submit(Task(pk=2, name="waits"))
    assert [pk for pk, _ in ran] == [1]  # taken by no thread while the only one rests
    pool.shutdown()  # ends the rest; the thread runs what is queued, then stops
    assert [pk for pk, _ in ran] == [1, 2]
    assert pool.resting == 0
