"""Drain rates: warm workers of each system and configuration, N no-op tasks inserted at once,
the rate from the first task's start to the last one's finish as the database recorded them.
The raw ceiling, django-pgtasks and the peers (pgqueuer, procrastinate, django-tasks-db) are
drained in interleaved rounds."""

from __future__ import annotations

import os
import sys
import time

from common import connect, exited, largest_rss_mb, proc_cpu_s, stderr_of, summary
from harness import all_pids, log, server_cpu_s, start_workers, stop_workers
from raw_ceiling import raw_plan
from systems import Config, DjTasksDb, PgQueuer, PgTasks, Procrastinate, System


def drain(system: System, config: Config, n: int, args) -> dict:
    """Warm workers, n tasks inserted at once, drained (or stopped after --max-drain-seconds);
    the rate is the tasks finished over the span from the first start to the last finish, as
    the database recorded them."""
    with connect(args.database) as conn:
        system.reset(conn)
        procs = start_workers(system, config, conn)
        try:
            pids = all_pids(procs)
            cpu0, server0 = proc_cpu_s(pids), server_cpu_s()
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            system.seed(conn, n)
            while system.remaining(conn):
                if time.monotonic() - t0 > args.max_drain_seconds:
                    break
                if any(exited(p) for p in procs):
                    raise RuntimeError(
                        f"a {system.name} worker exited during the drain: "
                        + " | ".join(stderr_of(p)[-1000:] for p in procs)
                    )
                time.sleep(0.2)
            cpu = proc_cpu_s(pids) - cpu0
            server = server_cpu_s()
            rss = max(largest_rss_mb(p.pid) for p in procs)
        finally:
            stop_workers(procs)
        done, seconds = system.window(conn)
    if not done:
        raise RuntimeError(f"{system.name}: no task finished")
    return {
        "rate": done / seconds,
        "tasks_done": done,
        "cpu_us_per_task": cpu / done * 1e6,
        "rss_mb": rss,
        "loadavg": load,
        **(
            {"server_cpu_us_per_task": (server - server0) / done * 1e6}
            if server is not None and server0 is not None
            else {}
        ),
    }


def drain_plan(args, results: dict) -> list[tuple[str, dict, object]]:
    """(key, description, run-once function) of every drain of the selected sections."""
    plan: list[tuple[str, dict, object]] = []
    if "raw" in args.sections:
        plan += raw_plan(args)
    systems: list[tuple[System, list[str], int]] = []
    if "pgtasks" in args.sections:
        systems.append((PgTasks(args.database, sys.executable), args.pgtasks, args.tasks))
    if "peers" in args.sections and "peers_error" not in results:
        systems.append((PgQueuer(args.database), args.pgqueuer, args.tasks))
        systems.append((Procrastinate(args.database), args.procrastinate, args.peer_tasks))
        systems.append((DjTasksDb(args.database), args.djtasks, args.peer_tasks))
    for system, configs, n in systems:
        for text in filter(None, configs):  # an empty list ("--djtasks ''") skips a system
            config = Config.parse(text)
            label = config.label(system.default_concurrency)
            key = f"{system.name} {'default (' + label + ')' if text == 'default' else label}"
            desc = {
                "system": system.name,
                "config": label,
                "processes": config.processes,
                "concurrency": config.concurrency or system.default_concurrency,
                "prefetch": config.prefetch,
                "tasks": n,
            }
            plan.append((key, desc, lambda s=system, c=config, n=n: drain(s, c, n, args)))
    return plan


def section_drains(args, results: dict) -> None:
    """Every drain once, then every drain again (--repeat rounds): on a shared machine, a
    burst of load from elsewhere then hits all the systems alike rather than one of them."""
    plan = drain_plan(args, results)
    runs: dict[str, list[dict]] = {key: [] for key, _, _ in plan}
    failed: dict[str, str] = {}
    for round_ in range(args.repeat):
        log(f"  round {round_ + 1} of {args.repeat}")
        for key, _, run_once in plan:
            if key in failed:
                continue
            try:
                run = run_once()
            except Exception as exc:
                log(f"  {key}: failed: {exc}")
                failed[key] = str(exc)
                continue
            runs[key].append(run)
            log(
                f"  {key:36} {run['rate']:7.0f} tasks/s  {run['cpu_us_per_task']:6.0f} us "
                f"CPU/task  {run.get('server_cpu_us_per_task', 0):6.0f} us server CPU/task  "
                f"{run.get('rss_mb', 0):4.0f} MB  load {run['loadavg']:.1f}"
            )
    for key, desc, _ in plan:
        entry = dict(desc)
        if key in failed:
            entry["error"] = failed[key]
        got = runs[key]
        if got:
            entry["rate"] = summary([r["rate"] for r in got])
            entry["cpu_us_per_task"] = summary([r["cpu_us_per_task"] for r in got])
            if all("server_cpu_us_per_task" in r for r in got):
                entry["server_cpu_us_per_task"] = summary(
                    [r["server_cpu_us_per_task"] for r in got]
                )
            if "rss_mb" in got[0]:
                entry["rss_mb"] = summary([r["rss_mb"] for r in got])
            entry["tasks_done"] = [r["tasks_done"] for r in got]
            entry["loadavg"] = [round(r["loadavg"], 1) for r in got]
        results[key] = entry
