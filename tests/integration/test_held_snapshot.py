"""A transaction held open elsewhere in the database (a long report, a session idle in a
transaction): the dead index entries every run leaves behind cannot be removed meanwhile, and
the worker's statements must not read them again and again.

- the claim starts where the last claim of its queue ended (its moving lower bound), so it
  does not step over every task claimed since that transaction began;
- the statements that find one running task by id (a step, a report, an event's wait), and
  the outcomes of a small batch, look the tasks up in the primary key, never by reading the
  whole index of running tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import F

from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.row_loading import ServerBindingCursor
from django_pgtasks.lifecycle.transitions import BY_ID_AT_MOST, Succeeded, statement_for
from django_pgtasks.models import Status, Task
from tests.helpers import conninfo
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: Tasks run while the snapshot is held (each leaves a dead entry in the claim index and in the
#: index of running tasks), claimed this many at a time.
TASKS = 1_500
BATCH = 25



@pytest.fixture
def held_snapshot() -> Iterator[None]:
    """A REPEATABLE READ transaction of another session, its snapshot taken, left open; on a
    vacuumed table (an earlier test's rolled-back rows leave dead entries in the claim index
    until VACUUM, which this test's figures would count)."""
    with psycopg.connect(**conninfo(), autocommit=True) as admin:
        admin.execute("VACUUM pgtasks_task_live")
    with psycopg.connect(**conninfo()) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM pgtasks_task").fetchone()
        yield
        reader.rollback()


def run_tasks(count: int) -> None:
    """Claim and record ``count`` no-op tasks as the worker's loop does, ``BATCH`` at a time."""
    recorder = Recorder("default")
    done = 0
    while done < count:
        claimed = Task.objects.claim("w", ["default"], limit=BATCH)
        assert claimed, f"nothing left to claim after {done} of {count}"
        written = recorder.record([(task, Succeeded(None)) for task in claimed])
        assert set(written.values()) == {Status.SUCCESSFUL}
        done += len(claimed)


def buffers_read(sql: str, params: list, index: str) -> int:
    """Shared buffers the statement's scans of ``index`` read (``EXPLAIN (ANALYZE, BUFFERS)``,
    rolled back)."""
    with transaction.atomic():
        connection.ensure_connection()
        with ServerBindingCursor(connection.connection) as cursor:  # as the worker binds
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
            [[[plan]]] = cursor.fetchall()
        transaction.set_rollback(True)

    def scans(node: dict) -> Iterator[dict]:
        if node.get("Index Name") == index:
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    found = list(scans(plan["Plan"]))
    assert found, plan
    return sum(node["Shared Hit Blocks"] + node["Shared Read Blocks"] for node in found)


def plan_of(sql: str, params: list) -> str:
    connection.ensure_connection()
    with ServerBindingCursor(connection.connection) as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def lasting_bounds(monkeypatch: pytest.MonkeyPatch, kept_claim_mode: None) -> None:
    """Bounds that do not expire during the test, however slow the machine: what the test
    reads is the claim from the bound, not whether a quarter second passed. The choice
    between the plain and the controlled claim is kept as long: once it expires, the next
    claim makes it again with a plain claim from the start of the queue (a CI run once took
    over a second between two claims, and the second one scanned from the start)."""
    monkeypatch.setattr(claiming, "BOUND_REFRESH", 3600.0)


def test_the_claim_does_not_reread_the_tasks_claimed_since_a_held_snapshot(
    held_snapshot: None, lasting_bounds: None,
) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(TASKS + 4 * BATCH))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
    run_tasks(BATCH)

    def scan_cost(**options: bool) -> int:
        sql, params = claiming.plain_statement(Task.objects, ["default"], BATCH, "default",
                                               **options)
        return buffers_read(sql, [*params, "w", "w"], index="pgtasks_task_claim_idx")

    early = scan_cost()
    run_tasks(TASKS)
    bounded, from_start = scan_cost(), scan_cost(from_bounds=False)
    # From its bound, the claim's scans read what they read before the 1,500 runs; from the
    # start, they visit each of those runs' dead entries (and the rows they point to).
    assert bounded <= early + 5, (early, bounded, from_start)
    assert from_start > 5 * bounded, (early, bounded, from_start)


def with_worker(statement: tuple[str, list]) -> tuple[str, list]:
    sql, params = statement
    return sql, [*params, "w", "w"]


