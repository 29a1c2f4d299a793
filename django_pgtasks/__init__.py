"""django-pgtasks: a task queue for Django on PostgreSQL (SELECT ... FOR UPDATE SKIP LOCKED).

Public API::

    from django_pgtasks import pgtask, FatalError
    from django_pgtasks.models import Task

    @pgtask(queue="emails", max_attempts=5)
    def send_welcome(user_id): ...

    Task.objects.enqueue(send_welcome, 42)   # or send_welcome.enqueue(42)
"""

from django_pgtasks.definition.registry import TaskContext, TaskHandler, add_resolver, pgtask
from django_pgtasks.exceptions import (
    EventTimeout,
    FatalError,
    InvalidEventError,
    InvalidPayloadError,
    InvalidTaskError,
    LeaseLostError,
    PgTasksError,
    Snooze,
    StepError,
    Suspend,
    TaskCancelled,
    TaskWaitTimeout,
    UnknownQueueError,
    UnknownTaskError,
)

__version__ = "0.1.0"

__all__ = [
    "EventTimeout",
    "FatalError",
    "InvalidEventError",
    "InvalidPayloadError",
    "InvalidTaskError",
    "LeaseLostError",
    "PgTasksError",
    "Snooze",
    "StepError",
    "Suspend",
    "TaskCancelled",
    "TaskContext",
    "TaskHandler",
    "TaskWaitTimeout",
    "UnknownQueueError",
    "UnknownTaskError",
    "add_resolver",
    "pgtask",
]
