"""Batched completion and prefetch: faster, and still nothing lost."""

from __future__ import annotations

import threading

import pytest

from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.transitions import BY_ID_AT_MOST, Succeeded
from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def finish_times() -> list:
    return list(Task.objects.values_list("finished_at", flat=True))


def test_successes_within_the_window_are_recorded_by_one_statement(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0.5}
    Task.objects.enqueue_bulk(tasks.add, [(i, i) for i in range(40)])
    assert Worker(concurrency=4, burst=True).run(install_signals=False) == 0
    assert Task.objects.succeeded().count() == 40
    assert sorted(Task.objects.values_list("result", flat=True)) == sorted(
        2 * i for i in range(40))
    # One UPDATE records a whole batch: its rows share the statement's now().
    assert len(set(finish_times())) < 10


def test_with_a_zero_window_each_success_is_recorded_on_its_own(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0}
    Task.objects.enqueue_bulk(tasks.add, [(i, i) for i in range(20)])
    worker = Worker(concurrency=1, burst=True)
    assert worker.run(install_signals=False) == 0
    assert not worker.executor.batched
    assert len(set(finish_times())) == 20


def test_signals_and_results_of_batched_successes_follow_the_recording(settings) -> None:
    from django_pgtasks import signals

    settings.PGTASKS = {**settings.PGTASKS, "COMPLETION_WINDOW": 0.2}
    seen: list[tuple[int, str]] = []

    def finished(sender, task, status, **kw) -> None:
        seen.append((task.pk, Task.objects.get(pk=task.pk).status))
        threads.add(threading.current_thread().name)

    threads: set[str] = set()

    signals.task_finished.connect(finished)
    try:
        Task.objects.enqueue_bulk(tasks.noop, [()] * 5)
        assert Worker(concurrency=2, burst=True).run(install_signals=False) == 0
    finally:
        signals.task_finished.disconnect(finished)
    assert len(seen) == 5
    assert {status for _, status in seen} == {Status.SUCCESSFUL}  # already recorded
    # User callbacks run on the callbacks' thread: never on the loop that records outcomes,
    # nor behind handlers on the pool's threads.
    assert threads == {"pgtasks-callbacks"}, threads


def test_prefetched_tasks_wait_as_running_and_go_back_unstarted_at_shutdown(tmp_path) -> None:
    from django_pgtasks import signals

    # Each task runs until the gate opens, once the stopping worker has given the prefetched
    # ones back: the first is still running meanwhile, however slow the machine.
    gate = tmp_path / "gate"
    Task.objects.enqueue_bulk(tasks.waits_for, [(str(gate), 60)] * 6)
    worker = Worker(concurrency=1, prefetch=3, worker_id="prefetcher")
    # Held means claimed; the stop must come once the first task has also started (a claimed
    # task that has not started is given back at shutdown, like the prefetched ones).
    started = threading.Event()
    signals.task_started.connect(lambda **kw: started.set(), weak=False,
                                 dispatch_uid="prefetch-started")
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: Task.objects.held_by("prefetcher").count() >= 4
                   and started.is_set(), 10, "the claim and the first task's start")
        assert Task.objects.held_by("prefetcher").count() == 4  # 1 running + 3 prefetched
        worker.stop()
        wait_until(lambda: Task.objects.filter(status=Status.READY, attempt=0).count() == 5,
                   30, "the prefetched tasks to be given back (and two never claimed)")
    finally:
        worker.stop()
        gate.touch()
        thread.join(30)
        signals.task_started.disconnect(dispatch_uid="prefetch-started")
    rows = list(Task.objects.order_by("id").values_list("status", "attempt", "worker_ids"))
    assert rows.count((Status.SUCCESSFUL, 1, ["prefetcher"])) == 1  # the one that ran
    assert rows.count((Status.READY, 0, [])) == 5  # given back as never claimed


def run_recording_pool_sizes(worker: Worker) -> list[int]:
    """Run ``worker`` (burst) and return, for each task as it started, how many tasks the
    worker held in its pool then (running and prefetched)."""
    from django_pgtasks import signals

    seen: list[int] = []

    def started(sender, task, worker_id, **kw) -> None:
        if worker_id == worker.worker_id:
            seen.append(worker._pool.busy)

    signals.task_started.connect(started, weak=False, dispatch_uid="pool-sizes")
    try:
        assert worker.run(install_signals=False) == 0
    finally:
        signals.task_started.disconnect(dispatch_uid="pool-sizes")
    return seen


def test_auto_prefetch_claims_ahead_for_short_tasks() -> None:
    Task.objects.enqueue_bulk(tasks.noop, [()] * 300)
    worker = Worker(concurrency=2, burst=True, prefetch="auto")
    seen = run_recording_pool_sizes(worker)
    assert Task.objects.succeeded().count() == 300
    assert worker.prefetch.mean_run_time is not None  # the run times were measured
    # Tasks were held beyond the two threads. (Not the mean's last value: a stall of the
    # machine among the last runs moves it.)
    assert max(seen) > 2


def test_auto_prefetch_takes_nothing_ahead_for_long_tasks() -> None:
    Task.objects.enqueue_bulk(tasks.sleepy, [(0.3,)] * 3)
    worker = Worker(concurrency=1, burst=True, prefetch="auto")
    seen = run_recording_pool_sizes(worker)
    assert Task.objects.succeeded().count() == 3
    assert worker.prefetch.ahead() == 0  # 0.3 s tasks are longer than PREFETCH_HORIZON
    assert max(seen) == 1  # never more than the one running


@pytest.mark.parametrize("size", [BY_ID_AT_MOST, BY_ID_AT_MOST + 1],
                         ids=["by primary key", "through the running index"])
def test_both_forms_of_the_outcome_statement_record_every_held_run_and_no_other(
        size: int) -> None:
    """A batch of outcomes finds its rows by primary key up to BY_ID_AT_MOST runs, through
    the index of running tasks above: either way each run still held is recorded, and a run
    whose lease was lost meanwhile (here claimed again by the same worker id) is left as is,
    RUNNING under its new holder."""
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(size))
    claimed = sorted(Task.objects.claim("w", limit=size), key=lambda t: t.id)
    assert len(claimed) == size
    lost = claimed[0]
    Task.objects.filter(pk=lost.pk).update(claims=lost.claims + 1)  # claimed again, same id
    # One kind of outcome per statement: the whole batch in one, of the size under test.
    written = Recorder("default").record([(t, Succeeded({"n": t.id})) for t in claimed])
    assert written[lost.id] == ""
    assert Task.objects.get(pk=lost.pk).status == Status.RUNNING
    assert {written[t.id] for t in claimed[1:]} == {Status.SUCCESSFUL}
    results = dict(Task.objects.filter(pk__in=[t.id for t in claimed[1:]])
                   .values_list("pk", "result"))
    assert results == {t.id: {"n": t.id} for t in claimed[1:]}
    assert not Task.objects.filter(status=Status.RUNNING).exclude(pk=lost.pk).exists()
