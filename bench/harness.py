"""What every measurement of bench/run.py shares: its log, the worker processes it starts
and stops, and the CPU the PostgreSQL server spends meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from common import CLK_TCK, exited, stderr_of, stop_process, tree_pids
from systems import Config, System

#: Every process the run started and has not stopped yet (workers, py-spy), stopped by
#: :func:`stop_all` whatever way the run ends.
STARTED: list[subprocess.Popen] = []


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


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
        name, rest = data[data.index("(") + 1 : data.rindex(")")], data.rsplit(")", 1)[1]
        if name != "postgres":
            continue
        fields = rest.split()
        found = True
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if fields[1] == "1" or not _is_postgres(fields[1]):  # the postmaster
            total += int(fields[13]) + int(fields[14])  # cutime, cstime: exited children
    return total / CLK_TCK if found else None


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


def start_workers(
    system: System, config: Config, conn, timeout: float = 60, settle: float = 0.5
) -> list:
    """Start the workers and wait until they are ready, then ``settle`` seconds more for every
    process to reach its idle wait (0: return at once, as on a full queue)."""
    procs = system.start(config)
    STARTED.extend(procs)
    deadline = time.monotonic() + timeout
    while not system.ready(conn, config):
        dead = [p for p in procs if exited(p)]
        if dead or time.monotonic() > deadline:
            errors = " | ".join(stderr_of(p)[-2000:] for p in dead)
            stop_workers(procs)
            raise RuntimeError(f"{system.name} workers did not get ready: {errors or 'timeout'}")
        time.sleep(0.05)
    time.sleep(settle)
    return procs


def stop_workers(procs: list) -> None:
    for p in procs:
        if not exited(p):
            p.send_signal(signal.SIGTERM)
    for p in procs:
        stop_process(p, grace=15)
        if p in STARTED:
            STARTED.remove(p)


def all_pids(procs: list) -> list[int]:
    return [pid for p in procs for pid in tree_pids(p.pid)]


def stop_all() -> None:
    """Stop every process of :data:`STARTED` still there (the run's final clean-up)."""
    for proc in list(STARTED):
        stop_process(proc, grace=15)
