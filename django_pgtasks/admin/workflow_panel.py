"""The "Workflow" part of a task's page: its workflow, the tasks it waits for, the tasks that
wait for it (django_pgtasks.models.dependencies).

Shown only for a task that belongs to a workflow or has dependents. What it reads is
bounded: one member row, at most :data:`MAX_LISTED` edges each way (plus a count when there
are more), in at most five queries whatever the number of parents or children.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgtasks.admin.common import WORKFLOW_PARAM, _with_database
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.models import Dependency, OnParentFailure, Status, Task, WorkflowMember

#: Parents, and dependents, a task's page lists at most.
MAX_LISTED = 50
# Where a task's page keeps what it read about the task's workflow (one read per page).
_CACHE = "_pgtasks_workflow_links"


@dataclass(frozen=True)
class LinkedTask:
    """A parent or a dependent of a task."""

    id: int
    #: Empty for a parent that is gone (deleted or purged).
    name: str
    #: Its status now, or, for a parent that is gone, how it ended as its edge recorded it
    #: (``DELETED`` if it was deleted before it ended).
    status: str
    exists: bool = True
    #: For a dependent: its workflow.
    workflow_id: uuid.UUID | None = None


@dataclass(frozen=True)
class TaskLinks:
    """A task's place in the workflows: its member row, its parents and its dependents."""

    member: WorkflowMember | None
    parents: list[LinkedTask]
    parent_count: int
    dependents: list[LinkedTask]
    dependent_count: int


def task_links(task: Task) -> TaskLinks | None:
    """What a task's page shows of its workflow; ``None`` for a task that neither belongs to
    a workflow nor has dependents (then one query ran)."""
    using = task._state.db or pgtasks_settings.DATABASE
    member = WorkflowMember.objects.using(using).filter(task_id=task.pk).first()
    if member is None and not task.has_dependents:
        return None
    parents: list[LinkedTask] = []
    parent_count = 0
    if member is not None:
        # The unique index (child, parent) gives the first edges in parent id order (the
        # order the parents were enqueued in); each parent is then one primary key probe,
        # which also tells a parent that is gone.
        tasks = Task.objects.using(using).filter(pk=OuterRef("parent_id"))
        edges = list(
            Dependency.objects.using(using).filter(child_id=task.pk).order_by("parent_id")
            .annotate(name=Subquery(tasks.values("name")[:1]),
                      now=Subquery(tasks.values("status")[:1]))
            .values_list("parent_id", "name", "now", "parent_status")[: MAX_LISTED + 1]
        )
        parents = [
            LinkedTask(pk, name, now) if now is not None
            else LinkedTask(pk, "", ended or "DELETED", exists=False)
            for pk, name, now, ended in edges[:MAX_LISTED]
        ]
        parent_count = len(edges) if len(edges) <= MAX_LISTED else (
            Dependency.objects.using(using).filter(child_id=task.pk).count())
    dependents: list[LinkedTask] = []
    dependent_count = 0
    if task.has_dependents:
        # The first children by id, from the edges' parent index; then their rows.
        child_ids = (Dependency.objects.using(using).filter(parent_id=task.pk)
                     .order_by("child_id").values("child_id")[: MAX_LISTED + 1])
        rows = list(
            Task.objects.using(using).filter(pk__in=Subquery(child_ids)).order_by("id")
            .values_list("id", "name", "status", "workflow_member__workflow_id")
        )
        dependents = [LinkedTask(pk, name, status, workflow_id=workflow_id)
                      for pk, name, status, workflow_id in rows[:MAX_LISTED]]
        dependent_count = len(rows) if len(rows) <= MAX_LISTED else (
            Dependency.objects.using(using).filter(parent_id=task.pk).count())
    return TaskLinks(member, parents, parent_count, dependents, dependent_count)


def _status_label(value: str) -> str:
    labels = dict(Status.choices)
    return str(labels.get(value, _("Deleted") if value == "DELETED" else value))


