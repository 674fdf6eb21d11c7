"""Replaying GRPO rollouts under another turn credit, on episode files in the real schema."""

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalStatus
from multiminddev.episode import Episode, Turn, write_episodes_jsonl
from multiminddev.episode.state import read_episodes_jsonl
from tests.benchmarks.helpers import eval_result as _result
from tests.benchmarks.helpers import load_script
from tests.episode.helpers import relu_problem


@pytest.fixture(scope="module")
def replay():
    return load_script("replay_credit")


def _episode(index, generator, optimizer):
    return Episode(problem=relu_problem(), episode_id=f"relu-0-{index}", group=0, turns=[
        # GRPO trains on a turn's tokens: a rollout turn has them (ids here are arbitrary)
        Turn(index=0, role=AgentRole.GENERATOR, candidate_source="// generator",
             prompt_ids=[1, 2], response_ids=[3, 4], logprobs=[-0.5, -0.5],
             eval_result=_result(*generator)),
        Turn(index=1, role=AgentRole.OPTIMIZER, candidate_source="// optimizer BROKEN",
             prompt_ids=[1, 2], response_ids=[5, 6], logprobs=[-0.5, -0.5],
             eval_result=_result(*optimizer))])


def test_optimizer_kind_names_what_the_turn_did(replay):
    assert replay.optimizer_kind(True, False, True) == "broke"
    assert replay.optimizer_kind(True, True, True) == "kept"
    assert replay.optimizer_kind(False, True, True) == "fixed"
    assert replay.optimizer_kind(False, False, True) == "still_failing"
    assert replay.optimizer_kind(True, True, False) == "no_kernel"


def test_improvement_credit_turns_a_broken_kernels_advantage_negative(replay, tmp_path):
    # One group: an Optimizer that broke a correct kernel, one that kept a failing one failing.
    path = tmp_path / "seed0" / "episodes.jsonl"
    write_episodes_jsonl([_episode(0, (EvalStatus.OK, 0.6), (EvalStatus.COMPILE_ERROR,)),
                          _episode(1, (EvalStatus.INCORRECT,), (EvalStatus.INCORRECT,))], path)
    episodes = read_episodes_jsonl(path)
    as_run = replay.summed_advantages(episodes, replay.config_with(["normalize_std=false"]), 24,
                                      pattern="BROKEN")
    better = replay.summed_advantages(
        episodes, replay.config_with(["normalize_std=false", "credit.improvement=true"]), 24)
    assert as_run["broke"][0] == 1 and as_run["still_failing"][0] == 1
    assert as_run["pattern"][0] == 2  # both Optimizer kernels hold the pattern
    assert as_run["broke"][1] > 0 > as_run["still_failing"][1]  # the flaw the option removes
    assert better["broke"][1] < 0 < better["still_failing"][1]
