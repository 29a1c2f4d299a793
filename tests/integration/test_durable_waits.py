"""Durable sleeps and waits for events (``context.sleep()``, ``sleep_until()``,
``wait_for_event()``, ``Task.objects.send_event()``): the run ends without spending an
attempt and holding nothing, the task is due again at the time (database clock) or when the
event is sent, and the next run replays the kept steps and goes on after the sleep or wait."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone

from django_pgtasks.database.sessions import open_connection
from django_pgtasks.definition import run_report
from django_pgtasks.exceptions import InvalidEventError
from django_pgtasks.lifecycle import events, transitions
from django_pgtasks.lifecycle.transitions import Suspended
from django_pgtasks.models import Event, Status, Task
from django_pgtasks.patterns import retention
from django_pgtasks.testing import run_task
from django_pgtasks.worker.loop import Worker
from tests.helpers import database_now, time_passes, wait_until
from tests.testapp import waiting
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def drain(concurrency: int = 1, **options: object) -> None:
    Worker(burst=True, concurrency=concurrency, **options).run(install_signals=False)


def effects(task: Task) -> Counter:
    return Counter(Execution.objects.filter(task_id=task.pk).values_list("worker", flat=True))


def due(task: Task) -> bool:
    return Task.objects.filter(pk=task.pk, run_after__lte=Now()).exists()


# -- durable sleep -------------------------------------------------------------------------


def test_a_durable_sleep_ends_the_run_and_the_task_goes_on_after_it() -> None:
    task = Task.objects.enqueue(waiting.sleeps_between_steps, 3600)
    drain()
    task.refresh_from_db()
    # Suspended: ready again at the kept time, the attempt given back, no worker held.
    assert (task.status, task.attempt, task.locked_at) == (Status.READY, 0, None)
    assert [s["name"] for s in task.steps] == ["a", "@sleep 1"]
    until = task.steps[1]["result"]["until"]
    assert task.run_after.isoformat() == timezone.datetime.fromisoformat(until).isoformat()
    assert task.run_after > task.started_at
    assert effects(task) == {"a": 1}

    time_passes(task)
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt, task.claims) == (Status.SUCCESSFUL, 1, 2)
    assert effects(task) == {"a": 1, "b": 1}
    assert task.result == [{"step": "a", "claim": 1}, {"step": "b", "claim": 2}]


def test_a_task_woken_before_its_sleep_ends_sleeps_on_until_the_kept_time() -> None:
    task = Task.objects.enqueue(waiting.sleeps_between_steps, 3600)
    drain()
    task.refresh_from_db()
    kept = task.run_after
    Task.objects.filter(pk=task.pk).retry_now()
    assert due(task)
    drain()
    task.refresh_from_db()
    # The second run replayed step a, found the sleep not over and suspended again.
    assert (task.status, task.claims, task.run_after) == (Status.READY, 2, kept)
    assert effects(task) == {"a": 1}
    assert [s["name"] for s in task.steps] == ["a", "@sleep 1"]


def test_sleep_until_keeps_the_time_of_the_first_run() -> None:
    task = Task.objects.enqueue(waiting.sleeps_until_later, 3600)
    drain()
    time_passes(task)
    task.refresh_from_db()
    first = task.run_after
    drain()
    task.refresh_from_db()
    # The second run asked for a later time (an hour on) but woke at the first one: done.
    assert (task.status, task.result, task.claims) == (Status.SUCCESSFUL, "after", 2)
    assert timezone.datetime.fromisoformat(task.steps[0]["result"]["until"]) == first


def test_a_sleep_that_ends_in_the_past_does_not_suspend() -> None:
    past = (timezone.now() - timedelta(days=1)).isoformat()
    task = run_task(Task.objects.enqueue(waiting.sleeps_until, past))
    assert (task.status, task.result, task.claims) == (Status.SUCCESSFUL, "awake", 1)
    zero = run_task(Task.objects.enqueue(waiting.sleeps_once, 0))
    assert (zero.status, zero.claims) == (Status.SUCCESSFUL, 1)


@pytest.mark.parametrize("seconds", [-1, 10**9, "1", True, None])
def test_a_bad_sleep_fails_the_task_with_a_clear_error(seconds: object) -> None:
    task = run_task(Task.objects.enqueue(waiting.sleeps_once, seconds))
    assert task.status == Status.FAILED
    assert "sleep() takes 0 to 31622400 seconds or a timedelta" in task.error_text


def test_a_cancelled_sleeping_task_ends_cancelled() -> None:
    task = Task.objects.enqueue(waiting.sleeps_between_steps, 3600)
    drain()
    assert Task.objects.filter(pk=task.pk).cancel().cancelled == 1
    task.refresh_from_db()
    assert task.status == Status.CANCELLED


# -- events --------------------------------------------------------------------------------


def test_a_task_waits_for_its_event_and_gets_the_payload() -> None:
    task = Task.objects.enqueue(waiting.waits_for_event, "order-1")
    drain()
    task.refresh_from_db()
    assert (task.status, task.attempt, task.awaited_event) == (Status.READY, 0, "order-1")
    assert not due(task)
    assert effects(task) == {"before": 1}

    assert Task.objects.send_event("order-1", {"paid": 12.5}) == 1
    task.refresh_from_db()
    assert task.awaited_event is None
    assert due(task)
    drain()
    task.refresh_from_db()
    assert (task.status, task.result, task.claims) == (Status.SUCCESSFUL, {"paid": 12.5}, 2)
    assert effects(task) == {"before": 1, "after": 1}
    assert [s["name"] for s in task.steps] == ["before", "@event order-1", "after"]
    # Sent again: nobody waits any more, and the task's kept payload stays.
    assert Task.objects.send_event("order-1", "again") == 0
    assert Event.objects.get(key="order-1").payload == "again"


def test_an_event_sent_before_the_wait_is_not_lost() -> None:
    Task.objects.send_event("early", [1, 2])
    task = Task.objects.enqueue(waiting.waits_for_event, "early")
    drain()
    task.refresh_from_db()
    assert (task.status, task.result, task.claims) == (Status.SUCCESSFUL, [1, 2], 1)


def test_an_event_sent_in_a_rolled_back_transaction_was_never_sent() -> None:
    task = Task.objects.enqueue(waiting.waits_for_event, "maybe")
    drain()
    with transaction.atomic():
        assert Task.objects.send_event("maybe", 1) == 1
        transaction.set_rollback(True)
    task.refresh_from_db()
    assert (task.status, task.awaited_event) == (Status.READY, "maybe")
    assert not due(task)
    assert not Event.objects.filter(key="maybe").exists()


def test_one_event_wakes_every_task_waiting_for_it() -> None:
    tasks = [Task.objects.enqueue(waiting.waits_only, "broadcast") for _ in range(5)]
    drain(concurrency=2)
    assert Task.objects.filter(status=Status.READY, awaited_event="broadcast").count() == 5
    assert Task.objects.send_event("broadcast", "go") == 5
    drain(concurrency=2)
    assert sorted(Task.objects.filter(pk__in=[t.pk for t in tasks])
                  .values_list("status", "result")) == [(Status.SUCCESSFUL, "go")] * 5


def test_a_wait_times_out_and_stays_timed_out_on_a_retry() -> None:
    task = Task.objects.enqueue(waiting.waits_or_times_out, "late", 3600, fail_after=True)
    drain()
    task.refresh_from_db()
    # One run, suspended until the deadline (keeping the deadline left its flag in place).
    assert (task.status, task.claims, task.awaited_event) == (Status.READY, 1, "late")
    deadline = timezone.datetime.fromisoformat(task.steps[0]["result"]["until"])
    assert task.run_after == deadline
    time_passes(task)
    task = run_task(task)
    # Timed out (the first attempt then failed on purpose), its flag cleared...
    assert (task.status, task.attempt, task.awaited_event) == (
        Status.AWAITING_RETRY, 1, None)
    assert [s["name"] for s in task.steps] == ["@wait late", "@timeout late"]
    # ... and the event sent before the retry does not change what the retry sees.
    assert Task.objects.send_event("late", "too late") == 0
    task = run_task(task)
    assert (task.status, task.attempt) == (Status.SUCCESSFUL, 2)
    assert task.result == {"timeout": "The event 'late' was not sent within 3600s."}


def test_a_wait_answered_before_its_timeout_returns_the_payload() -> None:
    task = Task.objects.enqueue(waiting.waits_or_times_out, "soon", 3600)
    drain()
    Task.objects.send_event("soon", {"ok": True})
    drain()
    task.refresh_from_db()
    assert (task.status, task.result) == (Status.SUCCESSFUL, {"payload": {"ok": True}})


def test_waiting_twice_for_a_key_in_a_run_fails_the_task() -> None:
    Task.objects.send_event("twice", 1)
    task = run_task(Task.objects.enqueue(waiting.waits_twice, "twice"))
    assert task.status == Status.FAILED
    assert "StepError" in task.error_text
    assert "@event twice" in task.error_text


def test_an_async_handler_sleeps_and_waits_durably() -> None:
    task = Task.objects.enqueue(waiting.async_sleeps_and_waits, "async-key", 3600)
    drain(pool="async")
    task.refresh_from_db()
    assert (task.status, [s["name"] for s in task.steps]) == (Status.READY, ["a", "@sleep 1"])
    time_passes(task)
    drain(pool="async")
    task.refresh_from_db()
    assert (task.status, task.awaited_event) == (Status.READY, "async-key")
    Task.objects.send_event("async-key", "async payload")
    drain(pool="async")
    task.refresh_from_db()
    assert (task.status, task.result, task.attempt) == (Status.SUCCESSFUL, "async payload", 1)
    assert effects(task) == {"a": 1, "b": 1}


def test_a_process_pool_child_sleeps_and_waits_durably() -> None:
    sleeper = Task.objects.enqueue(waiting.sleeps_between_steps, 3600)
    waiter = Task.objects.enqueue(waiting.waits_for_event, "child-key")
    drain(pool="process")
    sleeper.refresh_from_db()
    waiter.refresh_from_db()
    assert (sleeper.status, waiter.status, waiter.awaited_event) == (
        Status.READY, Status.READY, "child-key")
    Task.objects.send_event("child-key", "from the parent")
    time_passes(sleeper)
    drain(pool="process")
    assert set(Task.objects.filter(pk__in=[sleeper.pk, waiter.pk])
               .values_list("status", flat=True)) == {Status.SUCCESSFUL}
    waiter.refresh_from_db()
    assert waiter.result == "from the parent"


@pytest.mark.parametrize(("key", "payload", "message"), [
    ("", None, "An event key must be a non-empty string"),
    (7, None, "An event key must be a non-empty string"),
    ("k" * 201, None, "An event key has at most 200 characters"),
    ("a\x00b", None, "An event key cannot contain a NUL character"),
    ("a\ud800", None, "An event key cannot contain a lone surrogate"),
    ("k", {"x": float("nan")}, "The event's payload"),
    ("k", {1, 2}, "The event's payload"),
    ("k", "a\x00", "The event's payload"),
    ("k", 10**5000, "The event's payload"),
], ids=["empty", "int", "long", "nul", "surrogate", "nan", "set", "nul-payload", "huge-int"])
def test_a_bad_event_is_refused_before_any_sql(key: object, payload: object,
                                               message: str) -> None:
    Task.objects.enqueue(waiting.nothing)
    with transaction.atomic():
        with pytest.raises(InvalidEventError, match=message.replace("(", r"\(")):
            Task.objects.send_event(key, payload)
        # The caller's transaction is still usable, and nothing was written.
        assert Task.objects.count() == 1
    assert not Event.objects.exists()


# -- the race between a send and a wait, step by step ----------------------------------------


def flagged_run(key: str) -> Task:
    """A claimed task whose run looked for ``key`` (not sent) and flagged its task."""
    Task.objects.enqueue(waiting.waits_only, key)
    [task] = Task.objects.claim("w1")
    with Task.objects.event_check(task, key) as found:
        assert (found.sent, found.flagged) == (False, True)
    return task


def test_a_send_between_the_flag_and_the_suspension_makes_the_task_due_at_once() -> None:
    task = flagged_run("between")
    assert Task.objects.send_event("between", 1) == 1  # clears the running task's flag
    assert transitions.write("default", [(task, Suspended(None, event=True))]) == {
        task.pk: Status.READY}
    task.refresh_from_db()
    assert task.awaited_event is None
    assert due(task)


def test_a_send_after_the_suspension_makes_the_task_due_at_once() -> None:
    task = flagged_run("after")
    transitions.write("default", [(task, Suspended(None, event=True))])
    task.refresh_from_db()
    assert (task.awaited_event, due(task)) == ("after", False)
    assert task.run_after > database_now() + timedelta(days=364)
    assert Task.objects.send_event("after", 1) == 1
    assert due(task)


def test_a_wait_during_an_open_send_waits_for_its_commit_and_sees_the_event() -> None:
    """The sender's transaction is open (its event not yet visible) when the run looks for
    the key: the run waits for the key's lock, then finds the event."""
    Task.objects.enqueue(waiting.waits_only, "open")
    [task] = Task.objects.claim("w1")
    found: list = []

    def look() -> None:
        try:
            with Task.objects.event_check(task, "open") as check:
                found.append(check)
        finally:
            connection.close()

    with open_connection("default") as sender:
        sender.execute("BEGIN")
        sender.execute(events.LOCK_SQL, {"key": "open"})
        sender.execute(events.SEND_SQL, {"key": "open", "payload": '"sent"'})
        looker = threading.Thread(target=look)
        looker.start()
        try:
            wait_until(lambda: waiting_for_advisory_lock() == 1,
                       what="the run waits for the key")
        finally:
            sender.execute("COMMIT")
            looker.join(30)
    assert [(f.sent, f.payload, f.flagged) for f in found] == [(True, "sent", False)]


