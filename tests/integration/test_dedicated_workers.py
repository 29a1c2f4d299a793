"""Dedicated workers: a flood in one queue does not delay a queue with its own workers."""

from __future__ import annotations

import threading
import time

import pytest

from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
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
        time.sleep(0.5)  # the flood is being worked on
        urgent_ids = []
        for _ in range(10):
            urgent_ids.append(Task.objects.enqueue(tasks.noop, queue="urgent").pk)
            time.sleep(0.1)
        deadline = time.monotonic() + 30
        while Task.objects.filter(pk__in=urgent_ids).exclude(status=Status.SUCCESSFUL).exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waits = [(t.started_at - t.created_at).total_seconds()
                 for t in Task.objects.filter(pk__in=urgent_ids)]
        backlog = Task.objects.filter(queue="default").pending().count()
    finally:
        general.stop()
        urgent.stop()
        for t in threads:
            t.join(30)
    assert backlog > 1000  # the default queue was still flooded while urgent tasks ran
    assert max(waits) < 1.0  # each urgent task started at once (database clock)
    assert not Task.objects.filter(queue="urgent").exclude(locked_by="urgent-only").exists()
