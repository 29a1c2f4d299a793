"""The claim: order, due-ness by the database clock, SKIP LOCKED, and the index it uses."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models.signals import post_init

from django_pgtasks.database.schema import LIVE_TABLE
from django_pgtasks.models import Status, Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_claim_marks_tasks_running_for_the_worker() -> None:
    task = Task.objects.enqueue(tasks.noop)
    [claimed] = Task.objects.claim("w1")
    assert claimed.pk == task.pk
    assert (claimed.status, claimed.locked_by, claimed.attempt) == (Status.RUNNING, "w1", 1)
    assert claimed.locked_at == claimed.started_at is not None
    assert claimed.finished_at is None
    assert Task.objects.get(pk=task.pk).status == Status.RUNNING
    assert Task.objects.claim("w2") == []


def fields_of(task: Task) -> dict:
    return {field.attname: getattr(task, field.attname) for field in Task._meta.concrete_fields}


@pytest.mark.parametrize("controlled", [False, True], ids=["plain", "controlled"])
def test_claimed_tasks_are_the_instances_raw_would_build(controlled: bool) -> None:
    """The claim decodes its rows itself (django_pgtasks.lifecycle.row_loading): every field must
    come out as Django's own raw() gives it, time zones and JSON included."""
    Task.objects.enqueue(tasks.add, 1, b={"nested": ["é", 2.5, None]}, key="k", stage="s",
                         **({"concurrency_key": "c"} if controlled else {}))
    Task.objects.enqueue(tasks.noop)
    Task.objects.enqueue(tasks.noop)
    Task.objects.all().update(metadata={"m": [1]}, worker_ids=["earlier"],
                              errors=[{"attempt": 1, "error": "x", "at": "2030-01-01"}])
    claimed = Task.objects.claim("w1", limit=5)
    assert len(claimed) == 3
    for task in claimed:
        [expected] = Task.objects.raw("SELECT * FROM pgtasks_task WHERE id = %s", [task.pk])
        assert fields_of(task) == fields_of(expected)
        for name in ("run_after", "locked_at", "started_at", "created_at", "updated_at"):
            assert getattr(task, name).utcoffset() == timedelta(0)
            assert getattr(task, name).tzinfo == getattr(expected, name).tzinfo
        assert (task._state.adding, task._state.db) == (False, "default")
    # The rows share their worker ids' text, decoded once: each instance has its own list.
    assert [task.worker_ids for task in claimed] == [["earlier", "w1"]] * 3
    assert len({id(task.worker_ids) for task in claimed}) == 3


def test_claimed_tasks_reach_model_init_receivers_and_own_their_values() -> None:
    """Instances are built without Model.__init__ only while nobody listens to its signals;
    a receiver of post_init gets every claimed task, as from raw()."""
    first, second = Task.objects.enqueue(tasks.noop), Task.objects.enqueue(tasks.noop)
    seen = []

    def receiver(sender: type, instance: Task, **kwargs: object) -> None:
        seen.append((instance.pk, instance.status))

    post_init.connect(receiver, sender=Task)
    try:
        [claimed] = Task.objects.claim("w1")
    finally:
        post_init.disconnect(receiver, sender=Task)
    assert seen == [(first.pk, Status.RUNNING)]
    [other] = Task.objects.claim("w1")
    assert other.pk == second.pk
    assert len(seen) == 1
    # Each instance has its own lists and dicts, even for the values decoded without a parse.
    claimed.args.append(1)
    claimed.metadata["k"] = 1
    assert (other.args, other.metadata) == ([], {})


@pytest.mark.django_db(transaction=True)
def test_without_time_zones_the_claim_leaves_time_stamps_to_django(settings) -> None:
    """Only where both Django and the session use UTC does the claim decode time stamps
    itself; with ``USE_TZ = False`` Django's loader gives naive datetimes, as raw() does."""
    task = Task.objects.enqueue(tasks.noop)

    def reconnect() -> None:
        connection.close()
        for cached in ("timezone", "timezone_name"):
            connection.__dict__.pop(cached, None)

    settings.USE_TZ = False
    reconnect()
    try:
        [claimed] = Task.objects.claim("w1")
        [expected] = Task.objects.raw("SELECT * FROM pgtasks_task WHERE id = %s", [task.pk])
        assert claimed.pk == task.pk
        assert claimed.started_at.tzinfo is None
        assert fields_of(claimed) == fields_of(expected)
    finally:
        settings.USE_TZ = True
        reconnect()


