"""Workers and web processes behind a real PgBouncer in transaction mode (docs/howto/pgbouncer.md).

Each test starts ``run_pgtasks`` with ``tests/settings_pgbouncer.py``: the task database is
reached through the test's own PgBouncer (``tests/pgbouncer.py``: ``pool_mode =
transaction``, 4 server sessions), with ``PGTASKS["POOLER"] = "transaction"``. The test
process itself enqueues, pauses and reads through the same PgBouncer, as a web process would.

What is proven through the pooler: a worker drains what was enqueued while its transactions
share 4 server sessions with everything else, and leaves no session setting behind on them;
a worker killed with SIGKILL is found lost by its heartbeats alone and its task rescued;
pause and resume; a periodic task; and wake-ups by notifications received on the direct
connection of ``LISTEN_DATABASE``. The first test proves that the pooler really moves one
client session between server sessions, so that anything relying on session state would
fail here.

Skipped when the ``pgbouncer`` binary is missing (``bash .ci/install-pgbouncer`` installs it).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connection

from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.patterns.controls import pause, resume
from tests import pgbouncer as bouncer
from tests.conftest import started_processes
from tests.helpers import Output, stop_processes, wait_until
from tests.settings_pgbouncer import LISTEN_VARIABLE, PORT_VARIABLE, SCHEDULE_VARIABLE
from tests.testapp import tasks
from tests.testapp.models import Execution

if bouncer.binary() is None:
    pytest.skip("the pgbouncer binary is not installed (bash .ci/install-pgbouncer installs "
                "Debian's package)", allow_module_level=True)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: What the worker sessions and the test's own run with (as pg_stat_activity shows them).
WORKER_APPLICATION = "pgtasks worker"


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None) -> Iterator[bouncer.PgBouncer]:
    """The test's PgBouncer, in front of the test database's server; stopped at the end, which
    ends its server sessions (the test database must have none left when it is dropped)."""
    server = bouncer.PgBouncer(connection.settings_dict)
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def env(subprocess_env: dict[str, str], pgbouncer: bouncer.PgBouncer) -> dict[str, str]:
    """Environment of a worker process that reaches the task database through PgBouncer."""
    return {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.settings_pgbouncer",
            PORT_VARIABLE: str(pgbouncer.port)}


@pytest.fixture(autouse=True)
def through_pooler(env: dict[str, str], pgbouncer: bouncer.PgBouncer) -> Iterator[None]:
    """The test's own queries (enqueue, pause, the checks of the results) go through PgBouncer
    too, as a web process's would; the database is flushed directly afterwards."""
    settings_dict = connection.settings_dict
    direct = settings_dict["HOST"], settings_dict["PORT"]
    connection.close()
    settings_dict.update(HOST="127.0.0.1", PORT=str(pgbouncer.port))
    try:
        yield
    finally:
        connection.close()
        settings_dict.update(HOST=direct[0], PORT=direct[1])


