"""Rate limits per queue and per concurrency key: at most N starts in any span of the period.

The concurrent tests check the guarantee on the start times the database recorded
(``started_at``, the claim's ``now()``), never on a clock of the test: sorted, any N + 1
consecutive starts must span at least the period. The same check finds violations in the
same workload run without the limit, which shows it can fail.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_pgtasks.exceptions import InvalidTaskError, UnknownQueueError
from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.models import KeyRateLimit, QueueControl, Task
from django_pgtasks.patterns import controls
from django_pgtasks.worker.loop import Worker
from tests.helpers import all_finished, run_workers, stop_processes, wait_until
from tests.testapp import limited, tasks

pytestmark = pytest.mark.django_db



def violations(starts: list[datetime], limit: int, period: timedelta) -> list[datetime]:
    """Start times that begin a span shorter than ``period`` holding ``limit + 1`` starts."""
    starts = sorted(starts)
    return [starts[i] for i in range(len(starts) - limit)
            if starts[i + limit] - starts[i] < period]


def age_the_window(table: str = "pgtasks_queue", by: str = "1 hour") -> None:
    """Move the recorded starts into the past *on the database clock*."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET rate_starts = "
                       f"ARRAY(SELECT s - interval '{by}' FROM unnest(rate_starts) AS s)")


# -- claims -----------------------------------------------------------------------------------


def test_a_queue_rate_limit_caps_the_starts_in_a_window() -> None:
    Task.objects.enqueue_many(tasks.noop.build(queue="emails") for _ in range(5))
    Task.objects.enqueue_many(tasks.noop.build(queue="default") for _ in range(2))
    controls.set_rate_limit(3, timedelta(hours=1), queue="emails")
    got = Task.objects.claim("w", queues=["default", "emails"], limit=10)
    assert sorted(t.queue for t in got) == ["default", "default", "emails", "emails", "emails"]
    held_back = Task.objects.claim("w", queues=["emails"], limit=10)
    assert list(held_back) == []
    # The worker is told when a start frees up: when the oldest start leaves the window.
    assert 3500 < held_back.retry_in <= 3600
    age_the_window()
    assert len(Task.objects.claim("w", queues=["emails"], limit=10)) == 2


def test_a_key_rate_limit_caps_the_starts_of_that_key_in_every_queue() -> None:
    for queue in ("default", "emails"):
        Task.objects.enqueue_many(tasks.noop.build(queue=queue, concurrency_key="api",
                                                   concurrency_limit=100) for _ in range(3))
    other = Task.objects.enqueue(tasks.noop, concurrency_key="other")
    controls.set_rate_limit(4, 3600, key="api")
    got = Task.objects.claim("w", queues=["default", "emails"], limit=10)
    assert sum(1 for t in got if t.concurrency_key == "api") == 4
    assert other.pk in {t.pk for t in got}
    assert Task.objects.claim("w", queues=["default", "emails"], limit=10) == []
    age_the_window("pgtasks_key_rate")
    assert len(Task.objects.claim("w", queues=["default", "emails"], limit=10)) == 2


def test_the_window_slides_and_a_lower_limit_applies_at_once() -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(10))
    controls.set_rate_limit(4, 3600, queue="default")
    assert len(Task.objects.claim("w", queues=["default"], limit=2)) == 2
    controls.set_rate_limit(3, 3600, queue="default")  # keeps the record of starts
    assert len(Task.objects.claim("w", queues=["default"], limit=10)) == 1
    assert Task.objects.claim("w", queues=["default"], limit=10) == []
    # Half an hour later (database clock) the three starts are still in the window...
    age_the_window(by="30 minutes")
    assert Task.objects.claim("w", queues=["default"], limit=10) == []
    # ...and an hour later they have left it.
    age_the_window(by="31 minutes")
    assert len(Task.objects.claim("w", queues=["default"], limit=10)) == 3


def test_the_plain_claim_leaves_a_rate_limited_queue_alone(kept_claim_mode: None) -> None:
    """Even when the process still believes no limits are in use."""
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(3))
    claiming._remember("default", ("default",), controlled=False)
    controls.set_rate_limit(1, 3600, queue="default")
    assert Task.objects.claim("w", queues=["default"], limit=10) == []
    claiming.forget_modes()
    assert len(Task.objects.claim("w", queues=["default"], limit=10)) == 1


def test_queue_rate_and_key_concurrency_combine() -> None:
    Task.objects.enqueue_many(tasks.noop.build(concurrency_key="k", concurrency_limit=2)
                              for _ in range(4))
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(4))
    controls.set_rate_limit(3, 3600, queue="default")
    got = Task.objects.claim("w", queues=["default"], limit=10)
    assert len(got) == 3
    assert sum(1 for t in got if t.concurrency_key == "k") <= 2


def test_clearing_a_limit_lets_the_queue_run_again() -> None:
    Task.objects.enqueue_many(tasks.noop.build() for _ in range(3))
    controls.set_rate_limit(1, 3600, queue="default")
    assert len(Task.objects.claim("w", queues=["default"], limit=10)) == 1
    assert controls.clear_rate_limit(queue="default") is True
    assert controls.clear_rate_limit(queue="default") is False
    claiming.forget_modes()
    assert len(Task.objects.claim("w", queues=["default"], limit=10)) == 2
    controls.set_rate_limit(1, 60, key="k")
    assert controls.clear_rate_limit(key="k") is True
    assert not KeyRateLimit.objects.exists()


