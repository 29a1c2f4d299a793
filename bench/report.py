"""The report of a run: the tables printed at its end (or by ``--report FILE``), and the main
ones as Markdown (``--markdown``): per combination (scenario and size, bench/scenarios.py) the
table of every drain, and a summary of the combinations side by side."""

from __future__ import annotations

from comparison import best_of, default_of, drain_combinations, med
from raw_ceiling import raw_key
from scenarios import combination_key, combination_label, split_combination

PG, PGQ = "django-pgtasks", "pgqueuer"
RAW50, RAW1 = raw_key(8, 50, True), raw_key(8, 1, True)
SUMMARY_LEGEND = (
    "Summary: medians, tasks/s; in parentheses the ratio to pgqueuer's best (to its defaults "
    "for the default rows); then the rate kept, snapshot / backlog and burst / backlog."
)


def _cell(row: tuple[str, dict] | None, base: tuple[str, dict] | None = None, named=False) -> str:
    """A row's median rate, its ratio to ``base``'s in parentheses, its configuration."""
    if not row:
        return "-"
    text = f"{med(row[1]):,.0f}"
    if base and base is not row:
        text += f" ({med(row[1]) / med(base[1]):.2f}x)"
    if named:
        text += f" {row[1].get('config', '')}"
    return text


def _raw(entries: dict, key: str) -> tuple[str, dict] | None:
    return (key, entries[key]) if med(entries.get(key, {})) else None


def summary_tables(results: dict) -> list[tuple[list[str], list[list[str]]]]:
    """The summary: medians of the main rows, combination by combination (ratio to pgqueuer's
    best, or to its defaults for the default rows), the best configuration's CPU per task;
    then, size by size, the rate kept by the snapshot and the burst scenarios relative to the
    backlog. (header, rows) of each table; none for a results file of before the scenarios."""
    combos = {k: v for k, v in drain_combinations(results).items() if k}
    if not combos:
        return []
    header = ["tasks/s, median", *(combination_label(k) for k in combos)]
    lines: dict[str, list[str]] = {
        RAW50: [],
        RAW1: [],
        "pgqueuer best": [],
        "django-pgtasks best": [],
        "pgqueuer defaults": [],
        "django-pgtasks defaults": [],
        "django-pgtasks best: CPU us/task, worker + server": [],
    }
    cells = list(lines.values())
    for entries in combos.values():
        pgq_best, pgq_default = best_of(entries, PGQ), default_of(entries, PGQ)
        best = best_of(entries, PG)
        cells[0].append(_cell(_raw(entries, RAW50), pgq_best))
        cells[1].append(_cell(_raw(entries, RAW1), pgq_best))
        cells[2].append(_cell(pgq_best, named=True))
        cells[3].append(_cell(best, pgq_best, named=True))
        cells[4].append(_cell(pgq_default))
        cells[5].append(_cell(default_of(entries, PG), pgq_default))
        worker = med(best[1], "cpu_us_per_task") if best else None
        server = med(best[1], "server_cpu_us_per_task") if best else None
        cells[6].append(
            "-"
            if worker is None
            else f"{worker:.0f}"
            if server is None
            else f"{worker:.0f} + {server:.0f} = {worker + server:.0f}"
        )
    tables = [(header, [[name, *row] for name, row in lines.items()])]
    sizes = sorted({split_combination(k)[1] for k in combos})
    retention = []
    for scenario in ("snapshot", "burst"):
        for label, system, pick in (
            ("django-pgtasks best", PG, best_of),
            ("django-pgtasks defaults", PG, default_of),
            ("pgqueuer best", PGQ, best_of),
            ("pgqueuer defaults", PGQ, default_of),
            ("raw 8 processes, batch 50", None, lambda e, _: _raw(e, RAW50)),
        ):
            if scenario == "burst" and system != PG:
                continue  # the burst scenario's question is django-pgtasks' planning
            row = [f"{scenario} / backlog, {label}"]
            for n in sizes:
                ours = pick(combos.get(combination_key(scenario, n), {}), system)
                base = pick(combos.get(combination_key("backlog", n), {}), system)
                row.append(f"{med(ours[1]) / med(base[1]):.0%}" if ours and base else "-")
            if any(c != "-" for c in row[1:]):
                retention.append(row)
    if retention:
        tables.append((["rate kept", *(f"{n:,} tasks" for n in sizes)], retention))
    return tables


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Aligned columns: the first to the left, the figures to the right."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(r: list[str]) -> str:
        cells = [c.rjust(w) for c, w in zip(r, widths, strict=True)]
        cells[0] = r[0].ljust(widths[0])
        return "  ".join(cells).rstrip()

    return "\n".join(line(r) for r in table)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "| --- |" + " ---: |" * (len(header) - 1),
            *("| " + " | ".join(r) + " |" for r in rows),
        ]
    )


