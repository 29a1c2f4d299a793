"""History partitions: made ahead of time, dropped whole when their retention has passed.

Finished tasks live in two history tables (migration 0014), ``pgtasks_task_done``
(``SUCCESSFUL``, ``CANCELLED``) and ``pgtasks_task_failed`` (``FAILED``), each partitioned by
``finished_at`` into periods of ``PGTASKS["HISTORY_PERIOD"]`` (a day by default, in UTC).
Besides the periods, each has two catch partitions, so that every time has a partition and a
task's end can never fail for want of one:

- ``<table>_before`` (from MINVALUE): rows older than the first period, such as the history
  an upgrade brought along; purged by the batched purge (:mod:`.retention`);
- ``<table>_after`` (to MAXVALUE): ends later than the last period made. It stays empty while
  the periods are made ahead; a check reports rows in it: ``W070`` for those the next turn
  moves into their periods, ``W072`` for those that ended further in the future than the
  periods are made (only raw SQL or a wrong clock writes such an end; ``'infinity'`` too),
  which stay there until the operator corrects their end.

What the workers' maintenance does (:func:`maintain`, every ``PARTITION_INTERVAL`` seconds,
one worker at a time under an advisory lock):

- **make ahead**: periods up to ``HISTORY_PREMAKE`` periods past now. The new tables are made
  on their own and then attached, which takes a SHARE UPDATE EXCLUSIVE lock on the history
  table (``CREATE TABLE … PARTITION OF`` would take an exclusive one): writes go on. The
  ``_after`` partition is detached first (``CONCURRENTLY``) and attached again after the new
  periods, with the rows that now belong to them moved out of it;
- **drop**: a period whose end is older than its table's retention (``RETENTION`` for
  ``done``, ``FAILED_RETENTION`` for ``failed``) is detached with ``DETACH PARTITION …
  CONCURRENTLY`` (no lock that blocks readers or writers of the table), then its tasks' rows
  in the workflow tables are deleted, its rows copied to the archive when ``ARCHIVE`` is on,
  and the table dropped. A day of history goes in milliseconds, with no dead rows left for
  vacuum, where deleting its rows one by one would write them all again.

So a finished task is kept at least its retention and at most one period longer.

Every step can be cut off (a killed worker, a timeout): the next turn finds a table detached
but not dropped (``<table>_p…`` that is not a partition), a detach left pending, or
``_after`` detached, and finishes the work. ``CONCURRENTLY`` cannot run inside a transaction:
called inside one (tests), the same steps use a plain ``DETACH``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import DatabaseError, connections, transaction

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE
from django_pgtasks.database.sessions import transaction_pooler
from django_pgtasks.definition import maintenance_jobs as maintenance
from django_pgtasks.lifecycle.leases import LOCK_NAMESPACE
from django_pgtasks.models.task import archive_columns

logger = logging.getLogger("django_pgtasks.retention")

#: Second key of the advisory lock that serializes partition work; spells "part".
PARTITION_LOCK_KEY = -0x70617274
#: The history tables and the statuses each holds.
HISTORY_TABLES = {DONE_TABLE: ("SUCCESSFUL", "CANCELLED"), FAILED_TABLE: ("FAILED",)}
#: Lengths a period can have (``PGTASKS["HISTORY_PERIOD"]``), as date_trunc() units.
PERIODS = ("hour", "day", "week", "month")
#: How a period's table is named after its start (UTC).
NAME_FORMATS = {"hour": "YYYYMMDDHH24", "day": "YYYYMMDD", "week": "YYYYMMDD",
                "month": "YYYYMMDD"}
#: Longest wait of a DETACH … CONCURRENTLY (or its FINALIZE) for the transactions that use
#: the table, such as a report left open; past it the detach stays pending and the next turn
#: finishes it. Its wait blocks no reader or writer, but holds up the worker's other jobs.
DETACH_TIMEOUT_MS = 1_000
#: Every other DETACH, ATTACH or DROP of partition work waits at most this long for its lock,
#: so that readers and writers queue behind it no longer than that; the next turn tries again.
LOCK_TIMEOUT_MS = 200

# -- reading the partitions ------------------------------------------------------------------

# The partitions of a history table with their bounds (NULL for MINVALUE and MAXVALUE), and
# whether a detach of theirs is pending. pg_get_expr() prints the bounds as literals of the
# session's time zone, which the casts read back.
PARTITIONS_SQL = r"""
    SELECT c.relname,
           CASE WHEN b[1] = 'MINVALUE' THEN NULL ELSE btrim(b[1], '''')::timestamptz END,
           CASE WHEN b[2] = 'MAXVALUE' THEN NULL ELSE btrim(b[2], '''')::timestamptz END,
           i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid,
    LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                         'FROM \((.*)\) TO \((.*)\)') AS b
    WHERE i.inhparent = %s::regclass
    ORDER BY 2 NULLS FIRST
