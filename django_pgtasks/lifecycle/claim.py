"""The claim statements: the SQL the ORM cannot say by itself.

There are two. The **plain claim** serves queues without concurrency keys or rate limits, which
is every queue unless those features are used. ``TaskManager.claim()`` builds, per queue, the
candidate query with the ORM (``claimable(queue).select_for_update(skip_locked=True)[:limit]``)
and :func:`claim_statement` wraps those queries into a single ``UPDATE … RETURNING``::

    WITH c0 AS (SELECT id, priority, run_after FROM pgtasks_task
                WHERE status IN ('READY', 'AWAITING_RETRY') AND run_after <= now() AND queue = %s
                  AND concurrency_key IS NULL
                  AND NOT EXISTS (<the queue is paused or rate-limited>)
                ORDER BY priority DESC, run_after, id LIMIT n FOR UPDATE SKIP LOCKED),
         c1 AS (… the same for the next queue …),
         picked AS (SELECT id FROM (c0 UNION ALL c1) ORDER BY priority DESC, run_after, id LIMIT n)
    UPDATE pgtasks_task_live t SET status = 'RUNNING', locked_by = %s, locked_at = now(), …
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
- the plain claim never takes a task it must not: a task with a concurrency key, or any task
  of a paused or rate-limited queue. The ``NOT EXISTS`` is uncorrelated, so PostgreSQL
  evaluates it once per statement (an ``InitPlan``: one probe of the small ``pgtasks_queue``
  table) and a paused queue's scan never starts.

The **controlled claim** is the PL/pgSQL function ``pgtasks_claim_controlled()`` (migration
0006), one round trip as well. It runs several statements in the claim's transaction, and
in READ COMMITTED each statement of a function takes a fresh snapshot, which is what makes a
per-key limit exact:

1. lock the rows of the claimed queues that have a rate limit (claims of one rate-limited
   queue take turns), and keep the queues that are neither paused nor out of starts;
2. read which keys are full (a hint that lets the scan skip their waiting tasks);
3. lock candidates per queue in claim order with ``SKIP LOCKED``, from the same claim index;
4. take a transaction-level advisory lock per candidate key (sorted, so two claimers cannot
   deadlock), then lock the key's rate-limit row. Two claimers of one key now take turns:
   the second gets the lock only after the first committed;
5. with a snapshot taken *after* those locks, count the running tasks of each key, so the
   second claimer sees the tasks the first one started: it can never see ``N - 1`` running
   when there are ``N``. Pick per key the first tasks in claim order that fit its limit and
   rate, then per queue those that fit its rate, then the best ``limit`` overall;
6. mark them running; 7. record their start times in the rate windows;
8. if it took fewer than asked, say when to look again (``pgtasks.retry_in``): when a rate
   limit frees a start, or at once when key limits cut a full window of candidates short.

A rate limit keeps in its row the start times of its latest ``rate_limit`` tasks (the
database's ``now()``, the same value as the tasks' ``started_at``) and allows a start when
fewer than ``rate_limit`` of them fall within the last ``rate_period``: a sliding window, so
*any* span of ``rate_period`` holds at most ``rate_limit`` starts, not just fixed buckets.

Which claim a process uses is decided per (database, queues) and kept for
``PGTASKS["CONTROLS_REFRESH"]`` seconds: the controlled one while any of the queues has a rate
limit or a waiting task with a concurrency key, the plain one otherwise. The decision is
refreshed without a round trip of its own when possible: a plain claim made after the
decision expired also returns, with the rows it claims, whether the controlled claim is
needed. Since the plain claim never takes what it must not, a stale decision can only delay
keyed or rate-limited tasks (by at most that many seconds), never break a limit or a pause.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Exists, Manager, Q, QuerySet

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.partition_moves import retry_conflicts
from django_pgtasks.database.schema import LIVE_TABLE
from django_pgtasks.definition.task_row import TaskRow
from django_pgtasks.lifecycle.row_loading import load_rows

ORDER_SQL = "priority DESC, run_after, id"
#: First key of the transaction-level advisory locks on concurrency keys ("pgtk"); the second
#: is ``hashtext(key)``. See ``sql/claim.sql``.
KEY_LOCK_NAMESPACE = 0x7067746B
#: Column the plain claim adds to its rows when it also reports whether the controlled claim
#: is needed.
MODE_COLUMN = "pgtasks_controlled"


class ClaimedTasks(list):
    """The tasks a claim returned, in claim order, plus a hint for the worker.

    ``retry_in``: seconds after which a claim may find tasks that limits held back now
    (``None``: nothing to wait for; a notification or the poll will do).
    """

    retry_in: float | None = None


def claim_statement(
    connection: BaseDatabaseWrapper,
    table: str,
    candidates: Sequence[QuerySet],
    limit: int,
    *,
    mode_queues: Sequence[str] | None = None,
) -> tuple[str, list[Any]]:
    """Return ``(sql, params)`` of the claim for the given per-queue candidate querysets.

    The statement's last two placeholders, not included in ``params``, both take the worker
    id. Must be called inside the claim's transaction: Django refuses to compile
    ``select_for_update()`` outside one. With ``mode_queues``, each returned row also has the
    column :data:`MODE_COLUMN`: whether those queues need the controlled claim.
    """
    params: list[Any] = []
    ctes = []
    for i, queryset in enumerate(candidates):
        sql, qparams = queryset.query.get_compiler(connection=connection).as_sql()
        ctes.append(f"c{i} AS ({sql})")
        params.extend(qparams)
    t = connection.ops.quote_name(table)
    returning = f"{t}.*"
    if mode_queues is not None:
        ctes.append(f"mode AS (SELECT {MODE_SQL} AS controlled)")
        params.extend([list(mode_queues), list(mode_queues)])
        returning += f", (SELECT controlled FROM mode) AS {MODE_COLUMN}"
    union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(len(candidates)))
    ctes.append(f"picked AS (SELECT id FROM ({union}) AS u ORDER BY {ORDER_SQL} LIMIT %s)")
    params.append(limit)
    sql = (
        f"WITH {', '.join(ctes)} "
        f"UPDATE {t} SET status = 'RUNNING', locked_by = %s, locked_at = now(), "
        f"claims = {t}.claims + 1, "
        f"started_at = now(), finished_at = NULL, attempt = {t}.attempt + 1, updated_at = now(), "
        f"worker_ids = {t}.worker_ids || jsonb_build_array(%s::text) "
        f"FROM picked WHERE {t}.id = picked.id RETURNING {returning}"
    )
    return sql, params


#: Whether queues need the controlled claim: one has a rate limit, or has a waiting task with
#: a concurrency key (an index probe per queue on pgtasks_task_key_pending_idx, which is
#: empty unless keys are used). Takes the queue list twice.
MODE_SQL = """(
    EXISTS (SELECT 1 FROM pgtasks_queue
            WHERE queue = ANY (%s::text[]) AND rate_limit IS NOT NULL)
    OR EXISTS (SELECT 1 FROM unnest(%s::text[]) AS q(name)
               WHERE EXISTS (SELECT 1 FROM pgtasks_task_live k
                             WHERE k.queue = q.name AND k.concurrency_key IS NOT NULL
                               AND k.status IN ('READY', 'AWAITING_RETRY'))))"""

CONTROLLED_SQL = "SELECT * FROM pgtasks_claim_controlled(%s::text[], %s, %s, %s)"

#: Compiled plain claims by (database alias, queues, limit, with the mode column).
_statements: dict[tuple[str, tuple[str, ...], int, bool], tuple[str, list[Any]]] = {}
STATEMENT_CACHE_SIZE = 256
#: Per (database alias, queues): (time.monotonic() until which it holds, controlled?).
_modes: dict[tuple[str, tuple[str, ...]], tuple[float, bool]] = {}


def forget_modes() -> None:
    """Drop every kept decision between the plain and the controlled claim (tests use it
    after changing limits behind the claim's back; the decision expires by itself anyway)."""
    _modes.clear()


def _remember(db: str, queues: tuple[str, ...], controlled: bool) -> None:
    _modes[(db, queues)] = (time.monotonic() + pgtasks_settings.CONTROLS_REFRESH, controlled)


def _plain_candidates(manager: Manager[Any], db: str, queue: str, limit: int) -> QuerySet:
    QueueControl = apps.get_model("django_pgtasks", "QueueControl")
    held_back = QueueControl.objects.using(db).filter(
        Q(paused=True) | Q(rate_limit__isnull=False), queue=queue
    )
    return (
        manager.db_manager(db).claimable(queue)
        .filter(concurrency_key__isnull=True)
        .filter(~Exists(held_back))
        .select_for_update(skip_locked=True)
        .values_list("id", "priority", "run_after")[:limit]
    )


def _plain(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
    with_mode: bool,
) -> list[TaskRow]:
    with transaction.atomic(using=db, savepoint=False):
        # Compiling the candidate querysets costs more than running the statement, and the
        # result only depends on these: compile once, reuse.
        key = (db, queues, limit, with_mode)
        statement = _statements.get(key)
        if statement is None:
            candidates = [_plain_candidates(manager, db, q, limit) for q in queues]
            statement = claim_statement(
                connections[db], LIVE_TABLE, candidates, limit,
                mode_queues=queues if with_mode else None,
            )
            if len(_statements) < STATEMENT_CACHE_SIZE:
                _statements[key] = statement
        sql, params = statement
        return load_rows(manager.model, db, sql, [*params, worker_id, worker_id])


def _needs_control(db: str, queues: tuple[str, ...]) -> bool:
    with connections[db].cursor() as cursor:
        cursor.execute(f"SELECT {MODE_SQL}", [list(queues), list(queues)])
        return bool(cursor.fetchone()[0])


def controlled_window(limit: int) -> int:
    """Candidates the controlled claim locks per queue for a claim of ``limit`` tasks: more
    than ``limit``, so that tasks of other keys behind a full key are reached."""
    return max(4 * limit, 32)


def _controlled(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
) -> ClaimedTasks:
    with transaction.atomic(using=db, savepoint=False):
        tasks = ClaimedTasks(load_rows(
            manager.model, db, CONTROLLED_SQL,
            [list(queues), limit, worker_id, controlled_window(limit)],
        ))
        if len(tasks) < limit:
            with connections[db].cursor() as cursor:
                cursor.execute("SELECT current_setting('pgtasks.retry_in', true)")
                hint = cursor.fetchone()[0]
            tasks.retry_in = float(hint) if hint else None
    return tasks


def claim(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
) -> ClaimedTasks:
    """Claim up to ``limit`` tasks of ``queues`` for ``worker_id`` (see the module doc).

    A claim that meets a task moved to history meanwhile (cancelled, say) is made again
    (django_pgtasks.database.partition_moves)."""
    return retry_conflicts(db, lambda: _claim(manager, worker_id, queues, limit, db))


def _claim(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
) -> ClaimedTasks:
    now = time.monotonic()
    until, controlled = _modes.get((db, queues), (0.0, False))
    if now >= until and controlled:
        # It was needed last time: check on its own rather than risk one plain claim that
        # would pass over keyed tasks of higher priority.
        controlled = _needs_control(db, queues)
        _remember(db, queues, controlled)
    elif now >= until:
        rows = _plain(manager, worker_id, queues, limit, db, with_mode=True)
        if rows:
            controlled = bool(getattr(rows[0], MODE_COLUMN))
            for row in rows:
                delattr(row, MODE_COLUMN)
        else:
            controlled = _needs_control(db, queues)
        _remember(db, queues, controlled)
        if not controlled or len(rows) == limit:
            return _sorted(rows)
        # The plain claim took what it could; the controlled one takes the rest.
        more = _controlled(manager, worker_id, queues, limit - len(rows), db)
        result = _sorted([*rows, *more])
        result.retry_in = more.retry_in
        return result
    if controlled:
        return _sorted(_controlled(manager, worker_id, queues, limit, db))
    return _sorted(_plain(manager, worker_id, queues, limit, db, with_mode=False))


def _sorted(tasks: Sequence[TaskRow]) -> ClaimedTasks:
    result = ClaimedTasks(sorted(tasks, key=lambda t: (-t.priority, t.run_after, t.pk)))
    result.retry_in = getattr(tasks, "retry_in", None)
    return result
