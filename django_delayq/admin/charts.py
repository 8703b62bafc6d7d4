"""Inline SVG charts of the dashboard: no script, no external asset, colours from CSS
classes (so dark mode restyles them), a title per bar for mouse and screen reader."""

from __future__ import annotations

import datetime as dt

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..engine.stats import HISTOGRAM_MS, Histogram

WIDTH, HEIGHT = 190, 64
PLOT_TOP, PLOT_BOTTOM, PLOT_LEFT = 10, 50, 26  # the plot area inside the SVG


def _frame(label: str, bars: SafeString, top_label: str, left: str, right: str) -> SafeString:
    """The SVG around ``bars``: a background, the y maximum and the two x end labels."""
    return format_html(
        '<svg class="dq-chart" role="img" aria-label="{}" width="{}" height="{}" '
        'viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">'
        '<rect class="dq-chart-bg" x="{}" y="{}" width="{}" height="{}"/>{}'
        '<text class="dq-chart-text" x="{}" y="{}" text-anchor="end">{}</text>'
        '<text class="dq-chart-text" x="{}" y="{}" text-anchor="end">0</text>'
        '<text class="dq-chart-text" x="{}" y="{}">{}</text>'
        '<text class="dq-chart-text" x="{}" y="{}" text-anchor="end">{}</text></svg>',
        label, WIDTH, HEIGHT, WIDTH, HEIGHT,
        PLOT_LEFT, PLOT_TOP, WIDTH - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP, bars,
        PLOT_LEFT - 3, PLOT_TOP + 8, top_label, PLOT_LEFT - 3, PLOT_BOTTOM,
        PLOT_LEFT, HEIGHT - 3, left, WIDTH, HEIGHT - 3, right)


def throughput_chart(points: list[tuple[dt.datetime, int, int]]) -> SafeString:
    """Jobs finished per minute: completed (green) under failed (red), oldest left."""
    top = max((c + f for _, c, f in points), default=0)
    scale = (PLOT_BOTTOM - PLOT_TOP) / (top or 1)
    width = (WIDTH - PLOT_LEFT) / max(len(points), 1)
    bars = []
    for i, (minute, completed, failed) in enumerate(points):
        if not completed and not failed:
            continue
        x = PLOT_LEFT + i * width
        h_ok, h_bad = completed * scale, failed * scale
        bars.append((f"{minute:%H:%M} UTC: {completed} completed, {failed} failed",
                     f"{x:.1f}", f"{PLOT_BOTTOM - h_ok:.1f}", f"{max(width - 0.6, 0.8):.1f}",
                     f"{h_ok:.1f}", f"{x:.1f}", f"{PLOT_BOTTOM - h_ok - h_bad:.1f}",
                     f"{max(width - 0.6, 0.8):.1f}", f"{h_bad:.1f}"))
    body = format_html_join(
        "", '<g><title>{}</title><rect class="dq-ok" x="{}" y="{}" width="{}" height="{}"/>'
        '<rect class="dq-fail" x="{}" y="{}" width="{}" height="{}"/></g>', bars)
    return _frame(f"Jobs finished per minute over the last hour, at most {top}", body,
                  str(top), "-60 min", "now")


def _bound(ms: float) -> str:
    return f"{ms:g} ms" if ms < 1000 else f"{ms / 1000:g} s"


def quantile(histogram: Histogram, q: float) -> str:
    """The bucket bound under which a fraction ``q`` of the values lie ("-" if none)."""
    total = histogram.count
    if not total:
        return "-"
    running = 0
    for bound, n in zip([*HISTOGRAM_MS, None], histogram.buckets, strict=True):
        running += n
        if running >= q * total:
            return f"≤ {_bound(bound)}" if bound is not None else f"> {_bound(HISTOGRAM_MS[-1])}"
    return "-"


def lateness_chart(histogram: Histogram) -> SafeString:
    """How late jobs started: one bar per bucket, from ≤5 ms (left) to over 5 min."""
    top = max(histogram.buckets, default=0)
    scale = (PLOT_BOTTOM - PLOT_TOP) / (top or 1)
    width = (WIDTH - PLOT_LEFT) / len(histogram.buckets)
    labels = [f"≤ {_bound(ms)}" for ms in HISTOGRAM_MS] + [f"> {_bound(HISTOGRAM_MS[-1])}"]
    bars = [(f"{label}: {n} start(s)", f"{PLOT_LEFT + i * width:.1f}",
             f"{PLOT_BOTTOM - n * scale:.1f}", f"{width - 1.5:.1f}", f"{n * scale:.1f}")
            for i, (label, n) in enumerate(zip(labels, histogram.buckets, strict=True)) if n]
    body = format_html_join("", '<g><title>{}</title><rect class="dq-late" x="{}" y="{}" '
                                'width="{}" height="{}"/></g>', bars)
    return _frame(f"Start lateness of {histogram.count} starts, most in one bucket {top}",
                  body, str(top), "≤5 ms", "> 5 min")
