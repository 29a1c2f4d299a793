"""The test helpers shipped in django_pgtasks.testing, used as a project's tests would.

Most tests here use pytest-django's ``db`` fixture: the test runs inside one transaction that
is rolled back at the end, so nothing they do is ever committed.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from django_pgtasks import pgtask
from django_pgtasks.definition.registry import TaskContext
from django_pgtasks.models import Status, Task
from django_pgtasks.testing import (
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
    run_eagerly,
    run_task,
)
from tests.testapp import cooperative, tasks
from tests.testapp.models import Execution


@pgtask(name="tests.helpers.breaks_the_transaction", max_attempts=1, context=True)
def breaks_the_transaction(ctx: TaskContext) -> None:
    Execution.objects.create(task_id=ctx.task_id, worker="before the error")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1/0")


@pgtask(name="tests.helpers.signs_up")
def signs_up(email: str) -> None:
    tasks.log_execution.enqueue()  # a follow-up enqueued by the handler itself
    Task.objects.enqueue(tasks.add, len(email), 0, queue="emails")


def in_a_transaction() -> bool:
    return connection.in_atomic_block


@pytest.mark.django_db
def test_drain_runs_due_tasks_inside_the_tests_transaction() -> None:
    assert in_a_transaction()
    ok = Task.objects.enqueue(tasks.add, 2, 3)
    flaky = Task.objects.enqueue(tasks.flaky, 2)  # fails twice, then succeeds (no backoff)
    later = Task.objects.enqueue(tasks.add, 1, 1, delay=3600)

    result = drain()

    assert (len(result), result.succeeded, result.retried) == (4, 2, 2)
    ok.refresh_from_db()
    flaky.refresh_from_db()
    later.refresh_from_db()
    assert (ok.status, ok.result) == (Status.SUCCESSFUL, 5)
    assert (flaky.status, flaky.attempt) == (Status.SUCCESSFUL, 3)
    assert later.status == Status.READY  # not due: left alone
    assert in_a_transaction()


@pytest.mark.django_db
def test_drain_with_delayed_runs_later_tasks_and_snoozes_too() -> None:
    later = Task.objects.enqueue(tasks.add, 1, 1, delay=3600)
    snoozing = Task.objects.enqueue(cooperative.snoozes, 2, 3600)
    result = drain(delayed=True)
    assert (result.succeeded, result.snoozed) == (2, 2)
    assert Task.objects.get(pk=later.pk).status == Status.SUCCESSFUL
    assert Task.objects.get(pk=snoozing.pk).result == 2


@pytest.mark.django_db
def test_drain_only_the_given_queues() -> None:
    default = Task.objects.enqueue(tasks.noop)
    email = Task.objects.enqueue(tasks.noop, queue="emails")
    assert len(drain(["emails"])) == 1
    assert Task.objects.get(pk=default.pk).status == Status.READY
    assert Task.objects.get(pk=email.pk).status == Status.SUCCESSFUL


@pytest.mark.django_db
def test_a_handler_that_breaks_the_transaction_is_recorded_and_the_test_goes_on() -> None:
    task = Task.objects.enqueue(breaks_the_transaction)
    assert drain().failed == 1
    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert "division by zero" in task.error_text
    assert not Execution.objects.exists()  # rolled back with the failed statement
    assert Task.objects.count() == 1       # and the transaction still works


@pytest.mark.django_db
def test_a_handlers_writes_before_an_ordinary_error_stay_as_in_a_worker() -> None:
    task = Task.objects.enqueue(tasks.flaky, 5, max_attempts=1)
    assert drain().failed == 1
    assert list(Execution.objects.values_list("task_id", flat=True)) == [task.pk]


@pytest.mark.django_db
def test_drain_stops_a_task_that_snoozes_forever() -> None:
    Task.objects.enqueue(cooperative.snoozes, 10**6, 0)
    with pytest.raises(RuntimeError, match="drain\\(\\) ran 5 tasks"):
        drain(limit=5)


@pytest.mark.django_db
def test_run_eagerly_runs_each_task_at_enqueue() -> None:
    with run_eagerly():
        task = Task.objects.enqueue(tasks.add, 20, 22, delay=3600)
        assert Task.objects.get(pk=task.pk).result == 42  # already ran, whatever its delay
        signs_up.enqueue("ada@example.com")  # its follow-ups run at once too
    assert set(Task.objects.values_list("status", flat=True)) == {Status.SUCCESSFUL}
    assert Task.objects.count() == 4
    after = Task.objects.enqueue(tasks.noop)  # outside the block: waits again
    assert Task.objects.get(pk=after.pk).status == Status.READY


@pytest.mark.django_db
def test_run_eagerly_as_a_decorator_and_with_raise_errors() -> None:
    @run_eagerly(raise_errors=True)
    def enqueue_a_failure() -> Task:
        return Task.objects.enqueue(tasks.always_fails, "disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        enqueue_a_failure()
    # The outcome was recorded before the error surfaced: one attempt, awaiting its retry.
    task = Task.objects.get(name=tasks.always_fails.name)
    assert (task.status, task.attempt) == (Status.AWAITING_RETRY, 1)


@pytest.mark.django_db
def test_run_eagerly_covers_enqueue_many_and_django_tasks() -> None:
    from tests.djtasks import multiply

    with run_eagerly():
        Task.objects.enqueue_many(tasks.add.build(i, i) for i in range(3))
        result = multiply.enqueue(6, 7)
    assert sorted(Task.objects.filter(name=tasks.add.name).values_list("result", flat=True)) \
        == [0, 2, 4]
    result.refresh()
    assert result.return_value == 42


@pytest.mark.django_db
def test_run_task_runs_one_task_and_leaves_the_rest() -> None:
    one, other = Task.objects.enqueue(tasks.add, 1, 2), Task.objects.enqueue(tasks.noop)
    assert run_task(one).result == 3
    assert run_task(one.pk).status == Status.SUCCESSFUL  # not waiting any more: unchanged
    assert Task.objects.get(pk=other.pk).status == Status.READY


@pytest.mark.django_db
def test_assert_enqueued_and_assert_not_enqueued() -> None:
    Task.objects.enqueue(tasks.add, 1, 2)
    Task.objects.enqueue(tasks.flaky, fail_times=3, queue="emails")
    [task] = assert_enqueued(tasks.add, 1, 2)
    assert task.queue == "default"
    assert_enqueued("tests.testapp.tasks.add")  # by name, any arguments
    assert_enqueued(tasks.flaky, fail_times=3)  # keyword arguments: these keys match
    assert_not_enqueued(tasks.add, 2, 1)
    assert_not_enqueued(tasks.flaky, fail_times=4)
    assert_not_enqueued(tasks.noop)
    with pytest.raises(AssertionError, match=r"No waiting task tests\.testapp\.tasks\.add\(3\)\. "
                                             r"Waiting: #\d+ tests\.testapp\.tasks\.add\(1, 2\)"):
        assert_enqueued(tasks.add, 3)
    with pytest.raises(AssertionError, match="Expected no waiting task"):
        assert_not_enqueued(tasks.add)
    drain()
    assert enqueued() == []  # ran: no longer waiting
    assert_not_enqueued(tasks.add, 1, 2)


@pytest.mark.django_db
def test_assert_enqueued_accepts_django_tasks() -> None:
    from tests.djtasks import multiply

    multiply.enqueue(2, b=3)
    assert_enqueued(multiply, 2, b=3)
    with pytest.raises(TypeError, match="Expected a @pgtask handler"):
        assert_enqueued(42)


@pytest.mark.django_db(transaction=True)
def test_drain_in_a_transactional_test_commits_like_a_worker() -> None:
    assert not in_a_transaction()
    task = Task.objects.enqueue(tasks.log_execution_atomic)
    assert drain().succeeded == 1
    assert Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL
    assert Execution.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_drain_inside_an_atomic_block_of_a_transactional_test() -> None:
    with transaction.atomic():
        Task.objects.enqueue(tasks.add, 1, 1)
        assert drain().succeeded == 1
        with pytest.raises(IntegrityError), transaction.atomic():
            Task.objects.create(name="x", priority=999)
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 1