"""

# Tables named like a period of the history table that are not attached: left by a turn that
# was cut off between detaching and dropping (or between making and attaching).
ORPHANS_SQL = """
    SELECT c.relname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
    WHERE c.relkind = 'r' AND NOT c.relispartition
      AND c.relname LIKE %s ESCAPE '!'
"""

# The end of the period that starts at a time (the next period boundary after it, UTC).
NEXT_BOUNDARY_SQL = """
    SELECT date_trunc(%(unit)s, %(at)s::timestamptz, 'UTC') + ('1 ' || %(unit)s)::interval,
           to_char(%(at)s::timestamptz AT TIME ZONE 'UTC', %(format)s)
"""

# How far ahead the periods must reach: now plus HISTORY_PREMAKE periods.
TARGET_SQL = "SELECT now() + %s * ('1 ' || %s)::interval, now()"

# A period's table, made on its own and attached after (see the module doc). The new table
# takes the history table's columns, defaults and CHECK constraints; attaching gives it the
# indexes and triggers.
MAKE_SQL = """
    CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                         INCLUDING STORAGE);
    ALTER TABLE {name} SET (autovacuum_vacuum_insert_scale_factor = 0.05,
                            autovacuum_analyze_scale_factor = 0.05)
"""
ATTACH_SQL = "ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM ({start}) TO ({end})"
ATTACH_AFTER_SQL = ("ALTER TABLE {parent} ATTACH PARTITION {name} "
                    "FOR VALUES FROM ({start}) TO (MAXVALUE)")
# Rows of the detached _after partition that belong to the new periods: back through the
# history table, which routes them.
MOVE_FROM_AFTER_SQL = """
    WITH moved AS (DELETE FROM {name} WHERE finished_at < %s RETURNING *)
    INSERT INTO {parent} SELECT * FROM moved
"""

# What goes with a dropped period: the count of its rows per status (for the purge's report),
# its tasks' workflow rows (the cascade trigger fires on DELETE, not on DROP), and, with
# ARCHIVE, a copy of its rows in the archive.
COUNT_SQL = "SELECT status, count(*) FROM {name} GROUP BY status"
FORGET_WORKFLOWS_SQL = """
    DELETE FROM pgtasks_dependency d USING {name} p WHERE d.child_id = p.id;
    DELETE FROM pgtasks_workflow_member m USING {name} p WHERE m.task_id = p.id
"""
ARCHIVE_SQL = """
    INSERT INTO pgtasks_task_archive ({columns}, archived_at)
    SELECT {columns}, now() FROM {name}
    ON CONFLICT (id) DO UPDATE SET {updates}, archived_at = EXCLUDED.archived_at
