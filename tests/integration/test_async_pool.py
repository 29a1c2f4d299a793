"""The async pool (``--pool async``): ``async def`` handlers as coroutines of one event loop
per worker process, hundreds at a time, with a bounded number of database connections; sync
handlers on threads beside it; time limits and cancellations that cancel the coroutine; the
same outcomes as the thread pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskHandler, get_handler
from django_pgtasks.models import Status, Task
from django_pgtasks.signals import task_finished, task_started
from django_pgtasks.worker import watchdog
from django_pgtasks.worker.loop import Worker
from django_pgtasks.worker.pools import connection_holders
from django_pgtasks.worker.pools.coroutines import SYNC_THREADS, AsyncPool, runs_on_loop
from tests.helpers import running_worker, wait_until
from tests.testapp import aio, cooperative, tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

#: The name of the async pool's event loop thread.
LOOP_THREAD = "pgtasks-loop"
#: Generous bound for anything a test waits for; never reached when the code works.
PATIENCE = 60.0


@pytest.fixture(autouse=True)
def _fresh_gauges() -> Iterator[None]:
    aio.sleepers.reset()
    aio.cancelled.clear()
    yield
    aio.sleepers.reset()


def drain(**options: Any) -> Worker:
    worker = Worker(burst=True, pool=options.pop("pool", "async"),
                    concurrency=options.pop("concurrency", 4), **options)
    assert worker.run(install_signals=False) == 0
    return worker


def test_two_thousand_waiting_coroutines_finish_within_seconds_on_one_process() -> None:
    # One after the other they would take 2,000 s; 500 at a time, four rounds of one second.
    Task.objects.enqueue_many(aio.sleeps.build(1.0) for _ in range(2000))
    began = time.monotonic()
    worker = drain(concurrency=500)
    took = time.monotonic() - began
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 2000
    assert worker.processed == 2000
    # The behavioural proof: hundreds of handlers were waiting at the same time, all of them
    # on the one event loop thread (no thread per task).
    assert aio.sleepers.peak >= 100, aio.sleepers.peak
    assert aio.sleepers.peak <= 500  # never more than --concurrency at once
    assert aio.sleepers.threads == {LOOP_THREAD}
    assert took < 60, f"2,000 tasks of 1 s took {took:.1f}s"


def test_no_more_coroutines_run_at_once_than_the_concurrency(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PREFETCH": 20}  # claimed beyond the slots
    # 1 s each: five are asleep together even if their starts spread over most of a second.
    Task.objects.enqueue_many(aio.sleeps.build(1.0) for _ in range(15))
    drain(concurrency=5)
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 15
    assert aio.sleepers.peak == 5


def test_sync_and_async_handlers_run_side_by_side_on_one_worker() -> None:
    on_loop = [Task.objects.enqueue(aio.where) for _ in range(3)]
    on_threads = [Task.objects.enqueue(aio.where_sync) for _ in range(3)]
    atomic = Task.objects.enqueue(aio.where_atomic)
    # 3 s each: all 20 are asleep together even if their starts spread over a slow second.
    waiting = Task.objects.enqueue_many([*(aio.sleeps.build(3.0) for _ in range(20)),
                                         *(tasks.sleepy.build(0.2) for _ in range(4))])
    drain(concurrency=50)
    assert not Task.objects.exclude(status=Status.SUCCESSFUL).exists()
    for task in on_loop:
        task.refresh_from_db()
        assert task.result == LOOP_THREAD
    for task in on_threads:
        task.refresh_from_db()
        assert task.result.startswith("pgtasks-")
        assert task.result != LOOP_THREAD
    # An exactly-once async handler runs on a thread: its write commits with its completion.
    atomic.refresh_from_db()
    assert atomic.result != LOOP_THREAD
    assert Execution.objects.filter(task_id=atomic.pk).count() == 1
    assert len(waiting) == 24
    assert aio.sleepers.peak == 20  # the 20 coroutines waited together


def test_a_coroutine_past_its_time_limit_is_cancelled_and_retried_by_its_policy() -> None:
    task = Task.objects.enqueue(aio.overruns)  # timeout=0.3, max_attempts=2
    began = time.monotonic()
    drain()
    assert time.monotonic() - began < 30  # cancelled at its limit, not left to wait 600 s
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 2)
    assert [error["attempt"] for error in task.errors] == [1, 2]
    for error in task.errors:  # the time-out of an async handler, as on the thread pool
        assert error["error"].startswith("django_pgtasks.exceptions.TaskTimeoutError: Task "
                                         "exceeded its time limit of 0.3s and was cancelled.")
    assert aio.cancelled == [task.pk, task.pk]  # each attempt's coroutine saw its cancellation
    assert Execution.objects.filter(task_id=task.pk).count() == 2


def test_a_coroutine_that_ignores_its_time_limit_is_failed_and_abandoned(monkeypatch) -> None:
    monkeypatch.setattr(watchdog, "ASYNC_CANCEL_MARGIN", 0.5)
    task = Task.objects.enqueue(aio.ignores_its_time_limit)  # timeout=0.2
    quick = Task.objects.enqueue(aio.where)
    drain(concurrency=1)
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert task.error_text.startswith("django_pgtasks.exceptions.TaskTimeoutError: Task "
                                      "exceeded its time limit of 0.7s")
    quick.refresh_from_db()
    assert quick.status == Status.SUCCESSFUL  # the one slot was handed on
    assert aio.cancelled == [task.pk]  # cancelled again when the pool gave up on it


def test_a_running_coroutine_is_cancelled_with_its_task() -> None:
    with running_worker(pool="async", concurrency=10):
        task = Task.objects.enqueue(cooperative.async_stoppable)
        wait_until(lambda: Execution.objects.filter(task_id=task.pk).exists(),
                   what="the handler to start")
        assert Task.objects.filter(pk=task.pk).cancel().stopping == 1
        task = Task.objects.wait(task, timeout=PATIENCE)
    assert (task.status, task.attempt) == (Status.CANCELLED, 1)
    assert task.pk in cooperative.coroutines_cancelled  # its coroutine got CancelledError
    assert "TaskCancelled: The task was cancelled while it ran" in task.error_text


def test_an_async_django_task_runs_on_the_loop() -> None:
    pytest.importorskip("django_pgtasks.definition.framework")
    from django_pgtasks.definition.framework import TaskResultStatus
    from tests.testapp import dj_tasks

    where = dj_tasks.async_thread_name.enqueue()
    added = dj_tasks.async_add.enqueue(20, 22)
    failed = dj_tasks.async_fails.enqueue("from the loop")
    sync = dj_tasks.add.enqueue(1, 2)
    drain()
    for result in (where, added, failed, sync):
        result.refresh()
    assert (where.status, where.return_value) == (TaskResultStatus.SUCCESSFUL, LOOP_THREAD)
    assert (added.status, added.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class is ValueError
    assert failed.errors[-1].traceback.rstrip().endswith("ValueError: from the loop")
    assert (sync.status, sync.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


def _worker_backends(since: Any) -> int:
    """Sessions on the test database opened since ``since``, other than this one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND pid <> pg_backend_pid() "
                       "AND backend_start >= %s", [since])
        return cursor.fetchone()[0]


