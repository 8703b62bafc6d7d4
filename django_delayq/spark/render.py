"""Writing a :class:`~.report.Report`: CSV files, an SVG chart and a text table."""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from .report import ALL_TASKS, Report

CHART_FILE = "report.svg"


def _cell(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, float):
        return round(value, 6)
    return "" if value is None else value


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Write the CSVs and the chart into ``out_dir`` (created); return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary_columns = list(report.summary[0]) if report.summary else ["queue", "task_name"]
    offender_columns = ["job_id", "queue", "task_name", "status", "attempts", "run_at",
                        "started_at", "finished_at"]
    tables = {
        "summary.csv": (report.summary, summary_columns),
        "timeline.csv": (report.timeline, ["queue", "bucket", "completed", "failed", "per_min",
                                           "lateness_p50", "lateness_p95"]),
        "latest.csv": (report.latest, [*offender_columns, "lateness"]),
        "longest.csv": (report.longest, [*offender_columns, "duration"]),
    }
    paths = []
    for name, (rows, columns) in tables.items():
        write_csv(out / name, rows, columns)
        paths.append(out / name)
    paths.append(write_chart(report, out / CHART_FILE))
    return paths


#: Colours of the queues' lines, in order (Okabe and Ito's, told apart by colour-blind
#: readers too); a ninth queue takes the first colour again.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000",
           "#999999")
WIDTH, HEIGHT = 900, 560
LEFT, RIGHT = 70, 700  # the plots' x range; the legend is right of it
PANELS = ((40, 240), (300, 500))  # (top, bottom) of the lateness and the throughput plot
X_TICKS = 6

#: One line of a panel: its legend label, colour, dashed or not, and (time, value) points.
Series = tuple[str, str, bool, list[tuple[dt.datetime, float]]]


def write_chart(report: Report, path: Path) -> Path:
    """Lateness (p50 and p95) and throughput per queue over time, as an SVG file.

    Drawn here, with the standard library: the report needs no plotting package.
    """
    queues = sorted({r["queue"] for r in report.timeline})
    times = sorted({r["bucket"] for r in report.timeline})
    late: list[Series] = []
    rate: list[Series] = []
    for i, queue in enumerate(queues):
        colour = PALETTE[i % len(PALETTE)]
        rows = [r for r in report.timeline if r["queue"] == queue]
        for key, dashed in (("lateness_p50", False), ("lateness_p95", True)):
            points = [(r["bucket"], float(r[key])) for r in rows if r[key] is not None]
            late.append((f"{queue} {key[-3:]}", colour, dashed, points))
        rate.append((queue, colour, False, [(r["bucket"], float(r["per_min"])) for r in rows]))
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>']
    minutes = report.bucket_seconds // 60
    for (top, bottom), title, unit, series in (
            (PANELS[0], "Start lateness (started_at - run_at)", "start lateness (s)", late),
            (PANELS[1], f"Throughput ({minutes}-minute buckets, UTC)", "jobs finished / min",
             rate)):
        svg += _panel(title, unit, top, bottom, times, series)
    if not queues:
        svg.append(_text(f"{(LEFT + RIGHT) / 2:.0f}", f"{sum(PANELS[0]) / 2:.0f}",
                         "no started or finished jobs in the window", 'text-anchor="middle"'))
    svg.append("</svg>\n")
    path.write_text("\n".join(svg), encoding="utf-8")
    return path


def _panel(title: str, unit: str, top: int, bottom: int, times: list[dt.datetime],
           series: list[Series]) -> list[str]:
    """One plot: frame, grid, axes' labels, a polyline per series, and its legend."""
    most = max((v for *_, points in series for _, v in points), default=0.0)
    ceiling = _nice_ceiling(most)
    first, last = (times[0], times[-1]) if times else (None, None)
    span = (last - first).total_seconds() if first and last and last > first else 0.0

    def x(t: dt.datetime) -> float:
        if first is None or not span:
            return (LEFT + RIGHT) / 2
        return LEFT + (RIGHT - LEFT) * (t - first).total_seconds() / span

    def y(v: float) -> float:
        return bottom - (bottom - top) * v / ceiling

    out = [f'<rect x="{LEFT}" y="{top}" width="{RIGHT - LEFT}" height="{bottom - top}" '
           'fill="none" stroke="#444444"/>',
           _text(f"{LEFT}", f"{top - 10}", title, 'font-size="14" font-weight="bold"'),
           _text(f"{LEFT - 50}", f"{(top + bottom) / 2:.0f}", unit,
                 f'transform="rotate(-90 {LEFT - 50} {(top + bottom) / 2:.0f})" '
                 'text-anchor="middle"')]
    for i in range(5):
        value = ceiling * i / 4
        out.append(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                   'stroke="#dddddd"/>')
        out.append(_text(f"{LEFT - 6}", f"{y(value) + 4:.1f}", f"{value:g}",
                         'text-anchor="end"'))
    ticks = [times[round(i * (len(times) - 1) / (X_TICKS - 1))]
             for i in range(X_TICKS if times else 0)]
    for t in dict.fromkeys(ticks):
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}" '
                   'stroke="#dddddd"/>')
        out.append(_text(f"{x(t):.1f}", f"{bottom + 16}",
                         t.astimezone(dt.UTC).strftime("%m-%d %H:%M"), 'text-anchor="middle"'))
    step = min(16.0, (bottom - top - 4) / max(len(series), 1))  # the legend fits its plot
    for i, (label, colour, dashed, points) in enumerate(series):
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        if len(points) > 1:
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                       f'stroke-width="1.5"{dash}/>')
        elif points:  # a lone point: a dot
            ((t, v),) = points
            out.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{colour}"/>')
        ly = top + 12 + step * i
        out.append(f'<line x1="{RIGHT + 12}" x2="{RIGHT + 36}" y1="{ly - 4:.1f}" '
                   f'y2="{ly - 4:.1f}" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(_text(f"{RIGHT + 42}", f"{ly:.1f}", label))
    return out


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value)


def _text(x: str, y: str, text: str, attributes: str = "") -> str:
    return f'<text x="{x}" y="{y}" {attributes}>{escape(text)}</text>'


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_table(report: Report) -> str:
    """The summary as a fixed-width text table, one line per queue and task."""
    headers = ["queue", "task", "total", "done", "failed", "success", "late p50",
               "late p95", "late p99", "dur p50", "dur p95", "dur p99", "per min"]
    lines = []
    for r in report.summary:
        rate = r["success_rate"]
        lines.append([
            r["queue"], "(all)" if r["task_name"] == ALL_TASKS else r["task_name"],
            str(r["total"]), str(r["completed"]), str(r["failed"]),
            "-" if rate is None else f"{rate:.1%}",
            _num(r["lateness_p50"]), _num(r["lateness_p95"]), _num(r["lateness_p99"]),
            _num(r["duration_p50"]), _num(r["duration_p95"]), _num(r["duration_p99"]),
            _num(r["throughput_per_min"], 2),
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(headers)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    out = [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(line) for line in lines)]
    if not lines:
        out.append("(no jobs in the window)")
    out.append(f"{report.jobs} jobs; lateness and durations in seconds (exact percentiles); "
               f"per min over {report.window_minutes:.1f} minutes")
    damaged = sum(r["damaged"] for r in report.summary if r["task_name"] == ALL_TASKS)
    if damaged:
        out.append(f"{damaged} jobs mirrored from damaged records: their unreadable fields "
                   f"count as defaults (the damaged column of the history says which)")
    return "\n".join(out)
