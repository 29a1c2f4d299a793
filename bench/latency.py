"""Wake-up latency: tasks enqueued one by one into an idle worker, the time from each
enqueue to its start, for django-pgtasks and the peers."""

from __future__ import annotations

import random
import statistics
import sys
import time

from common import connect, largest_rss_mb, percentile
from harness import log, start_workers, stop_workers
from systems import Config, DjTasksDb, PgQueuer, PgTasks, Procrastinate, System


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
    return {
        "samples": len(values),
        "median_ms": statistics.median(values),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
        "min_ms": min(values),
        "idle_rss_mb": rss,
    }


def section_latency(args, results: dict) -> None:
    candidates: list[tuple[System, str]] = [(PgTasks(args.database, sys.executable), "default")]
    if "peers_error" not in results:
        candidates += [
            (PgQueuer(args.database), "default"),
            (Procrastinate(args.database), "default"),
        ]
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
        log(
            f"  latency {key}: median {res['median_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms "
            f"over {res['samples']}"
        )
