"""The benchmark harness end to end on a tiny scale, so it cannot rot.

Runs ``bench/run.py`` in a subprocess with its own throwaway Redis. Only django-delayq
and the ZADD ceiling are measured, plus RQ when the peers' virtualenv already exists
(``make bench`` creates it; this test never installs it). No timing is asserted: only
the shape of ``latest.json`` and that every figure is a positive number.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"
LIBRARY_KEYS = {
    "enqueue_per_s",
    "bulk_enqueue_per_s",
    "process_per_s_1proc",
    "process_per_s_2proc",
    "lateness_ms",
    "early",
    "redis_bytes_per_delayed_job",
    "enqueue_growth_ratio",
    "enqueue_vs_zadd",
    "enqueue_growth_ratio_vs_zadd",
}
CPU_KEYS = {
    "enqueue_cpu_us",
    "process_cpu_us_per_job_1proc",
    "process_cpu_us_per_job_2proc",
    "cores_busy_1proc",
    "cores_busy_2proc",
    "process_2proc_cpu_bound_x",
}


@pytest.fixture(scope="module")
def bench_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    libraries = ["django_delayq"] + (["rq"] if PEERS_PYTHON.exists() else [])
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--scale", "0.001", "--runs", "1",
         "--libraries", ",".join(libraries), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_json_has_every_figure_for_each_library(bench_output: Path) -> None:
    data = json.loads((bench_output / "latest.json").read_text())
    assert set(data) == {"environment", "results", "ceiling", "replication"}
    replication = data["replication"]
    for kind in ("single", "bulk"):
        for n in (0, 1):
            assert replication[f"{kind}_per_s_min_replicas_{n}"] > 0, (kind, n)
    env = data["environment"]
    for key in ("python", "redis_version", "cpu", "library_versions", "date"):
        assert env[key], key
    assert env["errors"] == {}
    assert "django_delayq" in data["results"]
    for lib, res in data["results"].items():
        assert set(res) == LIBRARY_KEYS | CPU_KEYS, lib
        for key in LIBRARY_KEYS - {"lateness_ms", "early"}:
            assert res[key] > 0, (lib, key)
        assert set(res["lateness_ms"]) == {"p50", "p95", "p99", "max"}
        # Lateness may be negative only if jobs start early, which `early` counts.
        assert res["early"] >= 0
        assert all(isinstance(v, float) for v in res["lateness_ms"].values())
        # Every enqueue costs CPU on both sides; a tiny backlog drains too fast for CPU
        # counted in clock ticks, and its processing run then has no per-job figure.
        assert res["enqueue_cpu_us"]["client"] > 0
        assert res["enqueue_cpu_us"]["redis"] > 0
        for procs in ("1proc", "2proc"):
            per_job = res[f"process_cpu_us_per_job_{procs}"]
            assert set(per_job) == {"workers", "redis"}
            assert all(v is None or v > 0 for v in per_job.values()), (lib, per_job)
    assert data["ceiling"]["zadd_single_per_s"] > 0
    assert data["ceiling"]["zadd_pipelined_per_s"] > 0
    floor = data["ceiling"]["redis_cpu_us_per_call"]
    assert set(floor) == {"lpush", "evalsha_return_1"}
    assert all(v > 0 for v in floor.values()), floor


def test_markdown_table_and_chart(bench_output: Path) -> None:
    md = (bench_output / "latest.md").read_text()
    assert "| django-delayq |" in md
    assert "## Targets" in md
    assert "| single (200 jobs), jobs/s |" in md, "the MIN_REPLICAS table"
    if importlib.util.find_spec("matplotlib") is not None or PEERS_PYTHON.exists():
        assert (bench_output / "latest.png").read_bytes().startswith(b"\x89PNG")


def _bench_module(name: str, folder: Path = ROOT / "bench"):
    """A module of bench/ (not a package), imported from its folder."""
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _common():
    return _bench_module("common", ROOT / "bench" / "adapters")


def test_window_opens_once_every_worker_process_runs() -> None:
    common = _common()
    # The second process ran its first job after job lo: the window opens there. A third
    # one that started after job hi took no part in the window.
    firsts = [(1, 9.5), (1_500, 10.2), (9_500, 11.0)]
    assert common.steady_start((1_000, 10.0), 9_000, firsts) == (1_500, 10.2, 2)
    # Every process was running before job lo: the window opens at lo.
    assert common.steady_start((1_000, 10.0), 9_000, [(1, 9.5), (3, 9.6)]) == (1_000, 10.0, 2)


def test_cpu_per_job_is_read_between_the_window_samples() -> None:
    common = _common()
    sampler = common.CpuSampler(None, [])
    # (completion count, monotonic s, Redis CPU s, workers CPU s); the window: jobs 100-900.
    sampler.samples = [(0, 0.0, 1.0, 1.0), (120, 0.1, 1.01, 1.02), (500, 0.25, 1.03, 1.05),
                       (880, 0.5, 1.05, 1.08), (1_000, 0.6, 2.0, 2.0)]
    per_job = sampler.per_job_us(100, 900)
    assert per_job["jobs"] == 760
    assert abs(per_job["redis"] - 1e6 * 0.04 / 760) < 1e-6
    assert abs(per_job["workers"] - 1e6 * 0.06 / 760) < 1e-6
    # One sample inside the window says nothing about a rate of CPU use, and samples
    # closer than a few clock ticks apart say too little.
    assert sampler.per_job_us(400, 600) is None
    assert sampler.per_job_us(100, 500) is None


def test_cpu_of_a_process_group_is_read_from_proc() -> None:
    common = _common()
    group, cpu = common._stat(str(os.getpid()))
    assert group == os.getpgid(0)
    assert cpu >= 0
    assert common._stat("999999999") is None


def test_two_process_bound_is_what_every_core_busy_allows() -> None:
    run = _bench_module("run")

    def process(workers: float, redis: float) -> dict:
        return {"ok": True, "cpu_us": {"workers": workers, "redis": redis}}

    runs = [{"enqueue": {"ok": True, "cpu_us": {"client": 30.0, "redis": 40.0}},
             "process_1": process(14.0, 12.0), "process_2": process(15.0, 10.0)}]
    rates = {"process_per_s_1proc": 40_000.0, "process_per_s_2proc": 60_000.0}
    figures = run.cpu_figures(runs, rates, 2)
    # 2 cores at 25 µs per job allow 80,000 jobs/s: twice the 1-process rate.
    assert abs(figures["process_2proc_cpu_bound_x"] - 2.0) < 1e-9
    assert abs(figures["cores_busy_2proc"] - 1.5) < 1e-9
    # Without a 2-process CPU figure there is no bound either.
    runs[0]["process_2"] = {"ok": True, "cpu_us": None}
    assert run.cpu_figures(runs, rates, 2)["process_2proc_cpu_bound_x"] is None


def test_each_run_starts_with_another_library_and_measures_every_one() -> None:
    run = _bench_module("run")
    libraries = ["a", "b", "c"]
    orders = [run.run_order(libraries, i) for i in range(3)]
    assert [order[0] for order in orders] == ["a", "b", "c"]
    assert all(sorted(order) == libraries for order in orders)
    assert run.run_order(libraries, 3) == libraries


def test_lateness_client_is_ready_before_the_first_due_job(redis_client, monkeypatch) -> None:
    common = _common()
    kwargs = redis_client.connection_pool.connection_kwargs
    monkeypatch.setenv(common.URL_ENV, f"redis://{kwargs['host']}:{kwargs['port']}/9")
    monkeypatch.setattr(common, "_sync_client", None)
    redis_client.script_flush()
    clients_before = len(redis_client.client_list())
    client = common._client()
    try:
        # The script is loaded and the connections opened: a worker thread's first job
        # sends its EVALSHA at once, on a connection of its own.
        assert redis_client.script_exists(common._sync_scripts["late"].sha) == [True]
        assert len(redis_client.client_list()) - clients_before == common.WARM_CONNECTIONS
        assert common._client() is client
    finally:
        client.close()
        client.connection_pool.disconnect()
