"""The speed issue's targets, each checked against the figures of a run."""

from __future__ import annotations

from comparison import best_peer, best_raw_batch, default_of, med
from raw_ceiling import raw_key


def evaluate_targets(results: dict) -> list[dict]:
    """The speed issue's targets, each with the measured figure and met / not met / not
    measured."""
    out: list[dict] = []

    def add(target: str, figure: str, met: bool | None) -> None:
        out.append(
            {
                "target": target,
                "measured": figure,
                "status": "not measured" if met is None else "met" if met else "not met",
            }
        )

    pg = {
        k: v
        for k, v in results.items()
        if isinstance(v, dict) and v.get("system") == "django-pgtasks" and med(v)
    }
    pgq_best = best_peer(results, "pgqueuer")
    pgq_default = default_of(results, "pgqueuer")
    raw50 = best_raw_batch(results)
    if pg and pgq_best:
        best = max(pg.values(), key=med)
        add(
            "best configuration >= 1.0x pgqueuer's best",
            f"{best['config']}: {med(best):.0f}/s vs {pgq_best[0]}: {pgq_best[1]:.0f}/s = "
            f"{med(best) / pgq_best[1]:.2f}x",
            med(best) >= pgq_best[1],
        )
    raw50_entry = results.get(raw_key(8, 50, True), {})
    if pg and med(raw50_entry, "server_cpu_us_per_task") is not None:
        best = max(pg.values(), key=med)

        def total_cpu(entry: dict) -> float | None:
            server = med(entry, "server_cpu_us_per_task")
            return None if server is None else med(entry, "cpu_us_per_task") + server

        ours, raw = total_cpu(best), total_cpu(raw50_entry)
        if ours is not None:
            add(
                "CPU per task (worker + PostgreSQL), best configuration, within 10x the raw "
                "batch-50 loop's (8 processes)",
                f"{best['config']}: {ours:.0f} us vs {raw:.0f} us = {ours / raw:.1f}x",
                ours <= 10 * raw,
            )
    if pg and raw50:
        best = max(pg.values(), key=med)
        add(
            "moonshot: best configuration >= 50% of the raw batch-50 ceiling (processes)",
            f"{best['config']}: {med(best):.0f}/s = {med(best) / raw50:.0%} of {raw50:.0f}/s",
            med(best) >= 0.5 * raw50,
        )
    default = default_of(results, "django-pgtasks")
    if default and pgq_default:
        rate = med(default[1])
        add(
            "default configuration >= 1.0x pgqueuer's defaults",
            f"{rate:.0f}/s vs {med(pgq_default[1]):.0f}/s = {rate / med(pgq_default[1]):.2f}x",
            rate >= med(pgq_default[1]),
        )
    if default and default[1].get("vs_raw1"):
        e = default[1]
        add(
            "default configuration >= 80% of the raw one-per-claim ceiling, same workers",
            f"{med(e):.0f}/s = {e['vs_raw1']:.0%} of {e['raw1_shape']}",
            e["vs_raw1"] >= 0.8,
        )
    if "enqueue single" in results:
        s = results["enqueue single"]
        ratio = s["enqueue_us"]["median"] / s["raw_insert_us"]["median"]
        add(
            "Task.objects.enqueue() <= 1.5x the cost of a raw INSERT ... RETURNING",
            f"{s['enqueue_us']['median']:.0f} us vs {s['raw_insert_us']['median']:.0f} us = "
            f"{ratio:.2f}x",
            ratio <= 1.5,
        )
    if "enqueue bulk" in results:
        b = results["enqueue bulk"]
        copy = b["copy_per_s"]["median"]
        many = b["enqueue_many_per_s"]["median"] / copy
        add("enqueue_many() >= 50% of a raw COPY of the same rows", f"{many:.0%}", many >= 0.5)
        if "enqueue_bulk_per_s" in b:
            bulk = b["enqueue_bulk_per_s"]["median"] / copy
            add("enqueue_bulk() >= 80% of a raw COPY of the same rows", f"{bulk:.0%}", bulk >= 0.8)
    if "startup" in results:
        runs = results["startup"]
        worst = max(v["median_s"] for v in runs.values())
        add(
            "first task running within 0.5 s of a worker's start (any --processes)",
            ", ".join(f"{k}: {v['median_s']:.2f} s" for k, v in runs.items()),
            worst <= 0.5,
        )
    lat = next(
        (
            v
            for k, v in results.items()
            if k.startswith("latency django-pgtasks") and "median_ms" in v
        ),
        None,
    )
    if lat:
        add(
            "idle wake-up: median <= 10 ms",
            f"median {lat['median_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms",
            lat["median_ms"] <= 10,
        )
    lt = results.get("large table", {})
    if "near-empty" in lt and "1M finished + 100k waiting" in lt:
        big = lt["1M finished + 100k waiting"]["claim_ms"]["median"]
        small = lt["near-empty"]["claim_ms"]["median"]
        add(
            "claim time flat from 0 to 1,000,000 finished rows (within 1.5x)",
            f"{big:.2f} ms vs {small:.2f} ms = {big / small:.2f}x",
            big / small <= 1.5,
        )
    if "long run" in results:
        r = results["long run"]
        growth = r["rss_end_mb"] - r["rss_at_10pct_mb"]
        add(
            f"worker memory flat over {r['tasks']:,} tasks",
            f"RSS {r['rss_at_10pct_mb']:.1f} MB at 10%, {r['rss_end_mb']:.1f} MB at the end "
            f"({growth:+.1f} MB)",
            growth <= 0.05 * r["rss_at_10pct_mb"],
        )
    else:
        add("worker memory flat over 1M tasks", "run with --long", None)
    return out
