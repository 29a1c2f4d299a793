"""Helpers shared by the benchmark scripts: scratch database, processes, statistics.

Everything here runs in the project's virtualenv. The peers run in ``bench/.venv-peers``,
which :func:`ensure_peers_venv` creates and fills from ``bench/requirements-peers.txt``.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEERS_VENV = BENCH / ".venv-peers"
PEERS_REQUIREMENTS = BENCH / "requirements-peers.txt"
PGTASKS_SETTINGS = "bench.pgtasks_site.settings"
DJTASKS_SETTINGS = "bench.peers.djtasks_settings"
PROCRASTINATE_APP = "bench.peers.procrastinate_app.app"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


# -- database --------------------------------------------------------------------------------


def server_params() -> dict[str, str]:
    """libpq parameters of the server (``PG*`` variables, else localhost:5432 as postgres)."""
    return {
        "host": os.environ.get("PGHOST", "localhost"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        **({"password": os.environ["PGPASSWORD"]} if os.environ.get("PGPASSWORD") else {}),
    }


def connect(dbname: str, autocommit: bool = True):
    import psycopg

    return psycopg.connect(**server_params(), dbname=dbname, autocommit=autocommit)


def recreate_database(name: str) -> None:
    with connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with connect("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def child_env(dbname: str, **extra: str) -> dict[str, str]:
    """Environment of a child process: the scratch database through libpq's variables."""
    env = {**os.environ, "PGDATABASE": dbname, "PYTHONPATH": str(ROOT), **extra}
    for key, value in server_params().items():
        env[f"PG{key.upper()}"] = value
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


# -- the peers' virtualenv -------------------------------------------------------------------


def peers_python() -> Path:
    return PEERS_VENV / "bin" / "python"


def ensure_peers_venv(log=print) -> dict[str, str]:
    """Create/refresh bench/.venv-peers from requirements-peers.txt; return installed versions.

    Reinstalls only when the requirements file changed since the last install.
    """
    wanted = hashlib.sha256(PEERS_REQUIREMENTS.read_bytes()).hexdigest()
    stamp = PEERS_VENV / ".requirements.sha256"
    if not (stamp.exists() and stamp.read_text() == wanted and peers_python().exists()):
        log(f"Creating {PEERS_VENV.relative_to(ROOT)} (the peers' virtualenv)...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
        subprocess.run([str(peers_python()), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", "-r", str(PEERS_REQUIREMENTS)],
                       check=True)
        stamp.write_text(wanted)
    out = subprocess.run(
        [str(peers_python()), "-c",
         "import importlib.metadata as m\n"
         "for n in ('pgqueuer', 'asyncpg', 'procrastinate', 'django-tasks-db', "
         "'django-tasks', 'Django', 'psycopg', 'py-spy'):\n"
         "    print(n, m.version(n))"],
        check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


# -- processes -------------------------------------------------------------------------------


@dataclass
class ProcResult:
    """What a finished child process cost: CPU of its whole tree, and its peak memory."""

    returncode: int
    cpu_s: float  # user + system of the process and every descendant it waited for
    maxrss_mb: float  # peak RSS of the largest single process in that tree
    rss_samples: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MB)
    stderr: str = ""


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc/<pid>/task/*/children."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KB / 1024
    except OSError:
        return 0.0


def largest_rss_mb(pid: int) -> float:
    """RSS of the largest process in the tree of ``pid`` (a worker, not its supervisor)."""
    return max((rss_mb(p) for p in tree_pids(pid)), default=0.0)


def wait_process(proc: subprocess.Popen, sample_every: float = 0.0,
                 timeout: float | None = None) -> ProcResult:
    """Wait for ``proc`` with ``wait4``, to get the CPU and peak RSS of its whole tree.

    With ``sample_every`` > 0, also record the largest RSS in the tree at that period.
    """
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    started = time.monotonic()

    def sampler() -> None:
        while not done.wait(sample_every):
            samples.append((time.monotonic() - started, largest_rss_mb(proc.pid)))

    thread = None
    if sample_every > 0:
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
    deadline = None if timeout is None else started + timeout
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
    except ChildProcessError:  # reaped elsewhere already: nothing more to learn
        done.set()
        return ProcResult(proc.returncode or 0, 0.0, 0.0, samples, stderr_of(proc))
    done.set()
    if thread is not None:
        thread.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ProcResult(proc.returncode, usage.ru_utime + usage.ru_stime,
                      usage.ru_maxrss / 1024, samples, stderr_of(proc))


def stderr_of(proc: subprocess.Popen, limit: int = 4000) -> str:
    """The end of what ``proc`` wrote to its stderr (a pipe or a temporary file)."""
    f = proc.stderr
    if f is None:
        return ""
    try:
        if f.seekable():
            f.seek(0)
        return f.read().decode(errors="replace")[-limit:]
    except (OSError, ValueError):
        return ""


def exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it (``poll()`` would, and then ``wait4``
    could no longer tell what it cost)."""
    if proc.returncode is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def proc_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (all their threads), from /proc."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / CLK_TCK


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> ProcResult:
    """SIGTERM ``proc`` (a worker we started) and wait for it; SIGKILL after ``grace``."""
    if not exited(proc):
        proc.terminate()
    return wait_process(proc, timeout=grace)


# -- statistics ------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of repeated measurements (and how many)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "runs": len(values)}


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile, ``p`` in [0, 100]."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


def machine_description() -> dict[str, object]:
    import platform

    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next(line.split(":", 1)[1].strip() for line in f
                             if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }
