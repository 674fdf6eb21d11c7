"""bench_ray_grpo's settings: which adapters and prompts its rollouts use."""

from __future__ import annotations

from multiminddev.agents.shipped import shipped_agents
from tests.benchmarks.helpers import load_script

bench = load_script("bench_ray_grpo")


def test_shipped_adapters_come_with_the_prompts_they_were_trained_on():
    args = bench.parse_args(["--adapters", "shipped"])
    agents = shipped_agents()
    config = bench.policy_config(args, "cpu")
    assert config.adapter_paths == agents.adapter_paths()
    assert bench.shipped_or_none(args).element_type_line == agents.element_type_line


def test_fresh_adapters_by_default_and_a_folder_as_given(tmp_path):
    assert bench.policy_config(bench.parse_args([]), "cpu").adapter_paths == {}
    assert bench.shipped_or_none(bench.parse_args(["--adapters", str(tmp_path)])) is None
