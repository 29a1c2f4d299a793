"""A database where ``migrate`` was not run: every entry point says so, and nothing retries.

The commands run against a database created empty for the test (no table at all); the
in-process tests take the task table away from the test database for their duration (each
test process has its own test database) and put it back.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from django_pgtasks.checks import check_queue_tables
from django_pgtasks.database.schema import expected_migrations
from django_pgtasks.exceptions import NotMigratedError
from django_pgtasks.models import Task
from django_pgtasks.worker.loop import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATE_HINT = "Run: python manage.py migrate"


@pytest.fixture
def table_away() -> Iterator[None]:
    """The task table is missing (renamed, committed) until the test ends."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgtasks_task RENAME TO pgtasks_task_away")
        cursor.execute("ALTER TABLE pgtasks_task_live RENAME TO pgtasks_task_live_away")
    try:
        yield
    finally:
        connection.close()  # a connection left in a failed transaction by the test
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgtasks_task_away RENAME TO pgtasks_task")
            cursor.execute("ALTER TABLE pgtasks_task_live_away RENAME TO pgtasks_task_live")


def test_the_worker_refuses_to_start_and_says_to_migrate(empty_database, run_in) -> None:
    result = run_in(empty_database, "run_pgtasks", "--burst", timeout=60)
    assert result.returncode == 1, result.stderr
    assert ("has no django-pgtasks tables (no migration of django_pgtasks was applied). "
            f"{MIGRATE_HINT}") in result.stderr
    assert "ERROR" not in result.stderr  # no retries, no back-off lines
    assert "Worker" not in result.stderr  # stopped before any worker started


def test_the_worker_names_the_migrations_an_upgrade_left_unapplied(
        empty_database, run_in) -> None:
    result = run_in(empty_database, "migrate", "django_pgtasks", "0008", timeout=120)
    assert result.returncode == 0, result.stderr
    result = run_in(empty_database, "run_pgtasks", "--burst", timeout=60)
    assert result.returncode == 1
    missing = [name for name in expected_migrations() if name[:4] > "0008"]
    assert missing[0] == "0009_claims"
    assert (f"lacks {len(missing)} migration(s) of django_pgtasks ({', '.join(missing)}). "
            f"{MIGRATE_HINT}") in result.stderr


def test_enqueue_raises_the_projects_error_saying_to_migrate(empty_database, run_in) -> None:
    result = run_in(empty_database, "shell", "-c", (
        "from django_pgtasks.exceptions import NotMigratedError\n"
        "from django_pgtasks.models import Task\n"
        "from tests.testapp import tasks\n"
        "try:\n"
        "    Task.objects.enqueue(tasks.add, 1, 2)\n"
        "except NotMigratedError as exc:\n"
        "    print('refused:', exc, '| cause:', type(exc.__cause__).__name__)\n"
    ), timeout=60)
    assert result.returncode == 0, result.stderr
    assert ("refused: The database 'default' lacks the tables or columns of django-pgtasks. "
            f"{MIGRATE_HINT} | cause: ProgrammingError") in result.stdout


@pytest.mark.usefixtures("table_away")
@pytest.mark.parametrize("how", ["enqueue", "enqueue_many", "enqueue_bulk", "keyed"])
def test_every_enqueue_form_raises_not_migrated(how: str) -> None:
    enqueue = {
        "enqueue": lambda: Task.objects.enqueue(tasks.add, 1, 2),
        "enqueue_many": lambda: Task.objects.enqueue_many([tasks.add.build(1, 2)]),
        "enqueue_bulk": lambda: Task.objects.enqueue_bulk(tasks.add, [[1, 2]]),
        "keyed": lambda: Task.objects.enqueue(tasks.add, 1, 2, key="k"),
    }[how]
    with pytest.raises(NotMigratedError, match=MIGRATE_HINT) as caught, transaction.atomic():
        enqueue()
    assert caught.value.alias == "default"
    assert re.search(r'relation "pgtasks_task(_live)?" does not exist',
                     str(caught.value.__cause__))


@pytest.mark.usefixtures("table_away")
@pytest.mark.parametrize("how", ["enqueue", "aenqueue", "get_result", "aget_result"])
def test_the_django_tasks_backend_raises_not_migrated(how: str) -> None:
    """``@task`` as ``@pgtask``: the error says to migrate (a ``ProgrammingError`` still)."""
    compat = pytest.importorskip("django_pgtasks.definition.framework")
    from asgiref.sync import async_to_sync

    from tests.testapp import dj_tasks

    backend = compat.task_backends["default"]
    call = {
        "enqueue": lambda: dj_tasks.add.enqueue(1, 2),
        "aenqueue": lambda: async_to_sync(dj_tasks.add.aenqueue)(1, 2),
        "get_result": lambda: backend.get_result("1"),
        "aget_result": lambda: async_to_sync(backend.aget_result)("1"),
    }[how]
    with pytest.raises(NotMigratedError, match=MIGRATE_HINT) as caught:
        call()
    assert caught.value.alias == "default"
    assert re.search(r'relation "pgtasks_task(_live)?" does not exist',
                     str(caught.value.__cause__))


@pytest.mark.usefixtures("table_away")
def test_a_running_worker_stops_when_it_finds_no_table(caplog) -> None:
    # The start-up check is skipped when the database is unreachable at start; the worker
    # then meets the missing table in its own statements, and stops instead of retrying.
    worker = Worker(worker_id="w-unmigrated", burst=False, poll_interval=0.05)
    with caplog.at_level(logging.INFO, logger="django_pgtasks"):
        code = worker.run(install_signals=False)
    assert code == 1
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical == ["Worker w-unmigrated stopping: The database 'default' lacks the "
                        f"tables or columns of django-pgtasks. {MIGRATE_HINT}"]
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]


@pytest.mark.usefixtures("table_away")
def test_migrate_does_not_warn_about_the_table_it_is_about_to_create() -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("migrate", "django_pgtasks", verbosity=1, skip_checks=False, stdout=out,
                 stderr=err)
    assert "W040" not in out.getvalue() + err.getvalue()
    # ``check --database default`` still reports it.
    [warning] = check_queue_tables(databases=["default"])
    assert warning.id == "django_pgtasks.W040"
    assert warning.hint == "Run: python manage.py migrate --database default"


def test_check_database_names_the_migrations_an_upgrade_left_unapplied(
        empty_database, run_in) -> None:
    assert run_in(empty_database, "migrate", "django_pgtasks", "0009").returncode == 0
    result = run_in(empty_database, "check", "--database", "default")
    missing = [name for name in expected_migrations() if name[:4] > "0009"]
    assert f"(django_pgtasks.W042) The queue database 'default' lacks {len(missing)} " \
           f"migration(s) of django_pgtasks ({', '.join(missing)})" in result.stderr, \
           result.stderr
    assert run_in(empty_database, "migrate").returncode == 0
    result = run_in(empty_database, "check", "--database", "default")
    assert "W042" not in result.stderr + result.stdout
    assert "System check identified no issues" in result.stdout
