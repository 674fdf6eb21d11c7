import pytest

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.env.results import EvalStatus
from multiminddev.integrations.episode_env import (
    KernelEnvConfig,
    TrajectoryReward,
    continuation_ids,
    next_user_message,
    run_rollouts,
    trajectory_reward,
)
from multiminddev.policy import encode_chat
from multiminddev.policy.chat import end_of_turn_ids
from multiminddev.rewards import CreditConfig, RewardConfig, assign_turn_rewards
from tests.episode.helpers import ReplayBackend, relu_problem
from tests.integrations.helpers import G, O, broken_then_fixed, env_config
from tests.policy.helpers import gguf_tokenizer


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as ev:
        yield ev


@pytest.fixture(scope="module")
def replayed(evaluator):
    """Two episodes of two turns: a kernel that does not compile, then one that does."""
    backend = ReplayBackend(gguf_tokenizer(), broken_then_fixed)
    return run_rollouts([relu_problem()], backend, evaluator, env_config(), group_size=2)


def test_config_needs_a_reward():
    from multiminddev.episode.runner import EpisodeConfig

    with pytest.raises(ValueError, match="RewardConfig"):
        KernelEnvConfig(episode=EpisodeConfig(reward=None))
    with pytest.raises(ValueError, match="trajectory_reward"):
        KernelEnvConfig(trajectory_reward="median")


def test_continuation_matches_the_chat_template():
    """prompt + reply (ending in the end-of-turn token) + continuation are exactly the tokens of
    the whole conversation rendered by the template."""
    tok = gguf_tokenizer()
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "write it"}]
    reply = "Here is my kernel."
    end = end_of_turn_ids(tok)[-1]
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"] + [end]
    sequence = encode_chat(tok, messages) + reply_ids + continuation_ids(tok, "fix it", reply_ids)
    whole = encode_chat(tok, [*messages, {"role": "assistant", "content": reply},
                              {"role": "user", "content": "fix it"}])
    assert sequence == whole


def test_continuation_closes_a_reply_cut_at_the_length_limit():
    tok = gguf_tokenizer()
    cut = tok("Here is my", add_special_tokens=False)["input_ids"]
    ids = continuation_ids(tok, "go on", cut)
    assert ids[0] in end_of_turn_ids(tok)


def test_optimizer_message_carries_role_kernel_and_report(replayed):
    episode = replayed[0].episode
    text = next_user_message(episode, O, env_config().episode)
    assert "You are the Optimizer" in text
    assert "Tester report:" in text and "fmaxf" in text


def test_rollout_masks_policy_tokens_only(replayed):
    rollout = replayed[0]
    assert len(rollout.response_ids) == len(rollout.response_mask) == len(rollout.response_logprobs)
    policy = {i for a, b in rollout.turn_spans for i in range(a, b)}
    assert [i for i, m in enumerate(rollout.response_mask) if m] == sorted(policy)
    assert 0 in rollout.response_mask  # the Tester's report sits between the two replies
    for (a, b), turn in zip(rollout.turn_spans, rollout.episode.turns):
        assert rollout.response_ids[a:b] == turn.response_ids


def test_rollout_rewards_come_from_compile_only_evaluations(replayed):
    turns = replayed[0].episode.turns
    assert [t.role for t in turns] == [G, O]
    assert turns[0].eval_result.status is EvalStatus.COMPILE_ERROR
    assert turns[1].eval_result.compiled
    assert turns[1].reward == pytest.approx(RewardConfig().compile_credit)
    assert turns[1].reward > turns[0].reward


def test_rollout_reward_is_the_mean_credited_turn_reward(replayed):
    rollout = replayed[0]
    immediate = [t.reward for t in rollout.episode.turns]
    credited = assign_turn_rewards([G, O], immediate, CreditConfig())
    assert rollout.turn_rewards == pytest.approx(credited)
    assert rollout.reward == pytest.approx(sum(credited) / 2)


def test_trajectory_reward_kinds():
    assert trajectory_reward([0.1, 0.5, 0.2], [1, 2, 3], TrajectoryReward.BEST) == 0.5
    assert trajectory_reward([0.1, 0.5, 0.2], [1, 2, 3], TrajectoryReward.LAST) == 0.2
    assert trajectory_reward([0.1, 0.5, 0.2], [1, 2, 3], TrajectoryReward.MEAN_CREDIT) == 2.0
    assert trajectory_reward([], [], TrajectoryReward.MEAN_CREDIT) == 0.0


def test_group_members_share_one_evaluation(evaluator):
    backend = ReplayBackend(gguf_tokenizer(), broken_then_fixed)
    rollouts = run_rollouts([relu_problem("relu_shared")], backend, evaluator,
                            env_config(max_turns=1), group_size=3)
    assert [r.episode.turns[0].cached for r in rollouts].count(False) == 1


def test_budget_ends_the_episode_before_a_turn_that_cannot_fit(evaluator):
    backend = ReplayBackend(gguf_tokenizer(), broken_then_fixed)
    budget = 400  # the first reply fits, the Optimizer's prompt after it does not
    (rollout,) = run_rollouts([relu_problem()], backend, evaluator,
                              env_config(max_turns=3, max_new_tokens=300,
                                         max_response_tokens=budget))
    assert rollout.budget_exhausted
    assert len(rollout.episode.turns) == 1
    assert len(rollout.response_ids) <= budget
