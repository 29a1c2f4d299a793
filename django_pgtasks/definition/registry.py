"""Task handlers and the registry that maps stored task names to them.

A row in the task table names its handler (``Task.name``); the worker resolves that name here
at run time. Only functions registered with :func:`pgtask` can ever run: a name that is not
registered fails its task with a clear error and never imports or calls anything else.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, overload

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from django_pgtasks.exceptions import HandlerImportError, UnknownTaskError
from django_pgtasks.retry import Backoff, resolve

if TYPE_CHECKING:
    pass

from django_pgtasks.definition.handlers import (
    MAX_NAME_LENGTH,
    CancelSignal,
    TaskContext,
    TaskHandler,
    cancel_signal,
    cancel_was_signalled,
)

__all__ = [
    "MAX_NAME_LENGTH", "CancelSignal", "TaskContext", "TaskHandler", "add_resolver",
    "cancel_signal", "cancel_was_signalled", "get_handler", "pgtask", "register",
    "registered_names",
]

logger = logging.getLogger("django_pgtasks")

_registry: dict[str, TaskHandler] = {}
_resolvers: list[Callable[[str], TaskHandler | None]] = []
_lock = threading.Lock()


def add_resolver(resolver: Callable[[str], TaskHandler | None]) -> None:
    """Add a fallback that maps a stored task name to a handler (used by adapters such as
    the ``django.tasks`` backend); it returns ``None`` for names it does not know.

    :func:`get_handler` asks resolvers about every name it has not registered, so a resolver
    must import nothing for a name outside the modules a stored name may import (check with
    :func:`installed_module_of` first) and should import through
    :func:`import_handler_module`, which turns a module that fails to import into
    :class:`~django_pgtasks.exceptions.HandlerImportError`.
    """
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def register(handler: TaskHandler) -> TaskHandler:
    if not handler.name or len(handler.name) > MAX_NAME_LENGTH:
        raise ImproperlyConfigured(
            f"Task name {handler.name!r} must be 1 to {MAX_NAME_LENGTH} characters long."
        )
    with _lock:
        existing = _registry.get(handler.name)
        if existing is not None and _qualified(existing.func) != _qualified(handler.func):
            raise ImproperlyConfigured(
                f"Task name {handler.name!r} is already registered for "
                f"{_qualified(existing.func)}; pass a distinct name= to @pgtask."
            )
        _registry[handler.name] = handler
    return handler


def _qualified(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


@overload
def pgtask(func: Callable[..., Any], /) -> TaskHandler: ...
@overload
def pgtask(
    *,
    name: str | None = ...,
    queue: str | None = ...,
    priority: int | None = ...,
    max_attempts: int | None = ...,
    backoff: str | Backoff | None = ...,
    fatal: Iterable[type[BaseException]] = ...,
    atomic: bool = ...,
    context: bool = ...,
    timeout: float | None = ...,
    schedule: Any = ...,
    concurrency_key: str | Callable[..., str | None] | None = ...,
    concurrency_limit: int | None = ...,
) -> Callable[[Callable[..., Any]], TaskHandler]: ...


def pgtask(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    backoff: str | Backoff | None = None,
    fatal: Iterable[type[BaseException]] = (),
    atomic: bool = False,
    context: bool = False,
    timeout: float | None = None,
    schedule: Any = None,
    concurrency_key: str | Callable[..., str | None] | None = None,
    concurrency_limit: int | None = None,
) -> TaskHandler | Callable[[Callable[..., Any]], TaskHandler]:
    """Register a function as a task handler.

    ``name`` defaults to ``"module.function"``. ``queue``, ``priority`` and ``max_attempts``
    are defaults that an enqueue call may override. ``backoff`` is ``"exponential"``,
    ``"linear"`` or a callable ``attempt -> seconds`` (default: ``PGTASKS["BACKOFF"]``).
    Exceptions listed in ``fatal`` (and :class:`~django_pgtasks.FatalError`) fail the task
    without retry. With ``atomic=True`` the handler runs in the same transaction as the
    completion of its task, so its database writes happen exactly once. With ``context=True``
    the handler receives a :class:`TaskContext` as its first argument. ``timeout`` (seconds)
    bounds one attempt: an async handler is cancelled at the limit; a sync handler's attempt
    is failed and its slot freed (see ``docs/reliability.md``). ``schedule`` makes the
    workers enqueue a run periodically: a period (``every(minutes=5)``, a ``timedelta`` or
    seconds) or a cron expression (a string or ``cron(..., timezone=...)``); see
    ``docs/howto/periodic.md``. ``concurrency_key`` (a string, or a callable that receives
    the task's arguments and returns the key or ``None``) and ``concurrency_limit`` (default
    1) are defaults for the enqueue options of the same names: at most that many tasks of one
    key run at once; see ``docs/howto/concurrency-limits.md``.
    """
    from django_pgtasks.definition.options import validate_options

    validate_options(priority=priority, max_attempts=max_attempts)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise ImproperlyConfigured(f"timeout must be a positive number of seconds, not "
                                   f"{timeout!r}.")
    if backoff is not None:
        resolve(backoff)  # fail at import time on an unknown policy name
    if concurrency_key is not None and not (isinstance(concurrency_key, str)
                                            or callable(concurrency_key)):
        raise ImproperlyConfigured(f"concurrency_key must be a string or a callable, not "
                                   f"{concurrency_key!r}.")
    if concurrency_limit is not None and (
        isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int)
        or not 1 <= concurrency_limit <= 32767
    ):
        raise ImproperlyConfigured(f"concurrency_limit must be an integer from 1 to 32767, "
                                   f"not {concurrency_limit!r}.")
    if schedule is not None:
        from django_pgtasks.definition.recurrence import parse_when

        schedule = parse_when(schedule)  # fail at import time on an invalid period or cron

    def decorator(f: Callable[..., Any]) -> TaskHandler:
        handler = TaskHandler(
            func=f,
            name=name or _qualified(f),
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            fatal=tuple(fatal),
            atomic=atomic,
            takes_context=context,
            timeout=timeout,
            schedule=schedule,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        )
        return register(handler)

    return decorator(func) if func is not None else decorator


def get_handler(name: str) -> TaskHandler:
    """Return the handler registered as ``name``.

    A name that is not registered yet is looked up only where a stored name may lead: the
    resolvers (e.g. the ``django.tasks`` backend's), then the module part of a
    ``package.module.function`` name *if that module belongs to an installed app, the
    project's package or* ``PGTASKS["TASK_MODULES"]`` (:func:`installed_module_of`): it is
    imported (which runs its ``@pgtask`` decorators) and the lookup is repeated. That is
    decided before anything is imported, so a stored name never imports a module outside
    them. Nothing that is not a registered handler is ever returned
    or called.

    Raises :class:`~django_pgtasks.exceptions.UnknownTaskError` if no handler is found, and
    :class:`~django_pgtasks.exceptions.HandlerImportError` if the module of a name inside an
    importable module raises while being imported, or does not exist in this code (a task
    enqueued by newer code than this process runs); the error is logged with its traceback.
    """
    handler = _registry.get(name)
    if handler is not None:
        return handler
    # Decided before anything is imported; the resolvers check the same for their own imports
    # (see add_resolver), and are asked about every name because they may hold handlers built
    # in this process, such as the django.tasks backend's for the tasks it enqueued.
    module_name = installed_module_of(name)
    _import_task_backends()
    for resolver in _resolvers:
        handler = resolver(name)
        if handler is not None:
            return handler
    if module_name is not None:
        import_handler_module(module_name, name)
        handler = _registry.get(name)
        if handler is not None:
            return handler
    message = (f"No task handler is registered under the name {name!r}; decorate the function "
               f"with @pgtask and make sure its module is imported.")
    outside = name.rpartition(".")[0]
    if module_name is None and _MODULE_PATH_RE.match(outside):
        message += (f" Only modules of installed apps, of the project's package and of "
                    f"PGTASKS['TASK_MODULES'] are imported by name, and {outside!r} is none "
                    f"of them.")
    raise UnknownTaskError(message)


_task_backends_imported = False


def _import_task_backends() -> None:
    """Import the backend classes named in ``settings.TASKS``, once.

    An adapter backend (``django_pgtasks.backend``) adds its resolver when imported; a worker
    process may otherwise meet its tasks before any code there has used the backend. These
    are configured paths, not stored names.
    """
    global _task_backends_imported
    if _task_backends_imported:
        return
    _task_backends_imported = True
    from django.conf import settings
    from django.utils.module_loading import import_string

    for config in (getattr(settings, "TASKS", None) or {}).values():
        with contextlib.suppress(Exception):  # a broken backend is Django's to report
            import_string(config["BACKEND"])


#: A dotted path of Python identifiers: the only module names a stored name may import.
_MODULE_PATH_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def installed_module_of(name: str) -> str | None:
    """The module part of ``name`` (``"app.tasks"`` of ``"app.tasks.send"``) if that module
    may be imported by name (see :func:`importable_prefixes`), else ``None``. Imports
    nothing.

    Only such modules are imported because of a stored name: installed apps, the project's
    own package and the prefixes of ``PGTASKS["TASK_MODULES"]`` are code the project chose
    to run; anything else on ``sys.path`` (``this``, ``antigravity``, a stray script) is
    not, whatever a row of the task table says.
    """

    module_name, _, attribute = name.rpartition(".")
    if not (_MODULE_PATH_RE.match(module_name) and attribute.isidentifier()):
        return None
    if any(module_name == prefix or module_name.startswith(prefix + ".")
           for prefix in importable_prefixes()):
        return module_name
    return None


def project_packages() -> list[str]:
    """The project's own top-level packages: those of ``settings.SETTINGS_MODULE`` and of
    ``settings.ROOT_URLCONF`` (``"mysite"`` of ``"mysite.settings"``), the package
    ``startproject`` makes, which is not an installed app. A module at the top level (a
    ``settings.py`` on ``sys.path``, not in a package) gives none."""
    from django.conf import settings

    packages = []
    for path in (getattr(settings, "SETTINGS_MODULE", None),
                 getattr(settings, "ROOT_URLCONF", None)):
        if isinstance(path, str) and "." in path:
            package = path.partition(".")[0]
            if _MODULE_PATH_RE.match(package) and package not in packages:
                packages.append(package)
    return packages


def importable_prefixes() -> list[str]:
    """The module prefixes a stored name may import: every installed app's module, the
    project's packages (:func:`project_packages`) and ``PGTASKS["TASK_MODULES"]`` (the
    well-formed entries; the system check ``E024`` reports the others)."""
    from django_pgtasks.conf import pgtasks_settings

    extra = pgtasks_settings.TASK_MODULES
    if not isinstance(extra, list | tuple):
        extra = []
    extra = [prefix for prefix in extra
             if isinstance(prefix, str) and _MODULE_PATH_RE.match(prefix)]
    return [*(config.name for config in apps.get_app_configs()), *project_packages(), *extra]


def import_handler_module(
    module_name: str, name: str, *, missing_ok: bool = False
) -> ModuleType | None:
    """Import ``module_name``, the module of the task ``name``; see :func:`installed_module_of`.

    Callers check first that the module may be imported by name. If the module raises
    while being imported (a missing dependency, a deploy in progress), the error is logged
    with its traceback and :class:`~django_pgtasks.exceptions.HandlerImportError` raised: the
    task's code is there but cannot run *now*, which is an interruption, not a failure of the
    task. A module that does not exist at all (``ModuleNotFoundError`` for it or its package)
    is the same, unless ``missing_ok``: then ``None`` is returned, for callers that only ask
    whether something of theirs is there. Nothing is cached: the next call imports again.
    """
    with _lock:  # other threads may register handlers meanwhile
        before = set(_registry)
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        _forget_handlers_of_failed_imports(before)
        missing = _is_missing(module_name, exc)
        if missing and missing_ok:
            return None
        if missing:
            logger.exception("Task name=%s: its module %s does not exist in this code.",
                             name, module_name)
            message = (
                f"The module {module_name!r} of the task {name!r} does not exist in this code "
                f"({type(exc).__name__}: {exc}): the name is misspelt, or the task was "
                f"enqueued by newer code than this process runs."
            )
        else:
            logger.exception("Task name=%s: importing its module %s failed.", name, module_name)
            message = (
                f"The module {module_name!r} of the task {name!r} raised while being imported "
                f"({type(exc).__name__}: {exc})."
            )
        raise HandlerImportError(message) from exc


def _is_missing(module_name: str, exc: Exception) -> bool:
    """Whether ``exc`` says that ``module_name`` itself (or a package of its path) does not
    exist, as opposed to the module failing while it ran, e.g. on a missing dependency."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    return missing is not None and (
        module_name == missing or module_name.startswith(missing + ".")
    )


def _forget_handlers_of_failed_imports(before: set[str]) -> None:
    """Unregister the handlers that a failed import registered before it raised.

    Python drops a module whose import raised from ``sys.modules``, so the next lookup
    imports it again; its ``@pgtask`` functions that ran first must not stay registered, or
    that lookup would find a handler of a module that never finished importing.
    """
    with _lock:
        for name in set(_registry) - before:
            if _registry[name].func.__module__ not in sys.modules:
                del _registry[name]


def registered_names() -> list[str]:
    return sorted(_registry)
