"""Shared fixtures. Every test that touches the queue runs against real PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections

from tests import fast_flush, kept_connections, second_server

ROOT = Path(__file__).resolve().parent.parent

fast_flush.install()
kept_connections.install()


@pytest.fixture
def subprocess_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child ``manage.py`` process that uses the test database.

    Connection details are passed as libpq ``PG*`` variables, which
    ``django_pgtasks_dev.database_config`` reads when ``DATABASE_URL`` is unset.
    """
    s = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        PGDATABASE=s["NAME"],
        PGUSER=s["USER"] or "",
        PGPASSWORD=s["PASSWORD"] or "",
        PGHOST=s["HOST"] or "",
        PGPORT=str(s["PORT"] or ""),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    if "second" in connections:  # the second server (tests/second_server.py), if any
        env[second_server.NAME_VARIABLE] = connections["second"].settings_dict["NAME"]
    return env


def manage_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


@pytest.fixture
def empty_database(subprocess_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The environment of a child process whose database exists but was never migrated."""
    name = f"{connection.settings_dict['NAME']}_empty"
    params = {"host": subprocess_env["PGHOST"] or None, "port": subprocess_env["PGPORT"] or None,
              "user": subprocess_env["PGUSER"] or None,
              "password": subprocess_env["PGPASSWORD"] or None, "dbname": "postgres"}
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**subprocess_env, "PGDATABASE": name}
    finally:
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def run_in() -> Callable[..., subprocess.CompletedProcess]:
    """Run ``django-admin <args>`` with the environment given."""

    def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(manage_command(*args), env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)

    return run


@pytest.fixture
def run_command(subprocess_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess]:
    """Run ``django-admin <args>`` against the test database and wait for it."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            manage_command(*args), env=subprocess_env, cwd=ROOT, capture_output=True,
            text=True, timeout=timeout,
        )

    return run


