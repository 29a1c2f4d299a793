"""Helpers shared by the test modules: waiting for a condition, stopping worker processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, connections, transaction

from django_pgtasks.models import PENDING, Status, Task, WorkerProcess
from django_pgtasks.worker.loop import Worker

#: One day, the default history period.
DAY = timedelta(days=1)

#: Rows above which a table read in full is a defect in a plan (a catch partition or an empty
#: period may be read in full: the planner prefers that on a table of no rows).
LARGE_TABLE_ROWS = 1000


def first_period_start(table: str) -> datetime:
    """The start of the oldest period of history table ``table``."""
    from django_pgtasks.patterns import partitions

    return min(p.start for p in partitions.partitions("default", table) if p.is_period)


def large_seq_scans(plan: str | list, using: str = "default") -> list[str]:
    """The tables of more than LARGE_TABLE_ROWS rows (as last analyzed) that ``plan`` (an
    EXPLAIN text, or its JSON nodes) reads with a sequential scan."""
    if isinstance(plan, str):
        names = re.findall(r"Seq Scan on (\w+)", plan)
    else:
        names = [n["Relation Name"] for n in plan if n.get("Node Type") == "Seq Scan"]
    if not names:
        return []
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname = ANY (%s) "
                       "AND reltuples > %s", [names, LARGE_TABLE_ROWS])
        return [row[0] for row in cursor.fetchall()]


@contextmanager
def nested_plans(analyze: bool = False) -> Iterator[list[str]]:
    """The plans (auto_explain's) of the statements run inside, those that the database's
    functions and triggers run included; with EXPLAIN ANALYZE's counts if ``analyze``. Runs
    in a transaction (or a savepoint) of its own: the settings are SET LOCAL. Needs a
    superuser, as the suite's server has."""
    plans: list[str] = []

    def handler(diagnostic: Any) -> None:
        if "plan:" in (diagnostic.message_primary or ""):
            plans.append(diagnostic.message_primary)

    with transaction.atomic():
        connection.ensure_connection()
        connection.connection.add_notice_handler(handler)
        try:
            with connection.cursor() as cursor:
                cursor.execute("LOAD 'auto_explain'")
                cursor.execute("SET LOCAL auto_explain.log_min_duration = 0; "
                               "SET LOCAL auto_explain.log_nested_statements = on; "
                               "SET LOCAL auto_explain.log_level = 'notice'; "
                               f"SET LOCAL auto_explain.log_analyze = {'on' if analyze else 'off'}")
            yield plans
        finally:
            connection.connection.remove_notice_handler(handler)


#: A plan node's line, with what EXPLAIN ANALYZE counted (``rows`` and ``Rows Removed`` are
#: per loop).
NODE = re.compile(r"\(actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)\)")
REMOVED = re.compile(r"Rows Removed by (?:Filter|Join Filter|Index Recheck): (\d+)")


def rows_touched(plans: list[str]) -> int:
    """The most rows one plan node of ``plans`` (auto_explain's, with ``log_analyze``)
    returned or filtered out over all its loops."""
    most = loops = 0
    for plan in plans:
        for line in plan.splitlines():
            if node := NODE.search(line):
                loops = int(node[2])
                most = max(most, int(node[1]) * loops)
            elif removed := REMOVED.search(line):
                most = max(most, int(removed[1]) * loops)
    return most


def sparse_statistics(rows: int = 5_000) -> None:
    """Leave the workflow tables as a quiet period after a large workflow may: ``rows``
    edges, members and tasks written then deleted, vacuum keeping the emptied pages
    (``TRUNCATE false``), statistics taken over the few live rows left (one ended chain). The
    planner then scales those few rows to the tables' many pages: after the next fan-out it
    expects a handful of rows where there are thousands, and any condition to match all."""
    from tests.testapp import tasks  # the handlers, registered on demand

    first = tasks.noop.build()
    Task.objects.enqueue_linked([first, *(tasks.noop.build() for _ in range(rows))],
                                [[], *([[first]] * rows)])
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgtasks_dependency; DELETE FROM pgtasks_workflow_member; "
                       "DELETE FROM pgtasks_task WHERE id >= %s", [first.pk])
    head = tasks.noop.build()
    Task.objects.enqueue_linked([head, tasks.noop.build()], [[], [head]])
    assert Worker(concurrency=1, burst=True).run(install_signals=False) == 0
    with connection.cursor() as cursor:
        for table in ("pgtasks_dependency", "pgtasks_workflow_member", "pgtasks_task_live",
                      "pgtasks_pending_release"):
            cursor.execute(f"VACUUM (TRUNCATE false, ANALYZE) {table}")
        cursor.execute("SELECT reltuples, relpages FROM pg_class "
                       "WHERE relname = 'pgtasks_dependency'")
        tuples, pages = cursor.fetchone()
    assert tuples < 10  # a few live rows...
    assert pages > rows // 500  # ...over many pages


