"""What durable sleeps and waits for events cost, and how fast a sent event wakes its task.

1. **Sleeps.** N tasks that each sleep S seconds, drained by ``run_pgtasks --burst
   --concurrency C``: with a thread-held sleep (``time.sleep``) the drain takes N x S / C;
   with a durable sleep (``context.sleep``) each task's run ends at the sleep and the task
   runs again after S, holding no thread meanwhile. The drain's span comes from the
   database (first start to last finish). The cost of a durable sleep itself (its
   checkpoint, the suspension, the second claim) is measured on tasks that sleep 1 ms
   (due again at once): the time a slot spends per task over a no-op task's.
2. **Wake-ups.** M tasks wait for an event each (suspended) while a worker runs
   (``run_pgtasks --concurrency C``, listening); the events are sent one at a time, each
   after the previous task finished. The wake-up is the time from the send to the task's
   next start, both on the database clock (the event's ``sent_at``, the claim's
   ``started_at``); the end-to-end time adds the run that returns the payload.

    python bench/durable.py [--tasks 40] [--seconds 1] [--events 100] [--concurrency 2]
                            [--output FILE]

It uses the scratch database of bench/pools.py (made and dropped here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pools
from common import PGTASKS_SETTINGS, ROOT, child_env, connect, drop_database, recreate_database


def insert(conn, name: str, args: list, n: int) -> None:
    conn.execute(
        "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
        "max_attempts, error_text, metadata) SELECT %s, 'default', %s::jsonb, '{}', 100, "
        "'READY', 0, 3, '', '{}' FROM generate_series(1, %s)", [name, json.dumps(args), n])


def run(name: str, args: list, n: int, concurrency: int) -> float:
    """Insert ``n`` tasks, run a worker until all succeeded (a burst worker would stop at the
    first sleep: nothing is due then), return the span from the first start to the last
    finish (database clock)."""
    with connect(pools.DATABASE) as conn:
        conn.execute("TRUNCATE pgtasks_task, pgtasks_worker")
        insert(conn, name, args, n)
        with worker(concurrency):
            until(conn, "SELECT count(*) = %s FROM pgtasks_task WHERE status = 'SUCCESSFUL'",
                  [n], timeout=600)
        # A task that slept started twice: its first start is its sleep's time ("at").
        return float(conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - least(min(started_at), "
            "min((steps -> 0 ->> 'at')::timestamptz))) FROM pgtasks_task").fetchone()[0])


@contextlib.contextmanager
def worker(concurrency: int) -> Iterator[None]:
    """A worker (``run_pgtasks``) running meanwhile."""
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "run_pgtasks", "--processes", "1", "--concurrency",
         str(concurrency), "--log-level", "WARNING", "--settings", PGTASKS_SETTINGS],
        env=child_env(pools.DATABASE), cwd=ROOT)
    try:
        yield
    finally:
        process.terminate()
        process.wait(60)


def sleeps(n: int, seconds: float, concurrency: int) -> list[tuple[str, float]]:
    """The span of draining ``n`` tasks that sleep ``seconds`` each, thread-held and
    durable."""
    spans = []
    for label, name, args in (("time.sleep (holds its thread)", "bench.sleep", [seconds * 1000]),
                              ("context.sleep (durable)", "bench.durable_sleep", [seconds])):
        spans.append((label, run(name, args, n, concurrency)))
        print(f"{n} tasks sleeping {seconds:g} s, {label}: {spans[-1][1]:.2f} s", flush=True)
    return spans


def wake_ups(m: int, concurrency: int) -> dict[str, float]:
    """Medians and 95th percentiles (ms) of the wake-up and end-to-end times of ``m``
    events sent one at a time to a running worker."""
    with connect(pools.DATABASE) as conn:
        conn.execute("TRUNCATE pgtasks_task, pgtasks_worker, pgtasks_event")
        conn.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata) SELECT 'bench.wait_for_event', 'default', "
            "jsonb_build_array('k' || i), '{}', 100, 'READY', 0, 3, '', '{}' "
            "FROM generate_series(1, %s) AS i", [m])
        with worker(concurrency):
            until(conn, "SELECT count(*) = %s FROM pgtasks_task WHERE awaited_event IS NOT NULL "
                        "AND status = 'READY'", [m])
            for i in range(1, m + 1):
                send(conn, f"k{i}")
                until(conn, "SELECT status = 'SUCCESSFUL' FROM pgtasks_task "
                            "WHERE args ->> 0 = %s", [f"k{i}"])
        rows = conn.execute(
            "SELECT extract(epoch FROM t.started_at - e.sent_at) * 1000, "
            "extract(epoch FROM t.finished_at - e.sent_at) * 1000 "
            "FROM pgtasks_task t JOIN pgtasks_event e ON e.key = t.args ->> 0").fetchall()
    wake = sorted(float(r[0]) for r in rows)
    end = sorted(float(r[1]) for r in rows)
    return {"wake_median": statistics.median(wake), "wake_p95": wake[int(len(wake) * 0.95) - 1],
            "end_median": statistics.median(end), "end_p95": end[int(len(end) * 0.95) - 1]}


def send(conn, key: str) -> None:
    """Send the event ``key`` as ``Task.objects.send_event`` does (lifecycle/events.py), in
    one transaction of this connection."""
    sys.path.insert(0, str(ROOT))
    from django_pgtasks.lifecycle.events import LOCK_SQL, SEND_SQL

    with conn.transaction():
        conn.execute(LOCK_SQL, {"key": key})
        conn.execute(SEND_SQL, {"key": key, "payload": json.dumps(key)})


def until(conn, sql: str, params: list, timeout: float = 120) -> None:
    """Poll ``sql`` (every 2 ms) until it returns true."""
    end = time.monotonic() + timeout
    while not conn.execute(sql, params).fetchone()[0]:
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for: {sql}")
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--cost-tasks", type=int, default=2000)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None,
                        help="write the table (Markdown) to this file too")
    args = parser.parse_args()
    recreate_database(pools.DATABASE)
    try:
        pools.django("migrate", "-v0")
        spans = sleeps(args.tasks, args.seconds, args.concurrency)
        noop = run("bench.noop", [], args.cost_tasks, args.concurrency)
        slept = run("bench.durable_sleep", [0.001], args.cost_tasks, args.concurrency)
        noop_ms = noop * args.concurrency / args.cost_tasks * 1000
        sleep_slot_ms = slept * args.concurrency / args.cost_tasks * 1000
        cost_ms = sleep_slot_ms - noop_ms
        print(f"a durable sleep costs {cost_ms:.2f} ms of a slot "
              f"(no-op task {noop_ms:.2f} ms)", flush=True)
        wake = wake_ups(args.events, args.concurrency)
        print(f"wake-up median {wake['wake_median']:.1f} ms, p95 {wake['wake_p95']:.1f} ms; "
              f"end to end median {wake['end_median']:.1f} ms, p95 {wake['end_p95']:.1f} ms",
              flush=True)
    finally:
        drop_database(pools.DATABASE)
    table = [
        f"Measured {time.strftime('%Y-%m-%d')} by `python bench/durable.py --tasks {args.tasks} "
        f"--seconds {args.seconds:g} --cost-tasks {args.cost_tasks} --events {args.events} "
        f"--concurrency {args.concurrency}` on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; thread pool.",
        "",
        f"| {args.tasks} tasks sleeping {args.seconds:g} s, concurrency {args.concurrency} "
        f"| drain (s) |",
        "|---|---:|",
        *(f"| {label} | {span:.2f} |" for label, span in spans),
        "",
        "| cost of one durable sleep (checkpoint, suspension, second claim) "
        "| ms of a slot |",
        "|---|---:|",
        f"| a no-op task | {noop_ms:.2f} |",
        f"| a task that sleeps durably for 1 ms | {sleep_slot_ms:.2f} |",
        f"| the sleep | {cost_ms:.2f} |",
        "",
        f"| {args.events} events sent one at a time to a running worker | median (ms) "
        f"| p95 (ms) |",
        "|---|---:|---:|",
        f"| send to the task's next start | {wake['wake_median']:.1f} | {wake['wake_p95']:.1f} |",
        f"| send to the task's end | {wake['end_median']:.1f} | {wake['end_p95']:.1f} |",
    ]
    if args.output:
        args.output.write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
