"""What every admin page shares: the database a request is about, bounded parameters."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from django.contrib.admin.options import IncorrectLookupParameters
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse
from django.urls import URLPattern, URLResolver
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.timestamps import tolerant_timestamps
from django_pgtasks.definition import routing
from django_pgtasks.models import (
    Task,
)

#: Rows the task list counts at most. Beyond it the list says "more than 10,000" instead of
#: counting every matching row of a table that may hold millions on each page view.
COUNT_LIMIT = 10_000
#: Newest tasks the name filter reads for names beyond the registered handlers.
NAME_FILTER_SAMPLE = 2_000
#: Names the name filter offers at most.
NAME_FILTER_MAX = 100
#: Query-string parameter of the status filter (Django's filter for a field with choices).
STATUS_PARAM = "status__exact"
#: Query-string parameter naming the database alias a page shows.
DATABASE_PARAM = "database"
#: Query-string parameter of the workflow filter (the tasks of one workflow).
WORKFLOW_PARAM = "workflow"

# A numeric search term is also looked up as a task id. Eighteen digits always fit a bigint.
_TASK_ID_RE = re.compile(r"[0-9]{1,18}")
# Set on a task when the admin refused to change it, so that neither the history nor the
# messages claim a change that did not happen.
_REFUSED = "_pgtasks_change_refused"



def selected_database(request: HttpRequest) -> str:
    """The database alias a request is about: its ``database`` parameter, else the one kept
    in the list's preserved filters (on a task's page), else ``PGTASKS["DATABASE"]``.

    Only aliases that hold queues (:func:`routing.queue_databases`) are accepted.
    """
    value = request.GET.get(DATABASE_PARAM) or request.POST.get(DATABASE_PARAM)
    if not value:
        preserved = request.GET.get("_changelist_filters", "")
        value = dict(parse_qsl(preserved)).get(DATABASE_PARAM)
    if not value:
        return str(pgtasks_settings.DATABASE)
    if value not in routing.queue_databases():
        raise Http404(f"No task database {value[:100]!r}.")
    return value


def _with_database(url: str, database: str) -> str:
    """``url`` with the ``database`` parameter, unless it is the default database."""
    if database == pgtasks_settings.DATABASE:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode({DATABASE_PARAM: database})}"


def _checked_param(value: str, max_length: int) -> str:
    """Reject a filter value longer than any value it could match.

    The value is always a bound parameter, never part of the SQL text; NUL characters never
    get this far (see :meth:`TaskAdmin.lookup_allowed`).
    """
    if len(value) > max_length:
        raise IncorrectLookupParameters(_("Invalid filter value."))
    return value


def _max_length(field_name: str) -> int:
    return Task._meta.get_field(field_name).max_length


class TolerantTimestampsMixin:
    """Pages of a model admin that show task rows: a time that PostgreSQL holds and Python
    cannot (``infinity``, a year before 1 or after 9999, written by raw SQL) is shown as
    such (:class:`~django_pgtasks.database.timestamps.OutOfRange`) instead of failing the page.

    Every view of the admin (its own and those of its mixins) runs with
    :func:`~django_pgtasks.database.timestamps.tolerant_timestamps` on the task databases, and
    its template is rendered inside, where the rows are read.
    """

    def get_urls(self) -> list[URLPattern | URLResolver]:
        urls = super().get_urls()  # type: ignore[misc]
        return [URLPattern(url.pattern, _tolerant_view(url.callback), url.default_args,
                           url.name) if isinstance(url, URLPattern) else url for url in urls]


def _tolerant_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @functools.wraps(view)
    def tolerant(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with tolerant_timestamps(routing.queue_databases()):
            response = view(request, *args, **kwargs)
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
        return response

    return tolerant
