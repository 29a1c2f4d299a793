"""Workflows under eight ``run_pgtasks`` processes, with workers killed by SIGKILL mid-run.

A 1,000-member group (each member holds its worker 50 ms, the last one until the last kill)
and a diamond (a, then b and c, then d) are enqueued in one transaction while eight workers
wait. Each time the members' successes pass another fifth (three times), a worker that is
running tasks is killed with
SIGKILL and a replacement started. Nothing may be lost: every member and step ends
SUCCESSFUL (a killed run is rescued and runs again), the group's callback is released once
and its log row, which commits with its outcome, exists exactly once; the diamond ran in
order.
"""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction

from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.workflows import chain, group
from tests.helpers import Output, stop_processes, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 8
MEMBERS = 1000
#: Early enough that the members left after the last kill keep the workers busy for over a
#: second, however loaded the machine (the test's polls slow down with it).
KILL_AT = (0.2, 0.4, 0.6)
TIME_LIMIT = 240


@pytest.mark.timeout(TIME_LIMIT + 120)
def test_a_group_and_a_diamond_under_8_workers_lose_nothing_to_kill_9(start_command,
                                                                    tmp_path) -> None:
    processes: dict[str, tuple] = {}
    counter = itertools.count()

    def spawn() -> None:
        worker_id = f"wf-{next(counter)}"
        process = start_command("run_pgtasks", "--concurrency", "2", "--worker-id", worker_id,
                                "--log-level", "WARNING")
        processes[worker_id] = (process, Output(process))

    for _ in range(WORKERS):
        spawn()
    wait_until(lambda: WorkerProcess.objects.count() == WORKERS, 90, "the workers to start")
    with transaction.atomic():
        # The last member runs until the test opens its gate after the last kill: the group
        # cannot end before every kill, however slow the test's polls.
        gate = tmp_path / "gate"
        big = group([*(tasks.wf_slow_step.build(f"m{i}") for i in range(MEMBERS - 1)),
                     tasks.wf_slow_step.build("gated", str(gate))],
                    then=tasks.wf_collect_once.build()).enqueue()
        diamond = chain(tasks.wf_step.build("a"),
                        group([tasks.wf_step.build("b"), tasks.wf_step.build("c")]),
                        tasks.wf_step.build("d")).enqueue()
    callback = big.tasks[-1]
    member_ids = [t.pk for t in big.tasks[:-1]]
    marks = [int(MEMBERS * f) for f in KILL_AT]
    killed: list[str] = []

    def step() -> bool:
        """Kill a worker at each mark; ``True`` once the workflow has ended."""
        if Task.objects.get(pk=callback.pk).status == Status.SUCCESSFUL:
            return True
        done = Task.objects.filter(pk__in=member_ids, status=Status.SUCCESSFUL).count()
        if marks and done >= marks[0]:
            # A registered worker that holds running members: the kill cuts runs short.
            holders = set(Task.objects.running().filter(pk__in=member_ids)
                          .values_list("locked_by", flat=True))
            up = [w for w, (p, _) in processes.items()
                  if p.poll() is None and w in holders]
            if up:
                marks.pop(0)
                victim = up[0]
                processes[victim][0].kill()
                processes[victim][0].wait()
                killed.append(victim)
                spawn()
                if not marks:
                    gate.touch()
        return False

    wait_until(step, TIME_LIMIT, "the workflow to end")
    wait_until(lambda: Task.objects.get(pk=diamond.tasks[-1].pk).status == Status.SUCCESSFUL,
               60, "the diamond to end")
    alive = [p for p, _ in processes.values() if p.poll() is None]
    wait_until(lambda: len(alive) <= WorkerProcess.objects.count(), 60,
               "every live worker to have started")
    stop_processes(alive)

    assert len(killed) == len(KILL_AT)
    statuses = set(big.members().values_list("status", flat=True))
    assert statuses == {Status.SUCCESSFUL}
    assert Task.objects.get(pk=callback.pk).result == ["SUCCESSFUL"] * MEMBERS
    assert Execution.objects.filter(worker="callback").count() == 1
    ran = set(Execution.objects.filter(task_id__in=member_ids).values_list("task_id", flat=True))
    assert ran == set(member_ids)
    # The killed workers' runs were cut short and given back, not failed.
    assert Task.objects.filter(pk__in=member_ids, interruptions__gt=0).exists()
    ids = dict(Execution.objects.filter(worker__in=["a", "b", "c", "d"])
               .values_list("worker", "id"))
    assert ids["a"] < ids["b"] < ids["d"]
    assert ids["a"] < ids["c"] < ids["d"]
