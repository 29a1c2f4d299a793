"""The report of a run: the tables printed at its end (or by ``--report FILE``), and the main
ones as Markdown (``--markdown``)."""

from __future__ import annotations

from comparison import med


def markdown_report(results: dict) -> str:
    """The main figures as Markdown tables (``--report FILE --markdown``), for the docs."""
    lines = [
        "| Configuration | tasks/s, median | min-max | vs raw 1/claim, same workers "
        "| vs raw 50/claim | vs pgqueuer best | vs pgqueuer default | CPU per task "
        "| server CPU per task | RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, e in results.items():
        if not isinstance(e, dict) or "system" not in e or not isinstance(e.get("rate"), dict):
            continue
        r = e["rate"]
        rss = f"{med(e, 'rss_mb'):.0f} MB" if "rss_mb" in e else ""
        lines.append(
            f"| {key} | {r['median']:,.0f} | {r['min']:,.0f}-{r['max']:,.0f} "
            f"| {fmt(e.get('vs_raw1'), '.0%')} | {fmt(e.get('vs_raw50'), '.0%')} "
            f"| {fmt(e.get('vs_pgqueuer_best'), '.2f', 'x')} "
            f"| {fmt(e.get('vs_pgqueuer_default'), '.2f', 'x')} "
            f"| {med(e, 'cpu_us_per_task'):,.0f} us "
            f"| {fmt(med(e, 'server_cpu_us_per_task'), ',.0f', ' us')} | {rss} |"
        )
    for key, e in results.items():
        if isinstance(e, dict) and "system" in e and "error" in e and "rate" not in e:
            lines.append(f"| {key} | error: {e['error'][:80]} | | | | | | | | |")
    lat = {k[8:]: v for k, v in results.items() if k.startswith("latency") and "median_ms" in v}
    if lat:
        best = min(v["median_ms"] for k, v in lat.items() if "pgtasks" not in k)
        lines += [
            "",
            "| Worker | median | p99 | max | samples | median vs best peer |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for k, v in lat.items():
            lines.append(
                f"| {k} | {v['median_ms']:.1f} ms | {v['p99_ms']:.1f} ms | "
                f"{v['max_ms']:.1f} ms | {v['samples']} | "
                f"{v['median_ms'] / best:.2f}x |"
            )
    if results.get("targets"):
        lines += ["", "| Target | Measured | Status |", "| --- | --- | --- |"]
        lines += [
            f"| {t['target']} | {t['measured']} | {t['status']} |" for t in results["targets"]
        ]
    return "\n".join(lines)


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def print_report(results: dict) -> None:
    print(
        "\nDrain rate (no-op tasks, tasks/s from the database's timestamps; "
        "median of the runs, [min-max])"
    )
    print(
        f"{'measurement':42} {'median':>7} {'min-max':>13} {'raw 1':>6} {'raw 50':>6} "
        f"{'pgq best':>8} {'pgq dflt':>8} {'CPU us/task':>11} {'PG us/task':>10} "
        f"{'RSS MB':>7}"
    )
    for key, e in results.items():
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
            f"{fmt(e.get('vs_raw1'), '6.0%')} {fmt(e.get('vs_raw50'), '6.0%')} "
            f"{fmt(e.get('vs_pgqueuer_best'), '7.2f', 'x'):>8} "
            f"{fmt(e.get('vs_pgqueuer_default'), '7.2f', 'x'):>8} "
            f"{fmt(med(e, 'cpu_us_per_task'), '11.0f')} "
            f"{fmt(med(e, 'server_cpu_us_per_task'), '10.0f')} "
            f"{fmt(med(e, 'rss_mb'), '7.0f')}"
        )
    for key, e in results.items():
        if key.startswith("drain error"):
            print(f"{key}: {e}")
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
