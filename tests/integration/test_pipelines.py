"""Pipelines: the next stage is enqueued in the transaction that completes the current one."""

from __future__ import annotations

import os
import random
import signal

import pytest
from django.db.models import Count

from django_pgtasks.models import Status, Task
from django_pgtasks.worker.loop import Worker
from tests.helpers import Output, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    assert Worker(concurrency=2, burst=True).run(install_signals=False) == 0


def test_a_three_stage_pipeline_runs_each_stage_once_in_order() -> None:
    root = Task.objects.enqueue(tasks.extract, 5, stage="extract")
    drain()
    stages = list(Task.objects.order_by("id").values_list("stage", "status", "result"))
    assert stages == [("extract", Status.SUCCESSFUL, 5), ("transform", Status.SUCCESSFUL, 10),
                      ("load", Status.SUCCESSFUL, 11)]
    later = Task.objects.exclude(pk=root.pk).order_by("id")
    assert [t.metadata["pipeline"] for t in later] == [root.pk, root.pk]
    assert [t.metadata["parent"] for t in later] == [root.pk, later[0].pk]
    assert sorted(Execution.objects.values_list("worker", flat=True)) == [
        "extract", "load", "transform"]


def test_a_failed_stage_stops_the_pipeline_and_shows_its_stage() -> None:
    Task.objects.enqueue(tasks.transform, 0, -1, stage="transform")
    drain()
    [failed] = Task.objects.all()
    assert (failed.stage, failed.status) == ("transform", Status.FAILED)
    assert "cannot transform a negative size" in failed.error_text
    assert not Task.objects.filter(stage="load").exists()


def test_followups_of_an_attempt_that_loses_its_lease_are_discarded() -> None:
    Task.objects.enqueue(tasks.extract, 1)
    [task] = Task.objects.claim("w")
    Task.objects.filter(pk=task.pk).update(status=Status.CANCELLED)  # taken away meanwhile
    worker = Worker(concurrency=1)
    task.followups = []
    from tests.testapp.tasks import transform

    task.followups.append(Task.objects.build(transform, task.pk, 2))
    worker.executor._succeed_with_followups(task, tasks.extract, 1, 0.0)
    assert Task.objects.count() == 1  # no next stage without this stage's success
    assert Task.objects.get(pk=task.pk).status == Status.CANCELLED


@pytest.mark.slow
def test_killing_workers_between_stages_neither_skips_nor_duplicates_a_stage(
        start_command) -> None:
    n = 150
    roots = [Task.objects.enqueue(tasks.extract, i, stage="extract").pk for i in range(n)]
    rng = random.Random(3)
    processes = []

    def spawn(i: int) -> None:
        p = start_command("run_pgtasks", "--concurrency", "3", "--worker-id", f"pipe-{i}",
                          "--log-level", "WARNING")
        processes.append((p, Output(p)))

    def successes() -> int:
        return Task.objects.filter(status=Status.SUCCESSFUL).count()

    def finished() -> bool:
        return Task.objects.filter(stage="load", status=Status.SUCCESSFUL).count() == n

    spawn(0)
    spawn(1)
    kills = 0
    while kills < 8 and not finished():
        # Each kill in the middle of the work: once the workers have got on with it (15
        # more stages done) since the last one.
        before = successes()
        wait_until(lambda before=before: finished() or successes() >= before + 15, 180,
                   "the pipelines to go on")
        alive = [p for p, _ in processes if p.poll() is None]
        if not finished() and len(alive) >= 2:
            victim = rng.choice(alive)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            kills += 1
            spawn(len(processes))
    wait_until(finished, 180, "the pipelines to finish")
    for p, _ in processes:
        if p.poll() is None:
            p.terminate()
            p.wait(30)
    per_stage = Task.objects.values("stage").annotate(n=Count("id"))
    assert {row["stage"]: row["n"] for row in per_stage} == {
        "extract": n, "transform": n, "load": n}
    assert not Task.objects.exclude(status=Status.SUCCESSFUL).exists()
    effects = Execution.objects.values("task_id", "worker").annotate(n=Count("id"))
    assert len(effects) == 3 * n
    assert {row["n"] for row in effects} == {1}  # each stage's effect exactly once
    assert {row["task_id"] for row in effects} == set(roots)
    assert kills >= 3
