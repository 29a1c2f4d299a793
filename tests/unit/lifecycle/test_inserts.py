"""Unsaved tasks made fast (``lifecycle/inserts.Blueprint``): the same instance as the
model's constructor makes, without looking up each field's default on every call."""

from __future__ import annotations

from django.db.models.expressions import DatabaseDefault

from django_pgtasks.lifecycle.inserts import Blueprint, blueprint
from django_pgtasks.models import Task


def fields(task: Task) -> dict:
    """Each field's value; a default the database fills in, by its type."""
    values = {}
    for field in Task._meta.concrete_fields:
        value = getattr(task, field.attname)
        values[field.attname] = DatabaseDefault if isinstance(value, DatabaseDefault) else value
    return values


def test_a_blueprint_makes_what_the_constructor_makes() -> None:
    values = {"name": "app.tasks.send", "queue": "emails", "args": [1], "kwargs": {"a": 2},
              "priority": 150, "max_attempts": 4, "key": "k"}
    made = blueprint(Task).make(**values)
    assert type(made) is Task
    assert made._state.adding
    assert fields(made) == fields(Task(**values))


def test_each_task_gets_fresh_mutable_defaults() -> None:
    first, second = blueprint(Task).make(name="a"), blueprint(Task).make(name="b")
    first.metadata["x"] = 1
    assert second.metadata == {}
    assert first.metadata is not second.metadata


def test_one_blueprint_per_model() -> None:
    assert blueprint(Task) is blueprint(Task)
    assert isinstance(blueprint(Task), Blueprint)