def waiting_for_advisory_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND NOT granted AND database = (SELECT oid FROM pg_database "
                       "WHERE datname = current_database())")
        return cursor.fetchone()[0]


def test_sends_racing_waits_lose_no_wake_up() -> None:
    """Events sent from four threads while a worker starts the tasks that wait for them,
    the sends landing before, during and after each wait: every task gets its payload."""
    keys = [f"race-{i}" for i in range(120)]
    tasks = Task.objects.enqueue_many(
        [Task.objects.build(waiting.waits_only, key) for key in keys])
    worker = Worker(concurrency=4, poll_interval=60, burst=False)
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    runner.start()
    try:
        def send(part: list[str]) -> None:
            try:
                for key in part:
                    Task.objects.send_event(key, key.upper())
            finally:
                connection.close()

        senders = [threading.Thread(target=send, args=(keys[i::4],)) for i in range(4)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == len(keys),
                   timeout=60)
    finally:
        worker.stop()
        runner.join(60)
    assert dict(Task.objects.filter(pk__in=[t.pk for t in tasks])
                .values_list("args__0", "result")) == {k: k.upper() for k in keys}


@pytest.mark.slow
def test_sleeping_and_waiting_tasks_hold_no_thread_while_others_drain() -> None:
    """500 sleeping and 500 waiting tasks, started first, and 500 others on a worker of
    two threads: had a sleep or a wait held its thread, the drain could never end."""
    sleepers = Task.objects.enqueue_many(
        Task.objects.build(waiting.sleeps_once, 3600, priority=200) for _ in range(500))
    waiters = Task.objects.enqueue_many(
        Task.objects.build(waiting.waits_only, f"many-{i}", priority=200) for i in range(500))
    Task.objects.enqueue_many(Task.objects.build(waiting.nothing) for _ in range(500))
    drain(concurrency=2)
    assert Task.objects.filter(name__endswith=".nothing", status=Status.SUCCESSFUL).count() \
        == 500
    # Every waiter ran once and waits, holding nothing: ready, not due, flagged.
    assert Task.objects.filter(pk__in=[t.pk for t in waiters], status=Status.READY,
                               awaited_event__isnull=False, run_after__gt=Now(),
                               claims=1).count() == 500
    with transaction.atomic():
        woken = sum(Task.objects.send_event(f"many-{i}", i) for i in range(500))
    assert woken == 500
    for sleeper in sleepers:  # an hour on, for them (the drain above took seconds at most)
        time_passes(sleeper)
    wait_until(lambda: not Task.objects.filter(status=Status.READY, run_after__gt=Now())
               .exists(), what="the sleepers' times have come")
    drain(concurrency=2)
    both = Task.objects.filter(pk__in=[t.pk for t in [*sleepers, *waiters]])
    assert set(both.values_list("status", "attempt", "claims")) == {(Status.SUCCESSFUL, 1, 2)}
    assert sorted(Task.objects.filter(pk__in=[t.pk for t in waiters])
                  .values_list("result", flat=True)) == list(range(500))
    # No sleeper ran again before its time.
    for sleeper in Task.objects.filter(pk__in=[t.pk for t in sleepers]):
        assert sleeper.started_at >= timezone.datetime.fromisoformat(
            sleeper.steps[0]["result"]["until"])


