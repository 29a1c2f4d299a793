"""The example project, exercised through its own ``manage.py`` on real PostgreSQL.

Everything here runs in child processes. The example has its own settings (the ``shop``
app, three queues, its own URLconf and logging) that cannot be loaded into this process,
which runs on ``tests.settings``. For the same reason the order view is covered by the
example's own test suite (``example_project/shop/tests.py``), which Django's test runner
runs in a child process with the example's settings; pytest checks that it passes.
"""

from __future__ import annotations

import re
import runpy
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from django_pgtasks.conf import DEFAULTS

from .conftest import ROOT

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

    demo = manage(env, "demo", "--orders", "20")

    assert demo.returncode == 0, output(demo)
    assert f"Created database {fresh_database!r}." in demo.stdout
    assert "Seeded 20 orders for 5 customers (1 withdrawn)" in demo.stdout
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
        subjects = [row[0] for row in conn.execute("SELECT subject FROM shop_notification")]
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
    assert {t[0] for t in others} == {"shop.tasks.rebuild_daily_report",
                                      "shop.tasks.review_order"}
    assert {(t[2], t[3]) for t in others} == {("SUCCESSFUL", 1)}
    assert reports
    for order_count, revenue, actual_count, actual_revenue in reports:
        assert (order_count, revenue) == (actual_count, Decimal(actual_revenue))

    # Everything is migrated, and a second run on the same database has nothing left to do.
    migrate = manage(env, "migrate", "--check")
    assert migrate.returncode == 0, output(migrate)
    rerun = manage(env, "demo", "--no-seed")
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
