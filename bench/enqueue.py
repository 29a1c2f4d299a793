"""Enqueue costs: a single ``Task.objects.enqueue()`` against a raw INSERT, one task per
transaction; the bulk forms (``build()`` + ``enqueue_many()``, ``enqueue_bulk()``) against a
raw COPY of the same rows."""

from __future__ import annotations

import time

from common import connect, self_cpu, summary
from harness import log


def section_enqueue(args, results: dict) -> None:
    """Single enqueue vs raw INSERT (one task per transaction); bulk vs COPY."""
    from django.db import connection

    from django_pgtasks.models import Task

    single: dict[str, list[float]] = {"pgtasks": [], "raw": [], "pgtasks_cpu": [], "raw_cpu": []}
    # The raw statements write into the live partition, where a new task belongs (as
    # enqueue does): through the partitioned parent, each row would also be routed.
    insert = (
        "INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, status, "
        "attempt, max_attempts, error_text, metadata) VALUES "
        "(%s, %s, %s, %s, %s, 'READY', 0, %s, '', '{}') RETURNING id"
    )
    k = args.single_enqueues
    with connect(args.database) as conn:
        for _ in range(args.repeat):
            conn.execute("TRUNCATE pgtasks_task")
            t0, c0 = time.perf_counter(), self_cpu()
            for _ in range(k):
                conn.execute(insert, ["bench.noop", "default", "[]", "{}", 100, 3]).fetchone()
            single["raw"].append((time.perf_counter() - t0) / k * 1e6)
            single["raw_cpu"].append((self_cpu() - c0) / k * 1e6)
            conn.execute("TRUNCATE pgtasks_task")
            connection.ensure_connection()
            t0, c0 = time.perf_counter(), self_cpu()
            for _ in range(k):
                Task.objects.enqueue("bench.noop")
            single["pgtasks"].append((time.perf_counter() - t0) / k * 1e6)
            single["pgtasks_cpu"].append((self_cpu() - c0) / k * 1e6)
            log(
                f"  single enqueue: raw INSERT {single['raw'][-1]:.0f} us "
                f"({single['raw_cpu'][-1]:.0f} us client CPU), Task.objects.enqueue "
                f"{single['pgtasks'][-1]:.0f} us ({single['pgtasks_cpu'][-1]:.0f} us CPU)"
            )
        results["enqueue single"] = {
            "tasks": k,
            "raw_insert_us": summary(single["raw"]),
            "enqueue_us": summary(single["pgtasks"]),
            "raw_insert_client_cpu_us": summary(single["raw_cpu"]),
            "enqueue_client_cpu_us": summary(single["pgtasks_cpu"]),
        }
        n = args.bulk_tasks
        bulk: dict[str, list[float]] = {
            "build": [],
            "enqueue_many": [],
            "copy": [],
            "enqueue_bulk": [],
        }
        has_bulk = hasattr(Task.objects, "enqueue_bulk")
        for _ in range(args.repeat):
            conn.execute("TRUNCATE pgtasks_task")
            t0 = time.perf_counter()
            with conn.cursor().copy(
                "COPY pgtasks_task_live (name, queue, args, kwargs, priority, status, attempt, "
                "max_attempts, error_text, metadata) FROM STDIN"
            ) as copy:
                for _ in range(n):
                    copy.write_row(
                        ("bench.noop", "default", "[]", "{}", 100, "READY", 0, 3, "", "{}")
                    )
            bulk["copy"].append(n / (time.perf_counter() - t0))
            conn.execute("TRUNCATE pgtasks_task")
            t0 = time.perf_counter()
            tasks = [Task.objects.build("bench.noop") for _ in range(n)]
            t1 = time.perf_counter()
            Task.objects.enqueue_many(tasks)
            t2 = time.perf_counter()
            del tasks
            bulk["build"].append(n / (t1 - t0))
            bulk["enqueue_many"].append(n / (t2 - t1))
            both = n / (t2 - t0)
            if has_bulk:  # the COPY-based API: one handler, one set of options
                conn.execute("TRUNCATE pgtasks_task")
                calls = [() for _ in range(n)]
                t0 = time.perf_counter()
                Task.objects.enqueue_bulk("bench.noop", calls)
                bulk["enqueue_bulk"].append(n / (time.perf_counter() - t0))
                del calls
            log(
                f"  bulk {n}: COPY {bulk['copy'][-1]:.0f}/s, build {bulk['build'][-1]:.0f}/s, "
                f"enqueue_many {bulk['enqueue_many'][-1]:.0f}/s, build+enqueue_many "
                f"{both:.0f}/s"
                + (f", enqueue_bulk {bulk['enqueue_bulk'][-1]:.0f}/s" if has_bulk else "")
            )
        conn.execute("TRUNCATE pgtasks_task")
    total = [1 / (1 / b + 1 / e) for b, e in zip(bulk["build"], bulk["enqueue_many"], strict=True)]
    results["enqueue bulk"] = {
        "tasks": n,
        "copy_per_s": summary(bulk["copy"]),
        "build_per_s": summary(bulk["build"]),
        "enqueue_many_per_s": summary(bulk["enqueue_many"]),
        "build_and_enqueue_many_per_s": summary(total),
        **({"enqueue_bulk_per_s": summary(bulk["enqueue_bulk"])} if has_bulk else {}),
    }