# -- progress and log --------------------------------------------------------------------------


def test_a_run_keeps_its_progress_and_its_log_records() -> None:
    task = Task.objects.enqueue(waiting.reports_progress, 50, fail=True)
    drain()
    task.refresh_from_db()
    assert (task.status, task.result) == (Status.SUCCESSFUL, 50)
    # The last progress of the last run (written as the run ended, though within the second).
    assert {k: task.progress[k] for k in ("done", "total", "message")} == {
        "done": 50, "total": 50, "message": "item 50"}
    assert task.progress["at"]
    # Both runs' records, in order: the run's logger and the project's, nothing else.
    assert [(e["level"], e["logger"], e["message"]) for e in task.log] == [
        ("INFO", "django_pgtasks.task", "starting 50 items"),
        ("WARNING", "tests.project", "a record of the project's own logger"),
    ] * 2


def test_a_tasks_log_is_bounded_and_clean(settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "TASK_LOG_LENGTH": 10}
    task = run_task(Task.objects.enqueue(waiting.logs_a_lot, 25))
    assert task.status == Status.SUCCESSFUL
    assert [e["message"] for e in task.log] == [
        f"record {i} x\\x00y" for i in range(15, 25)]


def test_a_task_that_reports_nothing_writes_nothing() -> None:
    task = run_task(Task.objects.enqueue(waiting.nothing))
    assert (task.progress, task.log) == (None, [])


