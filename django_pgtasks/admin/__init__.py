"""The Django admin for tasks: a dashboard, the task list, and a few guarded actions.

The **dashboard** (``admin/django_pgtasks/task/dashboard/``) answers "what is stuck, what is
failing and why, is the queue keeping up" for each database that holds queues: per queue the
waiting and running tasks, the oldest waiting age and the last hour's throughput; counts per
task name and status; failed tasks grouped by error; stuck tasks; live workers; the most
recent workflows with their groups' callbacks; and a chart of the last 24 hours. Its numbers
come from :mod:`django_pgtasks.monitoring.dashboard`, whose queries are bounded by the rows
they report on, never by the size of the table.

The **task list** filters by status, queue, task name, error group and workflow, searches ids
and keys, and counts its rows only up to :data:`COUNT_LIMIT`. A task's page is read-only,
except its priority while it still waits to run; the page of a task of a workflow, or of one
that others wait for, shows the workflow, the tasks it waits for and those waiting for it.
Bulk actions retry, cancel or re-prioritize tasks after a confirmation page, and the
dashboard requeues a whole error group. The **events** sent to durable tasks are listed
(read-only, deletable).

Every change made here goes through the guarded statements the rest of the app uses
(``retry_now()``, ``cancel()``, ``set_priority()``). The admin never saves a whole task row: a
worker may be updating that row at the same moment, and a full ``save()`` would write back the
stale copy the page was built from.

With queues on several databases (:mod:`django_pgtasks.definition.routing`), every page takes a
``database`` query parameter naming the alias to show; it defaults to ``PGTASKS["DATABASE"]``.
"""

from django_pgtasks.admin import controls, events, index_entry, schedules, tasks
from django_pgtasks.admin.common import COUNT_LIMIT
from django_pgtasks.admin.filters import ErrorGroupFilter, NameFilter, QueueFilter, WorkflowFilter
from django_pgtasks.admin.schedules import ScheduleAdmin
from django_pgtasks.admin.tasks import TaskAdmin
from django_pgtasks.monitoring.dashboard import error_group_expression

__all__ = [
    "COUNT_LIMIT", "ErrorGroupFilter", "NameFilter", "QueueFilter", "ScheduleAdmin",
    "TaskAdmin", "WorkflowFilter", "controls", "error_group_expression", "events", "index_entry",
    "schedules", "tasks",
]
