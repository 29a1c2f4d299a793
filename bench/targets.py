"""The speed issue's targets, each checked against the figures of a run.

The drain targets are checked at each size (--tasks) in the combinations they name
(bench/scenarios.py); "best" is the configuration with the highest median rate of its system in
that combination, "default" the system's own defaults.
"""

from __future__ import annotations

from comparison import best_of, default_of, drain_combinations, med
from raw_ceiling import raw_key
from scenarios import combination_key, split_combination

PG, PGQ = "django-pgtasks", "pgqueuer"


def _rate(row: tuple[str, dict], scenario: str = "") -> str:
    return f"{scenario}{row[0]}: {med(row[1]):,.0f}/s"


def drain_targets(results: dict, add) -> None:
    """The drain targets, at each size measured; none when no drain ran."""
    combos = drain_combinations(results)
    sizes = sorted({split_combination(k)[1] for k in combos if k})
    for n in sizes:
        at = f"{n:,} tasks"
        backlog = combos.get(combination_key("backlog", n), {})
        snapshot = combos.get(combination_key("snapshot", n), {})
        burst = combos.get(combination_key("burst", n), {})

        def ratio(
            target: str, ours, theirs, threshold: float, percent: bool = False, across: str = ""
        ) -> None:
            """ours / theirs >= threshold; ``across``: "<ours' scenario>/<theirs'>"."""
            if not (ours and theirs):
                add(target, "not measured", None)
                return
            r = med(ours[1]) / med(theirs[1])
            shown = f"{r:.0%}" if percent else f"{r:.2f}x"
            mine, other = (f"{s} " for s in across.split("/")) if across else ("", "")
            add(
                target,
                f"{_rate(ours, mine)} vs {_rate(theirs, other)} = {shown}",
                r >= threshold,
            )

        ratio(
            f"backlog {at}: best configuration >= 1.5x pgqueuer's best",
            best_of(backlog, PG),
            best_of(backlog, PGQ),
            1.5,
        )
        ratio(
            f"backlog {at}: default configuration >= 2x pgqueuer's defaults",
            default_of(backlog, PG),
            default_of(backlog, PGQ),
            2.0,
        )
        raw50 = raw_key(8, 50, True)
        ratio(
            f"backlog {at}: best configuration >= 40% of the raw batch-50 ceiling (8 processes)",
            best_of(backlog, PG),
            (raw50, backlog[raw50]) if med(backlog.get(raw50, {})) else None,
            0.4,
            percent=True,
        )
        best = best_of(backlog, PG)
        server = med(best[1], "server_cpu_us_per_task") if best else None
        worker = med(best[1], "cpu_us_per_task") if best else None
        if worker is not None and server is not None:
            add(
                f"backlog {at}: CPU per task (worker + PostgreSQL) of the best configuration "
                "<= 60 us",
                f"{best[0]}: {worker:.0f} + {server:.0f} = {worker + server:.0f} us",
                worker + server <= 60,
            )
        else:
            add(
                f"backlog {at}: CPU per task (worker + PostgreSQL) of the best configuration "
                "<= 60 us",
                "not measured",
                None,
            )
        for which, pick in (("best configuration", best_of), ("default configuration", default_of)):
            ratio(
                f"snapshot {at}: {which} >= 70% of its backlog rate",
                pick(snapshot, PG),
                pick(backlog, PG),
                0.7,
                percent=True,
                across="snapshot/backlog",
            )
        ratio(
            f"snapshot {at}: best configuration ahead of pgqueuer's best",
            best_of(snapshot, PG),
            best_of(snapshot, PGQ),
            1.0 + 1e-9,
        )
        ratio(
            f"snapshot {at}: default configuration ahead of pgqueuer's defaults",
            default_of(snapshot, PG),
            default_of(snapshot, PGQ),
            1.0 + 1e-9,
        )
        ratio(
            f"burst {at} (fresh, unanalyzed): best configuration >= 90% of the backlog "
            "(analyzed) rate",
            best_of(burst, PG),
            best_of(backlog, PG),
            0.9,
            percent=True,
            across="burst/backlog",
        )


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

    drain_targets(results, add)
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