@contextlib.contextmanager
def started_processes(env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen]]:
    """A function that starts ``django-admin <args>`` in the background with ``env`` (plus
    the keyword arguments as variables), each in a session of its own; at the end, every one
    is killed with the processes under it (:func:`tests.helpers.kill_process_tree`): a
    supervisor's worker processes must not outlive the test and claim the next test's
    tasks."""
    processes: list[subprocess.Popen] = []

    def start(*args: str, **extra: str) -> subprocess.Popen:
        process = subprocess.Popen(
            manage_command(*args), env={**env, **extra}, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        processes.append(process)
        return process

    try:
        yield start
    finally:
        from tests.helpers import close_output, kill_process_tree

        for process in processes:
            kill_process_tree(process)
            process.wait(timeout=10)
            close_output(process)


@pytest.fixture
def start_command(subprocess_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``django-admin <args>`` in the background; every process is killed at teardown."""
    with started_processes(subprocess_env) as start:
        yield start


@pytest.fixture(autouse=True)
def _no_claim_state_from_an_earlier_test() -> None:
    """Each test starts with its own tasks: the claim's moving lower bounds and its choice
    between the plain and the controlled claim (django_pgtasks.lifecycle.claim), kept by an
    earlier test's claims, describe rows that are gone."""
    from django_pgtasks.lifecycle import claim as claiming

    claiming.forget_bounds()
    claiming.forget_modes()


@pytest.fixture
def kept_claim_mode(settings) -> None:
    """The plain/controlled decision a claim makes is kept for the whole test: a test that
    reads what the second of two claims does must not depend on whether CONTROLS_REFRESH
    (one second) passed between them on a slow machine, when the second claim would make
    the decision again with a plain claim from the start of the queue."""
    settings.PGTASKS = {**settings.PGTASKS, "CONTROLS_REFRESH": 3600.0}


@pytest.fixture
def viewer_client(client):
    """A staff member who may look at tasks but change nothing."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("viewer", password="unused", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_pgtasks", codename="view_task")
    )
    client.force_login(user)
    return client


@pytest.fixture(scope="session", autouse=True)
def _no_session_outlives_the_run(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """At the end, every other session on the test database has gone, or the run fails
    naming them (Django cannot drop a database that is still in use).

    A session of a killed child can outlive it until its statement ends, and one a finished
    thread never closed lingers until the garbage collector frees it: both are waited for.
    """
    yield
    import gc

    from tests.helpers import wait_until

    if connection.settings_dict["NAME"] != connection.settings_dict.get("TEST", {}).get("NAME"):
        return  # no test of the run needed the database, so none was created

    def others() -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, application_name, state, wait_event, backend_start, "
                "left(query, 200) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return cursor.fetchall()

    with django_db_blocker.unblock():
        gc.collect()
        try:
            wait_until(lambda: not others(), timeout=60, what="the other sessions to end")
        except AssertionError:
            raise AssertionError(f"Sessions still open on the test database at the end of "
                                 f"the run: {others()}") from None


@pytest.fixture
def past_period(transactional_db: None) -> Iterator[dict[str, str]]:
    """Each history table gets periods for the two days before today, split off its
    ``_before`` partition (as if the workers had made them then); the older one, which no
    window of the last 24 hours reaches, is given (per table) to the test. The migration's
    layout comes back after."""
    from django.db import transaction

    from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE
    from django_pgtasks.patterns import partitions
    from tests.helpers import DAY, first_period_start

    made: dict[str, list[str]] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        for table in (DONE_TABLE, FAILED_TABLE):
            start = first_period_start(table)
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {table}_before")
            for days in (2, 1):
                name = f"{table}_p{(start - days * DAY):%Y%m%d}"
                cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS "
                               f"INCLUDING CONSTRAINTS INCLUDING STORAGE)")
                cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} "
                               f"FOR VALUES FROM (%s) TO (%s)",
                               [start - days * DAY, start - (days - 1) * DAY])
                made.setdefault(table, []).append(name)
            cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {table}_before "
                           f"FOR VALUES FROM (MINVALUE) TO (%s)", [start - 2 * DAY])
    yield {table: names[0] for table, names in made.items()}
    with transaction.atomic(), connection.cursor() as cursor:
        for table, names in made.items():
            attached = {p.name: p for p in partitions.partitions("default", table)}
            for name in names:
                if name in attached:  # a detach a test left pending is finished
                    how = " FINALIZE" if attached[name].detach_pending else ""
                    cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {name}{how}")
                cursor.execute(f"DROP TABLE IF EXISTS {name}")
            cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {table}_before")
            cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {table}_before "
                           f"FOR VALUES FROM (MINVALUE) TO (%s)",
                           [first_period_start(table)])


@pytest.fixture
def history_without_gaps(transactional_db: None) -> Iterator[None]:
    """For the tests whose retention is short (a minute, an hour) and that purge: once the UTC
    day has turned during the run, their purge drops, as expired, the periods the migration
    made the day before, and a later test's rows of that day would find no partition. After
    the test, the catch partition ``_before`` reaches again up to the first period left."""
    yield
    from django.db import transaction

    from django_pgtasks.database.schema import DONE_TABLE, FAILED_TABLE
    from django_pgtasks.patterns import partitions
    from tests.helpers import first_period_start

    with transaction.atomic(), connection.cursor() as cursor:
        for table in (DONE_TABLE, FAILED_TABLE):
            before = next(p for p in partitions.partitions("default", table)
                          if p.start is None)
            first = first_period_start(table)
            if before.end is not None and before.end < first:
                cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {before.name}")
                cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {before.name} "
                               f"FOR VALUES FROM (MINVALUE) TO (%s)", [first])


@pytest.fixture
def fresh_scheduler_state() -> Iterator[None]:
    """The scheduler remembers, per process, what it wrote and what it reported; each test
    that uses it starts from nothing."""
    from django_pgtasks.scheduling import job

    job._written.clear()
    job._reported.clear()
    yield
    job._written.clear()
    job._reported.clear()