def assert_reads_only_the_window(plan: str, since: datetime, now: datetime) -> None:
    """``plan`` reads the tasks of the window from ``since`` to ``now`` (at most a few days)
    out of a long history: it reads whole (a sequential scan of a large table) only the
    live partition and the daily periods that overlap the window (at most its few days,
    whichever way the planner's estimates go), and any older period through an index or not
    at all (pruned), never the history whole."""
    days, day = set(), since.astimezone(UTC).date()
    while day <= now.astimezone(UTC).date():
        days.add(f"{day:%Y%m%d}")
        day += DAY
    window = {f"pgtasks_task_{table}_p{d}" for table in ("done", "failed") for d in days}
    assert not set(large_seq_scans(plan)) - window - {"pgtasks_task_live"}, plan


def conninfo() -> dict:
    """psycopg keyword arguments for a session of its own on the test database."""
    s = connection.settings_dict
    return {"host": s["HOST"] or None, "port": s["PORT"] or None, "user": s["USER"] or None,
            "password": s["PASSWORD"] or None, "dbname": s["NAME"]}


def kill_process_tree(process: subprocess.Popen) -> None:
    """SIGKILL a command started in a session of its own, and every process under it.

    Killing its process group is not enough: a supervisor's worker processes put themselves in
    groups of their own (worker/supervisor.py), and once the supervisor is gone they are no
    longer its children, so they cannot be found afterwards; left alone, they go on claiming
    the next test's tasks until they notice their supervisor is gone. The group is stopped
    first (a stopped supervisor starts no replacement), then each group found under it
    killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGSTOP)
    groups = {process.pid}
    for pid in _descendants(process.pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (Linux: /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(child) for child in f.read().split()]
                found += children
                todo += children
    return found


def wait_until(condition: Callable[[], bool], timeout: float = 120, what: str = "") -> None:
    """Poll ``condition``, first after 10 ms, each pause 1.5 times the last, up to 100 ms;
    fail the test if it is still false after ``timeout``.

    The one place the tests wait: for an event they observe (a row's state, a counter, a
    session waiting for a lock), never for a fixed time. A test that asserts that something
    did *not* happen first waits here for an event that proves the system had its chance
    to do it (more turns of a maintainer, a worker asleep after looking for work).
    """
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"Gave up waiting for {what or 'the condition'} "
                                 f"after {timeout:g}s.")
        time.sleep(pause)
        # A long wait polls 10 times a second, not 50: the suite waits minutes in all, and
        # every poll is a query.
        pause = min(pause * 1.5, 0.1)


def sessions_waiting_for_a_lock(kind: str) -> int:
    """Sessions of the test database waiting for a lock of ``kind`` (``pg_stat_activity``'s
    ``wait_event``: "advisory", "transactionid", "tuple", "relation", ...)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND wait_event = %s", [kind])
        return cursor.fetchone()[0]


