"""Snooze: a handler asks to run again later, on the database clock, without using an attempt."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from django_pgtasks.exceptions import Snooze
from django_pgtasks.models import Status, Task
from django_pgtasks.testing import drain
from django_pgtasks.worker.loop import Worker
from tests.testapp import cooperative
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def burst(**options) -> None:
    assert Worker(burst=True, concurrency=options.pop("concurrency", 2),
                  **options).run(install_signals=False) == 0


def test_a_snoozed_task_waits_on_the_database_clock_without_using_an_attempt() -> None:
    task = Task.objects.enqueue(cooperative.snoozes, 1, 3600)
    burst()  # one run; the next is an hour away, so the burst worker stops
    task.refresh_from_db()
    assert (task.status, task.attempt, task.max_attempts) == (Status.READY, 0, 1)
    assert task.metadata["snoozes"] == 1
    assert (task.worker_ids, task.errors, task.error_text, task.locked_at) == ([], [], "", None)
    # Due an hour after the snoozed attempt ended, both times from the database clock.
    assert task.run_after - task.finished_at == pytest.approx(
        timedelta(hours=1), abs=timedelta(milliseconds=50))
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after > now() + interval '59 minutes' FROM pgtasks_task "
                       "WHERE id = %s", [task.pk])
        assert cursor.fetchone() == (True,)


def test_snoozing_never_burns_attempts() -> None:
    # max_attempts=1: a single failed attempt would end it; four snoozes do not.
    task = Task.objects.enqueue(cooperative.snoozes, 4, 0)
    burst()
    task.refresh_from_db()
    assert (task.status, task.result, task.attempt) == (Status.SUCCESSFUL, 4, 1)
    assert task.metadata["snoozes"] == 4
    assert Execution.objects.filter(task_id=task.pk).count() == 5
    assert len(task.worker_ids) == 1  # one entry per counted attempt


def test_raise_snooze_with_a_timedelta() -> None:
    task = Task.objects.enqueue(cooperative.snoozes_by_raising, 5)
    burst()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.READY, 0)
    assert task.run_after - task.finished_at == pytest.approx(
        timedelta(minutes=5), abs=timedelta(milliseconds=50))


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", True, 10**9])
def test_snooze_refuses_nonsense(bad) -> None:
    with pytest.raises(ValueError, match="Snooze takes 0 to"):
        Snooze(bad)


def test_a_cancellation_requested_meanwhile_wins_over_a_snooze() -> None:
    task = Task.objects.enqueue(cooperative.snoozes, 1, 0)
    [claimed] = Task.objects.claim("w-test")
    Task.objects.filter(pk=task.pk).cancel()  # asked to stop while it runs...
    assert Task.objects.mark_snoozed(claimed, 0) is True  # ...and it snoozes, not knowing
    task.refresh_from_db()
    assert task.status == Status.CANCELLED


def test_a_snooze_is_guarded_by_the_lease() -> None:
    Task.objects.enqueue(cooperative.snoozes, 1, 0)
    [claimed] = Task.objects.claim("w-a")
    Task.objects.filter(pk=claimed.pk).update(locked_by="w-b")  # taken over (rescued)
    assert Task.objects.mark_snoozed(claimed, 0) is False
    assert Task.objects.get(pk=claimed.pk).status == Status.RUNNING


def test_concurrent_workers_snooze_and_finish_each_task_once() -> None:
    """Three worker threads (three connections) and 30 tasks that snooze twice: every task
    ends SUCCESSFUL after exactly three runs and one counted attempt."""
    work = [Task.objects.enqueue(cooperative.snoozes, 2, 0) for _ in range(30)]
    workers = [Worker(burst=True, concurrency=2) for _ in range(3)]
    threads = [threading.Thread(target=lambda w=w: (w.run(install_signals=False),
                                                    connections.close_all()))
               for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Burst workers may stop while a snoozed task becomes due again: finish what is left.
    drain()
    rows = Task.objects.filter(pk__in=[t.pk for t in work])
    assert {(r.status, r.attempt, r.result, r.metadata["snoozes"]) for r in rows} == {
        (Status.SUCCESSFUL, 1, 2, 2)}
    for t in work:
        assert Execution.objects.filter(task_id=t.pk).count() == 3
