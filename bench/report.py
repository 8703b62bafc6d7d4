"""Turn the results files into ``latest.md`` and the bar chart.

    python -m bench.report [bench/results]   # rewrites latest.md and latest.png

``latest.md`` holds the table of ``latest.json`` (``bench.run``), its targets, django-delayq's
own rows, and a section per other results file in the same directory (``shards.json``,
``workflows.json``, ... : ``bench.tables.SCRIPTS``). The chart needs matplotlib;
:func:`chart_anywhere` uses it from the running interpreter, or else from the peers'
virtualenv (which installs it), or skips the chart with a note. Standard library only.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import tables

BENCH_DIR = Path(__file__).resolve().parent
TARGETS_FILE = BENCH_DIR / "targets.json"

LABELS = {
    "django_delayq": "django-delayq",
    "rq": "RQ",
    "celery": "Celery",
    "dramatiq": "Dramatiq",
    "huey": "Huey",
    "arq": "arq",
    "saq": "SAQ",
}
COLUMNS = [
    ("enqueue/s", "enqueue_per_s", "{:,.0f}"),
    ("vs ZADD", "enqueue_vs_zadd", "{:.2f}"),
    ("bulk enqueue/s", "bulk_enqueue_per_s", "{:,.0f}"),
    ("process/s 1 proc", "process_per_s_1proc", "{:,.0f}"),
    ("process/s 2 procs", "process_per_s_2proc", "{:,.0f}"),
    ("lateness p50 ms", "lateness_ms.p50", "{:,.1f}"),
    ("p95 ms", "lateness_ms.p95", "{:,.1f}"),
    ("p99 ms", "lateness_ms.p99", "{:,.1f}"),
    ("max ms", "lateness_ms.max", "{:,.1f}"),
    ("early", "early", "{:,.0f}"),
    ("bytes/delayed job", "redis_bytes_per_delayed_job", "{:,.0f}"),
    ("enqueue growth", "enqueue_growth_ratio", "{:.2f}"),
    ("growth vs ZADD", "enqueue_growth_ratio_vs_zadd", "{:.2f}"),
]


CPU_COLUMNS = [
    ("enqueue: client µs/call", "enqueue_cpu_us.client", "{:,.1f}"),
    ("Redis µs/call", "enqueue_cpu_us.redis", "{:,.1f}"),
    ("1 proc: workers µs/job", "process_cpu_us_per_job_1proc.workers", "{:,.1f}"),
    ("Redis µs/job", "process_cpu_us_per_job_1proc.redis", "{:,.1f}"),
    ("cores busy", "cores_busy_1proc", "{:.2f}"),
    ("2 procs: workers µs/job", "process_cpu_us_per_job_2proc.workers", "{:,.1f}"),
    ("Redis µs/job", "process_cpu_us_per_job_2proc.redis", "{:,.1f}"),
    ("cores busy", "cores_busy_2proc", "{:.2f}"),
    ("2 procs at most (x 1 proc)", "process_2proc_cpu_bound_x", "{:.2f}"),
]


def get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _load(env: dict[str, Any], key: str) -> str:
    values = env.get(key)
    return "/".join(f"{v:.1f}" for v in values) if values else "n/a"


def fmt(value: Any, spec: str) -> str:
    if value is None:
        return "n/a"
    return spec.format(value)


# --- targets -------------------------------------------------------------------------


def _reference(data: dict[str, Any], target: dict[str, Any]) -> tuple[float | None, str]:
    """The number a target compares against, and how to say it."""
    factor = float(target.get("factor", 1))
    ref = target["ref"]
    if isinstance(ref, int | float):
        return float(ref), f"{ref:g}"
    if ref.startswith("best_peer:"):
        metric = ref.split(":", 1)[1]
        better_low = target["op"] in ("<", "<=")
        among = target.get("peers")  # optional: only these libraries count
        peers = {
            lib: get(res, metric) for lib, res in data["results"].items()
            if lib != "django_delayq" and (among is None or lib in among)
        }
        peers = {k: v for k, v in peers.items() if v is not None}
        if not peers:
            return None, f"best peer {metric}"
        lib = (min if better_low else max)(peers, key=lambda k: peers[k])
        return peers[lib] * factor, f"{_times(factor)}{LABELS.get(lib, lib)} {metric}"
    return (None if get(data, ref) is None else get(data, ref) * factor), f"{_times(factor)}{ref}"


def _times(factor: float) -> str:
    return "" if factor == 1 else f"{factor:g} x "


def _metric(data: dict[str, Any], path: str) -> float | None:
    """A target's figure: one path, or the sum of paths joined by ``+`` (CPU per job of
    the workers and of Redis, say); None if any is missing."""
    values = [get(data, part.strip()) for part in path.split("+")]
    return None if None in values else sum(values)


def evaluate_targets(data: dict[str, Any], targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        value = _metric(data, t["metric"])
        ref, ref_text = _reference(data, t)
        holds: bool | None
        if value is None or ref is None:
            holds = None
        else:
            holds = {
                ">=": value >= ref,
                ">": value > ref,
                "<=": value <= ref,
                "<": value < ref,
                "==": math.isclose(value, ref),
            }[t["op"]]
        rows.append(
            {**t, "value": value, "reference": ref, "reference_text": ref_text, "holds": holds}
        )
    return rows


def load_targets() -> list[dict[str, Any]]:
    if not TARGETS_FILE.exists():
        return []
    targets: list[dict[str, Any]] = json.loads(TARGETS_FILE.read_text())["targets"]
    return targets


# --- markdown ------------------------------------------------------------------------


def _table(results: dict[str, Any], columns: list[tuple[str, str, str]]) -> list[str]:
    """A markdown table with a row per library and a column per (title, path, format)."""
    lines = [
        "| library | " + " | ".join(c[0] for c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for lib, res in results.items():
        cells = [fmt(get(res, path), spec) for _, path, spec in columns]
        lines.append(f"| {LABELS.get(lib, lib)} | " + " | ".join(cells) + " |")
    return lines


def _floor(ceiling: dict[str, Any]) -> list[str]:
    """The paragraph on the cheapest enqueue calls, if the run measured them."""
    floor = ceiling.get("redis_cpu_us_per_call")
    if not floor:
        return []
    return [
        "",
        f"The cheapest one-round-trip enqueues cost Redis {floor['lpush']:.1f} µs per call "
        f"for an `LPUSH` and {floor['evalsha_return_1']:.1f} µs for an `EVALSHA` of "
        "`return 1` with the 7 keys and 11 arguments of django-delayq's enqueue script (one "
        "call at a time, same Redis): a library's Redis µs per enqueue call beyond these "
        "is the work its enqueue does in Redis.",
    ]


def load_others(directory: Path) -> dict[str, dict[str, Any]]:
    """The stand-alone scripts' results files found in ``directory``, by name."""
    found = {}
    for name in tables.SCRIPTS:
        path = Path(directory) / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def markdown(data: dict[str, Any], others: dict[str, dict[str, Any]] | None = None) -> str:
    env, results, ceiling = data["environment"], data["results"], data["ceiling"]
    lines = [
        "# django-delayq benchmark",
        "",
        f"{env['date']} · Redis {env['redis_version']} · Python {env['python']} · "
        f"{env['cpu']} ({env['cores']} cores) · scale {env['scale']} · "
        f"median of {env['runs']} run(s)",
        "",
        f"Load average (1/5/15 min) at start {_load(env, 'load_average_start')}, at end "
        f"{_load(env, 'load_average_end')}: anything above the core count means the "
        "figures share the CPU with other work.",
        "",
        *_table(results, COLUMNS),
        "",
        f"Ceiling (redis-py on the same Redis): ZADD one call at a time "
        f"{ceiling['zadd_single_per_s']:,.0f}/s, pipelined in 1,000s "
        f"{ceiling['zadd_pipelined_per_s']:,.0f}/s.",
        "",
    ]
    rows = evaluate_targets(data, load_targets())
    if rows and "django_delayq" in results:
        lines += [
            "## Targets",
            "",
            "| target | value | reference | holds |",
            "|---|---:|---:|:---:|",
        ]
        for row in rows:
            verdict = {True: "yes", False: "**no**", None: "n/a"}[row["holds"]]
            lines.append(
                f"| {row['description']} | {fmt(row['value'], '{:,.2f}')} | "
                f"{row['op']} {fmt(row['reference'], '{:,.2f}')} ({row['reference_text']}) "
                f"| {verdict} |"
            )
        lines.append("")
    lines += [
        "## Where the CPU goes",
        "",
        *_table(results, CPU_COLUMNS),
        "",
        "CPU time (user + system) per enqueue call, of the calling process and of Redis "
        "(`INFO cpu`), over a further untimed pass of single enqueues; per processed job, "
        "of every process of the workers' process groups (threads and pool children "
        "included) and of Redis, over the measured window of the processing runs. Redis "
        "time includes reading and answering the calls, and for a processed job the "
        "benchmark's count reports (one call per worker process every 2 ms). **cores busy** "
        "is the processing rate times "
        f"the CPU per job: on {env['cores']} cores, a run near {env['cores']} cannot go "
        "faster without spending less CPU per job. **2 procs at most** is the 2-process "
        f"rate that would keep all {env['cores']} cores busy at the 2-process CPU per job, "
        "as a multiple of the 1-process rate: no 2-process run can beat it.",
        *_floor(ceiling),
        "",
    ]
    if data.get("configurations"):
        tuned = get(results, "django_delayq.process_per_s_1proc")
        lines += tables.configurations(data["configurations"], tuned)
    if data.get("replication"):
        lines += tables.replication(data["replication"])
    lines += [
        "## How each figure is measured",
        "",
        "- **enqueue/s**: immediate no-op jobs, one call at a time, one process. "
        "**vs ZADD**: that rate over the rate of redis-py single-call `ZADD`s timed in "
        "alternating blocks of 100 with it, in the same process and the same seconds "
        "(round trips on a shared machine drift over seconds; the ratio of two rates "
        "measured apart in time carries that drift, this one does not).",
        "- **bulk enqueue/s**: the library's bulk API (below); n/a where it has none.",
        f"- **process/s**: a backlog of {env['sizes']['process_n']:,} no-op jobs drained by 1 "
        "or 2 worker processes (for 2, at least "
        f"{env['sizes'].get('two_process_min_ms', 0) / 1000:g} s of work at the library's "
        "1-process rate: the two start up to half a second apart), measured on the Redis "
        "clock over its middle 80 % (from the "
        "job that finishes 10 % of the backlog to the one that finishes 90 %), or from the "
        "first report of the last worker process to start if that comes later (every task "
        "counts itself in its process; a thread per process adds the count to a Redis "
        "counter every 2 ms, and the report that passes each of those counts stores the "
        "count reached and the Redis `TIME`).",
        f"- **lateness**: {env['sizes']['lateness_n']:,} jobs due "
        f"{env['lateness_window_s'][0]:g}-{env['lateness_window_s'][1]:g} s out, evenly "
        "spread, one worker process; each job reads Redis `TIME` when it starts and "
        "records start - due. **early** counts jobs that started before they were due.",
        f"- **bytes/delayed job**: Redis `used_memory` growth with "
        f"{env['sizes']['memory_n']:,} delayed jobs waiting (no worker running), "
        "divided by their number.",
        f"- **enqueue growth**: single-enqueue rate of delayed jobs with "
        f"{env['sizes']['growth_large_n']:,} waiting divided by the rate with "
        f"{env['sizes']['growth_small_n']:,} waiting (1.0 = no slowdown). **growth vs "
        "ZADD**: the same ratio with each rate first divided by the ZADD rate timed "
        "alongside it, which takes out the drift of the machine between the two.",
        "",
        "## Library notes",
        "",
    ]
    for lib, notes in env.get("notes", {}).items():
        versions = env.get("library_versions", {}).get(lib) or {}
        vtext = ", ".join(f"{k} {v}" for k, v in versions.items())
        lines.append(
            f"- **{LABELS.get(lib, lib)}** ({vtext}): "
            + "; ".join(f"{k}: {v if v is not None else 'none'}" for k, v in notes.items())
        )
    lines += ["", *tables.scripts(others or {})]
    errors = env.get("errors") or {}
    if errors:
        lines += ["", "## Errors", ""]
        for lib, errs in errors.items():
            lines += [f"- {LABELS.get(lib, lib)}: {e}" for e in errs]
    return "\n".join(lines) + "\n"


