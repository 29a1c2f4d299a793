"""py-spy profiles of django-pgtasks workers during a drain, summed up per function and
thread. (Not ``profile``: that is a module of the standard library.)"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import BENCH, ROOT, connect, peers_python, wait_process
from harness import STARTED, log, start_workers, stop_workers
from systems import Config, PgTasks


def section_profile(args, results: dict, stamp: str) -> None:
    """py-spy (from the peers' venv) on a django-pgtasks worker during one drain.

    ``--gil`` samples only the thread holding the GIL, so the shares are of the Python CPU
    time of the worker, the resource its throughput is bound by."""
    pyspy = peers_python().parent / "py-spy"
    pg = PgTasks(args.database, sys.executable)
    profiles = {}
    for text in args.profile_configs:
        config = Config.parse(text)
        out = BENCH / "results" / f"{stamp}-pyspy-{config.label(4)}.collapsed"
        with connect(args.database) as conn:
            pg.reset(conn)
            procs = start_workers(pg, config, conn)
            try:
                spy = subprocess.Popen(
                    [
                        str(pyspy),
                        "record",
                        "--pid",
                        str(procs[0].pid),
                        "--subprocesses",
                        "--threads",
                        "--gil",
                        "--nonblocking",
                        "--rate",
                        "250",
                        "--format",
                        "raw",
                        "--output",
                        str(out),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                STARTED.append(spy)
                time.sleep(2)
                pg.seed(conn, args.tasks[0])
                while pg.remaining(conn):
                    time.sleep(0.2)
                spy.send_signal(signal.SIGINT)
                wait_process(spy, timeout=30)
                STARTED.remove(spy)
            finally:
                stop_workers(procs)
            done, seconds = pg.window(conn)
        profiles[config.label(4)] = {
            "rate": done / seconds,
            "file": out.name,
            **summarize_profile(out),
        }
        log(
            f"  profile {config.label(4)}: {done / seconds:.0f} tasks/s under py-spy, "
            f"written to {out.relative_to(ROOT)}"
        )
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
        funcs = [
            re.sub(r":\d+\)$", ")", f) for f in frames if not f.startswith(("process", "thread"))
        ]
        if funcs:
            own[funcs[-1]] = own.get(funcs[-1], 0) + n
        for f in set(funcs):
            incl[f] = incl.get(f, 0) + n

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [
            (k, round(v / total * 100, 1))
            for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]
        ]

    return {
        "samples": total,
        "self_pct": share(own),
        "inclusive_pct": share(incl),
        "threads_pct": share(threads),
    }
