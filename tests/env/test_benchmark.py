"""Pure parts of the benchmark: statistics against numpy, the JSON cache."""

from __future__ import annotations

import numpy as np
import pytest

from multiminddev.env.benchmark import JsonCache, compile_baseline_key, stats_from_times


def test_stats_match_numpy():
    times = list(np.random.default_rng(0).gamma(4.0, 0.1, size=37))
    stats = stats_from_times(times)
    q1, q3 = np.percentile(times, [25, 75])
    assert stats.median_ms == pytest.approx(np.median(times))
    assert stats.mean_ms == pytest.approx(np.mean(times))
    assert stats.iqr_ms == pytest.approx(q3 - q1)
    assert stats.std_ms == pytest.approx(np.std(times))
    assert (stats.min_ms, stats.max_ms, stats.runs) == (min(times), max(times), 37)


def test_relative_spread_is_iqr_over_median():
    stats = stats_from_times([1.0, 1.0, 2.0, 2.0])
    assert stats.relative_spread == pytest.approx(stats.iqr_ms / stats.median_ms)


def test_no_times_give_empty_stats():
    assert stats_from_times([]).runs == 0


def test_json_cache_round_trip_and_miss(tmp_path):
    cache = JsonCache(tmp_path / "c")
    key = compile_baseline_key("abc", "NVIDIA H100", "2.11")
    assert cache.get(key) is None
    cache.put(key, {"stats": {"median_ms": 1.5}})
    assert cache.get(key)["stats"] == {"median_ms": 1.5}
    assert cache.get(compile_baseline_key("abc", "NVIDIA H200", "2.11")) is None


def test_hold_covers_the_host_enqueue_time_with_margin():
    from multiminddev.env.benchmark import INITIAL_HOLD_CYCLES, MAX_HOLD_CYCLES, _cycles_to_cover

    # 1 ms of host work -> at least 1 ms of spinning even on a 3 GHz clock
    assert _cycles_to_cover(1e-3) >= 3e6
    assert _cycles_to_cover(0.0) == INITIAL_HOLD_CYCLES // 4
    assert _cycles_to_cover(10.0) == MAX_HOLD_CYCLES


def test_planned_runs_fill_the_budget_within_bounds():
    from multiminddev.env.benchmark import TimingPlan, planned_runs

    plan = TimingPlan(min_runs=10, max_runs=300, budget_s=1.0)
    assert planned_runs(plan, 0.01) == 100
    assert planned_runs(plan, 1.0) == 10
    assert planned_runs(plan, 1e-6) == 300
    assert planned_runs(plan, 0.0) == 300
