"""Is the database migrated? The answer for the worker's start and for errors of our SQL.

A database where ``manage.py migrate`` was never run (or not since django-pgtasks was
upgraded) has no task table, or one without the newest columns. Every statement of ours would
then fail with "relation … does not exist", which says nothing about the cure. Two places
turn that into :class:`~django_pgtasks.exceptions.NotMigratedError`, whose message says to
run ``migrate``:

- ``run_pgtasks`` asks :func:`missing_migrations` before it starts a worker, and exits with
  the error (status 1) instead of retrying forever;
- :func:`explain_missing_schema` wraps our statements (enqueue, claim, outcomes): a failure
  that is a missing table or column of ours becomes the error, chained to the original.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django_pgtasks.database.sqlstates import sqlstates
from django_pgtasks.exceptions import NotMigratedError

#: The task table (partitioned by state since migration 0014): what every query that reads
#: tasks of any state names, and what a task's end updates (the row moves to history).
TASK_TABLE = "pgtasks_task"
#: Its partition of waiting and running tasks: where enqueue inserts and the claim updates,
#: and where the key's unique index and the claim's indexes are.
LIVE_TABLE = "pgtasks_task_live"
#: Its history tables, each partitioned by ``finished_at``: SUCCESSFUL and CANCELLED tasks,
#: and FAILED ones (each has its own retention).
DONE_TABLE = "pgtasks_task_done"
FAILED_TABLE = "pgtasks_task_failed"
#: "The task is running", for statements that find *one* running task by its id (a step's
#: checkpoint, a progress report, an event's wait, the last-resort end), or a few (the
#: outcomes of a small batch, ``BY_ID_AT_MOST`` in lifecycle/transitions.py): the same rows as
#: ``status = 'RUNNING'``, and PostgreSQL still reads only the live partition, but it cannot
#: use the partial index of running tasks (``pgtasks_task_running_idx``), which the planner
#: may read whole instead of looking the id up in the primary key: statistics taken while few
#: tasks ran make that index look empty, and its dead entries (one per run, kept while any
#: transaction in the database is older) make the read grow with every task run meanwhile.
#: Not for statements on many tasks at once (a large batch of outcomes): for those the
#: planner may then prefer reading the whole live partition, and the running index, small as
#: long as nothing holds its dead entries, serves them best. Prefix it with a table alias as
#: needed.
RUNNING = "status BETWEEN 'RUNNING' AND 'RUNNING'"
#: The sequence of task ids (made by migration 0014, owned by the task table). Named, not
#: looked up with ``pg_get_serial_sequence()``, which a query evaluates once per row.
ID_SEQUENCE = "pgtasks_task_id_seq"

#: The folder of django-pgtasks' migrations.
MIGRATIONS_FOLDER = Path(__file__).resolve().parent.parent / "migrations"

#: SQLSTATEs of a schema object that does not exist: undefined table, column, function.
MISSING_SQLSTATES = frozenset({"42P01", "42703", "42883"})

#: The migrations of django-pgtasks recorded as applied on a database.
APPLIED_MIGRATIONS_SQL = "SELECT name FROM django_migrations WHERE app = 'django_pgtasks'"
#: Whether Django's migration table exists (the query above fails without it).
HAS_MIGRATION_TABLE_SQL = "SELECT to_regclass('django_migrations') IS NOT NULL"


def expected_migrations() -> list[str]:
    """The names of django-pgtasks' migrations, as ``django_migrations`` records them (read
    from the folder: importing the migrations would import the models)."""
    return sorted(module.name for module in pkgutil.iter_modules([str(MIGRATIONS_FOLDER)])
                  if not module.name.startswith("_"))


def missing_migrations(cursor: Any) -> list[str]:
    """The migrations of django-pgtasks not applied on the database of ``cursor`` (a DB-API
    cursor), oldest first."""
    cursor.execute(HAS_MIGRATION_TABLE_SQL)
    if not cursor.fetchone()[0]:
        return expected_migrations()
    cursor.execute(APPLIED_MIGRATIONS_SQL)
    applied = {row[0] for row in cursor.fetchall()}
    return [name for name in expected_migrations() if name not in applied]


def not_migrated(alias: str, missing: list[str] | None = None) -> NotMigratedError:
    """The error for database ``alias``, naming its ``missing`` migrations when known."""
    which = f" --database {alias}" if alias != "default" else ""
    if missing is None:
        state = "lacks the tables or columns of django-pgtasks"
    elif missing == expected_migrations():
        state = "has no django-pgtasks tables (no migration of django_pgtasks was applied)"
    else:
        state = (f"lacks {len(missing)} migration(s) of django_pgtasks "
                 f"({', '.join(missing)})")
    return NotMigratedError(
        f"The database {alias!r} {state}. Run: python manage.py migrate{which}", alias)


def is_missing_schema(exc: BaseException) -> bool:
    """Whether ``exc`` (a database error of one of our statements) is a table, column or
    function of django-pgtasks that does not exist."""
    return "pgtasks" in str(exc) and any(
        state in MISSING_SQLSTATES for state in sqlstates(exc))


@contextmanager
def explain_missing_schema(alias: str) -> Iterator[None]:
    """Turn a missing-schema error of the statements run inside into
    :class:`~django_pgtasks.exceptions.NotMigratedError` (chained to it)."""
    try:
        yield
    except NotMigratedError:
        raise
    except Exception as exc:
        if is_missing_schema(exc):
            raise not_migrated(alias) from exc
        raise
