"""The queues under test, each behind the same small interface.

A :class:`System` knows how to start its workers, tell when they are ready, seed no-op tasks in
one statement, analyze its queue's table (or forget its statistics), enqueue one task, and read
back from the database when each task started and finished. bench/run.py drives them all the
same way.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass

import psycopg
from common import (
    DJTASKS_SETTINGS,
    PGTASKS_SETTINGS,
    PROCRASTINATE_APP,
    ROOT,
    child_env,
    peers_python,
)

PGTASKS_NAME = "bench.noop"
PGQUEUER_APP = "bench.peers.pgqueuer_app"
DJTASKS_PATH = "bench.peers.djtasks_tasks.noop"


@dataclass(frozen=True)
class Config:
    """Worker processes x threads (or concurrent jobs) per process, plus options."""

    processes: int = 1
    concurrency: int | None = None  # None: the system's default
    prefetch: int | None = None  # django-pgtasks only; None: the default (PREFETCH)
    interval: float | None = None  # django-tasks-db only: --interval; None: its default
    #: The system's defaults: django-pgtasks then gets no --processes (PGTASKS["PROCESSES"]).
    default: bool = False

    @classmethod
    def parse(cls, text: str) -> Config:
        """``PxC`` / ``PxC+F`` (F = prefetch) / ``P`` / ``default``; ``@I`` sets --interval."""
        interval = None
        if "@" in text:
            text, _, value = text.partition("@")
            interval = float(value)
        if text == "default":
            return cls(interval=interval, default=True)
        prefetch = None
        if "+" in text:
            text, _, value = text.partition("+")
            prefetch = int(value)
        procs, _, conc = text.partition("x")
        return cls(int(procs), int(conc) if conc else None, prefetch, interval)

    def label(self, default_concurrency: int) -> str:
        c = self.concurrency or default_concurrency
        text = f"{self.processes}x{c}"
        if self.prefetch:
            text += f"+{self.prefetch}"
        if self.interval is not None:
            text += f"@{self.interval:g}"
        return text


class System:
    name: str
    app_name: str  # application_name of the workers' sessions (PGAPPNAME)
    default_concurrency: int = 1
    #: The queue's table(s): analyzed by the backlog and snapshot scenarios, their statistics
    #: forgotten by the burst one; the snapshot scenario's open transaction reads the first.
    queue_tables: tuple[str, ...]

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname

    # -- workers --
    def commands(self, config: Config) -> list[list[str]]:
        raise NotImplementedError

    def start(self, config: Config, **env: str) -> list[subprocess.Popen]:
        """Start the worker processes; their stderr goes to a temporary file (a pipe that
        nobody reads could fill up and block a worker)."""
        env = child_env(self.dbname, PGAPPNAME=self.app_name, **env)
        procs = []
        for cmd in self.commands(config):
            errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=errors)
            proc.stderr = errors  # read back by common.stderr_of()
            procs.append(proc)
        return procs

    def expected_sessions(self, config: Config) -> int:
        return config.processes

    def ready(self, conn, config: Config) -> bool:
        """All worker processes are connected and waiting for work."""
        raise NotImplementedError

    # -- data --
    def reset(self, conn) -> None:
        raise NotImplementedError

    def seed(self, conn, n: int) -> None:
        raise NotImplementedError

    def analyze(self, conn) -> None:
        """ANALYZE the queue's table(s); a partitioned one with its partitions."""
        for table in self.queue_tables:
            conn.execute(f"ANALYZE {table}")

    def forget_statistics(self, conn) -> bool:
        """Delete the planner's column statistics of the queue's table(s) and their partitions,
        as if never analyzed (TRUNCATE resets a table's size estimate but keeps them). Needs a
        superuser; returns False, changing nothing, without one."""
        try:
            with conn.transaction():
                for table in self.queue_tables:
                    conn.execute(
                        "DELETE FROM pg_statistic WHERE starelid IN (SELECT relid FROM "
                        "pg_partition_tree(%s::regclass) UNION SELECT %s::regclass)",
                        [table, table])
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True

    def remaining(self, conn) -> int:
        raise NotImplementedError

    def window(self, conn) -> tuple[int, float]:
        """(tasks finished, seconds from the first start to the last finish)."""
        raise NotImplementedError

    #: The finish time of every task that succeeded (a query of the system's tables).
    finished_sql: str

    def steady_rate(self, conn) -> float | None:
        """The steady drain rate: the tasks that finished between the moments 10% and 90% of
        them had finished, over that span. Leaves out the workers' warm-up (start-up, first
        claims, the first turn of their side jobs) and the last tasks' tail, which a
        prefilled backlog otherwise counts in."""
        done, seconds = conn.execute(
            "SELECT count(*), extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY t) "
            f"- percentile_disc(0.1) WITHIN GROUP (ORDER BY t)) FROM ({self.finished_sql}) "
            "AS f(t)").fetchone()
        if not done or not seconds:
            return None
        return 0.8 * done / float(seconds)

    def enqueue_one(self, conn) -> object:
        raise NotImplementedError

    def started(self, conn, key: object) -> bool:
        raise NotImplementedError

    def latencies_ms(self, conn) -> list[float]:
        """Enqueue-to-start latency of every started task, from the stored timestamps."""
        raise NotImplementedError


