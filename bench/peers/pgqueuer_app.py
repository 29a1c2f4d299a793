"""pgqueuer's side of the benchmark: a ``noop`` entrypoint, a ``sleep`` one (waits as many
seconds as its payload says, bench/pools_async.py) and a runner.

``python -m bench.peers.pgqueuer_app [--batch-size N] [--max-concurrent-tasks M]`` does what
``pgq run`` does (build the ``PgQueuer``, then ``run()`` it with the given batch size and cap
on the jobs it runs at once; the other options keep pgqueuer's defaults). The ``pgq`` command
line of pgqueuer 1.6 fails on its own ``--log-level`` handling with the click version it
installs, hence this runner. The connection comes from libpq's
``PG*`` variables (set by bench/run.py), with asyncpg, the driver pgqueuer's documentation
leads with. pgqueuer's logging is set to WARNING, like the other workers.
"""

import argparse
import asyncio
import logging
import os

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.models import Job


async def create() -> PgQueuer:
    # asyncpg reads PGHOST, PGDATABASE... but not PGAPPNAME, which bench/run.py looks for.
    connection = await asyncpg.connect(
        server_settings={"application_name": os.environ.get("PGAPPNAME", "pgqueuer")})
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Does nothing."""

    @pgq.entrypoint("sleep")
    async def sleep(job: Job) -> None:
        """Waits as many seconds as the payload says: an I/O-bound job."""
        await asyncio.sleep(float(job.payload or b"0"))

    return pgq


async def main(batch_size: int, max_concurrent_tasks: int | None = None) -> None:
    pgq = await create()
    await pgq.run(batch_size=batch_size, max_concurrent_tasks=max_concurrent_tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=10)  # pgqueuer's default
    parser.add_argument("--max-concurrent-tasks", type=int, default=None)  # unlimited
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    options = parser.parse_args()
    asyncio.run(main(options.batch_size, options.max_concurrent_tasks))
