"""Per-key concurrency limits, enforced by the claim itself.

The claim-level tests call ``Task.objects.claim()`` directly. The concurrency tests run many
workers (threads, then separate processes) over tasks that hold a shared resource measured by
a gauge in the database (``tests.testapp.limited``): its peak is the largest number of tasks
of one key that ever ran at once, and must never exceed the key's limit. The same workload
without keys drives the gauge above the limit, which shows the assertion can fail.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from django_pgtasks.database.schema import LIVE_TABLE
from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.worker.loop import Worker
from tests.helpers import all_finished, run_workers, stop_processes, wait_until
from tests.testapp import limited, tasks

pytestmark = pytest.mark.django_db



def finish(task: Task) -> None:
    assert Task.objects.mark_succeeded(task)


# -- enqueue options ------------------------------------------------------------------------


def test_a_concurrency_key_defaults_to_a_limit_of_one() -> None:
    task = Task.objects.enqueue(tasks.noop, concurrency_key="customer:42")
    task.refresh_from_db()
    assert (task.concurrency_key, task.concurrency_limit) == ("customer:42", 1)
    plain = Task.objects.enqueue(tasks.noop)
    plain.refresh_from_db()
    assert (plain.concurrency_key, plain.concurrency_limit) == (None, None)


def test_concurrency_options_reach_every_enqueue_path() -> None:
    many = Task.objects.enqueue_many(
        tasks.noop.build(concurrency_key=f"k{i}", concurrency_limit=3) for i in range(3)
    )
    bulk = Task.objects.enqueue_bulk(tasks.add, [(1, 2), (3, 4)], concurrency_key="bulk",
                                     concurrency_limit=2)
    deduplicated = Task.objects.enqueue(tasks.noop, key="dedup", concurrency_key="d")
    rows = dict(Task.objects.values_list("pk", "concurrency_key"))
    assert [rows[t.pk] for t in many] == ["k0", "k1", "k2"]
    assert [rows[pk] for pk in bulk] == ["bulk", "bulk"]
    assert rows[deduplicated.pk] == "d"
    assert set(Task.objects.filter(pk__in=bulk).values_list("concurrency_limit", flat=True)) == {2}


def test_a_handler_can_derive_the_key_from_its_arguments() -> None:
    task = limited.hold_keyed_by_default.enqueue("printer")
    task.refresh_from_db()
    assert (task.concurrency_key, task.concurrency_limit) == ("gauge:printer", 2)
    # The enqueue call wins over the handler's defaults.
    task = limited.hold_keyed_by_default.enqueue("printer", concurrency_key="x",
                                                 concurrency_limit=5)
    task.refresh_from_db()
    assert (task.concurrency_key, task.concurrency_limit) == ("x", 5)


@pytest.mark.parametrize("options", [
    {"concurrency_limit": 2},                           # a limit needs a key
    {"concurrency_key": ""},
    {"concurrency_key": 42},
    {"concurrency_key": "k", "concurrency_limit": 0},
    {"concurrency_key": "k", "concurrency_limit": 40_000},
    {"concurrency_key": "k", "concurrency_limit": True},
])
def test_invalid_concurrency_options_are_refused_before_anything_is_written(options) -> None:
    with pytest.raises(InvalidTaskError):
        Task.objects.enqueue(tasks.noop, **options)
    assert not Task.objects.exists()


# -- the claim --------------------------------------------------------------------------------


def test_at_most_the_limit_of_one_key_runs_at_once() -> None:
    first, second, third = (Task.objects.enqueue(tasks.noop, concurrency_key="k",
                                                 concurrency_limit=2) for _ in range(3))
    got = Task.objects.claim("w", limit=10)
    assert [t.pk for t in got] == [first.pk, second.pk]
    assert Task.objects.claim("w", limit=10) == []
    finish(got[0])
    assert [t.pk for t in Task.objects.claim("w", limit=10)] == [third.pk]


def test_keys_are_independent_and_unkeyed_tasks_are_not_held_back() -> None:
    a1, a2 = (Task.objects.enqueue(tasks.noop, concurrency_key="a") for _ in range(2))
    b1, b2 = (Task.objects.enqueue(tasks.noop, concurrency_key="b") for _ in range(2))
    free = [Task.objects.enqueue(tasks.noop) for _ in range(2)]
    got = {t.pk for t in Task.objects.claim("w", limit=10)}
    assert got == {a1.pk, b1.pk, *(t.pk for t in free)}
    assert Task.objects.filter(pk__in=[a2.pk, b2.pk], status=Status.READY).count() == 2


def test_per_key_order_is_priority_then_age() -> None:
    old = Task.objects.enqueue(tasks.noop, concurrency_key="k")
    new = Task.objects.enqueue(tasks.noop, concurrency_key="k")
    urgent = Task.objects.enqueue(tasks.noop, concurrency_key="k", priority=150)
    Task.objects.filter(pk=old.pk).update(run_after=old.run_after - timedelta(seconds=5))
    order = []
    while got := Task.objects.claim("w", limit=5):
        assert len(got) == 1
        order.append(got[0].pk)
        finish(got[0])
    assert order == [urgent.pk, old.pk, new.pk]


def test_the_limit_counts_running_tasks_of_the_key_in_every_queue() -> None:
    Task.objects.enqueue(tasks.noop, queue="emails", concurrency_key="k")
    waiting = Task.objects.enqueue(tasks.noop, queue="default", concurrency_key="k")
    [running] = Task.objects.claim("w", queues=["emails"], limit=5)
    assert Task.objects.claim("w", queues=["default"], limit=5) == []
    finish(running)
    assert [t.pk for t in Task.objects.claim("w", queues=["default"], limit=5)] == [waiting.pk]


def test_a_full_key_does_not_hide_the_tasks_behind_its_backlog() -> None:
    """More waiting tasks of one key than the claim's candidate window, all in front."""
    window = claiming.controlled_window(1)
    Task.objects.enqueue_many(tasks.noop.build(concurrency_key="busy", priority=150)
                              for _ in range(window + 10))
    behind = Task.objects.enqueue(tasks.noop, priority=50)
    claiming._remember("default", ("default",), controlled=True)
    [first] = Task.objects.claim("w", queues=["default"], limit=2)  # the key's one slot
    assert first.concurrency_key == "busy"
    # The key is full now: the next claim skips its backlog and reaches the task behind.
    assert [t.pk for t in Task.objects.claim("w", queues=["default"], limit=2)] == [behind.pk]


