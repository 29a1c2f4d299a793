"""The task list: a count bounded by COUNT_LIMIT, status counts, messages of bulk changes."""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_pgtasks.admin.common import COUNT_LIMIT, DATABASE_PARAM
from django_pgtasks.models import (
    Status,
    Task,
    TaskQuerySet,
)


class BoundedCountPaginator(Paginator):
    """Counts at most :data:`COUNT_LIMIT` rows (``SELECT count(*) FROM (… LIMIT n)``).

    ``capped`` tells that more rows match; the list then says "more than" the limit, and its
    last page is the last one within the limit. On the first page, the page's rows are read
    first: when they are all there is (a search, a small error group), that is the count,
    and no counting query runs at all.
    """

    capped = False

    def __init__(self, *args: Any, first_page: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_page = first_page
        #: The whole result, when it fit on the first page.
        self.whole_result: list[Task] | None = None

    @cached_property
    def count(self) -> int:
        if self.first_page:
            head = list(self.object_list[: self.per_page + 1])
            if len(head) <= self.per_page:
                self.whole_result = head
                return len(head)
        counted = self.object_list.order_by()[: COUNT_LIMIT + 1].count()
        self.capped = counted > COUNT_LIMIT
        return min(counted, COUNT_LIMIT)


class TaskChangeList(ChangeList):
    """The stock change list, plus the ``database`` parameter, which is not a filter, and
    filters drawn as a bar of drop-downs above the list (which then has the page's width)."""

    filter_template = "admin/django_pgtasks/task/filter.html"

    def get_filters(self, request: HttpRequest) -> Any:
        filters = super().get_filters(request)
        for spec in filters[0]:
            if spec.template == "admin/filter.html":  # a filter's own template is kept
                spec.template = self.filter_template
        return filters

    def get_filters_params(self, params: Any = None) -> Any:
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(DATABASE_PARAM, None)
        return lookup_params

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_count_capped = getattr(self.paginator, "capped", False)
        self.count_limit = COUNT_LIMIT
        whole = getattr(self.paginator, "whole_result", None)
        if whole is not None and not self.multi_page:
            self.result_list = whole  # already read: do not query again


def status_counts(queryset: TaskQuerySet) -> Counter[str]:
    """Tasks of ``queryset`` per status (one aggregate query)."""
    rows = queryset.order_by().values_list("status").annotate(n=Count("id"))
    return Counter(dict(rows))


def _status_labels(counts: Counter[str]) -> list[tuple[str, int]]:
    """(label, count) per status, in the order of :class:`Status`."""
    labels = dict(Status.choices)
    return [(str(labels.get(status, status)), counts[status])
            for status in [*Status.values, *sorted(set(counts) - set(Status.values))]
            if counts.get(status)]


def bulk_change_message(
    verb: str, before: Counter[str], changed: int, reasons: dict[str, str],
    leftover: str | None = None,
) -> tuple[str, int]:
    """"<verb>: N changed, M skipped (k running, j already finished)." and its level.

    ``before`` counts the selection per status before the update; ``reasons`` says why the
    update leaves tasks of a status alone. Skipped tasks no status explains get ``leftover``
    (by default: changed meanwhile, or a deduplication key another live task holds).
    """
    selected = sum(before.values())
    skipped = max(selected - changed, 0)
    explained: Counter[str] = Counter()
    budget = skipped
    for status, reason in reasons.items():
        n = min(before.get(status, 0), budget)
        if n:
            explained[str(reason)] += n
            budget -= n
    if budget:
        explained[str(leftover or _("key held by another live task, or changed meanwhile"))] += (
            budget)
    message = _("%(verb)s: %(changed)d changed, %(skipped)d skipped") % {
        "verb": verb, "changed": changed, "skipped": skipped}
    if explained:
        message += " (" + ", ".join(f"{n} {reason}" for reason, n in explained.items()) + ")"
    return message + ".", messages.SUCCESS if not skipped else messages.WARNING
