"""Durable steps (``context.step()``): a step that completed is kept with its task and never
runs again, whatever ends a run (a failure, a crash of the worker), and an atomic step's
writes commit with its checkpoint, exactly once."""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from typing import Any

import pytest
from django.db.models import Count

from django_pgtasks.exceptions import LeaseLostError
from django_pgtasks.models import Status, Task
from django_pgtasks.testing import run_task
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import durable
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    Worker(burst=True, concurrency=1).run(install_signals=False)


def effects(task: Task) -> Counter:
    """How many times each step's side effect happened for ``task``."""
    return Counter(Execution.objects.filter(task_id=task.pk).values_list("worker", flat=True))


@pytest.mark.parametrize("atomic", [False, True])
def test_a_retried_task_skips_the_steps_it_completed(atomic: bool) -> None:
    task = Task.objects.enqueue(durable.three_steps, fail_after="b", atomic=atomic)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.SUCCESSFUL, 2)
    assert effects(task) == {"a": 1, "b": 1, "c": 1}
    # Each step's entry: the attempt that completed it, its result, its time and duration.
    assert [(s["name"], s["attempt"]) for s in task.steps] == [("a", 1), ("b", 1), ("c", 2)]
    assert all(s["ms"] >= 0 and s["at"] for s in task.steps)
    # The second attempt got the kept results of a and b, as the first attempt had them.
    assert task.result == [{"step": "a", "claim": 1}, {"step": "b", "claim": 1},
                           {"step": "c", "claim": 2}]


def test_a_task_without_steps_keeps_an_empty_list() -> None:
    task = Task.objects.enqueue(durable.three_steps)
    assert task.steps == []
    task.refresh_from_db()
    assert task.steps == []


def test_an_atomic_step_that_fails_leaves_neither_its_writes_nor_a_checkpoint() -> None:
    task = Task.objects.enqueue(durable.fails_inside_an_atomic_step)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt, task.result) == (Status.SUCCESSFUL, 2, "written")
    # The first attempt's write went with its failed step: one write in all.
    assert list(Execution.objects.filter(task_id=task.pk).values_list("attempt", flat=True)) == [2]
    assert [s["attempt"] for s in task.steps] == [2]


def test_a_step_name_used_twice_in_a_run_fails_the_task_at_once() -> None:
    task = Task.objects.enqueue(durable.same_step_twice)
    drain()
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "StepError: Step 'once' ran already in this run" in task.error_text
    assert effects(task) == {"once": 1}


def test_a_step_result_comes_back_as_kept_on_its_first_run_too() -> None:
    task = Task.objects.enqueue(durable.step_returns, "tuple")
    drain()
    task.refresh_from_db()
    assert task.result == [1, "two", [3]]
    assert task.steps[0]["result"] == [1, "two", [3]]


@pytest.mark.parametrize(("what", "error"), [
    ("object", "UnstorableResultError: The result of step 'value'"),
    ("nul", "UnstorableResultError: The result of step 'value'"),
])
def test_a_step_result_that_cannot_be_kept_fails_the_task_at_once(what: str, error: str) -> None:
    task = Task.objects.enqueue(durable.step_returns, what)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.FAILED, 1)
    assert error in task.error_text
    assert task.steps == []


def test_a_step_result_over_the_limit_fails_the_task(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "MAX_RESULT_BYTES": 10}
    task = Task.objects.enqueue(durable.step_returns, "tuple")  # [1,"two",[3]]: 13 bytes
    drain()
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "more than the limit of 10 bytes" in task.error_text


@pytest.mark.parametrize("atomic", [False, True])
def test_a_step_of_a_run_that_lost_its_task_is_not_kept(atomic: bool) -> None:
    """The task is taken away during the step (as a rescue would): the checkpoint raises
    LeaseLostError; nothing of the step is kept, and an atomic step's write is rolled back."""
    task = Task.objects.enqueue(durable.loses_its_task, atomic)
    with pytest.raises(LeaseLostError, match="step 'taken' completed, but this run no longer"):
        run_task(task, raise_errors=True)
    task.refresh_from_db()
    assert (task.status, task.locked_by) == (Status.RUNNING, "elsewhere")  # not this run's
    assert task.steps == []
    assert effects(task) == ({} if atomic else {"taken": 1})


