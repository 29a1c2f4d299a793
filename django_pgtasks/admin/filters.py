"""The task list's filters: queue, task name, when finished, error group, workflow."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Value
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin.common import (
    NAME_FILTER_MAX,
    NAME_FILTER_SAMPLE,
    WORKFLOW_PARAM,
    _checked_param,
    _max_length,
)
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.registry import registered_names
from django_pgtasks.models import (
    TaskQuerySet,
)
from django_pgtasks.monitoring.dashboard import ERROR_GROUP_LENGTH, error_group_expression


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


class FinishedFilter(admin.SimpleListFilter):
    """Tasks that ended in the last hour, day, week or 30 days, on the database clock.

    A range of ``finished_at``, the key of the history's partitions: the list (and its
    other filters, such as an error group) reads only the periods of that range.
    """

    title = _("finished")
    parameter_name = "finished"
    SPANS = {
        "1h": (timedelta(hours=1), _("Last hour")),
        "24h": (timedelta(days=1), _("Last 24 hours")),
        "7d": (timedelta(days=7), _("Last 7 days")),
        "30d": (timedelta(days=30), _("Last 30 days")),
    }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(key, label) for key, (_span, label) in self.SPANS.items()]

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        if value not in self.SPANS:
            raise IncorrectLookupParameters(
                f"finished must be one of {', '.join(self.SPANS)}, not {value!r}.")
        span = self.SPANS[value][0]
        return queryset.finished().filter(finished_at__gte=Now() - Value(span))


class SelectedOnlyFilter(admin.SimpleListFilter):
    """A filter reached from links elsewhere (the summary, a task's page, the dashboard),
    shown in the sidebar only while a value is selected: there is nothing useful to list
    before, and listing every value would read the whole table."""

    template = "admin/django_pgtasks/task/selected_only_filter.html"

    def label(self, value: str) -> str:
        return value

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, self.label(value))] if value else []

    def has_output(self) -> bool:
        # Django applies only the filters that have output; this one must apply even though
        # it offers no choices until a value is selected (its template then renders nothing).
        return True


class ErrorGroupFilter(SelectedOnlyFilter):
    """Tasks whose first error line, ids blanked out, equals the value (chosen among the
    summary's error groups)."""

    title = _("error group")
    parameter_name = "error_group"

    def label(self, value: str) -> str:
        return Truncator(value).chars(60)

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        value = _checked_param(value, ERROR_GROUP_LENGTH)
        return queryset.alias(error_group=error_group_expression()).filter(error_group=value)


class WorkflowFilter(SelectedOnlyFilter):
    """The tasks of one workflow (``?workflow=<uuid>``, linked from a task's page and the
    dashboard), through the member table's workflow index."""

    title = _("workflow")
    parameter_name = WORKFLOW_PARAM
    # The longest spelling uuid.UUID() accepts: "urn:uuid:" and 36 characters.
    max_length = 45

    def queryset(self, request: HttpRequest, queryset: TaskQuerySet) -> TaskQuerySet:
        value = self.value()
        if value is None:
            return queryset
        try:
            workflow_id = uuid.UUID(_checked_param(value, self.max_length))
        except ValueError:
            raise IncorrectLookupParameters(_("Invalid filter value.")) from None
        return queryset.filter(workflow_member__workflow_id=workflow_id)
