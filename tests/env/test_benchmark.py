"""Pure parts of the benchmark: statistics against numpy, the JSON cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from multiminddev.env.benchmark import (
    JsonCache,
    TrustedBaselines,
    compile_baseline_key,
    peak_bandwidth_key,
    stats_from_times,
)


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


SECRET = b"k" * 32


def test_json_cache_round_trip_and_miss(tmp_path):
    cache = JsonCache(tmp_path / "c", SECRET)
    key = compile_baseline_key("abc", "NVIDIA H100", "2.11")
    assert cache.get(key) is None
    cache.put(key, {"stats": {"median_ms": 1.5}})
    assert cache.get(key)["stats"] == {"median_ms": 1.5}
    assert cache.get(compile_baseline_key("abc", "NVIDIA H200", "2.11")) is None


def test_json_cache_ignores_a_forged_record(tmp_path):
    cache = JsonCache(tmp_path / "c", SECRET)
    key = peak_bandwidth_key("NVIDIA H100", "2.11")
    cache.put(key, {"gbps": 3000.0})
    path = cache._path(key)
    record = json.loads(path.read_text())
    record["value"] = {"gbps": 1e9}  # what a candidate would plant: an absurd peak
    path.write_text(json.dumps(record))
    assert cache.get(key) is None


def test_json_cache_ignores_records_made_under_another_secret(tmp_path):
    JsonCache(tmp_path / "c", b"x" * 32).put("k", {"gbps": 1e9})
    assert JsonCache(tmp_path / "c", SECRET).get("k") is None


def test_json_cache_ignores_an_unauthenticated_record(tmp_path):
    cache = JsonCache(tmp_path / "c", SECRET)
    cache.root.mkdir()
    cache._path("k").write_text(json.dumps({"key": "k", "gbps": 1e9}))  # the old format
    assert cache.get("k") is None


def test_json_cache_needs_a_real_secret(tmp_path):
    with pytest.raises(ValueError, match="secret"):
        JsonCache(tmp_path, b"")


def test_trusted_baselines_round_trip_through_disk(tmp_path):
    first = TrustedBaselines(tmp_path)
    first.record_peak_gbps("H100", "2.11", 3000.0)
    first.record_compiled_baseline("abc", "H100", "2.11", {"median_ms": 0.5})
    second = TrustedBaselines(tmp_path)  # a new evaluator: same key file, same entries
    assert second.peak_gbps("H100", "2.11") == 3000.0
    assert second.compiled_baseline("abc", "H100", "2.11") == {"median_ms": 0.5}
    assert second.peak_gbps("H200", "2.11") is None


def test_trusted_baselines_do_not_use_a_forged_peak(tmp_path):
    honest = TrustedBaselines(tmp_path)
    honest.record_peak_gbps("H100", "2.11", 3000.0)
    # A forger without the key writes a well-formed record with a made-up tag.
    forged = {"key": peak_bandwidth_key("H100", "2.11"), "value": {"gbps": 1e9}, "tag": "0" * 64}
    path = JsonCache(tmp_path / "baselines", SECRET)._path(peak_bandwidth_key("H100", "2.11"))
    path.write_text(json.dumps(forged))
    assert TrustedBaselines(tmp_path).peak_gbps("H100", "2.11") is None


def test_trusted_baselines_refuse_nonsense_figures(tmp_path):
    store = TrustedBaselines(tmp_path)
    for bad in (0.0, -1.0, float("nan"), float("inf"), "3000", True, None):
        store.record_peak_gbps("H100", "2.11", bad)
    store.record_compiled_baseline("abc", "H100", "2.11", {"median_ms": 0.0})
    assert store.peak_gbps("H100", "2.11") is None
    assert store.compiled_baseline("abc", "H100", "2.11") is None


def test_trusted_baselines_work_in_memory_without_a_key(tmp_path):
    import os

    (tmp_path / "c.key").write_bytes(b"k" * 32)
    os.chmod(tmp_path / "c.key", 0o644)  # readable by others: refused
    store = TrustedBaselines(tmp_path / "c")
    store.record_peak_gbps("H100", "2.11", 3000.0)
    assert store.peak_gbps("H100", "2.11") == 3000.0
    assert not (tmp_path / "c" / "baselines").exists()


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


def test_the_host_released_hold_kernel_compiles_with_the_workers_warm_up_module():
    from multiminddev.core.results import StageStatus
    from multiminddev.cuda import compiler, kernels
    from multiminddev.env import worker
    from multiminddev.env.benchmark import HOLD_KERNEL

    module = compiler.compile_cuda(worker.WARM_SOURCE,
                                   compiler.CompileOptions(arch="sm_90", use_cache=False))
    assert module.result.status is StageStatus.OK, module.result.log
    params = kernels.parse_kernel_signatures(worker.WARM_SOURCE)[HOLD_KERNEL].params
    # the counter's address, the target and the cycle bound, all passed by value
    assert [p.c_type for p in params] == ["unsigned long long", "long long", "long long"]
    assert not any(p.is_pointer for p in params)
