"""Drain rates of django-pgtasks next to the raw-SQL ceiling: a shortcut for bench/run.py.

Usage, from the repository root::

    .venv/bin/python bench/throughput.py [bench/run.py options]

It is ``bench/run.py --only raw,pgtasks`` (any other option is passed on, and a later
``--only`` wins). bench/run.py is the full benchmark, with the peers, enqueue rates, wake-up
latency and the large-table scenario; see docs/performance.md.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
    run = Path(__file__).resolve().parent / "run.py"
    sys.argv = [str(run), "--only", "raw,pgtasks", *sys.argv[1:]]
    runpy.run_path(str(run), run_name="__main__")
