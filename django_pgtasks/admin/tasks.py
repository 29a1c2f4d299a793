"""The task admin: the list, a task's page, and what may change there."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.templatetags.admin_urls import admin_urlname
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Field as ModelField
from django.forms import Field as FormField
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin.actions import TaskActionsMixin, _pretty_json
from django_pgtasks.admin.cells import one_line, short_name, short_time
from django_pgtasks.admin.changelist import BoundedCountPaginator, TaskChangeList
from django_pgtasks.admin.common import (
    _REFUSED,
    _TASK_ID_RE,
    TolerantTimestampsMixin,
    _with_database,
    selected_database,
)
from django_pgtasks.admin.dashboard import DashboardMixin
from django_pgtasks.admin.filters import (
    ErrorGroupFilter,
    FinishedFilter,
    NameFilter,
    QueueFilter,
    WorkflowFilter,
)
from django_pgtasks.admin.progress import ProgressMixin
from django_pgtasks.admin.steps import StepsMixin
from django_pgtasks.admin.workflow_panel import WorkflowFieldsMixin
from django_pgtasks.definition import routing
from django_pgtasks.definition.options import PRIORITY_MAX, PRIORITY_MIN
from django_pgtasks.definition.status import UNSTARTED
from django_pgtasks.models import (
    Task,
    TaskQuerySet,
)


@admin.register(Task)
class TaskAdmin(TolerantTimestampsMixin, TaskActionsMixin, DashboardMixin, StepsMixin,
                ProgressMixin, WorkflowFieldsMixin, admin.ModelAdmin):
    # What tells tasks apart comes first, so that the error stays in view on a laptop's
    # screen; the worker holding a task is on its page (and the dashboard lists the stuck).
    # What tells tasks apart comes first, so that the error stays in view on a laptop's
    # screen; the worker holding a task is on its page (and the dashboard lists the stuck).
    # Each cell holds one line (long names, errors and arguments end in "…", whole in their
    # tooltip), related values share a cell and the filters are a bar above the list, so
    # that every column fits a 1,280-pixel screen with the navigation open and the error
    # column keeps the width the others leave (tests/integration/test_browser.py).
    list_display = ("id", "call", "state", "error_summary", "queue_and_priority", "when")
    list_filter = ("status", FinishedFilter, QueueFilter, NameFilter, ErrorGroupFilter,
                   WorkflowFilter)
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

    class Media:
        css = {"all": ("django_pgtasks/admin/pgtasks.css",)}
        js = ("django_pgtasks/admin/live_task.js",)

    # A task of a workflow, or one that others wait for, also gets a "Workflow" fieldset
    # (WorkflowFieldsMixin.get_fieldsets).
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

    @admin.display(description=_("task and arguments"), ordering="name")
    def call(self, obj: Task) -> SafeString:
        """The task's name (its end, when long) and its arguments, as a call."""
        args = ", ".join(json.dumps(a, ensure_ascii=False) for a in obj.args)
        kwargs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                           for k, v in obj.kwargs.items())
        arguments = Truncator(", ".join(p for p in (args, kwargs) if p)).chars(60)
        return one_line(f"{short_name(obj.name)}({arguments})", f"{obj.name}({arguments})")

    @admin.display(description=_("status, attempts"), ordering="status")
    def state(self, obj: Task) -> SafeString:
        return format_html('{} <span class="quiet">{}/{}</span>', obj.get_status_display(),
                           obj.attempt, obj.max_attempts)

    @admin.display(description=_("error"))
    def error_summary(self, obj: Task) -> SafeString:
        """The first line of the error; the column takes the width the others leave."""
        line = obj.error_text.partition("\n")[0]
        line = Truncator(line).chars(300)
        return one_line(line, line)

    @admin.display(description=_("queue, priority"), ordering="queue")
    def queue_and_priority(self, obj: Task) -> SafeString:
        return format_html('{} <span class="quiet">{}</span>', obj.queue, obj.priority)

    @admin.display(description=_("due or finished"))
    def when(self, obj: Task) -> SafeString | str:
        """When a finished task finished, or when an unfinished one is (or was) due."""
        if obj.finished_at is not None:
            return short_time(obj.finished_at, _("finished"))
        return short_time(obj.run_after, _("due"))

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
        """Priority matters only to a task that still waits to be claimed (or released)."""
        return obj is not None and obj.status in UNSTARTED

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
        self.model.objects.using(selected_database(request)).filter(pk=obj.pk).delete_finished()

    def delete_queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> None:
        # No stock action reaches this (see has_delete_permission); guarded all the same for
        # subclasses that add a bulk delete.
        queryset.delete_finished()
