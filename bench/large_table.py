"""The large table: claim time and admin-style counts with 1,000,000 finished and 100,000
waiting tasks, against smaller tables (seeded as bench/explain_claim.py does)."""

from __future__ import annotations

import statistics
import time

from common import summary
from harness import log


def section_large(args, results: dict) -> None:
    """Claim time and admin-style counts: 1M finished + 100k waiting vs smaller tables."""
    import explain_claim
    from django.db import connection, transaction
    from django.db.models import Count

    from django_pgtasks.models import Task

    def timed(fn, runs: int) -> float:
        fn()  # warm-up
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.mean(times)

    queries = {
        "pending().count()": lambda: Task.objects.pending().count(),
        "pending count, queue 'default'": lambda: (
            Task.objects.pending().filter(queue="default").count()
        ),
        "pending count per queue": lambda: list(
            Task.objects.pending().values("queue").annotate(n=Count("id")).order_by()
        ),
        "admin summary (count per name and status)": lambda: list(
            Task.objects.values("name", "status").annotate(n=Count("id")).order_by()
        ),
    }
    scenarios = (
        ("near-empty", 0, args.large_claims * 3 * 2 + 2000),
        ("100k waiting", 0, args.large_pending),
        ("1M finished + 100k waiting", args.large_finished, args.large_pending),
    )
    out: dict = {}
    for name, finished, pending in scenarios:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgtasks_task")
        t0 = time.perf_counter()
        explain_claim.seed(finished, pending)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE pgtasks_task")
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pgtasks_task'))")
            size = cursor.fetchone()[0]
        log(f"  large table, {name}: seeded in {time.perf_counter() - t0:.0f}s ({size})")
        entry: dict = {
            "finished": finished,
            "pending": pending,
            "table_size": size,
            "counts_ms": {},
        }
        for label, fn in queries.items():
            entry["counts_ms"][label] = timed(fn, 5)
        claim_means = []
        for _ in range(3):
            times = []
            for _ in range(args.large_claims):
                t0 = time.perf_counter()
                claimed = Task.objects.claim("bench-worker", queues=["default"], limit=1)
                times.append((time.perf_counter() - t0) * 1000)
                assert claimed, "ran out of due tasks"
            claim_means.append(statistics.mean(times))
        entry["claim_ms"] = summary(claim_means)
        claim = explain_claim.captured_claim_sql(["default"], 1)
        entry["claim_plan"] = explain_claim.explain_analyze(claim)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM pgtasks_task "
                "WHERE status IN ('READY', 'AWAITING_RETRY') AND queue = 'default'"
            )
            entry["pending_count_plan"] = "\n".join(r[0] for r in cursor.fetchall())
        out[name] = entry
        log(
            f"  {name}: claim {entry['claim_ms']['median']:.2f} ms (median of 3 means of "
            f"{args.large_claims}); counts "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in entry["counts_ms"].items())
        )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgtasks_task")
    results["large table"] = out