def test_an_async_handler_reports_its_progress() -> None:
    task = Task.objects.enqueue(waiting.async_reports)
    drain(pool="async")
    task.refresh_from_db()
    assert (task.status, task.progress["done"], task.progress["message"]) == (
        Status.SUCCESSFUL, 2, "all")
    assert [e["message"] for e in task.log] == ["async record"]


def test_the_progress_of_a_running_task_is_written_while_it_runs(monkeypatch) -> None:
    taken: list[float] = []  # when each write was decided, on the worker's clock
    take = run_report.RunReport.take

    def timed(report: run_report.RunReport) -> tuple[str | None, str]:
        taken.append(time.monotonic())
        return take(report)

    monkeypatch.setattr(run_report.RunReport, "take", timed)
    task = Task.objects.enqueue(waiting.reports_until_cancelled)
    worker = Worker(concurrency=1, poll_interval=60)
    runner = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    runner.start()
    try:
        wait_until(lambda: Task.objects.filter(pk=task.pk, status=Status.RUNNING,
                                               progress__message="still going").exists(),
                   what="a progress written while the task runs")
        first = Task.objects.get(pk=task.pk).progress
        # Written again later, not at every one of its calls (every 20 ms): the worker decides
        # on its own clock, a write WRITE_INTERVAL after the last one. (The statements' times
        # on the database clock are as far apart give or take how late each started: on a
        # loaded machine, more than the interval's half.)
        wait_until(lambda: Task.objects.get(pk=task.pk).progress["done"] > first["done"])
        assert len(taken) >= 2
        assert min(b - a for a, b in itertools.pairwise(taken)) >= run_report.WRITE_INTERVAL
    finally:
        # The handler runs until cancelled: cancel it first, whatever happened above.
        Task.objects.filter(pk=task.pk).cancel()
        wait_until(lambda: Task.objects.filter(pk=task.pk, status=Status.CANCELLED).exists())
        worker.stop()
        runner.join(60)


