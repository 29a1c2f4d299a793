"""The write of what a run reports while it runs: its progress and its log records.

One ``UPDATE`` of the task's row under the same lease guard as a step's checkpoint (only
while the run that reported holds the task), committed without waiting for the WAL to
reach the disk, as a step's checkpoint that is not atomic (in the transaction of an atomic
handler, it commits with it): a crash of the server may lose the last report, never
anything else. The log keeps ``PGTASKS["TASK_LOG_LENGTH"]`` entries,
the oldest dropped. See :mod:`django_pgtasks.definition.run_report`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import RUNNING
from django_pgtasks.lifecycle.steps import UNFLUSHED

# Set the progress (if given: stamped with the database clock) and append the log entries
# (keeping the last %(length)s), while the run that reported holds the task.
REPORT_SQL = f"""
    {{with_unflushed}}UPDATE pgtasks_task
    SET progress = coalesce(%(progress)s::jsonb || jsonb_build_object(
                                'at', statement_timestamp()), progress),
        log = CASE WHEN jsonb_array_length(%(entries)s::jsonb) = 0 THEN log
                   ELSE jsonb_path_query_array(log || %(entries)s::jsonb,
                                               ('$[last - ' || %(keep)s || ' to last]')::jsonpath)
              END
    {{from_unflushed}}WHERE id = %(id)s AND {RUNNING} AND locked_by = %(worker)s
      AND claims = %(claims)s
"""
# On its own, or in the transaction of an atomic handler or step (committed as that is).
_ON_ITS_OWN = REPORT_SQL.format(**UNFLUSHED)
_IN_TRANSACTION = REPORT_SQL.format(with_unflushed="", from_unflushed="")


def write(task: Any, progress_json: str | None, entries_json: str, using: str) -> bool:
    """Write what the running ``task`` reported; ``False`` if the run no longer holds it
    (nothing written)."""
    keep = max(int(pgtasks_settings.TASK_LOG_LENGTH or 0), 1) - 1
    connection = connections[using]
    sql = _IN_TRANSACTION if connection.in_atomic_block else _ON_ITS_OWN
    with connection.cursor() as cursor:
        cursor.execute(sql, {
            "progress": progress_json, "entries": entries_json, "keep": keep, "id": task.pk,
            "worker": task.locked_by, "claims": task.claims})
        return cursor.rowcount == 1
