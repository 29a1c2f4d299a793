"""Finding a Django task by its module path, importing only modules a stored name may import
(installed apps, the project's package, ``PGTASKS["TASK_MODULES"]``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from django_pgtasks.definition import registry
from django_pgtasks.definition.framework import (
    Task,
)

if TYPE_CHECKING:
    pass


_MODULE_PATH_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
#: The Task objects this process enqueued (through :func:`handler_for`), by module path: found
#: without importing anything, wherever their module is.
_tasks: dict[str, Task] = {}


def import_task(path: str, *, missing_ok: bool = True) -> Task | None:
    """The ``django.tasks.Task`` at module path ``path``, or ``None`` if there is none.

    Looks only at the tasks this process enqueued and, importing it if need be, at a module
    of an installed app, of the project's package or of ``PGTASKS["TASK_MODULES"]``
    (:func:`~django_pgtasks.definition.registry.installed_module_of`), checked before anything is
    imported: a stored path such as
    ``"this.s"`` imports nothing. If that module raises while being imported, the error is
    logged with its traceback and :class:`~django_pgtasks.exceptions.HandlerImportError`
    raised; if it does not exist, ``None`` is returned, or with ``missing_ok=False`` the same
    ``HandlerImportError`` (a task enqueued by newer code than this process runs).
    """
    if not _MODULE_PATH_RE.match(path):
        return None
    task = _tasks.get(path)
    if task is not None:
        return task
    module_name = registry.installed_module_of(path)
    if module_name is None:
        return None
    module = registry.import_handler_module(module_name, path, missing_ok=missing_ok)
    if module is None:
        return None
    value = getattr(module, path.rpartition(".")[2], None)
    return value if isinstance(value, Task) else None
