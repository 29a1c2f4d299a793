"""The ``django.tasks`` backend: Django's Tasks API on the django-pgtasks queue.

::

    TASKS = {
        "default": {
            "BACKEND": "django_pgtasks.backend.PgTasksBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF": "exponential"},
        }
    }

A ``@task`` enqueued through this backend becomes one row of the ``pgtasks_task`` table that
``@pgtask`` handlers use, so one ``run_pgtasks`` worker, one admin and one set of operator
actions serve both APIs. The row's ``name`` is the task's module path and its ``metadata``
holds ``{"django_tasks": {"backend": <alias>}}``. A worker finds the function through
:func:`resolve`, which returns a handler only for a module path that imports to a
``django.tasks.Task``; that handler refuses to run any row this backend did not write.

How Django's values map onto the native ones:

- priority: native = Django + 100, so Django's -100..100 becomes 0..200, the order is kept
  and both defaults (0 and 100) meet;
- status: WAITING (a workflow step waiting for its parents), READY and AWAITING_RETRY →
  READY, RUNNING → RUNNING, SUCCESSFUL → SUCCESSFUL,
  FAILED and CANCELLED → FAILED;
- result id: the row's primary key as a decimal string; for a row on another database than
  ``PGTASKS["DATABASE"]`` (a queue with a ``"database"`` option), ``<pk>@<alias>``, since
  primary keys repeat across databases.

Workflows (chains, groups, dependencies) take ``@task`` calls as steps through
:mod:`django_pgtasks.backend.workflows`.

This module is imported with the first ``tasks.py`` that uses it, before the app registry is
ready: it imports models lazily and reads no setting at import time.
"""

from django_pgtasks.backend.backend import PgTasksBackend
from django_pgtasks.backend.errors import InvalidReturnValue, InvalidTaskArguments
from django_pgtasks.backend.handler import DjangoTaskHandler
from django_pgtasks.backend.options import Backoff, RetryableTask
from django_pgtasks.backend.resolver import handler_for, import_task, resolve

__all__ = [
    "Backoff", "DjangoTaskHandler", "InvalidReturnValue", "InvalidTaskArguments",
    "PgTasksBackend", "RetryableTask", "handler_for", "import_task", "resolve",
]
