"""The claim statement: the one piece of SQL the ORM cannot say by itself.

``TaskManager.claim()`` builds, per queue, the candidate query with the ORM
(``claimable(queue).select_for_update(skip_locked=True)[:limit]``) and this module wraps those
queries into a single ``UPDATE … RETURNING``::

    WITH c0 AS (SELECT id, priority, run_after FROM pgtasks_task
                WHERE status IN ('READY', 'AWAITING_RETRY') AND run_after <= now() AND queue = %s
                ORDER BY priority DESC, run_after, id LIMIT n FOR UPDATE SKIP LOCKED),
         c1 AS (… the same for the next queue …),
         picked AS (SELECT id FROM (c0 UNION ALL c1) ORDER BY priority DESC, run_after, id LIMIT n)
    UPDATE pgtasks_task t SET status = 'RUNNING', locked_by = %s, locked_at = now(), …
    FROM picked WHERE t.id = picked.id RETURNING t.*

Why this shape:
- one statement and one round trip: the rows are locked, marked running and returned at once,
  so the claim transaction lasts a millisecond and holds no lock across the network;
- ``SKIP LOCKED`` makes concurrent claimers pass over each other's rows instead of waiting for
  them or taking them twice;
- one candidate query per queue, because each is an ordered range scan of the partial index
  ``pgtasks_task_claim_idx (queue, priority DESC, run_after, id) WHERE status IN (pending)``;
  a single ``queue = ANY(...)`` query could not use the index for its ordering and would sort
  the whole backlog of those queues on every claim. Rows a per-queue query locked but the final
  ``LIMIT`` did not pick are unlocked again when the statement's transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

ORDER_SQL = "priority DESC, run_after, id"


def claim_statement(
    connection: BaseDatabaseWrapper,
    table: str,
    candidates: Sequence[QuerySet],
    limit: int,
) -> tuple[str, list[Any]]:
    """Return ``(sql, params)`` of the claim for the given per-queue candidate querysets.

    The statement's last two placeholders, not included in ``params``, both take the worker
    id. Must be
    called inside the claim's transaction: Django refuses to compile ``select_for_update()``
    outside one.
    """
    params: list[Any] = []
    ctes = []
    for i, queryset in enumerate(candidates):
        sql, qparams = queryset.query.get_compiler(connection=connection).as_sql()
        ctes.append(f"c{i} AS ({sql})")
        params.extend(qparams)
    union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(len(candidates)))
    ctes.append(f"picked AS (SELECT id FROM ({union}) AS u ORDER BY {ORDER_SQL} LIMIT %s)")
    params.append(limit)
    t = connection.ops.quote_name(table)
    sql = (
        f"WITH {', '.join(ctes)} "
        f"UPDATE {t} SET status = 'RUNNING', locked_by = %s, locked_at = now(), "
        f"started_at = now(), finished_at = NULL, attempt = {t}.attempt + 1, updated_at = now(), "
        f"worker_ids = {t}.worker_ids || jsonb_build_array(%s::text) "
        f"FROM picked WHERE {t}.id = picked.id RETURNING {t}.*"
    )
    return sql, params
