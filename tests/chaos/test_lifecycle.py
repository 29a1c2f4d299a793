"""The lifecycle promise: a claimed task always ends in a recorded outcome or goes back to the
queue, whatever its handler returns or raises and whatever the database refuses.

Faults are real: values PostgreSQL rejects, triggers that make PostgreSQL refuse or fail an
UPDATE (non-transient and transient SQLSTATEs), backends terminated by the server, workers
shut down past their grace. No database call is mocked.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection, connections

from django_pgtasks.database.sqlstates import is_connection_loss, is_transient
from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.transitions import Failed, Interrupted, Succeeded
from django_pgtasks.models import Status, Task
from django_pgtasks.signals import task_started
from django_pgtasks.worker.loop import Worker
from tests.helpers import run_workers, running_worker, wait_until
from tests.testapp import lifecycle, tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain(**options) -> Worker:
    [worker] = run_workers([Worker(burst=True, concurrency=4, **options)])
    return worker


def statuses() -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Task.objects.values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


# -- outputs PostgreSQL cannot store ------------------------------------------------------------


@pytest.mark.parametrize("window", [0.005, 0.0], ids=["batched", "one-by-one"])
@pytest.mark.parametrize("kind", sorted(lifecycle.POISON))
def test_one_unstorable_result_fails_only_its_own_task(settings, window, kind) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": window}
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(100))
    poison = Task.objects.enqueue(lifecycle.returns_poison, kind)
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(100))
    drain()
    assert statuses() == {Status.SUCCESSFUL: 200, Status.FAILED: 1}
    poison.refresh_from_db()
    assert poison.status == Status.FAILED
    assert poison.error_text.startswith("django_pgtasks.exceptions.UnstorableResultError")
    assert poison.result is None


def test_a_batch_the_database_refuses_is_split_so_only_the_culprit_fails() -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(9))
    claimed = Task.objects.claim("recorder", limit=9)
    runs = [(task, Succeeded(i)) for i, task in enumerate(claimed)]
    # Past the handler's own checks, straight to PostgreSQL: jsonb holds no NUL, no lone
    # surrogate.
    runs[3] = (claimed[3], Succeeded({"a\x00b": 1}))
    runs[7] = (claimed[7], Succeeded("x\ud800y"))
    recorded = Recorder("default").record(runs)
    assert recorded == {task.pk: (Status.FAILED if i in (3, 7) else Status.SUCCESSFUL)
                        for i, task in enumerate(claimed)}
    failed = Task.objects.get(pk=claimed[3].pk)
    assert failed.error_text.startswith(
        "django_pgtasks.exceptions.UnstorableResultError: The task's outcome could not be "
        "stored: django.db.utils.DataError")
    assert [t.result for t in Task.objects.succeeded().order_by("pk")] == [
        0, 1, 2, 4, 5, 6, 8]


def test_an_exception_text_with_lone_surrogates_is_recorded_escaped() -> None:
    task = Task.objects.enqueue(lifecycle.raises_undecodable_path)
    drain()
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert task.error_text.startswith(
        "FileNotFoundError: No such file: /tmp/report-\\udcff.csv")
    assert task.errors[0]["error"] == task.error_text


def test_an_exception_text_with_lone_surrogates_is_recorded_without_batching(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0}
    task = Task.objects.enqueue(lifecycle.raises_undecodable_path)
    drain()
    assert Task.objects.get(pk=task.pk).status == Status.FAILED


# -- the database refuses or fails the recording ------------------------------------------------


@pytest.fixture
def refuse_status():
    """Make PostgreSQL refuse (SQLSTATE 23514, not transient) to set given end states on the
    tasks of given names, through a trigger; dropped again at teardown."""
    created = []

    def refuse(*statuses: str, names: tuple[str, ...], sqlstate: str = "23514",
               times: int | None = None) -> None:
        def quoted(values) -> str:
            return ", ".join("'" + str(value) + "'" for value in values)

        condition = f"NEW.status IN ({quoted(statuses)}) AND NEW.name IN ({quoted(names)})"
        counter = ""
        if times is not None:  # only the first `times` statements fail
            counter = (f"IF nextval('pgtasks_test_refusals') > {times} THEN RETURN NEW; END IF;")
        with connection.cursor() as cursor:
            cursor.execute("CREATE SEQUENCE IF NOT EXISTS pgtasks_test_refusals")
            cursor.execute(f"""
                CREATE OR REPLACE FUNCTION pgtasks_test_refuse() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    IF {condition} THEN
                        {counter}
                        RAISE EXCEPTION 'refused by the test' USING ERRCODE = '{sqlstate}';
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER pgtasks_test_refuse BEFORE UPDATE ON pgtasks_task
                FOR EACH ROW EXECUTE FUNCTION pgtasks_test_refuse();
            """)
        created.append(True)

    yield refuse
    if created:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS pgtasks_test_refuse ON pgtasks_task; "
                           "DROP FUNCTION IF EXISTS pgtasks_test_refuse(); "
                           "DROP SEQUENCE IF EXISTS pgtasks_test_refusals")


@pytest.mark.parametrize("window", [0.005, 0.0], ids=["batched", "one-by-one"])
def test_a_success_the_database_refuses_is_recorded_as_a_failure(settings, refuse_status,
                                                                  window) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": window}
    refuse_status(Status.SUCCESSFUL, names=(lifecycle.logged.name,))
    refused = [Task.objects.enqueue(lifecycle.logged) for _ in range(3)]
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(50))
    drain()
    assert statuses() == {Status.SUCCESSFUL: 50, Status.FAILED: 3}
    for task in refused:
        task.refresh_from_db()
        assert "UnstorableResultError" in task.error_text
        assert "refused by the test" in task.error_text


def test_a_run_whose_success_and_failure_are_both_refused_goes_back_to_the_queue(
        refuse_status) -> None:
    refuse_status(Status.SUCCESSFUL, Status.FAILED, names=(lifecycle.logged.name,))
    task = Task.objects.enqueue(lifecycle.logged)
    [claimed] = Task.objects.claim("recorder")
    recorded = Recorder("default").record([(claimed, Succeeded(1))])
    assert recorded == {task.pk: Status.READY}
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.READY, 0, 1)
    assert "refused by the test" in task.error_text


def test_transient_errors_while_recording_are_retried(refuse_status, caplog) -> None:
    # A lock timeout (55P03) for the first two statements, then it goes through.
    refuse_status(Status.SUCCESSFUL, names=(tasks.noop.name,), sqlstate="55P03", times=2)
    task = Task.objects.enqueue(tasks.noop)
    [claimed] = Task.objects.claim("recorder")
    with caplog.at_level(logging.WARNING):
        assert Recorder("default").record([(claimed, Succeeded(None))]) == {
            task.pk: Status.SUCCESSFUL}
    assert "(try 2 of 8)" in caplog.text


def test_a_lost_race_while_recording_is_tried_again_at_once(refuse_status, caplog) -> None:
    """A serialization failure (40001) is what PostgreSQL raises when a row of the batch was
    moved to another partition under the statement (a rescue ended the task meanwhile): the
    statement is tried again at once, on the same session, with nothing logged."""
    refuse_status(Status.SUCCESSFUL, names=(tasks.noop.name,), sqlstate="40001", times=2)
    task = Task.objects.enqueue(tasks.noop)
    [claimed] = Task.objects.claim("recorder")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        session = cursor.fetchone()[0]
    with caplog.at_level(logging.WARNING):
        assert Recorder("default").record([(claimed, Succeeded(None))]) == {
            task.pk: Status.SUCCESSFUL}
    assert caplog.text == ""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == session


def test_an_outcome_that_stays_unrecordable_is_reported_and_the_task_given_back(
        refuse_status) -> None:
    refuse_status(Status.SUCCESSFUL, Status.FAILED, Status.READY, Status.AWAITING_RETRY,
                  names=(tasks.noop.name,), sqlstate="40001")
    task = Task.objects.enqueue(tasks.noop)
    [claimed] = Task.objects.claim("recorder")
    assert Recorder("default", tries=2).record([(claimed, Succeeded(None))]) == {
        task.pk: None}
    # What a worker then does with it: the orphan check gives it back once the database
    # accepts writes again.
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER pgtasks_test_refuse ON pgtasks_task")
    assert Task.objects.unclaim([claimed]) == 1
    assert Task.objects.get(pk=task.pk).status == Status.READY


def test_a_cancelled_run_stopped_past_its_grace_whose_end_is_refused_is_not_left_running(
        refuse_status, tmp_path) -> None:
    """The process pool's new way for a run to end (its child stopped past CANCEL_GRACE)
    goes through the same recording as every outcome: refused by the database, the task
    does not stay RUNNING under the live worker."""
    refuse_status(Status.CANCELLED, names=(tasks.runs_on_after_cancel.name,))
    noticed, gate = tmp_path / "noticed", tmp_path / "gate"  # the gate never opens
    task = Task.objects.enqueue(tasks.runs_on_after_cancel, str(noticed), str(gate))
    with running_worker(pool="process", concurrency=1, cancel_grace=0):
        wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(),
                   what="the handler to start")
        Task.objects.filter(pk=task.pk).cancel()
        wait_until(lambda: Task.objects.get(pk=task.pk).status != Status.RUNNING,
                   timeout=30, what="the stopped run to be recorded")
    task.refresh_from_db()
    # Refused as an end state, the outcome ends the task FAILED, as any unstorable one does.
    assert (task.status, task.attempt) == (Status.FAILED, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.UnstorableResultError: The "
                                      "task's outcome could not be stored")
    assert "refused by the test" in task.error_text


def test_an_internal_error_in_the_worker_fails_the_task_instead_of_leaving_it_running() -> None:
    def broken_receiver(sender, task, **kwargs) -> None:
        raise RuntimeError("a task_started receiver is broken")

    task_started.connect(broken_receiver)
    try:
        task = Task.objects.enqueue(tasks.noop)
        drain()
    finally:
        task_started.disconnect(broken_receiver)
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "a task_started receiver is broken" in task.error_text


# -- interruptions are not failures -------------------------------------------------------------


def test_a_run_whose_connection_the_server_dropped_runs_again_without_spending_an_attempt(
) -> None:
    task = Task.objects.enqueue(lifecycle.loses_its_connection)
    assert task.max_attempts == 1
    drain()
    task.refresh_from_db()
    assert (task.status, task.result, task.attempt, task.interruptions) == (
        Status.SUCCESSFUL, "done", 1, 1)
    assert task.errors[0]["error"].startswith("django_pgtasks.exceptions.ConnectionLost: The "
                                              "run lost its database connection")
    assert Execution.objects.filter(task_id=task.pk).count() == 2


def test_a_worker_shut_down_past_its_grace_gives_its_tasks_back_unspent() -> None:
    task = Task.objects.enqueue(tasks.sleepy, 30, max_attempts=1)
    worker = Worker(concurrency=1, shutdown_grace=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    # RUNNING in the table is not enough: a claimed task that no pool thread has taken yet
    # is given back unstarted at shutdown. task_started is sent on the thread, just before
    # the handler runs.
    started = threading.Event()
    task_started.connect(lambda **kwargs: started.set(), weak=False, dispatch_uid="grace")
    thread.start()
    try:
        assert started.wait(30), "the task did not start"
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        task_started.disconnect(dispatch_uid="grace")
        connections.close_all()
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.READY, 0, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.WorkerShutdown: Worker ")


# -- classification ---------------------------------------------------------------------------


def test_connection_errors_are_told_apart_from_other_database_errors() -> None:
    from django.db import DataError, OperationalError

    with pytest.raises(DataError) as refused, connection.cursor() as cursor:
        cursor.execute("SELECT '\\u0000'::jsonb")
    assert not is_transient(refused.value)
    assert not is_connection_loss(refused.value)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(OperationalError) as lost, other.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        other.close()
    assert is_transient(lost.value)
    assert is_connection_loss(lost.value)
    assert not is_connection_loss(ValueError("not a database error"))


def test_outcome_kinds_cannot_be_mixed_in_one_statement() -> None:
    from django_pgtasks.lifecycle.transitions import write

    Task.objects.enqueue_many(tasks.noop.build() for _ in range(2))
    a, b = Task.objects.claim("recorder", limit=2)
    with pytest.raises(TypeError):
        write("default", [(a, Failed("x")), (b, Interrupted("y"))])


# -- liveness that nothing in the loop can block ------------------------------------------------


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    return thread


def test_a_claim_blocked_on_a_lock_longer_than_the_worker_timeout_runs_nothing_twice(
        settings, tmp_path) -> None:
    from django_pgtasks.patterns import controls
    from django_pgtasks.worker.liveness import rescue

    # A worker timeout eight heartbeats long (a loaded machine may delay one by a second),
    # the claim held back twice as long, and both under the loop's 5 s lock timeout.
    settings.PGTASKS = {**settings.PGTASKS, "WORKER_TIMEOUT": 2.0, "RESCUE_GRACE": 0.5}
    # A rate limit makes the claim lock the queue's control row (the controlled claim).
    controls.set_rate_limit(1000, 1, queue="emails")
    gate = tmp_path / "gate"  # the task runs until the claim has been held back
    task = Task.objects.enqueue(tasks.records_and_waits, str(gate), queue="emails")
    worker = Worker(concurrency=2, queues=["emails"], worker_id="blocked")
    thread = start(worker)
    holder = connections.create_connection("default")
    try:
        wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(), 30,
                   "the task to start")
        # Another session holds the control row the next claim needs, for two worker
        # timeouts (an operator's long transaction around controls.pause(), say).
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT * FROM pgtasks_queue WHERE queue = 'emails' FOR UPDATE")
        waiting = Task.objects.enqueue(tasks.noop, queue="emails")  # wakes the loop to claim
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            # The worker is never taken for lost (None: the worker's own rescue pass, on its
            # maintainer's thread while the claim waits, held the rescue lock at that instant).
            assert rescue() in ([], None)
            assert Task.objects.get(pk=task.pk).status == Status.RUNNING
        # The claim was blocked all along (it is what the lock holds back).
        assert Task.objects.get(pk=waiting.pk).status == Status.READY
        holder.rollback()
        gate.touch()
        wait_until(lambda: Task.objects.succeeded().count() == 2, 30, "both tasks to finish")
    finally:
        holder.close()
        worker.stop()
        thread.join(30)
    task.refresh_from_db()
    assert (task.attempt, task.interruptions) == (1, 0)
    assert Execution.objects.filter(task_id=task.pk).count() == 1


def test_heartbeats_go_on_during_the_shutdown_grace(settings) -> None:
    from django_pgtasks.worker.liveness import rescue

    settings.PGTASKS = {**settings.PGTASKS, "WORKER_TIMEOUT": 2.0, "RESCUE_GRACE": 0.5}
    task = Task.objects.enqueue(lifecycle.logged_sleep, 4.5)  # past two worker timeouts
    worker = Worker(concurrency=1, shutdown_grace=30, worker_id="grace")
    thread = start(worker)
    try:
        wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(), 30,
                   "the task to start")
        worker.stop()
        while thread.is_alive():
            # None: the worker's own rescue pass held the rescue lock at that instant (it runs
            # one too); whichever pass ran, the task's end state below shows none rescued it.
            assert rescue() in ([], None)
            thread.join(0.1)
    finally:
        worker.stop()
        thread.join(30)
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.SUCCESSFUL, 1, 0)
    assert Execution.objects.filter(task_id=task.pk).count() == 1


# -- the lease ----------------------------------------------------------------------------------


def test_an_earlier_claim_in_the_same_transaction_cannot_end_a_later_one() -> None:
    """Claims in one transaction share its now(): the lease is the claim's number, not its
    time."""
    from django.db import transaction

    task = Task.objects.enqueue(tasks.noop)
    with transaction.atomic():
        [first] = Task.objects.claim("same-worker")
        assert Task.objects.unclaim([first]) == 1
        [second] = Task.objects.claim("same-worker")
        assert first.locked_at == second.locked_at  # the same transaction time
        assert second.claims == first.claims + 1
        assert Task.objects.mark_succeeded(first, "stale") is False
        assert Task.objects.mark_succeeded(second, "current") is True
    task.refresh_from_db()
    assert (task.status, task.result, task.claims) == (Status.SUCCESSFUL, "current", 2)


def test_the_pause_between_claims_stays_short_while_the_server_refuses_connections(
        settings) -> None:
    """After an outage the loop tries again within RECONNECT_PAUSE_MAX, however long it
    lasted; other database errors back off up to ERROR_PAUSE_MAX."""
    import psycopg
    from django.db import OperationalError, ProgrammingError

    from django_pgtasks.worker.loop import RECONNECT_PAUSE_MAX

    settings.PGTASKS = {**settings.PGTASKS, "ERROR_PAUSE": 0.5, "ERROR_PAUSE_MAX": 30.0}
    worker = Worker(concurrency=1)
    worker._stop.set()  # the pauses return at once; the pause lengths are what is checked
    refused = OperationalError("connection refused")
    refused.__cause__ = psycopg.OperationalError("connection failed: Connection refused")
    for _ in range(10):
        worker._database_error("claiming tasks", refused)
    assert worker._error_pause == RECONNECT_PAUSE_MAX == 2.0
    broken = ProgrammingError("relation does not exist")
    broken.__cause__ = psycopg.errors.UndefinedTable("relation does not exist")
    for _ in range(10):
        worker._database_error("claiming tasks", broken)
    assert worker._error_pause == 30.0


def test_a_handler_module_that_fails_to_import_is_retried_as_an_interruption(
        settings, subprocess_env, run_command) -> None:
    """Deploy skew: a worker whose copy of the handler's module fails to import gives the
    task back (no attempt spent) until the budget is used up, instead of failing it as an
    unknown task at once; once the module imports, the task runs."""
    from django_pgtasks.exceptions import HandlerImportError, TooManyInterruptions
    from django_pgtasks.lifecycle.transitions import qualified_name
    from tests.testapp.broken_tasks import FLAG

    name = "tests.testapp.broken_tasks.some_task"
    task = Task.objects.create(name=name, queue="default", max_attempts=1)
    subprocess_env[FLAG] = "raise"
    result = run_command("run_pgtasks", "--burst", "--queues", "default")
    assert result.returncode == 0, result.stderr
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.FAILED, 1, 6)
    assert task.error_text.startswith(qualified_name(TooManyInterruptions))
    assert {e["error"].split(":")[0] for e in task.errors} == {qualified_name(HandlerImportError)}
    # The module imports again (the deploy finished): an operator's retry runs it.
    Task.objects.filter(pk=task.pk).retry_now()
    assert Task.objects.get(pk=task.pk).interruptions == 0  # a fresh budget
    del subprocess_env[FLAG]
    result = run_command("run_pgtasks", "--burst", "--queues", "default")
    assert result.returncode == 0, result.stderr
    task.refresh_from_db()
    assert (task.status, task.result) == (Status.SUCCESSFUL, "imported")


def test_the_loops_own_connection_waits_for_locks_only_so_long() -> None:
    from django_pgtasks.worker.loop import LOCK_TIMEOUT, STATEMENT_TIMEOUT

    worker = Worker(concurrency=1)
    worker._prepare_session()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout'), "
                       "current_setting('statement_timeout'), "
                       "current_setting('enable_bitmapscan'), "
                       "current_setting('random_page_cost')")
        assert cursor.fetchone() == (LOCK_TIMEOUT, STATEMENT_TIMEOUT, "off", "1.1") == (
            "5s", "5min", "off", "1.1")


def test_a_stage_whose_success_and_next_stage_are_refused_fails_instead_of_staying_running(
        refuse_status) -> None:
    staged = Task.objects.enqueue(lifecycle.stages_a_followup)
    drain()
    assert Task.objects.get(pk=staged.pk).status == Status.SUCCESSFUL
    assert Task.objects.filter(name=tasks.noop.name, stage="noop").count() == 1

    refuse_status(Status.SUCCESSFUL, names=(lifecycle.stages_a_followup.name,))
    refused = Task.objects.enqueue(lifecycle.stages_a_followup)
    drain()
    refused.refresh_from_db()
    assert refused.status == Status.FAILED
    assert refused.error_text.startswith("django_pgtasks.exceptions.UnstorableResultError")
    # The next stage was rolled back with the refused success.
    assert Task.objects.filter(name=tasks.noop.name).count() == 1
    assert not Task.objects.running().exists()
