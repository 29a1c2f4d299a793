"""Dedicated workers: a flood in one queue does not delay a queue with its own workers."""

from __future__ import annotations

import threading

import pytest

from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_flooded_default_queue_leaves_the_urgent_queue_unaffected() -> None:
    Task.objects.enqueue_bulk(tasks.sleepy, [(0.01,)] * 5000)  # far more than can drain
    general = Worker(queues=["default"], concurrency=2, worker_id="general")
    urgent = Worker(queues=["urgent"], concurrency=1, worker_id="urgent-only")
    threads = [threading.Thread(target=w.run, kwargs={"install_signals": False})
               for w in (general, urgent)]
    for t in threads:
        t.start()
    try:
        # The flood is being worked on.
        wait_until(lambda: Task.objects.filter(queue="default").succeeded().count() >= 20, 30,
                   "the flood to be worked on")
        # Urgent tasks arrive one after another, each once the one before has run.
        urgent_ids = []
        for _ in range(10):
            urgent_ids.append(Task.objects.enqueue(tasks.noop, queue="urgent").pk)
            wait_until(lambda: Task.objects.get(pk=urgent_ids[-1]).status == Status.SUCCESSFUL,
                       30, "the urgent task to run")
        waits = [(t.started_at - t.created_at).total_seconds()
                 for t in Task.objects.filter(pk__in=urgent_ids)]
        backlog = Task.objects.filter(queue="default").pending().count()
    finally:
        general.stop()
        urgent.stop()
        for t in threads:
            t.join(30)
    assert backlog > 1000  # the default queue was still flooded while urgent tasks ran
    # Each urgent task started at once (database clock): behind the flood (5,000 tasks of
    # 10 ms on two threads), it would have waited up to 25 s; the bound leaves room for a
    # loaded machine.
    assert max(waits) < 5.0
    assert not Task.objects.filter(queue="urgent").exclude(locked_by="urgent-only").exists()
