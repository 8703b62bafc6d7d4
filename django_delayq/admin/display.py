"""How the admin shows a job's values: badges, times, progress, periodic ids, attempts,
workflow trees.

Every helper escapes what it is given (job data is user data) and returns HTML or text.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ..conf import aware_time
from ..engine.jobhash import attempt_entries
from ..models import JobStatus

#: Badge colours per status (background, text).
STATUS_COLOURS = {
    JobStatus.WAITING: ("#7b6aa8", "#fff"),
    JobStatus.SCHEDULED: ("#5b7fbd", "#fff"),
    JobStatus.READY: ("#2f6fab", "#fff"),
    JobStatus.ACTIVE: ("#a35f00", "#fff"),
    JobStatus.COMPLETED: ("#2e7d32", "#fff"),
    JobStatus.FAILED: ("#c62828", "#fff"),
    JobStatus.CANCELLED: ("#616161", "#fff"),
    JobStatus.PURGED: ("#424242", "#fff"),
}

#: ``cron:<task>:<epoch ms>``, the id of one occurrence of a periodic task.
PERIODIC_ID = re.compile(r"^cron:(?P<task>.+):(?P<ms>\d{10,16})$")


def status_badge(status: str, *, missing_at: Any = None) -> SafeString:
    """A coloured badge for a job status (unknown statuses render grey); for a row whose
    job the mirror found gone from Redis (``missing_at``), a second badge says so."""
    background, colour = STATUS_COLOURS.get(status, ("#757575", "#fff"))
    label = JobStatus(status).label if status in JobStatus.values else status
    badge = format_html(
        '<span class="dq-badge dq-status-{}" style="background:{};color:{};padding:2px 8px;'
        'border-radius:9px;font-size:11px;font-weight:600;white-space:nowrap">{}</span>',
        status, background, colour, label)
    if missing_at is None:
        return badge
    return format_html('{} <span class="dq-badge dq-missing" title="{}" style="background:'
                       '#b71c1c;color:#fff;padding:2px 8px;border-radius:9px;font-size:11px;'
                       'white-space:nowrap">gone from Redis</span>', badge,
                       f"found gone from Redis at {missing_at:%Y-%m-%d %H:%M:%S %Z}")


def pre(text: str) -> SafeString:
    """Text as it is (a traceback, an error, JSON), in a ``<pre>`` block, escaped; "-" for
    none."""
    return format_html('<pre class="dq-pre">{}</pre>', text) if text else format_html("{}", "-")


def pretty_json(value: Any) -> SafeString:
    """A JSON value in a ``<pre>`` block, escaped."""
    return pre(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def short_json(value: Any, limit: int = 60) -> str:
    """A JSON value on one line, cut to ``limit`` characters (for a list column)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _local(value: dt.datetime) -> dt.datetime:
    """``value`` in the current time zone; a naive one (a row's time with ``USE_TZ``
    off) is in ``TIME_ZONE`` (:func:`~django_delayq.conf.aware_time`)."""
    return timezone.localtime(aware_time(value))


def when(value: dt.datetime | None) -> str:
    """A time to the millisecond in the current time zone, with its name."""
    if value is None:
        return "-"
    local = _local(value)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname()}"


def when_short(value: dt.datetime | None) -> str:
    """A time to the second in the current time zone (list columns: the zone is in the
    column's header, :func:`zoned_header`)."""
    return "-" if value is None else f"{_local(value):%m-%d %H:%M:%S}"


def clock(value: dt.datetime | None) -> str:
    """The time of day to the second in the current time zone."""
    return "-" if value is None else f"{_local(value):%H:%M:%S}"


def zoned_header(name: str) -> str:
    """A list's time column header, naming the zone its times are shown in."""
    return f"{name} ({timezone.get_current_timezone_name()})"


def seconds(value: float | None) -> str:
    """A duration as people read it: ms under a second, s under a minute, else m s."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.2f} s"
    return f"{int(value // 60)} m {value % 60:.0f} s"


def progress_bar(fraction: float | None, message: str) -> SafeString | str:
    """A job's reported progress: a ``<progress>`` bar, the percent and the message."""
    if fraction is None:
        return "-"
    return format_html('<span class="dq-progress"><progress max="1" value="{}">{}%</progress> '
                       '{}%{}</span>', fraction, f"{fraction * 100:.0f}",
                       f"{fraction * 100:.0f}", format_html(" — {}", message) if message else "")