def test_the_claim_says_to_look_again_when_key_limits_cut_a_full_window_short() -> None:
    window = claiming.controlled_window(2)
    Task.objects.enqueue_many(tasks.noop.build(concurrency_key="busy")
                              for _ in range(window + 1))
    got = Task.objects.claim("w", limit=2)
    assert len(got) == 1
    assert got.retry_in == 0
    assert Task.objects.claim("w", limit=2).retry_in is None  # nothing left to find


def test_the_plain_claim_never_takes_a_keyed_task(kept_claim_mode: None) -> None:
    """Even when the process still believes no keys are in use (its decision is kept for
    CONTROLS_REFRESH seconds), the plain claim leaves keyed tasks alone."""
    claiming._remember("default", ("default",), controlled=False)
    keyed = Task.objects.enqueue(tasks.noop, concurrency_key="k")
    plain = Task.objects.enqueue(tasks.noop)
    assert [t.pk for t in Task.objects.claim("w", queues=["default"], limit=5)] == [plain.pk]
    claiming.forget_modes()
    assert [t.pk for t in Task.objects.claim("w", queues=["default"], limit=5)] == [keyed.pk]


@pytest.mark.django_db(transaction=True)
def test_without_keys_or_limits_the_claim_is_the_plain_statement(
    django_assert_num_queries, kept_claim_mode: None,
) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(20))
    Task.objects.claim("w", queues=["default"], limit=5)  # decides, then keeps the decision
    with django_assert_num_queries(3) as captured:
        assert len(Task.objects.claim("w", queues=["default"], limit=5)) == 5
    sql = captured.captured_queries[1]["sql"]
    assert sql.startswith("WITH c0 AS")
    assert "pgtasks_claim_controlled" not in sql


