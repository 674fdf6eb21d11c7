"""Shipped agents: the lookup of the adapters the package ships, and their use as the default of
``optimize`` and ``bench``."""

from __future__ import annotations

import json

import pytest

from multiminddev.agents.shipped import (
    PROVENANCE_FILE,
    ShippedAgentsError,
    shipped_adapters,
    shipped_agents,
    write_provenance,
)
from multiminddev.core.roles import AgentRole

PROVENANCE = {"command": "multiminddev train --recipe optimizer-grpo-greedy-generator",
              "commit": "0123abc", "data": {"sft_problems": "builtin:tier0:train"},
              "heldout": {"problems": 39, "compile_rate": 0.9, "measured_on": "H100"}}


@pytest.fixture(scope="module")
def shipped_root(tmp_path_factory):
    """Real LoRA adapters (peft) of a tiny policy, saved as the package ships them."""
    pytest.importorskip("peft")
    from multiminddev.train import checkpoints as ck
    from tests.policy.helpers import tiny_policy

    root = tmp_path_factory.mktemp("shipped")
    ck.save_agents(tiny_policy(0), (AgentRole.GENERATOR, AgentRole.OPTIMIZER), root)
    write_provenance(root, **PROVENANCE, settings={"element_type_line": True})
    return root


def test_a_folder_without_provenance_ships_no_agents(tmp_path):
    assert shipped_adapters(tmp_path) is None


def test_the_lookup_finds_both_adapters(shipped_root):
    assert shipped_adapters(shipped_root) == {AgentRole.GENERATOR: shipped_root / "generator",
                                              AgentRole.OPTIMIZER: shipped_root / "optimizer"}


def test_the_found_adapters_load_with_peft(shipped_root):
    from peft import PeftConfig

    for folder in shipped_adapters(shipped_root).values():
        assert PeftConfig.from_pretrained(str(folder)).peft_type.value == "LORA"


def test_the_provenance_says_how_the_prompts_were_made(shipped_root):
    agents = shipped_agents(shipped_root)
    assert agents.model == "default" and agents.element_type_line
    assert agents.provenance["commit"] == "0123abc"


def test_provenance_without_an_adapter_is_an_error_and_is_not_written(tmp_path):
    with pytest.raises(ShippedAgentsError, match="no generator or optimizer adapter"):
        write_provenance(tmp_path, **PROVENANCE)
    assert not (tmp_path / PROVENANCE_FILE).exists()


def test_provenance_without_its_figures_is_an_error(shipped_root, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(shipped_root, root)
    data = json.loads((root / PROVENANCE_FILE).read_text())
    del data["heldout"]
    (root / PROVENANCE_FILE).write_text(json.dumps(data))
    with pytest.raises(ShippedAgentsError, match="lacks heldout"):
        shipped_agents(root)


def test_the_package_ships_complete_agents_or_none():
    agents = shipped_agents()  # raises on a broken install
    assert agents is None or set(agents.adapters) == {AgentRole.GENERATOR, AgentRole.OPTIMIZER}


# --------------------------------------------------------------------------- the commands

def _optimize_args(*argv):
    from multiminddev.cli import build_parser

    return build_parser().parse_args(["optimize", "problem.py", *argv])


def test_optimize_uses_the_shipped_adapters_by_default(shipped_root):
    from multiminddev.commands.optimize import _policy_config

    config = _policy_config(_optimize_args(), shipped_agents(shipped_root))
    assert config.adapter_paths == {"generator": str(shipped_root / "generator"),
                                    "optimizer": str(shipped_root / "optimizer")}


def test_optimize_with_adapters_none_uses_the_model_alone(shipped_root):
    from multiminddev.commands.optimize import _policy_config

    assert _policy_config(_optimize_args("--adapters", "none"),
                          shipped_agents(shipped_root)).adapter_paths == {}


def test_optimize_on_another_model_does_not_take_the_shipped_adapters(shipped_root):
    from multiminddev.commands.optimize import default_agents

    args = _optimize_args("--model", "Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert default_agents(args.model, args.adapters, shipped_agents(shipped_root)) is None


def test_bench_without_models_runs_the_shipped_agents(shipped_root):
    from multiminddev.commands.bench import SHIPPED_LABEL, policy_runs

    runs = policy_runs([], [], shipped_agents(shipped_root))
    assert list(runs) == [SHIPPED_LABEL]
    assert runs[SHIPPED_LABEL].adapter_paths["optimizer"] == str(shipped_root / "optimizer")


def test_bench_with_a_model_does_not_add_the_shipped_agents(shipped_root):
    from multiminddev.commands.bench import policy_runs

    assert list(policy_runs(["default"], [], None)) == ["default"]


@pytest.mark.slow
@pytest.mark.skipif(shipped_agents() is None, reason="the package ships no agents yet")
def test_optimize_with_the_shipped_agents_writes_a_kernel_that_compiles(tmp_path, capsys):
    """On a CPU machine: the default ``optimize`` command on a built-in held-out problem gives a
    compiling kernel (on a GPU, the command's own exit status says whether it is verified)."""
    from multiminddev.cli import main
    from multiminddev.episode.state import read_episodes_jsonl

    export = tmp_path / "kb"
    assert main(["problems", "export", str(export), "--split", "heldout", "--tier", "0",
                 "--family", "relu", "--shapes-per-family", "1"]) == 0
    problem = next(export.rglob("level*/*.py"))
    saved = tmp_path / "episode.jsonl"
    main(["optimize", str(problem), "--turns", "1", "--temperature", "0", "--device", "cpu",
          "--max-new-tokens", "512", "--quiet", "--save", str(saved)])
    (episode,) = read_episodes_jsonl(saved)
    assert episode.best_result is not None and episode.best_result.compiled, capsys.readouterr()