# --- chart ---------------------------------------------------------------------------

PANELS = [
    ("enqueue_per_s", "enqueue (jobs/s)", False),
    ("bulk_enqueue_per_s", "bulk enqueue (jobs/s)", False),
    ("process_per_s_1proc", "process, 1 worker process (jobs/s)", False),
    ("process_per_s_2proc", "process, 2 worker processes (jobs/s)", False),
    ("lateness_ms.p99", "delayed-job lateness p99 (ms, log)", True),
    ("redis_bytes_per_delayed_job", "Redis bytes per delayed job", False),
]


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = data["results"]
    libs = list(results)
    names = [LABELS.get(lib, lib) for lib in libs]
    colors = ["#c0392b" if lib == "django_delayq" else "#7f8c8d" for lib in libs]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (metric, title, log_scale) in zip(axes.flat, PANELS, strict=True):
        values = [get(results[lib], metric) for lib in libs]
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(names, heights, color=colors)
        ax.set_title(title, fontsize=11)
        top = max(heights, default=0) or 1
        if log_scale and any(h > 0 for h in heights):
            ax.set_yscale("log")
            ax.set_ylim(top=top * 3)
        else:
            ax.set_ylim(top=top * 1.12)  # room for the value labels
        ax.tick_params(axis="x", labelrotation=30, labelsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        for bar, v in zip(bars, values, strict=True):
            label = "n/a" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")
            y = bar.get_height() if v else (ax.get_ylim()[0] if log_scale else 0)
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    env = data["environment"]
    fig.suptitle(
        f"django-delayq vs peers on one Redis {env['redis_version']} · {env['cores']} cores · "
        f"median of {env['runs']} run(s) · scale {env['scale']}",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_anywhere(json_path: Path, png_path: Path, peers_python: str | None) -> bool:
    """Draw the chart here if matplotlib imports, else with the peers' interpreter."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if peers_python and Path(peers_python).exists():
            done = subprocess.run(
                [peers_python, "-m", "bench.report", str(json_path), "--chart-only",
                 str(png_path)],
                cwd=str(BENCH_DIR.parent), check=False,
            )
            return done.returncode == 0
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return False
    chart(json.loads(Path(json_path).read_text()), Path(png_path))
    return True


def main(argv: list[str]) -> int:
    """``[DIR or DIR/latest.json]``: rewrite latest.md and latest.png there;
    ``JSON --chart-only PNG``: draw the chart alone."""
    given = Path(argv[0]) if argv else BENCH_DIR / "results"
    json_path = given / "latest.json" if given.is_dir() else given
    data = json.loads(json_path.read_text())
    if len(argv) >= 3 and argv[1] == "--chart-only":
        chart(data, Path(argv[2]))
        return 0
    json_path.with_suffix(".md").write_text(markdown(data, load_others(json_path.parent)))
    chart_anywhere(json_path, json_path.with_suffix(".png"),
                   str(BENCH_DIR / ".venv-peers" / "bin" / "python"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