def markdown_drains(entries: dict) -> list[str]:
    lines = [
        "| Configuration | tasks/s, median | min-max | vs raw 1/claim, same workers "
        "| vs raw 50/claim | vs pgqueuer best | vs pgqueuer default | CPU per task "
        "| server CPU per task | RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, e in entries.items():
        if not isinstance(e, dict) or "system" not in e or not isinstance(e.get("rate"), dict):
            continue
        r = e["rate"]
        rss = f"{med(e, 'rss_mb'):.0f} MB" if "rss_mb" in e else ""
        lines.append(
            f"| {key} | {r['median']:,.0f} | {r['min']:,.0f}-{r['max']:,.0f} "
            f"| {fmt(e.get('vs_raw1'), '.0%')} | {fmt(e.get('vs_raw50'), '.0%')} "
            f"| {fmt(e.get('vs_pgqueuer_best'), '.2f', 'x')} "
            f"| {fmt(e.get('vs_pgqueuer_default'), '.2f', 'x')} "
            f"| {fmt(med(e, 'cpu_us_per_task'), ',.0f', ' us')} "
            f"| {fmt(med(e, 'server_cpu_us_per_task'), ',.0f', ' us')} | {rss} |"
        )
    for key, e in entries.items():
        if isinstance(e, dict) and "system" in e and "error" in e and "rate" not in e:
            lines.append(f"| {key} | error: {e['error'][:80]} | | | | | | | | |")
    return lines


def markdown_report(results: dict) -> str:
    """The summary and the main figures as Markdown tables (``--report FILE --markdown``),
    for the docs."""
    lines: list[str] = []
    tables = summary_tables(results)
    if tables:
        lines += [SUMMARY_LEGEND, ""]
    for header, rows in tables:
        lines += [markdown_table(header, rows), ""]
    for combination, entries in drain_combinations(results).items():
        if combination:
            lines += [f"#### {combination_label(combination)}", ""]
        lines += [*markdown_drains(entries), ""]
    lat = {k[8:]: v for k, v in results.items() if k.startswith("latency") and "median_ms" in v}
    if lat:
        best = min(v["median_ms"] for k, v in lat.items() if "pgtasks" not in k)
        lines += [
            "| Worker | median | p99 | max | samples | median vs best peer |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for k, v in lat.items():
            lines.append(
                f"| {k} | {v['median_ms']:.1f} ms | {v['p99_ms']:.1f} ms | "
                f"{v['max_ms']:.1f} ms | {v['samples']} | "
                f"{v['median_ms'] / best:.2f}x |"
            )
        lines.append("")
    if results.get("targets"):
        lines += ["| Target | Measured | Status |", "| --- | --- | --- |"]
        lines += [
            f"| {t['target']} | {t['measured']} | {t['status']} |" for t in results["targets"]
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def print_drains(entries: dict) -> None:
    print(
        f"{'measurement':42} {'median':>7} {'min-max':>13} {'raw 1':>6} {'raw 50':>6} "
        f"{'pgq best':>8} {'pgq dflt':>8} {'CPU us/task':>11} {'PG us/task':>10} "
        f"{'RSS MB':>7}"
    )
    for key, e in entries.items():
        if not isinstance(e, dict) or "system" not in e:
            continue
        if "error" in e and "rate" not in e:
            print(f"{key:42} error: {e['error'][:60]}")
            continue
        if "rate" not in e or not isinstance(e["rate"], dict):
            continue
        r = e["rate"]
        print(
            f"{key:42} {r['median']:7.0f} {r['min']:6.0f}-{r['max']:<6.0f} "
            f"{fmt(e.get('vs_raw1'), '6.0%'):>6} {fmt(e.get('vs_raw50'), '6.0%'):>6} "
            f"{fmt(e.get('vs_pgqueuer_best'), '7.2f', 'x'):>8} "
            f"{fmt(e.get('vs_pgqueuer_default'), '7.2f', 'x'):>8} "
            f"{fmt(med(e, 'cpu_us_per_task'), '11.0f'):>11} "
            f"{fmt(med(e, 'server_cpu_us_per_task'), '10.0f'):>10} "
            f"{fmt(med(e, 'rss_mb'), '7.0f'):>7}"
        )


def print_report(results: dict) -> None:
    print(
        "\nDrain rate (no-op tasks, tasks/s from the database's timestamps; "
        "median of the runs, [min-max])"
    )
    for combination, entries in drain_combinations(results).items():
        if combination:
            print(f"\n-- {combination_label(combination)}")
        print_drains(entries)
    for key, e in results.items():
        if key.startswith("drain") and isinstance(e, str):
            print(f"{key}: {e}")
    tables = summary_tables(results)
    if tables:
        print(f"\n{SUMMARY_LEGEND}")
        print("\n\n".join(text_table(header, rows) for header, rows in tables))
    if "enqueue single" in results:
        s = results["enqueue single"]
        print(
            f"\nSingle enqueue, one task per transaction ({s['tasks']} per run): "
            f"Task.objects.enqueue {s['enqueue_us']['median']:.0f} us "
            f"[{s['enqueue_us']['min']:.0f}-{s['enqueue_us']['max']:.0f}], raw INSERT "
            f"{s['raw_insert_us']['median']:.0f} us "
            f"[{s['raw_insert_us']['min']:.0f}-{s['raw_insert_us']['max']:.0f}]: "
            f"{s['enqueue_us']['median'] / s['raw_insert_us']['median']:.2f}x the raw cost"
            f"\n  client CPU per enqueue: {s['enqueue_client_cpu_us']['median']:.0f} us vs "
            f"{s['raw_insert_client_cpu_us']['median']:.0f} us for the raw INSERT"
        )
    if "enqueue bulk" in results:
        b = results["enqueue bulk"]
        print(f"Bulk enqueue of {b['tasks']:,} tasks (tasks/s, median [min-max]):")
        for label, field in (
            ("COPY", "copy_per_s"),
            ("build()", "build_per_s"),
            ("enqueue_many()", "enqueue_many_per_s"),
            ("build() + enqueue_many()", "build_and_enqueue_many_per_s"),
            ("enqueue_bulk() (COPY)", "enqueue_bulk_per_s"),
        ):
            v = b.get(field)
            if v is None:
                continue
            print(
                f"  {label:26} {v['median']:9.0f} [{v['min']:.0f}-{v['max']:.0f}]"
                f"  {v['median'] / b['copy_per_s']['median']:5.0%} of COPY"
            )
    lat = {k: v for k, v in results.items() if k.startswith("latency")}
    if lat:
        print("\nEnqueue-to-start latency into an idle worker:")
        for key, v in lat.items():
            if "error" in v:
                print(f"  {key[8:]:36} error: {v['error'][:70]}")
            else:
                print(
                    f"  {key[8:]:36} median {v['median_ms']:7.1f} ms   p99 "
                    f"{v['p99_ms']:7.1f} ms   ({v['samples']} samples)"
                )
    if "startup" in results:
        print("\nStart-up: from starting run_pgtasks to its first task running (queue full):")
        for key, v in results["startup"].items():
            print(f"  {key:16} median {v['median_s']:.2f} s, max {v['max_s']:.2f} s")
    if "large table" in results:
        lt = results["large table"]
        base = lt.get("near-empty")
        print(
            "\nLarge table (claim: mean of single claims, median of 3 rounds; counts: mean of "
            "5; ratio to the near-empty table):"
        )
        for name, e in lt.items():
            ratio = e["claim_ms"]["median"] / base["claim_ms"]["median"] if base else None
            print(
                f"  {name:28} claim {e['claim_ms']['median']:6.2f} ms ({fmt(ratio, '.2f')}x)"
                f"  [{e['table_size']}]"
            )
            for label, ms in e["counts_ms"].items():
                r = ms / base["counts_ms"][label] if base else None
                print(f"      {label:44} {ms:8.1f} ms ({fmt(r, '.1f')}x)")
    if "long run" in results:
        r = results["long run"]
        print(
            f"\nLong run, {r['tasks']:,} tasks, {r['config']}: {r['rate']:.0f} tasks/s, "
            f"{r['cpu_us_per_task']:.0f} us CPU/task; worker RSS idle {r['rss_idle_mb']:.1f} "
            f"MB, at 10% {r['rss_at_10pct_mb']:.1f}, at 50% {r['rss_at_50pct_mb']:.1f}, at "
            f"the end {r['rss_end_mb']:.1f} MB (max {r['rss_max_mb']:.1f})"
        )
    if results.get("targets"):
        print("\nTargets:")
        for t in results["targets"]:
            print(f"  [{t['status']:^12}] {t['target']}\n                 {t['measured']}")
    if "profile" in results:
        for label, p in results["profile"].items():
            if "self_pct" not in p:
                continue
            print(
                f"\npy-spy, django-pgtasks {label} ({p['samples']} samples), "
                "top functions by self time:"
            )
            for name, pct in p["self_pct"][:12]:
                print(f"  {pct:5.1f}%  {name}")
