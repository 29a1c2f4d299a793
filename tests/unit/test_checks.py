"""The system checks of the settings (``checks.py``), and the settings object (``conf.py``).

Only the checks that read settings run here; those that ask the server (migrations, the
connection budget) are tested in ``tests/integration/test_checks.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_pgtasks.checks import (
    check_database,
    check_metrics,
    check_pooler,
    check_queue_databases,
    check_retention,
    check_settings,
    check_shutdown_grace,
)
from django_pgtasks.conf import DEFAULTS, pgtasks_settings

POOLED = {"POOLER": "transaction"}
TOKEN = "s3cr3t-Token_for.metrics~"


def ids(errors: list) -> list[str]:
    return [e.id for e in errors]


@pytest.fixture
def cursors_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task database's entry asks for no server-side cursors, as behind a pooler."""
    monkeypatch.setitem(django_settings.DATABASES["default"], "DISABLE_SERVER_SIDE_CURSORS",
                        True)


# -- the task database ------------------------------------------------------------------------


def test_defaults_pass(settings: Any) -> None:
    settings.PGTASKS = {}
    assert check_settings() == []
    assert check_database() == []
    assert check_retention() == []
    assert check_shutdown_grace() == []
    assert check_metrics() == []


def test_a_non_postgresql_database_is_a_clear_check_error(settings: Any) -> None:
    settings.PGTASKS = {"DATABASE": "not_postgres"}
    [error] = check_database()
    assert error.id == "django_pgtasks.E002"
    assert "uses the 'sqlite' backend; django-pgtasks needs PostgreSQL" in error.msg


def test_an_unknown_database_alias_is_a_check_error(settings: Any) -> None:
    settings.PGTASKS = {"DATABASE": "nowhere"}
    assert ids(check_database()) == ["django_pgtasks.E001"]


def test_a_queue_on_an_unknown_or_non_postgresql_database_is_a_check_error(
    settings: Any,
) -> None:
    settings.PGTASKS = {"QUEUES": {"default": {}, "a": {"database": "nowhere"},
                                   "b": {"database": "not_postgres"},
                                   "c": {"database": "not_postgres"}}}
    errors = check_queue_databases()
    assert len(errors) == 2  # the sqlite alias is reported once, for its first queue
    assert "nowhere" in errors[0].msg
    assert "'sqlite' backend; django-pgtasks needs PostgreSQL" in errors[1].msg


def test_manage_py_check_fails_on_misconfiguration(settings: Any) -> None:
    settings.PGTASKS = {"DATABASE": "not_postgres", "CONCURENCY": 4}
    with pytest.raises(SystemCheckError) as excinfo:
        call_command("check", "--database", "default")
    assert "django_pgtasks.E002" in str(excinfo.value)
    assert "PGTASKS has an unknown key 'CONCURENCY'" in str(excinfo.value)