@pytest.fixture
def start_worker(env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``run_pgtasks <args>`` behind the pooler; ``extra`` adds environment variables.
    Every process still running at teardown is killed."""
    with started_processes(env) as start:
        yield lambda *args, **extra: start("run_pgtasks", *args, **extra)


@contextlib.contextmanager
def direct_session(pgbouncer: bouncer.PgBouncer) -> Iterator[psycopg.Connection]:
    """A session of the test database's server, not through PgBouncer."""
    s = connection.settings_dict
    host, port = pgbouncer.server
    with psycopg.connect(host=host, port=port, dbname=s["NAME"], user=s["USER"] or None,
                         password=s["PASSWORD"] or None, autocommit=True) as conn:
        yield conn


def clients_and_servers(pgbouncer: bouncer.PgBouncer) -> tuple[int, int]:
    """Client sessions of the test database in PgBouncer, and its server sessions."""
    name = connection.settings_dict["NAME"]
    clients = sum(1 for row in pgbouncer.show("CLIENTS") if row["database"] == name)
    servers = sum(1 for row in pgbouncer.show("SERVERS") if row["database"] == name)
    return clients, servers


def assert_no_errors(output: str) -> None:
    """The worker logged no error: a prepared statement or a setting missing from the server
    session a transaction ran on would have been one (a failed heartbeat, claim or record)."""
    errors = [line for line in output.splitlines()
              if " ERROR " in line or "CRITICAL" in line or "Traceback" in line]
    assert not errors, output


def test_one_client_session_moves_between_server_sessions(pgbouncer: bouncer.PgBouncer) -> None:
    """The pooler multiplexes: a client's consecutive transactions run on different server
    sessions, and a session setting made in one of them is absent from the next."""
    name = connection.settings_dict["NAME"]
    holders = [pgbouncer.connect(name) for _ in range(bouncer.POOL_SIZE)]
    client = pgbouncer.connect(name)
    try:
        pids = []
        for holder in holders:  # each holds a server session in an open transaction
            holder.execute("BEGIN")
            pids.append(holder.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert len(set(pids)) == bouncer.POOL_SIZE
        holders[0].execute("COMMIT")  # the only free server session is now pids[0]
        assert client.execute("SELECT pg_backend_pid()").fetchone()[0] == pids[0]
        client.execute("SET statement_timeout = '123s'")
        holders[0].execute("BEGIN")
        assert holders[0].execute("SELECT pg_backend_pid()").fetchone()[0] == pids[0]
        holders[1].execute("COMMIT")  # now only pids[1] is free
        assert client.execute("SELECT pg_backend_pid()").fetchone()[0] == pids[1]
        assert client.execute("SHOW statement_timeout").fetchone()[0] == "0"
    finally:
        for conn in [*holders, client]:
            conn.close()


def server_session_settings(pgbouncer: bouncer.PgBouncer) -> set[tuple[str, str]]:
    """``(lock_timeout, statement_timeout)`` of every server session PgBouncer has for the
    test database: all are taken at once, by as many open transactions."""
    name = connection.settings_dict["NAME"]
    clients = [pgbouncer.connect(name) for _ in range(bouncer.POOL_SIZE)]
    try:
        found = set()
        for client in clients:
            client.execute("BEGIN")
            found.add(client.execute("SELECT current_setting('lock_timeout'), "
                                     "current_setting('statement_timeout')").fetchone())
        return found
    finally:
        for client in clients:
            client.close()


def test_a_worker_drains_through_the_pooler_and_leaves_no_session_state(
        start_worker, pgbouncer: bouncer.PgBouncer) -> None:
    n = 300
    Task.objects.enqueue_many(tasks.log_execution.build() for _ in range(n))
    process = start_worker("--concurrency", "4", "--worker-id", "pooled")
    out = Output(process)
    # The worker's sessions (main loop, watchdog, one per busy thread) and the test's own are
    # more clients than PgBouncer has server sessions: their transactions share them.
    most = [0, 0]

    def multiplexed() -> bool:
        clients, servers = clients_and_servers(pgbouncer)
        most[:] = max(most[0], clients), max(most[1], servers)
        return clients > bouncer.POOL_SIZE or process.poll() is not None

    wait_until(multiplexed, what="more client sessions than server sessions")
    wait_until(lambda: Task.objects.succeeded().count() == n or process.poll() is not None,
               what="every task to succeed")
    # The idle worker's heartbeats move between server sessions: while the test holds all
    # but one of them in turn, the statements of the worker's watchdog session run on
    # whichever is free. A statement prepared on one of them (psycopg prepares a statement
    # run 5 times, unless told not to) would be missing on the next: a failed heartbeat.
    name = connection.settings_dict["NAME"]
    holders = [pgbouncer.connect(name) for _ in range(bouncer.POOL_SIZE - 1)]
    turn = [0]
    heartbeat_pids: set[int] = set()

    def heartbeats_moved() -> bool:
        holder = holders[turn[0] % len(holders)]
        turn[0] += 1
        holder.execute("ROLLBACK")
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        with direct_session(pgbouncer) as conn:
            heartbeat_pids.update(pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s "
                "AND query LIKE 'UPDATE pgtasks_worker SET last_seen_at%%'", [name]))
        return (len(heartbeat_pids) >= 3 and turn[0] >= 50) or process.poll() is not None

    try:
        for holder in holders:
            holder.execute("BEGIN")
            holder.execute("SELECT 1")
        wait_until(heartbeats_moved, what="heartbeats on three server sessions")
    finally:
        for holder in holders:
            holder.close()
    assert len(heartbeat_pids) >= 3, out.text
    assert stop_processes([process]) is not None
    assert process.returncode == 0, out.text
    assert most[0] > bouncer.POOL_SIZE >= most[1], most
    assert Task.objects.succeeded().count() == n
    assert Execution.objects.values("task_id").distinct().count() == n == Execution.objects.count()
    assert not WorkerProcess.objects.exists()  # unregistered through the pooler too
    assert_no_errors(out.text)
    # No lock_timeout or statement_timeout of the worker left on a server session, where
    # other clients' transactions would have run with them.
    assert server_session_settings(pgbouncer) == {("0", "0")}


def test_a_killed_worker_is_found_lost_by_its_heartbeats_and_its_task_rescued(
        start_worker, tmp_path) -> None:
    marker, release = tmp_path / "started", tmp_path / "release"
    task = Task.objects.enqueue(tasks.waits_for, str(release), 60, str(marker))
    victim = start_worker("--concurrency", "1", "--worker-id", "victim")
    wait_until(marker.exists, what="the task to start")
    row = WorkerProcess.objects.get(name="victim")
    assert row.lock_key is None  # heartbeat liveness: no session-level lock through a pooler
    victim.kill()
    victim.wait(timeout=30)
    killed_at = time.monotonic()
    release.touch()
    heir = start_worker("--concurrency", "1", "--worker-id", "heir")
    out = Output(heir)
    wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL,
               what="the task to be rescued and run again")
    rescued_after = time.monotonic() - killed_at
    stop_processes([heir])
    assert heir.returncode == 0, out.text
    task.refresh_from_db()
    assert (task.attempt, task.interruptions, task.worker_ids) == (1, 1, ["heir"])
    assert any("worker victim stopped" in str(error) for error in task.errors)
    assert "Worker victim was lost; 1 of its task(s) rescued." in out.text
    # Found by its silence (WORKER_TIMEOUT = 6 s, tests/settings_pgbouncer.py), not at once.
    assert rescued_after > 3.0, rescued_after
    assert_no_errors(out.text)


