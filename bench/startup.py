"""Start-up: from starting ``run_pgtasks`` to its first task running, with tasks waiting."""

from __future__ import annotations

import statistics
import sys
import time

from common import connect, exited, stderr_of
from harness import STARTED, log, stop_workers
from systems import Config, PgTasks


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
                STARTED.extend(procs)
                try:
                    deadline = time.monotonic() + 60
                    while True:
                        first = conn.execute(
                            "SELECT min(started_at) FROM pgtasks_task WHERE started_at IS NOT NULL"
                        ).fetchone()[0]
                        if first is not None:
                            break
                        if time.monotonic() > deadline or any(exited(p) for p in procs):
                            raise RuntimeError(
                                "no task started: "
                                + " | ".join(stderr_of(p)[-1000:] for p in procs)
                            )
                        time.sleep(0.01)
                finally:
                    stop_workers(procs)
                times.append((first - t0).total_seconds())
        key = f"--processes {text}"
        out[key] = {
            "runs": [round(t, 3) for t in times],
            "median_s": statistics.median(times),
            "max_s": max(times),
        }
        log(
            f"  start-up, {key}: first task running after {statistics.median(times):.2f} s "
            f"(median of {len(times)}, max {max(times):.2f} s)"
        )
    results["startup"] = out
