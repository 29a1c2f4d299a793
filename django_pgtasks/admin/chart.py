"""The dashboard's chart of the last hours: an inline SVG, drawn on the server."""


from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_pgtasks.monitoring.dashboard import HourPoint

CHART_WIDTH = 760
CHART_HEIGHT = 240
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 48, 56, 16, 36
#: Colours of the series (also used by the legend).
COLORS = {
    "succeeded": "#3b8a3e",
    "failed": "#c0392b",
    "enqueued": "#1f6fb2",
    "backlog": "#8e5bb5",
}


def _nice_max(value: float) -> int:
    """A round axis maximum at or above ``value`` whose half is a whole number too (the axis
    is labelled at 0, half and max): 2, 4, 6 or 10 below ten, then 1, 2 or 5 times a power
    of ten."""
    for small in (2, 4, 6, 10):
        if value <= small:
            return small
    magnitude = 10
    while magnitude * 10 < value:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude  # pragma: no cover


def chart_svg(points: list[HourPoint], title: str = "") -> SafeString:
    """An inline SVG of the hourly points: stacked bars of tasks that succeeded and failed,
    a line of tasks enqueued (left axis), and a dashed line of the backlog (right axis).

    Rendered on the server, with every number also in a ``<title>`` (a tooltip, and text for
    screen readers); no script and no stylesheet are needed.
    """
    if not points:
        return mark_safe("")
    width, height = CHART_WIDTH, CHART_HEIGHT
    plot_w = width - _PAD_LEFT - _PAD_RIGHT
    plot_h = height - _PAD_TOP - _PAD_BOTTOM
    left_max = _nice_max(max(max(p.succeeded + p.failed, p.enqueued) for p in points))
    right_max = _nice_max(max(p.backlog for p in points))
    slot = plot_w / len(points)
    bar_w = max(slot * 0.7, 1)

    def y_left(value: float) -> float:
        return _PAD_TOP + plot_h - plot_h * value / left_max

    def y_right(value: float) -> float:
        return _PAD_TOP + plot_h - plot_h * value / right_max

    parts: list[SafeString] = []
    # Grid and axes: 0, half and max on both sides.
    for fraction in (0, 0.5, 1):
        y = _PAD_TOP + plot_h - plot_h * fraction
        parts.append(format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#ccc" stroke-width="1"/>'
            '<text x="{}" y="{}" text-anchor="end" font-size="11" fill="#666">{}</text>'
            '<text x="{}" y="{}" text-anchor="start" font-size="11" fill="{}">{}</text>',
            _PAD_LEFT, _f(y), _PAD_LEFT + plot_w, _f(y), _PAD_LEFT - 6, _f(y + 4),
            _fmt_int(left_max * fraction), _PAD_LEFT + plot_w + 6, _f(y + 4), COLORS["backlog"],
            _fmt_int(right_max * fraction),
        ))
    line_enqueued: list[str] = []
    line_backlog: list[str] = []
    for i, point in enumerate(points):
        x = _PAD_LEFT + slot * i + (slot - bar_w) / 2
        center = _PAD_LEFT + slot * i + slot / 2
        label = point.hour.strftime("%H:00")
        tooltip = (f"{point.hour:%Y-%m-%d %H:00} UTC: {point.succeeded} succeeded, "
                   f"{point.failed} failed, {point.cancelled} cancelled, {point.enqueued} "
                   f"enqueued, ≈{point.backlog} waiting or running at the end")
        y_ok = y_left(point.succeeded)
        y_failed = y_left(point.succeeded + point.failed)
        parts.append(format_html(
            '<g class="hour"><title>{}</title>'
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>'
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>'
            '<rect x="{}" y="{}" width="{}" height="{}" fill="transparent"/></g>',
            tooltip,
            _f(x), _f(y_ok), _f(bar_w), _f(_PAD_TOP + plot_h - y_ok), COLORS["succeeded"],
            _f(x), _f(y_failed), _f(bar_w), _f(y_ok - y_failed), COLORS["failed"],
            _f(_PAD_LEFT + slot * i), _PAD_TOP, _f(slot), plot_h,
        ))
        line_enqueued.append(f"{center:.1f},{y_left(point.enqueued):.1f}")
        line_backlog.append(f"{center:.1f},{y_right(point.backlog):.1f}")
        if i % 3 == len(points) % 3 or len(points) <= 8:
            parts.append(format_html(
                '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#666">{}'
                '</text>', _f(center), height - _PAD_BOTTOM + 16, label,
            ))
    parts.append(format_html(
        '<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>'
        '<polyline points="{}" fill="none" stroke="{}" stroke-width="2" '
        'stroke-dasharray="6 4"/>',
        " ".join(line_enqueued), COLORS["enqueued"], " ".join(line_backlog), COLORS["backlog"],
    ))
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="pgtasks-chart" role="img" '
        'viewBox="0 0 {} {}" width="100%" style="max-width:{}px" aria-label="{}">{}</svg>',
        width, height, width, title, format_html_join("", "{}", ((p,) for p in parts)),
    )


def _f(value: float) -> str:
    return f"{value:.1f}"


def _fmt_int(value: float) -> str:
    return f"{round(value):,}"