def test_pause_and_resume_through_the_pooler(start_worker) -> None:
    assert pause("default") == 1
    held = Task.objects.enqueue(tasks.add, 1, 2)
    other = Task.objects.enqueue(tasks.add, 3, 4, queue="emails")
    process = start_worker("--concurrency", "2", "--worker-id", "paused")
    out = Output(process)
    # The claim that ran the other queue's task saw both: the paused one was held back.
    wait_until(lambda: Task.objects.get(pk=other.pk).status == Status.SUCCESSFUL,
               what="the task of the queue that runs")
    assert Task.objects.get(pk=held.pk).status == Status.READY
    assert resume("default") == 1
    wait_until(lambda: Task.objects.get(pk=held.pk).status == Status.SUCCESSFUL,
               what="the task of the resumed queue")
    assert Task.objects.get(pk=held.pk).result == 3
    stop_processes([process])
    assert process.returncode == 0, out.text
    assert_no_errors(out.text)


def test_a_periodic_task_runs_through_the_pooler(start_worker) -> None:
    process = start_worker("--concurrency", "2", "--worker-id", "scheduler",
                           **{SCHEDULE_VARIABLE: "1"})
    out = Output(process)
    wait_until(lambda: Execution.objects.count() >= 2, what="two runs of the periodic task")
    stop_processes([process])
    assert process.returncode == 0, out.text
    runs = Task.objects.filter(name="tests.testapp.periodic.tick")
    assert runs.count() >= 2
    assert set(Execution.objects.values_list("task_id", flat=True)) <= set(
        runs.values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgtasks_schedule WHERE name = 'pgbouncer-tick'")
        assert cursor.fetchone()[0] == 1
    assert_no_errors(out.text)


def test_wakeups_come_through_the_direct_connection(
        start_worker, pgbouncer: bouncer.PgBouncer) -> None:
    """With LISTEN_DATABASE, the worker LISTENs on a session of the server itself (none of
    PgBouncer's), and a task enqueued through the pooler starts long before the next poll
    (POLL_INTERVAL is 30 s in this mode, tests/settings_pgbouncer.py)."""
    process = start_worker("--concurrency", "2", "--worker-id", "listener",
                           **{LISTEN_VARIABLE: "1"})
    out = Output(process)
    name = connection.settings_dict["NAME"]

    def listening() -> list[int]:
        with direct_session(pgbouncer) as conn:
            return [pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query = "
                "'LISTEN pgtasks' AND application_name = %s", [name, WORKER_APPLICATION])]

    wait_until(lambda: listening() or process.poll() is not None,
               what="the worker to LISTEN")
    [pid] = listening()
    assert pid not in {row["remote_pid"] for row in pgbouncer.show("SERVERS")}
    # The worker is idle once a first task has run: its next poll is 30 s away.
    first = Task.objects.enqueue(tasks.add, 1, 1)
    wait_until(lambda: Task.objects.get(pk=first.pk).status == Status.SUCCESSFUL,
               what="the first task")
    for i in range(3):
        enqueued_at = time.monotonic()
        task = Task.objects.enqueue(tasks.add, i, i)
        try:
            wait_until(lambda task=task: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL,
                       timeout=25, what="the task to run before the next poll")
        except AssertionError as exc:  # what the worker said meanwhile, to find out why
            raise AssertionError(f"{exc} Task {task.pk}: {Task.objects.get(pk=task.pk).status}."
                                 f"\nWorker output:\n{out.text}") from None
        assert time.monotonic() - enqueued_at < 25
    stop_processes([process])
    assert process.returncode == 0, out.text
    assert_no_errors(out.text)

