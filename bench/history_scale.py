"""What a large history costs the live work: one database without history, then with it.

Usage (from the project root)::

    .venv/bin/python bench/history_scale.py [--history 10000000] [--waiting 100000]
        [--claims 300] [--enqueues 2000] [--many 1000] [--many-repeat 10] [--repeat 5]
        [--database-name pgtasks_hist_bench] [--output bench/results/history_scale.md] [--keep]

Since migration 0014 the task table is partitioned: ``pgtasks_task_live`` holds the waiting
and running tasks, ``pgtasks_task_done`` / ``pgtasks_task_failed`` the history, each
partitioned by ``finished_at`` into daily periods (django_pgtasks.patterns.partitions). This
script shows what that buys, on one scratch database (created on the server that
``DATABASES["default"]`` of ``tests.settings`` points at, migrated, and dropped at the end
unless ``--keep``):

- set-up: the migration makes periods from the current day (UTC) on; the ``_before``
  partition of both history tables is split so that each of the last 30 days is a period of
  its own too (``_before`` detached, the day tables made and attached as
  ``partitions.MAKE_SQL`` / ``ATTACH_SQL`` do, ``_before`` attached again below them). Then
  ``--waiting`` waiting tasks (bench/admin_render.py's seed: due, scheduled and awaiting a
  retry, queues default and emails), 200 running tasks and two workers;
- state **A**, no history, and state **B**, ``--history`` finished tasks (ids 1..N, below the
  live tasks', as if they had run before) spread evenly from the start of the day 30 days
  ago (UTC) to now: 90 % SUCCESSFUL, 8 % FAILED with five error messages (numbers and ids in
  them, so they group), 2 % CANCELLED. They are inserted with ``INSERT … SELECT
  generate_series`` in chunks of ``--chunk`` rows straight into the two history tables, then
  ``VACUUM (ANALYZE)``. In each state, after a ``VACUUM (ANALYZE)``:

  1. **claim**: ``Task.objects.claim("bench-host:1:worker", limit=1)`` and ``limit=50`` (all
     configured queues), ``--claims`` times each after 10 warm-ups, each in its own
     transaction as a worker makes it; every claim's tasks are then given back
     (``Task.objects.unclaim``, untimed) so the backlog stays the same. The statement that
     ``claim()`` sends is also run ``--explains`` times under ``EXPLAIN (ANALYZE, BUFFERS)``,
     each rolled back: the median of the server's execution times, and the last plan, printed
     with a check that it reads no history table;
  2. **enqueue**: ``Task.objects.enqueue(noop)`` (``tests.testapp.tasks.noop``), ``--enqueues``
     calls, each its own transaction; ``Task.objects.enqueue_many`` of ``--many`` built tasks,
     ``--many-repeat`` times. The tasks enqueued are deleted afterwards;
  3. **admin**: the dashboard and the task list (no filter, status = Failed, an error group
     over the dashboard's window and over all time), rendered with Django's test client as a
     superuser: one warm-up and ``--repeat`` timed renders each, median and slowest time,
     median SQL time, queries, slowest query (as bench/admin_render.py does);

- **retention** (state B only): the oldest period of ``pgtasks_task_done`` (a whole day, about
  N/30 rows) goes with ``purge(older_than=…, exact=False)`` (``DETACH PARTITION …
  CONCURRENTLY``, count, forget workflow rows, DROP), against retention's batched ``DELETE``
  (its ``DELETE_SQL``, 1,000 rows a batch, each batch its own transaction) of the same rows
  from a plain table copy of that day (``CREATE TABLE … AS SELECT``, primary key, the
  finished-time partial index and the cascade trigger of the old plain task table), and the
  ``VACUUM`` that the deleted rows then need. The plain copy holds only that day, so its
  indexes are far smaller than those of a pre-0014 table holding the whole history: its
  DELETE time is a lower bound.

It prints, and writes as Markdown to ``--output``, a table of state A, state B and B/A, the
retention comparison, the machine (CPUs, load, PostgreSQL version) and the two claims' plans.
Nothing is asserted. The machine's load matters: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from admin_render import NAMES, SEED_RUNNING, SEED_WAITING, time_page  # noqa: E402
from common import drop_database, machine_description, percentile, recreate_database  # noqa: E402

DEFAULT_OUTPUT = BENCH / "results" / "history_scale.md"
WORKER_ID = "bench-host:1:worker"
PLAIN_TABLE = "bench_plain_day"  # not named like a period (the purge would take it for one)
HISTORY_DAYS = 30
#: An error group of the seeded failures (the first line of the fifth message, which has no
#: number to blank out), known before any failure exists so that state A renders the same URL.
ERROR_GROUP = "SMTPServerDisconnected: Connection unexpectedly closed"

# Finished tasks number 1..N, ids = i: finished_at grows evenly with i from %(start)s to
# %(end)s; the same statuses, names and errors as bench/admin_render.py's finished tasks,
# except that the error is picked by i / 25 (by i % 5 every failure, i % 25 in (3, 11), would
# get one of two messages only). One statement per history table and chunk; {where} picks
# the table's statuses.
SEED_HISTORY = """
INSERT INTO {table} (
    id, name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    locked_by, started_at, finished_at, error_text, metadata, created_at, updated_at
)
SELECT i, (%(names)s::text[])[1 + i %% 20],
       (ARRAY['default', 'emails', 'urgent', 'reports'])[1 + i %% 4],
       json_build_array(i, 'order-' || i)::jsonb, '{{"notify": true}}', 100,
       CASE WHEN i %% 50 = 7 THEN 'CANCELLED'
            WHEN i %% 25 IN (3, 11) THEN 'FAILED' ELSE 'SUCCESSFUL' END,
       CASE WHEN i %% 25 IN (3, 11) THEN 3 ELSE 1 END, 3,
       t.finished - interval '1 second' - (i %% 30) * interval '100 milliseconds',
       'bench-host:' || (i %% 8) || ':worker',
       t.finished - (i %% 30) * interval '100 milliseconds',
       t.finished,
       CASE WHEN i %% 25 IN (3, 11) THEN
           (ARRAY['LookupError: order ' || i || ' not found',
                  'ConnectionError: upstream 10.0.' || (i %% 7) || '.' || (i %% 250)
                      || ':5432 refused the connection',
                  'TimeoutError: request ' || md5(i::text) || ' took more than 30 s',
                  'ValueError: invalid literal for int() with base 10: ''x' || i || '''',
                  'SMTPServerDisconnected: Connection unexpectedly closed'])[1 + i / 25 %% 5]
           || E'\\n\\nTraceback (most recent call last):\\n'
           || repeat(E'  File "/srv/shop/tasks.py", line 118, in run\\n    do_it()\\n', 6)
       ELSE '' END,
       '{{}}',
       t.finished - interval '1 second' - (i %% 30) * interval '100 milliseconds',
       t.finished
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i,
     LATERAL (SELECT %(start)s::timestamptz
                     + (%(end)s::timestamptz - %(start)s::timestamptz)
                       * ((i - 1)::float8 / %(rows)s)) AS t(finished)
WHERE {where}
"""
FAILED_ROWS = "i %% 25 IN (3, 11)"  # (the cancelled rows, i % 50 = 7, are never these)


# -- helpers ---------------------------------------------------------------------------------


def log(message: str) -> None:
    print(message, flush=True)


def sql_one(sql: str, params: list | dict | None = None):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def sql_do(sql: str, params: list | dict | None = None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def ms(seconds: float) -> float:
    return seconds * 1000


def stats(durations: list[float]) -> dict[str, float]:
    return {"median": statistics.median(durations), "p95": percentile(durations, 95),
            "max": max(durations), "n": len(durations)}


def vacuum_live() -> None:
    sql_do("VACUUM (ANALYZE) pgtasks_task_live")


# -- set-up ----------------------------------------------------------------------------------


def split_before(days: int) -> tuple[datetime, list[str]]:
    """Make each of the last ``days`` days a period of both history tables, cut from their
    ``_before`` partitions (empty yet). Return the first new period's start and its tables."""
    from django.db import transaction

    from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE
    from django_pgtasks.patterns import partitions as p

    made = []
    oldest = None
    with transaction.atomic():
        for table in (DONE_TABLE, FAILED_TABLE):
            first = min(x.start for x in p.partitions("default", table) if x.is_period)
            oldest = first - timedelta(days=days)
            before = f"{table}_before"
            p._execute("default", f"ALTER TABLE {p._q(table)} DETACH PARTITION {p._q(before)}")
            for k in range(days, 0, -1):
                start, end = first - timedelta(days=k), first - timedelta(days=k - 1)
                name = f"{table}_p{start.astimezone(UTC):%Y%m%d}"
                p._execute("default", p.MAKE_SQL.format(name=p._q(name), parent=p._q(table)))
                p._execute("default", p.ATTACH_SQL.format(
                    parent=p._q(table), name=p._q(name), start=p._literal(start),
                    end=p._literal(end)))
                made.append(name)
            p._execute("default", f"ALTER TABLE {p._q(table)} ATTACH PARTITION {p._q(before)} "
                                  f"FOR VALUES FROM (MINVALUE) TO ({p._literal(oldest)})")
    return oldest, made


def seed_live(history: int, waiting: int) -> None:
    """The waiting backlog (ids above the history's), 200 running tasks and two workers."""
    from django.db import connection

    from django_pgtasks.models import WorkerProcess

    started = time.perf_counter()
    sql_do("SELECT setval('pgtasks_task_id_seq', %s)", [max(history, 1)])
    with connection.cursor() as cursor:
        cursor.execute(SEED_WAITING, {"names": NAMES, "rows": waiting})
        cursor.execute(SEED_RUNNING, {"names": NAMES})
    for n in range(2):
        WorkerProcess.objects.create(name=f"bench-host:{n}:worker", hostname="bench-host",
                                     pid=1000 + n, concurrency=100, queues=["default"])
    log(f"Seeded {waiting:,} waiting and 200 running tasks in "
        f"{time.perf_counter() - started:.1f}s")


def seed_history(rows: int, start: datetime, chunk: int) -> dict[str, float]:
    """``rows`` finished tasks from ``start`` to now, in chunks, then VACUUM (ANALYZE)."""
    from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE

    (end,) = sql_one("SELECT now()")
    began = time.perf_counter()
    done_sql = SEED_HISTORY.format(table=DONE_TABLE, where=f"NOT ({FAILED_ROWS})")
    failed_sql = SEED_HISTORY.format(table=FAILED_TABLE, where=FAILED_ROWS)
    log(f"Seeding {rows:,} finished tasks from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} "
        f"UTC in chunks of {chunk:,}")
    for lo in range(1, rows + 1, chunk):
        hi = min(rows, lo + chunk - 1)
        t0 = time.perf_counter()
        params = {"names": NAMES, "lo": lo, "hi": hi, "rows": rows, "start": start, "end": end}
        sql_do(done_sql, params)
        sql_do(failed_sql, params)
        took = time.perf_counter() - t0
        log(f"  rows {lo:>11,} … {hi:>11,}: {took:6.1f}s ({(hi - lo + 1) / took:,.0f} rows/s), "
            f"{time.perf_counter() - began:7.1f}s in all")
    seeded = time.perf_counter() - began
    t0 = time.perf_counter()
    sql_do("VACUUM (ANALYZE) pgtasks_task")
    vacuumed = time.perf_counter() - t0
    log(f"Seeded in {seeded:.1f}s, VACUUM (ANALYZE) in {vacuumed:.1f}s")
    return {"seed_s": seeded, "vacuum_s": vacuumed}


def describe() -> dict[str, object]:
    """Rows per status and table sizes (with indexes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM pgtasks_task GROUP BY 1 ORDER BY 1")
        counts = dict(cursor.fetchall())
        sizes = {}
        for table in ("pgtasks_task_live", "pgtasks_task_done", "pgtasks_task_failed"):
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) "
                "FROM pg_partition_tree(%s::regclass)", [table])
            sizes[table] = int(cursor.fetchone()[0])
    return {"counts": counts, "sizes": sizes}


def fmt_size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- 1. claims -------------------------------------------------------------------------------


def captured_claim(limit: int) -> tuple[str, list]:
    """The claim statement ``Task.objects.claim()`` sends, from a rolled-back claim."""
    from django.db import connection, transaction

    from django_pgtasks.models import Task

    captured: list[tuple[str, list]] = []

    def capture(execute, sql, params, many, context):
        captured.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(capture):
        Task.objects.claim(WORKER_ID, limit=limit)
        transaction.set_rollback(True)
    [claim] = [(s, p) for s, p in captured if s.lstrip().startswith("WITH ")]
    return claim


def explain_claim(limit: int, runs: int) -> tuple[str, float]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of a claim of ``limit``, each run rolled back: the plan
    of the last run, and the median of the server's execution times of ``runs`` runs (ms)
    after one warm-up."""
    from django.db import transaction

    from django_pgtasks.lifecycle.row_loading import fast_cursor

    sql, params = captured_claim(limit)
    times = []
    for _ in range(1 + runs):
        with transaction.atomic(), fast_cursor("default") as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            transaction.set_rollback(True)
        found = re.search(r"Execution Time: ([0-9.]+) ms", plan)
        times.append(float(found.group(1)) if found else float("nan"))
    return plan, statistics.median(times[1:])


def time_claims(limit: int, count: int) -> dict[str, float]:
    from django_pgtasks.models import Task

    durations = []
    for n in range(10 + count):
        started = time.perf_counter()
        tasks = Task.objects.claim(WORKER_ID, limit=limit)
        took = time.perf_counter() - started
        if len(tasks) != limit:
            raise RuntimeError(f"claim(limit={limit}) took {len(tasks)} tasks")
        Task.objects.unclaim(tasks)
        if n >= 10:
            durations.append(took)
    return stats(durations)


# -- 2. enqueues -----------------------------------------------------------------------------


def time_enqueues(count: int, many: int, many_repeat: int) -> dict[str, dict[str, float]]:
    from django_pgtasks.models import Task
    from tests.testapp.tasks import noop

    (first_id,) = sql_one("SELECT max(id) FROM pgtasks_task_live")
    for _ in range(20):  # warm-up
        Task.objects.enqueue(noop)
    one = []
    for _ in range(count):
        started = time.perf_counter()
        Task.objects.enqueue(noop)
        one.append(time.perf_counter() - started)
    batches = []
    for _ in range(1 + many_repeat):
        built = [Task.objects.build(noop) for _ in range(many)]
        started = time.perf_counter()
        Task.objects.enqueue_many(built)
        batches.append(time.perf_counter() - started)
    batches = batches[1:]  # the first was a warm-up
    sql_do("DELETE FROM pgtasks_task_live WHERE id > %s", [first_id])
    vacuum_live()
    return {"one": stats(one), "many": stats(batches)}


# -- 3. admin pages --------------------------------------------------------------------------


def admin_pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_pgtasks.monitoring.dashboard import database_snapshot

    changelist = reverse("admin:django_pgtasks_task_changelist")
    dashboard = reverse("admin:django_pgtasks_task_dashboard")
    since = database_snapshot().since
    group = {"status__exact": "FAILED", "error_group": ERROR_GROUP}
    return [
        ("dashboard, last 24 h", dashboard),
        ("task list, no filter", changelist),
        ("task list, status = Failed", f"{changelist}?status__exact=FAILED"),
        ("task list, error group, last 24 h",
         f"{changelist}?{urlencode({**group, 'finished_at__gte': since.isoformat()})}"),
        ("task list, error group, all time", f"{changelist}?{urlencode(group)}"),
    ]


def time_pages(client, repeat: int) -> dict[str, dict[str, object]]:
    results = {}
    for title, url in admin_pages():
        timings, sql_times, captured = time_page(client, title, url, repeat)
        slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
        results[title] = {
            "median": statistics.median(timings), "max": max(timings),
            "sql": statistics.median(sql_times), "queries": len(captured.captured_queries),
            "slowest": float(slowest["time"]), "slowest_sql": " ".join(slowest["sql"].split()),
        }
        r = results[title]
        log(f"  {title:<36} {ms(r['median']):7.0f}ms (slowest {ms(r['max']):.0f}ms), "
            f"SQL {ms(r['sql']):.0f}ms in {r['queries']} queries, slowest query "
            f"{ms(r['slowest']):.0f}ms: {r['slowest_sql'][:70]}")
    return results


# -- a state ---------------------------------------------------------------------------------


def measure(state: str, args: argparse.Namespace, client) -> dict[str, object]:
    log(f"\n== State {state}: measuring")
    vacuum_live()
    result: dict[str, object] = {}
    log("Admin pages:")
    result["pages"] = time_pages(client, args.repeat)
    plans = {}
    for limit in (1, 50):
        plan, execution = explain_claim(limit, args.explains)
        history = [t for t in ("pgtasks_task_done", "pgtasks_task_failed") if t in plan]
        plans[limit] = {"plan": plan, "execution_ms": execution, "history": history}
        log(f"\nEXPLAIN (ANALYZE, BUFFERS) of a claim of {limit}, state {state}:\n{plan}")
        log(f"-> reads a history table: {', '.join(history) if history else 'no'}; server "
            f"execution time, median of {args.explains} runs: {execution:.3f}ms")
    result["plans"] = plans
    vacuum_live()
    claims = {}
    for limit in (1, 50):
        claims[limit] = time_claims(limit, args.claims)
        c = claims[limit]
        log(f"claim(limit={limit}) x{c['n']}: median {ms(c['median']):.2f}ms, "
            f"p95 {ms(c['p95']):.2f}ms, max {ms(c['max']):.2f}ms")
    result["claims"] = claims
    vacuum_live()
    enq = time_enqueues(args.enqueues, args.many, args.many_repeat)
    log(f"enqueue x{enq['one']['n']}: median {enq['one']['median'] * 1e6:.0f}µs, "
        f"p95 {enq['one']['p95'] * 1e6:.0f}µs; enqueue_many({args.many}) x{enq['many']['n']}: "
        f"median {ms(enq['many']['median']):.1f}ms "
        f"({enq['many']['median'] / args.many * 1e6:.1f}µs a task)")
    result["enqueue"] = enq
    result["describe"] = describe()
    return result


# -- 4. retention ----------------------------------------------------------------------------


def retention(first_day: datetime) -> dict[str, object]:
    """Drop the oldest period of the done table (a whole day) with the purge, and delete the
    same rows from a plain copy in retention's batches."""
    from django.db import connection

    from django_pgtasks.database.schema import DONE_TABLE, TASK_TABLE
    from django_pgtasks.patterns import partitions
    from django_pgtasks.patterns import retention as r

    log("\n== Retention: one day of pgtasks_task_done")
    oldest = min((p for p in partitions.partitions("default", DONE_TABLE) if p.is_period),
                 key=lambda p: p.start)
    assert oldest.start == first_day, (oldest, first_day)
    (rows,) = sql_one(f"SELECT count(*) FROM {oldest.name}")
    log(f"Period {oldest.name}: {oldest.start:%Y-%m-%d %H:%M} to {oldest.end:%Y-%m-%d %H:%M} UTC,"
        f" {rows:,} rows")

    # The plain copy, as the table was before 0014: primary key, the finished index, the
    # statement trigger that forgets deleted tasks' workflow rows.
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
        cursor.execute(f"CREATE TABLE {PLAIN_TABLE} AS SELECT * FROM {oldest.name}")
        cursor.execute(f"ALTER TABLE {PLAIN_TABLE} ADD PRIMARY KEY (id)")
        cursor.execute(f"CREATE INDEX {PLAIN_TABLE}_finished_idx ON {PLAIN_TABLE} (finished_at) "
                       f"WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')")
        cursor.execute(f"CREATE TRIGGER {PLAIN_TABLE}_deleted AFTER DELETE ON {PLAIN_TABLE} "
                       f"REFERENCING OLD TABLE AS pgtasks_deleted_tasks FOR EACH STATEMENT "
                       f"EXECUTE FUNCTION pgtasks_tasks_deleted()")
        cursor.execute(f"VACUUM (ANALYZE) {PLAIN_TABLE}")
    log(f"Plain copy {PLAIN_TABLE} made in {time.perf_counter() - t0:.1f}s")

    # Retention's own batch statement and batch runner, on the plain copy.
    sql = re.sub(r"\bpgtasks_task\b", PLAIN_TABLE,
                 r._move_sql(("SUCCESSFUL", "CANCELLED"), archive=False))
    assert TASK_TABLE + " " not in sql
    step = r._Step(r.DELETED, sql, 0.0)
    after, deleted, batches = None, 0, 0
    t0 = time.perf_counter()
    while True:
        counts, after = r._batch("default", step, after, 1000, wait=True)
        batches += 1
        deleted += sum(counts.values())
        if sum(counts.values()) < 1000:
            break
    delete_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sql_do(f"VACUUM {PLAIN_TABLE}")
    vacuum_s = time.perf_counter() - t0
    log(f"Batched DELETE: {deleted:,} rows in {batches} batches, {delete_s:.2f}s; "
        f"VACUUM after it {vacuum_s:.2f}s")
    sql_do(f"DROP TABLE {PLAIN_TABLE}")

    # The purge: old enough to take exactly the oldest period of done; failed kept.
    (now,) = sql_one("SELECT now()")
    older_than = now - oldest.end + timedelta(hours=-12)
    t0 = time.perf_counter()
    result = r.purge(older_than=older_than, failed_older_than=timedelta(days=365), exact=False)
    purge_s = time.perf_counter() - t0
    left = [p.name for p in partitions.partitions("default", DONE_TABLE)]
    if oldest.name in left:
        raise RuntimeError(f"the purge left {oldest.name}: {result}")
    log(f"purge(exact=False): {result.total:,} rows ({result.deleted}) in {purge_s:.3f}s, "
        f"{result.batches} batches")
    if result.total != rows or deleted != rows:
        log(f"!! rows differ: period {rows}, purge {result.total}, DELETE {deleted}")
    return {"period": oldest.name, "rows": rows, "purge_s": purge_s, "purged": result.total,
            "delete_s": delete_s, "deleted": deleted, "batches": batches, "vacuum_s": vacuum_s}


# -- report ----------------------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}" if a else "-"


def report(args: argparse.Namespace, env: dict[str, object], a: dict, b: dict,
           ret: dict, seeding: dict, elapsed: float) -> str:
    lines = []
    add = lines.append
    add("# History scale: live work with and without a large partitioned history\n")
    add(f"Command: `{' '.join(['.venv/bin/python', 'bench/history_scale.py', *sys.argv[1:]])}`  ")
    add(f"Run: {env['date']}, {elapsed / 60:.1f} min in all (seeding the history "
        f"{seeding['seed_s']:.0f}s, its VACUUM (ANALYZE) {seeding['vacuum_s']:.0f}s)\n")
    add(f"Machine: {env['nproc']} CPU(s) ({env['cpu_model']}), {env['memory_gb']} GB RAM, "
        f"load average at start {env['load_start']}, at end {env['load_end']}  ")
    add(f"Server: {env['server']}  ")
    add(f"Client: Python {env['python']}, Django {env['django']}\n")
    add(f"State A: no history. State B: {args.history:,} finished tasks (90 % successful, 8 % "
        f"failed, 2 % cancelled) from {env['history_start']} to the run, in daily partitions. "
        f"Both: {args.waiting:,} waiting tasks, 200 running.\n")
    add("| table (with indexes) | state A | state B |")
    add("|---|---:|---:|")
    for table in ("pgtasks_task_live", "pgtasks_task_done", "pgtasks_task_failed"):
        add(f"| {table} | {fmt_size(a['describe']['sizes'][table])} "
            f"| {fmt_size(b['describe']['sizes'][table])} |")
    add("")
    add("| measure | state A | state B | B/A |")
    add("|---|---:|---:|---:|")

    def row(label: str, va: float, vb: float, unit: str, digits: int = 2) -> None:
        add(f"| {label} | {va:.{digits}f} {unit} | {vb:.{digits}f} {unit} | {ratio(va, vb)} |")

    for limit in (1, 50):
        ca, cb = a["claims"][limit], b["claims"][limit]
        row(f"claim {limit}, median (x{ca['n']})", ms(ca["median"]), ms(cb["median"]), "ms")
        row(f"claim {limit}, p95", ms(ca["p95"]), ms(cb["p95"]), "ms")
        row(f"claim {limit}, server execution (EXPLAIN ANALYZE, median of {args.explains})",
            a["plans"][limit]["execution_ms"],
            b["plans"][limit]["execution_ms"], "ms", 3)
    ea, eb = a["enqueue"], b["enqueue"]
    row(f"enqueue, median (x{ea['one']['n']})", ea["one"]["median"] * 1e6,
        eb["one"]["median"] * 1e6, "µs", 0)
    row("enqueue, p95", ea["one"]["p95"] * 1e6, eb["one"]["p95"] * 1e6, "µs", 0)
    row(f"enqueue_many({args.many}), median (x{ea['many']['n']})", ms(ea["many"]["median"]),
        ms(eb["many"]["median"]), "ms", 1)
    row(f"enqueue_many({args.many}), per task", ea["many"]["median"] / args.many * 1e6,
        eb["many"]["median"] / args.many * 1e6, "µs", 1)
    for title in a["pages"]:
        pa, pb = a["pages"][title], b["pages"][title]
        row(f"{title}: render, median of {args.repeat}", ms(pa["median"]), ms(pb["median"]),
            "ms", 0)
        row(f"{title}: SQL ({pa['queries']} / {pb['queries']} queries)", ms(pa["sql"]),
            ms(pb["sql"]), "ms", 0)
        row(f"{title}: slowest query", ms(pa["slowest"]), ms(pb["slowest"]), "ms", 1)
    add("")
    add("Slowest query of each page in state B:\n")
    for title, p in b["pages"].items():
        add(f"- {title} ({ms(p['slowest']):.0f} ms): `{p['slowest_sql'][:160]}`")
    add("")
    read = {state: ", ".join(res["plans"][1]["history"] + res["plans"][50]["history"]) or "no"
            for state, res in (("A", a), ("B", b))}
    add(f"Claims read a history table: state A {read['A']}, state B {read['B']}.\n")
    add(f"## Retention (state B): one day of `pgtasks_task_done` ({ret['period']})\n")
    add("| rows | partition drop: purge(exact=False) | batched DELETE (1,000 a batch) "
        "| VACUUM after the DELETE | DELETE / drop | DELETE + VACUUM / drop |")
    add("|---:|---:|---:|---:|---:|---:|")
    add(f"| {ret['rows']:,} | {ret['purge_s']:.3f} s | {ret['delete_s']:.2f} s "
        f"({ret['batches']} batches) | {ret['vacuum_s']:.2f} s "
        f"| {ret['delete_s'] / ret['purge_s']:.0f}x "
        f"| {(ret['delete_s'] + ret['vacuum_s']) / ret['purge_s']:.0f}x |")
    add("")
    add("The DELETE runs on a plain copy of that day alone (primary key, finished-time index, "
        "cascade trigger); on a pre-partitioning table holding the whole history its indexes "
        "are larger, so this is a lower bound.\n")
    for state, res in (("A", a), ("B", b)):
        for limit in (1, 50):
            add(f"### EXPLAIN (ANALYZE, BUFFERS) of a claim of {limit}, state {state}\n")
            add("```")
            add(res["plans"][limit]["plan"])
            add("```\n")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=10_000_000,
                        help="Finished tasks of state B (default: 10000000).")
    parser.add_argument("--waiting", type=int, default=100_000,
                        help="Waiting tasks in both states (default: 100000).")
    parser.add_argument("--chunk", type=int, default=1_000_000,
                        help="Finished tasks per seeding statement (default: 1000000).")
    parser.add_argument("--claims", type=int, default=300,
                        help="Timed claims of each size, after 10 warm-ups (default: 300).")
    parser.add_argument("--explains", type=int, default=30,
                        help="EXPLAIN ANALYZE runs of each claim, rolled back, for its server "
                             "execution time (default: 30).")
    parser.add_argument("--enqueues", type=int, default=2000,
                        help="Timed single enqueues (default: 2000).")
    parser.add_argument("--many", type=int, default=1000,
                        help="Tasks per enqueue_many (default: 1000).")
    parser.add_argument("--many-repeat", type=int, default=10,
                        help="Timed enqueue_many calls, after one warm-up (default: 10).")
    parser.add_argument("--repeat", type=int, default=5,
                        help="Timed renders of each page after one warm-up (default: 5).")
    parser.add_argument("--database-name", default="pgtasks_hist_bench",
                        help="Scratch database to create and drop (default: pgtasks_hist_bench).")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"Markdown report (default: {DEFAULT_OUTPUT.relative_to(ROOT)}).")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the scratch database at the end (default: drop it).")
    args = parser.parse_args()
    if not args.database_name.startswith("pgtasks_hist_bench"):
        parser.error("--database-name must start with pgtasks_hist_bench")
    if args.history < 1000 or args.waiting < 1000:
        parser.error("--history and --waiting must be at least 1000")
    return args


def main() -> int:
    args = parse_args()
    began = time.perf_counter()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from django.conf import settings

    db_settings = settings.DATABASES["default"]
    # The server of the test settings, through common's helpers (libpq's PG* variables).
    for key, var in (("HOST", "PGHOST"), ("PORT", "PGPORT"), ("USER", "PGUSER"),
                     ("PASSWORD", "PGPASSWORD")):
        if db_settings.get(key):
            os.environ.setdefault(var, str(db_settings[key]))
    recreate_database(args.database_name)
    db_settings["NAME"] = args.database_name
    try:
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connections
        from django.test import Client
        from django.test.utils import setup_test_environment

        setup_test_environment()  # the test client's host name is allowed
        machine = machine_description()
        env: dict[str, object] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": machine["nproc"], "cpu_model": machine["cpu_model"],
            "memory_gb": machine["memory_gb"], "python": platform.python_version(),
            "django": django.get_version(),
            "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        }
        log(f"Machine: {env['nproc']} CPU(s) {env['cpu_model']}, load average "
            f"{env['load_start']}")
        t0 = time.perf_counter()
        call_command("migrate", verbosity=0)
        (env["server"],) = sql_one("SELECT version()")
        log(f"Server: {env['server']}\nMigrated {args.database_name} in "
            f"{time.perf_counter() - t0:.1f}s")
        first_day, made = split_before(HISTORY_DAYS)
        env["history_start"] = f"{first_day:%Y-%m-%d %H:%M} UTC"
        log(f"Made {len(made)} past daily periods ({made[0]} … {made[-1]})")
        seed_live(args.history, args.waiting)
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", "x"))

        a = measure("A", args, client)
        log("\n== State B: seeding the history")
        seeding = seed_history(args.history, first_day, args.chunk)
        b = measure("B", args, client)
        counts = b["describe"]["counts"]
        log("Rows: " + ", ".join(f"{s} {n:,}" for s, n in counts.items()))
        ret = retention(first_day)
        env["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        connections.close_all()
        text = report(args, env, a, b, ret, seeding, time.perf_counter() - began)
        log("\n" + text)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
        log(f"\nWritten to {args.output}")
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            drop_database(args.database_name)
            log(f"Dropped {args.database_name}.")
    log(f"Total time: {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