class PgTasks(System):
    name = "django-pgtasks"
    finished_sql = "SELECT finished_at FROM pgtasks_task WHERE status = 'SUCCESSFUL'"
    app_name = "bench pgtasks"
    default_concurrency = 4  # PGTASKS["CONCURRENCY"]
    # Partitioned: ANALYZE recurses into its partitions (the live one, where waiting tasks are).
    queue_tables = ("pgtasks_task",)

    def __init__(self, dbname: str, python: str) -> None:
        super().__init__(dbname)
        self.python = python

    def commands(self, config: Config) -> list[list[str]]:
        cmd = [self.python, "-m", "django", "run_pgtasks", "--settings", PGTASKS_SETTINGS,
               "--log-level", "WARNING"]
        if not config.default:
            cmd += ["--processes", str(config.processes)]
        if config.concurrency:
            cmd += ["--concurrency", str(config.concurrency)]
        if config.prefetch is not None:
            cmd += ["--prefetch", str(config.prefetch)]
        return [cmd]

    def ready(self, conn, config: Config) -> bool:
        # A worker registers (its watchdog's session) right after that session LISTENs.
        workers = conn.execute("SELECT count(*) FROM pgtasks_worker").fetchone()[0]
        return workers >= config.processes

    def reset(self, conn) -> None:
        conn.execute("TRUNCATE pgtasks_task, pgtasks_worker")

    def seed(self, conn, n: int) -> None:
        conn.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata) SELECT %s, 'default', '[]', '{}', 100, "
            "'READY', 0, 3, '', '{}' FROM generate_series(1, %s)", [PGTASKS_NAME, n])

    def remaining(self, conn) -> int:
        # Both states are covered by partial indexes, so this stays cheap on a large table.
        return conn.execute(
            "SELECT count(*) FROM pgtasks_task WHERE status IN ('READY', 'AWAITING_RETRY', "
            "'RUNNING')").fetchone()[0]

    def window(self, conn) -> tuple[int, float]:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) FROM pgtasks_task"
        ).fetchone()
        return done, float(seconds or 0)

    def enqueue_one(self, conn) -> object:
        from django_pgtasks.models import Task

        return Task.objects.enqueue(PGTASKS_NAME).pk  # the public API, its own transaction

    def started(self, conn, key: object) -> bool:
        return conn.execute("SELECT started_at IS NOT NULL FROM pgtasks_task WHERE id = %s",
                            [key]).fetchone()[0]

    def latencies_ms(self, conn) -> list[float]:
        rows = conn.execute("SELECT extract(epoch FROM started_at - created_at) * 1000 "
                            "FROM pgtasks_task WHERE started_at IS NOT NULL ORDER BY id")
        return [float(r[0]) for r in rows]


