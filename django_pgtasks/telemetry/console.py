"""The worker's console: one line per state change of a task, with every log record kept.

A worker sends Django's ``task_started`` and ``task_finished`` for the tasks of
``PgTasksBackend``, and Django's own receivers log them on the ``django.tasks`` logger
(``django_tasks`` with the backport). Those records reach every handler of that logger and
of its ancestors, as Django emits them: a project's file, Sentry or mail handlers get them.
The worker also logs each state change itself, with the attempt, the duration and the error
(``django_pgtasks.worker``), so a console that showed both would show each change twice.
``run_pgtasks`` therefore gives the console handlers (those that write to the process's
stderr or stdout) a filter that leaves out, on that console only, the records of the state
changes the worker logs itself.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator

#: The loggers of Django's tasks framework (``django.tasks`` on Django 6, the backport's).
FRAMEWORK_LOGGERS = ("django.tasks", "django_tasks")
#: The receivers with which Django logs ``task_started``/``task_finished``.
FRAMEWORK_STATE_RECEIVERS = frozenset({"log_task_started", "log_task_finished"})

_sending = threading.local()


@contextlib.contextmanager
def worker_state_signal() -> Iterator[None]:
    """While the worker sends Django's ``task_started``/``task_finished`` on this thread:
    the records Django's receivers log then are state changes the worker logs itself."""
    _sending.state = True
    try:
        yield
    finally:
        _sending.state = False


def logged_by_the_worker(record: logging.LogRecord) -> bool:
    """Whether ``record`` is Django's line of a state change the worker logs itself."""
    return (getattr(_sending, "state", False)
            and record.name in FRAMEWORK_LOGGERS
            and record.funcName in FRAMEWORK_STATE_RECEIVERS)


class OneLinePerState(logging.Filter):
    """A console handler's filter: leaves out Django's line of a state change the worker
    logs itself. On a handler, never on a logger: other handlers still get the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logged_by_the_worker(record)


def show_each_state_once() -> None:
    """Give each console handler that Django's task records reach (through the framework's
    loggers and their ancestors, or Python's last-resort handler when there is none) the
    :class:`OneLinePerState` filter. Handlers that write elsewhere are left as they are."""
    handlers: list[logging.Handler] = [logging.lastResort] if logging.lastResort else []
    for name in FRAMEWORK_LOGGERS:
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            handlers.extend(logger.handlers)
            logger = logger.parent if logger.propagate else None
    for handler in handlers:
        if (_writes_to_console(handler)
                and not any(isinstance(f, OneLinePerState) for f in handler.filters)):
            handler.addFilter(OneLinePerState())


def _writes_to_console(handler: logging.Handler) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler,
                                                                  logging.StreamHandler):
        return False
    # Python's last-resort handler writes to whatever sys.stderr is at the time.
    stream = sys.stderr if handler is logging.lastResort else handler.stream
    return stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
