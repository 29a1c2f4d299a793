"""System checks for PGTASKS and the database, and the settings object."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_pgtasks.checks import check_database, check_settings
from django_pgtasks.conf import DEFAULTS, pgtasks_settings


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_defaults_pass(settings) -> None:
    settings.PGTASKS = {}
    assert check_settings() == []
    assert check_database() == []


def test_a_non_postgresql_database_is_a_clear_check_error(settings) -> None:
    settings.PGTASKS = {"DATABASE": "not_postgres"}
    [error] = check_database()
    assert error.id == "django_pgtasks.E002"
    assert "uses the 'sqlite' backend; django-pgtasks needs PostgreSQL" in error.msg


def test_an_unknown_database_alias_is_a_check_error(settings) -> None:
    settings.PGTASKS = {"DATABASE": "nowhere"}
    assert ids(check_database()) == ["django_pgtasks.E001"]


def test_manage_py_check_fails_on_misconfiguration(settings) -> None:
    settings.PGTASKS = {"DATABASE": "not_postgres", "CONCURENCY": 4}
    with pytest.raises(SystemCheckError) as excinfo:
        call_command("check", "--database", "default")
    assert "django_pgtasks.E002" in str(excinfo.value)
    assert "PGTASKS has an unknown key 'CONCURENCY'" in str(excinfo.value)


@pytest.mark.parametrize(
    ("pgtasks", "expected"),
    [
        ({"QUEUES": []}, "E004"),
        ({"QUEUES": ["default", "bad queue!"]}, "E005"),
        ({"QUEUES": ["emails"]}, "E006"),
        ({"DEFAULT_PRIORITY": 300}, "E007"),
        ({"BACKOFF": "fibonacci"}, "E008"),
        ({"CONCURRENCY": 0}, "E009"),
        ({"MAX_ATTEMPTS": "3"}, "E009"),
        ({"POLL_INTERVAL": 0}, "E010"),
        ({"SHUTDOWN_GRACE": -1}, "E010"),
        ({"CONTROLS_REFRESH": 0}, "E010"),
        ({"PREFETCH_HORIZON": -0.1}, "E010"),
        ({"PREFETCH": "fast"}, "E013"),
        ({"PREFETCH": -1}, "E013"),
        ({"TASK_MODULES": "mysite"}, "E024"),
        ({"TASK_MODULES": ["mysite", "shared jobs"]}, "E024"),
        ({"TASK_MODULES": ["mysite."]}, "E024"),
        ({"TASK_MODULES": [None]}, "E024"),
    ],
)
def test_invalid_settings_are_reported(settings, pgtasks: dict, expected: str) -> None:
    settings.PGTASKS = pgtasks
    assert f"django_pgtasks.{expected}" in ids(check_settings())


def test_task_modules_may_list_module_paths(settings) -> None:
    for value in ([], ["mysite"], ("mysite", "shared.jobs")):
        settings.PGTASKS = {"TASK_MODULES": value}
        assert check_settings() == []


def test_prefetch_may_be_auto_or_a_number(settings) -> None:
    for value in ("auto", 0, 40):
        settings.PGTASKS = {"PREFETCH": value}
        assert check_settings() == []


def test_queues_may_be_a_dict(settings) -> None:
    settings.PGTASKS = {"QUEUES": {"default": {}, "emails": {}}}
    assert check_settings() == []
    assert pgtasks_settings.queue_names == ["default", "emails"]


def test_settings_are_read_lazily_and_follow_overrides(settings) -> None:
    settings.PGTASKS = {"CONCURRENCY": 9}
    assert pgtasks_settings.CONCURRENCY == 9
    default_poll_interval = DEFAULTS["POLL_INTERVAL"]
    assert default_poll_interval == pgtasks_settings.POLL_INTERVAL
    with pytest.raises(AttributeError, match="Unknown django-pgtasks setting 'NOPE'"):
        _ = pgtasks_settings.NOPE


@pytest.mark.django_db
def test_a_concurrency_the_server_cannot_serve_is_a_warning(settings) -> None:
    from django.db import connection

    from django_pgtasks.checks import check_connection_budget

    assert check_connection_budget(databases=["default"]) == []  # the defaults fit
    settings.PGTASKS = {"CONCURRENCY": 200}
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        max_connections = int(cursor.fetchone()[0])
    assert max_connections < 202, "the test expects a server that cannot take 202 clients"
    [warning] = check_connection_budget(databases=["default"])
    assert warning.id == "django_pgtasks.W050"
    assert "CONCURRENCY'] = 200 threads needs up to 204 connections" in warning.msg
    assert f"max_connections {max_connections} minus" in warning.msg
    assert "'pool'" in warning.hint
    # Only `check --database` queries the server, like Django's own database checks.
    assert check_connection_budget(databases=None) == []


@pytest.mark.parametrize(("grace", "timeout"), [(60.0, 60.0), (90, 60.0)])
def test_a_shutdown_grace_as_long_as_the_worker_timeout_is_an_error(
    settings, grace: float, timeout: float
) -> None:
    from django_pgtasks.checks import check_shutdown_grace

    settings.PGTASKS = {"SHUTDOWN_GRACE": grace, "WORKER_TIMEOUT": timeout}
    [error] = check_shutdown_grace()
    assert error.id == "django_pgtasks.E015"
    assert error.msg.endswith(".")
    settings.PGTASKS = {"SHUTDOWN_GRACE": 59.9, "WORKER_TIMEOUT": 60.0}
    assert check_shutdown_grace() == []
    settings.PGTASKS = {"SHUTDOWN_GRACE": "soon"}  # E010's business
    assert check_shutdown_grace() == []
