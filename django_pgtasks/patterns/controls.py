"""Queue controls kept in the database: pause and resume, and rate limits per queue or key.

Every worker reads these rows in its claim statement, so a change made here applies to the
whole cluster as soon as its transaction commits:

- :func:`pause` stops workers from *starting* tasks of a queue (running tasks finish);
  :func:`resume` lets them start again and wakes idle workers at once (``NOTIFY``).
- :func:`set_rate_limit` allows at most ``limit`` starts per ``period`` for a queue, or for
  the tasks of one concurrency key, across all workers; :func:`clear_rate_limit` removes it.

Per-key *concurrency* limits are not set here: a task carries them from its enqueue call
(``concurrency_key=``, ``concurrency_limit=``). How the claim enforces all of it is explained
in :mod:`django_pgtasks.lifecycle.claim` and ``docs/howto/concurrency-limits.md``.

The rows live in two small tables: ``pgtasks_queue`` (:class:`QueueControl`, one row per queue
that has ever been paused or rate-limited) and ``pgtasks_key_rate`` (:class:`KeyRateLimit`).
A queue without a row runs normally.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections
from django.db.models.functions import Now

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.options import validate_queue
from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.models.controls import MAX_RATE_LIMIT, KeyRateLimit, QueueControl

if TYPE_CHECKING:
    pass

@dataclass(frozen=True)
class QueueStatus:
    """What :func:`status` reports for one queue."""

    queue: str
    paused: bool
    paused_at: datetime | None
    rate_limit: int | None
    rate_period: timedelta | None
    #: Starts still allowed in the current window (``None`` without a rate limit).
    rate_available: int | None
    waiting: int
    running: int


def _db(using: str | None, queue: str | None = None) -> str:
    """``using``, else the database that holds ``queue``, else ``PGTASKS["DATABASE"]``."""
    from django_pgtasks.definition.routing import database_for_queue

    return using or (database_for_queue(queue) if queue else pgtasks_settings.DATABASE)


def _by_database(queues: tuple[str, ...], using: str | None) -> dict[str, list[str]]:
    """The (validated) queues grouped by the database that holds them."""
    if not queues:
        raise ValueError("Name at least one queue.")
    groups: dict[str, list[str]] = {}
    for queue in queues:
        groups.setdefault(_db(using, validate_queue(queue)), []).append(queue)
    return groups


PAUSE_SQL = """
    INSERT INTO pgtasks_queue AS c (queue, paused, paused_at, updated_at)
    SELECT q, true, now(), now() FROM unnest(%s::text[]) AS q
    ON CONFLICT (queue) DO UPDATE SET paused = true, paused_at = now(), updated_at = now()
    WHERE NOT c.paused
"""

RESUME_SQL = """
    WITH resumed AS (
        UPDATE pgtasks_queue SET paused = false, paused_at = NULL, updated_at = now()
        WHERE queue = ANY(%s) AND paused
        RETURNING queue
    )
    SELECT queue, pg_notify('pgtasks', queue) FROM resumed
