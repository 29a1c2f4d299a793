"""The events sent to durable tasks (``Task.objects.send_event()``): read-only, deletable.

One row per key: when it was last sent, its payload cut short, and how many tasks wait for
it now (a sent event wakes its waiters at once, so this is 0 unless one began to wait
since, which finds it at its next run). An operator may delete events (a task that waits
for a deleted key waits until it is sent again); sending is the application's to do, in its
own transaction, so the admin does not add or change them.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin.common import selected_database
from django_pgtasks.definition.status import Status
from django_pgtasks.models import Event, Task


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["key", "sent_at", "payload_preview", "waiting"]
    search_fields = ["key__startswith"]
    search_help_text = _("The start of an event key.")
    ordering = ["-sent_at"]
    list_per_page = 50
    show_full_result_count = False
    fields = ["key", "sent_at", "payload_json", "waiting"]
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        waiting = (Task.objects.filter(awaited_event=OuterRef("key"),
                                       status__in=(Status.READY, Status.RUNNING))
                   .order_by().values("awaited_event").annotate(n=Count("id")).values("n"))
        return (super().get_queryset(request).using(selected_database(request))
                .annotate(waiting_count=Coalesce(Subquery(waiting), 0)))

    @admin.display(description=_("payload"))
    def payload_preview(self, obj: Event) -> str:
        return Truncator(json.dumps(obj.payload, ensure_ascii=False)).chars(120)

    @admin.display(description=_("payload"))
    def payload_json(self, obj: Event) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2,
                                                       ensure_ascii=False))

    @admin.display(description=_("tasks waiting"), ordering="waiting_count")
    def waiting(self, obj: Event) -> int:
        return getattr(obj, "waiting_count", 0)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sent by the application, in its transaction

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
