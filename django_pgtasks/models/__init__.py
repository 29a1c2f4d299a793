"""The tables of the queue: tasks and their archive, workers, schedules, queue controls,
dependencies between tasks.

Every state change of a task is a guarded statement of :mod:`django_pgtasks.lifecycle`,
called through the task manager (:mod:`.manager`); the named queries live in :mod:`.queries`.
Time that decides when a task may run always comes from the database clock (``now()``).
"""

from django_pgtasks.definition.status import CLAIM_ORDER, FINISHED, LIVE, PENDING, Status
from django_pgtasks.models.controls import MAX_RATE_LIMIT, KeyRateLimit, QueueControl
from django_pgtasks.models.dependencies import (
    Dependency,
    OnParentFailure,
    PendingRelease,
    WorkflowMember,
)
from django_pgtasks.models.events import MAX_EVENT_KEY, Event
from django_pgtasks.models.fields import TimestampArrayField
from django_pgtasks.models.manager import TaskManager
from django_pgtasks.models.queries import CancelResult, TaskQuerySet
from django_pgtasks.models.schedules import Schedule
from django_pgtasks.models.task import ArchivedTask, Dashboard, Task, TaskFields
from django_pgtasks.models.workers import WorkerProcess

__all__ = [
    "CLAIM_ORDER",
    "FINISHED",
    "LIVE",
    "MAX_EVENT_KEY",
    "MAX_RATE_LIMIT",
    "PENDING",
    "ArchivedTask",
    "CancelResult",
    "Dashboard",
    "Dependency",
    "Event",
    "KeyRateLimit",
    "OnParentFailure",
    "PendingRelease",
    "QueueControl",
    "Schedule",
    "Status",
    "Task",
    "TaskFields",
    "TaskManager",
    "TaskQuerySet",
    "TimestampArrayField",
    "WorkerProcess",
    "WorkflowMember",
]
