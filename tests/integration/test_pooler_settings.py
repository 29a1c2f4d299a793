"""``PGTASKS["POOLER"]``: the connection budget and waiting behind a transaction pooler.

The system checks of ``POOLER`` and ``LISTEN_DATABASE``, and where sessions go, are in
``tests/unit/test_checks.py`` and ``tests/unit/database/test_sessions.py``; the workers behind
a real PgBouncer in ``tests/process/test_pgbouncer.py``.
"""

from __future__ import annotations

import logging

import pytest

from django_pgtasks.checks import check_connection_budget
from django_pgtasks.exceptions import TaskWaitTimeout
from django_pgtasks.models import Task
from tests.testapp import tasks

POOLED = {"POOLER": "transaction"}


def ids(errors) -> list[str]:
    return [e.id for e in errors]


@pytest.mark.django_db
def test_the_connection_budget_is_the_poolers_behind_one(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "CONCURRENCY": 100_000}
    assert ids(check_connection_budget(databases=["default"])) == ["django_pgtasks.W050"]
    settings.PGTASKS = {**settings.PGTASKS, **POOLED}
    assert check_connection_budget(databases=["default"]) == []


@pytest.mark.django_db
def test_run_pgtasks_does_not_weigh_the_servers_connections_behind_a_pooler(
        settings, caplog) -> None:
    from django_pgtasks.worker.startup import preflight

    with caplog.at_level(logging.WARNING, logger="django_pgtasks.run_pgtasks"):
        preflight("default", 4, 100_000)
        assert "Connection budget exceeded" in caplog.text
        caplog.clear()
        settings.PGTASKS = {**settings.PGTASKS, **POOLED}
        preflight("default", 4, 100_000)
        assert caplog.text == ""


@pytest.mark.django_db(transaction=True)
def test_a_waiter_behind_a_transaction_pooler_polls_without_listening(settings) -> None:
    task = Task.objects.enqueue(tasks.noop)
    settings.PGTASKS = {**settings.PGTASKS, **POOLED}
    with pytest.raises(TaskWaitTimeout):
        Task.objects.wait(task, timeout=0.2, poll_interval=0.05)
    # Not marked awaited: its completion would notify a LISTEN the pooler cannot keep.
    assert Task.objects.get(pk=task.pk).awaited is False
    settings.PGTASKS = {**settings.PGTASKS, "POOLER": None}
    with pytest.raises(TaskWaitTimeout):
        Task.objects.wait(task, timeout=0.2, poll_interval=0.05)
    assert Task.objects.get(pk=task.pk).awaited is True
