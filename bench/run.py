"""Benchmark django-pgtasks against the raw-SQL ceiling and its Python peers, in one run.

Usage, from the repository root, with the project's virtualenv::

    .venv/bin/python bench/run.py              # the default run (about 45 minutes)
    .venv/bin/python bench/run.py --long       # plus worker memory over 1,000,000 tasks
    .venv/bin/python bench/run.py --profile    # plus a py-spy profile of a worker
    .venv/bin/python bench/run.py --only enqueue,latency --repeat 5
    .venv/bin/python bench/run.py --only raw,pgtasks,peers --repeat 5   # the drains only
    .venv/bin/python bench/run.py --only raw,pgtasks,peers --scenarios backlog --tasks 20000
    .venv/bin/python bench/run.py --report bench/results/FILE.json [--markdown]

Everything runs against the same PostgreSQL server (``PG*`` variables, else localhost:5432 as
postgres), one measurement after another, in a scratch database (``--database``) that is
created at the start and dropped at the end. The peers (procrastinate, django-tasks-db) and
py-spy are installed into ``bench/.venv-peers`` only, from bench/requirements-peers.txt.

Drain rates: N no-op tasks drained in each scenario (``--scenarios``, bench/scenarios.py) and
at each size (``--tasks``, a comma list), every (scenario, size) pair a *combination*:

- ``backlog``: N tasks seeded and the queue's table analyzed (``ANALYZE``) before the workers
  start;
- ``snapshot``: the backlog, with a REPEATABLE READ transaction that took its snapshot before
  the workers started held open, idle, until the drain ends (so that nothing it could still
  see can be cleaned up meanwhile);
- ``burst``: workers started on an empty queue and given time to connect, then N tasks
  inserted in one statement, never analyzed.

The rate is the tasks finished divided by the time from the first task's start to the last
task's finish, as the database recorded them; a drain still running after
``--max-drain-seconds`` is stopped and rated on what finished. Worker CPU is the user+system
time of the worker processes (all threads, all children) from when they are ready to the end
of the drain, from /proc, per task finished meanwhile; server CPU likewise for every
PostgreSQL process; RSS is that of the largest worker process when the drain ends. The raw
ceiling's ``--raw-shapes`` (default: 8 processes claiming 50 or 1 per statement),
django-pgtasks and pgqueuer are drained in every combination; the ``--raw-extra-shapes``,
procrastinate and django-tasks-db (slow: at most ``--peer-tasks`` tasks) only in the burst
scenario at the first size, unless ``--peers-everywhere``. Each round (``--repeat``) drains
every combination with every system and configuration once before the next round starts, so
that a burst of load from elsewhere hits them alike; each drain is reported as min / median /
max, and ratios use medians, within a combination.

The results are printed as tables (one per combination, then a summary of the combinations side
by side and the targets) and saved to bench/results/<date>-<machine>.json, the drains under
``"drains"``, by combination (``"backlog 20000"``) and row. ``--report`` prints a saved file
again, also one of before the scenarios (its drains at the top level).

This file parses the options (options.py) and runs the sections, each in a module of its own:
drains.py (with scenarios.py and raw_ceiling.py), enqueue.py, latency.py, startup.py,
large_table.py, long_run.py and pyspy_profile.py, on what harness.py, systems.py and common.py
share; then comparison.py, targets.py and report.py make the ratios, the targets and the
tables.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from common import (  # noqa: E402
    DJTASKS_SETTINGS,
    PGTASKS_SETTINGS,
    PROCRASTINATE_APP,
    ROOT,
    child_env,
    connect,
    drop_database,
    ensure_peers_venv,
    machine_description,
    peers_python,
    recreate_database,
)
from comparison import compare  # noqa: E402
from drains import section_drains  # noqa: E402
from enqueue import section_enqueue  # noqa: E402
from harness import log, stop_all  # noqa: E402
from large_table import section_large  # noqa: E402
from latency import section_latency  # noqa: E402
from long_run import section_long  # noqa: E402
from options import DEFAULT_SECTIONS, DRAIN_SECTIONS, parse_args  # noqa: E402
from pyspy_profile import section_profile  # noqa: E402
from report import markdown_report, print_report  # noqa: E402
from startup import section_startup  # noqa: E402
from targets import evaluate_targets  # noqa: E402

#: What runs each section but "profile" (which also takes the date); "drains" runs the
#: sections "raw", "pgtasks" and "peers", in interleaved rounds.
SECTION_RUNS = {
    "drains": section_drains,
    "enqueue": section_enqueue,
    "latency": section_latency,
    "startup": section_startup,
    "large": section_large,
    "long": section_long,
}


def setup(args, results: dict) -> None:
    recreate_database(args.database)
    env = child_env(args.database)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0", "--settings", PGTASKS_SETTINGS],
        cwd=ROOT,
        env=env,
        check=True,
    )
    if not {"peers", "latency", "profile"} & set(args.sections):
        return
    try:
        results["machine"]["peers"] = ensure_peers_venv(log)
        subprocess.run(
            [
                str(peers_python()),
                "-m",
                "django",
                "migrate",
                "-v0",
                "--settings",
                DJTASKS_SETTINGS,
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [str(peers_python()), "-m", "pgqueuer", "install"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                str(peers_python()),
                "-m",
                "procrastinate",
                "--app",
                PROCRASTINATE_APP,
                "schema",
                "--apply",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        results["peers_error"] = f"{exc}: {detail.decode(errors='replace')[-2000:]}"
        log(
            f"The peers could not be installed or set up; they are skipped: "
            f"{results['peers_error']}"
        )


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main()'s clean-up


def main() -> int:
    args = parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(markdown_report(saved) if args.markdown else "", end="")
        if not args.markdown:
            print_report(saved)
        return 0
    # Clean up (stop our workers, drop the scratch database) on SIGTERM and on SIGINT, also
    # when started in the background, where SIGINT would otherwise be ignored.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    os.environ["DJANGO_SETTINGS_MODULE"] = PGTASKS_SETTINGS
    os.environ["PGDATABASE"] = args.database
    import django

    django.setup()
    from django.db import connection

    stamp = dt.date.today().isoformat()
    machine = platform.node().split(".")[0] or "machine"
    name = f"{stamp}-{machine}"
    if not set(DEFAULT_SECTIONS) <= set(args.sections):  # a partial run: keep the full one
        name += "-" + "-".join(args.sections)
    output = Path(args.output) if args.output else BENCH / "results" / f"{name}.json"
    results: dict = {
        "machine": machine_description(),
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "arguments": {k: v for k, v in vars(args).items()},
    }
    results["machine"]["django"] = django.get_version()
    import psycopg

    results["machine"]["psycopg"] = psycopg.__version__
    log(f"Sections: {', '.join(args.sections)}; scratch database {args.database!r}")
    t_start = time.monotonic()
    try:
        setup(args, results)
        with connect(args.database) as conn:
            results["machine"]["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            results["machine"]["postgresql_settings"] = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
                    "'synchronous_commit', 'fsync', 'wal_sync_method', 'max_connections', "
                    "'shared_preload_libraries', 'commit_delay', 'autovacuum')"
                ).fetchall()
            )
        sections = [s for s in args.sections if s not in DRAIN_SECTIONS]
        if set(args.sections) & set(DRAIN_SECTIONS):
            sections.insert(0, "drains")
        for section in sections:
            log(f"== {section}")
            t0 = time.monotonic()
            try:
                if section == "profile":
                    section_profile(args, results, stamp)
                else:
                    SECTION_RUNS[section](args, results)
            except Exception as exc:
                traceback.print_exc()
                results[f"{section} error"] = str(exc)
            log(f"   {section} took {time.monotonic() - t0:.0f}s")
            connection.close()
    finally:
        stop_all()
        connection.close()
        if not args.keep_database:
            drop_database(args.database)
    compare(results)
    results["targets"] = evaluate_targets(results)
    results["duration_s"] = round(time.monotonic() - t_start)
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    output.parent.mkdir(exist_ok=True)
    output.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print_report(results)
    print(
        f"\nSaved {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output} "
        f"({results['duration_s']}s)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
