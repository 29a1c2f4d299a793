"""The Django admin for tasks.

The changelist opens with a summary (counts per task name and status, and the commonest
failures grouped by their first error line). A task's page is read-only, except its priority
while it still waits to run. Bulk actions retry, cancel or re-prioritize tasks after a
confirmation page.

Every change made here goes through the guarded statements the rest of the app uses
(``retry_now()``, ``cancel()``, ``set_priority()``). The admin never saves a whole task row: a
worker may be updating that row at the same moment, and a full ``save()`` would write back the
stale copy the page was built from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import django
from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import admin_urlname
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import Case, Count, F, Func, Max, OuterRef, Subquery, TextField, Value, When
from django.db.models import Field as ModelField
from django.db.models.functions import Coalesce, Left
from django.forms import Field as FormField
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from .conf import pgtasks_settings
from .models import PENDING, ArchivedTask, Schedule, Status, Task, TaskQuerySet
from .registry import registered_names
from .validation import PRIORITY_MAX, PRIORITY_MIN

#: Task names the changelist summary shows at most (one aggregate query reads
#: ``SUMMARY_MAX_NAMES * len(Status)`` groups at most).
SUMMARY_MAX_NAMES = 100
#: Error groups the changelist summary lists at most, commonest first.
SUMMARY_MAX_ERROR_GROUPS = 20
#: Characters of a normalized first error line that name its group. Bounds the links the
#: summary builds and the values the error-group filter accepts.
ERROR_GROUP_LENGTH = 200
#: Newest tasks the name filter reads for names beyond the registered handlers.
NAME_FILTER_SAMPLE = 10_000
#: Names the name filter offers at most.
NAME_FILTER_MAX = 100
#: Query-string parameter of the status filter (Django's filter for a field with choices).
STATUS_PARAM = "status__exact"

# A numeric search term is also looked up as a task id. Eighteen digits always fit a bigint.
_TASK_ID_RE = re.compile(r"[0-9]{1,18}")
# Set on a task when the admin refused to change it, so that neither the history nor the
# messages claim a change that did not happen.
_REFUSED = "_pgtasks_change_refused"


def error_group_expression() -> Func:
    """SQL naming a failure's group: the first line of ``error_text`` with ids blanked out.

    Hexadecimal words that contain a digit (UUIDs, hashes, ``0x`` addresses), then any other
    run of digits, become ``N``; "Order 41 not found" and "Order 97 not found" are one
    problem. The summary groups by this expression and the error-group filter compares with
    it, so a group's link always finds exactly the tasks that were counted.
    """
    first_line = Func(
        F("error_text"), Value("\n"), Value(1), function="split_part", output_field=TextField()
    )
    without_hex = _regexp_replace(first_line, r"\m(0x)?[0-9a-fA-F]*[0-9][0-9a-fA-F]*\M")
    return Left(_regexp_replace(without_hex, "[0-9]+"), ERROR_GROUP_LENGTH)


def _regexp_replace(expression: Func, pattern: str) -> Func:
    return Func(
        expression, Value(pattern), Value("N"), Value("g"),
        function="regexp_replace", output_field=TextField(),
    )


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

        The bound is an id range (``id >=`` the sample's oldest id), which PostgreSQL reads
        from the primary key index. ``id IN (newest ids)`` would be planned as a hash join
        over a sequential scan of the whole table.
        """
        tasks = tasks.order_by()
        oldest_in_sample = tasks.order_by("-id").values("id")[
            NAME_FILTER_SAMPLE - 1 : NAME_FILTER_SAMPLE
        ]
        return (
            tasks.filter(id__gte=Coalesce(Subquery(oldest_in_sample), Value(0)))
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


# -- changelist summary ------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryLink:
    label: str
    url: str


@dataclass(frozen=True)
class SummaryCell:
    count: int
    url: str


@dataclass(frozen=True)
class SummaryRow:
    name: str
    url: str
    #: One cell per status, in the order of :attr:`TaskSummary.status_columns`.
    cells: list[SummaryCell]
    total: int


@dataclass(frozen=True)
class ErrorGroup:
    #: The normalized first line of the error, as grouped by :func:`error_group_expression`.
    text: str
    count: int
    last_failed_at: datetime | None
    url: str


class TaskSummary:
    """The changelist header: task counts per name and status, and failures by error group.

    Each part is one aggregate query, run only when a template first reads it, so requests
    that end in a redirect (such as a confirmed action) never pay for it.
    """

    max_names = SUMMARY_MAX_NAMES

    def __init__(self, queryset: TaskQuerySet, changelist_url: str) -> None:
        self.queryset = queryset.order_by()
        self.changelist_url = changelist_url

    def url(self, **params: str) -> str:
        """The changelist filtered by ``params`` (filter query-string parameters)."""
        return f"{self.changelist_url}?{urlencode(params)}"

    @cached_property
    def status_columns(self) -> list[SummaryLink]:
        return [
            SummaryLink(str(label), self.url(**{STATUS_PARAM: value}))
            for value, label in Status.choices
        ]

    @cached_property
    def _counts(self) -> tuple[list[SummaryRow], bool]:
        limit = SUMMARY_MAX_NAMES * len(Status)
        groups = list(
            self.queryset.values("name", "status")
            .annotate(n=Count("id"))
            .order_by("name", "status")[: limit + 1]
        )
        truncated = len(groups) > limit
        by_name: dict[str, dict[str, int]] = {}
        for group in groups[:limit]:
            by_name.setdefault(group["name"], {})[group["status"]] = group["n"]
        if truncated:
            # The limit may have cut the last name's statuses short; show complete rows only.
            by_name.popitem()
        rows = [
            SummaryRow(
                name=name,
                url=self.url(name=name),
                cells=[
                    SummaryCell(counts.get(status, 0),
                                self.url(name=name, **{STATUS_PARAM: status}))
                    for status in Status.values
                ],
                total=sum(counts.values()),
            )
            for name, counts in by_name.items()
        ]
        return rows, truncated

    @property
    def rows(self) -> list[SummaryRow]:
        return self._counts[0]

    @property
    def truncated(self) -> bool:
        """Whether there were more task names than :data:`SUMMARY_MAX_NAMES`."""
        return self._counts[1]

    @cached_property
    def error_groups(self) -> list[ErrorGroup]:
        """Failed tasks grouped by their normalized first error line, commonest first."""
        groups = (
            self.queryset.failed()
            .values(error_group=error_group_expression())
            .annotate(n=Count("id"), last_failed_at=Max("finished_at"))
            .order_by("-n", "error_group")[:SUMMARY_MAX_ERROR_GROUPS]
        )
        return [
            ErrorGroup(
                text=group["error_group"],
                count=group["n"],
                last_failed_at=group["last_failed_at"],
                url=self.url(**{
                    STATUS_PARAM: Status.FAILED,
                    ErrorGroupFilter.parameter_name: group["error_group"],
                }),
            )
            for group in groups
        ]


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
        "id", "name", "queue", "status", "priority", "attempts", "run_after", "started_at",
        "finished_at", "locked_by", "error_summary",
    )
    list_filter = ("status", QueueFilter, NameFilter, ErrorGroupFilter)
    search_fields = ("key__exact", "name")
    search_help_text = _(
        "A task id, an exact deduplication key, or part of a task name."
    )
    ordering = ("-id",)
    list_per_page = 100
    # Both would add counting queries over the whole table to every changelist view.
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ("retry_now_selected", "cancel_selected", "change_priority_selected")
    action_confirmation_template = "admin/django_pgtasks/task/action_confirmation.html"

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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        changelist_url = reverse(
            admin_urlname(self.opts, "changelist"), current_app=self.admin_site.name
        )
        summary = TaskSummary(self.get_queryset(request), changelist_url)
        return super().changelist_view(request, {"task_summary": summary, **(extra_context or {})})

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # PostgreSQL answers a NUL character in a text parameter with an error, not an empty
        # result: refuse such filter values up front (a 400) instead of failing with a 500.
        if "\x00" in str(value):
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(
        self, request: HttpRequest, queryset: TaskQuerySet, search_term: str
    ) -> tuple[TaskQuerySet, bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if _TASK_ID_RE.fullmatch(term):
            results |= queryset.filter(pk=int(term))
        return results, may_have_duplicates

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
            refused = not self.model.objects.filter(pk=obj.pk).set_priority(obj.priority)
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
        self.model.objects.filter(pk=obj.pk).finished().delete()

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
                    "skipped."
                ),
            )
        selected = queryset.count()
        changed = queryset.retry_now()
        self.report_bulk_change(
            request,
            _("Retry now: %(changed)d changed, %(skipped)d skipped (running or successful)."),
            selected, changed,
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
                    "will not run. Running and finished tasks are skipped."
                ),
            )
        selected = queryset.count()
        changed = queryset.cancel()
        self.report_bulk_change(
            request,
            _("Cancel: %(changed)d changed, %(skipped)d skipped (running or already "
              "finished)."),
            selected, changed,
        )
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
        selected = queryset.count()
        changed = queryset.set_priority(priority)
        self.report_bulk_change(
            request,
            _("Priority %(priority)d: %(changed)d changed, %(skipped)d skipped (running or "
              "already finished)."),
            selected, changed, priority=priority,
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
            "form": form,
            "media": media,
            # Django 6.0 renders breadcrumbs as a list; earlier versions as a div.
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.action_confirmation_template, context)

    def report_bulk_change(
        self, request: HttpRequest, message: str, selected: int, changed: int, **params: Any
    ) -> None:
        """Say how many selected tasks changed and how many the guarded update skipped."""
        skipped = max(selected - changed, 0)
        self.message_user(
            request,
            message % {"changed": changed, "skipped": skipped, **params},
            messages.SUCCESS if not skipped else messages.WARNING,
        )


def _pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


# -- schedules (periodic tasks) ------------------------------------------------------------


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Periodic tasks, read-only: a schedule is declared in code and its row is written by
    the scheduler alone (see :mod:`django_pgtasks.scheduling`).

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
        from .scheduling import declared_names

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
        from .scheduling import zone

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

