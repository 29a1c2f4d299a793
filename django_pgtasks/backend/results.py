"""Rows as Django's ``TaskResult``: ids, statuses, errors."""

from __future__ import annotations

import logging
import re
import traceback
from typing import TYPE_CHECKING, Any

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.framework import (
    Task,
    TaskError,
    TaskResult,
    TaskResultStatus,
)

if TYPE_CHECKING:
    from django_pgtasks.models import Task as TaskRow

from django_pgtasks.backend.options import METADATA_KEY

logger = logging.getLogger("django_pgtasks.backend")

_STATUS = {
    "WAITING": TaskResultStatus.READY,
    "READY": TaskResultStatus.READY,
    "AWAITING_RETRY": TaskResultStatus.READY,
    "RUNNING": TaskResultStatus.RUNNING,
    "SUCCESSFUL": TaskResultStatus.SUCCESSFUL,
    "FAILED": TaskResultStatus.FAILED,
    "CANCELLED": TaskResultStatus.FAILED,
}
_FINISHED = ("SUCCESSFUL", "FAILED", "CANCELLED")




def backend_alias(row: TaskRow) -> str | None:
    """The alias of the backend that enqueued ``row``; ``None`` for a native task."""
    marker = row.metadata.get(METADATA_KEY) if isinstance(row.metadata, dict) else None
    alias = marker.get("backend") if isinstance(marker, dict) else None
    return alias if isinstance(alias, str) else None


def parse_result_id(result_id: Any) -> int | None:
    """The primary key a result id stands for, or ``None`` if it cannot be one."""
    if not isinstance(result_id, str) or not result_id.isascii() or not result_id.isdigit():
        return None
    pk = int(result_id)
    # Only the canonical spelling ("42", not "042") and values a bigint can hold.
    return pk if str(pk) == result_id and 0 < pk < 2**63 else None


def parse_result_location(result_id: Any) -> tuple[int | None, str]:
    """The primary key and the database alias a result id stands for (see the module doc).

    The key is ``None`` if the id cannot be one, or names a database that holds no queue.
    """
    from django_pgtasks.definition.routing import queue_databases

    primary = pgtasks_settings.DATABASE
    if isinstance(result_id, str) and "@" in result_id:
        result_id, database = result_id.split("@", 1)
        if database == primary or database not in queue_databases():
            return None, primary
        return parse_result_id(result_id), database
    return parse_result_id(result_id), primary


def result_id_for(row: TaskRow) -> str:
    """The result id of a saved row: its key, with ``@<alias>`` off the primary database."""
    database = row._state.db or pgtasks_settings.DATABASE
    return str(row.pk) if database == pgtasks_settings.DATABASE else f"{row.pk}@{database}"


def result_from_row(row: TaskRow, task: Task, alias: str) -> TaskResult:
    """The ``TaskResult`` a row stands for (database times; see the module docstring)."""
    result = TaskResult(
        task=task,
        id=result_id_for(row),
        status=_STATUS[row.status],
        enqueued_at=row.created_at,
        # The row keeps the start of its latest attempt only.
        started_at=row.started_at,
        last_attempted_at=row.started_at,
        finished_at=row.finished_at if row.status in _FINISHED else None,
        args=row.args,
        kwargs=row.kwargs,
        backend=alias,
        errors=[error_from_text(e["error"]) for e in row.errors
                if isinstance(e, dict) and isinstance(e.get("error"), str)],
        worker_ids=[str(worker_id) for worker_id in row.worker_ids],
    )
    if row.status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", row.result)
    return result


def error_from_exception(exc: BaseException) -> TaskError:
    cls = type(exc)
    return TaskError(
        exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


# The first line of ``traceback.format_exception_only()``: the exception's type, qualified
# by its module unless that is builtins, then ": message" unless the message is empty.
_EXCEPTION_LINE_RE = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(?::\s|$)")
_TRACEBACK_START = "\n\nTraceback (most recent call last):"


def error_from_text(text: str) -> TaskError:
    """A ``TaskError`` from a stored error: the type and message, a blank line, then the
    traceback (see ``django_pgtasks.definition.error_text.format_exception``), possibly cut in
    the middle."""
    path = "builtins.Exception"
    for line in text.split("\n\n", 1)[0].splitlines():
        if match := _EXCEPTION_LINE_RE.match(line):
            path = match["path"]
            break
    if "." not in path:
        path = f"builtins.{path}"
    start = text.find(_TRACEBACK_START)
    return TaskError(
        exception_class_path=path,
        traceback=text[start + 2:] if start >= 0 else text,
    )
