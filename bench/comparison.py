"""The drain rows side by side, combination by combination (bench/scenarios.py): their medians,
the raw ceiling's and the peers' rows, the best and default rows of a system, and each row's
ratios to the raw ceiling and to pgqueuer."""

from __future__ import annotations

PEER_SYSTEMS = ("pgqueuer", "procrastinate", "django-tasks-db")


def med(entry: dict, field: str = "rate") -> float | None:
    value = entry.get(field) if isinstance(entry, dict) else None
    return value["median"] if isinstance(value, dict) else None


def drain_combinations(results: dict) -> dict[str, dict]:
    """The drain rows by combination: ``results["drains"]``; a results file of before the
    scenarios (its rows at the top level, all burst drains) as one combination, ``""``."""
    if "drains" in results:
        return results["drains"]
    return {"": results}


def rows(entries: dict, system: str | None = None) -> list[tuple[str, dict]]:
    """The measured rows (those with a rate) of a combination, of one system or of all."""
    return [
        (k, v)
        for k, v in entries.items()
        if isinstance(v, dict)
        and "system" in v
        and med(v)
        and (system is None or v["system"] == system)
    ]


def raw_for(entries: dict, workers: int, batch: int) -> tuple[str, float] | None:
    """(key, median rate) of the raw ceiling (processes) claiming ``batch`` at a time with the
    most processes up to ``workers`` measured in the combination, else with the fewest."""
    raw = sorted(
        (
            (v["processes"], k, med(v))
            for k, v in rows(entries, "raw SQL")
            if v["batch"] == batch and v.get("as_processes")
        ),
    )
    if not raw:
        return None
    within = [r for r in raw if r[0] <= workers]
    _, key, rate = within[-1] if within else raw[0]
    return key, rate


def best_raw_batch(entries: dict) -> float | None:
    rates = [
        med(v) for _, v in rows(entries, "raw SQL") if v["batch"] > 1 and v.get("as_processes")
    ]
    return max(rates) if rates else None


def peer_rows(entries: dict, system: str | None = None) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in rows(entries, system) if v["system"] in PEER_SYSTEMS]


def best_of(entries: dict, system: str) -> tuple[str, dict] | None:
    """The row of ``system`` with the highest median rate in the combination."""
    found = rows(entries, system)
    return max(found, key=lambda kv: med(kv[1])) if found else None


def best_peer(entries: dict, system: str | None = None) -> tuple[str, float] | None:
    peers = [(k, med(v)) for k, v in peer_rows(entries, system)]
    return max(peers, key=lambda kv: kv[1]) if peers else None


def default_of(entries: dict, system: str) -> tuple[str, dict] | None:
    """The row of ``system`` in its own default configuration."""
    return next(((k, v) for k, v in rows(entries, system) if " default (" in k), None)


def compare(results: dict) -> None:
    """Add, to every drain row of every combination, its ratios: to the raw one-per-claim
    ceiling at the same number of workers (processes, for django-pgtasks: processes x
    threads), to the best raw batch-50 ceiling, and to pgqueuer's best and default rows, all
    of the same combination."""
    for entries in drain_combinations(results).values():
        compare_combination(entries)


def compare_combination(entries: dict) -> None:
    raw50 = best_raw_batch(entries)
    pgq_best = best_peer(entries, "pgqueuer")
    pgq_default = default_of(entries, "pgqueuer")
    for _, entry in rows(entries):
        rate = med(entry)
        if entry["system"] == "raw SQL":
            continue
        if entry["system"] == "django-pgtasks":
            raw1 = raw_for(entries, entry["processes"] * entry["concurrency"], 1)
            entry["raw1_shape"] = raw1[0] if raw1 else None
            entry["vs_raw1"] = rate / raw1[1] if raw1 else None
        entry["vs_raw50"] = rate / raw50 if raw50 else None
        entry["vs_pgqueuer_best"] = rate / pgq_best[1] if pgq_best else None
        entry["vs_pgqueuer_default"] = rate / med(pgq_default[1]) if pgq_default else None
