"""End to end in a real browser: log into the admin, read the dashboard, open a failed error
group, retry it, and check the rows in PostgreSQL.

Needs the ``playwright`` Python package (the ``browser`` extra) and a Chromium binary
(``.ci/install-browser`` installs Debian's at ``/usr/bin/chromium``; ``PGTASKS_CHROMIUM``
names another). Playwright's own browser downloads are not used. Without either, the test is
skipped and says why.

Screenshots go to a temporary directory, or to ``PGTASKS_SCREENSHOT_DIR`` when it is set
(``PGTASKS_SCREENSHOT_DIR=docs/images`` refreshes the pictures in ``docs/admin.md``).
"""

from __future__ import annotations

import contextlib
import mimetypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test.testcases import LiveServerThread

import django_pgtasks
from django_pgtasks.models import Status, Task, WorkerProcess
from tests.helpers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CHROMIUM = os.environ.get("PGTASKS_CHROMIUM", "/usr/bin/chromium")
ADMIN_STATIC = Path(django.__file__).parent / "contrib" / "admin" / "static"
APP_STATIC = Path(django_pgtasks.__file__).parent / "static"
#: A Django tasks framework (@task) name, as long as such names get.
LONG_NAME = "tests.testapp.backend_tasks.a_task_with_a_rather_long_descriptive_name"
#: An error whose first line is 60 characters long: the list shows it whole.
ERROR_60 = "LookupError: order 1203 not found in the stock of warehouses"
PASSWORD = "browser-test-password"


def _skip(reason: str) -> None:
    # Shown with -s, and in -ra's summary.
    print(f"\ntests/integration/test_browser.py skipped: {reason}")
    pytest.skip(reason)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip("the playwright package is not installed (pip install 'django-pgtasks[browser]')")
    if not os.access(CHROMIUM, os.X_OK):
        _skip(f"no Chromium at {CHROMIUM} (run .ci/install-browser, or set PGTASKS_CHROMIUM)")
    # Playwright's synchronous API keeps an event loop in this thread, which Django takes for
    # async code; the ORM calls of this test run before and after the browser's work.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    directory = Path(os.environ.get("PGTASKS_SCREENSHOT_DIR") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def server_url(transactional_db: None, settings: Any) -> Iterator[str]:
    """The test project served on a free local port, in a thread, for this test only.

    The test settings do not install ``django.contrib.staticfiles`` (pytest-django's
    ``live_server`` needs ``STATIC_URL``); the browser gets the admin's stylesheets and
    scripts from :func:`serve_admin_static` instead.
    """
    settings.STATIC_URL = "/static/"
    settings.ALLOWED_HOSTS = ["localhost"]
    thread = LiveServerThread("localhost", static_handler=lambda app: app, port=0)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    try:
        yield f"http://{thread.host}:{thread.port}"
    finally:
        thread.terminate()
        _wait_for_request_threads()


def _wait_for_request_threads() -> None:
    """Request threads close their database connections when the browser's connections
    close, a moment after the server stops; the test database can only be dropped then."""

    def closed() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return not cursor.fetchone()[0]

    with contextlib.suppress(AssertionError):  # still open: the database's drop says so
        wait_until(closed, 10)


def serve_admin_static(route: Any) -> None:
    """The admin's static files and this app's, as ``collectstatic`` would gather them."""
    path = route.request.url.split("/static/", 1)[1].split("?", 1)[0]
    for root in (APP_STATIC, ADMIN_STATIC):
        file = (root / path).resolve()
        if root.resolve() in file.parents and file.is_file():
            route.fulfill(body=file.read_bytes(),
                          content_type=mimetypes.guess_type(file.name)[0] or "text/plain")
            return
    route.fulfill(status=404, body="")


def no_horizontal_scroll(page: Any) -> None:
    width = page.evaluate("""() => [document.documentElement.scrollWidth, window.innerWidth,
        [...document.querySelectorAll('#content *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth)
            .slice(-3).map(e => e.outerHTML.slice(0, 200))]""")
    assert width[0] <= width[1], width  # and the widest elements


