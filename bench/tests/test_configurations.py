"""django-delayq's configuration rows: order of the runs, spread, medians."""

from __future__ import annotations

from typing import Any

import pytest

from bench import configurations


def test_pairs_alternate_so_drift_weighs_on_both() -> None:
    assert configurations.alternating(3) == [True, False, False, True, True, False]
    assert configurations.alternating(0) == []


def test_spread_is_the_largest_distance_from_the_median() -> None:
    assert configurations.spread([100.0, 90.0, 115.0, 100.0, 101.0]) == pytest.approx(0.15)
    assert configurations.spread([50.0]) == 0.0
    assert configurations.spread([]) is None


def _calls(rates: dict[str, list[float]]) -> Any:
    """A stand-in for the adapter call: the next rate of each variant, in order."""
    seen: list[dict[str, Any]] = []

    def call(params: dict[str, Any]) -> dict[str, Any]:
        seen.append(params)
        rate = rates[params.get("variant", "plain")].pop(0)
        out: dict[str, Any] = {"ok": True, "per_s": rate, "first_to_last_s": 1.0}
        if params.get("settle"):
            out["settled_after_last_s"] = 1.0
        return out

    return call, seen


def test_a_variant_is_compared_by_the_medians_of_alternating_runs() -> None:
    call, seen = _calls({"timeout": [97.0, 98.0, 99.0], "plain": [100.0, 100.0, 101.0]})
    out = configurations.paired(call, 2_000, 3, "timeout", "time limits", lambda msg: None)
    assert [p.get("variant") for p in seen] == ["timeout", None, None, "timeout", "timeout",
                                                None]
    assert out["ratio"] == pytest.approx(98.0 / 100.0)
    assert out["on"]["per_s"] == [97.0, 98.0, 99.0]


def test_defaults_time_the_mirror_and_the_whole_drain() -> None:
    call, seen = _calls({"defaults": [80.0, 90.0], "defaults_no_mirror": [100.0, 100.0]})
    out = configurations.defaults(call, 2_000, 2, lambda msg: None)
    assert [p["settle"] for p in seen] == [True, False, False, True]
    assert out["mirror_vs_no_mirror"] == pytest.approx(0.85)
    assert out["mirror"]["settled_after_last_s_median"] == 1.0
    # 2,000 jobs from the first run to the last one mirrored in 1 + 1 s
    assert out["mirror"]["drained_to_database_per_s"] == pytest.approx(1_000.0)
    assert out["no_mirror"]["spread"] == 0.0


def test_a_failed_run_is_left_out_and_reported() -> None:
    def call(params: dict[str, Any]) -> dict[str, Any]:
        if params.get("variant"):
            return {"ok": False, "error": "RuntimeError: worker exited early with code 1"}
        return {"ok": True, "per_s": 100.0}

    out = configurations.paired(call, 2_000, 1, "async", "async tasks", lambda msg: None)
    assert out["ratio"] is None
    assert out["on"]["errors"] == ["RuntimeError: worker exited early with code 1"]


def test_the_pool_is_compared_with_separate_processes_run_by_run() -> None:
    def process(rate: float) -> dict[str, Any]:
        return {"ok": True, "per_s": rate, "done": 80_000,
                "cpu_us": {"workers": 20.0, "redis": 10.0}}

    runs = [{"process_2": process(40_000.0), "process_pool": process(44_000.0)},
            {"process_2": process(50_000.0), "process_pool": process(45_000.0)}]
    out = configurations.pool(runs)
    assert out is not None
    assert out["n"] == 80_000
    assert out["pool_vs_separate"] == pytest.approx(44_500 / 45_000)
    assert out["pool"]["cpu_us_per_job"]["workers"] == [20.0, 20.0]
    assert out["pool"]["cpu_us_per_job"]["workers_median"] == 20.0
    assert configurations.pool([{"process_2": process(1.0)}]) is None