"""


@dataclass(frozen=True)
class Partition:
    """A partition of a history table: its table and bounds (``None``: MINVALUE/MAXVALUE)."""

    name: str
    start: datetime | None
    end: datetime | None
    detach_pending: bool = False

    @property
    def is_period(self) -> bool:
        return self.start is not None and self.end is not None


def partitions(alias: str, table: str) -> list[Partition]:
    """The partitions of history table ``table``, oldest first."""
    with connections[alias].cursor() as cursor:
        cursor.execute(PARTITIONS_SQL, [table])
        return [Partition(*row) for row in cursor.fetchall()]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(at: datetime) -> str:
    """A bound as an SQL literal (DDL takes no parameters)."""
    return f"'{at.isoformat()}'::timestamptz"


# The session's lock and statement timeouts, saved and set around a bounded statement.
SAVE_TIMEOUTS_SQL = ("SELECT current_setting('lock_timeout'), "
                     "current_setting('statement_timeout')")
SET_TIMEOUTS_SQL = ("SELECT set_config('lock_timeout', %s, false), "
                    "set_config('statement_timeout', %s, false)")


def _execute(alias: str, sql: str, params: list | None = None) -> None:
    with connections[alias].cursor() as cursor:
        for statement in (s for s in sql.split(";\n") if s.strip()):
            cursor.execute(statement, params)


def _bounded(alias: str, sql: str, timeout_ms: int) -> None:
    """Run the DDL statement ``sql`` so that it gives up on a lock after ``timeout_ms``
    instead of waiting (a lock timeout: the next turn tries again).

    Inside a transaction (a turn behind a transaction pooler, see :class:`locked`) the bound
    is local to it. Outside, it is set on the session, the statement's whole run included
    (``CONCURRENTLY`` waits for other transactions in steps of its own), and the session's
    own settings (the maintainer's) come back after."""
    if connections[alias].in_atomic_block:
        with transaction.atomic(using=alias):
            _execute(alias, f"SET LOCAL lock_timeout = {int(timeout_ms)}")
            _execute(alias, sql)
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(SAVE_TIMEOUTS_SQL)
        previous = cursor.fetchone()
        cursor.execute(SET_TIMEOUTS_SQL, [str(timeout_ms), str(timeout_ms)])
        try:
            cursor.execute(sql)
        finally:
            cursor.execute(SET_TIMEOUTS_SQL, list(previous))


def _detach(alias: str, parent: str, name: str) -> None:
    """Detach ``name`` from ``parent``: CONCURRENTLY outside a transaction, else plainly (a
    turn behind a transaction pooler runs in one transaction: see :class:`locked`)."""
    if connections[alias].in_atomic_block:
        _bounded(alias, f"ALTER TABLE {_q(parent)} DETACH PARTITION {_q(name)}",
                 LOCK_TIMEOUT_MS)
    else:
        _bounded(alias, f"ALTER TABLE {_q(parent)} DETACH PARTITION {_q(name)} CONCURRENTLY",
                 DETACH_TIMEOUT_MS)


def _finalize(alias: str, parent: str, name: str) -> None:
    """Finish the detach of ``name`` that a cut-off ``CONCURRENTLY`` left pending."""
    _bounded(alias, f"ALTER TABLE {_q(parent)} DETACH PARTITION {_q(name)} FINALIZE",
             DETACH_TIMEOUT_MS)


# -- making periods ahead --------------------------------------------------------------------


def period() -> str:
    value = pgtasks_settings.HISTORY_PERIOD
    if value not in PERIODS:
        raise ValueError(f"PGTASKS['HISTORY_PERIOD'] must be one of {', '.join(PERIODS)}, "
                         f"not {value!r}.")
    return value


def make_ahead(alias: str, table: str) -> list[str]:
    """Make the periods of ``table`` up to ``HISTORY_PREMAKE`` periods past now; return the
    new tables' names."""
    unit = period()
    with connections[alias].cursor() as cursor:
        cursor.execute(TARGET_SQL, [int(pgtasks_settings.HISTORY_PREMAKE), unit])
        target, _now = cursor.fetchone()
    parts = partitions(alias, table)
    after = next((p for p in parts if p.end is None), None)
    after_name = f"{table}_after"
    if after is not None and after.detach_pending:
        _finalize(alias, table, after_name)
        after = None
    last_end = max((p.end for p in parts if p.is_period), default=None)
    if last_end is None:
        raise RuntimeError(f"{table} has no period: is migration 0014 applied?")
    if after is not None and last_end >= target:
        return []
    # The periods to make: from the end of the last one up to the target. With none to make,
    # a turn that was cut off after detaching _after only attaches it again.
    periods: list[tuple[str, datetime, datetime]] = []
    start = last_end
    with connections[alias].cursor() as cursor:
        while start < target:
            cursor.execute(NEXT_BOUNDARY_SQL, {"unit": unit, "at": start,
                                               "format": NAME_FORMATS[unit]})
            end, label = cursor.fetchone()
            periods.append((f"{table}_p{label}", start, end))
            start = end
    for name, _start, _end in periods:
        _execute(alias, f"DROP TABLE IF EXISTS {_q(name)}")  # left by a cut-off turn: empty
        _execute(alias, MAKE_SQL.format(name=_q(name), parent=_q(table)))
    if after is not None:
        _detach(alias, table, after_name)
    new_end = periods[-1][2] if periods else last_end
    with transaction.atomic(using=alias):
        _execute(alias, f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        for name, start, end in periods:
            _execute(alias, ATTACH_SQL.format(parent=_q(table), name=_q(name),
                                              start=_literal(start), end=_literal(end)))
        _execute(alias, MOVE_FROM_AFTER_SQL.format(name=_q(after_name), parent=_q(table)),
                 [new_end])
        _execute(alias, ATTACH_AFTER_SQL.format(parent=_q(table), name=_q(after_name),
                                                start=_literal(new_end)))
    names = [name for name, _s, _e in periods]
    logger.info("History partitions made: %s.", ", ".join(names))
    return names


# -- dropping expired periods ---------------------------------------------------------------


@dataclass
class Dropped:
    """A period dropped: its table and its rows per status."""

    name: str
    counts: dict[str, int]


def _finish_drop(alias: str, name: str, archive: bool) -> Dropped:
    """Count, forget the workflow rows of, archive (with ``archive``) and drop the detached
    table ``name``, in one transaction."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        # A transaction still reading the table keeps the drop waiting: the next turn drops it.
        cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        cursor.execute(COUNT_SQL.format(name=_q(name)))
        counts = dict(cursor.fetchall())
        if counts:
            _execute(alias, FORGET_WORKFLOWS_SQL.format(name=_q(name)))
            if archive:
                columns, updates = archive_columns()
                cursor.execute(ARCHIVE_SQL.format(name=_q(name), columns=columns,
                                                  updates=updates))
        cursor.execute(f"DROP TABLE {_q(name)}")
    return Dropped(name, counts)


def drop_expired(alias: str, table: str, seconds: float | None,
                 archive: bool) -> list[Dropped]:
    """Detach and drop the periods of ``table`` that ended more than ``seconds`` ago (and
    finish any drop a cut-off turn left); ``None`` keeps them all."""
    dropped = []
    with connections[alias].cursor() as cursor:
        cursor.execute(ORPHANS_SQL, [table.replace("_", "!_") + "!_p%"])
        orphans = [row[0] for row in cursor.fetchall()]
    for name in orphans:
        dropped.append(_finish_drop(alias, name, archive))
    if seconds is None:
        return dropped
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT now() - make_interval(secs => %s)", [seconds])
        cutoff = cursor.fetchone()[0]
    for part in partitions(alias, table):
        if not part.is_period or part.end > cutoff:  # type: ignore[operator]
            continue
        if part.detach_pending:
            _finalize(alias, table, part.name)
        else:
            _detach(alias, table, part.name)
        dropped.append(_finish_drop(alias, part.name, archive))
    return dropped


# -- health ---------------------------------------------------------------------------------

# Rows in the catch partition past the periods, per history table: all of them, those the
# next maintenance turn moves (ended before the end of the periods it makes, now plus
# HISTORY_PREMAKE periods), and the latest end among the others, as text ('infinity' too).
PAST_PERIODS_SQL = """
    SELECT count(*), count(*) FILTER (WHERE finished_at < %(reach)s),
           max(finished_at)::text
    FROM {name}
"""
# The later of two such ends, compared as times and written as text again.
LATER_SQL = "SELECT greatest(%s::timestamptz, %s::timestamptz)::text"
# Whether the periods reach at least one period past now.
REACH_SQL = "SELECT %s::timestamptz < now() + ('1 ' || %s)::interval"


@dataclass
class Health:
    """What the system check reports about the history partitions of a database."""

    #: Finished tasks in the ``_after`` partitions (ended past the periods made) that the
    #: next maintenance turn moves into their periods.
    past_periods: int
    tables_past: list[str]
    #: The end of the last period made (the earliest of both tables).
    reach: datetime | None
    #: The periods reach less than one period past now.
    short: bool
    #: Finished tasks in the ``_after`` partitions that ended further in the future than the
    #: maintenance makes periods (``HISTORY_PREMAKE``): they stay there until it does.
    beyond_reach: int = 0
    tables_beyond: list[str] = field(default_factory=list)
    #: The latest end among them, as PostgreSQL writes it (``'infinity'`` included).
    latest_beyond: str | None = None


def health(alias: str) -> Health:
    past, tables, reach = 0, [], None
    beyond, tables_beyond, latest = 0, [], None
    with connections[alias].cursor() as cursor:
        cursor.execute(TARGET_SQL, [int(pgtasks_settings.HISTORY_PREMAKE), period()])
        target = cursor.fetchone()[0]
        for table in HISTORY_TABLES:
            parts = partitions(alias, table)
            after = next((p for p in parts if p.end is None), None)
            if after is not None:
                cursor.execute(PAST_PERIODS_SQL.format(name=_q(after.name)),
                               {"reach": target})
                count, movable, last = cursor.fetchone()
                if movable:
                    past += movable
                    tables.append(after.name)
                if count > movable:
                    beyond += count - movable
                    tables_beyond.append(after.name)
                    if latest is not None:
                        cursor.execute(LATER_SQL, [latest, last])
                        last = cursor.fetchone()[0]
                    latest = last
            end = max((p.end for p in parts if p.is_period), default=None)
            if end is not None and (reach is None or end < reach):
                reach = end
        short = False
        if reach is not None:
            cursor.execute(REACH_SQL, [reach, period()])
            short = bool(cursor.fetchone()[0])
    return Health(past, tables, reach, short, beyond, tables_beyond, latest)



# -- the maintenance turn ------------------------------------------------------------------


def maintain(alias: str) -> bool:
    """Make the periods ahead of both history tables; ``False`` if another worker holds the
    lock (it is doing the same). Expired periods are dropped by the purge
    (:func:`~django_pgtasks.patterns.retention.purge`)."""
    with locked(alias) as acquired:
        if not acquired:
            return False
        for table in HISTORY_TABLES:
            make_ahead(alias, table)
    return True


class locked:
    """The advisory lock of partition work; ``as`` gives whether it was acquired (always,
    with ``wait=True``).

    It is held by the session, since the work spans several transactions (``DETACH …
    CONCURRENTLY`` runs two of its own). Behind a pooler in transaction mode, or on a
    connection of a pool, a session lock would stay with a server session the worker does
    not own: there the whole turn runs in one transaction, which holds the lock, and every
    detach is a plain one in it (``LOCK_TIMEOUT_MS`` bounds its wait for the table's lock).
    """

    def __init__(self, alias: str, wait: bool = False) -> None:
        self.alias, self.wait = alias, wait
        self.acquired = False
        self.atomic: transaction.Atomic | None = None

    def __enter__(self) -> bool:
        connection = connections[self.alias]
        connection.ensure_connection()
        if transaction_pooler() or getattr(connection, "pool", None) is not None:
            self.atomic = transaction.atomic(using=self.alias)
            self.atomic.__enter__()
            fn = "pg_advisory_xact_lock" if self.wait else "pg_try_advisory_xact_lock"
        else:
            fn = "pg_advisory_lock" if self.wait else "pg_try_advisory_lock"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {fn}(%s, %s)", [LOCK_NAMESPACE, PARTITION_LOCK_KEY])
            self.acquired = self.wait or bool(cursor.fetchone()[0])
        return self.acquired

    def __exit__(self, *exc: object) -> None:
        if self.atomic is not None:
            self.atomic.__exit__(*exc)  # type: ignore[arg-type]
            return
        if not self.acquired:
            return
        connection = connections[self.alias]
        if connection.connection is None or connection.needs_rollback:
            return  # the session is gone, and its lock with it, or its transaction failed
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)",
                               [LOCK_NAMESPACE, PARTITION_LOCK_KEY])
        except DatabaseError:  # a broken session: closing it releases the lock
            connection.close_if_unusable_or_obsolete()


maintenance.register(maintenance.Job(
    name="partitions",
    interval=lambda: pgtasks_settings.PARTITION_INTERVAL,
    run=maintain,
))
