"""EXPLAIN the claim on a large seeded task table, and time consecutive claims.

Usage (from the project root)::

    DJANGO_SETTINGS_MODULE=tests.settings .venv/bin/python bench/explain_claim.py \
        [--finished 1000000] [--pending 100000] [--waiting 100000] [--claims 1000] [--keep]

The script creates a scratch database (``--database-name``, default ``pgtasks_explain``) on
the server that ``DATABASES["default"]`` points at, migrates it, seeds finished and pending
tasks and tasks waiting for parents (``WAITING``, workflows) with ``INSERT ... SELECT
generate_series``, runs ``ANALYZE``, then:

1. captures the exact SQL that ``Task.objects.claim()`` sends, for one queue and for two
   queues, with ``limit=1`` and ``limit=50`` (each capture runs in a transaction that is
   rolled back);
2. prints ``EXPLAIN (ANALYZE, BUFFERS)`` of each statement, again inside a rolled-back
   transaction, after one unprinted warm-up run, and checks that every per-queue candidate
   query is an Index Scan on ``pgtasks_task_claim_idx`` and that no Seq Scan on
   ``pgtasks_task`` appears;
3. times ``--claims`` consecutive single-task claims (one queue, then two queues) through
   ``Task.objects.claim()``, and as a baseline the same number of transactions that update
   one row by primary key;
4. drops the scratch database, unless ``--keep`` is given.

The exit status is 1 if a plan does not have the expected shape.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLAIM_INDEX = "pgtasks_task_claim_idx"
TASK_NAME = "tests.testapp.tasks.noop"

SEED_FINISHED = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    locked_by, started_at, finished_at, error_text, metadata, created_at, updated_at
)
SELECT %(name)s,
       (ARRAY['default', 'emails', 'urgent', 'reports'])[1 + i %% 4],
       '[]', '{}', 100,
       CASE WHEN i %% 10 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END,
       CASE WHEN i %% 10 = 0 THEN 3 ELSE 1 END, 3,
       t.created, 'bench-host:1:000000', t.created + interval '1 second',
       t.created + interval '2 seconds',
       CASE WHEN i %% 10 = 0 THEN 'ConnectionError: upstream refused' ELSE '' END,
       '{}', t.created, t.created + interval '2 seconds'
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() - interval '30 days' * (i::float8 / %(rows)s)) AS t(created)
"""

# Pending rows: READY in "default" and "emails" with a spread of priorities; every 10th row is
# scheduled an hour ahead (not due), every 7th is AWAITING_RETRY (most due, some not yet).
SEED_PENDING = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    error_text, metadata, created_at, updated_at
)
SELECT %(name)s,
       (ARRAY['default', 'emails'])[1 + i %% 2],
       '[]', '{}',
       (ARRAY[50, 100, 100, 100, 150])[1 + i %% 5],
       CASE WHEN i %% 7 = 0 THEN 'AWAITING_RETRY' ELSE 'READY' END,
       CASE WHEN i %% 7 = 0 THEN 1 ELSE 0 END, 3,
       CASE WHEN i %% 10 = 0 THEN now() + interval '1 hour'
            ELSE now() - interval '1 second' * (%(rows)s - i) END,
       CASE WHEN i %% 7 = 0 THEN 'TimeoutError: upstream timed out' ELSE '' END,
       '{}', now() - interval '1 second' * (%(rows)s - i), now()
FROM generate_series(1, %(rows)s) AS i
"""

# Tasks of workflows waiting for their parents: outside the claim index's range, whatever
# their priority and run_after.
SEED_WAITING = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    error_text, metadata, created_at, updated_at
)
SELECT %(name)s, (ARRAY['default', 'emails'])[1 + i %% 2], '[]', '{}', 200, 'WAITING', 0, 3,
       now() - interval '1 day', '', '{}', now(), now()
FROM generate_series(1, %(rows)s) AS i
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000,
                        help="Finished rows (SUCCESSFUL/FAILED) to seed (default: 1000000).")
    parser.add_argument("--pending", type=int, default=100_000,
                        help="Pending rows (READY/AWAITING_RETRY) to seed (default: 100000).")
    parser.add_argument("--waiting", type=int, default=100_000,
                        help="Tasks waiting for parents (WAITING) to seed (default: 100000).")
    parser.add_argument("--claims", type=int, default=1000,
                        help="Consecutive single-task claims to time (default: 1000).")
    parser.add_argument("--database-name", default="pgtasks_explain",
                        help="Scratch database to create and drop (default: pgtasks_explain).")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the scratch database at the end (default: drop it).")
    return parser.parse_args()


def admin_connection(db_settings: dict):
    """An autocommit connection to the server's ``postgres`` database (for CREATE/DROP)."""
    import psycopg

    return psycopg.connect(
        dbname="postgres",
        host=db_settings.get("HOST") or None,
        port=db_settings.get("PORT") or None,
        user=db_settings.get("USER") or None,
        password=db_settings.get("PASSWORD") or None,
        autocommit=True,
    )


