"""The raw-SQL ceiling: plain psycopg loops claiming and finishing django-pgtasks' tasks,
what no queue on the same table can beat."""

from __future__ import annotations

import os
import sys
import threading
import time

import psycopg
from common import connect, self_cpu
from harness import server_cpu_per_task, server_cpu_s
from scenarios import PREFILLED, held_snapshot, prepare
from systems import PgTasks

# The raw ceiling's two statements, written for the partitioned task table as a hand-written
# loop would be: the claim reads and updates the live partition (where waiting tasks are), the
# completion goes through the parent (the row moves to history).
CEILING_CLAIM = """
UPDATE pgtasks_task_live t SET status = 'RUNNING', locked_by = %s, locked_at = now(),
       started_at = now(), attempt = t.attempt + 1
FROM (SELECT id FROM pgtasks_task_live WHERE status IN ('READY', 'AWAITING_RETRY')
      AND run_after <= now() AND queue = 'default'
      ORDER BY priority DESC, run_after, id LIMIT %s FOR UPDATE SKIP LOCKED) c
WHERE t.id = c.id RETURNING t.id
"""
CEILING_DONE = (
    "UPDATE pgtasks_task SET status = 'SUCCESSFUL', finished_at = now(), "
    "locked_at = NULL WHERE id = ANY(%s) AND status = 'RUNNING' AND locked_by = %s"
)


def _raw_claim(conn, me: str, batch: int) -> list[int]:
    """The claim, tried again when it met a row that another loop's completion had moved to
    history since the claim's snapshot (SQLSTATE 40001; SKIP LOCKED skips locked rows, not
    moved ones): what django-pgtasks' own claim does
    (django_pgtasks/database/partition_moves.py)."""
    while True:
        try:
            return [r[0] for r in conn.execute(CEILING_CLAIM, [me, batch])]
        except psycopg.errors.SerializationFailure:
            continue


def _raw_loop(
    dbname: str, me: str, batch: int, max_seconds: float, go=None, spent=None, slot: int = 0
) -> None:
    with connect(dbname) as conn:
        if go is not None:  # every process connected before the first claim
            go.wait()
        cpu0 = self_cpu()
        deadline = time.monotonic() + max_seconds
        while ids := _raw_claim(conn, me, batch):
            conn.execute(CEILING_DONE, [ids, me])
            if time.monotonic() > deadline:
                break
        if spent is not None:  # a process's own CPU over its drain, without its start-up
            spent[slot] = self_cpu() - cpu0


def raw_drain(
    dbname: str, workers: int, batch: int, max_seconds: float, processes: bool = True
) -> float:
    """Plain psycopg loops on django-pgtasks' table: claim ``batch`` tasks in one statement
    (autocommit), complete them in one guarded UPDATE; no handler, no ORM. ``workers`` loops
    run as separate processes (like a real deployment), or as threads of this process
    (``processes=False``, where the GIL caps them). Stops when the queue is empty or after
    ``max_seconds``. Returns the CPU seconds the loops spent from their first claim on (not
    the processes' start-up)."""
    if processes:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        go = ctx.Barrier(workers + 1)
        spent = ctx.Array("d", workers)
        procs = [
            ctx.Process(
                target=_raw_loop,
                args=(dbname, f"raw-{i}", batch, max_seconds, go, spent, i),
            )
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        go.wait(timeout=60)
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"a raw loop failed: exit codes {[p.exitcode for p in procs]}")
        return sum(spent)
    cpu = self_cpu()
    errors: list[BaseException] = []

    def loop(i: int) -> None:
        try:
            _raw_loop(dbname, f"raw-{i}", batch, max_seconds)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return self_cpu() - cpu


def parse_shape(text: str) -> tuple[int, int, bool]:
    """``WxB``: W processes claiming B tasks per statement; ``WxBt``: W threads of one process
    (where the GIL caps them). Returns (workers, batch, as processes?)."""
    processes = not text.endswith("t")
    workers, _, batch = text.removesuffix("t").partition("x")
    try:
        return int(workers), int(batch), processes
    except ValueError:
        raise ValueError(f"not a raw-ceiling shape (WxB or WxBt): {text!r}") from None


def raw_key(workers: int, batch: int, processes: bool) -> str:
    unit = ("process" if processes else "thread") + (
        "es" if processes and workers > 1 else "s" if workers > 1 else ""
    )
    return f"raw {workers} {unit}, batch {batch}"


def raw_run(workers: int, batch: int, processes: bool, n: int, scenario: str, args) -> dict:
    """One drain of the raw ceiling in a scenario (bench/scenarios.py). In the burst scenario
    the tasks are inserted before the loops start (they have no warm-up to wait for)."""
    pg = PgTasks(args.database, sys.executable)
    with connect(args.database) as conn:
        prepare(pg, conn, n, scenario)
        if scenario not in PREFILLED:
            pg.seed(conn, n)  # like the workers' burst: no ANALYZE before the drain
        with held_snapshot(pg, scenario, args.database):
            load = os.getloadavg()[0]
            server0 = server_cpu_s()
            cpu = raw_drain(args.database, workers, batch, args.max_drain_seconds, processes)
        done, seconds = pg.window(conn)
        steady = pg.steady_rate(conn)
    return {
        "rate": steady or done / seconds,
        "rate_whole_drain": done / seconds,
        "tasks_done": done,
        "cpu_us_per_task": cpu / done * 1e6,
        "loadavg": load,
        **server_cpu_per_task(server0, done),
    }


def raw_plan(args, scenario: str, n: int, shapes: list[str]) -> list[tuple[str, dict, object]]:
    """(key, description, run-once function) of each raw-ceiling shape, drained with n tasks in
    that scenario."""
    plan: list[tuple[str, dict, object]] = []
    for text in filter(None, shapes):
        workers, batch, processes = parse_shape(text)
        desc = {
            "system": "raw SQL",
            "scenario": scenario,
            "batch": batch,
            "tasks": n,
            "processes": workers if processes else 1,
            "concurrency": 1 if processes else workers,
            "as_processes": processes,
        }
        plan.append(
            (
                raw_key(workers, batch, processes),
                desc,
                lambda w=workers, b=batch, p=processes: raw_run(w, b, p, n, scenario, args),
            )
        )
    return plan