# -- PGTASKS ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pgtasks", "expected"),
    [
        ({"QUEUES": []}, "E004"),
        ({"QUEUES": "default"}, "E004"),
        ({"QUEUES": ["default", "bad queue!"]}, "E005"),
        ({"QUEUES": ["default", 5]}, "E005"),
        ({"QUEUES": ["emails"]}, "E006"),
        ({"QUEUES": {"default": "queue_a"}}, "E014"),
        ({"DEFAULT_PRIORITY": 300}, "E007"),
        ({"DEFAULT_PRIORITY": -1}, "E007"),
        ({"BACKOFF": "fibonacci"}, "E008"),
        ({"CONCURRENCY": 0}, "E009"),
        ({"MAX_ATTEMPTS": "3"}, "E009"),
        ({"ERROR_TEXT_LIMIT": True}, "E009"),
        ({"MAX_PAYLOAD_DEPTH": 0}, "E009"),
        ({"POLL_INTERVAL": 0}, "E010"),
        ({"SHUTDOWN_GRACE": -1}, "E010"),
        ({"CONTROLS_REFRESH": 0}, "E010"),
        ({"PREFETCH_HORIZON": -0.1}, "E010"),
        ({"BACKOFF_JITTER": "0.25"}, "E010"),
        ({"SHUTDOWN_GRACE": float("nan")}, "E010"),
        ({"POLL_INTERVAL": float("inf")}, "E010"),
        ({"LIVENESS": "ping"}, "E011"),
        ({"LISTEN": "yes"}, "E012"),
        ({"AUTODISCOVER": 1}, "E012"),
        ({"PROCESSES": 0}, "E027"),
        ({"PROCESSES": "all"}, "E027"),
        ({"PROCESSES": "2"}, "E027"),
        ({"PROCESSES": True}, "E027"),
        ({"PREFETCH": "fast"}, "E013"),
        ({"PREFETCH": -1}, "E013"),
        ({"TASK_MODULES": "mysite"}, "E024"),
        ({"TASK_MODULES": ["mysite", "shared jobs"]}, "E024"),
        ({"TASK_MODULES": ["mysite."]}, "E024"),
        ({"TASK_MODULES": [None]}, "E024"),
        ({"CONCURENCY": 4}, "E003"),
        ({"TASK_LOG_LENGTH": 0}, "E009"),
        ({"TASK_LOG_LEVEL": "LOUD"}, "E026"),
        ({"TASK_LOG_LEVEL": True}, "E026"),
        ({"TASK_LOG_LEVEL": 20.5}, "E026"),
    ],
)
def test_invalid_settings_are_reported(settings: Any, pgtasks: dict, expected: str) -> None:
    settings.PGTASKS = pgtasks
    assert f"django_pgtasks.{expected}" in ids(check_settings())


@pytest.mark.parametrize("pgtasks", [
    {"MAX_RESULT_BYTES": 0}, {"MAX_RESULT_BYTES": "1MB"}, {"MAX_INTERRUPTIONS": 0},
    {"MAX_INTERRUPTIONS": 2.5}, {"MAX_INTERRUPTIONS": True},
])
def test_result_and_interruption_limits_must_be_positive_integers(settings, pgtasks) -> None:
    settings.PGTASKS = {**settings.PGTASKS, **pgtasks}
    [key] = pgtasks
    errors = [e for e in check_settings() if e.id == "django_pgtasks.E009"]
    assert [e.msg for e in errors] == [f"PGTASKS[{key!r}] must be a positive integer."]


def test_tracing_must_be_true_or_false(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "TRACING": "yes"}
    assert [e.id for e in check_settings()] == ["django_pgtasks.E012"]


def test_an_unknown_key_names_itself_and_suggests_a_misspelling(settings: Any) -> None:
    settings.PGTASKS = {"CONCURENCY": 4, "RETENTON": 1}
    errors = [e for e in check_settings() if e.id == "django_pgtasks.E003"]
    assert [e.msg for e in errors] == ["PGTASKS has an unknown key 'CONCURENCY'.",
                                       "PGTASKS has an unknown key 'RETENTON'."]
    assert "misspelt" in errors[0].hint


def test_task_modules_may_list_module_paths(settings: Any) -> None:
    for value in ([], ["mysite"], ("mysite", "shared.jobs")):
        settings.PGTASKS = {"TASK_MODULES": value}
        assert check_settings() == []


def test_processes_may_be_auto_or_a_number(settings: Any) -> None:
    for value in ("auto", 1, 16):
        settings.PGTASKS = {"PROCESSES": value}
        assert check_settings() == []


def test_prefetch_may_be_auto_or_a_number(settings: Any) -> None:
    for value in ("auto", 0, 40):
        settings.PGTASKS = {"PREFETCH": value}
        assert check_settings() == []


def test_queues_may_be_a_dict(settings: Any) -> None:
    settings.PGTASKS = {"QUEUES": {"default": {}, "emails": {}}}
    assert check_settings() == []
    assert pgtasks_settings.queue_names == ["default", "emails"]