# -- the admin ---------------------------------------------------------------------------------


def task_page(admin_client, task: Task) -> str:
    response = admin_client.get(reverse("admin:django_pgtasks_task_change", args=[task.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_admin_shows_the_progress_and_the_log_of_a_task(admin_client) -> None:
    task = Task.objects.enqueue(waiting.reports_progress, 4)
    drain()
    Task.objects.filter(pk=task.pk).update(log=[*Task.objects.get(pk=task.pk).log, {
        "at": "2026-11-27T03:00:00+00:00", "level": "ERROR", "logger": "x",
        "message": "<script>alert(1)</script>"}])
    page = task_page(admin_client, task)
    assert '<progress class="pgtasks-progress" value="4" max="4"></progress> 4 / 4 (100%)' in page
    assert "item 4" in page
    assert "starting 4 items" in page
    assert "a record of the project&#x27;s own logger" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page
    # Finished: the page does not read itself again.
    assert 'data-pgtasks-live="running"' not in page
    assert "live_task.js" in page


def test_the_admin_shows_what_a_task_waits_for_and_refreshes_a_running_one(
        admin_client) -> None:
    waiter = Task.objects.enqueue(waiting.waits_for_event, "admin-key")
    drain()
    page = task_page(admin_client, waiter)
    assert "Waits for the event <code>admin-key</code>" in page
    # A sleep's kept entry is listed with the steps, without a "retry from here".
    sleeper = Task.objects.enqueue(waiting.sleeps_between_steps, 3600)
    drain()
    page = task_page(admin_client, sleeper)
    assert "<td>@sleep 1</td>" in page
    assert page.count("retry from here") == 1  # step "a" only
    Task.objects.enqueue(waiting.nothing)
    [running] = Task.objects.claim("w1")
    page = task_page(admin_client, running)
    assert 'data-pgtasks-live="running" data-refresh="2"' in page
    assert "No progress reported." in page


def test_events_older_than_their_retention_are_deleted(settings) -> None:
    Task.objects.send_event("old", 1)
    Task.objects.send_event("new", 2)
    Event.objects.filter(key="old").update(sent_at=Now() - timedelta(days=31))
    assert retention.expire_events("default") == 1
    assert list(Event.objects.values_list("key", flat=True)) == ["new"]
    settings.PGTASKS = {**settings.PGTASKS, "EVENT_RETENTION": None}
    Event.objects.filter(key="new").update(sent_at=Now() - timedelta(days=3650))
    assert retention.expire_events("default") == 0


@pytest.mark.slow
def test_a_send_finds_its_waiting_tasks_by_index_among_many_rows() -> None:
    """20,000 finished tasks and 2,000 waiting for other events: the send reads only the
    rows of its own key (the partial index on awaited_event)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata, run_after, finished_at, awaited_event) "
            "SELECT 'x', 'default', '[]', '{}', 100, "
            "CASE WHEN i <= 2000 THEN 'READY' ELSE 'SUCCESSFUL' END, 0, 3, '', '{}', "
            "now() + interval '1 day', CASE WHEN i > 2000 THEN now() END, "
            "'event-' || (i % 2000) FROM generate_series(1, 22000) AS i")
        cursor.execute("ANALYZE pgtasks_task")
        with transaction.atomic():
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {events.SEND_SQL}",
                           {"key": "event-7", "payload": "1"})
            plan = "\n".join(row[0] for row in cursor.fetchall())
            transaction.set_rollback(True)
    print(plan)
    assert "awaited_event_idx" in plan, plan
    assert "Seq Scan on pgtasks_task" not in plan, plan
    assert "Rows Removed by Filter" not in plan, plan


@pytest.mark.parametrize("handler", ["sleeps_in_an_atomic_handler", "waits_in_a_transaction"])
def test_a_sleep_or_wait_inside_a_transaction_fails_the_task_at_once(handler: str) -> None:
    """The run would end inside the transaction, whose rollback would take what the sleep
    or wait kept: refused, rather than a task that sleeps or waits again on every run."""
    task = run_task(Task.objects.enqueue(getattr(waiting, handler)))
    assert task.status == Status.FAILED
    assert "cannot run inside a transaction" in task.error_text
    assert (task.steps, task.awaited_event) == ([], None)


def test_sleeps_count_among_the_entries_a_task_keeps() -> None:
    """A handler that sleeps in a loop cannot grow its row without bound."""
    task = Task.objects.enqueue(waiting.sleeps_once, 60)
    Task.objects.filter(pk=task.pk).update(
        steps=[{"name": f"s{i}", "result": None} for i in range(1000)])
    task = run_task(task)
    assert task.status == Status.FAILED
    assert "A task keeps at most 1000 steps, sleeps and waits; '@sleep 1'" in task.error_text
    assert len(task.steps) == 1000


# -- children --------------------------------------------------------------------------------


def test_a_task_runs_children_and_waits_for_them_holding_no_thread() -> None:
    parent = Task.objects.enqueue(waiting.fans_out, 50, fail_after=True)
    drain(concurrency=2)
    parent.refresh_from_db()
    # Children, then the callback, ran; the callback's event woke the parent, whose retry
    # (it failed on purpose after the wait) enqueued nothing more.
    assert (parent.status, parent.attempt) == (Status.SUCCESSFUL, 2)
    assert parent.result == {"SUCCESSFUL": 42, "FAILED": 8}
    children = Task.objects.filter(name=waiting.child.name)
    assert children.count() == 50
    assert effects(parent) == {"before": 1}
    kept = {s["name"]: s["result"] for s in parent.steps}
    assert sorted(kept["children"]) == sorted(children.values_list("pk", flat=True))
    callback = Task.objects.get(name="django_pgtasks.definition.builtin_tasks.children_ended")
    assert (callback.status, callback.result) == (Status.SUCCESSFUL, parent.result)


def test_a_parent_waiting_for_its_children_is_suspended_until_the_last_one_ends() -> None:
    parent = Task.objects.enqueue(waiting.fans_out, 3)
    run_task(parent)
    parent.refresh_from_db()
    assert (parent.status, parent.awaited_event) == (Status.READY, waiting_key(parent))
    children = list(Task.objects.filter(name=waiting.child.name).order_by("pk"))
    for child in children[:2]:
        run_task(child)
    assert not due(parent)
    run_task(children[2])
    release_all()  # the callback, released by the last child's end
    run_task(Task.objects.get(name__endswith="children_ended"))
    assert due(parent)
    assert run_task(parent).result == {"SUCCESSFUL": 2, "FAILED": 1}


def waiting_key(task: Task) -> str:
    from django_pgtasks.definition import events as rules

    return rules.children(task.pk, "children")


def release_all() -> None:
    from django_pgtasks.lifecycle import release

    release.release_all("default")


def test_the_admin_lists_the_events_and_the_tasks_waiting_for_them(admin_client) -> None:
    Task.objects.send_event("shown", {"amount": 12})
    Task.objects.enqueue(waiting.waits_for_event, "not-yet")
    drain()
    Event.objects.create(key="not-yet", payload=None)  # as if sent without waking anyone
    page = admin_client.get(reverse("admin:django_pgtasks_event_changelist")).content.decode()
    assert "shown" in page
    assert "{&quot;amount&quot;: 12}" in page
    assert '<td class="field-waiting">1</td>' in page  # the task that waits for "not-yet"
    detail = admin_client.get(reverse("admin:django_pgtasks_event_change", args=["shown"]))
    assert detail.status_code == 200
    assert admin_client.get(reverse("admin:django_pgtasks_event_add")).status_code == 403


def test_a_last_report_that_cannot_be_written_leaves_the_outcome_alone(caplog) -> None:
    """The run's last write of its progress fails (its session was terminated): logged,
    and the outcome is still recorded; the task does not stay RUNNING."""
    task = Task.objects.enqueue(waiting.loses_its_connection_before_its_last_report)
    with caplog.at_level("WARNING", logger="django_pgtasks"):
        drain()
    task.refresh_from_db()
    assert (task.status, task.result, task.progress) == (Status.SUCCESSFUL, "done", None)
    assert any("its last progress and log records could not be written" in r.getMessage()
               for r in caplog.records)
