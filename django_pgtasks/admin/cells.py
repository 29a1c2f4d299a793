"""Cells of the task list that hold one line each, whatever they show: long names, errors
and arguments are cut short (whole in their tooltip), times are written in few characters.
One line per row keeps every column of the list on a laptop's screen."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

#: A task name longer than this loses its first dotted parts ("…tasks.send_receipt").
NAME_CHARS = 24


def one_line(text: str, title: str) -> SafeString:
    """``text`` on one line, cut by the column's width if need be; ``title`` on hover."""
    return format_html('<span class="pgtasks-line" title="{}">{}</span>', title, text)


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """A task name of at most ``limit`` characters that keeps its end, where the function's
    name is: the module path goes first, at a dot (``…tasks.send_order_confirmation``)."""
    if len(name) <= limit:
        return name
    parts = name.split(".")
    while len(parts) > 1 and len(".".join(parts)) + 1 > limit:
        parts.pop(0)
    tail = ".".join(parts)
    if len(tail) + 1 > limit:
        tail = tail[-(limit - 1):]
    return "…" + tail


def short_time(value: datetime | str | None, what: str) -> SafeString | str:
    """A time in a few characters (the time of day today, the day this year, the date
    before), what it is and the full time on hover. A time out of Python's range is a string
    (:class:`~django_pgtasks.database.timestamps.OutOfRange`) and is shown as it is."""
    if value is None:
        return "-"
    if not isinstance(value, datetime):
        return format_html('<span title="{}">{}</span>', what, value)
    local, now = timezone.localtime(value), timezone.localtime()
    if local.date() == now.date():
        text = date_format(local, "H:i:s")
    elif local.year == now.year:
        text = date_format(local, "M j")
    else:
        text = date_format(local, "Y-m-d")
    return format_html('<time datetime="{}" title="{}: {}">{}</time>', value.isoformat(),
                       what, date_format(local, "DATETIME_FORMAT"), text)