@pytest.mark.parametrize(("key", "value"), [("RESCUE_GRACE", 3.9), ("WORKER_TIMEOUT", 1)])
def test_a_grace_shorter_than_two_heartbeats_is_a_warning(
    settings: Any, key: str, value: float,
) -> None:
    settings.PGTASKS = {"HEARTBEAT_INTERVAL": 2.0, key: value, "SHUTDOWN_GRACE": 0.5}
    [warning] = check_settings()
    assert warning.id == "django_pgtasks.W001"
    assert f"PGTASKS[{key!r}] ({value}s) is less than two heartbeat intervals" in warning.msg


def test_settings_are_read_lazily_and_follow_overrides(settings: Any) -> None:
    settings.PGTASKS = {"CONCURRENCY": 9}
    assert pgtasks_settings.CONCURRENCY == 9
    default_poll_interval = DEFAULTS["POLL_INTERVAL"]
    assert default_poll_interval == pgtasks_settings.POLL_INTERVAL
    with pytest.raises(AttributeError, match="Unknown django-pgtasks setting 'NOPE'"):
        _ = pgtasks_settings.NOPE


def test_private_names_are_not_settings() -> None:
    with pytest.raises(AttributeError, match="Unknown django-pgtasks setting '_secret'"):
        _ = pgtasks_settings._secret


# -- shutdown grace ---------------------------------------------------------------------------


@pytest.mark.parametrize(("grace", "timeout"), [(60.0, 60.0), (90, 60.0)])
def test_a_shutdown_grace_as_long_as_the_worker_timeout_is_an_error(
    settings: Any, grace: float, timeout: float
) -> None:
    settings.PGTASKS = {"SHUTDOWN_GRACE": grace, "WORKER_TIMEOUT": timeout}
    [error] = check_shutdown_grace()
    assert error.id == "django_pgtasks.E015"
    assert error.msg.endswith(".")
    settings.PGTASKS = {"SHUTDOWN_GRACE": 59.9, "WORKER_TIMEOUT": 60.0}
    assert check_shutdown_grace() == []
    settings.PGTASKS = {"SHUTDOWN_GRACE": "soon"}  # E010's business
    assert check_shutdown_grace() == []


# -- retention --------------------------------------------------------------------------------


@pytest.mark.parametrize(("pgtasks", "expected"), [
    ({"RETENTION": None, "FAILED_RETENTION": 0, "ARCHIVE_RETENTION": timedelta(days=1)}, []),
    ({"RETENTION": -1}, ["E020"]),
    ({"FAILED_RETENTION": timedelta(seconds=-1)}, ["E020"]),
    ({"ARCHIVE_RETENTION": "30d"}, ["E020"]),
    ({"RETENTION": True}, ["E020"]),
    ({"EVENT_RETENTION": -1}, ["E020"]),
    ({"EVENT_RETENTION": None}, []),
    ({"PURGE_INTERVAL": None}, []),
    ({"PURGE_INTERVAL": -5}, ["E010"]),
    ({"PURGE_BATCH": 0}, ["E009"]),
    ({"ARCHIVE": "yes"}, ["E012"]),
    ({"HISTORY_PERIOD": "fortnight"}, ["E021"]),
    ({"HISTORY_PERIOD": "week"}, []),
    ({"HISTORY_PREMAKE": 1}, ["E022"]),
    ({"HISTORY_PREMAKE": 1001}, ["E022"]),
    ({"PARTITION_INTERVAL": 0}, ["E023"]),
    ({"PARTITION_INTERVAL": 3601}, ["E023"]),
    ({"PARTITION_INTERVAL": 3600}, []),
])
def test_retention_settings_are_checked(
    settings: Any, pgtasks: dict, expected: list[str],
) -> None:
    settings.PGTASKS = pgtasks
    assert ids(check_retention()) == [f"django_pgtasks.{i}" for i in expected]


