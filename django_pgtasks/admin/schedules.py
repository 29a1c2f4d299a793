"""The periodic schedules, with their next and last runs in their own time zone: those declared
in code read-only, those made here editable."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.templatetags.admin_urls import admin_urlname
from django.core.exceptions import ValidationError
from django.db.models import Case, OuterRef, Subquery, Value, When
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.payload import MAX_INT_DIGITS
from django_pgtasks.models import (
    ArchivedTask,
    Schedule,
    Status,
    Task,
)
from django_pgtasks.scheduling import runtime


class ArgumentsField(forms.JSONField):
    """The JSON of a schedule's arguments, as typed in the admin.

    Django's field lets through what Python's ``json`` raises besides a syntax error (too
    deep a nesting, an integer of more than :data:`MAX_INT_DIGITS` digits): here each is a
    form error. A value with a lone surrogate (``"\\ud800"``, which JSON allows and
    :func:`runtime.validate` refuses) is shown again as it was typed, escaped, since the page
    cannot be encoded with it.
    """

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError(
                _("This JSON is nested too deeply to be read; arguments may be nested "
                  "%(depth)s levels at most.") % {"depth": pgtasks_settings.MAX_PAYLOAD_DEPTH},
                code="invalid") from None
        except ValueError:  # not a syntax error (Django's field reports those)
            raise ValidationError(
                _("This JSON has an integer of more than %(digits)s digits, which JSON cannot "
                  "carry back to Python; write it as a string.") % {"digits": MAX_INT_DIGITS},
                code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, InvalidJSONInput):
            return value
        text = super().prepare_value(value)
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate: written as its JSON escape
            return json.dumps(value, cls=self.encoder)
        return text


class ScheduleForm(forms.ModelForm):
    """A schedule made or changed in the admin, checked as the scheduler will run it."""

    class Meta:
        model = Schedule
        fields = ("name", *runtime.DEFINITION_FIELDS)
        labels = {"name": _("Name of the schedule")}
        help_texts = {
            "name": _("Names this schedule among all others, e.g. \"nightly-report\"; it "
                      "cannot be changed later."),
            "spec": _("A cron expression (\"0 3 * * *\", \"@hourly\") or a period "
                      "(\"every 30m\", \"every 1h30m\", \"every 90s\")."),
            "task_name": _("The registered name of a @pgtask handler."),
            "timezone": _("Where a cron expression is read, e.g. Europe/Paris."),
        }
        field_classes = {"args": ArgumentsField, "kwargs": ArgumentsField}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        schedule = Schedule(name=cleaned.get("name", self.instance.name), **{
            field: cleaned.get(field) for field in runtime.DEFINITION_FIELDS})
        schedule.args = cleaned.get("args") if cleaned.get("args") is not None else []
        schedule.kwargs = cleaned.get("kwargs") if cleaned.get("kwargs") is not None else {}
        # Every field's error at once: the fields this form refused already (a JSON syntax
        # error, a number that is not one) are left out, every other field is checked.
        if self.errors:
            skip = {*self.errors, *(set(runtime.DEFINITION_FIELDS) - set(self.fields))}
            if "name" not in self.fields:
                skip.add("name")  # read-only on a schedule's page
            if problems := runtime.problems(schedule, skip=skip):
                raise ValidationError(problems)
            return cleaned
        runtime.validate(schedule)
        cleaned["args"], cleaned["kwargs"] = schedule.args, schedule.kwargs
        return cleaned


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Periodic tasks. Those declared in code are read-only here: their row is written by
    the scheduler alone (see :mod:`django_pgtasks.scheduling.job`). Those made here
    (``source = "database"``) can be changed, enabled, disabled and deleted; the workers
    pick a change up at their next scheduler pass (:mod:`django_pgtasks.scheduling.runtime`).

    Each row shows when the next run is planned, the last planned run, and the task it
    produced with its current status. A row of code whose schedule is no longer declared
    produces no runs; such rows may be deleted here too.
    """

    form = ScheduleForm
    list_display = (
        "name", "task_name", "spec", "timezone", "next_run", "last_run", "last_task",
        "last_outcome", "enabled", "source", "declared",
    )
    list_filter = ("enabled", "source")
    search_fields = ("name", "task_name")
    ordering = ("name",)
    #: What a row shows besides its definition, always read-only.
    state_fields = ("declared", "next_run", "last_run", "last_task", "last_outcome",
                    "created_at", "updated_at")

    def get_fields(self, request: HttpRequest, obj: Schedule | None = None) -> tuple[str, ...]:
        definition = ("name", *runtime.DEFINITION_FIELDS)
        return definition if obj is None else (*definition, "source", *self.state_fields)

    def get_readonly_fields(self, request: HttpRequest,
                            obj: Schedule | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        if obj.source == Schedule.Source.DATABASE and self.has_change_permission(request, obj):
            return ("name", "source", *self.state_fields)  # the name is the row's identity
        return self.get_fields(request, obj)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        runtime.save(obj)

    def get_queryset(self, request: HttpRequest) -> Any:
        from django_pgtasks.scheduling.declarations import declared_names

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
        from django_pgtasks.definition.recurrence import zone

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

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A schedule declared in code is changed in code; only the scheduler writes its row.
        if obj is not None and obj.source != Schedule.Source.DATABASE:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        # A declared schedule's row would come back at the next pass with a fresh plan, so
        # only schedules made here and leftovers of schedules removed from code may go, one
        # at a time.
        if obj is None or (obj.source != Schedule.Source.DATABASE
                           and getattr(obj, "is_declared", True)):
            return False
        return super().has_delete_permission(request, obj)
