"""What every benchmark script shares: its ``--scale`` and ``--out`` options, the machine
and load it ran on, and its results file (``<out>/<name>.json``), which ``bench.report``
turns into tables."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's argument parser: its docstring's first paragraph, ``--scale`` and
    ``--out``."""
    made = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    made.add_argument("--scale", type=float,
                        default=float(os.environ.get("BENCH_SCALE") or 1.0),
                        help="multiply every workload size (default $BENCH_SCALE or 1)")
    made.add_argument("--out", default=os.environ.get("BENCH_OUT") or str(RESULTS_DIR),
                        help="directory of the results files (default $BENCH_OUT or "
                             "bench/results)")
    return made


def scaled(n: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(n * scale))


def load() -> list[float]:
    """The load averages (1, 5, 15 min), rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Run:
    """One script's run: when it started, the load then and at the end."""

    def __init__(self, name: str, scale: float) -> None:
        self.name = name
        self.scale = scale
        self.started = time.monotonic()
        self.date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.load_start = load()

    def environment(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "python": platform.python_version(),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "scale": self.scale,
            "duration_s": round(time.monotonic() - self.started, 1),
            # Other work on the machine skews every figure: keep a trace of it.
            "load_average_start": self.load_start,
            "load_average_end": load(),
        }

    def write(self, out: str | Path, figures: dict[str, Any]) -> Path:
        """``<out>/<name>.json``: ``{"benchmark", "environment", **figures}``."""
        path = Path(out) / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"benchmark": self.name, "environment": self.environment(), **figures}
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path
