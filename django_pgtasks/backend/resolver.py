"""Which Django task a row names: the registry resolver and the safe import of a task."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_pgtasks.definition import registry
from django_pgtasks.definition.framework import (
    Task,
)

if TYPE_CHECKING:
    pass

from django_pgtasks.backend.handler import DjangoTaskHandler
from django_pgtasks.backend.importing import _tasks, import_task

logger = logging.getLogger("django_pgtasks.backend")

_handlers: dict[str, DjangoTaskHandler] = {}


def resolve(name: str) -> DjangoTaskHandler | None:
    """Registry resolver: a handler for ``name`` if it is the module path of a Django task.

    Nothing but a ``django.tasks.Task`` instance is ever turned into a handler, and the
    handler runs only rows that a :class:`PgTasksBackend` enqueued. Only the tasks this
    process enqueued and the modules a stored name may import are looked at (see
    :func:`import_task`); a module there that fails to import raises
    :class:`~django_pgtasks.exceptions.HandlerImportError`.
    """
    handler = _handlers.get(name)
    if handler is None:
        task = import_task(name)
        if task is not None:
            handler = _handlers.setdefault(name, DjangoTaskHandler(func=task.func, name=name))
    return handler


registry.add_resolver(resolve)


def handler_for(task: Task) -> DjangoTaskHandler:
    """The handler that runs ``task`` (as the worker will resolve it by name).

    Also remembers ``task``, so that this process finds it by name without an import. A task
    whose module a stored name may not import (in no installed app, not in the project's
    package nor in ``PGTASKS["TASK_MODULES"]``) is logged once: a worker process never imports
    such a module because a row names it, so only a worker in this process can run the task.
    """
    name = task.module_path
    handler = _handlers.get(name)
    if handler is None:
        _tasks.setdefault(name, task)
        handler = _handlers.setdefault(name, DjangoTaskHandler(func=task.func, name=name))
        if registry.installed_module_of(name) is None:
            logger.warning(
                "Task name=%s is in no installed app, nor in the project's package or "
                "PGTASKS['TASK_MODULES']: a worker process does not import its module and "
                "fails the task as unknown. Move it into an installed app's module, or add "
                "its module to PGTASKS['TASK_MODULES'].",
                name,
            )
    return handler
