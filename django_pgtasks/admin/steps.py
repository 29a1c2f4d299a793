"""The durable steps on a task's admin page: the steps it kept, and retrying it from one.

A task that kept steps (``ctx.step()``) gets a "Steps" fieldset: one row per kept step, in
the order they completed (name, the attempt that ran it, when it was kept, how long it took,
its result cut short). For a user who may change tasks, each row of a task that is not
running links to a confirmation page; its POST runs the task again from that step
(:meth:`~django_pgtasks.models.TaskQuerySet.retry_from_step`: the steps before it stay
kept, it and the later ones run again).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import django
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin.common import _with_database, selected_database
from django_pgtasks.admin.progress import live
from django_pgtasks.definition.status import Status
from django_pgtasks.definition.steps import RESERVED, check_name
from django_pgtasks.models import Task

#: Query-string parameter naming the step to retry from.
STEP_PARAM = "step"


class StepsMixin:
    """The steps fieldset and the retry-from-a-step page of :class:`TaskAdmin`."""

    retry_from_step_template = "admin/django_pgtasks/task/retry_from_step.html"

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if obj is None or not obj.steps:
            return fieldsets
        field = ("steps_with_retry" if obj.status != Status.RUNNING
                 and self.has_change_permission(request, obj)  # type: ignore[attr-defined]
                 else "steps_table")
        # Before the data (the last three fieldsets: data, error, record).
        return (*fieldsets[:-3], (_("Steps"), {"fields": (field,)}), *fieldsets[-3:])

    @admin.display(description=_("kept steps"))
    def steps_table(self, obj: Task) -> SafeString:
        return self._steps_html(obj, retry=False)

    @admin.display(description=_("kept steps"))
    def steps_with_retry(self, obj: Task) -> SafeString:
        return self._steps_html(obj, retry=True)

    def _steps_html(self, obj: Task, retry: bool) -> SafeString:
        """The kept steps, one row each; with ``retry``, a link to retry from each."""
        database = obj._state.db or "default"

        def link(name: str) -> SafeString | str:
            if not retry or name.startswith(RESERVED):  # a sleep or a wait: not a step
                return ""
            url = reverse("admin:django_pgtasks_task_retry_from_step", args=[obj.pk])
            url = _with_database(f"{url}?{urlencode({STEP_PARAM: name})}", database)
            return format_html('<a href="{}">{}</a>', url, _("retry from here"))

        entries = [entry for entry in obj.steps or [] if isinstance(entry, dict)]
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                                    "<td>{}</td><td><code>{}</code></td><td>{}</td></tr>", (
            (i, entry.get("name", ""), entry.get("attempt", ""), entry.get("at", ""),
             f"{entry['ms']:g} ms" if isinstance(entry.get("ms"), (int, float)) else "",
             Truncator(json.dumps(entry.get("result"), ensure_ascii=False)).chars(200),
             link(str(entry.get("name", ""))))
            for i, entry in enumerate(entries, 1)))
        return live(obj, "steps", format_html(
            '<table class="pgtasks-steps"><thead><tr><th>#</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th><th>{}</th><th></th></tr></thead><tbody>{}</tbody>"
            "</table>",
            _("step"), _("attempt"), _("kept at"), _("took"), _("result"), rows))

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name  # type: ignore[attr-defined]
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        return [
            path("<path:object_id>/retry-from-step/", wrap(self.retry_from_step_view),
                 name="{}_{}_retry_from_step".format(*info)),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def retry_from_step_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what retrying the task from the step would run again, and a button; POST:
        retry it, and back to the task's page with what happened."""
        if not self.has_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        database = selected_database(request)
        try:
            pk = int(object_id)
            name = check_name(request.POST.get(STEP_PARAM) or request.GET.get(STEP_PARAM))
        except ValueError as exc:  # StepError is one
            raise Http404(str(exc)) from None
        task = Task.objects.using(database).filter(pk=pk).first()
        if task is None:
            raise Http404(f"No task {pk}.")
        change_url = _with_database(
            reverse("admin:django_pgtasks_task_change", args=[pk]), database)
        names = [entry.get("name") for entry in task.steps or [] if isinstance(entry, dict)]
        if request.method == "POST" and request.POST.get("post") == "yes":
            if Task.objects.using(database).filter(pk=pk).retry_from_step(name):
                self.message_user(  # type: ignore[attr-defined]
                    request, _("Task %(pk)s runs again from step %(step)s.")
                    % {"pk": pk, "step": name}, messages.SUCCESS)
            else:
                self.message_user(  # type: ignore[attr-defined]
                    request, _("Task %(pk)s was not retried: it is running, or it has no "
                               "kept step %(step)s.") % {"pk": pk, "step": name},
                    messages.WARNING)
            return HttpResponseRedirect(change_url)
        again = names[names.index(name):] if name in names else []
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": _("Retry task %(pk)s from step %(step)s") % {"pk": pk, "step": name},
            "opts": self.opts,  # type: ignore[attr-defined]
            "task": task,
            "step": name,
            "again": again,
            "kept": names[:len(names) - len(again)] if again else names,
            "running": task.status == Status.RUNNING,
            "task_database": database,
            "change_url": change_url,
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
        }
        return TemplateResponse(request, self.retry_from_step_template, context)
