"""Settings for the test suite: a real PostgreSQL database (see django_pgtasks_dev)."""

import importlib.util
import os
from pathlib import Path

from django_pgtasks_dev import database_config
from tests import second_server

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_pgtasks",
    "tests.testapp",
]

# DATABASE_URL, PG* variables or localhost:5432; without any server, an embedded one whose data
# lives in .pgdata/embedded of the checkout (see django_pgtasks_dev).
DATABASES = {
    "default": database_config(
        "pgtasks", embedded_dir=Path(__file__).resolve().parent.parent / ".pgdata" / "embedded"
    )
}
# Worker processes of the connection budget test share a pool of this many connections each
# (tests/chaos/test_connection_budget.py).
if os.environ.get("PGTASKS_TEST_POOL"):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1, "max_size": int(os.environ["PGTASKS_TEST_POOL"]), "timeout": 60}
# Only used to prove the system check that refuses a non-PostgreSQL task database.
DATABASES["not_postgres"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
# One test database per test run, so several runs (e.g. two Django versions) can share a server.
DATABASES["default"]["TEST"] = {
    "NAME": os.environ.get("PGTASKS_TEST_DB", f"test_pgtasks_{os.getpid()}")
}
# A second PostgreSQL server (tests/second_server.py), for the tests of queues spread over
# several databases (tests/process/test_multidb.py); absent when none can be had.
_second = second_server.database_config(DATABASES["default"]["TEST"]["NAME"])
if _second is not None:
    DATABASES["second"] = _second

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's tasks framework: django.tasks on Django 6+, the django-tasks backport on 5.2 (whose
# app registers its system checks). Without either, the backend's tests are skipped.
if importlib.util.find_spec("django.tasks"):
    TASKS_MODULE = "django.tasks"
else:
    TASKS_MODULE = "django_tasks"
    if importlib.util.find_spec("django_tasks"):
        INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_pgtasks.backend.PgTasksBackend",
        "QUEUES": ["default", "emails"],
    },
    # Django's own backend, for the contract tests (tests/integration/test_backend_contract.py).
    "immediate": {
        "BACKEND": f"{TASKS_MODULE}.backends.immediate.ImmediateBackend",
        "QUEUES": ["default", "emails"],
    },
}

PGTASKS = {
    "QUEUES": ["default", "emails", "urgent"],
    "POLL_INTERVAL": 0.1,
    "ERROR_PAUSE": 0.1,
    "BACKOFF_BASE": 0.0,
    # Fast liveness for tests: a killed worker's tasks come back within about 2 seconds. The
    # tests that terminate live workers' sessions give their workers a longer grace
    # (PGTASKS_TEST_RESCUE_GRACE, set by tests/chaos/conftest.py).
    "HEARTBEAT_INTERVAL": 0.25,
    "RESCUE_GRACE": float(os.environ.get("PGTASKS_TEST_RESCUE_GRACE", "1.0")),
    "RESCUE_INTERVAL": 0.25,
    # One worker process per run_pgtasks unless a test asks for more (--processes, or
    # PGTASKS_TEST_PROCESSES): what the tests signal, kill and count is that process.
    "PROCESSES": (lambda v: v if v == "auto" else int(v))(
        os.environ.get("PGTASKS_TEST_PROCESSES", "1")),
}

# The admin tests log users in by the hundred: a fast hasher, as Django's testing docs advise
# (the default PBKDF2 takes about 0.3 s per hash by design).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