def test_statements_on_a_running_task_look_it_up_by_its_primary_key() -> None:
    from django_pgtasks.lifecycle.events import UNFLAG_SQL, WAIT_SQL
    from django_pgtasks.lifecycle.reports import _ON_ITS_OWN as REPORT_SQL
    from django_pgtasks.lifecycle.steps import CHECKPOINT_SQL, RESULT, UNFLUSHED
    from django_pgtasks.lifecycle.transitions import END_FOR_GOOD_SQL

    # A backlog (reading the whole live partition costs what it is), no task running: the
    # index of running tasks looks empty to the planner.
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(5_000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
    lease = {"id": 1, "worker": "w", "claims": 1}
    statements = {
        "step": (CHECKPOINT_SQL.format(result=RESULT, **UNFLUSHED),
                 {**lease, "name": "s", "result": "1", "ms": 1.0}),
        "report": (REPORT_SQL, {**lease, "progress": None, "entries": "[]", "keep": 10}),
        "wait": (WAIT_SQL, {**lease, "key": "k"}),
        "unflag": (UNFLAG_SQL, lease),
        "last resort": (END_FOR_GOOD_SQL, ["e", 1, None, None, None]),
    }
    for what, (sql, params) in statements.items():
        plan = plan_of(sql, params)
        assert "pgtasks_task_live_pkey" in plan, (what, plan)
        assert "pgtasks_task_running_idx" not in plan, (what, plan)
        assert "pgtasks_task_done" not in plan, (what, plan)  # pruned to the live partition


def outcome_statement(claimed: list[Task], runs: int | None = None) -> tuple[str, list]:
    """The successes of ``claimed`` as the worker records them (in a statement for a batch
    of ``runs``, by default as many as there are)."""
    return statement_for(Succeeded, runs or len(claimed)), [
        [t.id for t in claimed], [t.locked_by for t in claimed], [t.claims for t in claimed],
        [None] * len(claimed)]


def test_a_small_batch_of_outcomes_reads_no_dead_entry_of_the_running_index(
    held_snapshot: None,
) -> None:
    """The worker's defaults record a few outcomes at a time: each such statement finds its
    rows by primary key, so it reads about as much after 1,500 runs under a held snapshot
    as before. Through the index of running tasks, as a large batch finds its rows, the same
    statement reads a dead entry for each of those runs."""
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(TASKS + 4 * BATCH))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
    early = buffers_read(*outcome_statement(Task.objects.claim("w", limit=4)),
                         index="pgtasks_task_live_pkey")
    run_tasks(TASKS)
    claimed = Task.objects.claim("w", limit=4)
    by_id = buffers_read(*outcome_statement(claimed), index="pgtasks_task_live_pkey")
    assert by_id <= 2 * early, (early, by_id)
    by_index = buffers_read(*outcome_statement(claimed, runs=BY_ID_AT_MOST + 1),
                            index="pgtasks_task_running_idx")
    assert by_index > 5 * by_id, (early, by_id, by_index)


def test_a_higher_priority_task_enqueued_after_the_bound_is_claimed_first(
    lasting_bounds: None,
) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(10))
    assert len(Task.objects.claim("w", limit=2)) == 2  # the queue's bound: the 2nd task
    urgent = Task.objects.enqueue(tasks.noop, priority=150)
    assert [t.pk for t in Task.objects.claim("w", limit=1)] == [urgent.pk]


def in_claim_order(enqueued: list[Task]) -> list[Task]:
    """Tasks enqueued one after the other, in the order a claim takes them: by their due time
    as the database stored it, then id. The enqueue order is not assumed to be that order:
    each due time is the database clock at its own statement, which nothing guarantees to
    only move forward between two statements."""
    return sorted(enqueued, key=lambda task: (task.run_after, task.pk))


def enqueued_an_hour_ago() -> Task:
    task = Task.objects.enqueue(tasks.noop)
    Task.objects.filter(pk=task.pk).update(run_after=F("run_after") - timedelta(hours=1))
    return task


def test_a_task_that_comes_to_lie_before_the_bound_is_claimed_once_the_range_runs_short(
    lasting_bounds: None,
) -> None:
    later = in_claim_order([Task.objects.enqueue(tasks.noop) for _ in range(5)])
    assert [t.pk for t in Task.objects.claim("w", limit=2)] == [t.pk for t in later[:2]]
    # Due for an hour: first in claim order, but before the queue's bound.
    early = enqueued_an_hour_ago()
    # From the bound, the claim finds the later tasks first (the documented trade-off) ...
    assert [t.pk for t in Task.objects.claim("w", limit=2)] == [t.pk for t in later[2:4]]
    # ... and once the range after the bound cannot fill a claim, a scan from the start
    # tops it up, in the same claim.
    assert {t.pk for t in Task.objects.claim("w", limit=5)} == {later[4].pk, early.pk}


def test_the_bound_is_dropped_after_bound_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claiming, "BOUND_REFRESH", 0.0)  # each bound expires at once
    later = in_claim_order([Task.objects.enqueue(tasks.noop) for _ in range(5)])
    assert len(Task.objects.claim("w", limit=2)) == 2
    early = enqueued_an_hour_ago()
    assert [t.pk for t in Task.objects.claim("w", limit=1)] == [early.pk]
    assert [t.pk for t in Task.objects.claim("w", limit=1)] == [later[2].pk]