def job_label(job_id: str, task_name: str = "") -> SafeString:
    """The job id, or for a periodic occurrence its task's short name and scheduled time
    (the full id in the tooltip)."""
    match = PERIODIC_ID.match(job_id)
    if match is None:
        return format_html("{}", job_id)
    at = dt.datetime.fromtimestamp(int(match["ms"]) / 1000, tz=dt.UTC)
    task = task_name or match["task"]
    return format_html('<span class="dq-periodic" title="{}">⟳ {} @ {}</span>', job_id,
                       task.rsplit(".", 1)[-1], when_short(at))


def attempts_table(log: Any) -> SafeString | str:
    """The mirrored attempt log as a table; a failed attempt's traceback folded in its
    row. An entry that cannot be read shows what could be. Where a run follows a failed
    or aborted attempt, it was retried by hand, and a row says so (up to 0.1.0 the
    numbering started again there, which is read the same way)."""
    entries = attempt_entries(log)
    if not entries:
        return "-"
    rows = []
    previous, ended = 0, False
    for e in entries:
        if ended or (e["attempt"] and previous and e["attempt"] <= previous):
            rows.append(format_html('<tr class="dq-retry-mark"><td colspan="8">retried by '
                                    "hand: attempt {} began a new budget</td></tr>",
                                    e["attempt"]))
        previous, ended = e["attempt"] or previous, e["outcome"] in ("failed", "aborted")
        start, end = e["started_at"], e["finished_at"]
        duration = (end - start).total_seconds() if start and end else None
        tb = e["traceback"]
        rows.append(format_html(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td class="dq-error-cell">{}</td><td class="dq-tb-cell">{}</td></tr>',
            e["attempt"] or "", e["worker"] or "-", when(start), when(end),
            seconds(duration), e["outcome"] or "-", e["error"] or "-",
            format_html('<details class="dq-tb"><summary>traceback</summary>{}</details>',
                        pre(tb)) if tb else "-"))
    return format_html('<table class="dq-attempts"><thead><tr><th>#</th><th>worker</th>'
                       "<th>started</th><th>ended</th><th>duration</th><th>outcome</th>"
                       "<th>error</th><th>traceback (its end)</th></tr></thead><tbody>{}"
                       "</tbody></table>", format_html_join("", "{}", ((r,) for r in rows)))


def job_link(queue: str, job_id: str, pk: int | None) -> str:
    """The job page of a mirrored job, else the job list filtered to it (its row may not
    exist yet)."""
    if pk is not None:
        return reverse("admin:django_delayq_job_change", args=[pk])
    return (reverse("admin:django_delayq_job_changelist") + "?"
            + urlencode({"q": job_id, "queue__exact": queue}))


def _branch(nodes: list[dict[str, Any]], direction: str,
            pks: dict[tuple[str, str], int]) -> SafeString:
    items = [format_html(
        '<li>{} <a href="{}">{}</a> <span class="dq-quiet">{}{}</span>{}{}</li>',
        status_badge(node["status"]), job_link(node["queue"], node["job_id"],
                                               pks.get((node["queue"], node["job_id"]))),
        node["job_id"], node["task"].rsplit(".", 1)[-1],
        f" ({node['queue']})" if node["queue"] else "",
        _branch(node.get(direction, []), direction, pks) if node.get(direction) else "",
        format_html('<ul><li class="dq-quiet">… {} more</li></ul>', node["more"])
        if node.get("more") else "")
        for node in nodes]
    return format_html("<ul>{}</ul>", format_html_join("", "{}", ((i,) for i in items)))


def workflow_trees(flow: dict[str, Any], pks: dict[tuple[str, str], int]) -> SafeString:
    """A job's ancestors and descendants (``workflows.view.workflow``) as two nested lists,
    each job with its status badge and a link; ``pks``: the mirrored rows by (queue, id)."""
    parts = []
    for label, key in (("Waits for", "parents"), ("Then", "children")):
        if not flow[key]:
            continue
        total, shown = flow[f"{key}_total"], len(flow[key])
        extra = format_html(" (the first {} of {})", shown, total) if total > shown else ""
        parts.append(format_html('<div class="dq-tree dq-tree-{}"><strong>{}</strong>{}{}'
                                 "</div>", key, label, extra, _branch(flow[key], key, pks)))
    return format_html('<div class="dq-workflow">{}</div>',
                       format_html_join("", "{}", ((p,) for p in parts)))
