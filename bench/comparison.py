"""The drain rows side by side: their medians, the raw ceiling's and the peers' rows, and each
row's ratios to the raw ceiling and to pgqueuer."""

from __future__ import annotations

from raw_ceiling import RAW_SHAPES, raw_key

PEER_SYSTEMS = ("pgqueuer", "procrastinate", "django-tasks-db")


def med(entry: dict, field: str = "rate") -> float | None:
    value = entry.get(field) if isinstance(entry, dict) else None
    return value["median"] if isinstance(value, dict) else None


def raw_for(results: dict, workers: int, batch: int) -> float | None:
    """Median rate of the raw ceiling (processes) of that shape, workers capped at those
    measured."""
    measured = sorted(w for w, b, processes in RAW_SHAPES if b == batch and processes)
    w = max([m for m in measured if m <= workers] or measured[:1])
    return med(results.get(raw_key(w, batch, True), {}))


def best_raw_batch(results: dict) -> float | None:
    rates = [med(results.get(raw_key(w, b, True), {})) for w, b, p in RAW_SHAPES if b > 1 and p]
    rates = [r for r in rates if r]
    return max(rates) if rates else None


def peer_rows(results: dict, system: str | None = None) -> list[tuple[str, dict]]:
    return [
        (k, v)
        for k, v in results.items()
        if isinstance(v, dict)
        and med(v)
        and v.get("system") in PEER_SYSTEMS
        and (system is None or v["system"] == system)
    ]


def best_peer(results: dict, system: str | None = None) -> tuple[str, float] | None:
    peers = [(k, med(v)) for k, v in peer_rows(results, system)]
    return max(peers, key=lambda kv: kv[1]) if peers else None


def default_of(results: dict, system: str) -> tuple[str, dict] | None:
    """The row of ``system`` in its own default configuration."""
    return next(
        (
            (k, v)
            for k, v in results.items()
            if isinstance(v, dict) and v.get("system") == system and " default (" in k and med(v)
        ),
        None,
    )


def compare(results: dict) -> None:
    """Add, to every drain row, its ratios: to the raw one-per-claim ceiling at the same
    number of workers (processes, for django-pgtasks: processes x threads), to the best raw
    batch-50 ceiling, and to pgqueuer's best and default rows."""
    raw50 = best_raw_batch(results)
    pgq_best = best_peer(results, "pgqueuer")
    pgq_default = default_of(results, "pgqueuer")
    for entry in results.values():
        if not isinstance(entry, dict) or "rate" not in entry or "system" not in entry:
            continue
        rate = med(entry)
        if entry["system"] == "raw SQL":
            continue
        if entry["system"] == "django-pgtasks":
            workers = entry["processes"] * entry["concurrency"]
            base = raw_for(results, workers, 1)
            entry["raw1_shape"] = f"raw {min(workers, 8)} processes, batch 1"
            entry["vs_raw1"] = rate / base if base else None
        entry["vs_raw50"] = rate / raw50 if raw50 else None
        entry["vs_pgqueuer_best"] = rate / pgq_best[1] if pgq_best else None
        entry["vs_pgqueuer_default"] = rate / med(pgq_default[1]) if pgq_default else None
