"""EvalConfig validation and serialisation."""

from __future__ import annotations

import pytest

from multiminddev.env.config import EvalConfig, Stage, StartMethod


def test_defaults_keep_candidate_stages_under_a_minute():
    cfg = EvalConfig()
    assert cfg.timeout_s <= 60
    assert cfg.compile_timeout_s + cfg.run_timeout_s + cfg.benchmark_timeout_s <= 120


@pytest.mark.parametrize("kwargs, text", [
    ({"num_trials": 0}, "num_trials"),
    ({"num_workers": 0}, "num_workers"),
    ({"run_timeout_s": 0}, "run_timeout_s"),
    ({"min_timed_runs": 50, "max_timed_runs": 10}, "min_timed_runs"),
    ({"timed_checks": 0}, "timed_checks"),
    ({"timed_check_budget_mib": 0.0}, "timed_check_budget_mib"),
    ({"arch": "hopper"}, "sm_90"),
    ({"tensor_transfer": "shm"}, "pipe"),
    ({"infra_retries": -1}, "infra_retries"),
    ({"candidate_memory_factor": 0}, "None for no cap"),
    ({"candidate_memory_floor_gib": -1.0}, "candidate_memory_floor_gib"),
])
def test_invalid_values_raise_with_the_fix(kwargs, text):
    with pytest.raises(ValueError, match=text):
        EvalConfig(**kwargs)


def test_round_trip_through_dict_resolves_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIMINDDEV_CACHE", str(tmp_path))
    cfg = EvalConfig(num_trials=3, start_method=StartMethod.SPAWN)
    data = cfg.to_dict()
    assert data["cache_dir"] == str(tmp_path) and data["start_method"] == "spawn"
    back = EvalConfig.from_dict(data)
    assert back.num_trials == 3 and back.start_method is StartMethod.SPAWN


def test_stage_timeouts_are_looked_up_by_stage():
    cfg = EvalConfig(run_timeout_s=7.0)
    assert cfg.stage_timeout(Stage.RUN) == 7.0
    assert cfg.stage_timeout(Stage.SETUP) == cfg.setup_timeout_s