def test_the_bounded_claim_is_index_range_scans_from_the_bound(lasting_bounds: None) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(2_000))
    Task.objects.enqueue_many(tasks.noop.build(queue="emails") for _ in range(50))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
    # Tasks of both queues claimed: each queue has its bound.
    Task.objects.filter(queue="emails").update(priority=150)
    assert len(Task.objects.claim("w", ["default", "emails"], limit=60)) == 60
    sql, params = with_worker(claiming.plain_statement(Task.objects, ["default", "emails"], 10,
                                                       "default"))
    plan = plan_of(sql, params)
    # Per queue, the higher priorities and the range after the bound.
    assert plan.count("Index Scan using pgtasks_task_claim_idx") == 4, plan
    assert plan.count("ROW(run_after, id) >") == 2, plan
    assert "Bitmap Index Scan on pgtasks_task_claim_idx" not in plan, plan


def test_compiled_claims_are_kept_for_the_most_recently_used_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker's claim limits vary (free threads, prefetch): the compiled statements of the
    shapes used last are kept, the oldest dropped, whatever the number of shapes seen."""
    monkeypatch.setattr(claiming, "STATEMENT_CACHE_SIZE", 4)
    monkeypatch.setattr(claiming, "_statements", type(claiming._statements)())
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(3))
    for limit in range(1, 9):
        Task.objects.claim("w", ["default"], limit=limit)
        claiming.forget_bounds()  # each claim from the start: one shape per limit
        Task.objects.filter(status=Status.RUNNING).update(status=Status.READY)
    assert len(claiming._statements) == 4
    limits = [key[2] for key in claiming._statements]
    assert limits[-1] == 8
    assert 1 not in limits
    Task.objects.claim("w", ["default"], limit=limits[0])  # used again: the most recent
    assert list(claiming._statements)[-1][2] == limits[0]


@pytest.mark.django_db  # rolled back: the statistics deleted and the session settings too
def test_the_loops_session_reads_the_running_index_entry_by_entry_even_without_statistics(
) -> None:
    """The outcome statement of a large batch reads the index of running tasks. A bitmap scan
    of it reads every dead entry again on each statement (it never marks them), where a plain
    index scan marks those it meets for the next statements to skip; the planner takes a bitmap
    scan when the table has no statistics (a fresh burst) or its last ANALYZE saw many running
    tasks. The loop's session leaves it none to take."""
    from django_pgtasks.worker.loop import Worker

    Task.objects.enqueue_bulk(tasks.noop, [[] for _ in range(20_000)])
    claimed = Task.objects.claim("w", ["default"], limit=300)
    assert len(claimed) > BY_ID_AT_MOST
    with connection.cursor() as cursor:  # as before the first ANALYZE of a fresh burst
        cursor.execute("DELETE FROM pg_statistic WHERE starelid IN "
                       "('pgtasks_task'::regclass, 'pgtasks_task_live'::regclass)")
    Worker(concurrency=1)._prepare_session()  # this thread's connection, as the loop's
    columns = [[t.id for t in claimed], [t.locked_by for t in claimed],
               [t.claims for t in claimed], [None] * len(claimed)]
    with ServerBindingCursor(connection.connection) as cursor:
        cursor.execute("EXPLAIN (COSTS OFF) " + statement_for(Succeeded, len(claimed)),
                       columns)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using pgtasks_task_running_idx" in plan, plan
    assert "Bitmap" not in plan, plan


@pytest.mark.django_db  # rolled back: the session settings too
def test_the_loops_session_looks_up_the_largest_batch_by_id_in_the_primary_key() -> None:
    """On an analyzed live partition of 20,000 tasks, the outcome statement of
    ``BY_ID_AT_MOST`` runs looks each run up in the primary key in the loop's session.

    With the server's default cost of a random page read (4) this test fails on a freshly
    filled test database: the planner reads the whole partition. It does not assert that
    case: what the planner does at 4 depends on the partition's size in pages, which the
    tests run before this one in the same database change (with earlier tests' dead rows the
    lookup by primary key wins at 4 as well)."""
    from django_pgtasks.worker.loop import Worker

    Task.objects.enqueue_bulk(tasks.noop, [[] for _ in range(20_000)])
    claimed = Task.objects.claim("w", ["default"], limit=BY_ID_AT_MOST)
    assert len(claimed) == BY_ID_AT_MOST
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
    Worker(concurrency=1)._prepare_session()  # this thread's connection, as the loop's
    plan = plan_of(*outcome_statement(claimed))
    assert "Index Scan using pgtasks_task_live_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan
