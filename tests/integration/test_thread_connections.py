"""A pool thread's connection to the task database is got before the handler starts
(``django_pgtasks/worker/connecting.py``): a refusal then gives the task back unstarted; a
refusal once the handler runs is the run's interruption, as a lost connection is.

The worker runs in the test process and reaches PostgreSQL through a proxy
(``tests/proxy.py``) that the test makes refuse new connections, the ones it holds going on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext
from django_pgtasks.models import Task
from django_pgtasks.worker.connecting import ThreadConnections
from django_pgtasks.worker.loop import Worker
from tests.helpers import running_worker, wait_until
from tests.proxy import FlakyProxy
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

#: Set by the handler below once it has written through its first connection; the test then
#: refuses connections and sets GO.
STARTED = threading.Event()
GO = threading.Event()


@pgtask(name="tests.thread_connections.reconnects", context=True, max_attempts=1)
def reconnects(ctx: TaskContext) -> None:
    """Writes, closes its connection, then needs a new one: the handler's own connection."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    connection.close()
    STARTED.set()
    GO.wait(30)
    Execution.objects.count()


@contextlib.contextmanager
def through_proxy() -> Iterator[FlakyProxy]:
    """New connections to the test database (every thread's) go through a proxy."""
    settings = connections["default"].settings_dict
    host, port = settings["HOST"], settings["PORT"]
    proxy = FlakyProxy((host or "127.0.0.1", int(port or 5432)))
    settings.update(HOST="127.0.0.1", PORT=str(proxy.port))
    try:
        yield proxy
    finally:
        settings.update(HOST=host, PORT=port)
        proxy.close()
        connection.close()


def test_a_thread_refused_a_connection_gives_its_task_back_unstarted(caplog) -> None:
    caplog.set_level(logging.INFO, "django_pgtasks.worker")
    with through_proxy() as proxy, running_worker(concurrency=2, poll_interval=0.05) as worker:
        # The loop's connection is open once it has run a task (a claim, an outcome).
        warm = Task.objects.enqueue(tasks.noop)
        wait_until(lambda: Task.objects.get(pk=warm.pk).status == "SUCCESSFUL")
        proxy.refuse(600)
        task = Task.objects.enqueue(tasks.log_execution)
        # Both threads have been refused (each rests) and the task is back, unspent. (Read
        # as it was seen back: once a thread's rest is over it may be claimed again.)
        seen: list[Task] = []

        def given_back() -> bool:
            row = Task.objects.get(pk=task.pk)
            if (worker.executor.thread_connections.refused >= 2 and worker._pool.resting
                    and row.status == "READY"):
                seen.append(row)
            return bool(seen)

        wait_until(given_back, what="the task given back by refused threads")
        row = seen[0]
        assert (row.attempt, row.interruptions, row.error_text) == (0, 0, "")
        assert not Execution.objects.filter(task_id=task.pk).exists()  # never started
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                    and "refused a connection to a pool thread" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "lower --concurrency, raise the server's max_connections" in (
            warnings[0].getMessage())
        proxy.refuse(0)
        wait_until(lambda: Task.objects.get(pk=task.pk).status == "SUCCESSFUL", timeout=60,
                   what="the task to run once a connection can be had")
    row = Task.objects.get(pk=task.pk)
    assert (row.attempt, row.interruptions) == (1, 0)
    assert Execution.objects.filter(task_id=task.pk).count() == 1


def test_a_connection_the_handler_opens_itself_and_is_refused_interrupts_the_run() -> None:
    """The line: once the handler has started, a refused connection is the run's
    interruption (it spends no attempt, one interruption), not a give-back."""
    STARTED.clear()
    GO.clear()
    with through_proxy() as proxy, running_worker(Worker(concurrency=1, poll_interval=0.05)):
        task = Task.objects.enqueue(reconnects)
        assert STARTED.wait(60)
        proxy.refuse(600)
        GO.set()
        wait_until(lambda: Task.objects.get(pk=task.pk).interruptions == 1,
                   what="the run to be interrupted")
    row = Task.objects.get(pk=task.pk)
    assert row.status in ("READY", "RUNNING")  # back in the queue (maybe claimed again)
    assert "ConnectionLost" in row.error_text, row.error_text
    assert Execution.objects.filter(task_id=task.pk).count() == 1  # it had started


def test_a_give_back_the_database_refuses_interrupts_the_run_instead() -> None:
    """The new write path of a refused thread, refused in turn (a fault on the row): the
    recorder falls back to an interruption, so the task never stays RUNNING, and it runs once
    when connections can be had again."""
    name = tasks.log_execution.name
    # Refuses the give-back (back to the queue with the interruptions unchanged), not the
    # interruption that replaces it.
    when = (f"NEW.name = '{name}' AND OLD.status = 'RUNNING' AND NEW.status <> 'RUNNING' "
            f"AND NEW.interruptions = OLD.interruptions AND NEW.result IS NULL "
            f"AND NEW.finished_at IS NULL")
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE FUNCTION pgtasks_test_refuse_give_back() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected fault'; END $$;
            CREATE TRIGGER pgtasks_test_refuse_give_back BEFORE UPDATE ON pgtasks_task_live
                FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION pgtasks_test_refuse_give_back();""")
    try:
        with through_proxy() as proxy, running_worker(concurrency=1, poll_interval=0.05):
            warm = Task.objects.enqueue(tasks.noop)
            wait_until(lambda: Task.objects.get(pk=warm.pk).status == "SUCCESSFUL")
            proxy.refuse(600)
            task = Task.objects.enqueue(tasks.log_execution)
            # Recorded as an interruption, and not left RUNNING: back in the queue (the
            # worker may claim it again meanwhile, once its thread's rest is over, and be
            # refused again: each time it comes back).
            wait_until(lambda: (row := Task.objects.get(pk=task.pk)).interruptions >= 1
                       and row.status != "RUNNING",
                       what="the refused give-back to be recorded as an interruption")
            proxy.refuse(0)
            wait_until(lambda: Task.objects.get(pk=task.pk).status == "SUCCESSFUL",
                       timeout=60, what="the task to run once a connection can be had")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER pgtasks_test_refuse_give_back ON pgtasks_task_live; "
                           "DROP FUNCTION pgtasks_test_refuse_give_back();")
    row = Task.objects.get(pk=task.pk)
    assert row.attempt == 1
    assert 1 <= row.interruptions < 5
    assert Execution.objects.filter(task_id=task.pk).count() == 1


def test_a_handler_seen_not_to_use_the_database_that_uses_it_later_gets_its_connection_first(
) -> None:
    """A handler seen not to use the database starts without its thread's connection, and is
    not watched statement by statement: a run of it that opens the thread's connection shows
    that it uses it after all, and its next runs get the connection before they start."""
    threads = ThreadConnections("default", "w1", 1)
    needed: list[bool] = []

    def runs() -> None:
        try:
            with threads.watching("tests.quiet_then_not"):
                pass  # its first run sends no statement
            needed.append(threads.needed("tests.quiet_then_not", False, True))
            # Its next run opens the thread's connection.
            with (threads.watching("tests.quiet_then_not"),
                  connections["default"].cursor() as cursor):
                cursor.execute("SELECT 1")
            needed.append(threads.needed("tests.quiet_then_not", False, True))
        finally:
            connections.close_all()

    thread = threading.Thread(target=runs)  # a thread of its own: no connection yet
    thread.start()
    thread.join()
    assert needed == [False, True]


@pgtask(name="tests.thread_connections.closes_its_connection")
def closes_its_connection() -> None:
    Execution.objects.create(task_id=0, worker="closed")
    connection.close()


def test_a_transaction_left_open_after_a_closed_connection_is_still_ended() -> None:
    """A pool thread looks after a task only at the connections opened in it and not seen
    closed since: one that a handler closed is no longer looked at, until a later handler on
    the thread opens it again (and leaves a transaction open in it, which must not reach the
    task after)."""
    first = Task.objects.enqueue(closes_its_connection)
    second = Task.objects.enqueue(tasks.leaves_a_transaction_open, "left open")
    third = Task.objects.enqueue(tasks.in_a_transaction)
    # One thread runs the three, one after the other.
    assert Worker(burst=True, concurrency=1, prefetch=0).run(install_signals=False) == 0
    statuses = [Task.objects.get(pk=t.pk).status for t in (first, second, third)]
    assert statuses == ["SUCCESSFUL"] * 3
    assert Task.objects.get(pk=third.pk).result is False
    assert not Execution.objects.filter(worker="left open").exists()
    assert Execution.objects.filter(worker="closed").count() == 1
