"""Durable steps, sleeps and waits for events in ``django.tasks`` tasks defined with
``@task(takes_context=True)``: Django's context passed to them has them too."""

from __future__ import annotations

import pytest

compat = pytest.importorskip("django_pgtasks.definition.framework")

from django_pgtasks.models import Status, Task  # noqa: E402
from django_pgtasks.worker.loop import Worker  # noqa: E402
from tests.helpers import time_passes  # noqa: E402
from tests.testapp import dj_tasks  # noqa: E402
from tests.testapp.models import Execution  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    Worker(burst=True, concurrency=1).run(install_signals=False)


def test_a_django_task_keeps_its_steps_sleeps_and_waits_durably() -> None:
    result = dj_tasks.durable_through_djangos_context.enqueue("dj-key")
    row = Task.objects.get(pk=result.id)
    drain()
    row.refresh_from_db()
    assert (row.status, [s["name"] for s in row.steps]) == (Status.READY, ["record", "@sleep 1"])
    time_passes(row)
    drain()
    row.refresh_from_db()
    assert (row.status, row.awaited_event) == (Status.READY, "dj-key")
    assert Task.objects.send_event("dj-key", {"ok": 1}) == 1
    drain()
    result.refresh()
    assert result.status.name == "SUCCESSFUL"
    record = Execution.objects.get(worker="dj-dj-key").pk  # the step ran once in three runs
    assert result.return_value == {"record": record, "payload": {"ok": 1},
                                   "result_id": result.id}
    assert result.attempts == 1
    # Its progress and log records, through Django's context too (the code between its
    # steps ran in each of its three runs).
    row.refresh_from_db()
    assert (row.progress["done"], row.progress["message"]) == (1, "recorded")
    assert [e["message"] for e in row.log] == [f"recorded {record}"] * 3