@pytest.mark.django_db(transaction=True)
def test_with_a_keyed_task_waiting_the_claim_switches_to_the_controlled_function(
    django_assert_num_queries, kept_claim_mode: None,
) -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(20))
    Task.objects.enqueue(tasks.noop, concurrency_key="k")
    Task.objects.claim("w", queues=["default"], limit=5)
    with django_assert_num_queries(3) as captured:
        assert len(Task.objects.claim("w", queues=["default"], limit=5)) == 5
    assert "pgtasks_claim_controlled" in captured.captured_queries[1]["sql"]


@pytest.mark.django_db(transaction=True)
def test_two_claimers_of_one_key_take_turns_and_the_second_sees_the_first() -> None:
    """The race the advisory lock closes: claimer B starts while A holds the key's lock and
    has started a task. B must wait, then count A's task, and take nothing."""
    # More than A's window of candidates, so that B finds some A has not locked.
    n = claiming.controlled_window(4) + 8
    Task.objects.enqueue_many(tasks.noop.build(concurrency_key="k") for _ in range(n))
    b_result: list[list[Task]] = []
    b_started = threading.Event()

    def claimer_b() -> None:
        try:
            b_started.set()
            b_result.append(list(Task.objects.claim("b", limit=4)))
        finally:
            connections.close_all()

    # A claims inside a transaction kept open: its advisory lock on the key is held.
    from django.db import transaction

    with transaction.atomic():
        a_got = Task.objects.claim("a", limit=4)
        assert len(a_got) == 1
        thread = threading.Thread(target=claimer_b)
        thread.start()
        b_started.wait(10)
        # B is now blocked on the key's lock (or has not reached it yet): check the lock
        # wait from the database's point of view before letting A commit.
        wait_until(_someone_waits_for_an_advisory_lock, 30, "claimer B to wait for the key's lock")
    thread.join(30)
    assert b_result == [[]]
    assert Task.objects.running().count() == 1


def _someone_waits_for_an_advisory_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
            "AND NOT granted AND classid = %s)", [claiming.KEY_LOCK_NAMESPACE])
        return cursor.fetchone()[0]


# -- many workers ----------------------------------------------------------------------------

LIMITS = {"a": 1, "b": 2, "c": 3}
PER_KEY = 24


def enqueue_gauge_workload(keyed: bool, hold: float = 0.02) -> None:
    Task.objects.enqueue_many(
        limited.hold.build(name, hold,
                           **({"concurrency_key": f"gauge:{name}", "concurrency_limit": limit}
                              if keyed else {}))
        for name, limit in LIMITS.items() for _ in range(PER_KEY)
    )


def run_worker_threads(n: int, concurrency: int) -> list[Worker]:
    return run_workers([Worker(worker_id=f"t{i}", concurrency=concurrency) for i in range(n)],
                       until=all_finished, timeout=240)