def notifications(conn: Any, channel: str, timeout: float = 30) -> list[str]:
    """The payloads, in order, of the notifications not read yet that ``conn`` (a psycopg
    connection in autocommit mode, listening on ``channel``) was sent by the transactions
    committed before this call.

    No fixed wait: ``conn`` notifies a marker on ``channel`` itself, and what was committed
    before reaches a listener before the marker (PostgreSQL delivers notifications in commit
    order); the payloads are those read up to the marker."""
    marker = f"tests-marker-{time.monotonic_ns()}"
    conn.execute("SELECT pg_notify(%s, %s)", [channel, marker])
    payloads: list[str] = []
    for notification in conn.notifies(timeout=timeout):
        if notification.payload == marker:
            return payloads
        payloads.append(notification.payload)
    raise AssertionError(f"The marker notification did not come back within {timeout:g}s; "
                         f"heard {payloads}.")


def all_finished() -> bool:
    """No task is waiting or running (in the default database)."""
    return not Task.objects.filter(status__in=[*PENDING, Status.RUNNING]).exists()


def stop_processes(processes: Iterable[subprocess.Popen], timeout: float = 120) -> list[str]:
    """SIGTERM each worker process, wait for it, and return what each one printed.

    A worker started with ``--worker-id`` is first waited for until it has registered (or
    exited): before that it has not installed its signal handlers, and SIGTERM would end it
    the way it ends any process (return code -15) instead of shutting it down. A process still
    running after ``timeout`` fails the test with what it printed, including the stacks of all
    its threads (``SIGUSR1``, see worker/startup.py), and is killed.
    """
    processes = list(processes)
    for process in processes:
        args = [str(arg) for arg in process.args]
        if "--worker-id" in args:
            name = args[args.index("--worker-id") + 1]
            wait_until(lambda process=process, name=name: process.poll() is not None
                       or WorkerProcess.objects.filter(name=name).exists(),
                       timeout, f"worker {name} to start")
    for process in processes:
        process.send_signal(signal.SIGTERM)
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)
            try:
                out = process.communicate(timeout=5)[0]
            except subprocess.TimeoutExpired as exc:
                out = exc.output
            process.kill()
            raise AssertionError(
                f"Worker {process.args} did not stop within {timeout:g}s of SIGTERM; its "
                f"output and thread stacks:\n{out!s:.20000}") from None
    return outputs


def terminate_worker(process: subprocess.Popen, output: Output, timeout: float = 60) -> int:
    """SIGTERM a worker process whose output ``output`` collects, and return its exit code.

    Past ``timeout`` the test fails with what the worker printed, including the stacks of all
    its threads (``SIGUSR1``, see worker/startup.py), so that a slow shutdown shows where it
    waited; the process is then killed.
    """
    process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        with contextlib.suppress(AssertionError):  # no stacks came: fail with what there is
            output.wait_for(r"^(Current thread|Thread) 0x", timeout=10)
        process.kill()
        raise AssertionError(
            f"Worker {process.args} did not stop within {timeout:g}s of SIGTERM; its output "
            f"and thread stacks:\n{output.text[-20000:]}") from None


