"""The Django admin for tasks: a dashboard, the task list, and a few guarded actions.

The **dashboard** (``admin/django_pgtasks/task/dashboard/``) answers "what is stuck, what is
failing and why, is the queue keeping up" for each database that holds queues: per queue the
waiting and running tasks, the oldest waiting age and the last hour's throughput; counts per
task name and status; failed tasks grouped by error; stuck tasks; live workers; and a chart of
the last 24 hours. Its numbers come from :mod:`django_pgtasks.monitoring.dashboard`, whose queries
are
bounded by the rows they report on, never by the size of the table.

The **task list** filters by status, queue, task name and error group, searches ids and keys,
and counts its rows only up to :data:`COUNT_LIMIT`. A task's page is read-only, except its
priority while it still waits to run. Bulk actions retry, cancel or re-prioritize tasks after
a confirmation page, and the dashboard requeues a whole error group.

Every change made here goes through the guarded statements the rest of the app uses
(``retry_now()``, ``cancel()``, ``set_priority()``). The admin never saves a whole task row: a
worker may be updating that row at the same moment, and a full ``save()`` would write back the
stale copy the page was built from.

With queues on several databases (:mod:`django_pgtasks.base.routing`), every page takes a
``database`` query parameter naming the alias to show; it defaults to ``PGTASKS["DATABASE"]``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl

import django
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import admin_urlname
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Case, Count, OuterRef, Subquery, Value, When
from django.db.models import Field as ModelField
from django.forms import Field as FormField
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgtasks.base import routing
from django_pgtasks.base.registry import registered_names
from django_pgtasks.base.validation import PRIORITY_MAX, PRIORITY_MIN
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.models import (
    FINISHED,
    PENDING,
    ArchivedTask,
    Schedule,
    Status,
    Task,
    TaskQuerySet,
)
from django_pgtasks.monitoring import dashboard
from django_pgtasks.monitoring.dashboard import ERROR_GROUP_LENGTH, error_group_expression

#: Rows the task list counts at most. Beyond it the list says "more than 10,000" instead of
#: counting every matching row of a table that may hold millions on each page view.
COUNT_LIMIT = 10_000
#: Newest tasks the name filter reads for names beyond the registered handlers.
NAME_FILTER_SAMPLE = 2_000
#: Names the name filter offers at most.
NAME_FILTER_MAX = 100
#: Query-string parameter of the status filter (Django's filter for a field with choices).
STATUS_PARAM = "status__exact"
#: Query-string parameter naming the database alias a page shows.
DATABASE_PARAM = "database"

# A numeric search term is also looked up as a task id. Eighteen digits always fit a bigint.
_TASK_ID_RE = re.compile(r"[0-9]{1,18}")
# Set on a task when the admin refused to change it, so that neither the history nor the
# messages claim a change that did not happen.
_REFUSED = "_pgtasks_change_refused"

__all__ = [
    "COUNT_LIMIT", "ErrorGroupFilter", "NameFilter", "QueueFilter", "ScheduleAdmin",
    "TaskAdmin", "error_group_expression",
]


def selected_database(request: HttpRequest) -> str:
    """The database alias a request is about: its ``database`` parameter, else the one kept
    in the list's preserved filters (on a task's page), else ``PGTASKS["DATABASE"]``.

    Only aliases that hold queues (:func:`routing.queue_databases`) are accepted.
    """
    value = request.GET.get(DATABASE_PARAM) or request.POST.get(DATABASE_PARAM)
    if not value:
        preserved = request.GET.get("_changelist_filters", "")
        value = dict(parse_qsl(preserved)).get(DATABASE_PARAM)
    if not value:
        return str(pgtasks_settings.DATABASE)
    if value not in routing.queue_databases():
        raise Http404(f"No task database {value[:100]!r}.")
    return value


def _with_database(url: str, database: str) -> str:
    """``url`` with the ``database`` parameter, unless it is the default database."""
    if database == pgtasks_settings.DATABASE:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode({DATABASE_PARAM: database})}"


# -- list filters ------------------------------------------------------------------------


def _checked_param(value: str, max_length: int) -> str:
    """Reject a filter value longer than any value it could match.

    The value is always a bound parameter, never part of the SQL text; NUL characters never
    get this far (see :meth:`TaskAdmin.lookup_allowed`).
    """
    if len(value) > max_length:
        raise IncorrectLookupParameters(_("Invalid filter value."))
    return value


def _max_length(field_name: str) -> int:
    return Task._meta.get_field(field_name).max_length


# -- list filters ------------------------------------------------------------------------


class QueueFilter(admin.SimpleListFilter):
    """The configured queues: offered without reading the task table."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        names = pgtasks_settings.queue_names
        value = self.value()
        if value and value not in names:
            names = [*names, value]  # a queue no longer configured may still hold tasks
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(queue=_checked_param(value, _max_length("queue")))