# -- poolers ----------------------------------------------------------------------------------


def test_the_defaults_and_a_complete_pooler_setup_pass(settings, cursors_disabled) -> None:
    settings.PGTASKS = {}
    assert check_pooler() == []
    settings.PGTASKS = {**POOLED, "LISTEN_DATABASE": "direct"}
    # An alias the check only looks up (connections are made from it lazily).
    django_settings.DATABASES["direct"] = dict(django_settings.DATABASES["default"])
    try:
        assert check_pooler() == []
    finally:
        del django_settings.DATABASES["direct"]
    settings.PGTASKS = {**POOLED, "LISTEN": False, "LIVENESS": "heartbeat"}
    assert check_pooler() == []


@pytest.mark.parametrize(("pgtasks", "expected", "words"), [
    ({"POOLER": "session"}, "E016", "use None"),
    ({"POOLER": True}, "E016", "'transaction'"),
    ({"LISTEN_DATABASE": "nowhere"}, "E017", "not an alias in DATABASES"),
    ({"LISTEN_DATABASE": "not_postgres"}, "E017", "'sqlite' backend"),
    ({"LISTEN_DATABASE": 3}, "E017", "a database alias, a dict"),
    ({"LISTEN_DATABASE": {"default": "nowhere"}}, "E017", "for the task database 'default'"),
    ({**POOLED, "LIVENESS": "advisory_lock"}, "E018", "proves nothing"),
    ({**POOLED, "LISTEN": True}, "E019", "loses its notifications"),
    ({**POOLED, "LISTEN_DATABASE": "default"}, "E019", "names the task database 'default'"),
    ({**POOLED, "LISTEN_DATABASE": "default", "LISTEN": False}, "W002", "workers do not"),
])
def test_contradictions_are_check_errors(settings, cursors_disabled, pgtasks: dict,
                                         expected: str, words: str) -> None:
    settings.PGTASKS = pgtasks
    found = [e for e in check_pooler() if e.id == f"django_pgtasks.{expected}"]
    assert found, check_pooler()
    assert words in found[0].msg


def test_server_side_cursors_behind_a_transaction_pooler_are_a_warning(settings) -> None:
    settings.PGTASKS = {**POOLED, "LISTEN": False}
    [warning] = check_pooler()
    assert warning.id == "django_pgtasks.W003"
    assert "DATABASES['default'] does not set DISABLE_SERVER_SIDE_CURSORS" in warning.msg


# -- the metrics view -------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "expected"), [
    ({"METRICS_TOKEN": TOKEN}, []),
    ({"METRICS_TOKEN": ["a-token", "b-token=="]}, []),
    ({"METRICS_PERMISSION": "django_pgtasks.view_task"}, []),
    ({"METRICS_TOKEN": ""}, ["E060"]),
    ({"METRICS_TOKEN": "has space"}, ["E060"]),
    ({"METRICS_TOKEN": []}, ["E060"]),
    ({"METRICS_TOKEN": ["ok", 42]}, ["E060"]),
    ({"METRICS_TOKEN": b"bytes"}, ["E060"]),
    ({"METRICS_PERMISSION": "view_task"}, ["E061"]),
    ({"METRICS_PERMISSION": True}, ["E061"]),
    ({"METRICS_TOKEN": 1, "METRICS_PERMISSION": "a.b.c"}, ["E060", "E061"]),
])
def test_metrics_settings_are_checked(settings, options: dict, expected: list[str]) -> None:
    settings.PGTASKS = {**settings.PGTASKS, **options}
    assert [e.id for e in check_metrics()] == [f"django_pgtasks.{i}" for i in expected]


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", 15, None])
def test_a_task_log_level_may_be_a_name_a_number_or_none(settings: Any, level: Any) -> None:
    settings.PGTASKS = {"TASK_LOG_LEVEL": level}
    assert "django_pgtasks.E026" not in ids(check_settings())