@contextmanager
def database_statement_timeout(value: str) -> Iterator[None]:
    """Give every new session of the test database ``statement_timeout = value`` (as
    ``ALTER DATABASE … SET`` does on a production server), and take it back afterwards."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET statement_timeout = %s', [value])
    connections.close_all()  # new sessions take the setting
    try:
        yield
    finally:
        connections.close_all()
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET statement_timeout')
        connections.close_all()


@contextmanager
def running_worker(worker: Worker | None = None, **options: Any) -> Iterator[Worker]:
    """Run ``worker`` (by default a new one made with ``options``: not burst, so its releaser
    and maintainer threads run) in a thread; stop it on exit and fail the test if it raised
    or did not stop."""
    if worker is None:
        worker = Worker(**{"concurrency": 2, "poll_interval": 0.2, **options})
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"
    assert not errors, errors


def run_workers(workers: list[Worker], until: Callable[[], bool] | None = None,
                timeout: float = 240) -> list[Worker]:
    """Run each worker in a thread of its own; fail the test if one of them raised.

    Without ``until`` the workers must end by themselves (``burst=True``); with it they are
    stopped once ``until()`` holds.
    """
    errors: list[BaseException] = []

    def run(worker: Worker) -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    try:
        if until is not None:
            wait_until(until, timeout=timeout, what="the workers to finish")
    finally:
        if until is not None:
            for w in workers:
                w.stop()
        for t in threads:
            t.join(timeout)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a worker thread did not end"
    return workers


#: The thread of each :class:`Output` reading a child's pipe, for :func:`close_output`.
_readers: weakref.WeakKeyDictionary[subprocess.Popen, threading.Thread] = (
    weakref.WeakKeyDictionary())


def close_output(process: subprocess.Popen, timeout: float = 10) -> None:
    """Close the pipe of a child that has ended, once an :class:`Output` reading it has read
    it to its end: closing it under the reader's feet fails the reader's thread (``I/O
    operation on closed file``), which fails the test at its teardown."""
    reader = _readers.get(process)
    if reader is not None:
        reader.join(timeout)
    if process.stdout and not (reader and reader.is_alive()):
        process.stdout.close()


class Output:
    """Collects a child's output lines in the background so tests can wait for one."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._process = process
        self._drained = False
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        _readers[process] = self._thread
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 90, after: int = 0) -> re.Match:
        """The first line (from line ``after`` on) matching ``pattern``, once printed."""
        found: list[re.Match] = []

        def printed() -> bool:
            found.extend(match for line in self.lines[after:]
                         if (match := re.search(pattern, line)))
            return bool(found)

        try:
            wait_until(printed, timeout)
        except AssertionError:
            raise AssertionError(f"no line matching {pattern!r} in:\n{self.text}") from None
        return found[0]

    @property
    def text(self) -> str:
        """What the child printed so far; once it has exited, all of it: the reader thread
        is given the time to read the pipe to its end, which the exit does not wait for (at
        most 5 s, once: a grandchild that outlives the child may hold the pipe open)."""
        if not self._drained and self._process.poll() is not None:
            self._thread.join(timeout=5)
            self._drained = True
        return "".join(self.lines)


def terminate_worker_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'pgtasks worker' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def race_scheduler_passes(seconds: float = 3.0, threads: int = 8,
                          until: Callable[[], bool] | None = None) -> None:
    """Run scheduler passes in ``threads`` threads at once for ``seconds``, each thread with
    its own connection, as concurrent workers would, and on until ``until()`` holds (at most a
    minute more: a slow machine starts the threads late); fail the test on any error."""
    from django_pgtasks.scheduling import job

    deadline = time.monotonic() + seconds
    last = deadline + 60
    errors: list[BaseException] = []

    def racing() -> bool:
        now = time.monotonic()
        return now < deadline or (until is not None and now < last and not until())

    def race() -> None:
        try:
            while racing():
                job.run_scheduler("default")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    racers = [threading.Thread(target=race) for _ in range(threads)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=60)
    assert not errors, errors


def database_now() -> datetime:
    """The database clock, now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def time_passes(task: Any) -> None:
    """As if the task's sleeps and the deadlines of its waits had run out (a test cannot wait
    an hour, and a wait of seconds may run out before a loaded machine has looked): their kept
    ends and the task's due time become the database's now. The runs that follow compare them
    with their claim's time, as they would after a real hour."""
    now = database_now()
    task.refresh_from_db()
    steps = [{**entry, "result": {**entry["result"], "until": now.isoformat()}}
             if entry["name"].startswith(("@sleep", "@wait")) else entry
             for entry in task.steps]
    type(task).objects.filter(pk=task.pk).update(steps=steps, run_after=now)
