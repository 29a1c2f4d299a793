"""What a durable step costs: tasks of 0, 1, 5 and 10 steps that do nothing, drained side by
side in one run, with plain and atomic steps.

Each step keeps its result with one ``UPDATE`` of the task's row (its checkpoint); an atomic
step wraps its function and that ``UPDATE`` in a transaction. The cost per step is the
extra time a slot spends per task over the task without steps, divided by its steps (and
the same for the CPU of the worker process, start-up included).

    python bench/steps.py [--tasks 1000] [--concurrency 2] [--rounds 3] [--output FILE]

It uses the scratch database of bench/pools.py (made and dropped here), and its drain: N
tasks inserted at once, drained by ``run_pgtasks --burst``, the span taken from the database.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import pools
from common import drop_database, recreate_database

#: (label, steps per task, atomic)
KINDS = [("no steps", 0, False), ("1 step", 1, False), ("5 steps", 5, False),
         ("10 steps", 10, False), ("10 atomic steps", 10, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None,
                        help="write the table (Markdown) to this file too")
    args = parser.parse_args()
    recreate_database(pools.DATABASE)
    try:
        pools.django("migrate", "-v0")
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in KINDS}
        for _ in range(args.rounds):  # interleaved, so that a busy moment hits every kind
            for label, count, atomic in KINDS:
                results[label].append(pools.drain(
                    "thread", "bench.steps", json.dumps([count, atomic]), args.tasks,
                    args.concurrency))
    finally:
        drop_database(pools.DATABASE)
    medians = {label: {key: statistics.median(r[key] for r in runs)
                       for key in ("rate", "slot_ms", "cpu_ms")}
               for label, runs in results.items()}
    base = medians["no steps"]
    rows = []
    for label, count, _atomic in KINDS:
        med = medians[label]
        per_step = ((med["slot_ms"] - base["slot_ms"]) / count * 1000) if count else 0.0
        cpu_step = ((med["cpu_ms"] - base["cpu_ms"]) / count * 1000) if count else 0.0
        rows.append((label, med["rate"], med["slot_ms"], per_step, cpu_step))
        print(f"{label:16} {med['rate']:7.0f} tasks/s  {med['slot_ms']:6.2f} ms/task/slot  "
              f"+{per_step:6.0f} us per step  cpu +{cpu_step:6.0f} us per step", flush=True)
    table = [
        f"Measured {time.strftime('%Y-%m-%d')} by `python bench/steps.py --tasks {args.tasks} "
        f"--concurrency {args.concurrency} --rounds {args.rounds}` on {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; medians of "
        f"{args.rounds} interleaved rounds, thread pool.",
        "",
        "| tasks of | tasks/s | ms per task per slot | per step (us of a slot) "
        "| worker CPU per step (us) |",
        "|---|---:|---:|---:|---:|",
        *(f"| {label} | {rate:,.0f} | {slot:.2f} | {step:,.0f} | {cpu:,.0f} |"
          for label, rate, slot, step, cpu in rows),
    ]
    if args.output:
        args.output.write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
