"""Task handlers and the registry that maps stored task names to them.

A row in the task table names its handler (``Task.name``); the worker resolves that name here
at run time. Only functions registered with :func:`pgtask` can ever run: a name that is not
registered fails its task with a clear error and never imports or calls anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, overload

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from django_pgtasks.exceptions import HandlerImportError, UnknownTaskError
from django_pgtasks.retry import Backoff, resolve

if TYPE_CHECKING:
    from django_pgtasks.base.schedules import When
    from django_pgtasks.models import Task

MAX_NAME_LENGTH = 255


def _tasks() -> Any:
    """The task manager, looked up in the app registry: handlers are defined at import time,
    before the models can be imported, and the registry sits below the models."""
    return apps.get_model("django_pgtasks", "Task").objects

logger = logging.getLogger("django_pgtasks")


class CancelSignal:
    """Set when a running task is asked to stop (thread-safe); runs callbacks once set.

    The worker keeps one per running task (:func:`cancel_signal`) and sets it when it learns
    of the cancellation, through ``NOTIFY`` or its next heartbeat.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback()

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when set (at once if set already); return a function that
        removes it."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock, contextlib.suppress(ValueError):
                        self._callbacks.remove(callback)

                return remove
        callback()
        return lambda: None


def cancel_signal(task: Task) -> CancelSignal:
    """The cancellation signal of a claimed ``task`` (created on first use)."""
    signal = task.__dict__.get("_cancel_signal")
    if signal is None:
        signal = task.__dict__.setdefault("_cancel_signal", CancelSignal())
    return signal


