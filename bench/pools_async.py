"""The async pool on an I/O-bound workload, against the thread pool and pgqueuer.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/pools_async.py [--workloads 2000x0.05,5000x1] [--concurrency 500]
                                          [--repeat 3] [--markdown bench/results/pools_async.md]

A workload ``NxS``: N tasks that each wait S seconds without blocking (``await
asyncio.sleep(S)``), inserted at once into an empty queue watched by one warm worker process.
One process running ``--concurrency`` tasks at once can at best drain them in
``N * S / concurrency`` seconds; what it takes beyond that is the queue's own cost. Short
waits show that cost per task; long ones how close to the ideal a drain gets.

The systems, each one worker process on the same scratch database
(``pgtasks_bench_pools_async``, dropped at the end):

- django-pgtasks ``run_pgtasks --pool async --concurrency C``: one event loop, C coroutines;
- django-pgtasks ``run_pgtasks --pool thread --concurrency C``: C threads, each running its
  handler on an event loop of its own (``async_to_sync``), the way before the async pool;
- pgqueuer (1.6, asyncpg; bench/peers/pgqueuer_app.py, installed in bench/.venv-peers like
  bench/run.py does) with ``max_concurrent_tasks = C`` and a batch of C / 5 (it requires a cap
  of at least twice the batch), and at its defaults (batch 10, no cap).

Each drain gives the rate (tasks over the span from the first start to the last finish, as the
database recorded them), the share of the ideal rate (``C / S``), the worker's CPU per
task, its peak RSS and the most database sessions it held during the drain. Every figure is the
median of ``--repeat`` drains, run in interleaved rounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from common import (  # noqa: E402
    PGTASKS_SETTINGS,
    ROOT,
    child_env,
    connect,
    drop_database,
    ensure_peers_venv,
    exited,
    largest_rss_mb,
    peers_python,
    proc_cpu_s,
    recreate_database,
    stderr_of,
)
from harness import STARTED, all_pids, log, stop_all, stop_workers  # noqa: E402
from systems import PGQUEUER_APP, Config, PgQueuer, PgTasks  # noqa: E402

DATABASE = "pgtasks_bench_pools_async"


@dataclass
class Drain:
    """One drain of one system: a worker process started on an empty queue, N tasks seeded."""

    label: str
    system: PgTasks | PgQueuer
    command: list[str]
    #: Whether it runs at most --concurrency tasks at once (else no ideal applies).
    capped: bool = True
    runs: list[dict] = field(default_factory=list)


class SleepingPgTasks(PgTasks):
    """django-pgtasks with ``bench.await_sleep`` tasks."""

    def __init__(self, dbname: str, seconds: float) -> None:
        super().__init__(dbname, sys.executable)
        self.seconds = seconds

    def seed(self, conn, n: int) -> None:
        conn.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata) SELECT 'bench.await_sleep', 'default', "
            "jsonb_build_array(%s::float), '{}', 100, 'READY', 0, 3, '', '{}' "
            "FROM generate_series(1, %s)", [self.seconds, n])


class SleepingPgQueuer(PgQueuer):
    """pgqueuer with ``sleep`` jobs (the payload is the seconds to wait)."""

    def __init__(self, dbname: str, seconds: float) -> None:
        super().__init__(dbname)
        self.seconds = seconds

    def seed(self, conn, n: int) -> None:
        conn.execute("INSERT INTO pgqueuer (priority, status, entrypoint, payload) "
                     "SELECT 0, 'queued', 'sleep', convert_to(%s, 'UTF8') "
                     "FROM generate_series(1, %s)", [repr(self.seconds), n])


def drains(args, seconds: float) -> list[Drain]:
    c = args.concurrency
    pgtasks = SleepingPgTasks(DATABASE, seconds)
    base = [sys.executable, "-m", "django", "run_pgtasks", "--settings", PGTASKS_SETTINGS,
            "--log-level", "WARNING", "--processes", "1", "--concurrency", str(c)]
    plan = [Drain(f"django-pgtasks --pool async, {c} coroutines", pgtasks,
                  [*base, "--pool", "async"]),
            Drain(f"django-pgtasks --pool thread, {c} threads", pgtasks,
                  [*base, "--pool", "thread"])]
    if not args.no_peers:
        pgqueuer = SleepingPgQueuer(DATABASE, seconds)
        batch = max(c // 5, 1)
        plan += [
            Drain(f"pgqueuer, max_concurrent_tasks {c}, batch {batch}", pgqueuer,
                  [str(peers_python()), "-m", PGQUEUER_APP, "--batch-size", str(batch),
                   "--max-concurrent-tasks", str(c)]),
            Drain("pgqueuer defaults (batch 10, no cap)", pgqueuer,
                  [str(peers_python()), "-m", PGQUEUER_APP], capped=False),
        ]
    return plan


def start(drain: Drain) -> subprocess.Popen:
    import tempfile

    errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
    proc = subprocess.Popen(drain.command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors,
                            env=child_env(DATABASE, PGAPPNAME=drain.system.app_name))
    proc.stderr = errors  # read back by common.stderr_of()
    STARTED.append(proc)
    return proc


def sessions(conn, app_name: str) -> int:
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                        "application_name = %s", [DATABASE, app_name]).fetchone()[0]


def drain_once(drain: Drain, n: int, timeout: float) -> dict:
    system = drain.system
    with connect(DATABASE) as conn:
        system.reset(conn)
        proc = start(drain)
        try:
            deadline = time.monotonic() + 60
            while not system.ready(conn, Config()):
                if exited(proc) or time.monotonic() > deadline:
                    raise RuntimeError(f"{drain.label}: the worker did not get ready: "
                                       f"{stderr_of(proc)[-2000:]}")
                time.sleep(0.05)
            time.sleep(0.5)  # let the process reach its idle wait
            pids = all_pids([proc])
            cpu0 = proc_cpu_s(pids)
            t0 = time.monotonic()
            system.seed(conn, n)
            peak = 0
            while system.remaining(conn):
                peak = max(peak, sessions(conn, system.app_name))
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"{drain.label}: not drained within {timeout:g}s")
                if exited(proc):
                    raise RuntimeError(f"{drain.label}: the worker exited: "
                                       f"{stderr_of(proc)[-2000:]}")
                time.sleep(0.02)
            cpu = proc_cpu_s(all_pids([proc])) - cpu0
            rss = largest_rss_mb(proc.pid)
        finally:
            stop_workers([proc])
        done, seconds = system.window(conn)
    if done < n:
        raise RuntimeError(f"{drain.label}: {done} of {n} tasks succeeded")
    return {"rate": done / seconds, "seconds": seconds, "cpu_us_per_task": cpu / done * 1e6,
            "rss_mb": rss, "sessions": peak, "loadavg": os.getloadavg()[0]}


def setup(args) -> dict[str, str]:
    recreate_database(DATABASE)
    env = child_env(DATABASE)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0", "--settings",
                    PGTASKS_SETTINGS], cwd=ROOT, env=env, check=True)
    if args.no_peers:
        return {}
    versions = ensure_peers_venv(log)
    subprocess.run([str(peers_python()), "-m", "pgqueuer", "install"], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    return versions


def header(args, versions: dict[str, str]) -> list[str]:
    return [
        f"# bench/pools_async.py, {dt.date.today().isoformat()} ({os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"pgqueuer {versions.get('pgqueuer', '-')}; other work on the machine)",
        "",
        "```text",
        "$ python bench/pools_async.py " + " ".join(sys.argv[1:]),
        "```",
        "",
    ]


def report(args, n: int, seconds: float, plan: list[Drain]) -> list[str]:
    ideal = args.concurrency / seconds
    loads = [r["loadavg"] for drain in plan for r in drain.runs] or [0.0]
    lines = [
        f"## {n:,} tasks of `await asyncio.sleep({seconds:g})`",
        "",
        f"One worker process, {args.concurrency} tasks at once: at best "
        f"{n * seconds / args.concurrency:.2f} s, {ideal:,.0f} tasks/s. Medians of "
        f"{args.repeat} drains, interleaved; the machine's load average during them "
        f"{min(loads):.1f} to {max(loads):.1f}.",
        "",
        "| system | tasks/s | drain (s) | of ideal | worker CPU/task | worker RSS | "
        "sessions |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for drain in plan:
        if not drain.runs:
            lines.append(f"| {drain.label} | failed | | | | | |")
            continue

        def med(key: str, runs: list[dict] = drain.runs) -> float:
            return statistics.median(r[key] for r in runs)

        share = f"{med('rate') / ideal:.0%}" if drain.capped else "no cap"
        lines.append(
            f"| {drain.label} | {med('rate'):,.0f} | {med('seconds'):.2f} | {share} | "
            f"{med('cpu_us_per_task'):,.0f} us | {med('rss_mb'):.0f} MB | "
            f"{max(r['sessions'] for r in drain.runs)} |")
    lines.append("")
    return lines


FOOTER = [
    "Sessions: the most the worker process held on the database during a drain "
    "(pg_stat_activity by application_name). Worker CPU: user + system time of the worker "
    "process over the drain, per task.",
    "",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    p.add_argument("--workloads", default="2000x0.05,5000x1",
                   help="comma-separated NxS: N tasks that each wait S seconds")
    p.add_argument("--concurrency", type=int, default=500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300, help="longest drain, in seconds")
    p.add_argument("--no-peers", action="store_true", help="django-pgtasks only")
    p.add_argument("--markdown", help="also write the tables to this file")
    args = p.parse_args()
    workloads = [(int(n), float(seconds)) for n, _, seconds in
                 (text.partition("x") for text in args.workloads.split(","))]
    text = []
    try:
        versions = setup(args)
        text = header(args, versions)
        for n, seconds in workloads:
            plan = drains(args, seconds)
            for round_ in range(args.repeat):
                log(f"{n} x {seconds:g} s: round {round_ + 1} of {args.repeat}")
                for drain in plan:
                    try:
                        run = drain_once(drain, n, args.timeout)
                    except RuntimeError as exc:
                        log(f"  {drain.label}: {exc}")
                        continue
                    drain.runs.append(run)
                    log(f"  {drain.label:52} {run['rate']:7,.0f} tasks/s  "
                        f"{run['seconds']:6.2f} s  {run['cpu_us_per_task']:6,.0f} us CPU/task  "
                        f"{run['rss_mb']:4.0f} MB  {run['sessions']} sessions  "
                        f"load {run['loadavg']:.1f}")
            text += report(args, n, seconds, plan)
    finally:
        stop_all()
        drop_database(DATABASE)
    text += FOOTER
    print("\n".join(text))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