@pytest.mark.slow
@pytest.mark.parametrize("where", ["inside", "between"])
def test_a_worker_killed_during_a_task_resumes_it_after_its_last_step_elsewhere(
        start_command: Any, where: str) -> None:
    """kill -9 of the worker inside an atomic step (after its write, before its checkpoint)
    or between two steps: the task is rescued and run by another worker, which runs each
    step not kept yet: every step's write exactly once."""
    task = Task.objects.enqueue(durable.dies_in_the_middle, where)
    first = start_command("run_pgtasks", "--concurrency", "1", "--worker-id", "first",
                          "--log-level", "WARNING")
    assert first.wait(60) == -signal.SIGKILL  # it killed itself in the task
    start_command("run_pgtasks", "--concurrency", "1", "--worker-id", "second",
                  "--log-level", "WARNING")
    wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL, 60,
               "the task to be rescued and finished")
    task.refresh_from_db()
    assert effects(task) == {"s0": 1, "s1": 1, "s2": 1}
    kept_by = {s["name"]: s["result"]["claim"] for s in task.steps}
    # s0 (and s1, when the kill came after it) kept by the first run; the rest by the second.
    assert kept_by == ({"s0": 1, "s1": 2, "s2": 2} if where == "inside"
                       else {"s0": 1, "s1": 1, "s2": 2})
    assert task.result == [{"step": f"s{i}", "claim": kept_by[f"s{i}"]} for i in range(3)]
    assert task.worker_ids[-1] == "second"


@pytest.mark.slow
def test_atomic_steps_under_repeated_kill_9_each_take_effect_exactly_once(
        start_command: Any) -> None:
    """200 tasks of 5 atomic steps on 2 workers, one of them killed (SIGKILL) each time 60
    more steps are done, 6 times: every task SUCCESSFUL, every step's write exactly once."""
    n, steps = 200, 5
    Task.objects.enqueue_many([Task.objects.build(durable.many_atomic_steps, steps)
                               for _ in range(n)])
    rng = random.Random(7)
    processes = []

    def spawn() -> None:
        processes.append(start_command("run_pgtasks", "--concurrency", "3", "--worker-id",
                                       f"steps-{len(processes)}", "--log-level", "ERROR"))

    def done_steps() -> int:
        return Execution.objects.count()

    def finished() -> bool:
        return Task.objects.filter(status=Status.SUCCESSFUL).count() == n

    spawn()
    spawn()
    kills = 0
    while kills < 6 and not finished():
        before = done_steps()
        wait_until(lambda before=before: finished() or done_steps() >= before + 60, 120,
                   "the steps to go on")
        alive = [p for p in processes if p.poll() is None]
        if not finished() and alive:
            victim = rng.choice(alive)
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            kills += 1
            spawn()
    wait_until(finished, 180, "every task to finish")
    assert kills >= 3
    per_step = Execution.objects.values("task_id", "worker").annotate(n=Count("id"))
    assert len(per_step) == n * steps
    assert {row["n"] for row in per_step} == {1}  # each step's write exactly once
    assert not Task.objects.exclude(status=Status.SUCCESSFUL).exists()


