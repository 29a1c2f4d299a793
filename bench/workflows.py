"""What workflows cost: enqueueing a group, draining it, releasing its callback, a chain.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/workflows.py [--members 10000] [--chain 500] [--repeat 3]

In a scratch database (``pgtasks_bench_workflows``, dropped at the end), with one
``run_pgtasks`` worker process at the default settings (bench/pgtasks_site):

1. enqueue: ``enqueue_many()`` of N no-op tasks against ``group(N no-ops, then=callback)``
   (the same tasks, linked), each in its own transaction;
2. drain: the rate at which the worker runs the N plain tasks against the N members of the
   group (the database's start and finish times), and how long after the last member ended
   the callback started (its release, wake-up and claim);
3. chain: a chain of C no-op steps, each released by the end of the one before: the time per
   step from the first start to the last finish (release, wake-up, claim, run, record);
4. fan-out: one parent with F children (``--fan-out 1,1000,100000``): the time from the
   parent's end to the first child's start (its release mark, the releaser's first batch,
   the wake-up and claim), and to the last child's start (releases and the drain together);
5. late children: L children (``--late 20000``) enqueued in one transaction against a parent
   enqueued before it, once while the parent is pending (due in an hour) and once after it
   ended: the time of the transaction's commit, which is the check of the children's
   parents (it locks the parent once, then counts each child of an ended parent off).

Every figure is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from common import (  # noqa: E402
    PGTASKS_SETTINGS,
    ROOT,
    child_env,
    connect,
    drop_database,
    recreate_database,
)

DATABASE = "pgtasks_bench_workflows"


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = PGTASKS_SETTINGS
    os.environ["PGDATABASE"] = DATABASE
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_worker() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "run_pgtasks", "--settings", PGTASKS_SETTINGS,
         "--processes", "1", "--log-level", "WARNING"], cwd=ROOT, env=child_env(DATABASE),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait(conn, sql: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not conn.execute(sql).fetchone()[0]:
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for: {sql}")
        time.sleep(0.01)


def timed(action) -> float:
    from django.db import transaction

    started = time.perf_counter()
    with transaction.atomic():
        action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10_000, help="tasks per group")
    parser.add_argument("--chain", type=int, default=500, help="steps of the chain")
    parser.add_argument("--fan-out", default="1,1000,100000",
                        help="children of one parent, comma-separated sizes")
    parser.add_argument("--late", type=int, default=20_000,
                        help="children enqueued after their parent, pending then ended")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    recreate_database(DATABASE)
    worker = None
    try:
        setup_django()
        from django.db import transaction

        from django_pgtasks.models import Task
        from django_pgtasks.workflows import chain, group

        n = args.members
        plain_s, group_s, plain_rate, group_rate, release_ms, step_ms = [], [], [], [], [], []
        fan_outs = [int(size) for size in args.fan_out.split(",") if size]
        fan_first: dict[int, list[float]] = {}
        fan_last: dict[int, list[float]] = {}
        late_s: dict[str, list[float]] = {"pending": [], "ended": []}
        with connect(DATABASE) as conn:
            worker = start_worker()
            wait(conn, "SELECT count(*) > 0 FROM pgtasks_worker", 60)
            for _ in range(args.repeat):
                conn.execute("TRUNCATE pgtasks_task")
                plain_s.append(timed(lambda: Task.objects.enqueue_many(
                    Task.objects.build("bench.noop") for _ in range(n))))
                wait(conn, "SELECT count(*) = 0 FROM pgtasks_task WHERE status <> 'SUCCESSFUL'")
                plain_rate.append(n / conn.execute(
                    "SELECT extract(epoch FROM max(finished_at) - min(started_at)) "
                    "FROM pgtasks_task").fetchone()[0])

                conn.execute("TRUNCATE pgtasks_task")
                made = []
                group_s.append(timed(lambda made=made: made.append(group(
                    [Task.objects.build("bench.noop") for _ in range(n)],
                    then=Task.objects.build("bench.collect")).enqueue())))
                callback = made[0].tasks[-1].pk
                wait(conn, f"SELECT status = 'SUCCESSFUL' FROM pgtasks_task WHERE id = {callback}")
                rate, release = conn.execute(
                    "SELECT %s / extract(epoch FROM max(finished_at) - min(started_at)), "
                    "extract(epoch FROM (SELECT started_at FROM pgtasks_task WHERE id = %s) "
                    "    - max(finished_at)) * 1000 "
                    "FROM pgtasks_task WHERE id <> %s", [n, callback, callback]).fetchone()
                group_rate.append(rate)
                release_ms.append(release)

                conn.execute("TRUNCATE pgtasks_task")
                timed(lambda: chain(*[Task.objects.build("bench.noop")
                                      for _ in range(args.chain)]).enqueue())
                wait(conn, "SELECT count(*) = 0 FROM pgtasks_task WHERE status <> 'SUCCESSFUL'")
                step_ms.append(conn.execute(
                    "SELECT extract(epoch FROM max(finished_at) - min(started_at)) * 1000 / %s "
                    "FROM pgtasks_task", [args.chain]).fetchone()[0])
                for size in fan_outs:
                    conn.execute("TRUNCATE pgtasks_task")
                    parent = Task.objects.build("bench.noop")
                    members = [parent, *(Task.objects.build("bench.noop") for _ in range(size))]
                    links = [[], *([[parent]] * size)]
                    timed(lambda members=members, links=links: Task.objects.enqueue_linked(
                        members, links))
                    wait(conn, "SELECT count(*) = 0 FROM pgtasks_task "
                               "WHERE status <> 'SUCCESSFUL'", 900)
                    first, last = conn.execute(
                        "SELECT extract(epoch FROM min(c.started_at) - p.finished_at) * 1000, "
                        "extract(epoch FROM max(c.started_at) - p.finished_at) * 1000 "
                        "FROM pgtasks_task c, pgtasks_task p WHERE p.id = %s AND c.id <> p.id "
                        "GROUP BY p.finished_at", [parent.pk]).fetchone()
                    fan_first.setdefault(size, []).append(first)
                    fan_last.setdefault(size, []).append(last)
                for state in late_s if args.late else ():
                    conn.execute("TRUNCATE pgtasks_task")
                    parent = Task.objects.enqueue(
                        "bench.noop", delay=3600 if state == "pending" else None)
                    if state == "ended":
                        wait(conn, f"SELECT status = 'SUCCESSFUL' FROM pgtasks_task "
                                   f"WHERE id = {parent.pk}")
                    children = [Task.objects.build("bench.noop") for _ in range(args.late)]
                    with transaction.atomic():
                        Task.objects.enqueue_linked(children, [[parent]] * len(children))
                        enqueued = time.perf_counter()
                    late_s[state].append(time.perf_counter() - enqueued)  # the commit
        med = statistics.median
        print(f"Enqueue of {n:,} tasks in one transaction: enqueue_many() {med(plain_s):.3f} s, "
              f"group(..., then=callback) {med(group_s):.3f} s "
              f"({med(group_s) / med(plain_s):.2f}x)")
        print(f"Drain, one worker at the defaults: {med(plain_rate):,.0f} plain tasks/s, "
              f"{med(group_rate):,.0f} group members/s "
              f"({med(group_rate) / med(plain_rate):.2f}x); the callback started "
              f"{med(release_ms):.1f} ms after the last member ended")
        print(f"Chain of {args.chain} steps: {med(step_ms):.2f} ms per step, from the first "
              f"start to the last finish")
        for size, firsts in fan_first.items():
            print(f"Fan-out of {size:,} children: the first child started {med(firsts):.1f} ms "
                  f"after the parent ended, the last {med(fan_last[size]) / 1000:.2f} s after")
        if args.late:
            print(f"{args.late:,} children of an earlier parent in one transaction, its "
                  f"commit: {med(late_s['pending']):.2f} s while the parent is pending, "
                  f"{med(late_s['ended']):.2f} s after it ended")
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        from django.db import connections

        connections.close_all()
        drop_database(DATABASE)


if __name__ == "__main__":
    main()