class WorkflowFieldsMixin:
    """The read-only "Workflow" fieldset of :class:`~django_pgtasks.admin.tasks.TaskAdmin`."""

    workflow_fields = ("workflow", "workflow_parents", "workflow_dependents")

    def workflow_links(self, obj: Task) -> TaskLinks | None:
        """:func:`task_links`, read once per page (the fieldsets are asked for many times)."""
        if _CACHE not in obj.__dict__:
            obj.__dict__[_CACHE] = task_links(obj)
        return obj.__dict__[_CACHE]

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or obj.pk is None or self.workflow_links(obj) is None:
            return fieldsets
        # After what tells the task apart: for a waiting task, what it waits for is the
        # first thing to know.
        return (fieldsets[0], (_("Workflow"), {"fields": self.workflow_fields}),
                *fieldsets[1:])

    def workflow_list_url(self, workflow_id: uuid.UUID, database: str) -> str:
        url = f"{self.url('changelist')}?{urlencode({WORKFLOW_PARAM: workflow_id})}"
        return _with_database(url, database)

    def _task_url(self, pk: int, database: str) -> str:
        return _with_database(self.url("change", pk), database)

    @staticmethod
    def _database(obj: Task) -> str:
        return obj._state.db or str(pgtasks_settings.DATABASE)

    def _empty(self) -> str:
        return self.get_empty_value_display()

    @admin.display(description=_("workflow"))
    def workflow(self, obj: Task) -> SafeString | str:
        links = self.workflow_links(obj)
        if links is None or links.member is None:
            return self._empty()
        member = links.member
        database = self._database(obj)
        head = format_html('<a href="{}" class="pgtasks-workflow">{}</a>',
                           self.workflow_list_url(member.workflow_id, database),
                           member.workflow_id)
        n = links.parent_count
        if not n:
            return format_html("{}<br>{}", head, _("No parents: it waits for nothing."))
        if member.remaining > 0:
            waiting = ngettext("Waiting for %(k)d of %(n)d parent.",
                               "Waiting for %(k)d of %(n)d parents.", n) % {
                "k": member.remaining, "n": n}
        else:
            waiting = ngettext("Its parent has ended.", "All %(n)d parents have ended.", n) % {
                "n": n}
        policy = dict(OnParentFailure.choices).get(member.on_parent_failure,
                                                   member.on_parent_failure)
        return format_html(
            '{}<br><span class="pgtasks-remaining" data-remaining="{}" data-parents="{}">{}'
            "</span><br>{}",
            head, member.remaining, n, waiting,
            format_html(_("If a parent does not succeed: {}."), policy))

    def _task_list(self, obj: Task, tasks: list[LinkedTask], count: int, kind: str,
                   more_url: str | None) -> SafeString | str:
        if not tasks:
            return self._empty()
        database = self._database(obj)
        items = format_html_join(
            "", '<li data-task="{}" data-status="{}">{}</li>',
            ((task.id, task.status, self._task_item(task, database)) for task in tasks))
        more = ""
        if count > len(tasks):
            text = _("and %(n)d more") % {"n": count - len(tasks)}
            more = (format_html('<li class="more"><a href="{}">{}</a></li>', more_url, text)
                    if more_url else format_html('<li class="more">{}</li>', text))
        return format_html('<ul class="pgtasks-{}">{}{}</ul>', kind, items, more)

    def _task_item(self, task: LinkedTask, database: str) -> SafeString:
        if not task.exists:
            return format_html(_("task #{} (no longer in the table) — ended {}"), task.id,
                               _status_label(task.status))
        return format_html('<a href="{}">{} #{}</a> — {}', self._task_url(task.id, database),
                           task.name, task.id, _status_label(task.status))

    @admin.display(description=_("waits for"))
    def workflow_parents(self, obj: Task) -> SafeString | str:
        links = self.workflow_links(obj)
        if links is None:
            return self._empty()
        more_url = (self.workflow_list_url(links.member.workflow_id, self._database(obj))
                    if links.member else None)
        return self._task_list(obj, links.parents, links.parent_count, "parents", more_url)

    @admin.display(description=_("tasks waiting for it"))
    def workflow_dependents(self, obj: Task) -> SafeString | str:
        links = self.workflow_links(obj)
        if links is None:
            return self._empty()
        # The rest are found in the workflow of the dependents listed, when they share one
        # (else in the task's own).
        workflows = {task.workflow_id for task in links.dependents} - {None}
        if len(workflows) == 1:
            [workflow_id] = workflows
        else:
            workflow_id = links.member.workflow_id if links.member else None
        more_url = (self.workflow_list_url(workflow_id, self._database(obj))
                    if workflow_id else None)
        return self._task_list(obj, links.dependents, links.dependent_count, "dependents",
                               more_url)
