"""Which database holds which queue (``definition/routing.py``), read from the settings each
time they are asked (so ``override_settings`` applies at once)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_pgtasks.definition.routing import database_for_queue, queue_databases, queues_on

SPREAD = {
    "DATABASE": "default",
    "QUEUES": {
        "default": {},
        "emails": {"database": "queue_a"},
        "reports": {"database": "queue_b"},
        "exports": {"database": "queue_a"},
        "urgent": None,  # no options at all
    },
}


@override_settings(PGTASKS=SPREAD)
@pytest.mark.parametrize(("queue", "alias"), [
    ("default", "default"),
    ("emails", "queue_a"),
    ("reports", "queue_b"),
    ("exports", "queue_a"),
    ("urgent", "default"),
    ("not-configured", "default"),  # PGTASKS["DATABASE"]: enqueue refuses it elsewhere
])
def test_a_queue_lives_on_its_database_or_the_task_database(queue: str, alias: str) -> None:
    assert database_for_queue(queue) == alias


@override_settings(PGTASKS=SPREAD)
def test_every_database_that_holds_a_queue_once_the_task_database_first() -> None:
    assert queue_databases() == ["default", "queue_a", "queue_b"]


@override_settings(PGTASKS=SPREAD)
@pytest.mark.parametrize(("alias", "queues"), [
    ("default", ["default", "urgent"]),
    ("queue_a", ["emails", "exports"]),  # in declaration order
    ("queue_b", ["reports"]),
    ("elsewhere", []),
])
def test_the_queues_a_database_holds(alias: str, queues: list[str]) -> None:
    assert queues_on(alias) == queues


@override_settings(PGTASKS={"DATABASE": "tasks", "QUEUES": ["default", "emails"]})
def test_a_list_of_queues_puts_them_all_on_the_task_database() -> None:
    assert database_for_queue("emails") == "tasks"
    assert queue_databases() == ["tasks"]
    assert queues_on("tasks") == ["default", "emails"]
    assert queues_on("default") == []


@override_settings(PGTASKS={"DATABASE": "tasks", "QUEUES": {"default": {}, "a": {"database":
                                                                                "default"}}})
def test_a_queue_may_live_on_the_default_alias_when_the_task_database_is_another() -> None:
    assert queue_databases() == ["tasks", "default"]
    assert queues_on("default") == ["a"]


@override_settings(PGTASKS={"QUEUES": {"default": {"database": ""}, "b": {"other": 1},
                                       "c": "queue_a"}})
def test_options_without_a_database_leave_the_queue_on_the_task_database() -> None:
    assert [database_for_queue(q) for q in ("default", "b", "c")] == ["default"] * 3


def test_a_settings_change_applies_to_the_next_question() -> None:
    assert database_for_queue("emails") == "default"  # the test settings
    with override_settings(PGTASKS={"QUEUES": {"emails": {"database": "queue_a"}}}):
        assert database_for_queue("emails") == "queue_a"
    assert database_for_queue("emails") == "default"