def seed() -> dict[str, list[int]]:
    """A queue that has a bad night: steady work over 24 hours, a burst of failures of one
    kind, a few of another, a stuck task and two workers (one of them lost)."""
    with connection.cursor() as cursor:
        # In the order they were enqueued, as ids are handed out: steady work over 24 hours,
        # a burst eight hours ago that took the workers two hours to drain, and 40 tasks
        # waiting for four minutes.
        cursor.execute(
            """
            INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt,
                                      max_attempts, error_text, metadata, run_after,
                                      started_at, finished_at, created_at, updated_at)
            SELECT name, 'default', json_build_array(i)::jsonb, '{}', 100, status,
                   CASE WHEN status = 'READY' THEN 0 ELSE 1 END, 3, '', '{}', created,
                   finished - interval '1 second', finished, created, now()
            FROM (
                SELECT i, CASE WHEN i % 3 = 0 THEN 'shop.tasks.send_receipt'
                               ELSE 'shop.tasks.sync_stock' END AS name,
                       'SUCCESSFUL' AS status,
                       now() - interval '1444 minutes' + i * interval '72 seconds' AS created,
                       now() - interval '1443 minutes' + i * interval '72 seconds' AS finished
                FROM generate_series(1, 1200) AS i
                UNION ALL
                SELECT i, 'shop.tasks.rebuild_index', 'SUCCESSFUL',
                       now() - interval '8 hours' + i * interval '3 seconds',
                       now() - interval '7 hours' + i * interval '18 seconds'
                FROM generate_series(1, 400) AS i
                UNION ALL
                SELECT i, 'shop.tasks.sync_stock', 'READY', now() - interval '4 minutes', NULL
                FROM generate_series(1, 40) AS i
            ) AS seeded
            ORDER BY created
            """
        )
    failed_orders = []
    suffix = " in the stock of warehouses"
    for order in (41, 977, 1203):
        task = Task.objects.enqueue("tests.testapp.tasks.always_fails", f"order {order}",
                                    queue="emails")
        failed_orders.append(task.pk)
        Task.objects.filter(pk=task.pk).update(
            status=Status.FAILED, attempt=3, finished_at=task.created_at,
            error_text=(f"LookupError: order {order} not found{suffix}"
                        f"\n\nTraceback (most recent call "
                        f"last):\n  File \"shop/tasks.py\", line 18, in send_receipt\n"
                        f"LookupError: order {order} not found{suffix}"),
        )
    other = []
    for _ in range(2):
        task = Task.objects.enqueue("tests.testapp.tasks.always_fails", "smtp")
        other.append(task.pk)
        Task.objects.filter(pk=task.pk).update(
            status=Status.FAILED, attempt=3, finished_at=task.created_at,
            error_text="SMTPServerDisconnected: Connection unexpectedly closed",
        )
    # A task of Django's tasks framework, with a long name, as its backend stores it.
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, "
                       "attempt, max_attempts, error_text, metadata, run_after, created_at, "
                       "updated_at) VALUES (%s, 'emails', '[1]', '{}', 100, 'READY', 0, "
                       "1, '', '{}', now() + interval '1 hour', now(), now())", [LONG_NAME])
    WorkerProcess.objects.create(name="web-1:4242", hostname="web-1", pid=4242, concurrency=8,
                                 queues=["default", "emails"])
    stuck = Task.objects.enqueue("tests.testapp.tasks.noop")
    Task.objects.filter(pk=stuck.pk).update(status=Status.RUNNING, attempt=1,
                                            locked_by="web-2:977")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgtasks_task SET locked_at = now() - interval '7 minutes' "
                       "WHERE id = %s", [stuck.pk])
        cursor.execute("ANALYZE pgtasks_task")
    User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    return {"orders": failed_orders, "other": other}


def dashboard_refreshes(page: Any, url: str) -> None:
    """The open dashboard reads itself again, without a reload, and waits while hidden."""
    waiting = page.locator("#pgtasks-queues-default tr[data-queue=default] td.waiting")
    main = page.locator("#content-main.pgtasks-dashboard")
    refreshed = int(main.get_attribute("data-refreshed") or 0)
    page.evaluate("window.pgtasksNotReloaded = true")
    Task.objects.enqueue("tests.testapp.tasks.noop")
    page.wait_for_function(
        "() => document.querySelector('#pgtasks-queues-default tr[data-queue=default] "
        "td.waiting').textContent === '41'", timeout=30_000)
    assert waiting.inner_text() == "41"
    assert page.evaluate("window.pgtasksNotReloaded === true")  # the same page, refreshed

    # Hidden: no more reads. Each read the page makes is counted; a read planned before
    # the tab was hidden may still end, then the page waits (data-refresh-state="paused").
    reads = []
    page.on("request", lambda request: reads.append(request.url) if request.url == url else None)
    page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        Object.defineProperty(document, 'visibilityState', {configurable: true,
                                                            get: () => 'hidden'});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    page.wait_for_function("() => document.querySelector('#content-main')"
                           ".dataset.refreshState === 'paused'")
    refreshed = int(main.get_attribute("data-refreshed") or 0)
    reads.clear()
    # Time passes (the page's clock runs the timers of several intervals at once): nothing
    # is read while hidden.
    page.clock.run_for(60_000)
    assert main.get_attribute("data-refresh-state") == "paused"
    assert reads == []
    assert int(main.get_attribute("data-refreshed") or 0) == refreshed

    # Shown again: read at once.
    with page.expect_request(url):
        page.evaluate("""() => {
            Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
            Object.defineProperty(document, 'visibilityState', {configurable: true,
                                                                get: () => 'visible'});
            document.dispatchEvent(new Event('visibilitychange'));
        }""")
    page.wait_for_function(f"() => Number(document.querySelector('#content-main')"
                           f".dataset.refreshed) > {refreshed}")