def test_claim_order_is_priority_then_run_after_then_id() -> None:
    low = Task.objects.enqueue(tasks.noop, priority=10)
    old = Task.objects.enqueue(tasks.noop)
    new = Task.objects.enqueue(tasks.noop)
    high = Task.objects.enqueue(tasks.noop, priority=200)
    Task.objects.filter(pk=old.pk).update(run_after=old.run_after - timedelta(seconds=5))
    order = [t.pk for t in Task.objects.claim("w", limit=10)]
    assert order == [high.pk, old.pk, new.pk, low.pk]


def test_priority_change_of_a_waiting_task_affects_the_next_claim() -> None:
    first = Task.objects.enqueue(tasks.noop)
    second = Task.objects.enqueue(tasks.noop)
    Task.objects.filter(pk=second.pk).set_priority(101)
    assert [t.pk for t in Task.objects.claim("w")] == [second.pk]
    assert [t.pk for t in Task.objects.claim("w")] == [first.pk]


def test_claim_across_queues_keeps_global_priority_order() -> None:
    Task.objects.enqueue(tasks.noop, queue="default", priority=50)
    urgent = Task.objects.enqueue(tasks.noop, queue="urgent", priority=150)
    email = Task.objects.enqueue(tasks.noop, queue="emails", priority=100)
    got = Task.objects.claim("w", queues=["default", "emails", "urgent"], limit=2)
    assert [t.pk for t in got] == [urgent.pk, email.pk]
    assert Task.objects.running().count() == 2  # the unpicked candidate was not taken


def test_claim_only_serves_the_requested_queues() -> None:
    Task.objects.enqueue(tasks.noop, queue="emails")
    assert Task.objects.claim("w", queues=["default", "urgent"], limit=5) == []
    assert len(Task.objects.claim("w", queues=["emails"], limit=5)) == 1


def test_future_tasks_are_not_claimed_before_their_time_on_the_database_clock() -> None:
    Task.objects.enqueue(tasks.noop, delay=3600)
    assert Task.objects.claim("w") == []
    # Move the task's time into the past *by the database clock*, not the test's.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task SET run_after = now() - interval '1 second'")
    assert len(Task.objects.claim("w")) == 1


def test_retry_waiting_tasks_are_claimed_when_due() -> None:
    task = Task.objects.enqueue(tasks.noop)
    Task.objects.filter(pk=task.pk).update(status=Status.AWAITING_RETRY, attempt=1)
    [claimed] = Task.objects.claim("w")
    assert claimed.attempt == 2


@pytest.mark.parametrize("status", [Status.WAITING, Status.RUNNING, Status.SUCCESSFUL,
                                    Status.FAILED, Status.CANCELLED])
def test_tasks_in_other_states_are_never_claimed(status: str) -> None:
    Task.objects.filter(pk=Task.objects.enqueue(tasks.noop).pk).update(status=status)
    assert Task.objects.claim("w", limit=10) == []


@pytest.mark.django_db(transaction=True)
def test_claim_is_one_statement_in_one_transaction(django_assert_num_queries) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(20))
    # The statement plus the transaction's BEGIN/COMMIT bookkeeping Django records.
    with django_assert_num_queries(3) as captured:
        assert len(Task.objects.claim("w", queues=["default", "emails"], limit=10)) == 10
    sql = [q["sql"] for q in captured.captured_queries]
    assert sql[0] == "BEGIN"
    assert sql[2] == "COMMIT"
    assert "FOR UPDATE SKIP LOCKED" in sql[1]
    assert sql[1].startswith("WITH c0 AS")
    assert "RETURNING" in sql[1]


