"""The tasks django-pgtasks enqueues on its own.

``children_ended`` is the callback of the tasks a durable task runs with
``context.run_tasks()``: a group's callback (it runs once, when every member has ended,
whatever their outcomes), which sends the event its parent waits for, with how many of them
ended in each state. Its module is imported by name where it runs (an installed app's).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps

from django_pgtasks.definition.registry import pgtask


@pgtask(context=True, max_attempts=10, atomic=True)
def children_ended(ctx: Any, key: str) -> dict[str, int]:
    """Send the event ``key`` with how the tasks this one waited for ended (a count per
    state), in the transaction of this task's success."""
    tasks = apps.get_model("django_pgtasks", "Task").objects
    ended = tasks.parent_counts(ctx.task)
    tasks.send_event(key, ended, using=tasks.task_database(ctx.task))
    return ended