def test_the_admin_shows_the_kept_steps_of_a_task(admin_client: Any) -> None:
    from django.urls import reverse

    with_steps = Task.objects.enqueue(durable.three_steps, fail_after="b")
    drain()
    without = Task.objects.enqueue(durable.three_steps)
    page = admin_client.get(reverse("admin:django_pgtasks_task_change", args=[with_steps.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert '<table class="pgtasks-steps">' in html
    # One row per kept step, in order: name, attempt, result.
    for name, attempt in (("a", 1), ("b", 1), ("c", 2)):
        assert f"<td>{name}</td><td>{attempt}</td>" in html
    assert "{&quot;step&quot;: &quot;c&quot;, &quot;claim&quot;: 2}" in html
    page = admin_client.get(reverse("admin:django_pgtasks_task_change", args=[without.pk]))
    assert page.status_code == 200
    assert "pgtasks-steps" not in page.content.decode()


def test_a_re_run_on_change_starts_with_no_step_kept() -> None:
    task = Task.objects.enqueue(durable.changes_under_its_key, key="source-1")
    drain()
    task.refresh_from_db()
    assert (task.status, task.result) == (Status.SUCCESSFUL, 2)
    assert effects(task) == {"a": 2}  # the re-run ran step a again, on the new data
    assert [(s["name"], s["result"]["claim"]) for s in task.steps] == [("a", 2)]


def test_retry_from_a_step_runs_it_and_the_later_ones_again() -> None:
    done = Task.objects.enqueue(durable.three_steps)
    failed = Task.objects.enqueue(durable.same_step_twice)  # FAILED, step "once" kept
    other = Task.objects.enqueue(durable.step_returns, "tuple")  # kept "value", not "b"
    drain()
    assert Task.objects.get(pk=done.pk).status == Status.SUCCESSFUL

    assert Task.objects.filter(pk__in=[done.pk, other.pk]).retry_from_step("b") == 1
    task = Task.objects.get(pk=done.pk)
    assert (task.status, [s["name"] for s in task.steps]) == (Status.READY, ["a"])
    drain()
    task.refresh_from_db()
    assert task.status == Status.SUCCESSFUL
    assert effects(task) == {"a": 1, "b": 2, "c": 2}  # a kept; b and c ran again
    assert [(s["name"], s["result"]["claim"]) for s in task.steps] == [
        ("a", 1), ("b", 2), ("c", 2)]
    assert Task.objects.get(pk=other.pk).status == Status.SUCCESSFUL  # no step b: untouched

    # A failed task from its first step: nothing kept, and an attempt more to run with.
    assert Task.objects.filter(pk=failed.pk).retry_from_step("once") == 1
    task = Task.objects.get(pk=failed.pk)
    assert (task.status, task.steps, task.max_attempts) == (Status.READY, [], 2)


def test_retry_from_a_step_leaves_a_running_task_alone_and_checks_the_name() -> None:
    from django_pgtasks.exceptions import StepError

    task = Task.objects.enqueue(durable.three_steps)
    Task.objects.filter(pk=task.pk).update(
        status=Status.RUNNING, steps=[{"name": "a", "result": 1}])
    assert Task.objects.filter(pk=task.pk).retry_from_step("a") == 0
    assert Task.objects.get(pk=task.pk).steps == [{"name": "a", "result": 1}]
    with pytest.raises(StepError, match="non-empty string"):
        Task.objects.all().retry_from_step("")


def test_the_admin_retries_a_task_from_a_chosen_step_after_confirmation(
        admin_client: Any) -> None:
    from django.contrib.messages import get_messages
    from django.urls import reverse

    task = Task.objects.enqueue(durable.three_steps, fail_after="b")
    drain()
    page = admin_client.get(reverse("admin:django_pgtasks_task_change", args=[task.pk]))
    url = reverse("admin:django_pgtasks_task_retry_from_step", args=[task.pk]) + "?step=b"
    assert f'href="{url}"' in page.content.decode()
    # The link asks first: it shows what runs again and what stays kept, and changes nothing.
    confirm = admin_client.get(url)
    html = confirm.content.decode()
    assert confirm.status_code == 200
    assert '<ul class="pgtasks-steps-again"><li>b</li><li>c</li></ul>' in html
    assert '<ul class="pgtasks-steps-kept"><li>a</li></ul>' in html
    assert Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL
    done = admin_client.post(url, {"step": "b", "post": "yes"})
    assert done.status_code == 302
    assert [str(m) for m in get_messages(done.wsgi_request)] == [
        f"Task {task.pk} runs again from step b."]
    task.refresh_from_db()
    assert (task.status, [s["name"] for s in task.steps]) == (Status.READY, ["a"])
    # A step the task did not keep: nothing happens, and the user is told.
    done = admin_client.post(url.replace("step=b", "step=zz"), {"step": "zz", "post": "yes"})
    assert "was not retried" in [str(m) for m in get_messages(done.wsgi_request)][-1]
    assert admin_client.get(url.replace("step=b", "step=")).status_code == 404


def test_a_user_who_may_only_view_tasks_gets_no_retry_link_and_no_retry(client: Any) -> None:
    from django.contrib.auth.models import Permission, User
    from django.urls import reverse

    task = Task.objects.enqueue(durable.three_steps, fail_after="b")
    drain()
    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(viewer)
    page = client.get(reverse("admin:django_pgtasks_task_change", args=[task.pk]))
    assert page.status_code == 200
    assert "pgtasks-steps" in page.content.decode()
    assert "retry-from-step" not in page.content.decode()
    url = reverse("admin:django_pgtasks_task_retry_from_step", args=[task.pk])
    assert client.post(url, {"step": "a", "post": "yes"}).status_code == 403
    assert Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL


@pytest.mark.parametrize("pool", ["thread", "async"])
@pytest.mark.parametrize("fail_after", ["a", "b"])
def test_an_async_handler_keeps_its_steps_on_either_pool(pool: str, fail_after: str) -> None:
    task = Task.objects.enqueue(durable.async_steps, fail_after=fail_after)
    Worker(burst=True, concurrency=2, pool=pool).run(install_signals=False)
    task.refresh_from_db()
    assert (task.status, task.attempt) == (Status.SUCCESSFUL, 2)
    assert effects(task) == {"a": 1, "b": 1, "c": 1}
    first = ["a", "b"] if fail_after == "b" else ["a"]
    assert [s["name"] for s in task.steps if s["result"]["claim"] == 1] == first
    assert task.result == [{"step": name, "claim": 1 if name in first else 2}
                           for name in ("a", "b", "c")]


def test_an_atomic_async_step_needs_a_plain_function() -> None:
    task = Task.objects.enqueue(durable.async_atomic_coroutine)
    drain()
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "StepError: Step 'x': an atomic step runs in one database transaction" in (
        task.error_text)
    assert effects(task) == {}