def test_operator_retries_a_failed_error_group_from_the_dashboard(
    server_url: str, browser: Any, screenshots: Path,
) -> None:
    try:
        operator_session(server_url, browser, screenshots)
    finally:
        # The ORM calls made while Playwright runs use a connection of their own context,
        # which the test database's teardown would otherwise find still open.
        connections.close_all()


def operator_session(server_url: str, browser: Any, screenshots: Path) -> None:
    rows = seed()

    # A laptop's screen.
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    # The page's timers run on a clock the test can move on (dashboard_refreshes).
    page.clock.install()
    page.route("**/static/**", serve_admin_static)
    page.goto(f"{server_url}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    # The admin index leads to the dashboard.
    page.locator("#content-main a", has_text="Dashboard").click()
    dashboard_path = "/admin/django_pgtasks/task/dashboard/"
    page.wait_for_url(f"**{dashboard_path}")

    # The dashboard answers the three questions.
    queues = page.locator("#pgtasks-queues-default")
    assert queues.locator("tr[data-queue=default] td.waiting").inner_text() == "40"
    groups = page.locator("#pgtasks-error-groups-default tr.error-group")
    assert groups.count() == 2
    assert "LookupError: order N not found in the stock" in groups.nth(0).text_content()
    assert "Stuck: 1 running task" in page.locator("#pgtasks-stuck-default").text_content()
    assert page.locator("svg.pgtasks-chart g.hour").count() == 24
    # It fits the screen, with the navigation sidebar open.
    assert page.locator("#nav-sidebar").is_visible()
    no_horizontal_scroll(page)
    page.screenshot(path=str(screenshots / "admin-dashboard.png"), full_page=True)
    dashboard_refreshes(page, server_url + dashboard_path)

    # Open the failed group: exactly its three tasks.
    groups.nth(0).locator("a").first.click()
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 3
    # Every column is in view, with the navigation sidebar open, and the error column holds
    # an error line of 60 characters whole.
    assert page.locator("#nav-sidebar").is_visible()
    no_horizontal_scroll(page)
    table = page.evaluate("""() => [document.querySelector('#result_list').scrollWidth,
                                    document.querySelector('.results').clientWidth]""")
    assert table[0] <= table[1], table
    error_column = page.locator("#result_list th.column-error_summary").bounding_box()
    assert error_column is not None
    assert error_column["x"] + error_column["width"] <= 1280, error_column
    cell = page.locator("#result_list td.field-error_summary .pgtasks-line",
                        has_text="1203").first
    assert cell.text_content() == ERROR_60
    assert cell.evaluate("e => e.scrollWidth <= e.clientWidth"), "the error line is cut"
    page.screenshot(path=str(screenshots / "admin-failed-group.png"), full_page=True)

    # Retry them now, through the confirmation page.
    page.check("#action-toggle")
    page.select_option("select[name=action]", "retry_now_selected")
    page.click("button[name=index]")
    page.wait_for_selector(".pgtasks-action-confirmation, body.pgtasks-action-confirmation")
    assert "3 tasks are selected." in page.content()
    page.click("input[type=submit][value=Confirm]")
    page.wait_for_selector("ul.messagelist")
    message = page.locator("ul.messagelist li").first.text_content().strip()
    assert message == "Retry now: 3 changed, 0 skipped."

    # A task of the tasks framework, with a long name, takes one line.
    page.goto(f"{server_url}/admin/django_pgtasks/task/?name={LONG_NAME}")
    no_horizontal_scroll(page)
    row = page.locator("#result_list tbody tr").first
    assert LONG_NAME in row.locator("td.field-call .pgtasks-line").get_attribute("title")
    assert row.bounding_box()["height"] < 40, row.bounding_box()
    page.close()
    browser.close()

    # And in the database: the group is due again, the other failures untouched.
    assert set(Task.objects.filter(pk__in=rows["orders"]).values_list("status", flat=True)) == {
        Status.READY}
    assert set(Task.objects.filter(pk__in=rows["other"]).values_list("status", flat=True)) == {
        Status.FAILED}
    assert set(Task.objects.filter(pk__in=rows["orders"]).values_list(
        "max_attempts", flat=True)) == {4}