@pytest.fixture
def gauge(transactional_db: None) -> None:
    limited.create_gauge_table()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_threads_never_exceed_the_limit_of_a_key(gauge: None) -> None:
    enqueue_gauge_workload(keyed=True)
    workers = run_worker_threads(6, concurrency=3)
    peaks = {name: peak for name, (_now, peak, runs) in limited.gauges().items()}
    runs = {name: runs for name, (_now, _peak, runs) in limited.gauges().items()}
    print(f"\npeak concurrency per key with limits {LIMITS}: {peaks}")
    assert runs == {name: PER_KEY for name in LIMITS}  # every task ran exactly once
    assert Task.objects.succeeded().count() == PER_KEY * len(LIMITS)
    for name, limit in LIMITS.items():
        assert 1 <= peaks[name] <= limit, (name, peaks)
    assert sum(1 for w in workers if w.processed) >= 2  # several workers took part


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_same_workload_without_keys_exceeds_the_limits(gauge: None) -> None:
    """Proves the gauge assertion above can fail: nothing else limits concurrency."""
    enqueue_gauge_workload(keyed=False)
    run_worker_threads(6, concurrency=3)
    peaks = {name: peak for name, (_now, peak, _runs) in limited.gauges().items()}
    print(f"\npeak concurrency per gauge without keys: {peaks}")
    assert any(peaks[name] > limit for name, limit in LIMITS.items()), peaks


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_processes_never_exceed_the_limit_of_a_key(gauge: None, start_command) -> None:
    processes = [
        start_command("run_pgtasks", "--concurrency", "3", "--worker-id", f"proc-{i}",
                      "--log-level", "WARNING")
        for i in range(4)
    ]
    try:
        # All four compete for the work (and each is past its start-up when it is stopped).
        wait_until(lambda: WorkerProcess.objects.count() == 4, timeout=60)
        # Tasks long enough (about 1.2 s of work at the limits' 6 at a time) that a process
        # slowed by a loaded machine cannot leave all of it to another.
        enqueue_gauge_workload(keyed=True, hold=0.1)
        wait_until(all_finished, timeout=240)
    finally:
        outputs = stop_processes(processes)
    assert [p.returncode for p in processes] == [0, 0, 0, 0], outputs
    peaks = {name: peak for name, (_now, peak, _runs) in limited.gauges().items()}
    runs = {name: runs for name, (_now, _peak, runs) in limited.gauges().items()}
    print(f"\npeak concurrency per key with limits {LIMITS}, 4 processes: {peaks}")
    assert runs == {name: PER_KEY for name in LIMITS}
    for name, limit in LIMITS.items():
        assert 1 <= peaks[name] <= limit, (name, peaks)
    workers = set(Task.objects.values_list("locked_by", flat=True))
    assert len(workers) >= 2, workers


# -- the claim's plans ------------------------------------------------------------------------


