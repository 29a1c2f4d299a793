"""The overhead per task of each execution pool: the thread, process and async pools.

For each pool and each kind of task (a no-op, and a 10 ms sleep; as ``async def`` handlers
on the async pool, which runs them as coroutines, plain functions elsewhere), N tasks are
inserted at
once and drained by one worker process, ``run_pgtasks --burst --processes 1 --pool <pool>
--concurrency C`` (``PROCESSES`` "auto" would start one per CPU); the drain's span is
taken from the database (the first task's start to the last one's finish). The time a slot
spends per task is ``span * C / N``; the overhead per task is that minus what the handler
itself takes (0 or 10 ms). The CPU per task is that of the worker and all its processes
(children and fork server), from ``getrusage`` of the waited-for worker, start-up included.

    python bench/pools.py [--tasks 3000] [--concurrency 2] [--rounds 3] [--output FILE]

It uses a scratch database, ``pgtasks_bench_pools_<pid>``, on the server of the ``PG*`` variables
(else localhost:5432 as postgres), dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import PGTASKS_SETTINGS, ROOT, child_env, connect, drop_database, recreate_database

DATABASE = f"pgtasks_bench_pools_{os.getpid()}"
#: (label, the handler's own time in ms, {pool: (task name, args as JSON)})
SYNC = {"no-op": ("bench.noop", "[]"), "10 ms": ("bench.sleep", "[10]")}
ASYNC = {"no-op": ("bench.async_noop", "[]"), "10 ms": ("bench.await_sleep", "[0.01]")}
KINDS = [(label, own_ms, {"thread": SYNC[label], "process": SYNC[label],
                          "async": ASYNC[label]})
         for label, own_ms in (("no-op", 0.0), ("10 ms", 10.0))]
POOLS = ("thread", "process", "async")


def django(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "django", *args, "--settings",
                           PGTASKS_SETTINGS], env=child_env(DATABASE), cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-5000:]}")
    return done


def drain(pool: str, name: str, args: str, n: int, concurrency: int) -> dict[str, float]:
    with connect(DATABASE) as conn:
        conn.execute("TRUNCATE pgtasks_task, pgtasks_worker")
        conn.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata) SELECT %s, 'default', %s::jsonb, '{}', 100, "
            "'READY', 0, 3, '', '{}' FROM generate_series(1, %s)", [name, args, n])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        django("run_pgtasks", "--burst", "--processes", "1", "--pool", pool,
               "--concurrency", str(concurrency), "--log-level", "WARNING")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        done, span = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgtasks_task"
        ).fetchone()
    if done != n:
        raise RuntimeError(f"{pool}: {done} of {n} tasks succeeded")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rate": n / float(span), "slot_ms": float(span) * concurrency / n * 1000,
            "cpu_ms": cpu / n * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None,
                        help="write the table (Markdown) to this file too")
    args = parser.parse_args()
    recreate_database(DATABASE)
    try:
        django("migrate", "-v0")
        rows = []
        for label, own_ms, handlers in KINDS:
            n = args.tasks if own_ms == 0 else max(args.tasks // 3, 100)
            results: dict[str, list[dict[str, float]]] = {pool: [] for pool in POOLS}
            for _ in range(args.rounds):  # interleaved, so that a busy moment hits both
                for pool in POOLS:
                    results[pool].append(drain(pool, *handlers[pool], n, args.concurrency))
            for pool in POOLS:
                med = {key: statistics.median(r[key] for r in results[pool])
                       for key in ("rate", "slot_ms", "cpu_ms")}
                rows.append((label, pool, n, med["rate"], med["slot_ms"],
                             med["slot_ms"] - own_ms, med["cpu_ms"]))
                print(f"{label:6} {pool:8} {med['rate']:8.0f} tasks/s  "
                      f"{med['slot_ms']:6.2f} ms/task/slot  overhead {med['slot_ms'] - own_ms:6.2f}"
                      f" ms  cpu {med['cpu_ms']:5.2f} ms/task", flush=True)
    finally:
        drop_database(DATABASE)
    table = [
        f"Measured {time.strftime('%Y-%m-%d')} by `python bench/pools.py --tasks {args.tasks} "
        f"--concurrency {args.concurrency} --rounds {args.rounds}` on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; medians of "
        f"{args.rounds} interleaved rounds.",
        "",
        "| task | pool | tasks | tasks/s | ms per task per slot | overhead per task (ms) "
        "| CPU per task (ms) |",
        "|---|---|---:|---:|---:|---:|---:|",
        *(f"| {label} | {pool} | {n} | {rate:,.0f} | {slot:.2f} | {over:.2f} | {cpu:.2f} |"
          for label, pool, n, rate, slot, over, cpu in rows),
    ]
    if args.output:
        args.output.write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
