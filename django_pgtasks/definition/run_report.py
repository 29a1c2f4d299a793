"""What a run reports of itself while it runs: its progress and its own log records.

``context.progress(done, total, message)`` and the log records emitted during the run (by
``context.logger`` and by any logger of the project, in the run's thread or coroutine) are
collected here, in memory, and written to the task's row (``progress``, ``log``) at most
once per :data:`WRITE_INTERVAL` seconds and once more when the run ends
(:mod:`django_pgtasks.lifecycle.reports`). A run that reports nothing writes nothing.

The log is bounded: ``PGTASKS["TASK_LOG_LENGTH"]`` entries per task (the oldest dropped),
each message at most :data:`MAX_MESSAGE` characters; records below
``PGTASKS["TASK_LOG_LEVEL"]`` are not kept (``None``: none is). django-pgtasks' own loggers
(except ``django_pgtasks.task``, the run's logger) and ``django.db.backends`` are left out.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

from django_pgtasks.conf import pgtasks_settings

#: Seconds between two writes of a run's report while it runs.
WRITE_INTERVAL = 1.0
#: The longest message of a log entry or of the progress, in characters (longer: cut).
MAX_MESSAGE = 1000
#: The logger of ``context.logger``.
TASK_LOGGER = "django_pgtasks.task"

_current: contextvars.ContextVar[RunReport | None] = contextvars.ContextVar(
    "pgtasks_run_report", default=None)
_installed = threading.Lock()
_handler: RunLogHandler | None = None


def clean_text(value: Any, limit: int = MAX_MESSAGE) -> str:
    """``value`` as text PostgreSQL stores: NUL characters and lone surrogates escaped, at
    most ``limit`` characters (cut with an ellipsis)."""
    text = str(value).replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 1] + "…"


class RunReport:
    """What one run reported and has not written yet."""

    __slots__ = ("entries", "progress", "written")

    def __init__(self) -> None:
        #: ``{"done", "total", "message"}`` of the last ``progress()`` call, if not written.
        self.progress: dict[str, Any] | None = None
        #: Log entries not written yet (``{"at", "level", "logger", "message"}``).
        self.entries: list[dict[str, Any]] = []
        #: When it was last written (``time.monotonic()``).
        self.written = time.monotonic()

    @property
    def pending(self) -> bool:
        return self.progress is not None or bool(self.entries)

    @property
    def due(self) -> bool:
        """Whether it is time to write what is pending."""
        return self.pending and time.monotonic() - self.written >= WRITE_INTERVAL

    def add(self, record: logging.LogRecord, message: str) -> None:
        self.entries.append({
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname, "logger": record.name,
            "message": clean_text(message)})
        del self.entries[:-max(int(pgtasks_settings.TASK_LOG_LENGTH or 0), 0) or None]

    def take(self) -> tuple[str | None, str]:
        """The pending progress and log entries as JSON text, now taken (written)."""
        progress = None if self.progress is None else json.dumps(self.progress)
        entries = json.dumps(self.entries)
        self.progress, self.entries, self.written = None, [], time.monotonic()
        return progress, entries


def set_progress(report: RunReport, done: Any, total: Any, message: Any) -> None:
    """Note a ``progress()`` call, checked: ``done`` a number from 0, ``total`` ``None``
    or a number above 0, ``message`` text (cut to :data:`MAX_MESSAGE`)."""
    for name, value, low in (("done", done, 0), ("total", total, 0)):
        if value is None and name == "total":
            continue
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value < low or abs(value) > 1e15
                or (name == "total" and value == 0)):
            raise ValueError(f"progress() takes {name} as a finite number "
                             f"{'above' if name == 'total' else 'from'} 0, not {value!r}.")
    report.progress = {"done": done, "total": total, "message": clean_text(message)}


def current() -> RunReport | None:
    """The report of the run in this thread or coroutine, if any."""
    return _current.get()


def begin() -> tuple[RunReport, contextvars.Token]:
    """Start collecting the report of the run about to start in this thread or coroutine;
    pass the token to :func:`end` when it ends."""
    if _handler is None:
        install()
    report = RunReport()
    return report, _current.set(report)


def end(token: contextvars.Token) -> None:
    """Stop collecting the report of the run :func:`begin` started."""
    _current.reset(token)


class RunLogHandler(logging.Handler):
    """Adds the records emitted during a run to its report (a handler on the root logger)."""

    def emit(self, record: logging.LogRecord) -> None:
        report = _current.get()
        if report is None or not _kept(record):
            return
        try:
            report.add(record, self.format(record))
        except Exception:
            self.handleError(record)


def _kept(record: logging.LogRecord) -> bool:
    name = record.name
    if name.startswith("django_pgtasks") and not name.startswith(TASK_LOGGER):
        return False
    return not name.startswith("django.db.backends")


def install() -> None:
    """Put the run log's handler on the root logger, once per process, at
    ``PGTASKS["TASK_LOG_LEVEL"]``; and let ``context.logger`` emit at that level whatever
    the root logger's."""
    global _handler
    if _handler is not None:
        return
    with _installed:
        if _handler is not None:
            return
        level = pgtasks_settings.TASK_LOG_LEVEL
        handler = RunLogHandler(logging.CRITICAL + 1 if level is None else level)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger().addHandler(handler)
        task_logger = logging.getLogger(TASK_LOGGER)
        if task_logger.level == logging.NOTSET and level is not None:
            task_logger.setLevel(level)
        _handler = handler
