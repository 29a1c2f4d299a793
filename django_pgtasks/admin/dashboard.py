"""The dashboard page of the task admin and the requeue of an error group."""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

import django
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin import chart
from django_pgtasks.admin.actions import _confirmed
from django_pgtasks.admin.changelist import bulk_change_message, status_counts
from django_pgtasks.admin.common import (
    DATABASE_PARAM,
    STATUS_PARAM,
    WORKFLOW_PARAM,
    _with_database,
    selected_database,
)
from django_pgtasks.admin.filters import ErrorGroupFilter
from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition import routing
from django_pgtasks.models import (
    Status,
)
from django_pgtasks.monitoring import dashboard
from django_pgtasks.monitoring.dashboard import ERROR_GROUP_LENGTH


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

    def __init__(self, model_admin: ModelAdmin, request: HttpRequest,
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
        return chart.chart_svg(
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
    def failing_releases(self) -> list[dict[str, Any]]:
        return [{"release": release,
                 "url": _with_database(self.admin.url("change", release.id), self.database)}
                for release in self.snapshot.releases.failing]

    @cached_property
    def workflows(self) -> list[dict[str, Any]]:
        """The most recent workflows (:func:`dashboard.recent_workflows`: three queries,
        however many there are), with links to their tasks and callbacks."""
        labels = dict(Status.choices)
        rows = []
        for row in dashboard.recent_workflows(self.database):
            counts = [{"value": value, "label": labels[value], "count": row.counts[value],
                       "url": self.list_url(**{WORKFLOW_PARAM: row.id, STATUS_PARAM: value})}
                      for value in Status.values if row.counts.get(value)]
            callbacks = [{"task": callback, "status_label": labels.get(callback.status,
                                                                       callback.status),
                          "url": _with_database(self.admin.url("change", callback.id),
                                                self.database)}
                         for callback in row.callbacks]
            rows.append({"row": row, "url": self.list_url(**{WORKFLOW_PARAM: row.id}),
                         "counts": counts, "callbacks": callbacks,
                         "more_callbacks": row.callback_count - len(row.callbacks)})
        return rows

    @cached_property
    def estimates(self) -> list[tuple[str, int]]:
        by_status = self.snapshot.estimate.by_status
        return [(label, by_status[value]) for value, label in Status.choices
                if value in by_status]




class DashboardMixin:
    """The dashboard and requeue views of :class:`~django_pgtasks.admin.tasks.TaskAdmin`."""

    #: How often the open dashboard reads itself again (``dashboard.js``), in seconds.
    dashboard_refresh_seconds = 5

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
            "colors": chart.COLORS,
            "refresh_seconds": self.dashboard_refresh_seconds,
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