"""


def pause(*queues: str, using: str | None = None) -> int:
    """Pause ``queues``: from the commit on, no worker starts a task of them.

    Tasks already running finish normally (and their retries wait until the queue is
    resumed). Enqueueing still works. Pausing a paused queue changes nothing. Returns how many
    queues changed from running to paused. Each queue is paused in the database that holds
    it (or ``using``), inside the caller's transaction if there is one.
    """
    changed = 0
    for db, names in _by_database(queues, using).items():
        with connections[db].cursor() as cursor:
            cursor.execute(PAUSE_SQL, [names])
            changed += cursor.rowcount
    return changed


def resume(*queues: str, using: str | None = None) -> int:
    """Resume paused ``queues`` and wake their idle workers at once; return how many changed.

    The wake-up is a ``NOTIFY`` on the channel workers listen to, sent with the change's
    commit.
    """
    changed = 0
    for db, names in _by_database(queues, using).items():
        with connections[db].cursor() as cursor:
            cursor.execute(RESUME_SQL, [names])
            changed += len(cursor.fetchall())
    return changed


def is_paused(queue: str, using: str | None = None) -> bool:
    """Whether ``queue`` is paused now."""
    return QueueControl.objects.using(_db(using, queue)).filter(queue=queue,
                                                                 paused=True).exists()


def _period(period: timedelta | float) -> timedelta:
    if isinstance(period, bool) or not isinstance(period, timedelta | int | float):
        raise InvalidTaskError(f"period must be a timedelta or seconds, not {period!r}.")
    value = period if isinstance(period, timedelta) else timedelta(seconds=period)
    if value <= timedelta(0):
        raise InvalidTaskError(f"period must be positive, not {period!r}.")
    return value


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RATE_LIMIT:
        raise InvalidTaskError(
            f"A rate limit must be an integer from 1 to {MAX_RATE_LIMIT}, not {limit!r}."
        )
    return limit


def validate_rate_limit(limit: int, period: timedelta | float) -> tuple[int, timedelta]:
    """Check a rate limit; return it with the period as a timedelta, or raise
    ``InvalidTaskError``."""
    return _limit(limit), _period(period)


def set_rate_limit(
    limit: int,
    period: timedelta | float,
    *,
    queue: str | None = None,
    key: str | None = None,
    using: str | None = None,
) -> None:
    """Allow at most ``limit`` task starts per ``period`` (a timedelta or seconds).

    Give exactly one of ``queue`` (every task of the queue) or ``key`` (the tasks whose
    ``concurrency_key`` is ``key``, in any queue). The window slides: in any span of
    ``period`` on the database clock, at most ``limit`` of those tasks start. Changing a
    limit keeps the record of recent starts, so a lower limit applies at once.
    """
    limit, period = validate_rate_limit(limit, period)
    if (queue is None) == (key is None):
        raise ValueError("Give exactly one of queue= or key=.")
    db = _db(using, queue)
    if queue is not None:
        validate_queue(queue)
        QueueControl.objects.using(db).bulk_create(
            [QueueControl(queue=queue, rate_limit=limit, rate_period=period)],
            update_conflicts=True, unique_fields=["queue"],
            update_fields=["rate_limit", "rate_period", "updated_at"],
        )
    else:
        if not isinstance(key, str) or not 1 <= len(key) <= 255:
            raise InvalidTaskError(f"key must be a string of 1 to 255 characters, not {key!r}.")
        KeyRateLimit.objects.using(db).bulk_create(
            [KeyRateLimit(key=key, rate_limit=limit, rate_period=period)],
            update_conflicts=True, unique_fields=["key"],
            update_fields=["rate_limit", "rate_period", "updated_at"],
        )


def clear_rate_limit(
    *, queue: str | None = None, key: str | None = None, using: str | None = None
) -> bool:
    """Remove the rate limit of ``queue`` or of ``key``; ``True`` if there was one."""
    if (queue is None) == (key is None):
        raise ValueError("Give exactly one of queue= or key=.")
    db = _db(using, queue)
    if queue is not None:
        changed = QueueControl.objects.using(db).filter(
            queue=queue, rate_limit__isnull=False
        ).update(rate_limit=None, rate_period=None, rate_starts=[], updated_at=Now())
        if changed:
            with connections[db].cursor() as cursor:  # its waiting tasks may start now
                cursor.execute("SELECT pg_notify('pgtasks', %s)", [queue])
        return bool(changed)
    deleted, _ = KeyRateLimit.objects.using(db).filter(key=key).delete()
    return bool(deleted)


STATUS_SQL = """
    SELECT q.name, c.paused, c.paused_at, c.rate_limit, c.rate_period,
           CASE WHEN c.rate_limit IS NOT NULL
                THEN pgtasks_rate_free(c.rate_starts, c.rate_limit, c.rate_period) END,
           (SELECT count(*) FROM pgtasks_task t
            WHERE t.queue = q.name AND t.status IN ('READY', 'AWAITING_RETRY')),
           (SELECT count(*) FROM pgtasks_task t
            WHERE t.queue = q.name AND t.status = 'RUNNING')
    FROM unnest(%s::text[]) WITH ORDINALITY AS q(name, n)
    LEFT JOIN pgtasks_queue c ON c.queue = q.name
    ORDER BY q.n
"""


def status(*queues: str, using: str | None = None) -> list[QueueStatus]:
    """The state of ``queues`` (default: every configured queue), in the order given.

    ``waiting`` counts pending tasks (due or not), read from the claim index.
    """
    groups = _by_database(tuple(queues or pgtasks_settings.queue_names), using)
    found: dict[str, QueueStatus] = {}
    for db, names in groups.items():
        with connections[db].cursor() as cursor:
            cursor.execute(STATUS_SQL, [names])
            for name, paused, paused_at, limit, period, free, waiting, running in (
                cursor.fetchall()
            ):
                found[name] = QueueStatus(
                    queue=name, paused=bool(paused), paused_at=paused_at, rate_limit=limit,
                    rate_period=period, rate_available=free, waiting=waiting, running=running)
    return [found[name] for name in (queues or pgtasks_settings.queue_names)]


def key_rate_limits(using: str | None = None) -> dict[str, tuple[int, timedelta]]:
    """Every key rate limit: ``{key: (limit, period)}``."""
    rows = KeyRateLimit.objects.using(_db(using)).values_list("key", "rate_limit",
                                                               "rate_period")
    return {key: (limit, period) for key, limit, period in rows}


def ensure_queue_rows(using: str | None = None) -> None:
    """Create a (running, unlimited) row for every configured queue of database ``using``
    (default ``PGTASKS["DATABASE"]``) that has none, so that the admin lists them all."""
    from django_pgtasks.definition.routing import queues_on

    db = _db(using)
    with connections[db].cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgtasks_queue (queue) SELECT unnest(%s::text[]) "
            "ON CONFLICT (queue) DO NOTHING",
            [queues_on(db)],
        )


def describe_rate(limit: int | None, period: timedelta | None) -> str:
    """``"10 per 1s"``-style text for a rate limit, ``"-"`` without one."""
    if limit is None or period is None:
        return "-"
    return f"{limit} per {period.total_seconds():g}s"

