"""The workloads' arithmetic, and a processing run end to end with stand-in workers."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import redis

from bench.harness import cpu, ops, processes

# A stand-in worker process: runs N no-op "jobs" at a steady pace, then idles until
# stopped, as a queue's worker would.
WORKER = ("import sys, time\n"
          "from bench.harness import marks\n"
          "for i in range(int(sys.argv[1])):\n"
          "    marks.mark_done()\n"
          "    if i % 20 == 0:\n"
          "        time.sleep(0.002)\n"
          "time.sleep(120)\n")


def test_window_opens_once_every_worker_process_runs() -> None:
    # The second process ran its first job after job lo: the window opens there. A third
    # one that started after job hi took no part in the window.
    firsts = [(1, 9.5), (1_500, 10.2), (9_500, 11.0)]
    assert ops.steady_start((1_000, 10.0), 9_000, firsts) == (1_500, 10.2, 2)
    # Every process was running before job lo: the window opens at lo.
    assert ops.steady_start((1_000, 10.0), 9_000, [(1, 9.5), (3, 9.6)]) == (1_000, 10.0, 2)


def test_window_is_the_middle_80_percent() -> None:
    assert ops.process_window(20_000) == (2_000, 18_000)
    assert ops.process_window(3) == (1, 3)
    with pytest.raises(ValueError, match="at least 3"):
        ops.process_window(2)


def test_nearest_rank_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert ops.percentile(values, 50) == 50.0
    assert ops.percentile(values, 99) == 99.0
    assert ops.percentile(values, 100) == 100.0
    assert ops.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="no values"):
        ops.percentile([], 50)


def test_chunks_cover_n_in_pieces_of_at_most_size() -> None:
    assert list(ops.chunks(2_500)) == [1_000, 1_000, 500]
    assert list(ops.chunks(0)) == []


def test_cpu_per_job_is_read_between_the_window_samples() -> None:
    sampler = cpu.CpuSampler(None, [])
    # (completion count, monotonic s, Redis CPU s, workers CPU s); the window: jobs 100-900.
    sampler.samples = [cpu.Sample(*s) for s in [
        (0, 0.0, 1.0, 1.0), (120, 0.1, 1.01, 1.02), (500, 0.25, 1.03, 1.05),
        (880, 0.5, 1.05, 1.08), (1_000, 0.6, 2.0, 2.0)]]
    per_job = sampler.per_job_us(100, 900)
    assert per_job is not None
    assert per_job["jobs"] == 760
    assert abs(per_job["redis"] - 1e6 * 0.04 / 760) < 1e-6
    assert abs(per_job["workers"] - 1e6 * 0.06 / 760) < 1e-6
    # One sample inside the window says nothing about a rate of CPU use, and samples
    # closer than a few clock ticks apart say too little.
    assert sampler.per_job_us(400, 600) is None
    assert sampler.per_job_us(100, 500) is None


def _adapter(started: list[str], settled: bool = True) -> ops.Adapter:
    def start(procs: int, jobs: int, name: str) -> ops.Workers:
        started.append(name)
        return [processes.start_process([sys.executable, "-c", WORKER, str(jobs // procs)],
                                        f"test-ops-{name}-{i}") for i in range(procs)]

    def fail(*args: Any) -> None:
        raise AssertionError("not used by a processing run")

    return ops.Adapter(
        name="stand-in", versions=dict, enqueue_noop=fail, bulk_noop=None,
        preload_noop=lambda n: None, enqueue_late=fail, preload_late=fail,
        start_workers=lambda procs, scheduler: start(procs, 4_000, "default"),
        variants={"other": lambda procs: start(procs, 4_000, "other"),
                  "dies": lambda procs: [processes.start_process(
                      [sys.executable, "-c", "raise SystemExit(3)"], "test-ops-dies")]},
        settled=lambda: settled)


def test_a_processing_run_times_the_window_of_every_process(redis_url: str) -> None:
    started: list[str] = []
    r = redis.Redis.from_url(redis_url)
    out = ops.op_process(_adapter(started), r, {"n": 4_000, "procs": 2, "timeout": 60})
    assert started == ["default"]
    assert out["done"] == 4_000
    assert out["pids_in_window"] == 2
    lo, _ = ops.process_window(4_000)
    # From the report that passed job lo (or a later first report) to the one that
    # passed job hi: inside the backlog, past its first tenth.
    assert 0 < out["window_jobs"] <= 4_000 - lo
    assert out["per_s"] > 0
    assert out["seconds"] > 0
    assert "settled_after_last_s" not in out


def test_a_variant_starts_the_workers_and_settling_is_timed(redis_url: str) -> None:
    started: list[str] = []
    r = redis.Redis.from_url(redis_url)
    out = ops.op_process(_adapter(started), r,
                         {"n": 4_000, "procs": 1, "variant": "other", "settle": True})
    assert started == ["other"]
    assert out["settled_after_last_s"] >= 0


def test_a_worker_that_exits_fails_the_run(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    with pytest.raises(RuntimeError, match="exited early with code 3"):
        ops.op_process(_adapter([]), r, {"n": 4_000, "procs": 1, "variant": "dies"})
