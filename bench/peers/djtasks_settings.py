"""Settings for django-tasks-db (Django's tasks framework, database backend) in the benchmark.

On Django 5.2 the tasks framework is the ``django-tasks`` backport; the database backend is the
``django-tasks-db`` package and its worker is ``manage.py db_worker``.

``CONN_MAX_AGE = None`` keeps the worker's connection open: ``db_worker`` calls
``close_old_connections()`` around every task, which with Django's default (0) would open a new
PostgreSQL session for every task. Persistent connections are its fastest setting.
"""

import os

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("PGDATABASE", "pgtasks_bench"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "localhost"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "CONN_MAX_AGE": None,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
