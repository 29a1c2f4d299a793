"""procrastinate's application for the benchmark: plain procrastinate, psycopg connector.

The connection comes from libpq's ``PG*`` variables (bench/run.py sets them). The pool holds
``BENCH_POOL_SIZE`` connections (default 10), so that ``--concurrency`` up to that many jobs
never waits for a connection. ``noop`` is async (the worker runs it on its event loop, the
fastest path procrastinate has); ``noop_sync`` is the same as a sync task (run in a thread).
"""

import os

import procrastinate

POOL_SIZE = int(os.environ.get("BENCH_POOL_SIZE", "10"))

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(min_size=2, max_size=POOL_SIZE),
)


@app.task(name="noop")
async def noop() -> None:
    """Does nothing."""


@app.task(name="noop_sync")
def noop_sync() -> None:
    """Does nothing, as a sync task."""