class Procrastinate(System):
    name = "procrastinate"
    finished_sql = "SELECT at FROM procrastinate_events WHERE type = 'succeeded'"
    app_name = "bench procrastinate"
    default_concurrency = 1  # procrastinate worker --concurrency default
    queue_tables = ("procrastinate_jobs",)

    def commands(self, config: Config) -> list[list[str]]:
        cmd = [str(peers_python()), "-m", "procrastinate", "--app", PROCRASTINATE_APP,
               "--log-level", "warning", "worker"]
        if config.concurrency:
            cmd += ["--concurrency", str(config.concurrency)]
        return [cmd] * config.processes

    def start(self, config: Config, **env: str) -> list[subprocess.Popen]:
        return super().start(config, BENCH_POOL_SIZE=str((config.concurrency or 1) + 2))

    def ready(self, conn, config: Config) -> bool:
        workers = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0]
        listening = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = "
            "%s AND query LIKE 'LISTEN%%'", [self.dbname, self.app_name]).fetchone()[0]
        return workers >= config.processes and listening >= config.processes

    def reset(self, conn) -> None:
        conn.execute("TRUNCATE procrastinate_events, procrastinate_periodic_defers, "
                     "procrastinate_jobs, procrastinate_workers")

    def seed(self, conn, n: int) -> None:
        conn.execute("INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                     "SELECT 'default', 'noop', '{}' FROM generate_series(1, %s)", [n])

    def remaining(self, conn) -> int:
        return conn.execute("SELECT count(*) FROM procrastinate_jobs "
                            "WHERE status <> 'succeeded'").fetchone()[0]

    def window(self, conn) -> tuple[int, float]:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE type = 'succeeded'), extract(epoch FROM "
            "max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = "
            "'started')) FROM procrastinate_events").fetchone()
        return done, float(seconds or 0)

    def enqueue_one(self, conn) -> object:
        # What App.defer() sends: the schema's defer function, in its own transaction.
        return conn.execute(
            "SELECT procrastinate_defer_jobs_v1(ARRAY[ROW('default', 'noop', 0, NULL, NULL, "
            "'{}'::jsonb, NULL)::procrastinate_job_to_defer_v1])").fetchone()[0][0]

    def started(self, conn, key: object) -> bool:
        return conn.execute("SELECT status <> 'todo' FROM procrastinate_jobs WHERE id = %s",
                            [key]).fetchone()[0]

    def latencies_ms(self, conn) -> list[float]:
        rows = conn.execute(
            "SELECT extract(epoch FROM s.at - d.at) * 1000 FROM procrastinate_events d "
            "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
            "WHERE d.type = 'deferred' ORDER BY d.job_id")
        return [float(r[0]) for r in rows]


class DjTasksDb(System):
    name = "django-tasks-db"
    finished_sql = ("SELECT finished_at FROM django_tasks_database_dbtaskresult "
                    "WHERE status = 'SUCCESSFUL'")
    app_name = "bench django-tasks-db"
    queue_tables = ("django_tasks_database_dbtaskresult",)

    def commands(self, config: Config) -> list[list[str]]:
        cmd = [str(peers_python()), "-m", "django", "db_worker", "--settings",
               DJTASKS_SETTINGS, "--no-reload", "--no-startup-delay", "-v", "0"]
        if config.interval is not None:
            cmd += ["--interval", f"{config.interval:g}"]
        return [[*cmd, "--worker-id", f"bench-{i}"] for i in range(config.processes)]

    def ready(self, conn, config: Config) -> bool:
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = "
            "%s", [self.dbname, self.app_name]).fetchone()[0]
        return sessions >= config.processes

    def reset(self, conn) -> None:
        conn.execute("TRUNCATE django_tasks_database_dbtaskresult")

    INSERT = (
        "INSERT INTO django_tasks_database_dbtaskresult (id, status, args_kwargs, priority, "
        "task_path, queue_name, backend_name, run_after, enqueued_at, exception_class_path, "
        "traceback, worker_ids) SELECT gen_random_uuid(), 'READY', "
        "'{\"args\": [], \"kwargs\": {}}', 0, %s, 'default', 'default', "
        "'9999-01-01 00:00:00+00', clock_timestamp(), '', '', '[]' "
    )

    def seed(self, conn, n: int) -> None:
        conn.execute(self.INSERT + "FROM generate_series(1, %s)", [DJTASKS_PATH, n])

    def remaining(self, conn) -> int:
        return conn.execute("SELECT count(*) FROM django_tasks_database_dbtaskresult "
                            "WHERE status <> 'SUCCESSFUL'").fetchone()[0]

    def window(self, conn) -> tuple[int, float]:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "extract(epoch FROM max(finished_at) - min(started_at)) "
            "FROM django_tasks_database_dbtaskresult").fetchone()
        return done, float(seconds or 0)

    def enqueue_one(self, conn) -> object:
        # enqueued_at is the enqueuing client's clock (same host as the worker, whose
        # started_at is its own clock).
        return conn.execute(self.INSERT + "RETURNING id", [DJTASKS_PATH]).fetchone()[0]

    def started(self, conn, key: object) -> bool:
        return conn.execute("SELECT started_at IS NOT NULL FROM "
                            "django_tasks_database_dbtaskresult WHERE id = %s",
                            [key]).fetchone()[0]

    def latencies_ms(self, conn) -> list[float]:
        rows = conn.execute(
            "SELECT extract(epoch FROM started_at - enqueued_at) * 1000 FROM "
            "django_tasks_database_dbtaskresult WHERE started_at IS NOT NULL")
        return [float(r[0]) for r in rows]


