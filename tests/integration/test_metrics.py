"""The Prometheus metrics view and the signal-fed counters, on real PostgreSQL and a real
worker (the signals ``task_enqueued``, ``task_started`` and ``task_finished`` included)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.urls import path

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="the prometheus extra is not installed"
)
from prometheus_client import REGISTRY  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from django_pgtasks.models import Status, Task, WorkerProcess  # noqa: E402
from django_pgtasks.monitoring import metrics  # noqa: E402
from django_pgtasks.signals import task_enqueued, task_finished, task_started  # noqa: E402
from django_pgtasks.worker.loop import Worker  # noqa: E402
from tests.testapp import tasks  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

# Mounted the way the documentation says, in a URLconf of its own.
urlpatterns = [path("metrics/pgtasks", metrics.metrics_view)]
METRICS_URL = "/metrics/pgtasks"


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with override_settings(ROOT_URLCONF=__name__):
        response = client.get(METRICS_URL)
    assert response.status_code == 200
    assert response["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def insert(count: int, status: str, *, queue: str = "default", extra: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      locked_at, locked_by, started_at, finished_at)
            SELECT 'm', %s, '[]', '{{}}', 100, %s, 1, 3, '', '{{}}',
                   now() - interval '5 minutes',
                   CASE WHEN %s = 'RUNNING' THEN now() - interval '2 hours' END,
                   CASE WHEN %s = 'RUNNING' THEN 'gone' END,
                   now() - interval '1 minute', {extra or "now()"}
            FROM generate_series(1, %s)
            """,
            [queue, status, status, status, count],
        )


def test_queue_gauges_per_database_and_queue(client: Client) -> None:
    insert(4, Status.READY)
    insert(2, Status.RUNNING)
    insert(3, Status.SUCCESSFUL)
    insert(1, Status.FAILED)
    insert(5, Status.SUCCESSFUL, extra="now() - interval '3 hours'")  # not in the last hour
    insert(1, Status.READY, queue="emails")
    insert(3, Status.WAITING, queue="emails")
    WorkerProcess.objects.create(name="alive", hostname="h", pid=1, concurrency=1)

    samples = scrape(client)

    default = {"database": "default", "queue": "default"}
    assert value(samples, "pgtasks_tasks_waiting", **default) == 4
    assert value(samples, "pgtasks_tasks_running", **default) == 2
    assert value(samples, "pgtasks_tasks_scheduled", **default) == 0
    assert value(samples, "pgtasks_oldest_waiting_seconds", **default) == pytest.approx(
        300, abs=10)
    assert value(samples, "pgtasks_longest_running_seconds", **default) == pytest.approx(
        7200, abs=10)
    assert value(samples, "pgtasks_tasks_finished_last_hour", status="SUCCESSFUL",
                 **default) == 3
    assert value(samples, "pgtasks_tasks_finished_last_hour", status="FAILED", **default) == 1
    assert value(samples, "pgtasks_tasks_waiting", database="default", queue="emails") == 1
    assert value(samples, "pgtasks_tasks_waiting_for_parents", database="default",
                 queue="emails") == 3
    assert value(samples, "pgtasks_tasks_waiting_for_parents", **default) == 0
    assert value(samples, "pgtasks_tasks_waiting", database="default", queue="urgent") == 0
    # The running tasks belong to no registered worker and their lease is two hours old.
    assert value(samples, "pgtasks_tasks_stuck", database="default") == 2
    assert value(samples, "pgtasks_workers", database="default", state="alive") == 1
    assert value(samples, "pgtasks_workers", database="default", state="lost") == 0


def test_only_get_is_served(client: Client) -> None:
    with override_settings(ROOT_URLCONF=__name__):
        response = client.post(METRICS_URL)
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def before_and_after(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_signals_fire_and_feed_the_counters(client: Client) -> None:
    """A real worker runs a success and a failure; every signal fires once per task and the
    counters (and the view, in a single process) show them."""
    metrics.track_tasks()
    metrics.track_tasks()  # a second call connects nothing twice
    seen: list[tuple[str, Any]] = []

    def record(signal_name: str):
        def receiver(sender: Any, task: Task, **kwargs: Any) -> None:
            seen.append((signal_name, task.pk, kwargs.get("status")))
        return receiver

    receivers = {task_enqueued: record("enqueued"), task_started: record("started"),
                 task_finished: record("finished")}
    for signal, receiver in receivers.items():
        signal.connect(receiver, sender=Task)
    name_ok, name_bad = tasks.noop.name, tasks.always_fails.name
    ok_before = before_and_after("pgtasks_tasks_finished_total", task=name_ok,
                                 queue="default", status="SUCCESSFUL")
    bad_before = before_and_after("pgtasks_tasks_finished_total", task=name_bad,
                                  queue="default", status="FAILED")
    enqueued_before = before_and_after("pgtasks_tasks_enqueued_total", task=name_ok,
                                       queue="default")
    durations_before = before_and_after("pgtasks_task_duration_seconds_count", task=name_ok,
                                        queue="default")
    try:
        ok = Task.objects.enqueue(tasks.noop)
        bad = Task.objects.enqueue(tasks.always_fails, max_attempts=1)
        assert Worker(burst=True, concurrency=1).run(install_signals=False) == 0
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver, sender=Task)

    assert sorted(seen, key=str) == sorted([
        ("enqueued", ok.pk, None), ("enqueued", bad.pk, None),
        ("started", ok.pk, None), ("started", bad.pk, None),
        ("finished", ok.pk, Status.SUCCESSFUL), ("finished", bad.pk, Status.FAILED),
    ], key=str)
    assert before_and_after("pgtasks_tasks_finished_total", task=name_ok, queue="default",
                            status="SUCCESSFUL") == ok_before + 1
    assert before_and_after("pgtasks_tasks_finished_total", task=name_bad, queue="default",
                            status="FAILED") == bad_before + 1
    assert before_and_after("pgtasks_tasks_enqueued_total", task=name_ok,
                            queue="default") == enqueued_before + 1
    assert before_and_after("pgtasks_task_duration_seconds_count", task=name_ok,
                            queue="default") == durations_before + 1

    samples = scrape(client)
    assert value(samples, "pgtasks_tasks_finished_total", task=name_ok, queue="default",
                 status="SUCCESSFUL") == ok_before + 1


