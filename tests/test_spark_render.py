"""The report's SVG chart (``spark/render.py``), drawn without Spark or a plotting package."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from django_delayq.spark.render import LEFT, PANELS, RIGHT, write_chart
from django_delayq.spark.report import Report

SVG = "{http://www.w3.org/2000/svg}"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def row(queue: str, minute: int, per_min: float, p50: float | None,
        p95: float | None) -> dict[str, Any]:
    return {"queue": queue, "bucket": T0 + dt.timedelta(minutes=minute), "completed": 1,
            "failed": 0, "per_min": per_min, "lateness_p50": p50, "lateness_p95": p95}


def draw(report: Report, tmp_path: Path) -> ET.Element:
    path = write_chart(report, tmp_path / "report.svg")
    return ET.parse(path).getroot()  # well-formed XML, or this raises


def points(line: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in
            (pair.split(",") for pair in line.attrib["points"].split())]


def test_each_queue_gets_a_lateness_p50_p95_and_a_throughput_line(tmp_path: Path) -> None:
    report = Report(timeline=[
        row("emails", 0, 0, 0.5, 2.0), row("emails", 1, 5, None, None),
        row("emails", 2, 10, 1.0, 4.0),
        row("a & <b>", 0, 1, 0.1, 0.2), row("a & <b>", 2, 2, 0.3, 0.4),
    ])
    svg = draw(report, tmp_path)
    assert svg.tag == f"{SVG}svg"
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert {"a & <b> p50", "a & <b> p95", "a & <b>", "emails p50", "emails p95",
            "emails"} <= set(texts)
    assert "Throughput (1-minute buckets, UTC)" in texts
    assert "03-01 12:00" in texts
    assert "03-01 12:02" in texts
    lines = svg.findall(f"{SVG}polyline")
    # lateness p50 and p95 of each queue (p95 dashed), then the throughput of each
    assert len(lines) == 6
    assert ["stroke-dasharray" in line.attrib for line in lines[:4]] == [False, True] * 2
    emails_rate = points(lines[5])
    # 0, 5, 10 jobs/min over 12:00-12:02: bottom to top of the throughput plot, left to
    # right (10 is the axis's top)
    top, bottom = PANELS[1]
    assert emails_rate == [(LEFT, bottom), ((LEFT + RIGHT) / 2, (top + bottom) / 2),
                           (RIGHT, top)]
    # the minute without a start has no lateness point
    assert len(points(lines[2])) == 2
    assert lines[2].attrib["stroke"] == lines[5].attrib["stroke"] != lines[4].attrib["stroke"]


def test_a_lone_bucket_is_a_dot_and_an_empty_report_says_so(tmp_path: Path) -> None:
    svg = draw(Report(timeline=[row("solo", 0, 3, 0.2, 0.3)]), tmp_path)
    assert not svg.findall(f"{SVG}polyline")
    assert len(svg.findall(f"{SVG}circle")) == 3

    empty = draw(Report(), tmp_path)
    assert not empty.findall(f"{SVG}polyline")
    assert not empty.findall(f"{SVG}circle")
    assert "no started or finished jobs in the window" in [
        t.text for t in empty.iter(f"{SVG}text")]
