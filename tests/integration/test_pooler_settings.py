"""``PGTASKS["POOLER"]`` and ``LISTEN_DATABASE``: their system checks, and where sessions go.

The workers behind a real PgBouncer are tested in ``tests/process/test_pgbouncer.py``.
"""

from __future__ import annotations

import logging

import pytest
from django.conf import settings as django_settings

from django_pgtasks.checks import check_connection_budget, check_pooler
from django_pgtasks.database.sessions import listen_database, liveness_mode
from django_pgtasks.exceptions import TaskWaitTimeout
from django_pgtasks.models import Task
from tests.testapp import tasks

POOLED = {"POOLER": "transaction"}


def ids(errors) -> list[str]:
    return [e.id for e in errors]


@pytest.fixture
def cursors_disabled(monkeypatch) -> None:
    """The task database's entry asks for no server-side cursors, as behind a pooler."""
    monkeypatch.setitem(django_settings.DATABASES["default"], "DISABLE_SERVER_SIDE_CURSORS",
                        True)


def test_the_defaults_and_a_complete_pooler_setup_pass(settings, cursors_disabled) -> None:
    settings.PGTASKS = {}
    assert check_pooler() == []
    settings.PGTASKS = {**POOLED, "LISTEN_DATABASE": "direct"}
    # An alias the check only looks up (connections are made from it lazily).
    django_settings.DATABASES["direct"] = dict(django_settings.DATABASES["default"])
    try:
        assert check_pooler() == []
    finally:
        del django_settings.DATABASES["direct"]
    settings.PGTASKS = {**POOLED, "LISTEN": False, "LIVENESS": "heartbeat"}
    assert check_pooler() == []


@pytest.mark.parametrize(("pgtasks", "expected", "words"), [
    ({"POOLER": "session"}, "E016", "use None"),
    ({"POOLER": True}, "E016", "'transaction'"),
    ({"LISTEN_DATABASE": "nowhere"}, "E017", "not an alias in DATABASES"),
    ({"LISTEN_DATABASE": "not_postgres"}, "E017", "'sqlite' backend"),
    ({"LISTEN_DATABASE": 3}, "E017", "a database alias, a dict"),
    ({"LISTEN_DATABASE": {"default": "nowhere"}}, "E017", "for the task database 'default'"),
    ({**POOLED, "LIVENESS": "advisory_lock"}, "E018", "proves nothing"),
    ({**POOLED, "LISTEN": True}, "E019", "loses its notifications"),
    ({**POOLED, "LISTEN_DATABASE": "default"}, "E019", "names the task database 'default'"),
    ({**POOLED, "LISTEN_DATABASE": "default", "LISTEN": False}, "W002", "workers do not"),
])
def test_contradictions_are_check_errors(settings, cursors_disabled, pgtasks: dict,
                                         expected: str, words: str) -> None:
    settings.PGTASKS = pgtasks
    found = [e for e in check_pooler() if e.id == f"django_pgtasks.{expected}"]
    assert found, check_pooler()
    assert words in found[0].msg


def test_server_side_cursors_behind_a_transaction_pooler_are_a_warning(settings) -> None:
    settings.PGTASKS = {**POOLED, "LISTEN": False}
    [warning] = check_pooler()
    assert warning.id == "django_pgtasks.W003"
    assert "DATABASES['default'] does not set DISABLE_SERVER_SIDE_CURSORS" in warning.msg


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


def test_where_notifications_are_listened_for(settings) -> None:
    settings.PGTASKS = {}
    assert listen_database("default") == "default"
    assert liveness_mode() == "advisory_lock"
    settings.PGTASKS = {"LISTEN_DATABASE": "direct"}  # an alias: for PGTASKS["DATABASE"]
    assert listen_database("default") == "direct"
    assert listen_database("second") == "second"
    settings.PGTASKS = POOLED
    assert listen_database("default") is None  # nowhere to listen: poll
    assert liveness_mode() == "heartbeat"
    settings.PGTASKS = {**POOLED, "LISTEN_DATABASE": {"second": "second_direct"}}
    assert listen_database("default") is None
    assert listen_database("second") == "second_direct"


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
