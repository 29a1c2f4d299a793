"""Server-side cost of the task table's row triggers on the hot statements, in isolation.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/triggers_overhead.py            # ROUNDS=150 for more runs

It creates a scratch database (``pgtasks_bench_triggers``, on localhost as postgres, or the
server the ``PG*`` variables name), migrates it, then times two statements on 500 rows: a
claim-shaped UPDATE (READY -> RUNNING) and the worker's batched completion UPDATE
(``transitions.SUCCEED_SQL``, RUNNING -> SUCCESSFUL), in alternating runs with the triggers
enabled and disabled: ``pgtasks_task_notify_cancel`` and ``pgtasks_task_notify_finished``
(migration 0007) and ``pgtasks_task_parent_changed`` (0013, workflows), or those named in
``TRIGGERS`` (comma-separated). Nobody waits for these tasks and none has dependents, which
is the case the triggers must not slow down. Prints min and median per variant; the
database is dropped at the end.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "pgtasks_bench_triggers"
BATCH = 500
ROUNDS = int(os.environ.get("ROUNDS", "40"))
TRIGGERS = tuple(os.environ.get("TRIGGERS", "pgtasks_task_notify_cancel,"
                                "pgtasks_task_notify_finished,pgtasks_task_parent_changed")
                 .split(","))
CLAIM_SQL = (
    "UPDATE pgtasks_task SET status = 'RUNNING', locked_by = 'w', locked_at = now(), "
    "started_at = now(), attempt = attempt + 1, "
    "worker_ids = worker_ids || jsonb_build_array('w'::text), claims = claims + 1 "
    "WHERE id = ANY(%s) AND status IN ('READY', 'AWAITING_RETRY') RETURNING claims"
)


def server(dbname: str) -> psycopg.Connection:
    return psycopg.connect(host=os.environ.get("PGHOST", "localhost"),
                           user=os.environ.get("PGUSER", "postgres"), dbname=dbname,
                           autocommit=True)


def migrate() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    import tests.settings as test_settings

    test_settings.DATABASES["default"]["NAME"] = DATABASE
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    connection.close()


def main() -> None:
    with server("postgres") as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    try:
        migrate()
        from django_pgtasks.lifecycle.transitions import SUCCEED_SQL

        with server(DATABASE) as conn:
            conn.execute(
                "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, max_attempts, "
                "status, attempt, error_text, metadata) SELECT 'x', 'default', '[]', '{}', 100, "
                "3, 'READY', 0, '', '{}' FROM generate_series(1, %s)", [BATCH])
            ids = [row[0] for row in conn.execute("SELECT id FROM pgtasks_task").fetchall()]
            times: dict[tuple[str, bool], list[float]] = {
                (what, on): [] for what in ("claim", "completion") for on in (True, False)}
            for run in range(ROUNDS):
                for on in (True, False) if run % 2 else (False, True):
                    for trigger in TRIGGERS:
                        conn.execute(f"ALTER TABLE pgtasks_task "
                                     f"{'ENABLE' if on else 'DISABLE'} TRIGGER {trigger}")
                    conn.execute("UPDATE pgtasks_task SET status = 'READY', locked_by = NULL, "
                                 "locked_at = NULL, result = NULL, attempt = 0")
                    conn.execute("VACUUM pgtasks_task")
                    start = time.perf_counter()
                    claims = [c for (c,) in conn.execute(CLAIM_SQL, [ids]).fetchall()]
                    times[("claim", on)].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    done = conn.execute(SUCCEED_SQL.replace("%b", "%s"), [
                        ids, ["w"] * BATCH, claims, [None] * BATCH]).fetchall()
                    times[("completion", on)].append(time.perf_counter() - start)
                    assert len(done) == BATCH
        for (what, on), values in times.items():
            print(f"{what} of {BATCH} rows, triggers {'on ' if on else 'off'}: "
                  f"min {min(values) * 1000:.2f} ms, "
                  f"median {statistics.median(values) * 1000:.2f} ms ({ROUNDS} runs)")
    finally:
        with server("postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")


if __name__ == "__main__":
    main()
