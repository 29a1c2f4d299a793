"""Drain rates: the workers of each system and configuration drain N no-op tasks in a scenario
(bench/scenarios.py: backlog, snapshot or burst); the rate is the steady drain rate: the tasks
that finished between the moments 10% and 90% of them had finished, over that span, as the
database recorded the finishes (the rate over the whole drain, from the first start to the
last finish, is kept beside it: ``rate_whole_drain``). The raw
ceiling, django-pgtasks and the peers (pgqueuer, procrastinate, django-tasks-db) are drained
in interleaved rounds: each round drains every (scenario, size) combination with every system
and configuration once."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

from common import connect, exited, largest_rss_mb, proc_cpu_s, stderr_of, summary
from harness import all_pids, log, server_cpu_s, start_workers, stop_workers
from raw_ceiling import raw_plan
from scenarios import PREFILLED, combination_key, held_snapshot, prepare
from systems import Config, DjTasksDb, PgQueuer, PgTasks, Procrastinate, System

from django_pgtasks.worker.process_count import usable_cpus


def drain(system: System, config: Config, n: int, scenario: str, args) -> dict:
    """n tasks drained in the scenario (or stopped after --max-drain-seconds); the rate is the
    steady rate (see the module doc). Worker and server CPU are counted from the moment the
    workers are ready, per task finished after it (in a prefilled scenario, the workers
    started on the tasks while they got ready)."""
    with connect(args.database) as conn:
        prepare(system, conn, n, scenario)
        with held_snapshot(system, scenario, args.database):
            procs = start_workers(system, config, conn, settle=0 if scenario in PREFILLED else 0.5)
            try:
                pids = all_pids(procs)
                cpu0, server0 = proc_cpu_s(pids), server_cpu_s()
                load = os.getloadavg()[0]
                t0 = time.monotonic()
                if scenario in PREFILLED:
                    finished_before = n - system.remaining(conn)
                else:
                    system.seed(conn, n)
                    finished_before = 0
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
        steady = system.steady_rate(conn)
    if not done:
        raise RuntimeError(f"{system.name}: no task finished")
    counted = done - finished_before  # none: every task finished before the workers were ready
    return {
        "rate": steady or done / seconds,
        "rate_whole_drain": done / seconds,
        "tasks_done": done,
        "cpu_tasks": counted,
        "rss_mb": rss,
        "loadavg": load,
        **({"cpu_us_per_task": cpu / counted * 1e6} if counted > 0 else {}),
        **(
            {"server_cpu_us_per_task": (server - server0) / counted * 1e6}
            if server is not None and server0 is not None and counted > 0
            else {}
        ),
    }


def system_plan(
    system: System, configs: list[str], scenario: str, n: int, args
) -> list[tuple[str, dict, object]]:
    """(key, description, run-once function) of each configuration of a system, drained with n
    tasks in that scenario."""
    plan: list[tuple[str, dict, object]] = []
    for text in filter(None, configs):  # an empty list ("--djtasks ''") skips a system
        config = Config.parse(text)
        if config.default and isinstance(system, PgTasks):
            # PGTASKS["PROCESSES"] "auto": one process per CPU (the budget is not short here).
            config = replace(config, processes=usable_cpus())
        label = config.label(system.default_concurrency)
        key = f"{system.name} {'default (' + label + ')' if text == 'default' else label}"
        desc = {
            "system": system.name,
            "scenario": scenario,
            "config": label,
            "processes": config.processes,
            "concurrency": config.concurrency or system.default_concurrency,
            "prefetch": config.prefetch,
            "tasks": n,
        }
        plan.append((key, desc, lambda c=config: drain(system, c, n, scenario, args)))
    return plan


def drain_plan(args, results: dict) -> list[tuple[str, str, dict, object]]:
    """(combination, key, description, run-once function) of every drain of the selected
    sections, combination after combination (--scenarios x --tasks). The raw ceiling's
    --raw-shapes, django-pgtasks and pgqueuer are drained in every combination; the
    --raw-extra-shapes, procrastinate and django-tasks-db (at most --peer-tasks tasks) only in
    the burst scenario at the first size, unless --peers-everywhere."""
    plan: list[tuple[str, str, dict, object]] = []
    peers = "peers" in args.sections and "peers_error" not in results
    for scenario in args.scenarios:
        for i, n in enumerate(args.tasks):
            first_burst = scenario == "burst" and i == 0
            drains: list[tuple[str, dict, object]] = []
            if "raw" in args.sections:
                shapes = args.raw_shapes + (args.raw_extra_shapes if first_burst else [])
                drains += raw_plan(args, scenario, n, list(dict.fromkeys(shapes)))
            if "pgtasks" in args.sections:
                pg = PgTasks(args.database, sys.executable)
                drains += system_plan(pg, args.pgtasks, scenario, n, args)
            if peers:
                drains += system_plan(PgQueuer(args.database), args.pgqueuer, scenario, n, args)
            if peers and (first_burst or args.peers_everywhere):
                m = min(n, args.peer_tasks)
                drains += system_plan(
                    Procrastinate(args.database), args.procrastinate, scenario, m, args
                )
                drains += system_plan(DjTasksDb(args.database), args.djtasks, scenario, m, args)
            combination = combination_key(scenario, n)
            plan += [(combination, key, desc, run) for key, desc, run in drains]
    slow = [
        s
        for s, c in (("procrastinate", args.procrastinate), ("django-tasks-db", args.djtasks))
        if any(c)
    ]
    if peers and slow and "burst" not in args.scenarios and not args.peers_everywhere:
        log(
            f"  {' and '.join(slow)}: not drained (only in the burst scenario, unless "
            "--peers-everywhere)"
        )
    return plan


def section_drains(args, results: dict) -> None:
    """Every drain once, then every drain again (--repeat rounds): on a shared machine, a
    burst of load from elsewhere then hits all the systems alike rather than one of them.
    The results go to ``results["drains"][combination][key]``."""
    plan = drain_plan(args, results)
    runs: dict[tuple[str, str], list[dict]] = {(c, key): [] for c, key, _, _ in plan}
    failed: dict[tuple[str, str], str] = {}
    for round_ in range(args.repeat):
        log(f"  round {round_ + 1} of {args.repeat}")
        for combination, key, _, run_once in plan:
            if (combination, key) in failed:
                continue
            try:
                run = run_once()
            except Exception as exc:
                log(f"  {combination:16} {key}: failed: {exc}")
                failed[combination, key] = str(exc)
                continue
            runs[combination, key].append(run)
            log(
                f"  {combination:16} {key:34} {run['rate']:7.0f} tasks/s "
                f"{run.get('cpu_us_per_task', 0):5.0f} us CPU/task "
                f"{run.get('server_cpu_us_per_task', 0):5.0f} us server CPU/task "
                f"{run.get('rss_mb', 0):4.0f} MB  load {run['loadavg']:.1f}"
                + (
                    f"  (CPU over {run['cpu_tasks']} of {run['tasks_done']} tasks)"
                    if run.get("cpu_tasks", run["tasks_done"]) < run["tasks_done"]
                    else ""
                )
            )
    drains = results.setdefault("drains", {})
    for combination, key, desc, _ in plan:
        entry = dict(desc)
        if (combination, key) in failed:
            entry["error"] = failed[combination, key]
        got = runs[combination, key]
        if got:
            entry["rate"] = summary([r["rate"] for r in got])
            entry["rate_whole_drain"] = summary([r["rate_whole_drain"] for r in got])
            for field in ("cpu_us_per_task", "server_cpu_us_per_task"):
                if values := [r[field] for r in got if field in r]:  # not when the CPU window
                    entry[field] = summary(values)  # was empty (all done before "ready")
            if "rss_mb" in got[0]:
                entry["rss_mb"] = summary([r["rss_mb"] for r in got])
            entry["tasks_done"] = [r["tasks_done"] for r in got]
            if "cpu_tasks" in got[0]:  # the tasks the CPU figures are per (prefilled: fewer)
                entry["cpu_tasks"] = [r["cpu_tasks"] for r in got]
            entry["loadavg"] = [round(r["loadavg"], 1) for r in got]
        drains.setdefault(combination, {})[key] = entry