def explain(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def nested_plans(sql: str, params: list) -> list[str] | None:
    """The plans of the statements a function runs, or ``None`` without auto_explain (it
    needs a superuser, or the module in session_preload_libraries)."""
    from django.db import DatabaseError, transaction

    notices: list[str] = []
    with transaction.atomic():
        connection.ensure_connection()
        def handler(diagnostic: object) -> None:
            notices.append(diagnostic.message_primary or "")

        connection.connection.add_notice_handler(handler)
        try:
            with connection.cursor() as cursor:
                try:
                    with transaction.atomic():
                        cursor.execute("LOAD 'auto_explain'")
                except DatabaseError:
                    return None
                cursor.execute("SET LOCAL auto_explain.log_min_duration = 0")
                cursor.execute("SET LOCAL auto_explain.log_nested_statements = on")
                cursor.execute("SET LOCAL auto_explain.log_level = 'notice'")
                cursor.execute(sql, params)
                cursor.fetchall()
        finally:
            connection.connection.remove_notice_handler(handler)
            transaction.set_rollback(True)
    return [n for n in notices if "plan:" in n]


@pytest.mark.slow
def test_plain_and_controlled_candidate_scans_use_the_claim_index_on_a_large_table() -> None:
    """100k finished and 20k waiting tasks (a tenth of them keyed): the plain claim's
    candidate query, with its pause check, and the controlled claim's candidate scan are
    ordered range scans of the claim index; the running-per-key count uses its own index."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after, finished_at)
            SELECT 'tests.testapp.tasks.noop', 'default', '[]', '{}', 100, 'SUCCESSFUL', 1, 3,
                   '', '{}', now() - interval '1 day', now() - interval '1 hour'
            FROM generate_series(1, 100000)""")
        cursor.execute("""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      concurrency_key, concurrency_limit)
            SELECT 'tests.testapp.tasks.noop', 'default', '[]', '{}', i % 200, 'READY', 0, 3,
                   '', '{}', now() - interval '1 minute',
                   CASE WHEN i % 10 = 0 THEN 'k' || (i % 50) END,
                   CASE WHEN i % 10 = 0 THEN 1 END
            FROM generate_series(1, 20000) AS i""")
        cursor.execute("ANALYZE pgtasks_task")
    from django.db import transaction

    with transaction.atomic():
        candidates = [claiming._plain_candidates(Task.objects, "default", "default", 10)]
        sql, params = claiming.claim_statement(connection, LIVE_TABLE, candidates, 10)
        plan = explain(sql, [*params, "w", "w"])
    assert plan.count("Index Scan using pgtasks_task_claim_idx") == 1, plan
    assert "Seq Scan on pgtasks_task " not in plan, plan
    assert "InitPlan" in plan, plan  # the pause/rate check runs once, not per row
    # The controlled claim's own statements, as the function runs them (auto_explain sends
    # the plan of every statement inside it back as a notice).
    nested = nested_plans("SELECT id FROM pgtasks_claim_controlled(%s, %s, %s, %s)",
                          [["default"], 10, "w", claiming.controlled_window(10)])
    if nested is not None:
        joined = "\n".join(nested)
        assert "Index Scan using pgtasks_task_claim_idx" in joined, joined
        assert "pgtasks_task_key_running_idx" in joined, joined
        assert "Seq Scan on pgtasks_task " not in joined, joined
    # The same statements on their own (also where auto_explain is not available).
    candidate_plan = explain(
        """SELECT t.id FROM pgtasks_task t
           WHERE t.status IN ('READY', 'AWAITING_RETRY') AND t.run_after <= statement_timestamp()
             AND t.queue = %s AND (t.concurrency_key IS NULL OR t.concurrency_key <> ALL (%s))
           ORDER BY t.priority DESC, t.run_after, t.id LIMIT 32 FOR UPDATE OF t SKIP LOCKED""",
        ["default", ["k1", "k2"]])
    assert "Index Scan using pgtasks_task_claim_idx" in candidate_plan, candidate_plan
    assert "Sort" not in candidate_plan, candidate_plan
    running_plan = explain(
        "SELECT concurrency_key, count(*) FROM pgtasks_task WHERE status = 'RUNNING' "
        "AND concurrency_key IS NOT NULL GROUP BY concurrency_key", [])
    assert "pgtasks_task_key_running_idx" in running_plan, running_plan
    mode_plan = explain(f"SELECT {claiming.MODE_SQL}", [["default"], ["default"]])
    assert "pgtasks_task_key_pending_idx" in mode_plan, mode_plan
    assert "Seq Scan on pgtasks_task " not in mode_plan, mode_plan
    # And the controlled claim gives at most one task per key (limit 1 each).
    claiming._remember("default", ("default",), controlled=True)
    got = Task.objects.claim("w", queues=["default"], limit=50)
    keys = [t.concurrency_key for t in got if t.concurrency_key]
    assert len(got) == 50
    assert len(keys) == len(set(keys))


@pytest.mark.django_db(transaction=True)
def test_a_keyed_task_that_stops_running_wakes_the_workers_of_its_queue() -> None:
    import psycopg

    keyed = Task.objects.enqueue(tasks.noop, queue="emails", concurrency_key="k")
    plain = Task.objects.enqueue(tasks.noop, queue="urgent")
    claimed = {t.pk: t for t in Task.objects.claim("w", queues=["emails", "urgent"], limit=5)}
    s = connection.settings_dict
    with psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                         host=s["HOST"] or None, port=s["PORT"] or None,
                         autocommit=True) as listener:
        listener.execute("LISTEN pgtasks")
        assert Task.objects.mark_succeeded(claimed[plain.pk])  # no key: no wake-up
        assert Task.objects.mark_succeeded(claimed[keyed.pk])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == ["emails"]


def test_claimed_tasks_carry_no_helper_column() -> None:
    Task.objects.enqueue(tasks.noop)
    [task] = Task.objects.claim("w", queues=["default"])  # the claim that decides
    assert not hasattr(task, claiming.MODE_COLUMN)


@pytest.mark.parametrize("options", [{"concurrency_key": 3}, {"concurrency_limit": 0},
                                     {"concurrency_limit": "2"}])
def test_pgtask_refuses_bad_concurrency_defaults_at_import_time(options) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_pgtasks import pgtask

    with pytest.raises(ImproperlyConfigured, match="concurrency_"):
        pgtask(name="tests.never_registered", **options)