def recreate_database(db_settings: dict, name: str) -> None:
    with admin_connection(db_settings) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(db_settings: dict, name: str) -> None:
    with admin_connection(db_settings) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed(finished: int, pending: int, waiting: int = 0) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        started = time.perf_counter()
        if finished:
            cursor.execute(SEED_FINISHED, {"name": TASK_NAME, "rows": finished})
        if pending:
            cursor.execute(SEED_PENDING, {"name": TASK_NAME, "rows": pending})
        if waiting:
            cursor.execute(SEED_WAITING, {"name": TASK_NAME, "rows": waiting})
        seeded = time.perf_counter() - started
        cursor.execute("ANALYZE pgtasks_task")
    print(f"Seeded {finished:,} finished + {pending:,} pending + {waiting:,} waiting rows in "
          f"{seeded:.1f}s; ANALYZE done.")


def describe_table() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, status, (run_after <= now()) AS due, count(*) FROM pgtasks_task "
            "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        )
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT pg_size_pretty(pg_relation_size('pgtasks_task')), "
            "pg_size_pretty(pg_relation_size(%s))",
            [CLAIM_INDEX],
        )
        table_size, index_size = cursor.fetchone()
    print("\nRows by queue, status and due-ness:")
    print(f"  {'queue':<10} {'status':<16} {'due':<5} {'rows':>10}")
    for queue, status, due, count in rows:
        print(f"  {queue:<10} {status:<16} {'yes' if due else 'no':<5} {count:>10,}")
    print(f"Table heap: {table_size}; {CLAIM_INDEX}: {index_size}.")


def captured_claim_sql(queues: list[str], limit: int) -> tuple[str, list]:
    """The exact statement ``Task.objects.claim()`` sends and its parameters, from a
    rolled-back claim (caught by an execute wrapper: the claim binds its parameters on the
    server, so the query log shows ``$1`` placeholders, not values)."""
    from django.db import connection, transaction

    from django_pgtasks.models import Task

    captured: list[tuple[str, list]] = []

    def capture(execute, sql, params, many, context):
        captured.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(capture):
        Task.objects.claim("bench-worker", queues=queues, limit=limit)
        transaction.set_rollback(True)
    [claim] = [(sql, params) for sql, params in captured if sql.lstrip().startswith("WITH ")]
    return claim


def explain_analyze(claim: tuple[str, list]) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the claim; the UPDATE it executes is rolled back."""
    from django.db import transaction

    from django_pgtasks.lifecycle.row_loading import fast_cursor

    sql, params = claim
    with transaction.atomic(), fast_cursor("default") as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def check_plan(plan: str, queues: list[str]) -> list[str]:
    problems = []
    scans = plan.count(f"Index Scan using {CLAIM_INDEX}")
    if scans != len(queues):
        problems.append(f"expected {len(queues)} Index Scan(s) on {CLAIM_INDEX}, found {scans}")
    if "Seq Scan on pgtasks_task" in plan:
        problems.append("a Seq Scan on pgtasks_task appears")
    if "Bitmap Heap Scan on pgtasks_task" in plan:
        problems.append("a Bitmap Heap Scan on pgtasks_task appears")
    return problems


def time_claims(queues: list[str], count: int) -> None:
    from django_pgtasks.models import Task

    durations = []
    claimed = 0
    for _ in range(count):
        started = time.perf_counter()
        tasks = Task.objects.claim("bench-worker", queues=queues, limit=1)
        durations.append((time.perf_counter() - started) * 1000)
        claimed += len(tasks)
    durations.sort()

    def pct(p: float) -> float:
        return durations[min(len(durations) - 1, round(p * (len(durations) - 1)))]

    print(
        f"{count} consecutive claims, queues={','.join(queues)}, limit=1: "
        f"{claimed} tasks claimed, total {sum(durations):.0f} ms, "
        f"mean {statistics.mean(durations):.2f} ms, p50 {pct(0.5):.2f} ms, "
        f"p95 {pct(0.95):.2f} ms, p99 {pct(0.99):.2f} ms, max {durations[-1]:.2f} ms "
        f"(each: BEGIN, the claim statement, COMMIT, measured in Python)"
    )


def time_baseline(count: int) -> None:
    """The same transaction shape with a trivial write: BEGIN, a one-row UPDATE, COMMIT.

    It shows how much of a claim's latency is the round trips and the commit's WAL flush
    rather than finding and locking the task.
    """
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id) FROM pgtasks_task")
        (row_id,) = cursor.fetchone()
    durations = []
    for _ in range(count):
        started = time.perf_counter()
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute("UPDATE pgtasks_task SET updated_at = now() WHERE id = %s", [row_id])
        durations.append((time.perf_counter() - started) * 1000)
    durations.sort()
    print(
        f"Baseline, {count} transactions of one single-row UPDATE by primary key: "
        f"mean {statistics.mean(durations):.2f} ms, p50 {durations[len(durations) // 2]:.2f} ms"
    )


def main() -> int:
    args = parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

    from django.conf import settings

    db_settings = settings.DATABASES["default"]
    original_name = db_settings["NAME"]
    recreate_database(db_settings, args.database_name)
    db_settings["NAME"] = args.database_name
    failures: list[str] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, connections

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            (version,) = cursor.fetchone()
        print(f"Server: {version}")
        print(f"Client: {platform.node()} with {os.cpu_count()} CPU(s), "
              f"Python {platform.python_version()}")
        print(f"Scratch database: {args.database_name} (settings named {original_name!r})")

        seed(args.finished, args.pending, args.waiting)
        describe_table()

        for queues in (["default"], ["default", "emails"]):
            for limit in (1, 50):
                claim = captured_claim_sql(queues, limit)
                explain_analyze(claim)  # warm-up, not printed
                plan = explain_analyze(claim)
                title = f"queues={','.join(queues)} limit={limit}"
                print(f"\n=== Claim statement, {title} ===\n{claim[0]}\nparameters: {claim[1]}")
                print(f"\n=== EXPLAIN (ANALYZE, BUFFERS), {title} ===\n{plan}")
                problems = check_plan(plan, queues)
                failures.extend(f"{title}: {p}" for p in problems)
                print("Plan check:", "; ".join(problems) if problems else
                      f"OK ({len(queues)} Index Scan(s) on {CLAIM_INDEX}, no Seq Scan)")

        print()
        time_claims(["default"], args.claims)
        time_claims(["default", "emails"], args.claims)
        time_baseline(args.claims)

        # The claimed rows left dead entries at the front of the index range until vacuum.
        claim = captured_claim_sql(["default"], 1)
        plan = explain_analyze(claim)
        print(f"\n=== EXPLAIN (ANALYZE, BUFFERS) after the timed claims, before VACUUM, "
              f"queues=default limit=1 ===\n{plan}")
        failures.extend(f"after claims: {p}" for p in check_plan(plan, ["default"]))
        with connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE) pgtasks_task")
        plan = explain_analyze(claim)
        print(f"\n=== The same after VACUUM (ANALYZE) ===\n{plan}")
        failures.extend(f"after vacuum: {p}" for p in check_plan(plan, ["default"]))
        connections.close_all()
    finally:
        if args.keep:
            print(f"\nKept database {args.database_name!r}.")
        else:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:  # Django may not be set up if migrate failed early.
                pass
            drop_database(db_settings, args.database_name)
            print(f"\nDropped database {args.database_name!r}.")

    if failures:
        print("\nPLAN CHECK FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nAll plans use the claim index and no Seq Scan on pgtasks_task.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