def test_500_coroutines_that_use_the_database_share_a_few_connections() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        since = cursor.fetchone()[0]
    Task.objects.enqueue_many(aio.queries.build() for _ in range(500))
    try:
        with running_worker(pool="async", concurrency=500) as worker:
            # Every handler wrote its row and waits, all at once: 500 coroutines mid-run.
            wait_until(lambda: Execution.objects.count() == 500 and aio.sleepers.now == 500,
                       timeout=PATIENCE, what="every handler to write its row and wait")
            held = [_worker_backends(since) for _ in range(5)]
            aio.gate.set()
            wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 500,
                       timeout=PATIENCE, what="every task to end")
    finally:
        aio.gate.clear()
    # The worker's own (loop, watchdog, maintainer, releaser; the callbacks' thread if a
    # receiver uses the database) and the loop's database thread: not one per coroutine (no
    # sync handler ran, so no sync thread has one either).
    assert 0 < max(held) <= 6, held
    assert set(Task.objects.values_list("result", flat=True)) == {1}
    assert worker.processed == 500


@pytest.mark.parametrize("how", [
    "returns", "raises", "fatal", "declared_fatal", "exits", "snoozes", "snoozes_by_raising",
    "cancels", "unstorable", "then",
])
def test_outcomes_are_the_thread_pools(how: str) -> None:
    """An async handler ends the same way on both pools: same states, attempts, results,
    errors, signals and next stages."""
    seen: dict[str, list[tuple[str, Any]]] = {}

    def on_started(task: Any, **kwargs: Any) -> None:
        seen.setdefault(task.metadata.get("pool"), []).append(("started", None))

    def on_finished(task: Any, status: str, exception: Any, **kwargs: Any) -> None:
        seen.setdefault(task.metadata.get("pool"), []).append(
            ("finished", (status, type(exception).__name__)))

    task_started.connect(on_started, weak=False, dispatch_uid="parity-started")
    task_finished.connect(on_finished, weak=False, dispatch_uid="parity-finished")
    try:
        ends = {}
        for pool in ("thread", "async"):
            task = Task.objects.enqueue(aio.behaves, how)
            Task.objects.filter(pk=task.pk).update(metadata={"pool": pool})
            drain(pool=pool)
            ends[pool] = _ending(task.pk)
    finally:
        task_started.disconnect(dispatch_uid="parity-started")
        task_finished.disconnect(dispatch_uid="parity-finished")
    assert ends["async"] == ends["thread"]
    # The same signals: the same outcomes, in order, and as many starts. (A retry due at
    # once may start, on another slot, before the callbacks' thread has sent the last
    # attempt's task_finished: how starts and ends interleave is not the pools' to fix.)
    for pool in ("thread", "async"):
        assert seen[pool][0] == ("started", None), seen[pool]
    assert ([e for e in seen["async"] if e[0] == "finished"]
            == [e for e in seen["thread"] if e[0] == "finished"])
    assert seen["async"].count(("started", None)) == seen["thread"].count(("started", None))


