"""Where sessions go (``database/sessions.py``): the alias that listens for a task database's
notifications, and how workers prove they are alive, directly or behind a transaction pooler.
The workers behind a real PgBouncer are tested in ``tests/process/test_pgbouncer.py``."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgtasks.database.sessions import listen_database, liveness_mode, transaction_pooler

POOLED = {"POOLER": "transaction"}


def test_where_notifications_are_listened_for(settings: Any) -> None:
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


@pytest.mark.parametrize(("pgtasks", "mode"), [
    ({}, "advisory_lock"),
    ({"LIVENESS": "heartbeat"}, "heartbeat"),
    ({"POOLER": "transaction", "LIVENESS": "advisory_lock"}, "heartbeat"),  # overridden
    ({"POOLER": None, "LIVENESS": "advisory_lock"}, "advisory_lock"),
])
def test_a_transaction_pooler_implies_heartbeat_liveness(
    settings: Any, pgtasks: dict, mode: str,
) -> None:
    settings.PGTASKS = pgtasks
    assert liveness_mode() == mode
    assert transaction_pooler() is (pgtasks.get("POOLER") == "transaction")


def test_a_listen_database_for_another_task_database_leaves_this_one_alone(
    settings: Any,
) -> None:
    settings.PGTASKS = {"DATABASE": "tasks", "LISTEN_DATABASE": "tasks_direct"}
    assert listen_database("tasks") == "tasks_direct"
    assert listen_database("default") == "default"  # not PGTASKS["DATABASE"]
    settings.PGTASKS = {"LISTEN_DATABASE": {"default": ""}}  # empty: none given
    assert listen_database("default") == "default"
