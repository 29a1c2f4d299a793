"""The checkpoint of a step: the one write a durable task makes to its own row while it runs.

A step's entry (see :mod:`django_pgtasks.definition.steps`) is appended to the task's
``steps`` by one ``UPDATE`` under the same lease guard as the outcome: only while the run
that completed the step still holds the task. An atomic step runs this statement in the
transaction of its own writes, so both commit together or not at all; the row lock it takes
makes a rescue of the task wait for that commit (and a rescue that came first makes the
guard fail, which rolls the step's writes back).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connections

from django_pgtasks.database.schema import RUNNING
from django_pgtasks.exceptions import LeaseLostError

# Append the entry of a completed step to a running task's steps, while the run that
# completed it holds the task: still RUNNING (in the live partition), under the worker and
# claim that took it. Returns the entry as stored (its attempt and time are the row's).
# {with_unflushed} and {from_unflushed}: see UNFLUSHED.
CHECKPOINT_SQL = f"""
    {{with_unflushed}}UPDATE pgtasks_task
    SET steps = steps || jsonb_build_array(jsonb_build_object(
            'name', %(name)s::text, 'result', {{result}}, 'attempt', attempt,
            'at', statement_timestamp(), 'ms', round(%(ms)s::numeric, 3)))
    {{from_unflushed}}WHERE id = %(id)s AND {RUNNING} AND locked_by = %(worker)s
      AND claims = %(claims)s
    RETURNING steps -> -1
"""
#: A step's result, given as JSON text.
RESULT = "%(result)s::jsonb"
#: A durable sleep's result: when it ends, given (``sleep_until()``) or the given seconds
#: from now on the database clock (``sleep()``).
SLEEP_RESULT = ("jsonb_build_object('until', coalesce(%(until)s::timestamptz, "
                "statement_timestamp() + make_interval(secs => %(seconds)s::float8)))")

# The checkpoint of a step that is not atomic commits on its own, without waiting for the
# WAL to reach the disk (synchronous_commit off for its one-statement transaction): a
# crash of the server may lose it, and then the step runs again, which a step that is not
# atomic allows anyway (at least once). The next commit that waits (the task's outcome, an
# atomic step) flushes it. An atomic step's checkpoint commits with the step's own writes,
# as the caller's transaction is configured.
UNFLUSHED = {
    "with_unflushed": "WITH unflushed AS (SELECT set_config('synchronous_commit', 'off', true))\n",
    "from_unflushed": "FROM unflushed ",
}
_NO_FLUSH = {"with_unflushed": "", "from_unflushed": ""}
_STATEMENTS = {
    (result, in_transaction): CHECKPOINT_SQL.format(
        result=result, **(_NO_FLUSH if in_transaction else UNFLUSHED))
    for result in (RESULT, SLEEP_RESULT) for in_transaction in (False, True)
}


def checkpoint(task: Any, name: str, result_json: str, ms: float, using: str) -> dict:
    """Keep step ``name`` of ``task`` (a claimed task) as completed with ``result_json``
    (its result as JSON text) after ``ms`` milliseconds; return the entry as stored.

    Raises :class:`~django_pgtasks.exceptions.LeaseLostError` if the run no longer holds the
    task (rescued, cancelled or changed meanwhile): nothing is kept, and in an atomic step
    the caller's transaction is rolled back with it."""
    return _keep(task, name, RESULT, {"result": result_json, "ms": ms}, using)


def keep_sleep(task: Any, name: str, seconds: float | None, until: datetime | None,
               using: str) -> dict:
    """Keep the durable sleep ``name`` of ``task``: its result is ``{"until": <time>}``,
    ``until`` or ``seconds`` from now on the database clock. Raises as :func:`checkpoint`."""
    return _keep(task, name, SLEEP_RESULT, {"seconds": seconds, "until": until, "ms": 0},
                 using)


def _keep(task: Any, name: str, result: str, params: dict[str, Any], using: str) -> dict:
    connection = connections[using]
    sql = _STATEMENTS[result, connection.in_atomic_block]
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, "name": name, "id": task.pk,
                             "worker": task.locked_by, "claims": task.claims})
        row = cursor.fetchone()
    if row is None:
        raise LeaseLostError(
            f"Task {task.pk}: step {name!r} completed, but this run no longer holds the task "
            f"(it was rescued, cancelled or changed meanwhile); the step is not kept.")
    entry = row[0]
    return json.loads(entry) if isinstance(entry, str) else entry