def test_outcomes_recorded_at_once_are_recorded_on_the_loops_database_thread(settings) -> None:
    # COMPLETION_WINDOW = 0: each run records its own outcome, here on the database thread.
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0}
    returns = Task.objects.enqueue(aio.behaves, "returns")
    raises = Task.objects.enqueue(aio.behaves, "raises")
    staged = Task.objects.enqueue(aio.behaves, "then")
    drain()
    assert _ending(returns.pk)[:3] == (Status.SUCCESSFUL, 1, {"attempt": 1})
    assert _ending(raises.pk)[:2] == (Status.FAILED, 3)
    assert _ending(staged.pk)[4] == [("tests.testapp.aio.behaves", Status.SUCCESSFUL,
                                      {"attempt": 1})]


def _ending(pk: int) -> tuple:
    """How task ``pk`` ended, without what differs from run to run (ids, times, workers,
    tracebacks' line numbers)."""
    task = Task.objects.get(pk=pk)
    errors = [(e["attempt"], e["error"].partition("\n")[0]) for e in task.errors]
    stages = [(t.name, t.status, t.result) for t in Task.objects.filter(
        metadata__parent=pk).order_by("pk")]
    return task.status, task.attempt, task.result, errors, stages


def test_a_shutdown_past_its_grace_cancels_the_coroutines_and_gives_their_tasks_back() -> None:
    work = [Task.objects.enqueue(cooperative.async_stoppable) for _ in range(3)]
    worker = Worker(pool="async", concurrency=10, shutdown_grace=0.3)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: (codes.append(worker.run(install_signals=False)),
                        connections.close_all()))
    thread.start()
    try:
        wait_until(lambda: Execution.objects.count() == 3, timeout=PATIENCE,
                   what="the three handlers to start")
        worker.stop()
        thread.join(PATIENCE)
    finally:
        worker.stop()
    assert not thread.is_alive()
    assert codes == [1]  # tasks were left unfinished
    wait_until(lambda: {t.pk for t in work} <= set(cooperative.coroutines_cancelled),
               timeout=PATIENCE, what="the coroutines to be cancelled")
    for task in work:
        task.refresh_from_db()
        assert (task.status, task.attempt, task.interruptions) == (Status.READY, 0, 1)
        assert task.error_text.startswith("django_pgtasks.exceptions.WorkerShutdown: Worker ")


