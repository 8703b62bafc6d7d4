"""Writing a :class:`~.report.Report`: CSV files, a PNG chart and a text table."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import ALL_TASKS, Report

CHART_FILE = "report.png"


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


def write_chart(report: Report, path: Path) -> Path:
    """Lateness (p50 and p95) and throughput per queue over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, (late_ax, rate_ax) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    try:
        queues = sorted({r["queue"] for r in report.timeline})
        for queue in queues:
            rows = [r for r in report.timeline if r["queue"] == queue]
            late = [r for r in rows if r["lateness_p50"] is not None]
            if late:
                line, = late_ax.plot([r["bucket"] for r in late],
                                     [r["lateness_p50"] for r in late],
                                     label=f"{queue} p50", marker=".")
                late_ax.plot([r["bucket"] for r in late], [r["lateness_p95"] for r in late],
                             label=f"{queue} p95", linestyle="--", color=line.get_color())
            rate_ax.plot([r["bucket"] for r in rows], [r["per_min"] for r in rows],
                         label=queue, marker=".")
        late_ax.set_ylabel("start lateness (s)")
        late_ax.set_title("Start lateness (started_at - run_at)")
        rate_ax.set_ylabel("jobs finished / min")
        rate_ax.set_title(f"Throughput ({report.bucket_seconds // 60}-minute buckets, UTC)")
        for ax in (late_ax, rate_ax):
            ax.grid(True, alpha=0.3)
            if queues:
                ax.legend(loc="upper right", fontsize="small")
        if not queues:
            late_ax.text(0.5, 0.5, "no started or finished jobs in the window",
                         ha="center", va="center", transform=late_ax.transAxes)
        rate_ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=dt.UTC))
        fig.autofmt_xdate()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


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
