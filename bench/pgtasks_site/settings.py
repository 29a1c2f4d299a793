"""Settings of the benchmark's django-pgtasks runs: every PGTASKS setting at its default.

Only the database name differs from a fresh project (the scratch database of bench/run.py,
``PGDATABASE`` or ``pgtasks_bench``). Command-line options of ``run_pgtasks`` (``--concurrency``,
``--prefetch``, ``--processes``) select the non-default configurations.

For experiments, ``BENCH_PGTASKS`` (a JSON object, e.g. ``'{"COMPLETION_WINDOW": 0}'``) is
merged over those defaults; bench/run.py never sets it.
"""

import json
import os

from django_pgtasks_dev import database_config

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_pgtasks", "bench.pgtasks_site"]
DATABASES = {"default": database_config("pgtasks_bench")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGTASKS = {"QUEUES": ["default"], **json.loads(os.environ.get("BENCH_PGTASKS", "{}"))}
