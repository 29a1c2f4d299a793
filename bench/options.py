"""The command line of bench/run.py: its sections and options."""

from __future__ import annotations

import argparse
import re

SECTIONS = ("raw", "pgtasks", "peers", "enqueue", "latency", "startup", "large", "long", "profile")
DRAIN_SECTIONS = ("raw", "pgtasks", "peers")
DEFAULT_SECTIONS = ("raw", "pgtasks", "peers", "enqueue", "latency", "startup", "large")
#: The drain scenarios (bench/scenarios.py), in the order each round runs them.
SCENARIOS = ("backlog", "snapshot", "burst")


def shapes(text: str) -> list[str]:
    """``--raw-shapes``: comma-separated ``WxB`` (W processes, B tasks per claim) or ``WxBt``
    (W threads of one process)."""
    values = [v for v in text.split(",") if v]
    wrong = [v for v in values if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*t?", v)]
    if wrong:
        raise argparse.ArgumentTypeError(f"not WxB or WxBt: {', '.join(wrong)}")
    return values


def sizes(text: str) -> list[int]:
    """``--tasks``: comma-separated task counts (``20000,100000`` or ``20_000,100_000``)."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of whole numbers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("at least one task count, each 1 or more")
    return values


def comma_list(text: str) -> list[str]:
    """An option's comma-separated values (configurations, --processes values)."""
    return text.split(",")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except for flags and options without one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False):
            return action.help or ""
        return super()._get_help_string(action)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark django-pgtasks against the raw-SQL ceiling, procrastinate and "
        "django-tasks-db on one PostgreSQL server; print a table and save JSON.",
        formatter_class=_DefaultsFormatter,
        epilog="Configurations are PxC (P worker processes x C threads or concurrent jobs "
        "each), PxC+F (F = --prefetch), P@I (django-tasks-db: P processes, "
        "--interval I) or 'default' (the system's own defaults). See "
        "docs/performance.md.",
    )
    p.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated sections to run, from: {', '.join(SECTIONS)}",
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="also run the long memory run (--long-tasks tasks; takes minutes)",
    )
    p.add_argument(
        "--profile", action="store_true", help="also profile django-pgtasks workers with py-spy"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    p.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        type=comma_list,
        help="drain scenarios, from: backlog (N tasks seeded and analyzed, then the workers "
        "start), snapshot (backlog with a REPEATABLE READ transaction open for the whole "
        "drain), burst (warm workers, then N tasks inserted at once, unanalyzed)",
    )
    p.add_argument(
        "--tasks",
        type=sizes,
        default="20000,100000",
        help="tasks per drain (comma list: every scenario is drained at every size, by every "
        "system but procrastinate and django-tasks-db)",
    )
    p.add_argument(
        "--peer-tasks",
        type=int,
        default=5_000,
        help="cap on the tasks per drain of procrastinate and django-tasks-db (slow)",
    )
    p.add_argument(
        "--peers-everywhere",
        action="store_true",
        help="drain procrastinate and django-tasks-db in every scenario and size, not only "
        "in the burst scenario at the first size",
    )
    p.add_argument(
        "--raw-shapes",
        default="8x50,8x1",
        type=shapes,
        help="raw-ceiling shapes drained in every scenario and size: WxB = W processes "
        "claiming B tasks per statement (a 't' suffix: W threads of one process)",
    )
    p.add_argument(
        "--raw-extra-shapes",
        default="1x1,2x1,4x1,1x50,8x1t,8x50t",
        type=shapes,
        help="more raw-ceiling shapes, drained in the burst scenario at the first size only "
        "(how the ceiling scales; '' for none)",
    )
    p.add_argument(
        "--max-drain-seconds",
        type=float,
        default=30.0,
        help="a drain still running after this long is stopped, and its rate "
        "taken from the tasks finished by then",
    )
    p.add_argument(
        "--pgtasks",
        default="default,1x32,2x32,2x32+64",
        type=comma_list,
        help="django-pgtasks configurations",
    )
    p.add_argument(
        "--pgqueuer",
        default="default,2x50",
        type=comma_list,
        help="pgqueuer configurations: PxB = P processes, batch_size B (async no-op entrypoint)",
    )
    p.add_argument(
        "--startup-runs",
        type=int,
        default=5,
        help="worker starts timed per --processes value in the startup section",
    )
    p.add_argument(
        "--startup-processes",
        default="1,2",
        type=comma_list,
        help="--processes values of the startup section",
    )
    p.add_argument(
        "--procrastinate",
        default="1x1,1x8,2x8",
        type=comma_list,
        help="procrastinate configurations (async no-op task)",
    )
    p.add_argument(
        "--djtasks",
        default="1@0.1,2@0.1",
        type=comma_list,
        help="django-tasks-db configurations (db_worker processes @ --interval)",
    )
    p.add_argument(
        "--djtasks-latency",
        default="default,1@0.1",
        type=comma_list,
        help="django-tasks-db configurations for the latency measurement",
    )
    p.add_argument(
        "--latency-samples",
        type=int,
        default=100,
        help="tasks enqueued one by one into an idle worker, per system",
    )
    p.add_argument(
        "--single-enqueues",
        type=int,
        default=1_000,
        help="single enqueues (one transaction each) per run",
    )
    p.add_argument("--bulk-tasks", type=int, default=100_000, help="tasks per bulk enqueue")
    p.add_argument(
        "--large-finished",
        type=int,
        default=1_000_000,
        help="finished rows in the large-table scenario",
    )
    p.add_argument(
        "--large-pending",
        type=int,
        default=100_000,
        help="waiting rows in the large-table scenario",
    )
    p.add_argument(
        "--large-claims",
        type=int,
        default=1_000,
        help="single claims timed per round in the large-table scenario",
    )
    p.add_argument("--long-tasks", type=int, default=1_000_000, help="tasks in the long run")
    p.add_argument(
        "--long-config",
        default="1x8+42",
        help="django-pgtasks configuration of the long run (one process; the "
        "fastest single-process one, so that it takes minutes, not an hour)",
    )
    p.add_argument(
        "--long-sample-every",
        type=float,
        default=5.0,
        help="seconds between two RSS samples in the long run",
    )
    p.add_argument(
        "--long-vacuum-every",
        type=float,
        default=30.0,
        help="seconds between two VACUUM (ANALYZE) of the task table in the long "
        "run, when the server's autovacuum is off",
    )
    p.add_argument(
        "--profile-configs",
        default="1x8,1x8+42",
        type=comma_list,
        help="django-pgtasks configurations to profile with --profile",
    )
    p.add_argument(
        "--database", default="pgtasks_bench", help="scratch database (created, then dropped)"
    )
    p.add_argument(
        "--output",
        default=None,
        help="results file (default: bench/results/<date>-<machine>.json, with the "
        "sections appended to the name when only some of them run)",
    )
    p.add_argument(
        "--keep-database", action="store_true", help="do not drop the scratch database at the end"
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="measure nothing: print the report of an earlier results file",
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="with --report: print the summary and the main tables as Markdown",
    )
    args = p.parse_args()
    args.sections = [s for s in args.only.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    args.scenarios = [s for s in args.scenarios if s]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    if args.long and "long" not in args.sections:
        args.sections.append("long")
    if args.profile and "profile" not in args.sections:
        args.sections.append("profile")
    return args
