"""Periodic tasks: declarations, planning, exactly-once production across workers, admin.

The pure calculations (periods, cron in time zones with DST changes, the missed-run policies)
and the checks of the declarations are in ``tests/unit/definition/test_recurrence.py`` and
``tests/unit/scheduling/``. Everything here runs on real PostgreSQL in transactional tests,
so that ``now()`` advances as it does in production (a test wrapped in one transaction would see the
database clock stand still).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.urls import reverse

from django_pgtasks import pgtask
from django_pgtasks.checks import check_schedules
from django_pgtasks.definition import registry
from django_pgtasks.definition.recurrence import (
    CATCH_UP_LIMIT,
    every,
    zone,
)
from django_pgtasks.models import ArchivedTask, Schedule, Status, Task
from django_pgtasks.scheduling import job as scheduling
from django_pgtasks.scheduling import planned_at
from django_pgtasks.signals import task_enqueued
from django_pgtasks.worker.loop import Worker
from tests.helpers import (
    race_scheduler_passes,
    run_workers,
    sessions_waiting_for_a_lock,
    wait_until,
)
from tests.testapp.models import Execution

DOCS = Path(__file__).resolve().parents[2] / "docs" / "howto" / "periodic.md"
TICK = "tests.testapp.periodic.tick"
db = pytest.mark.django_db(transaction=True)
P = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
MINUTE = every(minutes=1)
UTC_ZONE = zone("UTC")
pytestmark = pytest.mark.usefixtures("fresh_scheduler_state")


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def configure(settings: Any) -> Callable[..., None]:
    """Set PGTASKS keys on top of the test settings (restored after the test)."""
    base = dict(settings.PGTASKS)

    def apply(**options: Any) -> None:
        settings.PGTASKS = {**base, **options}

    return apply


@pytest.fixture
def temporary_handlers() -> Iterator[None]:
    """Handlers registered during the test are unregistered after it, so that schedules
    declared with ``@pgtask(schedule=...)`` never reach another test's workers."""
    before = set(registry._registry)
    yield
    for name in set(registry._registry) - before:
        registry._registry.pop(name)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def move_next_run(name: str, seconds_ago: float) -> datetime:
    """Put a schedule's next planned run ``seconds_ago`` into the past, on the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgtasks_schedule SET next_run_at = now() - make_interval(secs => %s) "
            "WHERE name = %s RETURNING next_run_at", [seconds_ago, name],
        )
        return cursor.fetchone()[0]


def planned_runs(name: str) -> list[datetime]:
    """Planned times of the runs a schedule produced, oldest first (duplicates kept)."""
    return sorted(planned_at(task) for task in Task.objects.filter(metadata__schedule=name))


def every_minute_settings(**entry: Any) -> dict[str, Any]:
    return {"tick": {"task": TICK, "schedule": every(minutes=1), **entry}}


# -- exactly once, across workers -------------------------------------------------------------


@db
@pytest.mark.slow
def test_four_workers_produce_each_planned_run_exactly_once_with_no_gaps(configure) -> None:
    # Every planned time gets its run, even one a stall of the machine let pass ("all"; under
    # the default "once" such runs are coalesced into one, a gap by design): the planned
    # times then follow each other with no gap, each once.
    configure(SCHEDULE={"tick": {"task": TICK, "schedule": every(seconds=1)},
                        "half": {"task": TICK, "schedule": every(seconds=0.5)}},
              SCHEDULER_INTERVAL=0.1, MISSED_RUNS="all")
    producers: Counter[str] = Counter()

    def count_producer(sender: Any, task: Task, **kwargs: Any) -> None:
        producers[threading.current_thread().name] += 1

    task_enqueued.connect(count_producer)
    workers = [Worker(worker_id=f"scheduler-{i}", concurrency=2, poll_interval=0.1)
               for i in range(4)]
    try:
        # Until each schedule has had five seconds' worth of runs, and some have run.
        run_workers(workers, until=lambda: len(planned_runs("tick")) >= 5
                    and len(planned_runs("half")) >= 10 and Execution.objects.exists(),
                    timeout=120)
    finally:
        task_enqueued.disconnect(count_producer)

    for name, period in (("tick", timedelta(seconds=1)), ("half", timedelta(seconds=0.5))):
        runs = planned_runs(name)
        assert max(Counter(runs).values()) == 1  # no planned time produced twice
        # Planned times exactly one period apart: no gap, and no drift from late passes.
        assert all(b - a == period for a, b in itertools.pairwise(runs))
        state = Schedule.objects.get(name=name)
        assert state.last_run_at == runs[-1]
        assert state.next_run_at == runs[-1] + period
        assert planned_at(Task.objects.get(pk=state.last_task_id)) == runs[-1]
    print(f"\nruns produced per worker: {dict(producers)}")
    # Each worker's scheduler runs on its maintainer's thread.
    assert set(producers) <= {f"pgtasks-maintainer scheduler-{i}" for i in range(4)}
    # Every run that was executed was executed once.
    executed = Counter(Execution.objects.values_list("task_id", flat=True))
    assert executed
    assert max(executed.values()) == 1


@db
@pytest.mark.slow
def test_eight_threads_racing_scheduler_passes_produce_each_run_once(configure) -> None:
    # Every planned time gets its run, even those a stall of the machine let pass ("all"):
    # the planned times then follow each other with no gap, each once.
    configure(SCHEDULE={"fast": {"task": TICK, "schedule": every(seconds=0.2)}},
              MISSED_RUNS="all")
    race_scheduler_passes(until=lambda: len(planned_runs("fast")) >= 12)
    runs = planned_runs("fast")
    assert len(runs) >= 12
    assert max(Counter(runs).values()) == 1
    assert all(b - a == timedelta(seconds=0.2) for a, b in itertools.pairwise(runs))


@db
def test_the_guard_rolls_back_a_second_transaction_racing_for_the_same_run(configure) -> None:
    """Without the row lock of a pass, the guarded UPDATE alone keeps the run unique: the
    second transaction waits for the first, finds ``next_run_at`` moved on, and rolls back
    the task it had inserted."""
    configure(SCHEDULE=every_minute_settings())
    scheduling.sync()
    declaration = scheduling.collect()[0]["tick"]
    planned = Schedule.objects.get(name="tick").next_run_at
    first_done, release = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = scheduling._produce("default", declaration, planned,
                                                       db_now(), "once")
                first_done.set()
                release.wait(10)
        finally:
            connections.close_all()

    def second() -> None:
        try:
            first_done.wait(10)
            results["second"] = scheduling._produce("default", declaration, planned,
                                                    db_now(), "once")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_done.wait(10)
    # Blocked on the row the first transaction updated, as the database shows.
    wait_until(lambda: sessions_waiting_for_a_lock("transactionid") == 1, 30,
               "the second transaction to wait for the first")
    assert threads[1].is_alive()
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert len(results["first"]) == 1
    assert results["second"] is None
    assert planned_runs("tick") == [planned]
    assert Task.objects.count() == 1


@db
def test_a_stale_planned_time_produces_nothing(configure) -> None:
    configure(SCHEDULE=every_minute_settings())
    assert len(scheduling.run_scheduler()) == 1
    declaration = scheduling.collect()[0]["tick"]
    state = Schedule.objects.get(name="tick")
    assert scheduling._produce("default", declaration, state.last_run_at, db_now(),
                               "once") is None
    assert Task.objects.count() == 1
    assert Schedule.objects.get(name="tick").next_run_at == state.next_run_at


# -- the schedule row: first run, drift, missed runs, changes ----------------------------------


@db
def test_a_new_period_schedule_runs_at_once_and_then_every_period(configure) -> None:
    configure(SCHEDULE=every_minute_settings(args=[], kwargs={}, queue="emails"))
    ids = scheduling.run_scheduler()
    task = Task.objects.get(pk=ids[0])
    state = Schedule.objects.get(name="tick")
    assert (task.name, task.queue) == (TICK, "emails")
    assert task.metadata == {"schedule": "tick", "planned_at": state.last_run_at.isoformat()}
    assert (state.task_name, state.spec, state.timezone, state.enabled) == (
        TICK, "every 1m", "UTC", True)
    assert state.last_task_id == task.pk
    assert state.next_run_at == state.last_run_at + timedelta(minutes=1)
    assert scheduling.run_scheduler() == []  # not due again before a minute has passed


@db
def test_a_late_pass_plans_the_next_run_from_the_planned_time(configure) -> None:
    configure(SCHEDULE={"tick": {"task": TICK, "schedule": 10}})
    scheduling.sync()
    planned = move_next_run("tick", 3.3)  # the pass comes 3.3 s after the planned time
    scheduling.run_scheduler()
    state = Schedule.objects.get(name="tick")
    assert state.last_run_at == planned
    assert state.next_run_at == planned + timedelta(seconds=10)  # exactly, no drift
    assert planned_runs("tick") == [planned]


@pytest.mark.parametrize(("policy", "expected_runs"), [("once", 1), ("skip", 0), ("all", 11)])
@db
def test_missed_runs_after_downtime_follow_the_policy(
    configure, policy: str, expected_runs: int
) -> None:
    configure(SCHEDULE=every_minute_settings(), MISSED_RUNS=policy)
    scheduling.sync()
    planned = move_next_run("tick", 605)  # stopped for 10 minutes: 11 planned runs passed
    ids = scheduling.run_scheduler()
    assert len(ids) == expected_runs
    runs = planned_runs("tick")
    assert runs == [planned + timedelta(minutes=k) for k in range(expected_runs)]
    state = Schedule.objects.get(name="tick")
    # The schedule continues on its own chain, at the first planned time still ahead.
    assert state.next_run_at == planned + timedelta(minutes=11)
    assert state.next_run_at > db_now()
    assert state.last_run_at == (runs[-1] if runs else None)
    assert state.last_task_id == (max(ids) if ids else None)


@db
def test_catching_up_all_missed_runs_enqueues_at_most_the_limit(configure, caplog) -> None:
    configure(SCHEDULE=every_minute_settings(), MISSED_RUNS="all")
    scheduling.sync()
    planned = move_next_run("tick", 10_000 * 60)  # about a week of minutes
    assert len(scheduling.run_scheduler()) == CATCH_UP_LIMIT
    assert f"the rest beyond {CATCH_UP_LIMIT} skipped" in caplog.text
    assert planned_runs("tick")[-1] == planned + timedelta(minutes=CATCH_UP_LIMIT - 1)
    next_run = Schedule.objects.get(name="tick").next_run_at
    assert (next_run - planned) % timedelta(minutes=1) == timedelta(0)  # still on the chain
    assert next_run - timedelta(minutes=1) <= db_now() < next_run


@db
def test_a_run_is_produced_even_while_the_previous_one_has_not_finished(configure) -> None:
    configure(SCHEDULE=every_minute_settings())
    first = scheduling.run_scheduler()
    Task.objects.filter(pk__in=first).update(status=Status.RUNNING)
    move_next_run("tick", 1)
    second = scheduling.run_scheduler()
    assert len(second) == 1
    assert list(Task.objects.order_by("id").values_list("status", flat=True)) == [
        Status.RUNNING, Status.READY]


@db
def test_a_disabled_schedule_produces_nothing_and_enabling_it_starts_afresh(configure) -> None:
    configure(SCHEDULE=every_minute_settings(enabled=False))
    assert scheduling.run_scheduler() == []
    move_next_run("tick", 3600)
    assert scheduling.run_scheduler() == []
    assert Schedule.objects.get(name="tick").enabled is False

    configure(SCHEDULE=every_minute_settings())  # enabled again, an hour later
    ids = scheduling.run_scheduler()
    assert len(ids) == 1  # one run now, not a catch-up of the hour it was off
    state = Schedule.objects.get(name="tick")
    assert state.enabled is True
    assert state.last_run_at > db_now() - timedelta(seconds=5)


@db
def test_a_schedule_removed_from_code_keeps_its_row_and_stops(configure) -> None:
    configure(SCHEDULE=every_minute_settings())
    first = scheduling.run_scheduler()
    configure(SCHEDULE={})
    move_next_run("tick", 3600)
    assert scheduling.run_scheduler() == []
    state = Schedule.objects.get(name="tick")
    assert (state.last_task_id, state.enabled) == (first[0], True)
    assert Task.objects.count() == 1


@db
def test_a_changed_spec_recomputes_the_next_run_and_an_unchanged_one_writes_nothing(
    configure,
) -> None:
    configure(SCHEDULE=every_minute_settings())
    scheduling.run_scheduler()
    before = Schedule.objects.get(name="tick")
    scheduling._written.clear()  # as in a new worker process with the same code
    scheduling.sync()
    assert Schedule.objects.get(name="tick").updated_at == before.updated_at

    # Another task, same spec: the plan stays.
    configure(SCHEDULE={"tick": {"task": "tests.testapp.periodic.report",
                                 "schedule": every(minutes=1)}})
    scheduling.run_scheduler()
    retasked = Schedule.objects.get(name="tick")
    assert retasked.task_name == "tests.testapp.periodic.report"
    assert retasked.next_run_at == before.next_run_at

    configure(SCHEDULE={"tick": {"task": TICK, "schedule": every(minutes=5)}})
    scheduling.run_scheduler()
    after = Schedule.objects.get(name="tick")
    assert after.spec == "every 5m"
    assert after.next_run_at == before.last_run_at + timedelta(minutes=5)
    assert Task.objects.count() == 1

    configure(SCHEDULE={"tick": {"task": TICK, "schedule": "0 4 * * *",
                                 "timezone": "Asia/Tokyo"}})
    scheduling.run_scheduler()
    tokyo = Schedule.objects.get(name="tick")
    assert (tokyo.spec, tokyo.timezone) == ("0 4 * * *", "Asia/Tokyo")
    # 04:00 in Tokyo is 19:00 UTC, within the next day.
    assert (tokyo.next_run_at.hour, tokyo.next_run_at.minute) == (19, 0)
    assert timedelta(0) < tokyo.next_run_at - db_now() <= timedelta(days=1)


@db
def test_a_row_changed_by_another_version_of_the_code_is_left_alone(configure, caplog) -> None:
    configure(SCHEDULE=every_minute_settings())
    scheduling.run_scheduler()
    Schedule.objects.filter(name="tick").update(spec="every 2m")  # written by newer code
    move_next_run("tick", 3600)
    assert scheduling.run_scheduler() == []
    assert Schedule.objects.get(name="tick").spec == "every 2m"
    assert "changed by another version of the code" in caplog.text


@db
def test_a_pass_costs_one_query(
    configure, django_assert_num_queries,
) -> None:
    # Without schedules in code, the query looks for due schedules made in the admin.
    configure(SCHEDULE={})
    with django_assert_num_queries(1):
        assert scheduling.run_scheduler() == []
    configure(SCHEDULE=every_minute_settings())
    scheduling.run_scheduler()
    with django_assert_num_queries(1):
        assert scheduling.run_scheduler() == []


@db
def test_a_scheduler_interval_of_zero_turns_the_scheduler_off(configure) -> None:
    configure(SCHEDULE=every_minute_settings(), SCHEDULER_INTERVAL=0)
    assert Worker(burst=True, concurrency=1).run(install_signals=False) == 0
    assert not Schedule.objects.exists()
    configure(SCHEDULE=every_minute_settings(), SCHEDULER_INTERVAL=1.0)
    assert Worker(burst=True, concurrency=1).run(install_signals=False) == 0
    assert Schedule.objects.get(name="tick").last_task_id is not None


@db
def test_a_cron_schedule_defaults_to_the_time_zone_setting(configure, settings) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    configure(SCHEDULE={"nightly": {"task": TICK, "schedule": "30 3 * * *"}})
    scheduling.run_scheduler()
    state = Schedule.objects.get(name="nightly")
    assert state.timezone == "Europe/Paris"
    local = state.next_run_at.astimezone(zone("Europe/Paris"))
    assert (local.hour, local.minute) == (3, 30)
    assert Task.objects.count() == 0


@db
def test_a_decorated_handler_with_a_schedule_is_run_by_the_scheduler(
    temporary_handlers: None, configure,
) -> None:
    configure(SCHEDULER_INTERVAL=0.1)

    @pgtask(name="tests.heartbeat", schedule=every(seconds=30), queue="urgent")
    def heartbeat() -> None:
        pass

    [task_id] = scheduling.run_scheduler()
    task = Task.objects.get(pk=task_id)
    assert (task.name, task.queue, task.metadata["schedule"]) == (
        "tests.heartbeat", "urgent", "tests.heartbeat")
    assert Worker(burst=True, concurrency=1).run(install_signals=False) == 0
    assert Task.objects.get(pk=task_id).status == Status.SUCCESSFUL


@db
def test_args_and_kwargs_reach_the_handler(configure) -> None:
    configure(SCHEDULE={"eu": {"task": "tests.testapp.periodic.report", "schedule": 3600,
                               "args": ["eu"], "kwargs": {"full": True}}})
    [task_id] = scheduling.run_scheduler()
    Worker(burst=True, concurrency=1).run(install_signals=False)
    assert Task.objects.get(pk=task_id).result == "eu:full"


@db
def test_a_broken_schedule_is_logged_once_and_does_not_stop_the_others(
    configure, caplog,
) -> None:
    configure(SCHEDULE={
        "bad": {"task": "nowhere.missing", "schedule": 60},
        "good": {"task": TICK, "schedule": 60},
    })
    assert len(scheduling.run_scheduler()) == 1
    scheduling.run_scheduler()
    assert caplog.text.count("nowhere.missing") == 1
    assert not Schedule.objects.filter(name="bad").exists()


# -- admin ------------------------------------------------------------------------------------


@db
def test_the_admin_lists_schedules_with_their_last_task_and_outcome(
    configure, admin_client,
) -> None:
    configure(SCHEDULE={
        "tick": {"task": TICK, "schedule": 60},
        "nightly": {"task": TICK, "schedule": "0 3 * * *", "timezone": "Europe/Berlin"},
        "gone": {"task": TICK, "schedule": 60},
    })
    ids = scheduling.run_scheduler()
    tick_task = Schedule.objects.get(name="tick").last_task_id
    Task.objects.filter(pk=tick_task).update(status=Status.SUCCESSFUL)
    gone_task = Schedule.objects.get(name="gone").last_task_id
    Task.objects.filter(pk=gone_task).delete()
    # The nightly schedule's last run was purged into the archive.
    ArchivedTask.objects.create(id=10**9, name=TICK, status=Status.FAILED)
    Schedule.objects.filter(name="nightly").update(last_task_id=10**9)
    configure(SCHEDULE={  # "gone" is removed from the code
        "tick": {"task": TICK, "schedule": 60},
        "nightly": {"task": TICK, "schedule": "0 3 * * *", "timezone": "Europe/Berlin"},
    })
    assert len(ids) == 2

    response = admin_client.get(reverse("admin:django_pgtasks_schedule_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    for text in ("tick", "nightly", "gone", "every 1m", "0 3 * * *", "Europe/Berlin",
                 f"#{tick_task}</a>", "Successful", f"#{gone_task} (deleted)",
                 f"#{10**9} (archived)", "Failed"):
        assert text in page, text
    nightly = Schedule.objects.get(name="nightly")
    local = nightly.next_run_at.astimezone(zone("Europe/Berlin"))
    assert local.strftime("%Y-%m-%d 03:00:00 %Z") in page
    rows = {s.name: s for s in response.context["cl"].result_list}
    assert (rows["tick"].is_declared, rows["gone"].is_declared) == (True, False)

    change = reverse("admin:django_pgtasks_schedule_change", args=[rows["tick"].pk])
    detail = admin_client.get(change)
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content  # read-only
    delete = "admin:django_pgtasks_schedule_delete"
    assert admin_client.get(reverse(delete, args=[rows["tick"].pk])).status_code == 403
    assert admin_client.get(reverse(delete, args=[rows["gone"].pk])).status_code == 200
    # Schedules can be made in the admin (tests/integration/test_runtime_schedules.py).
    assert admin_client.get(reverse("admin:django_pgtasks_schedule_add")).status_code == 200


# -- the how-to's example -------------------------------------------------------------------


def python_blocks(path: Path) -> dict[str, str]:
    """The ```python blocks of a page, by the file name in their first-line comment."""
    blocks = re.findall(r"```python\n# (\S+)\n(.*?)```", path.read_text(), flags=re.S)
    return dict(blocks)


@db
def test_the_howto_example_runs(temporary_handlers: None, configure) -> None:
    blocks = python_blocks(DOCS)
    exec(compile(blocks["shop/tasks.py"], "shop/tasks.py", "exec"), {"__name__": "shop.tasks"})
    namespace: dict[str, Any] = {}
    exec(compile(blocks["settings.py"], "settings.py", "exec"), namespace)
    configure(**namespace["PGTASKS"])
    assert check_schedules() == []
    ids = scheduling.run_scheduler()
    names = sorted(Task.objects.filter(pk__in=ids).values_list("name", flat=True))
    assert names == ["shop.tasks.refresh_exchange_rates", "shop.tasks.sync_stock"]
    assert set(Schedule.objects.values_list("name", flat=True)) == {
        "shop.tasks.refresh_exchange_rates", "shop.tasks.send_morning_digest",
        "purge-old-carts", "sync-stock",
    }
