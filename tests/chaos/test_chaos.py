"""The chaos test: thousands of tasks, 4 worker processes, kill -9 and terminated backends.

Two runs. In the ``mixed`` run one queue holds the tasks of five modes at once, their
priorities drawn at random so that the modes interleave as the workers drain it; the
``workflow`` run drains one large workflow under ``statement_timeout = 1s`` on every session
of the database. While the workers drain, a random running worker process is killed with
SIGKILL each time the successes pass another nineteenth (``mixed``: 18 kills) or tenth
(``workflow``: 9 kills) of the tasks (or ``PGTASKS_CHAOS_KILLS`` kills), and a replacement
started; once, half way through, every worker's database session is terminated from the
server side. The kills follow the drain's progress, not a clock, so a slow (loaded) machine
sees the same kills as a fast one, and the workers are never killed faster than they can
start. Every execution is logged by the handler in ``testapp.Execution``.

- exactly-once mode (``atomic=True``): the log row commits in the completion's transaction, so
  the log must hold exactly one row per task, however often workers die (3,000 tasks,
  ``PGTASKS_CHAOS_TASKS``);
- at-least-once mode: the log row commits before the completion, so a task whose worker died
  between the two runs again; every task must run at least once, and every duplicate must
  trace back to a killed worker (as many tasks);
- steps: tasks of 10 atomic steps (``ctx.step(..., atomic=True)``; 300 tasks by default,
  ``PGTASKS_CHAOS_STEP_TASKS``): every step's write exactly once, whatever run of its task did
  it, and every task SUCCESSFUL;
- one attempt (``max_attempts=1``, 2,000 native tasks and 2,000 of Django's ``@task``, whose
  default is one attempt): a killed worker interrupts its runs, which spends no attempt, so
  every task still ends SUCCESSFUL; one native task in a hundred returns a value PostgreSQL
  cannot store and must end FAILED alone, without holding back the successes recorded with
  it;
- workflow (its own run): ``chain(atomic parent, group(N atomic members, then=atomic
  callback))``: the parent's end releases N children in bounded batches, within the
  statement timeout, the callback is released once, every task runs exactly once (N is
  ``PGTASKS_CHAOS_WORKFLOW_MEMBERS``, 3,000 by default, three release batches; 100,000 by
  hand).

Run together, the five modes share the worker starts the kills need (22 instead of 13 per
mode), and each kill lands in whatever mix of them its worker held. The counts above are the
defaults; larger ones (``PGTASKS_CHAOS_TASKS=20000 PGTASKS_CHAOS_KILLS=40``) run by hand.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connections, transaction
from django.db.models import Count

from django_pgtasks.models import Task, WorkerProcess
from django_pgtasks.workflows import chain, group
from tests.helpers import (
    Output,
    database_statement_timeout,
    terminate_worker,
    terminate_worker_backends,
    wait_until,
)
from tests.testapp import durable, lifecycle, tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.usefixtures("sessions_terminated")]

#: Tasks of the exactly-once and at-least-once modes, each.
N_TASKS = int(os.environ.get("PGTASKS_CHAOS_TASKS", "3000"))
#: Tasks of the one-attempt modes, each.
N_SMALL = 2_000
#: Members of the workflow mode's group.
N_WORKFLOW = int(os.environ.get("PGTASKS_CHAOS_WORKFLOW_MEMBERS", "3000"))
#: Tasks of the steps mode, and the atomic steps of each.
N_STEP_TASKS = int(os.environ.get("PGTASKS_CHAOS_STEP_TASKS", "300"))
STEPS = 10
WORKERS = 4
#: Workers killed in each run (``PGTASKS_CHAOS_KILLS`` for both): one as the successes pass
#: each of these fractions of the tasks.
KILLS = {run: int(os.environ.get("PGTASKS_CHAOS_KILLS", default))
         for run, default in (("mixed", "18"), ("workflow", "9"))}
KILL_AT = {run: tuple(i / (kills + 1) for i in range(1, kills + 1))
           for run, kills in KILLS.items()}
TIME_LIMIT = int(os.environ.get("PGTASKS_CHAOS_TIME_LIMIT", "600"))
#: The modes whose log must hold one row per task, and those where a duplicate run must come
#: from a killed worker (the rows of Django's tasks name no worker).
EXACTLY_ONCE = ("exactly_once", "workflow", "steps")
TRACED = ("at_least_once", "one_attempt")


def measure_rescue(worker_id: str, killed_at: float, delays: list[float]) -> None:
    """Record how long the tasks a killed worker held stayed RUNNING."""
    try:
        # Past 60s, recorded as is: the assertion on the maximum then fails.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not Task.objects.held_by(worker_id).exists(),
                       60 - (time.monotonic() - killed_at))
        delays.append(time.monotonic() - killed_at)
    finally:
        connections.close_all()


def enqueue(run: str, rng: random.Random) -> tuple[dict[str, set[int]], set[int]]:
    """Enqueue the tasks of ``run``'s modes, each with a random priority; return the ids of
    each mode's tasks and those of the poisoned ones (which must fail). The Django mode is
    left out where Django's tasks framework is not installed."""
    def priority() -> int:
        return rng.randint(0, 200)

    def native(handler, n: int, *args) -> set[int]:
        builds = [handler.build(*args, priority=priority()) for _ in range(n)]
        return {task.pk for task in Task.objects.enqueue_many(builds)}

    if run == "workflow":
        # The enqueue of the whole workflow is one statement per table: not what the timeout
        # is about (the workers' sessions keep it).
        with connections["default"].cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '10min'")
        workflow = chain(
            tasks.chaos_exactly_once.build(),
            group([tasks.chaos_exactly_once.build() for _ in range(N_WORKFLOW)],
                  then=tasks.wf_count_once.build()),
        ).enqueue()
        return {"workflow": {task.pk for task in workflow.tasks}}, set()
    poisoned = {task.pk for task in Task.objects.enqueue_many(
        lifecycle.returns_poison.build(kind, priority=priority())
        for kind in sorted(lifecycle.POISON)
        for _ in range(N_SMALL // 100 // len(lifecycle.POISON)))}
    return {
        "exactly_once": native(tasks.chaos_exactly_once, N_TASKS),
        "at_least_once": native(tasks.chaos_at_least_once, N_TASKS),
        "one_attempt": native(lifecycle.chaos_one_attempt, N_SMALL) | poisoned,
        "django_one_attempt": django_tasks(N_SMALL, priority),
        "steps": native(durable.many_atomic_steps, N_STEP_TASKS, STEPS),
    }, poisoned


def django_tasks(n: int, priority: Callable[[], int]) -> set[int]:
    """Enqueue ``n`` tasks of a Django ``@task``; their ids (none without the framework)."""
    try:
        from tests.testapp import dj_tasks
    except ImportError:
        return set()
    # Django's priorities run from -100 to 100.
    return {int(dj_tasks.chaos_django.using(priority=priority() - 100).enqueue().id)
            for _ in range(n)}


@pytest.mark.timeout(TIME_LIMIT + 120)
@pytest.mark.parametrize("run", ["mixed", "workflow"])
def test_chaos_nothing_lost_and_exactly_once_where_promised(run: str, start_command) -> None:
    timeout = (database_statement_timeout("1s") if run == "workflow"
               else contextlib.nullcontext())
    with timeout:
        chaos(run, start_command)


def chaos(run: str, start_command) -> None:
    rng = random.Random(20_000)
    processes: dict[str, tuple] = {}
    counter = iter(range(1000))

    def spawn() -> None:
        worker_id = f"chaos-{next(counter)}"
        process = start_command("run_pgtasks", "--concurrency", "4", "--worker-id", worker_id,
                                "--log-level", "WARNING")
        processes[worker_id] = (process, Output(process))

    for _ in range(WORKERS):
        spawn()
    # Every worker is up before the tasks come, so none drains the queue alone.
    wait_until(lambda: WorkerProcess.objects.count() == WORKERS, 60, "the workers to start")
    with transaction.atomic():  # all at once: the kill marks count from the first success
        modes, poisoned = enqueue(run, rng)
    n_tasks = sum(len(ids) for ids in modes.values()) - len(poisoned)
    killed: set[str] = set()
    rescue_delays: list[float] = []
    watchers: list[threading.Thread] = []
    terminated = 0
    started = time.monotonic()
    kill_marks = [int(n_tasks * fraction) for fraction in KILL_AT[run]]

    def step() -> bool:
        """Kill a worker at each mark, and terminate the sessions once; ``True`` when done."""
        nonlocal terminated
        succeeded = Task.objects.succeeded().count()
        if succeeded >= n_tasks:
            return True
        failed = Task.objects.failed().exclude(pk__in=poisoned)
        assert not failed.exists(), list(failed.values("pk", "name", "attempt", "error_text"))
        # Only workers that have started (registered) are killed: killing replacements
        # still starting up on a loaded machine would leave no worker running.
        registered = set(WorkerProcess.objects.values_list("name", flat=True))
        up = [w for w, (p, _) in processes.items() if p.poll() is None and w in registered]
        if up and kill_marks and succeeded >= kill_marks[0]:
            kill_marks.pop(0)
            victim = rng.choice(up)
            victim_process = processes[victim][0]
            victim_process.kill()
            victim_process.wait()
            killed.add(victim)
            watcher = threading.Thread(target=measure_rescue,
                                       args=(victim, time.monotonic(), rescue_delays))
            watcher.start()
            watchers.append(watcher)
            spawn()
            up.remove(victim)
        if not terminated and up and succeeded > n_tasks // 2:
            terminated = terminate_worker_backends()
            assert terminated  # the sessions of the workers up at that moment
        return False

    try:
        wait_until(step, TIME_LIMIT, "the queue to drain")
    except AssertionError as exc:
        left = {mode: dict(Task.objects.filter(pk__in=ids).exclude(status="SUCCESSFUL")
                           .values_list("status").annotate(n=Count("id")))
                for mode, ids in modes.items()}
        logs = "\n".join(f"{w}: {''.join(out.lines[-10:])}" for w, (_, out) in processes.items())
        raise AssertionError(f"{exc} Tasks left per mode: {left}; killed {len(killed)}; "
                             f"the workers' last lines:\n{logs}") from None
    elapsed = time.monotonic() - started
    # A replacement may still be starting up: a worker that has not registered has not yet
    # installed its signal handlers, and SIGTERM would end it as it ends any process.
    alive = {w for w, (p, _) in processes.items() if p.poll() is None}
    wait_until(lambda: alive <= set(WorkerProcess.objects.values_list("name", flat=True)), 60,
               "every live worker to have started")
    for process, out in processes.values():
        if process.poll() is None:
            assert terminate_worker(process, out) == 0, out.text
    for watcher in watchers:
        watcher.join()

    wait_until(lambda: Task.objects.failed().count() == len(poisoned), 60,
               "the poisoned tasks to fail")
    assert set(Task.objects.exclude(status="SUCCESSFUL").values_list("pk", flat=True)) == (
        poisoned)
    assert all("UnstorableResultError" in text
               for text in Task.objects.failed().values_list("error_text", flat=True))
    assert not Task.objects.filter(locked_at__isnull=False).exists()
    # Every step of every task took effect exactly once; from here on, one row per task.
    per_step = (Execution.objects.filter(task_id__in=modes.get("steps", ()))
                .values_list("task_id", "worker").annotate(n=Count("id")))
    assert len(per_step) == len(modes.get("steps", ())) * STEPS
    assert {n for _task, _step, n in per_step} <= {1}
    Execution.objects.filter(task_id__in=modes.get("steps", ())).exclude(worker="s0").delete()
    runs = dict(Execution.objects.values_list("task_id").annotate(n=Count("id")))
    assert set(runs) == set().union(*modes.values()) - poisoned  # every task ran
    duplicates = {task_id for task_id, n in runs.items() if n > 1}
    for mode in EXACTLY_ONCE:
        assert not duplicates & modes.get(mode, set()), mode
    if run == "workflow":  # the callback saw every member succeed, once
        callback = Task.objects.get(name=tasks.wf_count_once.name)
        assert callback.result == {"SUCCESSFUL": N_WORKFLOW}
    # A task runs again only if a run of it was cut short by a killed worker.
    traced = duplicates & set().union(*(modes.get(mode, set()) for mode in TRACED))
    suspects = set(Execution.objects.filter(task_id__in=traced).exclude(worker__in=killed)
                   .values_list("task_id", flat=True))
    by_killed = set(Execution.objects.filter(task_id__in=traced, worker__in=killed)
                    .values_list("task_id", flat=True))
    assert suspects <= by_killed
    interrupted = set(Task.objects.filter(interruptions__gt=0).values_list("pk", flat=True))
    print(
        f"\nchaos {run}: {n_tasks} tasks in {elapsed:.0f}s, {len(killed)} workers killed, "
        f"{terminated} backends terminated, {sum(runs.values()) - len(runs)} duplicate runs, "
        f"{len(poisoned)} poisoned; tasks interrupted per mode: "
        + ", ".join(f"{mode} {len(interrupted & ids)}" for mode, ids in modes.items())
        + f"; rescue delay median {statistics.median(rescue_delays):.2f}s "
        f"max {max(rescue_delays):.2f}s over {len(rescue_delays)} kills"
    )
    assert len(killed) >= KILLS[run] // 3
    assert max(rescue_delays) < 15
