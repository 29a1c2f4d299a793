"""The drain scenarios: how the queue is filled, and the database prepared, for a drain.

- ``backlog``: the queue is emptied, N tasks are seeded in one statement, the queue's table is
  analyzed (``System.analyze``), and only then are the workers started. Workers start working
  as soon as they connect; the rate comes from the database's timestamps (first start to last
  finish) and the worker CPU from the moment they are ready, per task finished after it.
- ``snapshot``: as ``backlog``, plus a separate session that, before the workers start, runs
  ``BEGIN ISOLATION LEVEL REPEATABLE READ`` and a ``SELECT`` on the queue's table (which takes
  its snapshot) and stays idle in that transaction until the drain has ended: the dead rows
  and index entries that the drain leaves behind cannot be cleaned up meanwhile.
- ``burst``: warm workers are started on an empty queue, then N tasks are inserted at once,
  and nothing is analyzed: the planner has no statistics of the queue's table. (TRUNCATE keeps
  a table's column statistics, so those an earlier scenario's ANALYZE gathered are deleted
  first: ``System.forget_statistics``.)

Every (scenario, size) pair is a *combination*, keyed ``"<scenario> <size>"`` in the results.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from common import connect
from harness import log
from systems import System

#: The scenarios whose queue is filled before the workers start.
PREFILLED = ("backlog", "snapshot")
_warned = False  # about statistics that could not be forgotten


def combination_key(scenario: str, tasks: int) -> str:
    return f"{scenario} {tasks}"


def split_combination(key: str) -> tuple[str, int]:
    """``"backlog 20000"`` -> ``("backlog", 20000)``."""
    scenario, _, tasks = key.rpartition(" ")
    return scenario, int(tasks)


def combination_label(key: str) -> str:
    """``"backlog 20000"`` -> ``"backlog 20,000"``; anything else as is."""
    try:
        scenario, tasks = split_combination(key)
    except ValueError:
        return key
    return f"{scenario} {tasks:,}"


def prepare(system: System, conn, n: int, scenario: str) -> None:
    """Empty the system's queue; for a prefilled scenario, seed ``n`` tasks and analyze the
    queue's table(s). The burst scenario seeds nothing here (its caller inserts the tasks once
    the workers are warm) and forgets the statistics of an earlier ANALYZE."""
    global _warned
    system.reset(conn)
    if scenario in PREFILLED:
        system.seed(conn, n)
        system.analyze(conn)
    elif not system.forget_statistics(conn) and not _warned:
        log("  (not a superuser: burst drains keep the statistics of earlier ANALYZEs)")
        _warned = True


@contextmanager
def held_snapshot(system: System, scenario: str, dbname: str) -> Iterator[None]:
    """In the snapshot scenario, a REPEATABLE READ transaction that has taken its snapshot
    (a SELECT on the queue's table) and stays open, idle, for the block; rolled back at its
    end. Raises if the transaction did not last (a server's idle_in_transaction timeout)."""
    if scenario != "snapshot":
        yield
        return
    conn = connect(dbname)
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SELECT count(*) FROM {system.queue_tables[0]}").fetchone()
        yield
        conn.execute("SELECT 1")  # fails if the server ended the transaction meanwhile
        conn.execute("ROLLBACK")
    finally:
        conn.close()
