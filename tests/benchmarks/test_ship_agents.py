"""ship_agents: a finished run's adapters and provenance become shipped agents."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def ship():
    return load_script("ship_agents")


def _finished_run(tmp_path):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.train import checkpoints as ck
    from tests.policy.helpers import tiny_policy

    run = tmp_path / "run"
    ck.save_agents(tiny_policy(0), (AgentRole.GENERATOR, AgentRole.OPTIMIZER),
                   run / "rl_checkpoints" / "final_model")
    (run / "run_config.json").write_text(json.dumps({
        "model": "default", "train_problems": "builtin:tier1:train", "element_type_line": True,
        "replay_command": "multiminddev train --config run/run_config.json"}))
    (run / "eval_results.json").write_text(json.dumps({"problems": 39, "pass_rate": 0.74}))
    return run


def test_a_finished_run_becomes_shipped_agents(ship, tmp_path):
    from multiminddev.agents.shipped import shipped_agents

    dest = tmp_path / "shipped"
    dest.mkdir()
    assert ship.main([str(_finished_run(tmp_path)), "--dest", str(dest)]) == 0
    agents = shipped_agents(dest)
    assert agents.element_type_line and agents.provenance["heldout"]["final"]["pass_rate"] == 0.74
    assert agents.provenance["data"] == {"train_problems": "builtin:tier1:train"}
    assert sorted(p.name for p in (dest / "optimizer").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]


def test_a_run_without_its_evaluation_ships_nothing(ship, tmp_path, capsys):
    run = _finished_run(tmp_path)
    (run / "eval_results.json").unlink()
    dest = tmp_path / "shipped"
    dest.mkdir()
    assert ship.main([str(run), "--dest", str(dest)]) == 1
    assert "eval_results.json is missing" in capsys.readouterr().err
    assert list(dest.iterdir()) == []