# -- protecting the view ----------------------------------------------------------------------


def get(client: Client, method: str = "get", **headers: str):
    with override_settings(ROOT_URLCONF=__name__):
        return getattr(client, method)(METRICS_URL, headers=headers)


def protect(settings, **options: object) -> None:
    settings.PGTASKS = {**settings.PGTASKS, **options}


TOKEN = "s3cr3t-Token_for.metrics~"


def test_with_a_token_only_its_bearer_may_scrape(client: Client, settings) -> None:
    protect(settings, METRICS_TOKEN=TOKEN)

    missing = get(client)
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="django-pgtasks metrics"'
    assert b"pgtasks_" not in missing.content
    wrong = get(client, authorization=f"Bearer {TOKEN}x")
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"] == (
        'Bearer realm="django-pgtasks metrics", error="invalid_token"')
    assert get(client, authorization=f"Basic {TOKEN}").status_code == 401
    assert get(client, authorization=TOKEN).status_code == 401
    assert get(client, authorization="Bearer ").status_code == 401

    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"Bearer  {TOKEN} "):
        response = get(client, authorization=header)
        assert response.status_code == 200, header
        assert b"pgtasks_tasks_waiting" in response.content
    assert get(client, "head", authorization=f"Bearer {TOKEN}").status_code == 200
    # Refused before anything else is said; with the token, the method is checked as before.
    assert get(client, "post").status_code == 401
    assert get(client, "post", authorization=f"Bearer {TOKEN}").status_code == 405


def test_tokens_can_be_rotated_with_a_list(client: Client, settings) -> None:
    protect(settings, METRICS_TOKEN=["old-token", "new-token"])
    assert get(client, authorization="Bearer old-token").status_code == 200
    assert get(client, authorization="Bearer new-token").status_code == 200
    assert get(client, authorization="Bearer other-token").status_code == 401


def test_with_a_permission_only_users_who_have_it_may_scrape(
        viewer_client: Client, settings) -> None:
    from django.contrib.auth.models import User

    protect(settings, METRICS_PERMISSION="django_pgtasks.view_task")
    client = Client()  # anonymous (viewer_client is the logged-in one)
    assert get(client).status_code == 403  # anonymous: no scheme to offer, so 403
    assert get(client, authorization="Bearer anything").status_code == 403
    assert get(viewer_client).status_code == 200  # staff with django_pgtasks.view_task

    other = Client()
    other.force_login(User.objects.create_user("nobody", password="unused", is_staff=True))
    assert get(other).status_code == 403
    boss = Client()
    boss.force_login(User.objects.create_superuser("boss", password="unused"))
    assert get(boss).status_code == 200


def test_with_both_either_the_token_or_the_permission_will_do(
        viewer_client: Client, settings) -> None:
    from django.contrib.auth.models import User

    protect(settings, METRICS_TOKEN=TOKEN, METRICS_PERMISSION="django_pgtasks.view_task")
    client = Client()  # anonymous
    assert get(client, authorization=f"Bearer {TOKEN}").status_code == 200
    assert get(viewer_client).status_code == 200
    assert get(viewer_client, authorization="Bearer wrong").status_code == 200
    assert get(client).status_code == 401
    other = Client()
    other.force_login(User.objects.create_user("nobody", password="unused"))
    assert get(other).status_code == 403  # logged in, without the permission
    assert get(other, authorization="Bearer wrong").status_code == 401
    assert get(other, authorization=f"Bearer {TOKEN}").status_code == 200


def test_the_view_stays_open_without_either_setting(client: Client, settings) -> None:
    protect(settings, METRICS_TOKEN=None, METRICS_PERMISSION=None)
    assert get(client).status_code == 200