def test_claim_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        Task.objects.claim("w", limit=0)


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_another_claimer_is_skipped_not_waited_for() -> None:
    first, second = Task.objects.enqueue(tasks.noop), Task.objects.enqueue(tasks.noop)
    locked = threading.Event()
    release = threading.Event()

    def hold_lock_on_first() -> None:
        try:
            with transaction.atomic():
                list(Task.objects.filter(pk=first.pk).select_for_update())
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_lock_on_first)
    holder.start()
    try:
        assert locked.wait(10)
        claimed = Task.objects.claim("w", limit=2)  # returns at once despite the lock
        assert [t.pk for t in claimed] == [second.pk]
    finally:
        release.set()
        holder.join()
    assert [t.pk for t in Task.objects.claim("w", limit=2)] == [first.pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_get_the_same_task() -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(2000))
    got: list[list[int]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def claimer(i: int) -> None:
        try:
            start.wait()
            while batch := Task.objects.claim(f"w{i}", limit=7):
                got[i].extend(t.pk for t in batch)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [pk for ids in got for pk in ids]
    assert len(ids) == len(set(ids)) == 2000
    assert sum(1 for ids in got if ids) >= 2  # several claimers really took part


FINISHED_ROWS = 300_000
PENDING_ROWS = 30_000


def explain(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.slow
def test_claim_uses_the_partial_index_on_a_large_table() -> None:
    """300k finished + 30k pending rows (half of them due): the claim is an index range scan."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      finished_at)
            SELECT 'tests.testapp.tasks.noop', (ARRAY['default','emails','urgent'])[1 + i %% 3],
                   '[]', '{}', 100, CASE WHEN i %% 10 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END,
                   1, 3, '', '{}', now() - interval '1 day', now() - interval '1 hour'
            FROM generate_series(1, %s) AS i
            """,
            [FINISHED_ROWS],
        )
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after)
            SELECT 'tests.testapp.tasks.noop', (ARRAY['default','emails'])[1 + (i / 2) %% 2], '[]',
                   '{}', i %% 200, CASE WHEN i %% 7 = 0 THEN 'AWAITING_RETRY' ELSE 'READY' END,
                   0, 3, '', '{}',
                   now() + (CASE WHEN i %% 2 = 0 THEN 1 ELSE -1 END) * interval '1 hour'
            FROM generate_series(1, %s) AS i
            """,
            [PENDING_ROWS],
        )
        cursor.execute("ANALYZE pgtasks_task")

    from django_pgtasks.lifecycle.claim import claim_statement

    for queues, limit in [(["default"], 1), (["default", "emails"], 50)]:
        with transaction.atomic():
            candidates = [
                Task.objects.claimable(q).select_for_update(skip_locked=True)
                .values_list("id", "priority", "run_after")[:limit]
                for q in queues
            ]
            sql, params = claim_statement(connection, LIVE_TABLE, candidates, limit)
            params.extend(["w", "w"])
            plan = explain(sql, params)
        assert plan.count("Index Scan using pgtasks_task_claim_idx") == len(queues), plan
        assert "Seq Scan" not in plan, plan
        assert "Bitmap" not in plan, plan
        # The claim reads and updates the live partition alone, whatever the history holds.
        assert "pgtasks_task_done" not in plan, plan
        assert "pgtasks_task_failed" not in plan, plan
        # Per queue, rows come out of the index already in claim order; the only sort is the
        # final merge of at most `limit` candidates per queue (keys of the CTEs, not the table).
        sort_keys = [line for line in plan.splitlines() if "Sort Key" in line]
        assert all("pgtasks_task" not in key for key in sort_keys), plan
    # And the real claim returns the highest-priority due task.
    [task] = Task.objects.claim("w", queues=["default"])
    best = (Task.objects.due().filter(queue="default").exclude(pk=task.pk)
            .order_by("-priority").values_list("priority", flat=True).first())
    assert task.priority >= best


@pytest.mark.django_db(transaction=True)
def test_a_worker_turn_claims_and_records_a_batch_in_two_statements() -> None:
    """The loop's share of ten tasks: one claim, one UPDATE for all ten successes (pinned, as
    a regression guard: a per-task query here would cost a round trip per task)."""
    from django.test.utils import CaptureQueriesContext

    from django_pgtasks.lifecycle.recorder import Recorder
    from django_pgtasks.lifecycle.transitions import Succeeded

    Task.objects.enqueue_many(tasks.noop.build() for _ in range(10))
    recorder = Recorder("default")
    with CaptureQueriesContext(connection) as captured:
        claimed = Task.objects.claim("w", queues=["default"], limit=10)
        written = recorder.record([(task, Succeeded(None)) for task in claimed])
    sql = [q["sql"] for q in captured.captured_queries]
    assert len(claimed) == 10
    assert set(written.values()) == {Status.SUCCESSFUL}
    # BEGIN, the claim, COMMIT; then the batch's UPDATE in autocommit.
    assert len(sql) == 4, [s[:60] for s in sql]
    assert (sql[0], sql[2]) == ("BEGIN", "COMMIT")
    assert "FOR UPDATE SKIP LOCKED" in sql[1]
    assert sql[3].lstrip().startswith("UPDATE pgtasks_task"), sql[3]


def test_the_worker_statements_are_never_prepared_on_the_server() -> None:
    """They bind on the server but prepare nothing: a pooler in transaction mode may give
    the next statement another server session, where a prepared statement does not exist."""
    connection.ensure_connection()
    # Even on a connection set to prepare every statement at once (Django leaves psycopg's
    # prepare_threshold off unless OPTIONS ask for it).
    connection.connection.prepare_threshold = 0
    try:
        for _ in range(3):
            Task.objects.enqueue(tasks.noop)
            [claimed] = Task.objects.claim("w1")
            assert Task.objects.mark_succeeded(claimed, None)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone()[0] == 0
    finally:
        connection.connection.prepare_threshold = None