def test_tasks_waiting_for_a_slot_go_back_unstarted_at_shutdown(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "PREFETCH": 10}
    Task.objects.enqueue_many(aio.queries.build() for _ in range(12))
    try:
        with running_worker(pool="async", concurrency=2) as worker:
            wait_until(lambda: aio.sleepers.now == 2 and Task.objects.filter(
                status=Status.RUNNING).count() == 12, what="two running, ten prefetched")
            worker.stop()
            # Given back at once, while the two running ones finish within the grace.
            wait_until(lambda: Task.objects.filter(status=Status.READY).count() == 10,
                       what="the prefetched tasks to go back")
            aio.gate.set()
    finally:
        aio.gate.clear()
    assert sorted(Task.objects.values_list("status", "attempt")) == sorted(
        [(Status.SUCCESSFUL, 1)] * 2 + [(Status.READY, 0)] * 10)
    assert aio.sleepers.peak == 2


def test_which_handlers_run_on_the_loop() -> None:
    class CallOnly(TaskHandler):
        def call(self, task: Any, worker_id: str) -> Any:
            return super().call(task, worker_id)

    async def coroutine() -> None:
        """An async def function."""

    assert runs_on_loop(get_handler(aio.where.name))
    assert not runs_on_loop(get_handler(aio.where_sync.name))
    assert not runs_on_loop(get_handler(aio.where_atomic.name))  # atomic: on a thread
    assert not runs_on_loop(CallOnly(func=coroutine, name="call-only"))
    assert runs_on_loop(pgtask(name="plain-coroutine")(coroutine))


def test_the_pool_is_chosen_by_the_worker() -> None:
    worker = Worker(pool="async", concurrency=300, burst=True)
    assert worker.run(install_signals=False) == 0
    assert worker.pool_options.kind == "async"
    assert isinstance(worker._pool, AsyncPool)
    assert worker._pool.size == 300


def test_the_connection_budget_counts_the_loops_thread_not_its_coroutines() -> None:
    from django_pgtasks.database.connection_budget import connections_needed

    assert connection_holders("async", 500) == 1 + SYNC_THREADS
    assert connection_holders("async", 2) == 1 + 2
    assert connection_holders("thread", 500) == 500
    # What run_pgtasks's start-up check and W050 compare with the server's limit.
    assert connections_needed(1, connection_holders("async", 500)) == 4 + 1 + SYNC_THREADS


def test_a_run_on_the_loop_is_traced_and_its_next_stage_continues_the_trace(
        monkeypatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from django_pgtasks.telemetry import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    tracing.forget()
    try:
        with provider.get_tracer("test").start_as_current_span("request") as request:
            Task.objects.enqueue(aio.behaves, "then")
        drain()

        def named(prefix: str) -> list[Any]:
            return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]

        wait_until(lambda: len(named("run")) == 2, what="both run spans to end")
        runs = sorted(named("run"), key=lambda span: span.start_time)
        enqueues = sorted(named("enqueue"), key=lambda span: span.start_time)
        trace_id = request.get_span_context().trace_id
        assert {span.context.trace_id for span in [*runs, *enqueues]} == {trace_id}
        # The next stage was enqueued inside the first run's span (on the loop's database
        # thread, in the run's context), and runs as the child of that enqueue.
        assert enqueues[1].parent.span_id == runs[0].context.span_id
        assert runs[1].parent.span_id == enqueues[1].context.span_id
        assert [span.attributes["pgtasks.task.outcome"] for span in runs] == [
            "successful", "successful"]
    finally:
        tracing.forget()
        provider.shutdown()


def test_run_pgtasks_runs_the_async_pool(run_command) -> None:
    on_loop = Task.objects.enqueue(aio.where)
    on_thread = Task.objects.enqueue(aio.where_sync)
    done = run_command("run_pgtasks", "--pool", "async", "--concurrency", "200", "--burst")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "concurrency=200 pool=async" in output
    on_loop.refresh_from_db()
    on_thread.refresh_from_db()
    assert (on_loop.status, on_loop.result) == (Status.SUCCESSFUL, LOOP_THREAD)
    assert on_thread.status == Status.SUCCESSFUL
    assert on_thread.result != LOOP_THREAD