@dataclass(frozen=True)
class TaskContext:
    """Passed as the first argument to handlers registered with ``context=True``."""

    task: Task
    worker_id: str

    @property
    def task_id(self) -> int:
        return self.task.pk

    @property
    def attempt(self) -> int:
        """The number of the attempt now running, starting at 1."""
        return self.task.attempt

    # -- cooperative cancellation ----------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether this task was cancelled while it runs (``Task.objects...cancel()``)."""
        return cancel_signal(self.task).is_set()

    def should_stop(self) -> bool:
        """Whether the handler should stop now: its task was cancelled.

        Check it between units of work and stop by raising (e.g. with
        :meth:`raise_if_cancelled`): the task then ends ``CANCELLED``. A handler that returns
        normally has done its work, and its task ends ``SUCCESSFUL``.
        """
        return self.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~django_pgtasks.exceptions.TaskCancelled` if the task was cancelled."""
        if self.cancelled:
            from django_pgtasks.exceptions import TaskCancelled

            raise TaskCancelled(f"Task {self.task_id} was cancelled while it ran.")

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early if the task is cancelled; return
        :meth:`should_stop`. For handlers that poll or back off between steps."""
        return cancel_signal(self.task).wait(seconds)

    # -- snooze ----------------------------------------------------------------------------

    def snooze(self, seconds: float | timedelta) -> NoReturn:
        """Stop this attempt and run the task again after ``seconds`` (database clock)
        without using up an attempt: raises :class:`~django_pgtasks.exceptions.Snooze`."""
        from django_pgtasks.exceptions import Snooze

        raise Snooze(seconds)

    def then(
        self, handler: TaskHandler | str, *args: Any, stage: str | None = None,
        **options_and_kwargs: Any,
    ) -> Task:
        """Enqueue the next stage of a pipeline *together with this task's success*.

        The follow-up task is inserted in the same transaction that records this task as
        SUCCESSFUL, so it exists if and only if this stage succeeded: a crash in between
        neither skips the next stage nor enqueues it twice. ``stage`` names it (shown in the
        admin; default: the handler's function name); other keyword arguments are the usual
        enqueue options (queue, priority, delay, ...) and the handler's keyword arguments.
        Follow-ups of an attempt that fails are discarded with it.
        """
        from django_pgtasks.exceptions import InvalidTaskError
        if "key" in options_and_kwargs:
            raise InvalidTaskError("A pipeline stage cannot have a deduplication key.")
        followup = _tasks().build(handler, *args, **options_and_kwargs)
        followup.stage = stage or followup.name.rsplit(".", 1)[-1]
        root = self.task.metadata.get("pipeline", self.task.pk)
        followup.metadata = {**followup.metadata, "pipeline": root, "parent": self.task.pk}
        self.task.followups.append(followup)
        return followup


@dataclass(eq=False)
class TaskHandler:
    """A registered task function plus its defaults. Call it to run the function directly."""

    func: Callable[..., Any]
    name: str
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    backoff: str | Backoff | None = None
    fatal: tuple[type[BaseException], ...] = ()
    atomic: bool = False
    takes_context: bool = False
    timeout: float | None = None
    #: When the scheduler enqueues runs of this handler (``@pgtask(schedule=...)``).
    schedule: When | None = None
    #: Default concurrency key of its tasks: a string, or a callable that takes the task's
    #: arguments and returns one (or ``None``); and the default limit for that key.
    concurrency_key: str | Callable[..., str | None] | None = None
    concurrency_limit: int | None = None
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.func)
        self.__doc__ = self.func.__doc__
        self.__wrapped__ = self.func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskHandler {self.name}>"

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(resolve(self.backoff)(attempt))

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether ``exc`` fails the task at once instead of scheduling a retry."""
        from django_pgtasks.exceptions import FatalError

        return isinstance(exc, (FatalError, *self.fatal))

    def retry_after(self, task: Task, exc: BaseException | None) -> float | None:
        """Seconds until the next attempt of ``task``, whose attempt just failed with ``exc``
        (``None`` for a time-out seen from outside), or ``None`` when the failure is final.

        The worker calls it once per failed attempt, on the thread that ran the attempt; the
        transition fails the task for good anyway once ``max_attempts`` are spent.
        """
        if exc is not None and self.is_fatal(exc):
            return None
        return self.retry_delay(task.attempt)

    # -- how the worker runs it (extension points for adapters, e.g. the django.tasks one) --

    def call(self, task: Task, worker_id: str) -> Any:
        """Run the function for ``task`` and return its result as plain JSON.

        Raises whatever the function raises. A malformed stored payload raises
        :class:`~django_pgtasks.FatalError`; a return value PostgreSQL cannot store unchanged
        (not plain JSON, a NUL character or a lone surrogate anywhere, an integer too large
        for JSON, more than ``PGTASKS["MAX_RESULT_BYTES"]``) raises
        :class:`~django_pgtasks.exceptions.UnstorableResultError`, a ``FatalError``.
        """
        from asgiref.sync import async_to_sync

        from django_pgtasks.base.payload import normalize_result
        from django_pgtasks.exceptions import FatalError, InvalidPayloadError, UnstorableResultError

        if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
            raise FatalError(
                f"Malformed stored payload: args must be a JSON array and kwargs a JSON object "
                f"(got {type(task.args).__name__} and {type(task.kwargs).__name__})."
            )
        args = list(task.args)
        if self.takes_context:
            args.insert(0, TaskContext(task=task, worker_id=worker_id))
        if self.is_async:
            func = async_to_sync(_cancellable(_bounded(self.func, self.timeout),
                                              cancel_signal(task)))
        else:
            func = self.func
        result = func(*args, **task.kwargs)
        try:
            return normalize_result(result)
        except InvalidPayloadError as exc:
            raise UnstorableResultError(str(exc)) from exc

    def started(self, task: Task, worker_id: str) -> None:
        """Called in the worker thread just before :meth:`call`."""

    def finished(self, task: Task, worker_id: str, exception: BaseException | None) -> None:
        """Called after the outcome is recorded; on failure from inside the ``except`` block."""

    def enqueue(
        self,
        *args: Any,
        queue: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        delay: timedelta | float | None = None,
        max_attempts: int | None = None,
        using: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> Task:
        """Enqueue a run of this handler; see :meth:`TaskManager.enqueue`."""
        return _tasks().enqueue(
            self, *args, queue=queue, priority=priority, run_after=run_after, delay=delay,
            max_attempts=max_attempts, using=using, key=key, **kwargs,
        )

    def build(self, *args: Any, **kwargs: Any) -> Task:
        """An unsaved, validated task for :meth:`TaskManager.enqueue_many`."""
        return _tasks().build(self, *args, **kwargs)


def _bounded(func: Callable[..., Any], timeout: float | None) -> Callable[..., Any]:
    """Wrap an async function so it is cancelled after ``timeout`` seconds."""
    if timeout is None:
        return func

    async def bounded(*args: Any, **kwargs: Any) -> Any:
        from django_pgtasks.exceptions import TaskTimeoutError

        try:
            return await asyncio.wait_for(func(*args, **kwargs), timeout)
        except TimeoutError:
            raise TaskTimeoutError(
                f"Task exceeded its time limit of {timeout:g}s and was cancelled."
            ) from None

    return bounded


def _cancellable(func: Callable[..., Any], signal: CancelSignal) -> Callable[..., Any]:
    """Wrap an async function so that its coroutine is cancelled when ``signal`` is set; the
    cancellation surfaces as :class:`~django_pgtasks.exceptions.TaskCancelled`."""

    async def cancellable(*args: Any, **kwargs: Any) -> Any:
        from django_pgtasks.exceptions import TaskCancelled

        loop = asyncio.get_running_loop()
        inner = asyncio.ensure_future(func(*args, **kwargs))
        remove = signal.add_callback(lambda: loop.call_soon_threadsafe(inner.cancel))
        try:
            return await inner
        except asyncio.CancelledError:
            if not signal.is_set():
                raise
            raise TaskCancelled("The task was cancelled while it ran; its coroutine was "
                                "cancelled.") from None
        finally:
            remove()

    return cancellable


_registry: dict[str, TaskHandler] = {}
_resolvers: list[Callable[[str], TaskHandler | None]] = []
_lock = threading.Lock()


def add_resolver(resolver: Callable[[str], TaskHandler | None]) -> None:
    """Add a fallback that maps a stored task name to a handler (used by adapters such as
    the ``django.tasks`` backend); it returns ``None`` for names it does not know.

    :func:`get_handler` asks resolvers about every name it has not registered, so a resolver
    must import nothing for a name outside installed apps (check with
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
    from django_pgtasks.base.validation import validate_options

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
        from django_pgtasks.base.schedules import parse_when

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
    ``package.module.function`` name *if that module belongs to an installed app*: it is
    imported (which runs its ``@pgtask`` decorators) and the lookup is repeated. Whether a name
    is inside an installed app is decided before anything is imported, so a stored name never
    imports a module outside them. Nothing that is not a registered handler is ever returned
    or called.

    Raises :class:`~django_pgtasks.exceptions.UnknownTaskError` if no handler is found, and
    :class:`~django_pgtasks.exceptions.HandlerImportError` if the module of a name inside an
    installed app raises while being imported, or does not exist in this code (a task
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
        message += (f" Only modules of installed apps are imported by name, and {outside!r} "
                    f"is not one.")
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
    belongs to an installed app, else ``None``. Imports nothing.

    Only such modules are imported because of a stored name: installed apps are code the
    project chose to run; anything else on ``sys.path`` (``this``, ``antigravity``, a stray
    script) is not, whatever a row of the task table says.
    """
    from django.apps import apps

    module_name, _, attribute = name.rpartition(".")
    if not (_MODULE_PATH_RE.match(module_name) and attribute.isidentifier()):
        return None
    if any(module_name == config.name or module_name.startswith(config.name + ".")
           for config in apps.get_app_configs()):
        return module_name
    return None


def import_handler_module(
    module_name: str, name: str, *, missing_ok: bool = False
) -> ModuleType | None:
    """Import ``module_name``, the module of the task ``name``; see :func:`installed_module_of`.

    Callers check first that the module belongs to an installed app. If the module raises
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
