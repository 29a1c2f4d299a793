"""Admin pages for the queue controls: pause/resume queues, rate limits of queues and keys.

Importing this module (``admin.py`` does) registers both pages on the default admin site.

Like the task admin, these pages never save a whole row: a worker's claim may be updating the
same row (the record of recent starts) at the same moment, and a full ``save()`` would write
back the stale copy the page was read from. Pausing and resuming go through
:func:`django_pgtasks.patterns.controls.pause` / :func:`~django_pgtasks.patterns.controls.resume`
(the latter
wakes idle workers), and saving a rate limit through
:func:`~django_pgtasks.patterns.controls.set_rate_limit`, which writes only the limit's columns.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.models import KeyRateLimit, QueueControl
from django_pgtasks.patterns import controls

__all__ = ["KeyRateLimitAdmin", "QueueControlAdmin"]


def _count(queue_status: Q) -> Coalesce:
    from django_pgtasks.models import Task

    counts = (Task.objects.filter(queue_status, queue=OuterRef("queue"))
              .order_by().values("queue").annotate(n=Count("id")).values("n"))
    return Coalesce(Subquery(counts), 0)


class RateLimitForm(forms.ModelForm):
    """Checks a rate limit as :func:`~django_pgtasks.patterns.controls.set_rate_limit` will."""

    #: Whether the limit may be left empty (a queue without a rate limit).
    optional = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        limit, period = data.get("rate_limit"), data.get("rate_period")
        if limit is None and period is None and self.optional:
            return data
        if limit is None or period is None:
            raise forms.ValidationError(_("A rate limit needs both a limit and a period."))
        try:
            controls.validate_rate_limit(limit, period)
        except InvalidTaskError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


class QueueRateLimitForm(RateLimitForm):
    optional = True

    class Meta:
        model = QueueControl
        fields = ["rate_limit", "rate_period"]


class KeyRateLimitForm(RateLimitForm):
    class Meta:
        model = KeyRateLimit
        fields = ["key", "rate_limit", "rate_period"]


@admin.register(QueueControl)
class QueueControlAdmin(admin.ModelAdmin):
    """One row per configured queue: pause or resume it (actions), edit its rate limit."""

    list_display = ["queue", "state", "paused_at", "rate", "waiting", "running"]
    list_filter = ["paused"]
    actions = ["pause_queues", "resume_queues"]
    form = QueueRateLimitForm
    fields = ["queue", "paused", "paused_at", "rate_limit", "rate_period"]
    readonly_fields = ["queue", "paused", "paused_at"]
    ordering = ["queue"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueueControl]:
        from django_pgtasks.models import PENDING, Status

        return super().get_queryset(request).annotate(
            waiting_count=_count(Q(status__in=PENDING)),
            running_count=_count(Q(status=Status.RUNNING)),
        )

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        controls.ensure_queue_rows()  # every configured queue shows, paused or not
        return super().changelist_view(request, extra_context)

    @admin.display(description=_("state"), ordering="paused")
    def state(self, obj: QueueControl) -> str:
        return str(_("paused")) if obj.paused else str(_("running"))

    @admin.display(description=_("rate limit"))
    def rate(self, obj: QueueControl) -> str:
        return controls.describe_rate(obj.rate_limit, obj.rate_period)

    @admin.display(description=_("waiting"), ordering="waiting_count")
    def waiting(self, obj: QueueControl) -> int:
        return obj.waiting_count

    @admin.display(description=_("running"), ordering="running_count")
    def running(self, obj: QueueControl) -> int:
        return obj.running_count

    @admin.action(description=_("Pause selected queues (running tasks finish)"),
                  permissions=["change"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        names = list(queryset.values_list("queue", flat=True))
        changed = controls.pause(*names) if names else 0
        self.message_user(request, ngettext(
            "%(count)d queue paused.", "%(count)d queues paused.", changed
        ) % {"count": changed}, messages.SUCCESS)

    @admin.action(description=_("Resume selected queues"), permissions=["change"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> None:
        names = list(queryset.values_list("queue", flat=True))
        changed = controls.resume(*names) if names else 0
        self.message_user(request, ngettext(
            "%(count)d queue resumed.", "%(count)d queues resumed.", changed
        ) % {"count": changed}, messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # one row per configured queue, created by the list page

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # resume it and clear its limit instead

    def save_model(self, request: HttpRequest, obj: QueueControl, form: ModelForm,
                   change: bool) -> None:
        # Only the limit's columns are written (never the claim's record of starts).
        if obj.rate_limit is None:
            controls.clear_rate_limit(queue=obj.queue)
        else:
            controls.set_rate_limit(obj.rate_limit, obj.rate_period, queue=obj.queue)


@admin.register(KeyRateLimit)
class KeyRateLimitAdmin(admin.ModelAdmin):
    """Rate limits of concurrency keys: add, change, delete."""

    form = KeyRateLimitForm
    list_display = ["key", "rate", "updated_at"]
    search_fields = ["key"]
    fields = ["key", "rate_limit", "rate_period"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["key"] if obj is not None else []

    @admin.display(description=_("rate limit"))
    def rate(self, obj: KeyRateLimit) -> str:
        return controls.describe_rate(obj.rate_limit, obj.rate_period)

    def save_model(self, request: HttpRequest, obj: KeyRateLimit, form: ModelForm,
                   change: bool) -> None:
        controls.set_rate_limit(obj.rate_limit, obj.rate_period, key=obj.key)
