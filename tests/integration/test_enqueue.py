"""Enqueueing: validation at the boundary, transactional semantics, bulk inserts."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction

from django_pgtasks import (
    InvalidPayloadError,
    InvalidTaskError,
    UnknownQueueError,
    UnknownTaskError,
)
from django_pgtasks.definition.options import (
    MAX_ATTEMPTS_LIMIT,
    MAX_CONCURRENCY_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
)
from django_pgtasks.models import Status, Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_enqueue_stores_a_ready_task_with_handler_defaults() -> None:
    task = Task.objects.enqueue(tasks.add, 1, b=2)
    row = Task.objects.get(pk=task.pk)
    assert (row.name, row.queue, row.args, row.kwargs) == ("tests.testapp.tasks.add", "default",
                                                          [1], {"b": 2})
    assert (row.status, row.priority, row.attempt, row.max_attempts) == (Status.READY, 100, 0, 3)
    assert row.run_after == row.created_at  # both the database's now() of the INSERT


def test_enqueue_by_registered_name_and_handler_shortcut() -> None:
    by_name = Task.objects.enqueue("tests.testapp.tasks.add", 1, 2)
    by_handler = tasks.add.enqueue(3, 4, queue="emails", priority=150, max_attempts=7)
    assert by_name.name == by_handler.name == "tests.testapp.tasks.add"
    assert (by_handler.queue, by_handler.priority, by_handler.max_attempts) == ("emails", 150, 7)


def test_handler_options_are_defaults() -> None:
    task = Task.objects.enqueue(tasks.flaky, 1)
    assert task.max_attempts == 5


def test_delay_is_relative_to_the_database_clock() -> None:
    task = Task.objects.enqueue(tasks.noop, delay=timedelta(minutes=5))
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after - created_at FROM pgtasks_task WHERE id = %s", [task.pk])
        (gap,) = cursor.fetchone()
    assert gap == timedelta(minutes=5)
    assert task.run_after - task.created_at == timedelta(minutes=5)  # returned by the INSERT


def test_run_after_is_stored_as_given() -> None:
    when = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert Task.objects.enqueue(tasks.noop, run_after=when).run_after == when
    assert Task.objects.get().run_after == when


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"priority": -1}, "Priority must be an integer from 0 to 200"),
        ({"priority": 201}, "Priority must be an integer from 0 to 200"),
        ({"priority": "high"}, "Priority must be an integer"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1"),
        ({"delay": -5}, "delay must be a non-negative number"),
        ({"run_after": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"delay": 1, "run_after": datetime(2030, 1, 1, tzinfo=UTC)}, "either run_after or delay"),
    ],
)
def test_invalid_options_raise_and_write_nothing(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidTaskError, match=message):
        Task.objects.enqueue(tasks.noop, **kwargs)
    assert not Task.objects.exists()


def test_unknown_queue_is_refused() -> None:
    with pytest.raises(UnknownQueueError, match="Queue 'nope' is not configured"):
        Task.objects.enqueue(tasks.noop, queue="nope")
    assert not Task.objects.exists()


@pytest.mark.parametrize("name", ["no_such_task", "tests.testapp.tasks.missing", "os.system"])
def test_unknown_task_name_is_refused(name: str) -> None:
    with pytest.raises(UnknownTaskError, match="No task handler is registered"):
        Task.objects.enqueue(name)
    assert not Task.objects.exists()


class Opaque:
    pass


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((Opaque(),), {}, r"Task argument args\[0\] of type Opaque is not JSON-serializable"),
        ((), {"when": datetime.now(UTC)}, "Task argument 'when' of type datetime"),
        ((), {"x": math.nan}, "'x' is nan; NaN and Infinity are not valid JSON"),
        ((), {"x": [1, math.inf]}, r"'x'\[1\] is inf"),
        ((), {"x": {1: "a"}}, "dict key 1 of type int; JSON object keys must be strings"),
        ((), {"x": b"bytes"}, "of type bytes is not JSON-serializable"),
        ((), {"x": "nul\x00"}, "NUL character"),
        ((), {"x": {1, 2}}, "of type set is not JSON-serializable"),
    ],
)
def test_non_json_payloads_are_refused(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidPayloadError, match=message):
        Task.objects.enqueue(tasks.noop, *args, **kwargs)
    assert not Task.objects.exists()


def test_payload_size_and_depth_limits(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "MAX_PAYLOAD_BYTES": 1000, "MAX_PAYLOAD_DEPTH": 5}
    with pytest.raises(InvalidPayloadError, match="more than the limit of 1000 bytes"):
        Task.objects.enqueue(tasks.noop, "x" * 2000)
    nested: list = []
    for _ in range(6):
        nested = [nested]
    with pytest.raises(InvalidPayloadError, match="nested more than 5 levels deep"):
        Task.objects.enqueue(tasks.noop, nested)
    assert not Task.objects.exists()


def test_tuples_are_stored_as_lists() -> None:
    task = Task.objects.enqueue(tasks.takes_anything, (1, 2), pair={"a": (3,)})
    task.refresh_from_db()
    assert task.args == [[1, 2]]
    assert task.kwargs == {"pair": {"a": [3]}}


def test_enqueue_many_takes_ids_then_writes_one_copy(django_assert_num_queries) -> None:
    built = [tasks.add.build(i, i) for i in range(2000)]
    with django_assert_num_queries(2) as queries:
        saved = Task.objects.enqueue_many(built)
    assert "nextval" in queries[0]["sql"]
    assert queries[1]["sql"].split()[:2] == ["COPY", "pgtasks_task_live"]
    assert len(saved) == 2000
    ids = [t.pk for t in saved]
    assert ids == sorted(ids)
    assert len(set(ids)) == 2000
    stored = {t.pk: t for t in Task.objects.filter(pk__in=ids)}
    for i, task in enumerate(saved):
        row = stored[task.pk]
        assert (row.args, row.status, row.attempt) == ([i, i], Status.READY, 0)
        # What the instance says is what the row holds.
        assert (row.run_after, row.created_at) == (task.run_after, task.created_at)


def test_enqueue_many_of_one_key_twice_is_refused_whole() -> None:
    with transaction.atomic():
        with pytest.raises(IntegrityError, match="pgtasks_task_live_key_uniq"), \
                transaction.atomic():
            Task.objects.enqueue_many([tasks.noop.build(), Task.objects.build(tasks.noop, key="k"),
                                       Task.objects.build(tasks.noop, key="k")])
        # The caller's transaction goes on; nothing of the call was written.
        assert not Task.objects.exists()
        assert Task.objects.enqueue_many([Task.objects.build(tasks.noop, key="k")])[0].pk


def test_enqueue_bulk_error_of_the_database_is_djangos() -> None:
    # Everything the API lets through the table accepts, so the table gets a constraint of
    # its own for this test (rolled back with it).
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgtasks_task_live ADD CONSTRAINT test_few "
                       "CHECK (max_attempts < 5)")
    with pytest.raises(IntegrityError, match="test_few"), transaction.atomic():
        Task.objects.enqueue_bulk(tasks.noop, [(), ()], max_attempts=7)
    assert not Task.objects.exists()


def test_enqueue_many_validates_before_writing() -> None:
    with pytest.raises(InvalidPayloadError):
        Task.objects.enqueue_many([tasks.add.build(1, 2), tasks.add.build(object(), 2)])
    assert not Task.objects.exists()
    with pytest.raises(TypeError, match="unsaved tasks"):
        Task.objects.enqueue_many([Task.objects.enqueue(tasks.noop)])


@pytest.mark.django_db(transaction=True)
def test_rolled_back_enqueue_leaves_no_row() -> None:
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            Task.objects.enqueue(tasks.noop)
            raise RuntimeError("caller fails after enqueueing")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_task_is_invisible_to_workers_until_the_caller_commits() -> None:
    """Enqueue has on-commit semantics for free: a worker cannot claim an uncommitted row."""
    seen: list[list[Task]] = []

    def claim_from_other_connection() -> None:
        try:
            seen.append(Task.objects.claim("other-worker", limit=10))
        finally:
            connections.close_all()

    with transaction.atomic():
        task = Task.objects.enqueue(tasks.noop)
        thread = threading.Thread(target=claim_from_other_connection)
        thread.start()
        thread.join()
    assert seen == [[]]
    thread = threading.Thread(target=claim_from_other_connection)
    thread.start()
    thread.join()
    assert [t.pk for t in seen[1]] == [task.pk]


def test_operator_actions_never_touch_running_tasks() -> None:
    _ready, running, failed, done = (Task.objects.enqueue(tasks.noop) for _ in range(4))
    Task.objects.filter(pk=running.pk).update(status=Status.RUNNING, locked_by="w")
    Task.objects.filter(pk=failed.pk).update(status=Status.FAILED, attempt=3, max_attempts=3)
    Task.objects.filter(pk=done.pk).update(status=Status.SUCCESSFUL)
    assert Task.objects.all().set_priority(7) == 1
    assert Task.objects.all().retry_now() == 2  # the ready and the failed one
    failed.refresh_from_db()
    assert (failed.status, failed.max_attempts) == (Status.READY, 4)
    assert Task.objects.all().cancel() == 2
    assert Task.objects.get(pk=running.pk).status == Status.RUNNING
    assert Task.objects.get(pk=done.pk).status == Status.SUCCESSFUL
    with pytest.raises(InvalidTaskError):
        Task.objects.all().set_priority(500)


def test_single_enqueue_is_one_statement_planned_once_per_session(
        django_assert_num_queries) -> None:
    # The INSERT runs inside the database function of migration 0015, which keeps its plan
    # for the session (nothing is prepared on the server by the connection itself).
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        prepared = cursor.fetchone()[0]
    with django_assert_num_queries(1) as captured:
        task = Task.objects.enqueue(tasks.add, 1, 2)
    assert "pgtasks_enqueue_one(" in captured.captured_queries[0]["sql"]
    stored = Task.objects.get(pk=task.pk)
    assert (stored.args, stored.status, stored.run_after, stored.created_at) == (
        [1, 2], Status.READY, task.run_after, task.created_at)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == prepared


def test_enqueue_sends_the_model_signals_save_would_send() -> None:
    from django.db.models.signals import post_save, pre_save

    seen: list[tuple] = []

    def before(instance: Task, **kwargs: object) -> None:
        seen.append(("pre_save", instance.pk, kwargs["using"]))
        instance.priority = 150  # a pre_save receiver may still change what is written

    def after(instance: Task, **kwargs: object) -> None:
        seen.append(("post_save", instance.pk, kwargs["created"], kwargs["using"]))

    pre_save.connect(before, sender=Task)
    post_save.connect(after, sender=Task)
    try:
        task = Task.objects.enqueue(tasks.add, 1, 2)
    finally:
        pre_save.disconnect(before, sender=Task)
        post_save.disconnect(after, sender=Task)
    assert seen == [("pre_save", None, "default"), ("post_save", task.pk, True, "default")]
    assert Task.objects.get(pk=task.pk).priority == 150


def test_enqueue_many_keeps_every_option_and_returns_saved_tasks() -> None:
    when = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    built = [
        tasks.add.build(1, b=2),
        tasks.add.build(3, 4, queue="emails", priority=150, max_attempts=9),
        tasks.noop.build(run_after=when),
        tasks.noop.build(delay=timedelta(minutes=10)),
    ]
    saved = Task.objects.enqueue_many(built)
    assert saved == built
    rows = {t.pk: t for t in Task.objects.all()}
    assert [rows[t.pk].args for t in saved] == [[1], [3, 4], [], []]
    assert rows[saved[0].pk].kwargs == {"b": 2}
    assert (rows[saved[1].pk].queue, rows[saved[1].pk].priority,
            rows[saved[1].pk].max_attempts) == ("emails", 150, 9)
    assert rows[saved[2].pk].run_after == when == saved[2].run_after
    delayed = rows[saved[3].pk]
    assert delayed.run_after - delayed.created_at == timedelta(minutes=10)
    assert saved[3].run_after == delayed.run_after
    assert rows[saved[0].pk].run_after == rows[saved[0].pk].created_at
    # The database's time, as stored (written out as text once for the whole COPY) and as the
    # returned instances hold it, to the microsecond.
    for task in saved:
        row = rows[task.pk]
        assert (task.created_at, task.run_after) == (row.created_at, row.run_after)
        assert row.updated_at == row.created_at
    assert all(r.status == Status.READY and r.attempt == 0 for r in rows.values())


def test_enum_members_are_refused_because_json_would_change_their_type() -> None:
    import enum

    class Color(enum.StrEnum):
        RED = "red"

    with pytest.raises(InvalidPayloadError, match="of type Color would come back from JSON"):
        Task.objects.enqueue(tasks.noop, color=Color.RED)
    assert not Task.objects.exists()


def test_enqueue_bulk_copies_many_tasks_in_the_callers_transaction() -> None:
    ids = Task.objects.enqueue_bulk(tasks.add, [(1, 2), {"a": 3, "b": 4}, [5, 6]],
                                    queue="emails", priority=120)
    rows = Task.objects.in_bulk(ids)
    assert [(rows[i].args, rows[i].kwargs) for i in ids] == [
        ([1, 2], {}), ([], {"a": 3, "b": 4}), ([5, 6], {})]
    assert {(r.name, r.queue, r.priority, r.status, r.max_attempts) for r in rows.values()} == {
        ("tests.testapp.tasks.add", "emails", 120, Status.READY, 3)}
    assert all(r.run_after == r.created_at for r in rows.values())
    assert Task.objects.enqueue_bulk(tasks.add, []) == []


def test_enqueue_bulk_validates_every_item_before_writing() -> None:
    with pytest.raises(InvalidPayloadError, match=r"Task argument args\[1\] is nan"):
        Task.objects.enqueue_bulk(tasks.add, [(1, 2)] * 1000 + [(1, math.nan)])
    with pytest.raises(UnknownQueueError):
        Task.objects.enqueue_bulk(tasks.add, [(1, 2)], queue="nope")
    assert not Task.objects.exists()


@pytest.mark.parametrize("item", ["12", b"ab", 7])
def test_enqueue_bulk_items_must_be_args_or_kwargs(item) -> None:
    with pytest.raises(InvalidTaskError, match="positional arguments \\(a list or tuple\\)"):
        Task.objects.enqueue_bulk(tasks.add, [item])
    assert not Task.objects.exists()


@pytest.mark.parametrize("priority", [PRIORITY_MIN, PRIORITY_MAX])
def test_enqueue_stores_every_option_at_its_bounds(priority: int) -> None:
    """The database function's parameters have the columns' types: the widest values the
    validation lets through reach the row unchanged."""
    far = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    task = Task.objects.enqueue(tasks.noop, priority=priority, max_attempts=MAX_ATTEMPTS_LIMIT,
                                run_after=far, stage="s" * 100, concurrency_key="c" * 255,
                                concurrency_limit=MAX_CONCURRENCY_LIMIT)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.priority, stored.max_attempts, stored.run_after, stored.stage,
            stored.concurrency_key, stored.concurrency_limit) == (
        priority, MAX_ATTEMPTS_LIMIT, far, "s" * 100, "c" * 255, MAX_CONCURRENCY_LIMIT)
    assert task.run_after == far
