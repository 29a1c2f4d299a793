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

**The moving lower bound.** A claim marks its rows running, which leaves their entries in
the claim index behind as dead entries until VACUUM removes them, and VACUUM cannot while any
transaction in the database is older than them (a long report, a session left idle in a
transaction, a replica's query with ``hot_standby_feedback``). A claim that scans from the
start of the index then steps over every task claimed since that transaction began: a drain
slows down with every task it runs. So once a claim of a queue took tasks, the next claims of
that queue start where it ended: per queue, two candidate queries instead of one, each a range
of the same index::

    a: ... AND priority > <last taken>.priority                              (higher first)
    b: ... AND priority = <last taken>.priority AND (run_after, id) > (<last taken>)

Everything before the bound was taken or locked by a claimer when the bound was set. A task
can still come to lie before it later (one enqueued with a ``run_after`` in the past, one given
back by the rescue, an unclaim or a cancelled claim, one a lock of another statement hid from
the claim): the bounded claim does not see it, so the bound is only a shortcut, and the plain
claim runs again (a) in the same transaction whenever the bounded one finds fewer tasks than
asked (the queue's range after the bound is used up, or tasks of a lower priority come next),
(b) at least every :data:`BOUND_REFRESH` seconds, and (c) at once after this process gave
tasks back to their place (:func:`forget_bounds`). Such a task waits at most that long behind
later ones of its priority, and only while its queue has a backlog.

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

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.core.signals import setting_changed
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, Exists, Manager, Q, QuerySet
from django.db.models.expressions import RawSQL

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

#: Compiled plain claims by (database alias, queues, limit, with the mode column, which queues
#: are claimed from their bound), the least recently used dropped past the size: a worker's
#: limits vary with its free threads and prefetch.
_statements: OrderedDict[tuple[Any, ...], tuple[str, list[Any]]] = OrderedDict()
_statements_lock = threading.Lock()  # claims of several threads (tests, embedded workers)
STATEMENT_CACHE_SIZE = 256
#: Per (database alias, queues): (time.monotonic() until which it holds, controlled?).
_modes: dict[tuple[str, tuple[str, ...]], tuple[float, bool]] = {}


#: Longest time the plain claim of a queue goes on from its moving lower bound before it scans
#: its queue from the start again (see the module doc). Under a held snapshot such a scan
#: costs a few milliseconds per 100,000 tasks run since: four a second cost little.
BOUND_REFRESH = 0.25


class _Slot:
    """A placeholder of a compiled bounded claim, filled with the bound of the claim at hand."""

    def __init__(self, queue: int, part: int) -> None:
        self.queue, self.part = queue, part


#: Per (database alias, queues): (time.monotonic() until which the bounds may be used, and per
#: queue the claim-order key ``(priority, run_after, id)`` of the last task claimed).
_bounds: dict[tuple[str, tuple[str, ...]], tuple[float, dict[str, tuple[Any, ...]]]] = {}


def forget_bounds() -> None:
    """Drop every moving lower bound: the next claims of this process scan their queues from
    the start. Called when this process gives tasks back to their place in the queue (an
    interrupted or unstarted run, the rescue), so that its next claim takes them first; a
    bound also expires by itself after :data:`BOUND_REFRESH` seconds."""
    _bounds.clear()


def _forget_bounds_on_change(**kwargs: Any) -> None:
    forget_bounds()  # a bound's time may be naive or aware by USE_TZ, changed in tests


setting_changed.connect(_forget_bounds_on_change, dispatch_uid="django_pgtasks.lifecycle.claim")


def forget_modes() -> None:
    """Drop every kept decision between the plain and the controlled claim (tests use it
    after changing limits behind the claim's back; the decision expires by itself anyway)."""
    _modes.clear()


def _remember(db: str, queues: tuple[str, ...], controlled: bool) -> None:
    _modes[(db, queues)] = (time.monotonic() + pgtasks_settings.CONTROLS_REFRESH, controlled)


def _plain_candidates(manager: Manager[Any], db: str, queue: str, limit: int,
                      where: RawSQL | None = None) -> QuerySet:
    QueueControl = apps.get_model("django_pgtasks", "QueueControl")
    held_back = QueueControl.objects.using(db).filter(
        Q(paused=True) | Q(rate_limit__isnull=False), queue=queue
    )
    candidates = (
        manager.db_manager(db).claimable(queue)
        .filter(concurrency_key__isnull=True)
        .filter(~Exists(held_back))
    )
    if where is not None:
        candidates = candidates.filter(where)
    return (candidates.select_for_update(skip_locked=True)
            .values_list("id", "priority", "run_after")[:limit])


def _bounded_candidates(manager: Manager[Any], db: str, i: int, queue: str,
                        limit: int) -> list[QuerySet]:
    """The two candidate queries of a queue claimed from its bound (see the module doc): the
    tasks of a higher priority, then those of the bound's priority after it."""
    above = RawSQL("priority > %s", [_Slot(i, 0)], output_field=BooleanField())
    after = RawSQL("priority = %s AND (run_after, id) > (%s, %s)",
                   [_Slot(i, 0), _Slot(i, 1), _Slot(i, 2)], output_field=BooleanField())
    return [_plain_candidates(manager, db, queue, limit, above),
            _plain_candidates(manager, db, queue, limit, after)]


def _statement(
    manager: Manager[Any], queues: tuple[str, ...], limit: int, db: str, with_mode: bool,
    bounded: tuple[bool, ...],
) -> tuple[str, list[Any]]:
    """The plain claim's statement and parameters, compiled once per shape: which queues are
    claimed from their bound (whose parameters are :class:`_Slot` placeholders)."""
    # Compiling the candidate querysets costs more than running the statement, and the
    # result only depends on these: compile once, reuse.
    key = (db, queues, limit, with_mode, bounded)
    with _statements_lock:
        statement = _statements.get(key)
        if statement is not None:
            _statements.move_to_end(key)
    if statement is None:
        candidates = []
        for i, (queue, from_bound) in enumerate(zip(queues, bounded, strict=True)):
            if from_bound:
                candidates += _bounded_candidates(manager, db, i, queue, limit)
            else:
                candidates.append(_plain_candidates(manager, db, queue, limit))
        statement = claim_statement(
            connections[db], LIVE_TABLE, candidates, limit,
            mode_queues=queues if with_mode else None,
        )
        with _statements_lock:
            _statements[key] = statement
            while len(_statements) > STATEMENT_CACHE_SIZE:
                _statements.popitem(last=False)
    return statement


def _plain_rows(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
    with_mode: bool, bounds: dict[str, tuple[Any, ...]] | None = None,
) -> list[TaskRow]:
    """Run the plain claim in the current transaction; from the ``bounds`` of the queues that
    have one, if given."""
    bounds = bounds or {}
    sql, params = _statement(manager, queues, limit, db, with_mode,
                             tuple(q in bounds for q in queues))
    return load_rows(manager.model, db, sql,
                     [*_filled(params, queues, bounds), worker_id, worker_id])


def _filled(params: list[Any], queues: tuple[str, ...],
            bounds: dict[str, tuple[Any, ...]]) -> list[Any]:
    """The statement's parameters with each :class:`_Slot` replaced by its bound's value."""
    return [bounds[queues[p.queue]][p.part] if isinstance(p, _Slot) else p for p in params]


def plain_statement(
    manager: Manager[Any], queues: Sequence[str], limit: int, db: str, *,
    from_bounds: bool = True,
) -> tuple[str, list[Any]]:
    """``(sql, params)`` of the next plain claim of ``queues`` (the worker id's two
    placeholders not included): from the queues' bounds while they hold, unless
    ``from_bounds=False``. What plan checks run ``EXPLAIN`` on."""
    queues = tuple(queues)
    until, kept = _bounds.get((db, queues), (0.0, {}))
    use = kept if from_bounds and time.monotonic() < until else {}
    with transaction.atomic(using=db, savepoint=False):  # compiles FOR UPDATE (nothing sent)
        sql, params = _statement(manager, queues, limit, db, False,
                                 tuple(q in use for q in queues))
    return sql, _filled(params, queues, use)


def _plain(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
    with_mode: bool,
) -> list[TaskRow]:
    """The plain claim, scanning each queue from the start; sets the queues' bounds."""
    with transaction.atomic(using=db, savepoint=False):
        rows = _plain_rows(manager, worker_id, queues, limit, db, with_mode)
    _, kept = _bounds.get((db, queues), (0.0, {}))
    _set_bounds(db, queues, [], rows, kept, time.monotonic() + BOUND_REFRESH)
    return rows


def _plain_from_bounds(
    manager: Manager[Any], worker_id: str, queues: tuple[str, ...], limit: int, db: str,
) -> list[TaskRow]:
    """The plain claim from the queues' bounds while they hold, topped up by a scan from the
    start when that finds fewer than ``limit`` (see the module doc)."""
    now = time.monotonic()
    until, kept = _bounds.get((db, queues), (0.0, {}))
    use = kept if now < until else {}
    if not use:
        until = now + BOUND_REFRESH
    with transaction.atomic(using=db, savepoint=False):
        rows = _plain_rows(manager, worker_id, queues, limit, db, False, use) if use else []
        scanned = None
        if len(rows) < limit:
            scanned = _plain_rows(manager, worker_id, queues, limit - len(rows), db, False)
    _set_bounds(db, queues, rows, scanned, kept, until)
    return rows if scanned is None else [*rows, *scanned]


def _order_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A bound's place in claim order (priority first, highest first)."""
    return (-row[0], row[1], row[2])


def _set_bounds(db: str, queues: tuple[str, ...], from_bounds: Sequence[TaskRow],
                scanned: Sequence[TaskRow] | None, kept: dict[str, tuple[Any, ...]],
                until: float) -> None:
    """The queues' bounds after a claim, used until ``until``. A queue that a scan from the
    start claimed tasks of is bound at the last of those (tasks between it and an older bound
    may have come to lie there since: they are read again); one that the scan found nothing
    of, or that no scan read, at the latest of its bound and the tasks claimed from it."""
    def last(rows: Sequence[TaskRow], queue: str) -> tuple[Any, ...] | None:
        keys = [(r.priority, r.run_after, r.id) for r in rows if r.queue == queue]
        return max(keys, key=_order_key) if keys else None

    bounds = {}
    for queue in queues:
        bound = last(scanned, queue) if scanned else None
        if bound is None:
            keys = [k for k in (kept.get(queue), last(from_bounds, queue)) if k is not None]
            bound = max(keys, key=_order_key) if keys else None
        if bound is not None:
            bounds[queue] = bound
    _bounds[(db, queues)] = (until, bounds)


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
    return _sorted(_plain_from_bounds(manager, worker_id, queues, limit, db))


def _sorted(tasks: Sequence[TaskRow]) -> ClaimedTasks:
    result = ClaimedTasks(sorted(tasks, key=lambda t: (-t.priority, t.run_after, t.id)))
    result.retry_in = getattr(tasks, "retry_in", None)
    return result
