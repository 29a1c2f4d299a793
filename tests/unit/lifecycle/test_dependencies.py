"""A workflow's links, checked before anything is written (``lifecycle/dependencies.py``):
what a parent may be, and tasks that wait for each other in a circle."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle.dependencies import parent_refs, refuse_cycles
from django_pgtasks.models import Task


def unsaved(name: str) -> Task:
    return Task(name=name)


def saved(pk: int, db: str = "default") -> Task:
    task = Task(pk=pk, name=f"saved-{pk}")
    task._state.db = db
    task._state.adding = False
    return task


def test_parents_are_tasks_of_the_call_or_saved_tasks_without_repeats() -> None:
    a, b, c = unsaved("a"), unsaved("b"), unsaved("c")
    refs = parent_refs([a, b, c], [[], [a, a, 42], [b, saved(7), 7]], Task, "default")
    assert refs == [[], [("local", 0), ("id", 42)], [("local", 1), ("id", 7)]]


@pytest.mark.parametrize(("parent", "words"), [
    ("7", "depends_on takes tasks or their ids, not str '7'."),
    (0, "not int 0."),
    (-1, "not int -1."),
    (2**63, "not int 9223372036854775808."),
    (True, "not bool True."),
    (1.0, "not float 1.0."),
])
def test_a_parent_that_is_no_task_or_id_is_refused(parent: Any, words: str) -> None:
    with pytest.raises(InvalidTaskError, match=words.replace(".", r"\.")):
        parent_refs([unsaved("a")], [[parent]], Task, "default")


def test_an_unsaved_parent_outside_the_call_is_refused() -> None:
    with pytest.raises(InvalidTaskError, match="Task a depends on an unsaved task \\(outside\\) "
                                               "that is not part of the same workflow"):
        parent_refs([unsaved("a")], [[unsaved("outside")]], Task, "default")


def test_a_parent_on_another_database_is_refused() -> None:
    with pytest.raises(InvalidTaskError, match="depends on task 7 of database 'queue_a'; the "
                                               "tasks it depends on must be on its own "
                                               "database \\('default'\\)"):
        parent_refs([unsaved("a")], [[saved(7, db="queue_a")]], Task, "default")


def test_an_empty_workflow_and_a_task_given_twice_are_refused() -> None:
    with pytest.raises(InvalidTaskError, match=r"A workflow needs at least one task\."):
        parent_refs([], [], Task, "default")
    a = unsaved("a")
    with pytest.raises(InvalidTaskError, match=r"A task appears twice in one workflow\."):
        parent_refs([a, a], [[], []], Task, "default")


@pytest.mark.parametrize(("links", "stuck"), [
    ([[0]], "a"),  # waits for itself
    ([[1], [0]], "a, b"),
    ([[], [2], [1]], "b, c"),  # a can run; b and c wait for each other
    ([[2], [0], [1], []], "a, b, c"),
])
def test_tasks_waiting_for_each_other_in_a_circle_are_refused(
    links: list[list[int]], stuck: str,
) -> None:
    tasks = [unsaved(name) for name in "abcd"[:len(links)]]
    with pytest.raises(InvalidTaskError, match=f"wait for each other in a circle \\({stuck}\\)"):
        refuse_cycles(tasks, [[("local", i) for i in refs] for refs in links])


def test_a_diamond_is_no_circle_and_saved_parents_never_are() -> None:
    tasks = [unsaved(name) for name in "abcd"]
    refuse_cycles(tasks, [[], [("local", 0)], [("local", 0), ("id", 99)],
                          [("local", 1), ("local", 2)]])