class NameFilter(admin.SimpleListFilter):
    """Registered handlers plus the names among the newest tasks.

    ``SELECT DISTINCT name`` over the whole table would read every row on each changelist
    view; :meth:`recent_names` reads only the newest :data:`NAME_FILTER_SAMPLE` tasks. Older
    names can still be reached through the summary or a search.
    """

    title = _("task name")
    parameter_name = "name"

    @staticmethod
    def recent_names(tasks: TaskQuerySet) -> TaskQuerySet:
        """Distinct names among the newest :data:`NAME_FILTER_SAMPLE` of ``tasks``.

        The bound is an id range (``id >=`` the sample's oldest id), read from the primary
        key index. The oldest id is looked up first, so that the planner sees the actual
        (short) range: as a subquery it would be planned as a third of the table, and
        ``id IN (newest ids)`` as a hash join over a sequential scan of the whole table.
        """
        tasks = tasks.order_by()
        oldest_in_sample = list(tasks.order_by("-id").values_list("id", flat=True)[
            NAME_FILTER_SAMPLE - 1 : NAME_FILTER_SAMPLE
        ])
        return (
            tasks.filter(id__gte=oldest_in_sample[0] if oldest_in_sample else 0)
            .values_list("name", flat=True)
            .distinct()
        )

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        recent = self.recent_names(model_admin.get_queryset(request))
        names = sorted({*registered_names(), *recent})[:NAME_FILTER_MAX]
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(name=_checked_param(value, _max_length("name")))


class ErrorGroupFilter(admin.SimpleListFilter):
    """Tasks whose first error line, ids blanked out, equals the value.

    Reached from the summary's error groups; shown in the sidebar only while active, since
    there is nothing useful to list before a group is chosen.
    """

    title = _("error group")
    parameter_name = "error_group"
    template = "admin/django_pgtasks/task/error_group_filter.html"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, Truncator(value).chars(60))] if value else []

    def has_output(self) -> bool:
        # Django applies only the filters that have output; this one must apply even though
        # it offers no choices until a group is selected (its template then renders nothing).
        return True

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        value = _checked_param(value, ERROR_GROUP_LENGTH)
        return queryset.alias(error_group=error_group_expression()).filter(error_group=value)



# -- the task list -------------------------------------------------------------------------


