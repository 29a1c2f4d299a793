"""The one place that knows where Django's tasks framework lives.

Django 6.0 and later ship it as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
(``pip install "django-pgtasks[backport]"``, version 0.12 or later) provides the same API as
``django_tasks``. Only :mod:`django_pgtasks.backend` and the tests import this module, so the
rest of django-pgtasks works without either.
"""

from __future__ import annotations

import django

if django.VERSION >= (6, 0):
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started

    TASKS_MODULE = "django.tasks"
else:
    try:
        from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            DEFAULT_TASK_PRIORITY,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
            task,
        )
        from django_tasks.exceptions import (
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django_tasks.signals import task_enqueued, task_finished, task_started
    except ImportError as exc:
        raise ImportError(
            f"The django.tasks backend of django-pgtasks needs Django 6.0 or later, or the "
            f"django-tasks backport 0.12 or later on Django {django.get_version()} "
            f'(pip install "django-pgtasks[backport]"): {exc}'
        ) from exc

    TASKS_MODULE = "django_tasks"

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "TASKS_MODULE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
