"""The long run: one worker process through ``--long-tasks`` tasks, its memory over time."""

from __future__ import annotations

import os
import sys
import time

from common import connect, exited, largest_rss_mb, proc_cpu_s
from harness import all_pids, log, start_workers, stop_workers
from systems import Config, PgTasks


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
                samples.append(
                    {
                        "t": round(time.monotonic() - t0, 1),
                        "done": n - left,
                        "rss_mb": round(largest_rss_mb(procs[0].pid), 1),
                    }
                )
                if not left:
                    break
                if time.monotonic() > next_log:
                    next_log += 60
                    log(
                        f"  long run: {n - left:,} done, RSS {samples[-1]['rss_mb']} MB, "
                        f"load {os.getloadavg()[0]:.1f}"
                    )
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
        "tasks": n,
        "config": config.label(4),
        "rate": done / seconds,
        "cpu_us_per_task": cpu_s / n * 1e6,
        "rss_idle_mb": rss0,
        "rss_at_10pct_mb": rss_at(0.1),
        "rss_at_50pct_mb": rss_at(0.5),
        "rss_end_mb": samples[-1]["rss_mb"],
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "server_autovacuum": autovacuum,
        "manual_vacuums_s": vacuums,
        "samples": samples,
    }
    r = results["long run"]
    log(
        f"  long run: {r['rate']:.0f} tasks/s; RSS idle {rss0:.1f} MB, at 10% "
        f"{r['rss_at_10pct_mb']:.1f} MB, at 50% {r['rss_at_50pct_mb']:.1f} MB, end "
        f"{r['rss_end_mb']:.1f} MB"
    )