class BoundedCountPaginator(Paginator):
    """Counts at most :data:`COUNT_LIMIT` rows (``SELECT count(*) FROM (… LIMIT n)``).

    ``capped`` tells that more rows match; the list then says "more than" the limit, and its
    last page is the last one within the limit. On the first page, the page's rows are read
    first: when they are all there is (a search, a small error group), that is the count,
    and no counting query runs at all.
    """

    capped = False

    def __init__(self, *args: Any, first_page: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_page = first_page
        #: The whole result, when it fit on the first page.
        self.whole_result: list[Task] | None = None

    @cached_property
    def count(self) -> int:
        if self.first_page:
            head = list(self.object_list[: self.per_page + 1])
            if len(head) <= self.per_page:
                self.whole_result = head
                return len(head)
        counted = self.object_list.order_by()[: COUNT_LIMIT + 1].count()
        self.capped = counted > COUNT_LIMIT
        return min(counted, COUNT_LIMIT)


class TaskChangeList(ChangeList):
    """The stock change list, plus the ``database`` parameter, which is not a filter."""

    def get_filters_params(self, params: Any = None) -> Any:
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(DATABASE_PARAM, None)
        return lookup_params

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_count_capped = getattr(self.paginator, "capped", False)
        self.count_limit = COUNT_LIMIT
        whole = getattr(self.paginator, "whole_result", None)
        if whole is not None and not self.multi_page:
            self.result_list = whole  # already read: do not query again


def status_counts(queryset: TaskQuerySet) -> Counter[str]:
    """Tasks of ``queryset`` per status (one aggregate query)."""
    rows = queryset.order_by().values_list("status").annotate(n=Count("id"))
    return Counter(dict(rows))


def _status_labels(counts: Counter[str]) -> list[tuple[str, int]]:
    """(label, count) per status, in the order of :class:`Status`."""
    labels = dict(Status.choices)
    return [(str(labels.get(status, status)), counts[status])
            for status in [*Status.values, *sorted(set(counts) - set(Status.values))]
            if counts.get(status)]


def bulk_change_message(
    verb: str, before: Counter[str], changed: int, reasons: dict[str, str],
    leftover: str | None = None,
) -> tuple[str, int]:
    """"<verb>: N changed, M skipped (k running, j already finished)." and its level.

    ``before`` counts the selection per status before the update; ``reasons`` says why the
    update leaves tasks of a status alone. Skipped tasks no status explains get ``leftover``
    (by default: changed meanwhile, or a deduplication key another live task holds).
    """
    selected = sum(before.values())
    skipped = max(selected - changed, 0)
    explained: Counter[str] = Counter()
    budget = skipped
    for status, reason in reasons.items():
        n = min(before.get(status, 0), budget)
        if n:
            explained[str(reason)] += n
            budget -= n
    if budget:
        explained[str(leftover or _("key held by another live task, or changed meanwhile"))] += (
            budget)
    message = _("%(verb)s: %(changed)d changed, %(skipped)d skipped") % {
        "verb": verb, "changed": changed, "skipped": skipped}
    if explained:
        message += " (" + ", ".join(f"{n} {reason}" for reason, n in explained.items()) + ")"
    return message + ".", messages.SUCCESS if not skipped else messages.WARNING


def _since_param(value: str) -> datetime | None:
    """An aware ISO datetime (the dashboard's window start), or ``None`` for "any time"."""
    if not value:
        return None
    try:
        since = datetime.fromisoformat(value)
    except ValueError:
        raise Http404("Invalid time.") from None
    if since.tzinfo is None:
        raise Http404("Invalid time.")
    return since


def _hours_param(request: HttpRequest) -> int:
    """The dashboard's window (``?hours=``), 24 unless a whole number in range is given."""
    try:
        hours = int(request.GET.get("hours", 24))
    except ValueError:
        return 24
    return hours if 1 <= hours <= dashboard.MAX_HOURS else 24


class DashboardSection:
    """One database's snapshot, with the links the dashboard template shows."""

    def __init__(self, model_admin: TaskAdmin, request: HttpRequest,
                 snapshot: dashboard.DatabaseSnapshot) -> None:
        self.admin = model_admin
        self.snapshot = snapshot
        self.database = snapshot.database
        self.can_change = model_admin.has_change_permission(request)

    def list_url(self, **params: Any) -> str:
        if self.database != pgtasks_settings.DATABASE:
            params[DATABASE_PARAM] = self.database
        return f"{self.admin.url('changelist')}?{urlencode(params)}"

    @cached_property
    def chart(self) -> SafeString:
        return dashboard.chart_svg(
            self.snapshot.chart,
            title=str(_("Tasks per hour over the last 24 hours, database %(db)s")
                      % {"db": self.database}),
        )

    @cached_property
    def queues(self) -> list[dict[str, Any]]:
        return [{"row": row, "url": self.list_url(queue=row.queue)}
                for row in self.snapshot.queues]

    @cached_property
    def status_columns(self) -> list[dict[str, Any]]:
        live = set(self.snapshot.live_statuses)
        return [{"value": value, "label": label, "live": value in live,
                 "url": self.list_url(**{STATUS_PARAM: value})}
                for value, label in Status.choices]

    @cached_property
    def names(self) -> list[dict[str, Any]]:
        since = self.snapshot.since.isoformat()
        rows = []
        for row in self.snapshot.names:
            cells = []
            for column in self.status_columns:
                params = {"name": row.name, STATUS_PARAM: column["value"]}
                if not column["live"]:
                    params["finished_at__gte"] = since
                cells.append({"count": row.counts.get(column["value"], 0),
                              "url": self.list_url(**params)})
            rows.append({"name": row.name, "url": self.list_url(name=row.name),
                         "cells": cells, "total": row.total})
        return rows

    @cached_property
    def error_groups(self) -> list[dict[str, Any]]:
        requeue = self.admin.url("requeue_group")
        since, database = self.snapshot.since, self.database
        return [
            {"group": group,
             "url": self.admin._group_list_url(group.text, database, since),
             "requeue_url": f"{requeue}?"
                            f"{urlencode(self.admin._requeue_params(group.text, database, since))}"}
            for group in self.snapshot.error_groups
        ]

    @cached_property
    def stuck(self) -> list[dict[str, Any]]:
        return [{"task": task,
                 "url": _with_database(self.admin.url("change", task.id), self.database)}
                for task in self.snapshot.stuck]

    @cached_property
    def estimates(self) -> list[tuple[str, int]]:
        by_status = self.snapshot.estimate.by_status
        return [(label, by_status[value]) for value, label in Status.choices
                if value in by_status]


# -- action forms ------------------------------------------------------------------------


class PriorityForm(forms.Form):
    priority = forms.IntegerField(
        label=_("New priority"),
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text=_("From 0 to 200; higher runs first."),
    )


def _confirmed(request: HttpRequest) -> bool:
    """Whether this POST comes from an action's confirmation page (``delete_selected`` style)."""
    return request.POST.get("post") == "yes"


# -- the model admin ---------------------------------------------------------------------


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = (
        "id", "name", "queue", "status", "priority", "attempts", "run_after", "finished_at",
        "locked_by", "payload_summary", "error_summary",
    )
    list_filter = ("status", QueueFilter, NameFilter, ErrorGroupFilter)
    search_fields = ("key__exact",)
    search_help_text = _("A task id, or an exact deduplication key.")
    ordering = ("-id",)
    list_per_page = 50
    paginator = BoundedCountPaginator
    # Both would add counting queries over the whole table to every changelist view.
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ("retry_now_selected", "cancel_selected", "change_priority_selected")
    action_confirmation_template = "admin/django_pgtasks/task/action_confirmation.html"
    dashboard_template = "admin/django_pgtasks/task/dashboard.html"
    requeue_group_template = "admin/django_pgtasks/task/requeue_group.html"

    fieldsets = (
        (None, {"fields": ("id", "name", "queue", "status", "priority", "key", "stage")}),
        (_("Attempts"), {"fields": (
            "attempt", "max_attempts", "run_after", "locked_by", "locked_at", "started_at",
            "finished_at",
        )}),
        (_("Data"), {"fields": ("args_json", "kwargs_json", "result_json", "metadata_json")}),
        (_("Error"), {"fields": ("error_text_full",)}),
        (_("Record"), {"fields": ("created_at", "updated_at")}),
    )

    # -- changelist ----------------------------------------------------------------------

    @admin.display(description=_("attempts"), ordering="attempt")
    def attempts(self, obj: Task) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description=_("error"))
    def error_summary(self, obj: Task) -> str:
        return Truncator(obj.error_text.partition("\n")[0]).chars(80)

    @admin.display(description=_("arguments"))
    def payload_summary(self, obj: Task) -> str:
        """The call's arguments as compact JSON, cut short; the task's page shows them all."""
        args = ", ".join(json.dumps(a, ensure_ascii=False) for a in obj.args)
        kwargs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                           for k, v in obj.kwargs.items())
        return Truncator(", ".join(p for p in (args, kwargs) if p)).chars(60)

    def get_queryset(self, request: HttpRequest) -> TaskQuerySet:
        return super().get_queryset(request).using(selected_database(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    def get_paginator(
        self, request: HttpRequest, queryset: TaskQuerySet, per_page: int, orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        first_page = request.GET.get("p", "1") == "1" and "all" not in request.GET
        return self.paginator(queryset, per_page, orphans, allow_empty_first_page,
                              first_page=first_page)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        # Within one task name, the tasks that needed the most attempts come first: that is
        # where a problem shows.
        if request.GET.get(NameFilter.parameter_name):
            return ("-attempt", "-id")
        return self.ordering

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        database = selected_database(request)
        context = {
            "dashboard_url": _with_database(self.url("dashboard"), database),
            "task_database": database,
            "task_databases": routing.queue_databases(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def url(self, name: str, *args: Any) -> str:
        return reverse(admin_urlname(self.opts, name), args=args,
                       current_app=self.admin_site.name)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # PostgreSQL answers a NUL character in a text parameter with an error, not an empty
        # result: refuse such filter values up front (a 400) instead of failing with a 500.
        if "\x00" in str(value):
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(
        self, request: HttpRequest, queryset: TaskQuerySet, search_term: str
    ) -> tuple[TaskQuerySet, bool]:
        term = search_term.strip()
        if _TASK_ID_RE.fullmatch(term):
            # A number is a task id: one primary-key lookup. Keys are searched for any other
            # term (a numeric key is found with the deduplication key filter of a URL:
            # ?key=123).
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, term)

    # -- detail page ---------------------------------------------------------------------

    @admin.display(description=_("positional arguments"))
    def args_json(self, obj: Task) -> SafeString:
        return _pretty_json(obj.args)

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, obj: Task) -> SafeString:
        return _pretty_json(obj.kwargs)

    @admin.display(description=_("result"))
    def result_json(self, obj: Task) -> SafeString:
        return _pretty_json(obj.result)

    @admin.display(description=_("metadata"))
    def metadata_json(self, obj: Task) -> SafeString:
        return _pretty_json(obj.metadata)

    @admin.display(description=_("error"))
    def error_text_full(self, obj: Task) -> SafeString | str:
        if not obj.error_text:
            return self.get_empty_value_display()
        return format_html("<pre>{}</pre>", obj.error_text)

    @staticmethod
    def priority_editable(obj: Task | None) -> bool:
        """Priority matters only to a task that still waits to be claimed."""
        return obj is not None and obj.status in PENDING

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> list[str]:
        fields = flatten_fieldsets(self.get_fieldsets(request, obj))
        if self.priority_editable(obj):
            fields.remove("priority")
        return fields

    def formfield_for_dbfield(
        self, db_field: ModelField, request: HttpRequest, **kwargs: Any
    ) -> FormField | None:
        if db_field.name == "priority":
            # The range as a form error, rather than a failed CHECK constraint.
            kwargs.update(min_value=PRIORITY_MIN, max_value=PRIORITY_MAX)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], add: bool = False,
        change: bool = False, form_url: str = "", obj: Task | None = None,
    ) -> HttpResponse:
        if not self.priority_editable(obj):
            # Nothing on the page can be changed: offer no save buttons.
            context.update(show_save=False, show_save_and_continue=False)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def save_model(self, request: HttpRequest, obj: Task, form: forms.ModelForm,
                   change: bool) -> None:
        # Never obj.save() (see the module docstring): the priority is the only thing this
        # page changes, through the guarded update that leaves a claimed task alone.
        if "priority" in form.changed_data:
            tasks = self.model.objects.using(selected_database(request)).filter(pk=obj.pk)
            refused = not tasks.set_priority(obj.priority)
        else:
            # The page offered a priority field but the task had left the waiting states by
            # the time the form came back, so the form no longer includes it.
            refused = "priority" in request.POST and "priority" not in form.fields
        if refused:
            setattr(obj, _REFUSED, True)
            self.message_user(
                request,
                _("The task “%(task)s” is no longer waiting to run, so its priority was "
                  "not changed.") % {"task": obj},
                messages.WARNING,
            )

    def log_change(self, request: HttpRequest, obj: Task, message: Any) -> Any:
        if getattr(obj, _REFUSED, False):
            return None
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Task) -> HttpResponse:
        if getattr(obj, _REFUSED, False):
            # Back to the task's page, which now shows its current state and the warning.
            return HttpResponseRedirect(request.get_full_path())
        return super().response_change(request, obj)

    # -- permissions ---------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Tasks are created by code (enqueue), which validates them; never by hand.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # Only finished tasks may be deleted, one at a time from their own page. Without an
        # object the answer is no, which also withdraws Django's "delete selected" action:
        # it would delete running and waiting tasks along with finished ones.
        if obj is None or not obj.is_finished:
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        # Guarded like every other change: a task retried since the page was shown stays.
        self.model.objects.using(selected_database(request)).filter(pk=obj.pk).finished().delete()

    def delete_queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> None:
        # No stock action reaches this (see has_delete_permission); guarded all the same for
        # subclasses that add a bulk delete.
        queryset.finished().delete()

    # -- actions -------------------------------------------------------------------------

    @admin.action(description=_("Retry selected tasks now"), permissions=["change"])
    def retry_now_selected(
        self, request: HttpRequest, queryset: TaskQuerySet
    ) -> TemplateResponse | None:
        if not _confirmed(request):
            return self.render_action_confirmation(
                request, queryset, "retry_now_selected", title=_("Retry tasks now"),
                explanation=_(
                    "Failed, cancelled and waiting tasks become due at once; a task whose "
                    "attempts are used up gets one more. Running and successful tasks are "
                    "skipped, and so is a finished task whose deduplication key another "
                    "waiting or running task holds now."
                ),
            )
        before = status_counts(queryset)
        changed = queryset.retry_now()
        self.report_bulk_change(
            request, _("Retry now"), before, changed,
            {Status.RUNNING: _("running"), Status.SUCCESSFUL: _("successful")},
        )
        return None

    @admin.action(description=_("Cancel selected tasks"), permissions=["change"])
    def cancel_selected(
        self, request: HttpRequest, queryset: TaskQuerySet
    ) -> TemplateResponse | None:
        if not _confirmed(request):
            return self.render_action_confirmation(
                request, queryset, "cancel_selected", title=_("Cancel tasks"),
                explanation=_(
                    "Tasks that have not started (ready or awaiting retry) are cancelled and "
                    "will not run. Running tasks are asked to stop: their handler sees the "
                    "request and the task ends cancelled when it stops (a handler that "
                    "finishes its work anyway ends successful). Finished tasks are skipped."
                ),
            )
        before = status_counts(queryset)
        outcome = queryset.cancel()
        message, level = bulk_change_message(
            _("Cancel"), before, outcome.cancelled + outcome.stopping,
            {status: _("already finished") for status in FINISHED},
            leftover=_("changed meanwhile"),
        )
        if outcome.stopping:
            message += " " + ngettext(
                "%(count)d running task was asked to stop.",
                "%(count)d running tasks were asked to stop.",
                outcome.stopping,
            ) % {"count": outcome.stopping}
        self.message_user(request, message, level)
        return None

    @admin.action(description=_("Change priority of selected tasks"), permissions=["change"])
    def change_priority_selected(
        self, request: HttpRequest, queryset: TaskQuerySet
    ) -> TemplateResponse | None:
        # Unbound on the way in from the changelist; bound (and validated) once submitted.
        form = PriorityForm(request.POST if _confirmed(request) else None)
        if not form.is_valid():
            return self.render_action_confirmation(
                request, queryset, "change_priority_selected", title=_("Change priority"),
                explanation=_(
                    "Only waiting tasks (ready or awaiting retry) change; the new priority "
                    "applies from their next claim. Running and finished tasks are skipped."
                ),
                form=form,
            )
        priority = form.cleaned_data["priority"]
        before = status_counts(queryset)
        changed = queryset.set_priority(priority)
        self.report_bulk_change(
            request, _("Priority %(priority)d") % {"priority": priority}, before, changed,
            {Status.RUNNING: _("running"),
             **{status: _("already finished") for status in FINISHED}},
        )
        return None

    def render_action_confirmation(
        self, request: HttpRequest, queryset: TaskQuerySet, action: str, *, title: str,
        explanation: str, form: forms.Form | None = None,
    ) -> TemplateResponse:
        """The intermediate page of a bulk action: what will happen, to how many tasks.

        It posts the selection back as the changelist did (the same URL, so the same filters;
        the same ``select_across``) plus ``post=yes``, which tells the action to proceed.
        """
        opts = self.opts
        media = (self.media + form.media) if form is not None else self.media
        # Read the way Django's action form reads it, so that the count shown here and the
        # tasks the confirmed action changes are the same selection.
        select_across = forms.BooleanField(required=False).clean(
            request.POST.get("select_across")
        )
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "explanation": explanation,
            "opts": opts,
            "app_label": opts.app_label,
            "action": action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": "1" if select_across else "0",
            "selected_count": queryset.count(),
            "by_status": _status_labels(status_counts(queryset)),
            "task_database": selected_database(request),
            "form": form,
            "media": media,
            # Django 6.0 renders breadcrumbs as a list; earlier versions as a div.
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.action_confirmation_template, context)

    def report_bulk_change(
        self, request: HttpRequest, verb: str, before: Counter[str], changed: int,
        reasons: dict[str, str],
    ) -> None:
        """Say how many selected tasks changed, how many were skipped, and why.

        ``before`` counts the selection per status just before the guarded update;
        ``reasons`` names the statuses the update never changes. Skipped tasks beyond those
        were changed by someone else meanwhile (a worker claimed them, say) or, for a retry,
        have a deduplication key that another live task holds.
        """
        message, level = bulk_change_message(verb, before, changed, reasons)
        self.message_user(request, message, level)

    # -- dashboard -----------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("dashboard/", wrap(self.dashboard_view), name="{}_{}_dashboard".format(*info)),
            path("requeue-error-group/", wrap(self.requeue_group_view),
                 name="{}_{}_requeue_group".format(*info)),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        """Queues, counts, failures by error, stuck tasks, workers and a 24-hour chart, one
        section per database that holds queues (or the one named by ``?database=``)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        hours = _hours_param(request)
        if request.GET.get(DATABASE_PARAM):
            aliases = [selected_database(request)]
        else:
            aliases = routing.queue_databases()
        sections = [DashboardSection(self, request, dashboard.database_snapshot(alias, hours))
                    for alias in aliases]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Task queue dashboard"),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "sections": sections,
            "several_databases": len(routing.queue_databases()) > 1,
            "hours": hours,
            "hour_choices": [1, 6, 24],
            "changelist_url": self.url("changelist"),
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
            "colors": dashboard.COLORS,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.dashboard_template, context)

    def requeue_group_view(self, request: HttpRequest) -> HttpResponse:
        """Retry now every failed task of one error group, after a confirmation page."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        data = request.POST if request.method == "POST" else request.GET
        group = data.get("group", "")
        if len(group) > ERROR_GROUP_LENGTH or "\x00" in group:
            raise Http404("No such error group.")
        database = selected_database(request)
        since = _since_param(data.get("since", ""))
        tasks = dashboard.failed_in_group(database, group, since)
        dashboard_url = _with_database(self.url("dashboard"), database)
        if request.method == "POST" and _confirmed(request):
            before = status_counts(tasks)
            changed = tasks.retry_now()
            message, level = bulk_change_message(
                _("Requeue error group"), before, changed, {},
                leftover=_("deduplication key held by another live task, or changed "
                           "meanwhile"),
            )
            self.message_user(request, message, level)
            return HttpResponseRedirect(dashboard_url)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Requeue failed tasks of an error group"),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "group": group,
            "since": since,
            "all_time_url": f"{self.url('requeue_group')}?"
                            f"{urlencode(self._requeue_params(group, database))}",
            "count": tasks.count(),
            "task_database": database,
            "several_databases": len(routing.queue_databases()) > 1,
            "list_url": self._group_list_url(group, database, since),
            "dashboard_url": dashboard_url,
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.requeue_group_template, context)

    def _requeue_params(self, group: str, database: str,
                        since: datetime | None = None) -> dict[str, str]:
        params = {"group": group}
        if since is not None:
            params["since"] = since.isoformat()
        if database != pgtasks_settings.DATABASE:
            params[DATABASE_PARAM] = database
        return params

    def _group_list_url(self, group: str, database: str, since: datetime | None = None) -> str:
        params = {STATUS_PARAM: Status.FAILED, ErrorGroupFilter.parameter_name: group}
        if since is not None:
            params["finished_at__gte"] = since.isoformat()
        if database != pgtasks_settings.DATABASE:
            params[DATABASE_PARAM] = database
        return f"{self.url('changelist')}?{urlencode(params)}"


