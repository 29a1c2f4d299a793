"""The admin dashboard and the error-group requeue, on real PostgreSQL rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from django_pgtasks.admin import chart
from django_pgtasks.admin.dashboard import DashboardSection
from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.monitoring import dashboard
from tests.helpers import assert_reads_only_the_window
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:django_pgtasks_task_dashboard")
REQUEUE = reverse("admin:django_pgtasks_task_requeue_group")
CHANGELIST = reverse("admin:django_pgtasks_task_changelist")


def insert(count: int, *, name: str = "a", status: str = Status.SUCCESSFUL,
           queue: str = "default", created: str = "now()", ended: str | None = "now()",
           run_after: str = "now()", locked_at: str = "NULL", locked_by: str | None = None,
           error: str = "", attempt: int = 1) -> None:
    """``count`` rows; the SQL fragments may use ``i`` (1..count) and run on the database."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      locked_at, locked_by, started_at, finished_at,
                                      created_at, updated_at)
            SELECT %s, %s, '[]', '{{}}', 100, %s, %s, 3, %s || i, '{{}}', {run_after},
                   {locked_at}, %s, {ended or "NULL"}, {ended or "NULL"}, {created}, now()
            FROM generate_series(1, %s) AS i
            """,
            [name, queue, status, attempt, error, locked_by, count],
        )


def section(response: HttpResponse, database: str = "default") -> DashboardSection:
    [found] = [s for s in response.context["sections"] if s.database == database]
    return found


def message_texts(response: HttpResponse) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def listed(response: HttpResponse) -> set[int]:
    return {task.pk for task in response.context["cl"].result_list}



# -- what the dashboard shows --------------------------------------------------------------


def test_queues_show_waiting_running_oldest_age_and_last_hour(admin_client: Client) -> None:
    insert(3, status=Status.READY, ended=None, run_after="now() - interval '10 minutes'")
    insert(2, status=Status.READY, ended=None, run_after="now() + interval '1 hour'")
    insert(1, status=Status.RUNNING, ended=None, locked_at="now()", locked_by="w1")
    insert(4, ended="now() - interval '5 minutes'")
    insert(1, status=Status.FAILED, ended="now() - interval '5 minutes'", error="Boom ")
    insert(7, ended="now() - interval '2 hours'")  # not in the last hour
    insert(1, queue="emails", status=Status.READY, ended=None)

    response = admin_client.get(DASHBOARD)

    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_pgtasks/task/dashboard.html"
    queues = {q["row"].queue: q for q in section(response).queues}
    assert list(queues) == ["default", "emails", "urgent"]
    default = queues["default"]["row"]
    assert (default.waiting, default.scheduled, default.running) == (3, 2, 1)
    assert default.oldest_waiting == pytest.approx(600, abs=5)
    assert (default.succeeded_last_hour, default.failed_last_hour) == (4, 1)
    assert default.oldest_waiting_text.startswith("10m0")
    assert queues["emails"]["row"].waiting == 1
    content = response.content.decode()
    assert re.search(r'data-queue="default">.*?<td class="num waiting">3</td>', content, re.S)
    assert listed(admin_client.get(queues["emails"]["url"]))  # the link lists its tasks


def test_counts_per_name_and_status_now_and_in_the_window(admin_client: Client) -> None:
    insert(2, name="mail.send", status=Status.READY, ended=None)
    insert(1, name="mail.send", status=Status.RUNNING, ended=None, locked_by="w1",
           locked_at="now()")
    insert(3, name="mail.send", status=Status.WAITING, ended=None)
    insert(5, name="mail.send", ended="now() - interval '1 hour'")
    insert(9, name="mail.send", ended="now() - interval '3 days'")  # outside 24 h
    insert(1, name="report.build", status=Status.FAILED, error="Boom ",
           ended="now() - interval '2 hours'")

    response = admin_client.get(DASHBOARD)

    rows = {row["name"]: row for row in section(response).names}
    assert list(rows) == ["mail.send", "report.build"]
    counts = dict(zip(Status.values, (c["count"] for c in rows["mail.send"]["cells"]),
                      strict=True))
    assert counts == {"WAITING": 3, "READY": 2, "RUNNING": 1, "AWAITING_RETRY": 0,
                      "SUCCESSFUL": 5, "FAILED": 0, "CANCELLED": 0}
    assert rows["mail.send"]["total"] == 11
    # Each cell lists exactly the tasks it counted (the window is part of the link).
    cells = dict(zip(Status.values, rows["mail.send"]["cells"], strict=True))
    assert len(listed(admin_client.get(cells["SUCCESSFUL"]["url"]))) == 5
    assert len(listed(admin_client.get(cells["READY"]["url"]))) == 2
    assert len(listed(admin_client.get(cells["WAITING"]["url"]))) == 3

    # A wider window counts the older ones too.
    week = admin_client.get(DASHBOARD, {"hours": str(24 * 7)})
    [mail] = [r for r in section(week).names if r["name"] == "mail.send"]
    assert dict(zip(Status.values, (c["count"] for c in mail["cells"]), strict=True))[
        "SUCCESSFUL"] == 14


@pytest.mark.parametrize("hours", ["0", "-3", "abc", "100000"])
def test_a_bad_window_falls_back_to_24_hours(admin_client: Client, hours: str) -> None:
    response = admin_client.get(DASHBOARD, {"hours": hours})
    assert response.status_code == 200
    assert response.context["hours"] == 24


def test_failures_are_grouped_by_error_with_ids_blanked(admin_client: Client) -> None:
    failed = [Task.objects.enqueue(tasks.always_fails) for _ in range(5)]
    texts = ["LookupError: order 41 not found", "LookupError: order 977 not found",
             "LeaseLost: lease 3f2a9c1e-0b7d-4c1e-9a55-1d2e3f4a5b6c lost",
             "LeaseLost: lease 0c9d8e7f-1a2b-4c3d-8e9f-a0b1c2d3e4f5 lost",
             "ValueError: bad input"]
    for task, text in zip(failed, texts, strict=True):
        Task.objects.filter(pk=task.pk).update(
            status=Status.FAILED, finished_at=task.created_at,
            error_text=f"{text}\nTraceback (most recent call last):\n  line {task.pk}")
    # Same error, but still to be retried: not a failure yet.
    insert(1, status=Status.AWAITING_RETRY, error="LookupError: order 5 not found", ended=None)

    response = admin_client.get(DASHBOARD)

    groups = {g["group"].text: g for g in section(response).error_groups}
    assert {text: g["group"].count for text, g in groups.items()} == {
        "LookupError: order N not found": 2,
        "LeaseLost: lease N-N-N-N-N lost": 2,
        "ValueError: bad input": 1,
    }
    assert list(groups)[-1] == "ValueError: bad input"  # commonest first
    orders = groups["LookupError: order N not found"]
    content = response.content.decode()
    assert escape(orders["url"]) in content
    assert escape(orders["requeue_url"]) in content
    assert listed(admin_client.get(orders["url"])) == {failed[0].pk, failed[1].pk}


def test_stuck_tasks_are_running_tasks_of_lost_workers_or_expired_leases(
    admin_client: Client,
) -> None:
    WorkerProcess.objects.create(name="alive", hostname="h", pid=1, concurrency=2,
                                 queues=["default"])
    lost = WorkerProcess.objects.create(name="gone", hostname="h", pid=2, concurrency=2,
                                        queues=["default"])
    WorkerProcess.objects.filter(pk=lost.pk).update(
        last_seen_at=datetime.now(UTC) - timedelta(hours=1))
    insert(1, name="fine", status=Status.RUNNING, ended=None, locked_by="alive",
           locked_at="now() - interval '2 hours'")
    insert(1, name="orphan", status=Status.RUNNING, ended=None, locked_by="gone",
           locked_at="now() - interval '3 minutes'")
    insert(1, name="no-worker", status=Status.RUNNING, ended=None, locked_by="script",
           locked_at="now() - interval '2 hours'")

    response = admin_client.get(DASHBOARD)

    snap = section(response).snapshot
    assert sorted(t.name for t in snap.stuck) == ["no-worker", "orphan"]
    assert snap.stuck_count == 2
    orphan = next(s for s in section(response).stuck if s["task"].name == "orphan")
    assert orphan["task"].running_for == pytest.approx(180, abs=10)
    assert admin_client.get(orphan["url"]).status_code == 200
    workers = {w.name: w for w in snap.workers}
    assert (workers["alive"].lost, workers["gone"].lost) == (False, True)
    assert (workers["alive"].running, workers["gone"].running) == (1, 1)
    content = response.content.decode()
    assert "Stuck: 2 running tasks" in content
    assert ">lost<" in content


def test_the_chart_has_24_hours_of_flows_and_a_derived_backlog(admin_client: Client) -> None:
    # Older tasks first: ids grow with the time tasks were enqueued.
    insert(5, created="now() - interval '3 days'", ended="now() - interval '3 days'")
    # Two hours ago: 6 enqueued, 4 of them finished then (3 succeeded, 1 failed). Now: 2 still
    # waiting from then, and 1 enqueued this hour.
    insert(3, created="date_trunc('hour', now()) - interval '2 hours' + interval '1 minute'",
           ended="date_trunc('hour', now()) - interval '2 hours' + interval '5 minutes'")
    insert(1, status=Status.FAILED, error="Boom ",
           created="date_trunc('hour', now()) - interval '2 hours' + interval '1 minute'",
           ended="date_trunc('hour', now()) - interval '2 hours' + interval '6 minutes'")
    insert(2, status=Status.READY, ended=None,
           created="date_trunc('hour', now()) - interval '2 hours' + interval '1 minute'")
    insert(1, status=Status.READY, ended=None, created="now()")

    response = admin_client.get(DASHBOARD)

    points = section(response).snapshot.chart
    assert len(points) == 24
    assert points[-1].hour == section(response).snapshot.now.replace(
        minute=0, second=0, microsecond=0)
    two_ago = points[-3]
    assert (two_ago.enqueued, two_ago.succeeded, two_ago.failed) == (6, 3, 1)
    assert points[-1].enqueued == 1
    # Backlog: 3 live now; 2 at the end of the last two full hours; 0 before the burst.
    assert [p.backlog for p in points[-4:]] == [0, 2, 2, 3]
    assert sum(p.enqueued for p in points) == 7
    content = response.content.decode()
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="pgtasks-chart"' in content
    assert "6 enqueued" in content  # every number is in the bar's tooltip


def test_chart_svg_escapes_and_scales() -> None:
    hour = datetime(2026, 1, 1, tzinfo=UTC)
    points = [dashboard.HourPoint(hour + timedelta(hours=i), i, i, 0, 0, 10 * i)
              for i in range(24)]
    svg = str(chart.chart_svg(points, title='<script>"x"</script>'))
    assert "<script>" not in svg
    assert svg.count('<g class="hour">') == 24
    assert ">50<" in svg  # the left axis rounds 46 up to 50
    assert ">500<" in svg  # the right axis rounds 230 up to 500
    assert str(chart.chart_svg([])) == ""


@pytest.mark.parametrize(("most", "labels"), [
    (0, ["0", "1", "2"]), (1, ["0", "1", "2"]), (3, ["0", "2", "4"]), (5, ["0", "3", "6"]),
    (7, ["0", "5", "10"]), (11, ["0", "10", "20"]), (46, ["0", "25", "50"]),
    (101, ["0", "100", "200"]),
])
def test_chart_axis_labels_are_three_different_whole_numbers(most: int,
                                                             labels: list[str]) -> None:
    hour = datetime(2026, 1, 1, tzinfo=UTC)
    points = [dashboard.HourPoint(hour, most, 0, 0, 0, most)]
    svg = str(chart.chart_svg(points))
    left = re.findall(r'<text [^>]*text-anchor="end"[^>]*>([^<]*)</text>', svg)
    right = re.findall(r'<text [^>]*text-anchor="start"[^>]*>([^<]*)</text>', svg)
    assert left == right == labels  # from the bottom up: 0, half, max


def test_whole_table_numbers_are_marked_as_estimates(admin_client: Client,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Statistics are read when they say the table holds more than a small table's rows.
    monkeypatch.setattr(dashboard, "EXACT_COUNT_LIMIT", 20)
    insert(50)
    insert(10, status=Status.FAILED, error="Boom ")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")

    response = admin_client.get(DASHBOARD)

    estimate = section(response).snapshot.estimate
    assert estimate.rows == 60
    assert estimate.by_status == {"SUCCESSFUL": 50, "FAILED": 10}
    assert "Whole task table: ≈ 60 rows (≈ 50 successful, ≈ 10 failed)." in (
        " ".join(response.content.decode().split()))


def test_a_small_or_never_analyzed_table_is_counted_exactly(admin_client: Client) -> None:
    # Never analyzed: the partitioned table's statistics know no rows (0, or -1).
    insert(20)
    insert(5, status=Status.FAILED, error="Boom ")

    response = admin_client.get(DASHBOARD)

    estimate = section(response).snapshot.estimate
    assert (estimate.rows, estimate.by_status, estimate.exact) == (
        25, {"SUCCESSFUL": 20, "FAILED": 5}, True)
    assert "Whole task table: 25 rows (20 successful, 5 failed)." in (
        " ".join(response.content.decode().split()))


def test_one_section_per_task_database(admin_client: Client) -> None:
    response = admin_client.get(DASHBOARD)
    assert [s.database for s in response.context["sections"]] == ["default"]
    assert not response.context["several_databases"]
    assert admin_client.get(DASHBOARD, {"database": "default"}).status_code == 200
    assert admin_client.get(DASHBOARD, {"database": "not_postgres"}).status_code == 404


def test_the_task_list_links_to_the_dashboard(admin_client: Client) -> None:
    content = admin_client.get(CHANGELIST).content.decode()
    assert f'href="{DASHBOARD}"' in content


def test_the_admin_index_links_to_the_dashboard(admin_client: Client,
                                                viewer_client: Client) -> None:
    entry = "/admin/django_pgtasks/dashboard/"
    for client in (admin_client, viewer_client):
        index = client.get("/admin/").content.decode()
        assert f'<a href="{entry}">Dashboard</a>' in index
        assert client.get("/admin/django_pgtasks/").content.decode().count(entry) >= 1
        response = client.get(entry)
        assert (response.status_code, response.url) == (302, DASHBOARD)
    # Nothing to add, change or delete through the entry.
    assert admin_client.get(f"{entry}add/").status_code == 404
    # ...and no permissions of its own: those of tasks decide.
    assert not Permission.objects.filter(content_type__model="dashboard").exists()


def test_users_without_task_permissions_get_no_dashboard_entry(client: Client) -> None:
    user = User.objects.create_user("staff-only", password="unused", is_staff=True)
    client.force_login(user)
    assert "/admin/django_pgtasks/dashboard/" not in client.get("/admin/").content.decode()
    assert client.get("/admin/django_pgtasks/dashboard/").status_code == 403


def test_snapshot_refuses_bad_windows() -> None:
    for hours in (0, -1, 1.5, True, dashboard.MAX_HOURS + 1):
        with pytest.raises(ValueError, match="hours must be an integer"):
            dashboard.database_snapshot(hours=hours)  # type: ignore[arg-type]


# -- permissions ---------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_the_login_page(client: Client) -> None:
    for url in (DASHBOARD, f"{REQUEUE}?group=x"):
        response = client.get(url)
        assert response.status_code == 302
        assert "/login/" in response.url


def test_view_only_users_see_the_dashboard_but_cannot_requeue(viewer_client: Client) -> None:
    insert(2, status=Status.FAILED, error="ValueError: bad input ")
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert section(response).error_groups
    assert "Requeue group" not in response.content.decode()

    group = section(response).error_groups[0]["group"].text
    assert viewer_client.get(REQUEUE, {"group": group}).status_code == 403
    assert viewer_client.post(REQUEUE, {"group": group, "post": "yes"}).status_code == 403
    assert Task.objects.failed().count() == 2


def test_users_without_task_permissions_get_no_dashboard(client: Client) -> None:
    user = User.objects.create_user("staff", password="unused", is_staff=True)
    client.force_login(user)
    assert client.get(DASHBOARD).status_code == 403


# -- requeue an error group ----------------------------------------------------------------


def requeue(client: Client, group: str, **extra: Any) -> tuple[HttpResponse, HttpResponse]:
    """Open the confirmation page (checking it changed nothing), then confirm."""
    failed_before = Task.objects.failed().count()
    shown = client.get(REQUEUE, {"group": group, **extra})
    assert Task.objects.failed().count() == failed_before
    done = client.post(REQUEUE, {"group": group, "post": "yes", **extra})
    return shown, done


def test_requeue_a_whole_error_group_after_confirmation(admin_client: Client) -> None:
    insert(3, status=Status.FAILED, error="LookupError: order ", attempt=3)
    insert(2, status=Status.FAILED, error="ValueError: bad input ")
    # The same error on tasks that are not failed: never touched.
    insert(1, status=Status.RUNNING, error="LookupError: order ", ended=None, locked_by="w1",
           locked_at="now()")
    insert(1, status=Status.SUCCESSFUL, error="LookupError: order ")
    # An old failure of the group, outside the dashboard's window: requeued too.
    insert(1, status=Status.FAILED, error="LookupError: order ",
           ended="now() - interval '20 days'")

    shown, done = requeue(admin_client, "LookupError: order N")

    assert shown.status_code == 200
    assert shown.context["count"] == 4
    content = shown.content.decode()
    assert "4 failed tasks are in this group." in content
    assert 'value="Requeue 4 tasks"' in content

    assert done.status_code == 302
    assert done.url == DASHBOARD
    assert message_texts(done) == ["Requeue error group: 4 changed, 0 skipped."]
    requeued = Task.objects.filter(error_text__startswith="LookupError")
    assert sorted(requeued.values_list("status", flat=True)) == [
        "READY", "READY", "READY", "READY", "RUNNING", "SUCCESSFUL"]
    assert set(Task.objects.ready().values_list("max_attempts", flat=True)) == {3, 4}
    assert Task.objects.failed().count() == 2  # the other group


def test_requeue_says_how_many_were_skipped_and_why(admin_client: Client) -> None:
    insert(2, status=Status.FAILED, error="LookupError: order ")
    held = Task.objects.failed().first()
    Task.objects.filter(pk=held.pk).update(key="order-1")
    Task.objects.enqueue(tasks.noop, key="order-1")

    _, done = requeue(admin_client, "LookupError: order N")

    assert message_texts(done) == [
        "Requeue error group: 1 changed, 1 skipped (1 deduplication key held by another "
        "live task, or changed meanwhile)."
    ]
    assert Task.objects.get(pk=held.pk).status == Status.FAILED


def test_requeue_needs_a_post_with_confirmation(admin_client: Client) -> None:
    insert(1, status=Status.FAILED, error="LookupError: order ")
    response = admin_client.post(REQUEUE, {"group": "LookupError: order N"})  # no post=yes
    assert response.status_code == 200
    assert Task.objects.failed().count() == 1


@pytest.mark.parametrize("group", ["x" * 201, "a\x00b"])
def test_requeue_refuses_groups_that_cannot_exist(admin_client: Client, group: str) -> None:
    assert admin_client.get(REQUEUE, {"group": group}).status_code == 404


def test_requeue_is_csrf_protected() -> None:
    user = User.objects.create_superuser("root", password="unused")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    insert(1, status=Status.FAILED, error="LookupError: order ")
    response = client.post(REQUEUE, {"group": "LookupError: order N", "post": "yes"})
    assert response.status_code == 403
    assert Task.objects.failed().count() == 1


# -- cost ----------------------------------------------------------------------------------


def explain(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (COSTS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.slow
def test_dashboard_queries_read_indexes_not_the_table() -> None:
    """100,000 tasks that ended over 30 days and 5,000 waiting: every dashboard query reads
    index ranges (the window, the waiting or running tasks), never the whole table."""
    insert(100_000, name="n", created="now() - (100001 - i) * interval '26 seconds'",
           ended="now() - (100001 - i) * interval '26 seconds'")
    insert(5_000, name="n", status=Status.READY, ended=None)  # enqueued now
    insert(50, name="n", status=Status.RUNNING, ended=None, locked_by="w", locked_at="now()")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgtasks_task")
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    since = dashboard.window_start(now, 24)
    marks = [since + timedelta(hours=i) for i in range(24)]

    plans = {
        "queue finished": explain(dashboard.QUEUE_FINISHED_SQL, [now - timedelta(hours=1)]),
        "live": explain(dashboard.LIVE_SQL, []),
        "finished window": explain(dashboard.FINISHED_WINDOW_SQL, {
            "since": since, "last_hour": now - timedelta(hours=1),
            "hex": dashboard.HEX_WORD_PATTERN, "digits": dashboard.DIGITS_PATTERN}),
        "enqueued": explain(dashboard.ENQUEUED_BOUNDARIES_SQL,
                            {"marks": marks, "since": min(marks)}),
        "requeue group": explain(*_compiled(
            dashboard.failed_in_group("default", "x", since).values("id"))),
    }
    # Counting the live tasks may read the live partition whole: it holds nothing else. The
    # window's periods may be read whole (at most its two days, as the planner's estimates
    # go), never the history before them.
    windows = {"queue finished": now - timedelta(hours=1), "live": now}
    for what, plan in plans.items():
        assert_reads_only_the_window(plan, windows.get(what, since), now)
    assert re.search(r"pgtasks_task_done_p\d{8}", plans["finished window"])
    assert "pgtasks_task_failed" in plans["requeue group"]
    assert "pgtasks_task_done" not in plans["requeue group"]
    # The live counts read the live partition alone (through its indexes, or whole).
    assert "pgtasks_task_live" in plans["live"]
    assert "pgtasks_task_done" not in plans["live"]
    assert "pgtasks_task_failed" not in plans["live"]
    assert re.search(r"pgtasks_task_(live_pkey|\w+_id_idx)", plans["enqueued"])

    # The enqueued counts from the id boundaries equal a count over created_at.
    snapshot = dashboard.database_snapshot()
    for point in snapshot.chart:
        assert point.enqueued == Task.objects.filter(
            created_at__gte=point.hour, created_at__lt=point.hour + timedelta(hours=1)
        ).count(), point.hour
    assert snapshot.queues[0].waiting == 5_000


def _compiled(queryset: Any) -> tuple[str, Any]:
    sql, params = queryset.query.sql_with_params()
    return sql, params


def test_requeue_from_the_dashboard_takes_the_failures_it_counted(admin_client: Client) -> None:
    insert(3, status=Status.FAILED, error="LookupError: order ")
    insert(1, status=Status.FAILED, error="LookupError: order ",
           ended="now() - interval '20 days'")  # older than the window

    dashboard_page = admin_client.get(DASHBOARD)
    [group] = section(dashboard_page).error_groups
    assert group["group"].count == 3
    shown = admin_client.get(group["requeue_url"])
    assert shown.context["count"] == 3
    content = " ".join(shown.content.decode().split())
    assert "3 tasks of this group failed since" in content
    assert escape(shown.context["all_time_url"]) in shown.content.decode()
    assert admin_client.get(shown.context["all_time_url"]).context["count"] == 4

    since = shown.context["since"].isoformat()
    done = admin_client.post(REQUEUE, {"group": "LookupError: order N", "since": since,
                                       "post": "yes"})

    assert message_texts(done) == ["Requeue error group: 3 changed, 0 skipped."]
    assert Task.objects.failed().count() == 1  # the old one


@pytest.mark.parametrize("since", ["yesterday", "2026-01-01T00:00:00"])
def test_requeue_refuses_a_bad_window(admin_client: Client, since: str) -> None:
    response = admin_client.get(REQUEUE, {"group": "x", "since": since})
    assert response.status_code == 404


def test_pages_lead_back_through_their_breadcrumbs(admin_client: Client) -> None:
    insert(1, status=Status.FAILED, error="LookupError: order ")
    dashboard_page = admin_client.get(DASHBOARD).content.decode()
    requeue_page = admin_client.post(REQUEUE, {"group": "LookupError: order N"}).content.decode()
    crumbs = [page[page.index('class="breadcrumbs"'):].split("</ol>")[0].split("</div>")[0]
              for page in (dashboard_page, requeue_page)]
    assert f'href="{CHANGELIST}"' in crumbs[0]
    assert "Task queue dashboard" in crumbs[0]
    assert f'href="{DASHBOARD}"' in crumbs[1]
    assert "Dashboard" in crumbs[1]
