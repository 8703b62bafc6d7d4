"""The orchestrator's arithmetic: sizes, order, medians and the CPU bound."""

from __future__ import annotations

from bench import run


def test_two_process_bound_is_what_every_core_busy_allows() -> None:
    def process(workers: float, redis: float) -> dict:
        return {"ok": True, "cpu_us": {"workers": workers, "redis": redis}}

    runs = [{"enqueue": {"ok": True, "cpu_us": {"client": 30.0, "redis": 40.0}},
             "process_1": process(14.0, 12.0), "process_2": process(15.0, 10.0)}]
    rates = {"process_per_s_1proc": 40_000.0, "process_per_s_2proc": 60_000.0}
    figures = run.cpu_figures(runs, rates, 2)
    # 2 cores at 25 µs per job allow 80,000 jobs/s: twice the 1-process rate.
    assert abs(figures["process_2proc_cpu_bound_x"] - 2.0) < 1e-9
    assert abs(figures["cores_busy_2proc"] - 1.5) < 1e-9
    assert abs(figures["cores_busy_1proc"] - 40_000 * 26 / 1e6) < 1e-9
    # Without a 2-process CPU figure there is no bound either.
    runs[0]["process_2"] = {"ok": True, "cpu_us": None}
    assert run.cpu_figures(runs, rates, 2)["process_2proc_cpu_bound_x"] is None


def test_each_run_starts_with_another_library_and_measures_every_one() -> None:
    libraries = ["a", "b", "c"]
    orders = [run.run_order(libraries, i) for i in range(3)]
    assert [order[0] for order in orders] == ["a", "b", "c"]
    assert all(sorted(order) == libraries for order in orders)
    assert run.run_order(libraries, 3) == libraries


def test_the_two_process_backlog_is_two_seconds_of_one_process_work() -> None:
    sizes = run.sizes_for(1.0)
    assert sizes["process_n"] == 20_000
    assert run.two_process_backlog(sizes, {"ok": True, "per_s": 40_000.0}) == 80_000
    assert run.two_process_backlog(sizes, {"ok": True, "per_s": 1_000.0}) == 20_000
    assert run.two_process_backlog(sizes, {"ok": True, "per_s": 1e9}) == run.MAX_PROCESS_N
    assert run.two_process_backlog(sizes, {"ok": False}) == 20_000


def test_tiny_scales_keep_every_workload_measurable() -> None:
    sizes = run.sizes_for(0.001)
    assert sizes["process_n"] == run.MIN_PROCESS_N
    assert sizes["memory_n"] >= sizes["growth_small_n"] + 2 * sizes["growth_measure_n"]
    assert sizes["growth_large_n"] > sizes["memory_n"]
    assert sizes["lateness_n"] >= 2


def _runs(per_s: list[float | None]) -> list[dict]:
    def ok(value: float | None) -> dict:
        return {"ok": False, "error": "boom"} if value is None else {"ok": True, "per_s": value}

    return [{"enqueue": ok(v), "bulk": ok(v), "process_1": ok(v), "process_2": ok(v),
             "lateness": {"ok": True, "lateness_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0,
                                                      "max": 4.0}, "early": 0},
             "storage": {"ok": True, "redis_bytes_per_delayed_job": 300.0,
                         "enqueue_growth_ratio": 1.0, "enqueue_growth_ratio_vs_zadd": 1.0}}
            for v in per_s]


def test_a_figure_is_the_median_of_the_runs_that_worked() -> None:
    result, errors = run.summarize(_runs([10.0, None, 30.0]))
    assert result["enqueue_per_s"] == 20.0
    assert result["lateness_ms"]["p99"] == 3.0
    assert errors == [f"{key}: boom (1 of 3 runs)"
                      for key in ("bulk", "enqueue", "process_1", "process_2")]