@pytest.mark.parametrize(("args", "kwargs", "error"), [
    ((0, 60), {"queue": "default"}, InvalidTaskError),
    ((10_001, 60), {"queue": "default"}, InvalidTaskError),
    ((5, 0), {"queue": "default"}, InvalidTaskError),
    ((5, -1), {"key": "k"}, InvalidTaskError),
    ((5, 60), {}, ValueError),
    ((5, 60), {"queue": "default", "key": "k"}, ValueError),
    ((5, 60), {"queue": "nope"}, UnknownQueueError),
    ((5, 60), {"key": ""}, InvalidTaskError),
])
def test_invalid_rate_limits_are_refused(args, kwargs, error) -> None:
    with pytest.raises(error):
        controls.set_rate_limit(*args, **kwargs)
    assert not QueueControl.objects.exclude(rate_limit=None).exists()


def test_the_command_sets_shows_and_clears_rate_limits() -> None:
    def run(*args: str) -> str:
        out = StringIO()
        call_command("pgtasks_queue", *args, stdout=out)
        return out.getvalue()

    assert "Rate limit of queue emails: 5 per 2s." in run("rate-limit", "--queue", "emails",
                                                           "5", "2")
    assert "Rate limit of key api: 10 per 60s." in run("rate-limit", "--key", "api", "10",
                                                        "60")
    table = run("status", "emails")
    assert "5 per 2s" in table
    assert "api: 10 per 60s" in table
    assert "removed" in run("clear-rate-limit", "--queue", "emails")
    assert "had no rate limit" in run("clear-rate-limit", "--queue", "emails")


# -- many workers ------------------------------------------------------------------------------

RATE, PERIOD, N_TASKS = 4, timedelta(seconds=1), 14


def run_worker_threads(n: int, concurrency: int) -> None:
    run_workers([Worker(worker_id=f"t{i}", concurrency=concurrency) for i in range(n)],
                until=all_finished, timeout=120)

def start_times() -> list[datetime]:
    return list(Task.objects.succeeded().values_list("started_at", flat=True))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_threads_start_at_most_n_tasks_in_any_window() -> None:
    controls.set_rate_limit(RATE, PERIOD, queue="emails")
    Task.objects.enqueue_many(limited.record_start.build(queue="emails")
                              for _ in range(N_TASKS))
    run_worker_threads(4, concurrency=2)
    starts = start_times()
    assert len(starts) == N_TASKS
    assert violations(starts, RATE, PERIOD) == []
    # The limit was used, not just respected: some window held RATE starts.
    assert violations(starts, RATE - 1, PERIOD)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_the_limit_the_same_check_finds_violations() -> None:
    Task.objects.enqueue_many(limited.record_start.build(queue="emails")
                              for _ in range(N_TASKS))
    run_worker_threads(4, concurrency=2)
    assert violations(start_times(), RATE, PERIOD)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_processes_respect_a_key_rate_limit(start_command) -> None:
    controls.set_rate_limit(RATE, PERIOD, key="api")
    Task.objects.enqueue_many(
        limited.record_start.build(queue=queue, concurrency_key="api", concurrency_limit=50)
        for queue in ("default", "emails") for _ in range(N_TASKS // 2)
    )
    Task.objects.enqueue_many(limited.record_start.build() for _ in range(10))  # unlimited
    processes = [
        start_command("run_pgtasks", "--concurrency", "2", "--worker-id", f"proc-{i}",
                      "--log-level", "WARNING")
        for i in range(4)
    ]
    try:
        wait_until(all_finished)
    finally:
        outputs = stop_processes(processes)
    assert [p.returncode for p in processes] == [0, 0, 0, 0], outputs
    keyed = list(Task.objects.filter(concurrency_key="api").values_list("started_at",
                                                                         flat=True))
    assert len(keyed) == N_TASKS
    assert violations(keyed, RATE, PERIOD) == []
    assert Task.objects.succeeded().count() == N_TASKS + 10


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_waits_for_the_rate_limit_instead_of_exiting() -> None:
    """The claim tells the worker when the window allows the next start; a burst worker
    sleeps until then rather than taking the held-back tasks for an empty queue."""
    controls.set_rate_limit(2, timedelta(seconds=1), queue="emails")
    Task.objects.enqueue_many(limited.record_start.build(queue="emails") for _ in range(5))
    Worker(queues=["emails"], concurrency=2, burst=True).run(install_signals=False)
    starts = start_times()
    assert len(starts) == 5
    assert violations(starts, 2, timedelta(seconds=1)) == []


@pytest.mark.django_db(transaction=True)
def test_the_admin_sets_checks_and_clears_rate_limits(admin_client) -> None:
    from django.contrib import admin

    if QueueControl not in admin.site._registry:
        pytest.skip("admin.py does not register the queue controls yet")
    controls.ensure_queue_rows()
    url = "/admin/django_pgtasks/queuecontrol/emails/change/"
    # Rejected with a form error, not saved.
    response = admin_client.post(url, {"rate_limit": "0", "rate_period": "00:00:01"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors
    assert QueueControl.objects.get(queue="emails").rate_limit is None
    # Saved through set_rate_limit(), which leaves the record of starts alone.
    QueueControl.objects.filter(queue="emails").update(rate_starts=[timezone.now()])
    response = admin_client.post(url, {"rate_limit": "5", "rate_period": "00:00:02"})
    assert response.status_code == 302
    row = QueueControl.objects.get(queue="emails")
    assert (row.rate_limit, row.rate_period, len(row.rate_starts)) == (
        5, timedelta(seconds=2), 1)
    admin_client.post(url, {"rate_limit": "", "rate_period": ""})
    assert QueueControl.objects.get(queue="emails").rate_limit is None
    # Key rate limits: add one.
    response = admin_client.post("/admin/django_pgtasks/keyratelimit/add/",
                                 {"key": "api", "rate_limit": "3", "rate_period": "00:01:00"})
    assert response.status_code == 302
    assert controls.key_rate_limits() == {"api": (3, timedelta(minutes=1))}
