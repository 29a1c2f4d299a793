"""A task's progress and log on its admin page, refreshed while it runs.

A task that reported its progress (``ctx.progress()``), kept log records (``ctx.logger``
and the project's loggers during its runs), waits for an event or is running gets a
"Progress" fieldset: a progress bar (or the count done, when the total is unknown) with
the last message and when it was reported, what the task waits for, and its log, newest
last. While the task runs, the page reads itself again every few seconds and puts the
progress, the log and the steps in place (``static/django_pgtasks/admin/live_task.js``):
nothing on a running task's page can be edited, so nothing typed is lost.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_pgtasks.definition.status import Status
from django_pgtasks.models import Task

#: Seconds between two reads of a running task's page.
REFRESH_SECONDS = 2


def live(obj: Task, name: str, html: SafeString) -> SafeString:
    """``html`` in a block the page puts in place again while ``obj`` runs."""
    return format_html('<div id="pgtasks-live-{}" data-pgtasks-live="{}" data-refresh="{}">'
                       "{}</div>", name, "running" if obj.status == Status.RUNNING else "",
                       REFRESH_SECONDS, html)


class ProgressMixin:
    """The progress fieldset of :class:`TaskAdmin`."""

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if obj is None or not (obj.progress or obj.log or obj.awaited_event
                               or obj.status == Status.RUNNING):
            return fieldsets
        # After the attempts (the second fieldset).
        return (*fieldsets[:2], (_("Progress"), {"fields": ("progress_panel", "log_panel")}),
                *fieldsets[2:])

    @admin.display(description=_("progress"))
    def progress_panel(self, obj: Task) -> SafeString:
        return live(obj, "progress", format_html("{}{}", _progress_html(obj), _waits_html(obj)))

    @admin.display(description=_("log"))
    def log_panel(self, obj: Task) -> SafeString:
        entries = [e for e in obj.log or [] if isinstance(e, dict)]
        if not entries:
            return live(obj, "log", format_html('<span class="quiet">{}</span>',
                                                _("No records.")))
        rows = format_html_join("", '<tr class="level-{}"><td>{}</td><td>{}</td><td>{}</td>'
                                    "<td><pre>{}</pre></td></tr>", (
            (str(e.get("level", "")).lower(), e.get("at", ""), e.get("level", ""),
             e.get("logger", ""), e.get("message", "")) for e in entries))
        return live(obj, "log", format_html(
            '<table class="pgtasks-log"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("time"), _("level"), _("logger"), _("message"), rows))


def _progress_html(obj: Task) -> SafeString:
    progress = obj.progress if isinstance(obj.progress, dict) else None
    if progress is None:
        return format_html('<p class="quiet">{}</p>', _("No progress reported."))
    done, total = progress.get("done"), progress.get("total")
    if isinstance(total, int | float) and total > 0 and isinstance(done, int | float):
        bar = format_html('<progress class="pgtasks-progress" value="{}" max="{}"></progress> '
                          "{} / {} ({}%)", done, total, done, total,
                          round(min(done / total, 1) * 100))
    else:
        bar = format_html("{} {}", done, _("done"))
    return format_html('<p>{}</p><p>{} <span class="quiet">{}</span></p>', bar,
                       progress.get("message", ""), progress.get("at", ""))


def _waits_html(obj: Task) -> SafeString | str:
    if obj.awaited_event and obj.status == Status.READY:
        return format_html("<p>{} <code>{}</code></p>", _("Waits for the event"),
                           obj.awaited_event)
    return ""
