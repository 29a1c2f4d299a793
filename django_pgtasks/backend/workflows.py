"""Workflows for ``django.tasks`` code: a ``@task`` call as a step, and its parents' outcomes.

Django's Tasks API has no workflow primitive, so the steps of
:func:`~django_pgtasks.workflows.chain` and :func:`~django_pgtasks.workflows.group` are
built from ``@task`` calls here::

    from django_pgtasks.backend.workflows import parent_outcomes, step
    from django_pgtasks.workflows import chain, group

    group([step(resize, pk) for pk in ids], then=step(notify, batch_id)).enqueue()

    @task(takes_context=True)
    def notify(context, batch_id):
        outcomes = parent_outcomes(context)   # how each member ended, in order
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_pgtasks.backend.results import parse_result_location
from django_pgtasks.definition.framework import Task as DjangoTask
from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle.dependencies import ParentOutcome


def step(task: DjangoTask, *args: Any, **kwargs: Any) -> Any:
    """An unsaved row that runs ``task(*args, **kwargs)``, as its backend would enqueue it:
    a step of a chain or a member or callback of a group. The task's backend must be a
    :class:`~django_pgtasks.backend.PgTasksBackend`; Django's ``InvalidTask`` errors are
    raised for a bad call, before anything is written."""
    from django_pgtasks.backend.backend import PgTasksBackend

    backend = task.get_backend()
    if not isinstance(backend, PgTasksBackend):
        raise InvalidTaskError(
            f"Task {task.module_path} uses the backend {task.backend!r}, which is not a "
            f"PgTasksBackend; only tasks of a PgTasksBackend can be workflow steps.")
    backend.validate_task(task)
    return backend._build_row(task, args, kwargs)


def parent_outcomes(context: Any) -> Sequence[ParentOutcome]:
    """How each task the running ``@task(takes_context=True)`` waited for ended, in the
    order they were given (``id``, ``name``, ``status``, ``result``, ``error_text``)."""
    from django_pgtasks.models import Task

    pk, database = parse_result_location(context.task_result.id)
    if pk is None:
        return []
    return Task.objects.db_manager(database).parent_outcomes(pk)
