"""Events: ``Task.objects.send_event(key, payload)`` and the wait of a durable task for one.

An event is the last payload sent under a key (the table ``pgtasks_event``). A run that
waits for a key (``context.wait_for_event()``) either finds it sent and goes on with its
payload, or *flags* its task (``awaited_event = key``) and ends suspended
(``SUSPEND_SQL`` of :mod:`.transitions`): ``READY``, due at the wait's deadline, holding no
thread. Sending the key clears the flag of every task that carries it and makes the
suspended ones due now; the trigger on ``run_after`` wakes a worker at once (``NOTIFY``), and
the task runs again, replays its kept steps and finds the event.

Race-free by one lock per key (a transaction-scoped advisory lock, taken by both sides in a
statement of its own before they read): the sender holds it until its transaction commits,
so a wait that checks the key after the send sees the event, and a send after the wait's
commit sees the flag. A flag found on a task still running (the run checked, then the
event came before its suspension was recorded) is cleared too, and ``SUSPEND_SQL`` then
makes the task due now. The event is sent with the caller's transaction: rolled back, it
was never sent, and no task woke.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from django_pgtasks.database.schema import RUNNING

# One advisory lock per event key (two keys may share one: they then only wait for each
# other), in a class of its own; taken in its own statement, so that the statements after
# it read what the lock's previous holder committed.
LOCK_SQL = "SELECT pg_advisory_xact_lock(1886611265, hashtext(%(key)s))"

# Send: keep the payload under the key (the last one sent wins), then clear the flag of the
# tasks waiting for it and make the suspended ones due now (the running ones: see above).
SEND_SQL = """
    WITH sent AS (
        INSERT INTO pgtasks_event (key, payload, sent_at)
        VALUES (%(key)s, %(payload)s::jsonb, statement_timestamp())
        ON CONFLICT (key) DO UPDATE SET payload = EXCLUDED.payload, sent_at = EXCLUDED.sent_at
        RETURNING key
    )
    UPDATE pgtasks_task t
    SET awaited_event = NULL, updated_at = statement_timestamp(),
        run_after = CASE WHEN t.status = 'READY'
                         THEN least(t.run_after, statement_timestamp()) ELSE t.run_after END
    FROM sent
    WHERE t.awaited_event = sent.key AND t.status IN ('READY', 'RUNNING')
    RETURNING t.id
"""

# Wait: read the event; if it was not sent, flag the running task (under its lease) so that
# the send wakes it. Returns whether it was sent, its payload, whether the task was flagged
# (false with nothing sent: the run lost its task) and the database clock.
WAIT_SQL = f"""
    WITH sent AS (SELECT payload FROM pgtasks_event WHERE key = %(key)s),
    flagged AS (
        UPDATE pgtasks_task SET awaited_event = %(key)s
        WHERE id = %(id)s AND {RUNNING} AND locked_by = %(worker)s
          AND claims = %(claims)s AND NOT EXISTS (SELECT FROM sent)
        RETURNING id
    )
    SELECT EXISTS (SELECT FROM sent), (SELECT payload FROM sent),
           EXISTS (SELECT FROM flagged), statement_timestamp()
"""


# A wait that timed out: the running task no longer waits (its flag cleared).
UNFLAG_SQL = f"""
    UPDATE pgtasks_task SET awaited_event = NULL
    WHERE id = %(id)s AND {RUNNING} AND locked_by = %(worker)s AND claims = %(claims)s
"""


def send(key: str, payload_json: str, using: str) -> list[int]:
    """Send the event ``key`` with ``payload_json`` (its payload as JSON text) in the current
    transaction (or one of its own); return the ids of the tasks it woke."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(LOCK_SQL, {"key": key})
        cursor.execute(SEND_SQL, {"key": key, "payload": payload_json})
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class Check:
    """What a wait found: the event sent (and its payload), or its task flagged."""

    sent: bool
    payload: Any
    flagged: bool
    #: The database clock when it looked.
    now: datetime


def check(task: Any, key: str, using: str) -> Check:
    """Look for the event ``key`` for the running ``task``, flagging it if not sent; under
    the key's lock, in the caller's transaction (which must be open: the flag and what the
    run keeps of the wait commit together)."""
    with connections[using].cursor() as cursor:
        cursor.execute(LOCK_SQL, {"key": key})
        cursor.execute(WAIT_SQL, {"key": key, "id": task.pk, "worker": task.locked_by,
                                  "claims": task.claims})
        sent, payload, flagged, now = cursor.fetchone()
    if isinstance(payload, str):  # jsonb comes as text through Django's connections
        payload = json.loads(payload)
    return Check(sent, payload, flagged, now)


# Delete the events sent more than %(age)s seconds ago, oldest first, at most %(limit)s
# (through the index on sent_at).
EXPIRE_SQL = """
    DELETE FROM pgtasks_event WHERE key IN (
        SELECT key FROM pgtasks_event
        WHERE sent_at < statement_timestamp() - make_interval(secs => %(age)s)
        ORDER BY sent_at LIMIT %(limit)s)
"""


def expire(using: str, age: float, limit: int) -> int:
    """Delete up to ``limit`` events sent more than ``age`` seconds ago; return how many."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(EXPIRE_SQL, {"age": age, "limit": limit})
        return cursor.rowcount


def unflag(task: Any, using: str) -> None:
    """The wait of the running ``task`` timed out: clear its flag (in the caller's
    transaction, with what the run keeps of the time-out)."""
    with connections[using].cursor() as cursor:
        cursor.execute(UNFLAG_SQL, {"id": task.pk, "worker": task.locked_by,
                                    "claims": task.claims})