def _pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


# -- schedules (periodic tasks) ------------------------------------------------------------


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Periodic tasks, read-only: a schedule is declared in code and its row is written by
    the scheduler alone (see :mod:`django_pgtasks.scheduling.job`).

    Each row shows when the next run is planned, the last planned run, and the task it
    produced with its current status. A row whose schedule is no longer declared produces
    no runs; only such rows may be deleted here.
    """

    list_display = (
        "name", "task_name", "spec", "timezone", "next_run", "last_run", "last_task",
        "last_outcome", "enabled", "declared",
    )
    list_filter = ("enabled",)
    search_fields = ("name", "task_name")
    ordering = ("name",)
    fields = (
        "name", "task_name", "spec", "timezone", "enabled", "declared", "next_run", "last_run",
        "last_task", "last_outcome", "created_at", "updated_at",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> Any:
        from django_pgtasks.scheduling.job import declared_names

        # One subquery per column rather than a query per row: the last task's status, from
        # the task table or, once purged there, from the archive.
        def status_of(model: type[Task] | type[ArchivedTask]) -> Subquery:
            return Subquery(model.objects.filter(pk=OuterRef("last_task_id")).values("status")[:1])

        return super().get_queryset(request).annotate(
            last_task_status=status_of(Task),
            last_task_archived_status=status_of(ArchivedTask),
            is_declared=Case(When(name__in=sorted(declared_names()), then=Value(True)),
                             default=Value(False)),
        )

    @staticmethod
    def _local(when: datetime | None, obj: Schedule) -> str | None:
        """A time in the schedule's own time zone, which is where a cron spec is read."""
        if when is None:
            return None
        from django_pgtasks.base.schedules import zone

        try:
            tz = zone(obj.timezone)
        except Exception:  # a row written by other code with a zone unknown here
            return when.isoformat()
        return when.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")

    @admin.display(description=_("next run"), ordering="next_run_at")
    def next_run(self, obj: Schedule) -> str | None:
        return self._local(obj.next_run_at, obj)

    @admin.display(description=_("last planned run"), ordering="last_run_at")
    def last_run(self, obj: Schedule) -> str | None:
        return self._local(obj.last_run_at, obj)

    @admin.display(description=_("last task"))
    def last_task(self, obj: Schedule) -> SafeString | str | None:
        if obj.last_task_id is None:
            return None
        if getattr(obj, "last_task_status", None) is not None:
            url = reverse(admin_urlname(Task._meta, "change"), args=[obj.last_task_id],
                          current_app=self.admin_site.name)
            return format_html('<a href="{}">#{}</a>', url, obj.last_task_id)
        if getattr(obj, "last_task_archived_status", None) is not None:
            return _("#%(id)s (archived)") % {"id": obj.last_task_id}
        return _("#%(id)s (deleted)") % {"id": obj.last_task_id}

    @admin.display(description=_("last outcome"))
    def last_outcome(self, obj: Schedule) -> str | None:
        status = (getattr(obj, "last_task_status", None)
                  or getattr(obj, "last_task_archived_status", None))
        return Status(status).label if status in Status.values else status

    @admin.display(description=_("declared in code"), boolean=True, ordering="is_declared")
    def declared(self, obj: Schedule) -> bool:
        return bool(getattr(obj, "is_declared", False))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows come from declarations in code

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False  # only the scheduler writes a row, guarded on its planned time

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A declared schedule's row would come back at the next pass with a fresh plan, so
        # only leftovers of schedules removed from code may go, one at a time.
        if obj is None or getattr(obj, "is_declared", True):
            return False
        return super().has_delete_permission(request, obj)



# Queue pause/resume and rate-limit controls register their own admin.
from django_pgtasks.admin import controls as admin_controls  # noqa: E402, F401