class PgQueuer(System):
    """pgqueuer with its asyncpg driver and an ``async def`` no-op entrypoint.

    A configuration ``PxB`` is P processes with ``batch_size`` B (pgqueuer has no thread
    count: its jobs run as tasks of one event loop per process); ``default`` is one process
    with pgqueuer's default batch of 10. pgqueuer deletes a finished job and keeps its history
    in ``pgqueuer_log`` (one row per state change, with the database clock).
    """

    name = "pgqueuer"
    finished_sql = "SELECT created FROM pgqueuer_log WHERE status = 'successful'"
    app_name = "bench pgqueuer"
    default_concurrency = 10  # its batch_size default
    queue_tables = ("pgqueuer",)

    def commands(self, config: Config) -> list[list[str]]:
        cmd = [str(peers_python()), "-m", PGQUEUER_APP]
        if config.concurrency:
            cmd += ["--batch-size", str(config.concurrency)]
        return [cmd] * config.processes

    def ready(self, conn, config: Config) -> bool:
        # Its one session LISTENs, then dequeues on the same session (which pg_stat_activity
        # then shows): a session that has run a statement is listening.
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = "
            "%s AND query <> ''", [self.dbname, self.app_name]).fetchone()[0]
        return sessions >= config.processes

    def reset(self, conn) -> None:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def seed(self, conn, n: int) -> None:
        conn.execute("INSERT INTO pgqueuer (priority, status, entrypoint) "
                     "SELECT 0, 'queued', 'noop' FROM generate_series(1, %s)", [n])

    def remaining(self, conn) -> int:
        return conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]

    def window(self, conn) -> tuple[int, float]:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'), extract(epoch FROM "
            "max(created) FILTER (WHERE status = 'successful') - min(created) FILTER (WHERE "
            "status = 'picked')) FROM pgqueuer_log").fetchone()
        return done, float(seconds or 0)

    def enqueue_one(self, conn) -> object:
        # What Queries.enqueue() sends, for one job: the row and its 'queued' log entry.
        return conn.execute(
            "WITH job AS (INSERT INTO pgqueuer (priority, status, entrypoint) VALUES "
            "(0, 'queued', 'noop') RETURNING id, priority, entrypoint), logged AS (INSERT INTO "
            "pgqueuer_log (job_id, status, entrypoint, priority) SELECT id, 'queued', "
            "entrypoint, priority FROM job) SELECT id FROM job").fetchone()[0]

    def started(self, conn, key: object) -> bool:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM pgqueuer_log WHERE job_id = %s AND "
                            "status = 'picked')", [key]).fetchone()[0]

    def latencies_ms(self, conn) -> list[float]:
        rows = conn.execute(
            "SELECT extract(epoch FROM p.created - q.created) * 1000 FROM pgqueuer_log q "
            "JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked' "
            "WHERE q.status = 'queued' ORDER BY q.job_id")
        return [float(r[0]) for r in rows]
