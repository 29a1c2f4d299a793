"""The task list's bulk actions, each behind a confirmation page: retry now, cancel, change
priority."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import django
from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgtasks.admin.changelist import _status_labels, bulk_change_message, status_counts
from django_pgtasks.admin.common import (
    selected_database,
)
from django_pgtasks.definition.options import PRIORITY_MAX, PRIORITY_MIN
from django_pgtasks.models import (
    FINISHED,
    Status,
    TaskQuerySet,
)


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




class TaskActionsMixin:
    """The actions of :class:`~django_pgtasks.admin.tasks.TaskAdmin`."""


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
                    "skipped, and so are tasks waiting for the tasks they depend on (they run "
                    "when those end) and a finished task whose deduplication key another "
                    "waiting or running task holds now."
                ),
            )
        before = status_counts(queryset)
        changed = queryset.retry_now()
        self.report_bulk_change(
            request, _("Retry now"), before, changed,
            {Status.RUNNING: _("running"), Status.SUCCESSFUL: _("successful"),
             Status.WAITING: _("waiting for the tasks they depend on")},
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
                    "Tasks that have not started (ready, awaiting retry or waiting for the "
                    "tasks they depend on) are cancelled and will not run; the tasks that "
                    "depend on them see a parent that did not succeed. Running tasks are "
                    "asked to stop: their handler sees the request and the task ends "
                    "cancelled when it stops (a handler that finishes its work anyway ends "
                    "successful; on a process-pool worker, one still running CANCEL_GRACE "
                    "seconds later is stopped, and its task ends cancelled). Finished tasks "
                    "are skipped."
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
                    "Only tasks that have not started (ready, awaiting retry or waiting for "
                    "the tasks they depend on) change; the new priority applies from their "
                    "next claim. Running and finished tasks are skipped."
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


def _pretty_json(value: Any) -> SafeString:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))
