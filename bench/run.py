"""Benchmark django-pgtasks against the raw-SQL ceiling and its Python peers, in one run.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/run.py              # the default run (about 10 minutes)
    .venv/bin/python bench/run.py --long       # plus worker memory over 1,000,000 tasks
    .venv/bin/python bench/run.py --profile    # plus a py-spy profile of a worker
    .venv/bin/python bench/run.py --only enqueue,latency --repeat 5

Everything runs against the same PostgreSQL server (``PG*`` variables, else localhost:5432 as
postgres), one measurement after another, in a scratch database (``--database``) that is
created at the start and dropped at the end. The peers (procrastinate, django-tasks-db) and
py-spy are installed into ``bench/.venv-peers`` only, from bench/requirements-peers.txt.

Drain rates: worker processes are started on an empty queue and given time to connect;
then N no-op tasks are inserted in one statement and the rate is N divided by the time from
the first task's start to the last task's finish, as the database recorded them. Worker CPU
is the user+system time of the worker processes (all threads, all children) over that drain,
from /proc; RSS is that of the largest worker process when the drain ends. Each drain is
repeated (``--repeat``) and reported as min / median / max; ratios use medians.

The results are printed as a table and saved to bench/results/<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from common import (  # noqa: E402
    BENCH as BENCH_DIR,
)
from common import (  # noqa: E402
    PGTASKS_SETTINGS,
    ROOT,
    child_env,
    connect,
    drop_database,
    ensure_peers_venv,
    exited,
    largest_rss_mb,
    machine_description,
    peers_python,
    percentile,
    recreate_database,
    self_cpu,
    stderr_of,
    stop_process,
    summary,
    tree_pids,
    wait_process,
)
from systems import (  # noqa: E402
    Config,
    DjTasksDb,
    PgQueuer,
    PgTasks,
    Procrastinate,
    System,
    raw_drain,
)

SECTIONS = ("raw", "pgtasks", "peers", "enqueue", "latency", "startup", "large", "long",
            "profile")
DRAIN_SECTIONS = ("raw", "pgtasks", "peers")
DEFAULT_SECTIONS = ("raw", "pgtasks", "peers", "enqueue", "latency", "startup", "large")
#: (workers, tasks per claim, as processes?) of the raw ceiling. The processes are the
#: ceiling; the threads (one process, where the GIL caps them) are kept for comparison.
RAW_SHAPES = ((1, 1, True), (2, 1, True), (4, 1, True), (8, 1, True), (1, 50, True),
              (8, 50, True), (8, 1, False), (8, 50, False))
PEER_SYSTEMS = ("pgqueuer", "procrastinate", "django-tasks-db")

_started: list[subprocess.Popen] = []  # every worker we started, for the final clean-up


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def proc_cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def server_cpu_s() -> float | None:
    """CPU seconds spent so far by the PostgreSQL server on this machine: every ``postgres``
    process (the postmaster and its children, backends and background processes), plus what
    the postmaster's children that have exited spent (its ``cutime``/``cstime``), so that a
    backend whose session ended during a drain still counts. ``None`` when no PostgreSQL
    process runs here (a remote server)."""
    total, found = 0, False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        name, rest = data[data.index("(") + 1:data.rindex(")")], data.rsplit(")", 1)[1]
        if name != "postgres":
            continue
        fields = rest.split()
        found = True
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if fields[1] == "1" or not _is_postgres(fields[1]):  # the postmaster
            total += int(fields[13]) + int(fields[14])  # cutime, cstime: exited children
    return total / os.sysconf("SC_CLK_TCK") if found else None


def _is_postgres(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "postgres"
    except OSError:
        return False


def server_cpu_per_task(before: float | None, tasks: int) -> dict:
    after = server_cpu_s()
    if before is None or after is None or not tasks:
        return {}
    return {"server_cpu_us_per_task": (after - before) / tasks * 1e6}


# -- the generic harness -----------------------------------------------------------------------


def start_workers(system: System, config: Config, conn, timeout: float = 60) -> list:
    procs = system.start(config)
    _started.extend(procs)
    deadline = time.monotonic() + timeout
    while not system.ready(conn, config):
        dead = [p for p in procs if exited(p)]
        if dead or time.monotonic() > deadline:
            errors = " | ".join(stderr_of(p)[-2000:] for p in dead)
            stop_workers(procs)
            raise RuntimeError(f"{system.name} workers did not get ready: {errors or 'timeout'}")
        time.sleep(0.05)
    time.sleep(0.5)  # let every process reach its idle wait
    return procs


def stop_workers(procs: list) -> None:
    for p in procs:
        if not exited(p):
            p.send_signal(signal.SIGTERM)
    for p in procs:
        stop_process(p, grace=15)
        if p in _started:
            _started.remove(p)


def all_pids(procs: list) -> list[int]:
    return [pid for p in procs for pid in tree_pids(p.pid)]


def drain(system: System, config: Config, n: int, args) -> dict:
    """Warm workers, n tasks inserted at once, drained (or stopped after --max-drain-seconds);
    the rate is the tasks finished over the span from the first start to the last finish, as
    the database recorded them."""
    with connect(args.database) as conn:
        system.reset(conn)
        procs = start_workers(system, config, conn)
        try:
            pids = all_pids(procs)
            cpu0, server0 = proc_cpu_s(pids), server_cpu_s()
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            system.seed(conn, n)
            while system.remaining(conn):
                if time.monotonic() - t0 > args.max_drain_seconds:
                    break
                if any(exited(p) for p in procs):
                    raise RuntimeError(f"a {system.name} worker exited during the drain: "
                                       + " | ".join(stderr_of(p)[-1000:] for p in procs))
                time.sleep(0.2)
            cpu = proc_cpu_s(pids) - cpu0
            server = server_cpu_s()
            rss = max(largest_rss_mb(p.pid) for p in procs)
        finally:
            stop_workers(procs)
        done, seconds = system.window(conn)
    if not done:
        raise RuntimeError(f"{system.name}: no task finished")
    return {"rate": done / seconds, "tasks_done": done, "cpu_us_per_task": cpu / done * 1e6,
            "rss_mb": rss, "loadavg": load,
            **({"server_cpu_us_per_task": (server - server0) / done * 1e6}
               if server is not None and server0 is not None else {})}


def raw_key(workers: int, batch: int, processes: bool) -> str:
    unit = ("process" if processes else "thread") + ("es" if processes and workers > 1 else
                                                     "s" if workers > 1 else "")
    return f"raw {workers} {unit}, batch {batch}"


def raw_run(workers: int, batch: int, processes: bool, n: int, args) -> dict:
    pg = PgTasks(args.database, sys.executable)
    with connect(args.database) as conn:
        pg.reset(conn)
        pg.seed(conn, n)  # like the workers' drains: no VACUUM or ANALYZE in between
        load = os.getloadavg()[0]
        server0 = server_cpu_s()
        cpu = raw_drain(args.database, workers, batch, args.max_drain_seconds, processes)
        done, seconds = pg.window(conn)
    return {"rate": done / seconds, "tasks_done": done, "cpu_us_per_task": cpu / done * 1e6,
            "loadavg": load, **server_cpu_per_task(server0, done)}


def drain_plan(args, results: dict) -> list[tuple[str, dict, object]]:
    """(key, description, run-once function) of every drain of the selected sections."""
    plan: list[tuple[str, dict, object]] = []
    if "raw" in args.sections:
        for workers, batch, processes in RAW_SHAPES:
            n = args.tasks * (5 if batch > 1 else 1)
            desc = {"system": "raw SQL", "batch": batch, "tasks": n,
                    "processes": workers if processes else 1,
                    "concurrency": 1 if processes else workers, "as_processes": processes}
            plan.append((raw_key(workers, batch, processes), desc,
                         lambda w=workers, b=batch, p=processes, n=n:
                         raw_run(w, b, p, n, args)))
    systems: list[tuple[System, list[str], int]] = []
    if "pgtasks" in args.sections:
        systems.append((PgTasks(args.database, sys.executable), args.pgtasks, args.tasks))
    if "peers" in args.sections and "peers_error" not in results:
        systems.append((PgQueuer(args.database), args.pgqueuer, args.tasks))
        systems.append((Procrastinate(args.database), args.procrastinate, args.peer_tasks))
        systems.append((DjTasksDb(args.database), args.djtasks, args.peer_tasks))
    for system, configs, n in systems:
        for text in filter(None, configs):  # an empty list ("--djtasks ''") skips a system
            config = Config.parse(text)
            label = config.label(system.default_concurrency)
            key = f"{system.name} {'default (' + label + ')' if text == 'default' else label}"
            desc = {"system": system.name, "config": label, "processes": config.processes,
                    "concurrency": config.concurrency or system.default_concurrency,
                    "prefetch": config.prefetch, "tasks": n}
            plan.append((key, desc, lambda s=system, c=config, n=n: drain(s, c, n, args)))
    return plan


def section_drains(args, results: dict) -> None:
    """Every drain once, then every drain again (--repeat rounds): on a shared machine, a
    burst of load from elsewhere then hits all the systems alike rather than one of them."""
    plan = drain_plan(args, results)
    runs: dict[str, list[dict]] = {key: [] for key, _, _ in plan}
    failed: dict[str, str] = {}
    for round_ in range(args.repeat):
        log(f"  round {round_ + 1} of {args.repeat}")
        for key, _, run_once in plan:
            if key in failed:
                continue
            try:
                run = run_once()
            except Exception as exc:
                log(f"  {key}: failed: {exc}")
                failed[key] = str(exc)
                continue
            runs[key].append(run)
            log(f"  {key:36} {run['rate']:7.0f} tasks/s  {run['cpu_us_per_task']:6.0f} us "
                f"CPU/task  {run.get('server_cpu_us_per_task', 0):6.0f} us server CPU/task  "
                f"{run.get('rss_mb', 0):4.0f} MB  load {run['loadavg']:.1f}")
    for key, desc, _ in plan:
        entry = dict(desc)
        if key in failed:
            entry["error"] = failed[key]
        got = runs[key]
        if got:
            entry["rate"] = summary([r["rate"] for r in got])
            entry["cpu_us_per_task"] = summary([r["cpu_us_per_task"] for r in got])
            if all("server_cpu_us_per_task" in r for r in got):
                entry["server_cpu_us_per_task"] = summary(
                    [r["server_cpu_us_per_task"] for r in got])
            if "rss_mb" in got[0]:
                entry["rss_mb"] = summary([r["rss_mb"] for r in got])
            entry["tasks_done"] = [r["tasks_done"] for r in got]
            entry["loadavg"] = [round(r["loadavg"], 1) for r in got]
        results[key] = entry


def section_enqueue(args, results: dict) -> None:
    """Single enqueue vs raw INSERT (one task per transaction); bulk vs COPY."""
    from django.db import connection

    from django_pgtasks.models import Task

    single: dict[str, list[float]] = {"pgtasks": [], "raw": [], "pgtasks_cpu": [],
                                      "raw_cpu": []}
    # The raw statements write into the live partition, where a new task belongs (as
    # enqueue does): through the partitioned parent, each row would also be routed.
    insert = ("INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, status, "
              "attempt, max_attempts, error_text, metadata) VALUES "
              "(%s, %s, %s, %s, %s, 'READY', 0, %s, '', '{}') RETURNING id")
    k = args.single_enqueues
    with connect(args.database) as conn:
        for _ in range(args.repeat):
            conn.execute("TRUNCATE pgtasks_task")
            t0, c0 = time.perf_counter(), self_cpu()
            for _ in range(k):
                conn.execute(insert, ["bench.noop", "default", "[]", "{}", 100, 3]).fetchone()
            single["raw"].append((time.perf_counter() - t0) / k * 1e6)
            single["raw_cpu"].append((self_cpu() - c0) / k * 1e6)
            conn.execute("TRUNCATE pgtasks_task")
            connection.ensure_connection()
            t0, c0 = time.perf_counter(), self_cpu()
            for _ in range(k):
                Task.objects.enqueue("bench.noop")
            single["pgtasks"].append((time.perf_counter() - t0) / k * 1e6)
            single["pgtasks_cpu"].append((self_cpu() - c0) / k * 1e6)
            log(f"  single enqueue: raw INSERT {single['raw'][-1]:.0f} us "
                f"({single['raw_cpu'][-1]:.0f} us client CPU), Task.objects.enqueue "
                f"{single['pgtasks'][-1]:.0f} us ({single['pgtasks_cpu'][-1]:.0f} us CPU)")
        results["enqueue single"] = {
            "tasks": k, "raw_insert_us": summary(single["raw"]),
            "enqueue_us": summary(single["pgtasks"]),
            "raw_insert_client_cpu_us": summary(single["raw_cpu"]),
            "enqueue_client_cpu_us": summary(single["pgtasks_cpu"]),
        }
        n = args.bulk_tasks
        bulk: dict[str, list[float]] = {"build": [], "enqueue_many": [], "copy": [],
                                        "enqueue_bulk": []}
        has_bulk = hasattr(Task.objects, "enqueue_bulk")
        for _ in range(args.repeat):
            conn.execute("TRUNCATE pgtasks_task")
            t0 = time.perf_counter()
            with conn.cursor().copy(
                "COPY pgtasks_task_live (name, queue, args, kwargs, priority, status, attempt, "
                "max_attempts, error_text, metadata) FROM STDIN"
            ) as copy:
                for _ in range(n):
                    copy.write_row(("bench.noop", "default", "[]", "{}", 100, "READY", 0, 3,
                                    "", "{}"))
            bulk["copy"].append(n / (time.perf_counter() - t0))
            conn.execute("TRUNCATE pgtasks_task")
            t0 = time.perf_counter()
            tasks = [Task.objects.build("bench.noop") for _ in range(n)]
            t1 = time.perf_counter()
            Task.objects.enqueue_many(tasks)
            t2 = time.perf_counter()
            del tasks
            bulk["build"].append(n / (t1 - t0))
            bulk["enqueue_many"].append(n / (t2 - t1))
            both = n / (t2 - t0)
            if has_bulk:  # the COPY-based API: one handler, one set of options
                conn.execute("TRUNCATE pgtasks_task")
                calls = [() for _ in range(n)]
                t0 = time.perf_counter()
                Task.objects.enqueue_bulk("bench.noop", calls)
                bulk["enqueue_bulk"].append(n / (time.perf_counter() - t0))
                del calls
            log(f"  bulk {n}: COPY {bulk['copy'][-1]:.0f}/s, build {bulk['build'][-1]:.0f}/s, "
                f"enqueue_many {bulk['enqueue_many'][-1]:.0f}/s, build+enqueue_many "
                f"{both:.0f}/s"
                + (f", enqueue_bulk {bulk['enqueue_bulk'][-1]:.0f}/s" if has_bulk else ""))
        conn.execute("TRUNCATE pgtasks_task")
    total = [1 / (1 / b + 1 / e) for b, e in zip(bulk["build"], bulk["enqueue_many"],
                                                   strict=True)]
    results["enqueue bulk"] = {
        "tasks": n, "copy_per_s": summary(bulk["copy"]), "build_per_s": summary(bulk["build"]),
        "enqueue_many_per_s": summary(bulk["enqueue_many"]),
        "build_and_enqueue_many_per_s": summary(total),
        **({"enqueue_bulk_per_s": summary(bulk["enqueue_bulk"])} if has_bulk else {}),
    }


def measure_latency(system: System, config: Config, samples: int, dbname: str) -> dict:
    with connect(dbname) as conn:
        system.reset(conn)
        procs = start_workers(system, config, conn)
        try:
            time.sleep(1.0)
            for _ in range(samples):
                key = system.enqueue_one(conn)
                deadline = time.monotonic() + 30
                while not system.started(conn, key):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{system.name}: a task did not start in 30 s")
                    time.sleep(0.003)
                time.sleep(random.uniform(0.02, 0.06))
            time.sleep(0.2)
            rss = max(largest_rss_mb(p.pid) for p in procs)
        finally:
            stop_workers(procs)
        values = system.latencies_ms(conn)
    return {"samples": len(values), "median_ms": statistics.median(values),
            "p99_ms": percentile(values, 99), "max_ms": max(values), "min_ms": min(values),
            "idle_rss_mb": rss}


def section_latency(args, results: dict) -> None:
    candidates: list[tuple[System, str]] = [(PgTasks(args.database, sys.executable), "default")]
    if "peers_error" not in results:
        candidates += [(PgQueuer(args.database), "default"),
                       (Procrastinate(args.database), "default")]
        candidates += [(DjTasksDb(args.database), c) for c in args.djtasks_latency]
    for system, text in candidates:
        config = Config.parse(text)
        key = f"{system.name} {'default' if text == 'default' else config.label(1)}"
        try:
            res = measure_latency(system, config, args.latency_samples, args.database)
        except Exception as exc:
            log(f"  latency {key} failed: {exc}")
            results[f"latency {key}"] = {"error": str(exc)}
            continue
        results[f"latency {key}"] = {"system": system.name, **res}
        log(f"  latency {key}: median {res['median_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms "
            f"over {res['samples']}")


def section_startup(args, results: dict) -> None:
    """From ``run_pgtasks`` being started (the database's clock just before the process is
    spawned) to its first task running (that task's ``started_at``), with tasks already
    waiting: what a deploy or a scale-up waits for. Interpreter and Django start-up count."""
    pg = PgTasks(args.database, sys.executable)
    out: dict = {}
    for text in args.startup_processes:
        config = Config(processes=int(text))
        times = []
        with connect(args.database) as conn:
            for _ in range(args.startup_runs):
                pg.reset(conn)
                pg.seed(conn, 1000)
                t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                procs = pg.start(config)
                _started.extend(procs)
                try:
                    deadline = time.monotonic() + 60
                    while True:
                        first = conn.execute("SELECT min(started_at) FROM pgtasks_task "
                                             "WHERE started_at IS NOT NULL").fetchone()[0]
                        if first is not None:
                            break
                        if time.monotonic() > deadline or any(exited(p) for p in procs):
                            raise RuntimeError("no task started: " + " | ".join(
                                stderr_of(p)[-1000:] for p in procs))
                        time.sleep(0.01)
                finally:
                    stop_workers(procs)
                times.append((first - t0).total_seconds())
        key = f"--processes {text}"
        out[key] = {"runs": [round(t, 3) for t in times], "median_s": statistics.median(times),
                    "max_s": max(times)}
        log(f"  start-up, {key}: first task running after {statistics.median(times):.2f} s "
            f"(median of {len(times)}, max {max(times):.2f} s)")
    results["startup"] = out


def section_large(args, results: dict) -> None:
    """Claim time and admin-style counts: 1M finished + 100k waiting vs smaller tables."""
    import explain_claim
    from django.db import connection, transaction
    from django.db.models import Count

    from django_pgtasks.models import Task

    def timed(fn, runs: int) -> float:
        fn()  # warm-up
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.mean(times)

    queries = {
        "pending().count()": lambda: Task.objects.pending().count(),
        "pending count, queue 'default'":
            lambda: Task.objects.pending().filter(queue="default").count(),
        "pending count per queue": lambda: list(
            Task.objects.pending().values("queue").annotate(n=Count("id")).order_by()),
        "admin summary (count per name and status)": lambda: list(
            Task.objects.values("name", "status").annotate(n=Count("id")).order_by()),
    }
    scenarios = (("near-empty", 0, args.large_claims * 3 * 2 + 2000),
                 ("100k waiting", 0, args.large_pending),
                 ("1M finished + 100k waiting", args.large_finished, args.large_pending))
    out: dict = {}
    for name, finished, pending in scenarios:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgtasks_task")
        t0 = time.perf_counter()
        explain_claim.seed(finished, pending)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE pgtasks_task")
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pgtasks_task'))")
            size = cursor.fetchone()[0]
        log(f"  large table, {name}: seeded in {time.perf_counter() - t0:.0f}s ({size})")
        entry: dict = {"finished": finished, "pending": pending, "table_size": size,
                       "counts_ms": {}}
        for label, fn in queries.items():
            entry["counts_ms"][label] = timed(fn, 5)
        claim_means = []
        for _ in range(3):
            times = []
            for _ in range(args.large_claims):
                t0 = time.perf_counter()
                claimed = Task.objects.claim("bench-worker", queues=["default"], limit=1)
                times.append((time.perf_counter() - t0) * 1000)
                assert claimed, "ran out of due tasks"
            claim_means.append(statistics.mean(times))
        entry["claim_ms"] = summary(claim_means)
        claim = explain_claim.captured_claim_sql(["default"], 1)
        entry["claim_plan"] = explain_claim.explain_analyze(claim)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM pgtasks_task "
                           "WHERE status IN ('READY', 'AWAITING_RETRY') AND queue = 'default'")
            entry["pending_count_plan"] = "\n".join(r[0] for r in cursor.fetchall())
        out[name] = entry
        log(f"  {name}: claim {entry['claim_ms']['median']:.2f} ms (median of 3 means of "
            f"{args.large_claims}); counts "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in entry["counts_ms"].items()))
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgtasks_task")
    results["large table"] = out


def section_long(args, results: dict) -> None:
    """One worker process through --long-tasks tasks: its RSS over time."""
    pg = PgTasks(args.database, sys.executable)
    config = Config.parse(args.long_config)
    n = args.long_tasks
    with connect(args.database) as conn:
        pg.reset(conn)
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0] == "on"
        vacuums: list[float] = []
        procs = start_workers(pg, config, conn)
        samples = []
        try:
            t0 = time.monotonic()
            rss0 = largest_rss_mb(procs[0].pid)
            for start in range(0, n, 100_000):
                pg.seed(conn, min(100_000, n - start))  # 100k at a time, as a producer would
            log(f"  long run: {n} tasks seeded in {time.monotonic() - t0:.0f}s, draining")
            next_log = time.monotonic() + 60
            next_vacuum = time.monotonic() + args.long_vacuum_every
            while True:
                if not autovacuum and time.monotonic() > next_vacuum:
                    # The server runs without autovacuum: do its job (VACUUM and ANALYZE), as a
                    # production server would. Without VACUUM, every index scan wades through
                    # the dead rows of done tasks; without ANALYZE, the claim's plan is made
                    # from the statistics of an empty table (see docs/performance.md).
                    v0 = time.monotonic()
                    conn.execute("VACUUM (ANALYZE) pgtasks_task")
                    vacuums.append(round(time.monotonic() - v0, 1))
                    next_vacuum = time.monotonic() + args.long_vacuum_every
                left = pg.remaining(conn)
                samples.append({"t": round(time.monotonic() - t0, 1), "done": n - left,
                                "rss_mb": round(largest_rss_mb(procs[0].pid), 1)})
                if not left:
                    break
                if time.monotonic() > next_log:
                    next_log += 60
                    log(f"  long run: {n - left:,} done, RSS {samples[-1]['rss_mb']} MB, "
                        f"load {os.getloadavg()[0]:.1f}")
                if exited(procs[0]):
                    raise RuntimeError("the worker exited during the long run")
                time.sleep(args.long_sample_every)
            cpu_s = proc_cpu_s(all_pids(procs))
        finally:
            stop_workers(procs)
        done, seconds = pg.window(conn)
        pg.reset(conn)

    def rss_at(fraction: float) -> float:
        return next(s["rss_mb"] for s in samples if s["done"] >= fraction * n)

    results["long run"] = {
        "tasks": n, "config": config.label(4), "rate": done / seconds,
        "cpu_us_per_task": cpu_s / n * 1e6, "rss_idle_mb": rss0,
        "rss_at_10pct_mb": rss_at(0.1), "rss_at_50pct_mb": rss_at(0.5),
        "rss_end_mb": samples[-1]["rss_mb"], "rss_max_mb": max(s["rss_mb"] for s in samples),
        "server_autovacuum": autovacuum, "manual_vacuums_s": vacuums,
        "samples": samples,
    }
    r = results["long run"]
    log(f"  long run: {r['rate']:.0f} tasks/s; RSS idle {rss0:.1f} MB, at 10% "
        f"{r['rss_at_10pct_mb']:.1f} MB, at 50% {r['rss_at_50pct_mb']:.1f} MB, end "
        f"{r['rss_end_mb']:.1f} MB")


def section_profile(args, results: dict, stamp: str) -> None:
    """py-spy (from the peers' venv) on a django-pgtasks worker during one drain.

    ``--gil`` samples only the thread holding the GIL, so the shares are of the Python CPU
    time of the worker, the resource its throughput is bound by."""
    pyspy = peers_python().parent / "py-spy"
    pg = PgTasks(args.database, sys.executable)
    profiles = {}
    for text in args.profile_configs:
        config = Config.parse(text)
        out = BENCH_DIR / "results" / f"{stamp}-pyspy-{config.label(4)}.collapsed"
        with connect(args.database) as conn:
            pg.reset(conn)
            procs = start_workers(pg, config, conn)
            try:
                spy = subprocess.Popen(
                    [str(pyspy), "record", "--pid", str(procs[0].pid), "--subprocesses",
                     "--threads", "--gil", "--nonblocking", "--rate", "250", "--format", "raw",
                     "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                _started.append(spy)
                time.sleep(2)
                pg.seed(conn, args.tasks * 2)
                while pg.remaining(conn):
                    time.sleep(0.2)
                spy.send_signal(signal.SIGINT)
                wait_process(spy, timeout=30)
                _started.remove(spy)
            finally:
                stop_workers(procs)
            done, seconds = pg.window(conn)
        profiles[config.label(4)] = {"rate": done / seconds, "file": out.name,
                                     **summarize_profile(out)}
        log(f"  profile {config.label(4)}: {done / seconds:.0f} tasks/s under py-spy, "
            f"written to {out.relative_to(ROOT)}")
    results["profile"] = profiles


def summarize_profile(path: Path, top: int = 25) -> dict:
    """Self and inclusive sample shares per function, and per thread, from collapsed stacks."""
    if not path.exists():
        return {"error": "py-spy wrote no profile"}
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread")), "?")
        threads[thread] = threads.get(thread, 0) + n
        funcs = [re.sub(r":\d+\)$", ")", f) for f in frames
                 if not f.startswith(("process", "thread"))]
        if funcs:
            own[funcs[-1]] = own.get(funcs[-1], 0) + n
        for f in set(funcs):
            incl[f] = incl.get(f, 0) + n

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(v / total * 100, 1))
                for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(incl),
            "threads_pct": share(threads)}


# -- report ------------------------------------------------------------------------------------


def med(entry: dict, field: str = "rate") -> float | None:
    value = entry.get(field) if isinstance(entry, dict) else None
    return value["median"] if isinstance(value, dict) else None


def raw_for(results: dict, workers: int, batch: int) -> float | None:
    """Median rate of the raw ceiling (processes) of that shape, workers capped at those
    measured."""
    measured = sorted(w for w, b, processes in RAW_SHAPES if b == batch and processes)
    w = max([m for m in measured if m <= workers] or measured[:1])
    return med(results.get(raw_key(w, batch, True), {}))


def best_raw_batch(results: dict) -> float | None:
    rates = [med(results.get(raw_key(w, b, True), {})) for w, b, p in RAW_SHAPES
             if b > 1 and p]
    rates = [r for r in rates if r]
    return max(rates) if rates else None


def peer_rows(results: dict, system: str | None = None) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in results.items() if isinstance(v, dict) and med(v)
            and v.get("system") in PEER_SYSTEMS and (system is None or v["system"] == system)]


def best_peer(results: dict, system: str | None = None) -> tuple[str, float] | None:
    peers = [(k, med(v)) for k, v in peer_rows(results, system)]
    return max(peers, key=lambda kv: kv[1]) if peers else None


def default_of(results: dict, system: str) -> tuple[str, dict] | None:
    """The row of ``system`` in its own default configuration."""
    return next(((k, v) for k, v in results.items() if isinstance(v, dict)
                 and v.get("system") == system and " default (" in k and med(v)), None)


def compare(results: dict) -> None:
    """Add, to every drain row, its ratios: to the raw one-per-claim ceiling at the same
    number of workers (processes, for django-pgtasks: processes x threads), to the best raw
    batch-50 ceiling, and to pgqueuer's best and default rows."""
    raw50 = best_raw_batch(results)
    pgq_best = best_peer(results, "pgqueuer")
    pgq_default = default_of(results, "pgqueuer")
    for entry in results.values():
        if not isinstance(entry, dict) or "rate" not in entry or "system" not in entry:
            continue
        rate = med(entry)
        if entry["system"] == "raw SQL":
            continue
        if entry["system"] == "django-pgtasks":
            workers = entry["processes"] * entry["concurrency"]
            base = raw_for(results, workers, 1)
            entry["raw1_shape"] = f"raw {min(workers, 8)} processes, batch 1"
            entry["vs_raw1"] = rate / base if base else None
        entry["vs_raw50"] = rate / raw50 if raw50 else None
        entry["vs_pgqueuer_best"] = rate / pgq_best[1] if pgq_best else None
        entry["vs_pgqueuer_default"] = rate / med(pgq_default[1]) if pgq_default else None


def evaluate_targets(results: dict) -> list[dict]:
    """The speed issue's targets, each with the measured figure and met / not met / not
    measured."""
    out: list[dict] = []

    def add(target: str, figure: str, met: bool | None) -> None:
        out.append({"target": target, "measured": figure,
                    "status": "not measured" if met is None else "met" if met else "not met"})

    pg = {k: v for k, v in results.items() if isinstance(v, dict)
          and v.get("system") == "django-pgtasks" and med(v)}
    pgq_best = best_peer(results, "pgqueuer")
    pgq_default = default_of(results, "pgqueuer")
    raw50 = best_raw_batch(results)
    if pg and pgq_best:
        best = max(pg.values(), key=med)
        add("best configuration >= 1.0x pgqueuer's best",
            f"{best['config']}: {med(best):.0f}/s vs {pgq_best[0]}: {pgq_best[1]:.0f}/s = "
            f"{med(best) / pgq_best[1]:.2f}x", med(best) >= pgq_best[1])
    raw50_entry = results.get(raw_key(8, 50, True), {})
    if pg and med(raw50_entry, "server_cpu_us_per_task") is not None:
        best = max(pg.values(), key=med)

        def total_cpu(entry: dict) -> float | None:
            server = med(entry, "server_cpu_us_per_task")
            return None if server is None else med(entry, "cpu_us_per_task") + server

        ours, raw = total_cpu(best), total_cpu(raw50_entry)
        if ours is not None:
            add("CPU per task (worker + PostgreSQL), best configuration, within 10x the raw "
                "batch-50 loop's (8 processes)",
                f"{best['config']}: {ours:.0f} us vs {raw:.0f} us = {ours / raw:.1f}x",
                ours <= 10 * raw)
    if pg and raw50:
        best = max(pg.values(), key=med)
        add("moonshot: best configuration >= 50% of the raw batch-50 ceiling (processes)",
            f"{best['config']}: {med(best):.0f}/s = {med(best) / raw50:.0%} of {raw50:.0f}/s",
            med(best) >= 0.5 * raw50)
    default = default_of(results, "django-pgtasks")
    if default and pgq_default:
        rate = med(default[1])
        add("default configuration >= 1.0x pgqueuer's defaults",
            f"{rate:.0f}/s vs {med(pgq_default[1]):.0f}/s = {rate / med(pgq_default[1]):.2f}x",
            rate >= med(pgq_default[1]))
    if default and default[1].get("vs_raw1"):
        e = default[1]
        add("default configuration >= 80% of the raw one-per-claim ceiling, same workers",
            f"{med(e):.0f}/s = {e['vs_raw1']:.0%} of {e['raw1_shape']}", e["vs_raw1"] >= 0.8)
    if "enqueue single" in results:
        s = results["enqueue single"]
        ratio = s["enqueue_us"]["median"] / s["raw_insert_us"]["median"]
        add("Task.objects.enqueue() <= 1.5x the cost of a raw INSERT ... RETURNING",
            f"{s['enqueue_us']['median']:.0f} us vs {s['raw_insert_us']['median']:.0f} us = "
            f"{ratio:.2f}x", ratio <= 1.5)
    if "enqueue bulk" in results:
        b = results["enqueue bulk"]
        copy = b["copy_per_s"]["median"]
        many = b["enqueue_many_per_s"]["median"] / copy
        add("enqueue_many() >= 50% of a raw COPY of the same rows", f"{many:.0%}", many >= 0.5)
        if "enqueue_bulk_per_s" in b:
            bulk = b["enqueue_bulk_per_s"]["median"] / copy
            add("enqueue_bulk() >= 80% of a raw COPY of the same rows", f"{bulk:.0%}",
                bulk >= 0.8)
    if "startup" in results:
        runs = results["startup"]
        worst = max(v["median_s"] for v in runs.values())
        add("first task running within 0.5 s of a worker's start (any --processes)",
            ", ".join(f"{k}: {v['median_s']:.2f} s" for k, v in runs.items()), worst <= 0.5)
    lat = next((v for k, v in results.items() if k.startswith("latency django-pgtasks")
                and "median_ms" in v), None)
    if lat:
        add("idle wake-up: median <= 10 ms", f"median {lat['median_ms']:.1f} ms, p99 "
            f"{lat['p99_ms']:.1f} ms", lat["median_ms"] <= 10)
    lt = results.get("large table", {})
    if "near-empty" in lt and "1M finished + 100k waiting" in lt:
        big = lt["1M finished + 100k waiting"]["claim_ms"]["median"]
        small = lt["near-empty"]["claim_ms"]["median"]
        add("claim time flat from 0 to 1,000,000 finished rows (within 1.5x)",
            f"{big:.2f} ms vs {small:.2f} ms = {big / small:.2f}x", big / small <= 1.5)
    if "long run" in results:
        r = results["long run"]
        growth = r["rss_end_mb"] - r["rss_at_10pct_mb"]
        add(f"worker memory flat over {r['tasks']:,} tasks",
            f"RSS {r['rss_at_10pct_mb']:.1f} MB at 10%, {r['rss_end_mb']:.1f} MB at the end "
            f"({growth:+.1f} MB)", growth <= 0.05 * r["rss_at_10pct_mb"])
    else:
        add("worker memory flat over 1M tasks", "run with --long", None)
    return out


def markdown_report(results: dict) -> str:
    """The main figures as Markdown tables (``--report FILE --markdown``), for the docs."""
    lines = ["| Configuration | tasks/s, median | min-max | vs raw 1/claim, same workers "
             "| vs raw 50/claim | vs pgqueuer best | vs pgqueuer default | CPU per task "
             "| server CPU per task | RSS |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, e in results.items():
        if not isinstance(e, dict) or "system" not in e or not isinstance(e.get("rate"), dict):
            continue
        r = e["rate"]
        rss = f"{med(e, 'rss_mb'):.0f} MB" if "rss_mb" in e else ""
        lines.append(f"| {key} | {r['median']:,.0f} | {r['min']:,.0f}-{r['max']:,.0f} "
                     f"| {fmt(e.get('vs_raw1'), '.0%')} | {fmt(e.get('vs_raw50'), '.0%')} "
                     f"| {fmt(e.get('vs_pgqueuer_best'), '.2f', 'x')} "
                     f"| {fmt(e.get('vs_pgqueuer_default'), '.2f', 'x')} "
                     f"| {med(e, 'cpu_us_per_task'):,.0f} us "
                     f"| {fmt(med(e, 'server_cpu_us_per_task'), ',.0f', ' us')} | {rss} |")
    for key, e in results.items():
        if isinstance(e, dict) and "system" in e and "error" in e and "rate" not in e:
            lines.append(f"| {key} | error: {e['error'][:80]} | | | | | | | | |")
    lat = {k[8:]: v for k, v in results.items() if k.startswith("latency") and "median_ms" in v}
    if lat:
        best = min(v["median_ms"] for k, v in lat.items() if "pgtasks" not in k)
        lines += ["", "| Worker | median | p99 | max | samples | median vs best peer |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for k, v in lat.items():
            lines.append(f"| {k} | {v['median_ms']:.1f} ms | {v['p99_ms']:.1f} ms | "
                         f"{v['max_ms']:.1f} ms | {v['samples']} | "
                         f"{v['median_ms'] / best:.2f}x |")
    if results.get("targets"):
        lines += ["", "| Target | Measured | Status |", "| --- | --- | --- |"]
        lines += [f"| {t['target']} | {t['measured']} | {t['status']} |"
                  for t in results["targets"]]
    return "\n".join(lines)


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def print_report(results: dict) -> None:
    print("\nDrain rate (no-op tasks, tasks/s from the database's timestamps; "
          "median of the runs, [min-max])")
    print(f"{'measurement':42} {'median':>7} {'min-max':>13} {'raw 1':>6} {'raw 50':>6} "
          f"{'pgq best':>8} {'pgq dflt':>8} {'CPU us/task':>11} {'PG us/task':>10} "
          f"{'RSS MB':>7}")
    for key, e in results.items():
        if not isinstance(e, dict) or "system" not in e:
            continue
        if "error" in e and "rate" not in e:
            print(f"{key:42} error: {e['error'][:60]}")
            continue
        if "rate" not in e or not isinstance(e["rate"], dict):
            continue
        r = e["rate"]
        print(f"{key:42} {r['median']:7.0f} {r['min']:6.0f}-{r['max']:<6.0f} "
              f"{fmt(e.get('vs_raw1'), '6.0%')} {fmt(e.get('vs_raw50'), '6.0%')} "
              f"{fmt(e.get('vs_pgqueuer_best'), '7.2f', 'x'):>8} "
              f"{fmt(e.get('vs_pgqueuer_default'), '7.2f', 'x'):>8} "
              f"{fmt(med(e, 'cpu_us_per_task'), '11.0f')} "
              f"{fmt(med(e, 'server_cpu_us_per_task'), '10.0f')} "
              f"{fmt(med(e, 'rss_mb'), '7.0f')}")
    for key, e in results.items():
        if key.startswith("drain error"):
            print(f"{key}: {e}")
    if "enqueue single" in results:
        s = results["enqueue single"]
        print(f"\nSingle enqueue, one task per transaction ({s['tasks']} per run): "
              f"Task.objects.enqueue {s['enqueue_us']['median']:.0f} us "
              f"[{s['enqueue_us']['min']:.0f}-{s['enqueue_us']['max']:.0f}], raw INSERT "
              f"{s['raw_insert_us']['median']:.0f} us "
              f"[{s['raw_insert_us']['min']:.0f}-{s['raw_insert_us']['max']:.0f}]: "
              f"{s['enqueue_us']['median'] / s['raw_insert_us']['median']:.2f}x the raw cost"
              f"\n  client CPU per enqueue: {s['enqueue_client_cpu_us']['median']:.0f} us vs "
              f"{s['raw_insert_client_cpu_us']['median']:.0f} us for the raw INSERT")
    if "enqueue bulk" in results:
        b = results["enqueue bulk"]
        print(f"Bulk enqueue of {b['tasks']:,} tasks (tasks/s, median [min-max]):")
        for label, field in (("COPY", "copy_per_s"), ("build()", "build_per_s"),
                             ("enqueue_many()", "enqueue_many_per_s"),
                             ("build() + enqueue_many()", "build_and_enqueue_many_per_s"),
                             ("enqueue_bulk() (COPY)", "enqueue_bulk_per_s")):
            v = b.get(field)
            if v is None:
                continue
            print(f"  {label:26} {v['median']:9.0f} [{v['min']:.0f}-{v['max']:.0f}]"
                  f"  {v['median'] / b['copy_per_s']['median']:5.0%} of COPY")
    lat = {k: v for k, v in results.items() if k.startswith("latency")}
    if lat:
        print("\nEnqueue-to-start latency into an idle worker:")
        for key, v in lat.items():
            if "error" in v:
                print(f"  {key[8:]:36} error: {v['error'][:70]}")
            else:
                print(f"  {key[8:]:36} median {v['median_ms']:7.1f} ms   p99 "
                      f"{v['p99_ms']:7.1f} ms   ({v['samples']} samples)")
    if "startup" in results:
        print("\nStart-up: from starting run_pgtasks to its first task running (queue full):")
        for key, v in results["startup"].items():
            print(f"  {key:16} median {v['median_s']:.2f} s, max {v['max_s']:.2f} s")
    if "large table" in results:
        lt = results["large table"]
        base = lt.get("near-empty")
        print("\nLarge table (claim: mean of single claims, median of 3 rounds; counts: mean of "
              "5; ratio to the near-empty table):")
        for name, e in lt.items():
            ratio = e["claim_ms"]["median"] / base["claim_ms"]["median"] if base else None
            print(f"  {name:28} claim {e['claim_ms']['median']:6.2f} ms ({fmt(ratio, '.2f')}x)"
                  f"  [{e['table_size']}]")
            for label, ms in e["counts_ms"].items():
                r = ms / base["counts_ms"][label] if base else None
                print(f"      {label:44} {ms:8.1f} ms ({fmt(r, '.1f')}x)")
    if "long run" in results:
        r = results["long run"]
        print(f"\nLong run, {r['tasks']:,} tasks, {r['config']}: {r['rate']:.0f} tasks/s, "
              f"{r['cpu_us_per_task']:.0f} us CPU/task; worker RSS idle {r['rss_idle_mb']:.1f} "
              f"MB, at 10% {r['rss_at_10pct_mb']:.1f}, at 50% {r['rss_at_50pct_mb']:.1f}, at "
              f"the end {r['rss_end_mb']:.1f} MB (max {r['rss_max_mb']:.1f})")
    if results.get("targets"):
        print("\nTargets:")
        for t in results["targets"]:
            print(f"  [{t['status']:^12}] {t['target']}\n                 {t['measured']}")
    if "profile" in results:
        for label, p in results["profile"].items():
            if "self_pct" not in p:
                continue
            print(f"\npy-spy, django-pgtasks {label} ({p['samples']} samples), "
                  "top functions by self time:")
            for name, pct in p["self_pct"][:12]:
                print(f"  {pct:5.1f}%  {name}")


# -- main --------------------------------------------------------------------------------------


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for flags and options without one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False):
            return action.help or ""
        return super()._get_help_string(action)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark django-pgtasks against the raw-SQL ceiling, procrastinate and "
                    "django-tasks-db on one PostgreSQL server; print a table and save JSON.",
        formatter_class=_DefaultsFormatter,
        epilog="Configurations are PxC (P worker processes x C threads or concurrent jobs "
               "each), PxC+F (F = --prefetch), P@I (django-tasks-db: P processes, "
               "--interval I) or 'default' (the system's own defaults). See "
               "docs/performance.md.")
    p.add_argument("--only", default=",".join(DEFAULT_SECTIONS),
                   help=f"comma-separated sections to run, from: {', '.join(SECTIONS)}")
    p.add_argument("--long", action="store_true",
                   help="also run the long memory run (--long-tasks tasks; takes minutes)")
    p.add_argument("--profile", action="store_true",
                   help="also profile django-pgtasks workers with py-spy")
    p.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    p.add_argument("--tasks", type=int, default=10_000,
                   help="tasks per drain for django-pgtasks and the raw ceiling "
                        "(the raw batch-50 ceiling drains 5x as many)")
    p.add_argument("--peer-tasks", type=int, default=5_000, help="tasks per peer drain")
    p.add_argument("--max-drain-seconds", type=float, default=4.0,
                   help="a drain still running after this long is stopped, and its rate "
                        "taken from the tasks finished by then")
    p.add_argument("--pgtasks", default="default,1x1,1x2,1x8,1x8+42,2x8,2x8+42,2x32",
                   type=lambda s: s.split(","), help="django-pgtasks configurations")
    p.add_argument("--pgqueuer", default="default,1x50,2x50", type=lambda s: s.split(","),
                   help="pgqueuer configurations: PxB = P processes, batch_size B "
                        "(async no-op entrypoint)")
    p.add_argument("--startup-runs", type=int, default=5,
                   help="worker starts timed per --processes value in the startup section")
    p.add_argument("--startup-processes", default="1,2", type=lambda s: s.split(","),
                   help="--processes values of the startup section")
    p.add_argument("--procrastinate", default="1x1,1x8,2x8", type=lambda s: s.split(","),
                   help="procrastinate configurations (async no-op task)")
    p.add_argument("--djtasks", default="1@0.1,2@0.1", type=lambda s: s.split(","),
                   help="django-tasks-db configurations (db_worker processes @ --interval)")
    p.add_argument("--djtasks-latency", default="default,1@0.1", type=lambda s: s.split(","),
                   help="django-tasks-db configurations for the latency measurement")
    p.add_argument("--latency-samples", type=int, default=100,
                   help="tasks enqueued one by one into an idle worker, per system")
    p.add_argument("--single-enqueues", type=int, default=1_000,
                   help="single enqueues (one transaction each) per run")
    p.add_argument("--bulk-tasks", type=int, default=100_000, help="tasks per bulk enqueue")
    p.add_argument("--large-finished", type=int, default=1_000_000,
                   help="finished rows in the large-table scenario")
    p.add_argument("--large-pending", type=int, default=100_000,
                   help="waiting rows in the large-table scenario")
    p.add_argument("--large-claims", type=int, default=1_000,
                   help="single claims timed per round in the large-table scenario")
    p.add_argument("--long-tasks", type=int, default=1_000_000, help="tasks in the long run")
    p.add_argument("--long-config", default="1x8+42",
                   help="django-pgtasks configuration of the long run (one process; the "
                        "fastest single-process one, so that it takes minutes, not an hour)")
    p.add_argument("--long-sample-every", type=float, default=5.0,
                   help="seconds between two RSS samples in the long run")
    p.add_argument("--long-vacuum-every", type=float, default=30.0,
                   help="seconds between two VACUUM (ANALYZE) of the task table in the long "
                        "run, when the server's autovacuum is off")
    p.add_argument("--profile-configs", default="1x8,1x8+42", type=lambda s: s.split(","),
                   help="django-pgtasks configurations to profile with --profile")
    p.add_argument("--database", default="pgtasks_bench",
                   help="scratch database (created, then dropped)")
    p.add_argument("--output", default=None,
                   help="results file (default: bench/results/<date>-<machine>.json, with the "
                        "sections appended to the name when only some of them run)")
    p.add_argument("--keep-database", action="store_true",
                   help="do not drop the scratch database at the end")
    p.add_argument("--report", metavar="FILE",
                   help="measure nothing: print the report of an earlier results file")
    p.add_argument("--markdown", action="store_true",
                   help="with --report: print the main tables as Markdown")
    args = p.parse_args()
    args.sections = [s for s in args.only.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.long and "long" not in args.sections:
        args.sections.append("long")
    if args.profile and "profile" not in args.sections:
        args.sections.append("profile")
    return args


def setup(args, results: dict) -> None:
    recreate_database(args.database)
    env = child_env(args.database)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0", "--settings",
                    PGTASKS_SETTINGS], cwd=ROOT, env=env, check=True)
    if not {"peers", "latency", "profile"} & set(args.sections):
        return
    try:
        results["machine"]["peers"] = ensure_peers_venv(log)
        subprocess.run([str(peers_python()), "-m", "django", "migrate", "-v0", "--settings",
                        "bench.peers.djtasks_settings"], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        subprocess.run([str(peers_python()), "-m", "pgqueuer", "install"], cwd=ROOT, env=env,
                       check=True, capture_output=True)
        subprocess.run([str(peers_python()), "-m", "procrastinate", "--app",
                        "bench.peers.procrastinate_app.app", "schema", "--apply"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        results["peers_error"] = f"{exc}: {detail.decode(errors='replace')[-2000:]}"
        log(f"The peers could not be installed or set up; they are skipped: "
            f"{results['peers_error']}")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main()'s clean-up


def main() -> int:
    args = parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(markdown_report(saved) if args.markdown else "", end="")
        if not args.markdown:
            print_report(saved)
        return 0
    # Clean up (stop our workers, drop the scratch database) on SIGTERM and on SIGINT, also
    # when started in the background, where SIGINT would otherwise be ignored.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    os.environ["DJANGO_SETTINGS_MODULE"] = PGTASKS_SETTINGS
    os.environ["PGDATABASE"] = args.database
    import django

    django.setup()
    from django.db import connection

    stamp = dt.date.today().isoformat()
    machine = platform.node().split(".")[0] or "machine"
    name = f"{stamp}-{machine}"
    if not set(DEFAULT_SECTIONS) <= set(args.sections):  # a partial run: keep the full one
        name += "-" + "-".join(args.sections)
    output = Path(args.output) if args.output else BENCH_DIR / "results" / f"{name}.json"
    results: dict = {"machine": machine_description(), "started": dt.datetime.now().isoformat(
        timespec="seconds"), "arguments": {k: v for k, v in vars(args).items()}}
    results["machine"]["django"] = django.get_version()
    import psycopg

    results["machine"]["psycopg"] = psycopg.__version__
    log(f"Sections: {', '.join(args.sections)}; scratch database {args.database!r}")
    t_start = time.monotonic()
    try:
        setup(args, results)
        with connect(args.database) as conn:
            results["machine"]["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            results["machine"]["postgresql_settings"] = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
                "'synchronous_commit', 'fsync', 'wal_sync_method', 'max_connections', "
                "'shared_preload_libraries', 'commit_delay', 'autovacuum')").fetchall())
        sections = [s for s in args.sections if s not in DRAIN_SECTIONS]
        if set(args.sections) & set(DRAIN_SECTIONS):
            sections.insert(0, "drains")
        for section in sections:
            log(f"== {section}")
            t0 = time.monotonic()
            try:
                if section == "profile":
                    section_profile(args, results, stamp)
                else:
                    globals()[f"section_{section}"](args, results)
            except Exception as exc:
                traceback.print_exc()
                results[f"{section} error"] = str(exc)
            log(f"   {section} took {time.monotonic() - t0:.0f}s")
            connection.close()
    finally:
        for proc in list(_started):
            stop_process(proc, grace=15)
        connection.close()
        if not args.keep_database:
            drop_database(args.database)
    compare(results)
    results["targets"] = evaluate_targets(results)
    results["duration_s"] = round(time.monotonic() - t_start)
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    output.parent.mkdir(exist_ok=True)
    output.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print_report(results)
    print(f"\nSaved {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output} "
          f"({results['duration_s']}s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
