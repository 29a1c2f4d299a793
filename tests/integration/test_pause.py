"""Pausing and resuming queues: from the API, the management command and the admin."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest
from django.contrib.admin.sites import AdminSite
from django.contrib.auth.models import User
from django.contrib.messages.storage.fallback import FallbackStorage
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.db.models import Count
from django.test import RequestFactory

from django_pgtasks.admin.controls import QueueControlAdmin
from django_pgtasks.exceptions import UnknownQueueError
from django_pgtasks.lifecycle import claim as claiming
from django_pgtasks.models import PENDING, QueueControl, Status, Task
from django_pgtasks.patterns import controls
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db



def claimed_queues(**kwargs) -> list[str]:
    return sorted(t.queue for t in Task.objects.claim("w", limit=50, **kwargs))


def test_a_paused_queue_starts_nothing_and_the_others_keep_running() -> None:
    for queue in ("default", "emails"):
        Task.objects.enqueue_many(tasks.noop.build(queue=queue) for _ in range(2))
    assert controls.pause("emails") == 1
    assert controls.is_paused("emails")
    assert not controls.is_paused("default")
    assert claimed_queues(queues=["default", "emails"]) == ["default", "default"]
    assert claimed_queues(queues=["emails"]) == []
    assert Task.objects.filter(queue="emails", status=Status.READY, attempt=0).count() == 2
    assert controls.resume("emails") == 1
    assert claimed_queues(queues=["default", "emails"]) == ["emails", "emails"]


def test_pause_applies_to_the_controlled_claim_as_well() -> None:
    """With keyed tasks in play the claim is the PL/pgSQL function; it honours pauses too."""
    Task.objects.enqueue(tasks.noop, queue="emails", concurrency_key="k")
    Task.objects.enqueue(tasks.noop, queue="emails")
    keyed_default = Task.objects.enqueue(tasks.noop, queue="default", concurrency_key="j")
    controls.pause("emails")
    claiming._remember("default", ("default", "emails"), controlled=True)
    got = Task.objects.claim("w", queues=["default", "emails"], limit=10)
    assert [t.pk for t in got] == [keyed_default.pk]
    controls.resume("emails")
    assert claimed_queues(queues=["default", "emails"]) == ["emails", "emails"]


def test_a_pause_is_seen_at_once_even_by_a_process_that_kept_its_claim_decision(
    kept_claim_mode: None,
) -> None:
    """The pause is read by the claim statement itself, not from a cached decision."""
    Task.objects.enqueue(tasks.noop, queue="emails")
    claiming._remember("default", ("emails",), controlled=False)
    controls.pause("emails")
    assert Task.objects.claim("w", queues=["emails"]) == []


def test_running_tasks_finish_normally_in_a_paused_queue() -> None:
    Task.objects.enqueue(tasks.noop, queue="emails")
    [task] = Task.objects.claim("w", queues=["emails"])
    controls.pause("emails")
    assert Task.objects.mark_succeeded(task)


def test_pause_and_resume_are_idempotent_and_check_queue_names() -> None:
    assert controls.pause("emails", "urgent") == 2
    assert controls.pause("emails") == 0
    assert controls.resume("default") == 0
    assert controls.resume("emails", "urgent") == 2
    with pytest.raises(UnknownQueueError):
        controls.pause("nope")
    with pytest.raises(ValueError, match="at least one queue"):
        controls.pause()


def test_status_reports_pauses_limits_and_counts() -> None:
    Task.objects.enqueue_many(tasks.noop.build(queue="emails") for _ in range(3))
    Task.objects.claim("w", queues=["emails"])
    controls.pause("emails")
    controls.set_rate_limit(10, 60, queue="urgent")
    by_queue = {s.queue: s for s in controls.status()}
    assert list(by_queue) == ["default", "emails", "urgent"]
    emails, urgent = by_queue["emails"], by_queue["urgent"]
    assert (emails.paused, emails.waiting, emails.running) == (True, 2, 1)
    assert emails.paused_at is not None
    assert emails.rate_limit is None
    assert (urgent.paused, urgent.rate_limit, urgent.rate_period.total_seconds(),
            urgent.rate_available) == (False, 10, 60.0, 10)


@pytest.mark.django_db(transaction=True)
def test_resume_wakes_listening_workers_at_once() -> None:
    s = connection.settings_dict
    with psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                         host=s["HOST"] or None, port=s["PORT"] or None,
                         autocommit=True) as listener:
        listener.execute("LISTEN pgtasks")
        controls.pause("emails")
        controls.resume("emails")
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert payloads == ["emails"]


# -- with running workers ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workers_honour_pause_and_resume_while_they_run() -> None:
    workers = [Worker(worker_id=f"t{i}", queues=["default", "emails"], concurrency=2)
               for i in range(3)]
    threads = [threading.Thread(target=w.run, kwargs={"install_signals": False})
               for w in workers]
    for t in threads:
        t.start()
    try:
        controls.pause("emails")
        paused_ids = [t.pk for t in Task.objects.enqueue_many(
            tasks.noop.build(queue="emails") for _ in range(20))]
        Task.objects.enqueue_many(tasks.noop.build(queue="default") for _ in range(40))
        # The other queue keeps running: all of it is done...
        wait_until(lambda: Task.objects.filter(queue="default", status=Status.SUCCESSFUL)
                   .count() == 40)
        # ...while the paused one started nothing (the workers saw its tasks all along).
        assert Task.objects.filter(pk__in=paused_ids, status=Status.READY,
                                   attempt=0).count() == 20
        controls.resume("emails")
        wait_until(lambda: Task.objects.filter(pk__in=paused_ids,
                                               status=Status.SUCCESSFUL).count() == 20)
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(60)
        connections.close_all()
    assert not Task.objects.filter(status__in=[*PENDING, Status.RUNNING]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_leaves_a_paused_queue_alone_and_drains_it_after_resume() -> None:
    Task.objects.enqueue_many(tasks.noop.build(queue="emails") for _ in range(5))
    Task.objects.enqueue_many(tasks.noop.build(queue="default") for _ in range(5))
    controls.pause("emails")
    Worker(queues=["default", "emails"], burst=True).run(install_signals=False)
    done = Task.objects.succeeded().values_list("queue").annotate(n=Count("id"))
    assert dict(done) == {"default": 5}
    controls.resume("emails")
    Worker(queues=["default", "emails"], burst=True).run(install_signals=False)
    assert Task.objects.succeeded().count() == 10


# -- the management command -------------------------------------------------------------------


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("pgtasks_queue", *args, stdout=out)
    return out.getvalue()


def test_the_command_pauses_resumes_and_shows_the_state() -> None:
    assert "Paused emails (1 were running)." in run("pause", "emails")
    assert controls.is_paused("emails")
    table = run("status")
    lines = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line}
    assert lines["emails"][1] == "paused"
    assert lines["default"][1] == "running"
    data = json.loads(run("status", "emails", "--json"))
    assert data[0]["queue"] == "emails"
    assert data[0]["paused"] is True
    assert "Resumed emails (1 were paused)." in run("resume", "emails")
    assert not controls.is_paused("emails")


def test_the_command_refuses_unknown_queues() -> None:
    with pytest.raises(CommandError, match="not configured"):
        run("pause", "nope")


# -- the admin --------------------------------------------------------------------------------


def admin_request(path: str = "/") -> object:
    request = RequestFactory().post(path)
    request.user = User(is_superuser=True, is_staff=True)
    request.session = {}
    request._messages = FallbackStorage(request)
    return request


def test_admin_actions_pause_and_resume_the_selected_queues() -> None:
    model_admin = QueueControlAdmin(QueueControl, AdminSite())
    controls.ensure_queue_rows()
    selected = QueueControl.objects.filter(queue__in=["emails", "urgent"])
    model_admin.pause_queues(admin_request(), selected)
    assert [s.queue for s in controls.status() if s.paused] == ["emails", "urgent"]
    model_admin.resume_queues(admin_request(), selected)
    assert not any(s.paused for s in controls.status())


@pytest.mark.django_db(transaction=True)
def test_admin_list_shows_every_configured_queue_with_its_state(admin_client) -> None:
    from django.contrib import admin

    if QueueControl not in admin.site._registry:
        pytest.skip("admin.py does not register the queue controls yet")
    controls.pause("emails")
    Task.objects.enqueue(tasks.noop, queue="emails")
    response = admin_client.get("/admin/django_pgtasks/queuecontrol/")
    assert response.status_code == 200
    rows = response.context["cl"].result_list
    assert [(r.queue, r.paused, r.waiting_count) for r in rows] == [
        ("default", False, 0), ("emails", True, 1), ("urgent", False, 0)]
