"""The dashboard's entry in the admin index: a row named "Dashboard" under the app's models,
whose link opens the dashboard (:class:`~django_pgtasks.models.Dashboard` is a proxy model
without a table or permissions of its own)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from django_pgtasks.models import Dashboard, Task


@admin.register(Dashboard)
class DashboardEntryAdmin(admin.ModelAdmin):
    """Shown to whoever may view or change tasks; its list page is the dashboard."""

    def _task_perm(self, request: HttpRequest, action: str) -> bool:
        opts = Task._meta
        return request.user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._task_perm(request, "view") or self._task_perm(request, "change")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name="{}_{}_changelist".format(*info))]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponseRedirect:
        if not self.has_view_permission(request):
            raise PermissionDenied
        opts = Task._meta
        return HttpResponseRedirect(reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_dashboard"))
