"""GRPO trainer: per-role updates, loss masks, reward/advantage phases, resume equality."""

from __future__ import annotations

import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.tasks.curriculum import CurriculumConfig
from multiminddev.train.grpo import (
    AdvantageMode,
    GRPOConfig,
    GRPOTrainer,
    TurnSample,
    assign_advantages,
    baseline_problems,
    batch_loss,
    build_batch,
    checkpoint_score,
    score_episodes,
)
from tests.policy.helpers import tiny_policy
from tests.problems import RELU_1024


def problems(n: int = 2):
    from multiminddev.tasks.problem import load_problem_source

    return [load_problem_source(RELU_1024, name=f"relu_{i}", tier=0) for i in range(n)]


def sample(role, prompt, response, adv, group=0, turn=0):
    return TurnSample(group=group, episode=0, turn_index=turn, role=role, prompt_ids=prompt,
                      response_ids=response, old_logprobs=[-1.0] * len(response), immediate=0.0,
                      reward=0.0, advantage=adv)


def test_config_rejects_group_of_one_and_bad_clip():
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="clip_low"):
        GRPOConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="Tester"):
        GRPOConfig(train_roles=(AgentRole.TESTER,))


def test_loss_mask_is_exactly_the_response_tokens():
    batch = build_batch([sample(AgentRole.GENERATOR, [1, 2, 3], [4, 5], 1.0),
                         sample(AgentRole.GENERATOR, [1, 2], [6, 7, 8], -1.0)], pad_id=0)
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_gradient_flows_only_from_agent_tokens():
    batch = build_batch([sample(AgentRole.GENERATOR, [1, 2, 3], [4, 5], 1.0),
                         sample(AgentRole.GENERATOR, [1, 2], [6], -1.0)], pad_id=0)
    batch.ref_logprobs = torch.full(batch.loss_mask.shape, -1.5)
    new = torch.full(batch.loss_mask.shape, -1.2, requires_grad=True)
    loss, _ = batch_loss(new, batch, GRPOConfig())
    loss.backward()
    assert (new.grad[batch.loss_mask == 0] == 0).all()
    assert (new.grad[batch.loss_mask == 1] != 0).all()


def test_advantages_are_relative_within_group_role_and_turn():
    s = [sample(AgentRole.GENERATOR, [1], [2], 0.0, group=0, turn=0) for _ in range(4)]
    for x, r in zip(s, [1.0, 0.0, 1.0, 0.0]):
        x.reward = r
    lone = sample(AgentRole.OPTIMIZER, [1], [2], 0.0, group=0, turn=1)
    lone.reward = 5.0
    out = assign_advantages(s + [lone], GRPOConfig(advantage=AdvantageMode.TURN_LEVEL))
    adv = [x.advantage for x in out]
    assert adv[0] > 0 > adv[1] and adv[0] == pytest.approx(-adv[1])
    assert adv[4] == 0.0  # the lone Optimizer turn has no group to compare with


def test_w_reinforce_weights_scale_the_group_relative_advantages():
    def rewarded(cfg):
        s = [sample(AgentRole.GENERATOR, [1], [2], 0.0, group=0) for _ in range(4)]
        for x, r in zip(s, [1.0, 0.0, 0.0, 0.0]):
            x.reward = r
        return [x.advantage for x in assign_advantages(s, cfg)]

    plain = rewarded(GRPOConfig(normalize_std=False))
    assert plain == pytest.approx([0.75, -0.25, -0.25, -0.25])
    weighted = rewarded(GRPOConfig(normalize_std=False, positive_weight=0.1))
    assert weighted == pytest.approx([0.075, -0.25, -0.25, -0.25])  # the failures keep full weight
    with pytest.raises(ValueError, match="positive_weight and negative_weight"):
        GRPOConfig(positive_weight=-1.0)


def _improvement_advantages(immediate, **cfg):
    """Generator and Optimizer advantages of one group of two-turn episodes with these
    immediate rewards, credited with improvement; a positive Generator reward passed."""
    from multiminddev.rewards import CreditConfig, assign_turn_rewards

    roles = [AgentRole.GENERATOR, AgentRole.OPTIMIZER]
    config = GRPOConfig(normalize_std=False, credit=CreditConfig(improvement=True), **cfg)
    samples = []
    for e, rewards in enumerate(immediate):
        for k, credited in enumerate(assign_turn_rewards(roles, rewards, config.credit)):
            x = sample(roles[k], [1], [2], 0.0, group=0, turn=k)
            x.episode, x.reward = e, credited
            x.handed_correct = rewards[0] > 0 if k else None
            samples.append(x)
    out = assign_advantages(samples, config)
    return [[x.advantage for x in out if x.turn_index == k] for k in (0, 1)]


def test_uncentred_improvement_gives_a_failing_optimizer_turn_no_credit_from_a_groupmates_break():
    """With improvement credit centred on the group, Optimizer turns that left a
    failing kernel failing gained whenever a groupmate broke a correct kernel. Uncentred, the
    improvement itself is the advantage: 0 for them, the whole loss for the break."""
    # episode 0: a correct Generator kernel (0.6) that the Optimizer broke (-0.1); episodes 1-3:
    # failing Generator kernels (-0.1) the Optimizer left failing
    immediate = [[0.6, -0.1]] + [[-0.1, -0.1]] * 3
    generator, optimizer = _improvement_advantages(immediate)
    assert optimizer == pytest.approx([-0.525, 0.175, 0.175, 0.175])  # failing turns gain
    generator_uncentred, optimizer_uncentred = _improvement_advantages(
        immediate, improvement_baseline="none")
    assert optimizer_uncentred == pytest.approx([-0.7, 0.0, 0.0, 0.0])
    assert generator_uncentred == pytest.approx(generator)  # first turns stay group-relative
    with pytest.raises(ValueError, match="credit.improvement=True"):
        GRPOConfig(improvement_baseline="none")
    with pytest.raises(ValueError, match="'group', 'none', 'handed_outcome'"):
        GRPOConfig(improvement_baseline="uncentred")


def test_handed_outcome_baseline_compares_optimizer_turns_handed_the_same_outcome():
    """Uncentred, breaks outweighed keeps and the summed advantage went negative,
    and one seed's Optimizer collapsed. Centred per handed outcome, a kept kernel is credited
    against a groupmate's break, and failing starts against each other only."""
    # a correct kernel broken (0.6 -> -0.1) and one made faster (0.6 -> 0.7); two failing
    # kernels, one fixed (-0.1 -> 0.5) and one left failing
    immediate = [[0.6, -0.1], [0.6, 0.7], [-0.1, 0.5], [-0.1, -0.1]]
    generator, optimizer = _improvement_advantages(immediate, improvement_baseline="handed_outcome")
    assert optimizer == pytest.approx([-0.4, 0.4, 0.3, -0.3])
    assert generator == pytest.approx(_improvement_advantages(immediate)[0])


def test_score_episodes_records_whether_the_kernel_handed_on_had_passed():
    problem = problems(1)[0]
    episodes = [_episode(problem, ["ok", "incorrect"]), _episode(problem, ["incorrect", "ok"])]
    samples, _ = score_episodes(episodes, GRPOConfig())
    handed = {(s.episode, s.turn_index): s.handed_correct for s in samples}
    assert handed == {(0, 0): None, (0, 1): True, (1, 0): None, (1, 1): False}


def test_dapo_filter_drops_zero_variance_groups():
    s = [sample(AgentRole.GENERATOR, [1], [2], 0.0, group=g) for g in (0, 0, 1, 1)]
    for x, r in zip(s, [1.0, 1.0, 0.0, 1.0]):
        x.reward = r
    kept = assign_advantages(s, GRPOConfig(filter_zero_variance=True))
    assert [x.group for x in kept] == [1, 1]


def _episode(problem, statuses):
    """A two-turn episode whose turns got evaluation results with ``statuses``."""
    from multiminddev.env.results import EvalResult, EvalStatus
    from multiminddev.episode.state import Episode, Turn

    roles = [AgentRole.GENERATOR, AgentRole.OPTIMIZER]
    turns = [Turn(index=i, role=roles[i], prompt_ids=[1, 2], response_ids=[3, 4],
                  logprobs=[-1.0, -1.0], candidate_source="class ModelNew: pass",
                  eval_result=EvalResult(status=EvalStatus(status), problem=problem.name))
             for i, status in enumerate(statuses)]
    return Episode(problem=problem, group=0, turns=turns)


def test_episodes_with_an_infra_error_are_left_out_of_training_and_rewards():
    problem = problems(1)[0]
    episodes = [_episode(problem, ["incorrect", "infra_error"]),
                _episode(problem, ["incorrect", "runtime_error"]),
                _episode(problem, ["compile_error", "incorrect"])]
    samples, stats = score_episodes(episodes, GRPOConfig())
    assert {s.episode for s in samples} == {1, 2}  # the crowded GPU's episode trains nothing
    assert stats["infra_error_episodes"] == 1.0
    kept, kept_stats = score_episodes(episodes[1:], GRPOConfig())
    assert stats["reward_mean"] == pytest.approx(kept_stats["reward_mean"])
    assert [s.reward for s in samples] == [s.reward for s in kept]


def test_scored_turns_carry_their_reward_credit_and_advantage_into_the_episode_log():
    """episodes.jsonl showed reward None on every GRPO turn: the reward
    phase now writes each agent turn's reward, components and credit on the turn."""
    from multiminddev.episode.state import episode_to_dict
    from multiminddev.rewards import compute_reward
    from multiminddev.train.grpo import record_advantages

    problem = problems(1)[0]
    episodes = [_episode(problem, ["incorrect", "compile_error"]),
                _episode(problem, ["compile_error", "compile_error"])]
    episodes[1].turns[0].eval_result = None  # a reply with no candidate: a format failure
    cfg = GRPOConfig()
    samples, _ = score_episodes(episodes, cfg)
    for e_idx, episode in enumerate(episodes):
        for k, turn in enumerate(episode.turns):
            expected = compute_reward(turn.eval_result, cfg.reward, turn.candidate_source)
            assert turn.reward == pytest.approx(expected.total)
            assert {n: turn.reward_breakdown[n] for n in expected.components} == pytest.approx(
                dict(expected.components))
            mine = next(s for s in samples if s.episode == e_idx and s.turn_index == k)
            assert turn.reward_breakdown["credited"] == pytest.approx(mine.reward)
    samples = assign_advantages(samples, cfg)
    record_advantages(episodes, samples)
    generator_advantages = [e.turns[0].reward_breakdown["advantage"] for e in episodes]
    assert generator_advantages[0] > 0 > generator_advantages[1]  # a candidate beats none
    logged = episode_to_dict(episodes[0])["turns"][0]
    assert logged["reward"] == pytest.approx(episodes[0].turns[0].reward)
    assert logged["reward_breakdown"]["advantage"] == pytest.approx(generator_advantages[0])


def _trainer(tmp_path, policy, compile_only=True, sft_anchor=None, curriculum_config=None, **cfg):
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import HFGenerationBackend, SamplingParams
    from multiminddev.tasks.curriculum import Curriculum

    config = GRPOConfig(**{"num_steps": 1, "problems_per_step": 2, "group_size": 2,
                           "max_turns": 2, "max_new_tokens": 8, "mini_batch_size": 4,
                           "learning_rate": 1e-2, "eval_every": 0, **cfg})
    episode_cfg = EpisodeConfig(max_turns=config.max_turns, patience=0, max_format_failures=5,
                                sampling=SamplingParams(temperature=1.0, max_new_tokens=8))
    return GRPOTrainer(config, policy=policy, backend=HFGenerationBackend(policy),
                       evaluator=Evaluator(EvalConfig(num_workers=1)),
                       curriculum=Curriculum.from_problems(problems(), curriculum_config),
                       episode_config=episode_cfg, output_dir=tmp_path, compile_only=compile_only,
                       sft_anchor=sft_anchor)


def test_update_changes_only_the_active_roles_adapter(tmp_path):
    policy = tiny_policy()
    trainer = _trainer(tmp_path, policy)
    base = {n: p.detach().clone() for n, p in policy.peft_model.named_parameters() if "lora_" not in n}
    gen = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.GENERATOR)]
    opt = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.OPTIMIZER)]
    samples = [sample(AgentRole.GENERATOR, [1, 2, 3, 4], [5, 6, 7], a) for a in (1.0, -1.0)]
    trainer.update_role(AgentRole.GENERATOR, samples)
    after = dict(policy.peft_model.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in base.items()), "frozen base moved"
    assert all(torch.equal(a, b) for a, b in
               zip(opt, policy.trainable_parameters(AgentRole.OPTIMIZER))), "optimizer adapter moved"
    assert any(not torch.equal(a, b) for a, b in
               zip(gen, policy.trainable_parameters(AgentRole.GENERATOR))), "generator adapter still"


def test_role_learning_rates_name_trained_agents_with_rates_in_range():
    cfg = GRPOConfig(learning_rate=5e-5, role_learning_rates={AgentRole.GENERATOR: 2e-5})
    assert cfg.role_learning_rates == {"generator": 2e-5}
    assert cfg.learning_rate_for(AgentRole.GENERATOR) == 2e-5
    assert cfg.learning_rate_for("optimizer") == 5e-5
    assert cfg.to_dict()["role_learning_rates"] == {"generator": 2e-5}
    with pytest.raises(ValueError, match="'tester' is not a trained agent"):
        GRPOConfig(role_learning_rates={"tester": 1e-5})
    with pytest.raises(ValueError, match="'critic' is not a trained agent"):
        GRPOConfig(role_learning_rates={"critic": 1e-5})
    with pytest.raises(ValueError, match=r"role_learning_rates\['optimizer'\] must be in \(0, 1\)"):
        GRPOConfig(role_learning_rates={"optimizer": 0.0})


def test_each_agent_steps_at_its_own_learning_rate(tmp_path):
    samples = [sample(AgentRole.GENERATOR, [1, 2, 3, 4], [5, 6, 7], a) for a in (1.0, -1.0)]

    def generator_step(rates, path):
        policy = tiny_policy()
        trainer = _trainer(path, policy, learning_rate=1e-2, role_learning_rates=rates)
        before = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.GENERATOR)]
        trainer.update_role(AgentRole.GENERATOR, samples)
        after = policy.trainable_parameters(AgentRole.GENERATOR)
        lrs = {r.value: o.param_groups[0]["lr"] for r, o in trainer.optimizers.items()}
        return max(float((a.detach() - b).abs().max()) for a, b in zip(after, before)), lrs

    shared, shared_lrs = generator_step({}, tmp_path / "shared")
    own, own_lrs = generator_step({"generator": 1e-3}, tmp_path / "own")
    assert shared_lrs == {"generator": 1e-2, "optimizer": 1e-2}
    assert own_lrs == {"generator": 1e-3, "optimizer": 1e-2}
    # AdamW's first step moves each parameter by about its learning rate
    assert shared == pytest.approx(1e-2, rel=0.05) and own == pytest.approx(1e-3, rel=0.05)


def test_one_step_writes_metrics_and_seeds_checkpoint_layout(tmp_path):
    from multiminddev.train.metrics import STEP_KEYS, read_metrics

    trainer = _trainer(tmp_path, tiny_policy())
    trainer.train()
    final = trainer.finish()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 1 and set(STEP_KEYS) <= set(records[0])
    assert records[0]["compile_only"] is True and records[0]["episodes"] == 4
    # the rollout's time in the backend's decoding and log-prob passes, within the rollout's
    decoding = records[0]["time_rollout_generate"] + records[0]["time_rollout_logprobs"]
    assert 0 < records[0]["time_rollout_generate"] and decoding <= records[0]["time_rollout"]
    rl = tmp_path / "rl_checkpoints"
    best = next(rl.glob("best_model_episode_*"))
    assert best.name == "best_model_episode_4"
    for d in (best, final):
        assert (d / "generator" / "adapter_config.json").exists()
        assert (d / "optimizer" / "adapter_config.json").exists()
    assert (best / "config.json").exists() and (final / "training_metrics.json").exists()
    assert (rl / "latest" / "manifest.json").exists()


def test_training_only_the_optimizer_leaves_the_generator_at_its_start(tmp_path):
    """train_roles=(optimizer,): the Generator samples but never moves, and the checkpoints
    still hold both agents (the untrained one as it was)."""
    policy = tiny_policy()
    trainer = _trainer(tmp_path, policy, train_roles=(AgentRole.OPTIMIZER,), kl_reference="start")
    assert trainer.roles == [AgentRole.OPTIMIZER] and set(trainer.optimizers) == {AgentRole.OPTIMIZER}
    gen = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.GENERATOR)]
    opt = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.OPTIMIZER)]
    # both agents' turns with real advantages: only the Optimizer's may move anything
    trainer.update([sample(role, [1, 2, 3, 4], [5, 6, 7], a, turn=t)
                    for t, role in enumerate((AgentRole.GENERATOR, AgentRole.OPTIMIZER))
                    for a in (1.0, -1.0)])
    assert all(torch.equal(a, b) for a, b in
               zip(gen, policy.trainable_parameters(AgentRole.GENERATOR))), "generator moved"
    assert any(not torch.equal(a, b) for a, b in
               zip(opt, policy.trainable_parameters(AgentRole.OPTIMIZER))), "optimizer still"
    trainer.train()
    final = trainer.finish()
    assert trainer.step == 1
    best = next((tmp_path / "rl_checkpoints").glob("best_model_episode_*"))
    for d in (best, final):
        assert (d / "generator" / "adapter_config.json").exists()
        assert (d / "optimizer" / "adapter_config.json").exists()


def test_a_greedy_generator_hands_every_optimizer_of_a_group_the_same_kernel(tmp_path):
    """Optimizer-only GRPO with the Generator decoding greedily: within a group the Generator's
    replies are identical (so the group's reward differences are the Optimizer's), while the
    Optimizer's turns are still sampled, at GRPO's temperature."""
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import SamplingParams

    policy = tiny_policy()
    trainer = _trainer(tmp_path, policy, train_roles=(AgentRole.OPTIMIZER,), group_size=4,
                       problems_per_step=1, max_new_tokens=12)
    trainer.episode_config = EpisodeConfig(
        max_turns=2, patience=0, max_format_failures=5,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=12),
        temperature_by_role={"generator": 0.0})
    episodes, _ = trainer.rollout()
    assert len(episodes) == 4
    firsts = {tuple(e.turns[0].response_ids) for e in episodes}
    seconds = {tuple(e.turns[1].response_ids) for e in episodes if len(e.turns) > 1}
    assert len(firsts) == 1, "greedy Generator replies differ within the group"
    assert len(seconds) > 1, "the Optimizer's sampled replies are all the same"


def test_a_trained_role_must_sample_at_grpos_temperature(tmp_path):
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import SamplingParams

    trainer = _trainer(tmp_path, tiny_policy())  # trains both agents at temperature 1.0
    trainer.episode_config = EpisodeConfig(
        max_turns=2, sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        temperature_by_role={"generator": 0.0})
    with pytest.raises(ValueError, match="generator at temperature 1, but its rollout turns "
                                         "sample at 0"):
        trainer.rollout()
    trainer.episode_config = EpisodeConfig(
        max_turns=2, sampling=SamplingParams(temperature=0.8, max_new_tokens=8))
    with pytest.raises(ValueError, match="GRPOConfig.temperature"):
        trainer.rollout()


def test_checkpoint_score_never_ranks_a_rollout_reward_against_a_heldout_one():
    rollout, heldout = {"reward_mean": 0.9}, {"reward_mean": 0.3}
    assert checkpoint_score(rollout, heldout, heldout_decides=True) == 0.3
    assert checkpoint_score(rollout, None, heldout_decides=True) is None
    assert checkpoint_score(rollout, None, heldout_decides=False) == 0.9


def test_best_model_follows_heldout_evaluations_only(tmp_path):
    trainer = _trainer(tmp_path, tiny_policy(), eval_every=2)
    trainer.heldout = problems(1)
    rl = tmp_path / "rl_checkpoints"
    trainer.maybe_checkpoint({"reward_mean": 0.9}, None)  # a rollout step: ranks nothing
    assert trainer.best_reward is None and not list(rl.glob("best_model_episode_*"))
    trainer.episodes_done = 8
    trainer.maybe_checkpoint({"reward_mean": 0.1}, {"reward_mean": 0.3})
    trainer.episodes_done = 12
    trainer.maybe_checkpoint({"reward_mean": 0.95}, None)  # higher, but not held-out
    assert (trainer.best_reward, trainer.best_episode) == (0.3, 8)
    assert [d.name for d in rl.glob("best_model_episode_*")] == ["best_model_episode_8"]


def _params(policy):
    return [p.detach().clone() for r in policy.roles for p in policy.trainable_parameters(r)]


@pytest.mark.slow
def test_resume_after_kill_reproduces_uninterrupted_training(tmp_path):
    straight = _trainer(tmp_path / "a", tiny_policy(), num_steps=2)
    straight.train()
    first = _trainer(tmp_path / "b", tiny_policy(), num_steps=1)
    first.train()  # writes rl_checkpoints/latest after its step; the process "dies" here
    del first
    torch.manual_seed(1234)  # a fresh process would start from other RNG states
    resumed = _trainer(tmp_path / "b", tiny_policy(seed=0), num_steps=2)
    resumed.resume(tmp_path / "b")
    assert resumed.step == 1 and resumed.episodes_done == 4
    resumed.train()
    for a, b in zip(_params(straight.policy), _params(resumed.policy)):
        assert torch.equal(a, b)
    for role in straight.roles:
        sa, sb = straight.optimizers[role].state_dict(), resumed.optimizers[role].state_dict()
        assert all(torch.equal(sa["state"][k]["exp_avg"], sb["state"][k]["exp_avg"])
                   for k in sa["state"])
    assert straight.curriculum.state_dict() == resumed.curriculum.state_dict()
    # the episodes' outcomes reached the family windows that --family-sampling signal reads
    families = straight.curriculum.state_dict()["families"]
    assert sum(len(w) for w in families.values()) == straight.episodes_done


@pytest.mark.slow
def test_training_paused_at_a_step_goes_on_as_if_never_paused(tmp_path):
    straight = _trainer(tmp_path / "a", tiny_policy(), num_steps=2)
    straight.train()
    paused = _trainer(tmp_path / "b", tiny_policy(), num_steps=2)
    paused.train(until=1)
    assert paused.step == 1  # a caller evaluates here (the pipeline's early stopping)
    paused.train()
    assert paused.step == 2
    for a, b in zip(_params(straight.policy), _params(paused.policy)):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_one_step_on_gpu_moves_the_adapters_and_logs_real_rewards(tmp_path):
    from multiminddev.train.metrics import read_metrics

    policy = tiny_policy()
    policy.peft_model.to("cuda")
    before = _params(policy)
    # with --family-sampling signal, whose draws read the episodes' outcomes
    trainer = _trainer(tmp_path, policy, compile_only=False,
                       curriculum_config=CurriculumConfig(family_sampling="signal"))
    trainer.train()
    after = _params(policy)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    metrics = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert metrics["compile_only"] is False
    families = trainer.curriculum.state_dict()["families"]
    assert sum(len(w) for w in families.values()) == trainer.episodes_done
    assert {f"curriculum/family_weight/{f}" for f in families} <= set(metrics)


def _generator_logprobs(policy, ids, *, reference=False):
    from multiminddev.policy import token_logprobs

    mask = torch.ones_like(ids)
    with torch.no_grad():
        if reference:
            with policy.reference(AgentRole.GENERATOR) as ref:
                return token_logprobs(ref, ids, mask)
        with policy.use(AgentRole.GENERATOR) as model:
            return token_logprobs(model, ids, mask)


def test_start_reference_is_the_agent_as_grpo_started_and_stays_frozen(tmp_path):
    policy = tiny_policy()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    start = _generator_logprobs(policy, ids)
    with policy.reference() as base_model:  # no role: the pre-trained base, adapters off
        from multiminddev.policy import token_logprobs

        base = token_logprobs(base_model, ids, torch.ones_like(ids)).detach()
    trainer = _trainer(tmp_path, policy, kl_reference="start")
    assert not policy.start_references  # not at construction: SFT may still run before train()
    trainer.freeze_start_reference()  # what train() and resume() do first
    assert torch.allclose(_generator_logprobs(policy, ids, reference=True), start)
    assert not torch.allclose(start, base)  # the (randomised) adapter acts: a real difference
    frozen = [p for n, p in policy.peft_model.named_parameters() if "_start_reference." in n]
    assert frozen and not any(p.requires_grad for p in frozen)
    samples = [sample(AgentRole.GENERATOR, [1, 2, 3, 4], [5, 6, 7], a) for a in (1.0, -1.0)]
    trainer.update_role(AgentRole.GENERATOR, samples)
    moved = _generator_logprobs(policy, ids)
    assert not torch.allclose(moved, start)  # the agent trained ...
    assert torch.allclose(_generator_logprobs(policy, ids, reference=True), start)  # ... its reference did not
    assert not any(p.requires_grad for p in frozen)
    assert trainer.cfg.to_dict()["kl_reference"] == "start"


def test_base_reference_is_the_default_and_a_bad_name_says_what_to_use():
    assert GRPOConfig().kl_reference.value == "base"
    with pytest.raises(ValueError, match="'base'.*'start'"):
        GRPOConfig(kl_reference="sft")


def test_a_resumed_run_keeps_the_start_reference_it_began_with(tmp_path):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    first = _trainer(tmp_path, tiny_policy(), kl_reference="start")
    start = _generator_logprobs(first.policy, ids)
    first.freeze_start_reference()
    samples = [sample(AgentRole.GENERATOR, [1, 2, 3, 4], [5, 6, 7], a) for a in (1.0, -1.0)]
    first.update_role(AgentRole.GENERATOR, samples)
    trained = _generator_logprobs(first.policy, ids)
    first.save_checkpoint()  # the process "dies" after this
    resumed = _trainer(tmp_path, tiny_policy(), kl_reference="start")  # same starting agents
    resumed.resume(tmp_path)
    assert torch.allclose(_generator_logprobs(resumed.policy, ids), trained)
    assert torch.allclose(_generator_logprobs(resumed.policy, ids, reference=True), start)
    assert not torch.allclose(trained, start)


def _anchor_examples(policy, n: int = 4):
    from multiminddev.train.sft import tokenize_chat

    messages = [[{"role": "user", "content": f"write kernel {i}"},
                 {"role": "assistant", "content": f"```python\nx = {i}\n```"}] for i in range(n)]
    return [tokenize_chat(policy.tokenizer, m, 256) for m in messages]


def test_sft_anchor_needs_examples_and_a_valid_weight(tmp_path):
    with pytest.raises(ValueError, match="sft_coef >= 0"):
        GRPOConfig(sft_coef=-0.1)
    with pytest.raises(ValueError, match="sft_anchor="):
        _trainer(tmp_path, tiny_policy(), sft_coef=0.5)


def test_sft_anchor_trains_toward_the_sft_examples_without_any_advantage(tmp_path):
    """With every advantage 0 the policy loss has no gradient; the anchor alone lowers SFT's
    loss on the role's examples, and the step reports it."""
    from multiminddev.train.sft import mean_assistant_loss

    policy = tiny_policy()
    examples = _anchor_examples(policy)
    trainer = _trainer(tmp_path, policy, sft_coef=1.0, sft_batch_size=4, kl_coef=0.0,
                       learning_rate=1e-2, sft_anchor={AgentRole.GENERATOR: examples})
    pad = policy.tokenizer.pad_token_id or 0
    with policy.use(AgentRole.GENERATOR) as model:
        before = mean_assistant_loss(model, examples, pad)
    samples = [sample(AgentRole.GENERATOR, [1, 2, 3, 4], [5, 6, 7], 0.0) for _ in range(2)]
    stats = {}
    for _ in range(3):
        stats = trainer.update_role(AgentRole.GENERATOR, samples)
    with policy.use(AgentRole.GENERATOR) as model:
        after = mean_assistant_loss(model, examples, pad)
    assert "sft_loss" in stats and after < before


def test_without_the_anchor_no_sft_examples_are_drawn(tmp_path):
    policy = tiny_policy()
    trainer = _trainer(tmp_path, policy, sft_anchor={AgentRole.GENERATOR: _anchor_examples(policy)})
    state = trainer.rng.getstate()
    assert trainer.anchor_examples(AgentRole.GENERATOR) == []
    assert trainer.rng.getstate() == state  # sft_coef 0: the random stream is untouched


def test_config_rejects_an_infra_share_outside_zero_to_one():
    with pytest.raises(ValueError, match="GRPOConfig.max_infra_share must be in \\[0, 1\\]"):
        GRPOConfig(max_infra_share=1.5)


def _replay_trainer(tmp_path, evaluator, **cfg):
    """A trainer whose rollouts write a valid relu kernel every turn (a replay backend), so each
    turn reaches ``evaluator``."""
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import SamplingParams
    from multiminddev.tasks.curriculum import Curriculum
    from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced

    policy = tiny_policy()
    backend = ReplayBackend(policy.tokenizer, lambda role, call, i: fenced(RELU_KERNEL))
    config = GRPOConfig(**{"num_steps": 1, "problems_per_step": 1, "group_size": 2,
                           "max_turns": 1, "max_new_tokens": 8, "mini_batch_size": 2,
                           "eval_every": 0, **cfg})
    return GRPOTrainer(config, policy=policy, backend=backend, evaluator=evaluator,
                       curriculum=Curriculum.from_problems(problems(1)),
                       episode_config=EpisodeConfig(max_turns=1, sampling=SamplingParams(
                           temperature=1.0, max_new_tokens=8)),
                       output_dir=tmp_path, compile_only=True)


def test_a_rollout_whose_workers_cannot_start_stops_training_with_the_cause(tmp_path):
    """Real worker processes given no time to start: every evaluation of the rollout is an
    infrastructure error. Left out one by one, they would make a step that trained on nothing;
    the step stops instead, with the evaluator's message, its episodes logged, no step taken."""
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import InfraFailure, read_episodes_jsonl

    config = EvalConfig(num_workers=1, spare_workers=0, startup_timeout_s=1e-6,
                        infra_retry_delay_s=0.01)
    with Evaluator(config) as evaluator:
        trainer = _replay_trainer(tmp_path, evaluator)
        with pytest.raises(InfraFailure, match="GRPO step 1's rollout: 2 of 2 episodes .*"
                                               "did not start within"):
            trainer.train()
    assert trainer.step == 0 and not (tmp_path / "rl_checkpoints" / "latest").exists()
    assert len(read_episodes_jsonl(tmp_path / "episodes.jsonl")) == 2


def test_a_rollout_with_infra_errors_trains_when_told_to_accept_them(tmp_path):
    from multiminddev.env import EvalConfig, Evaluator

    evaluator = Evaluator(EvalConfig(num_workers=1))
    evaluator.close()  # every evaluation: "the evaluator is closed"
    trainer = _replay_trainer(tmp_path, evaluator, max_infra_share=1.0)
    trainer.train()
    assert trainer.step == 1 and trainer.history[0]["infra_error_episodes"] == 2.0


@pytest.mark.parametrize("steps, per_step, eval_every, expected", [
    (1, 2, 0, ["t0_p0", "t0_p1"]),  # the run draws 2: the current tier's first two
    (2, 4, 0, ["t0_p0", "t0_p1", "t0_p2", "t1_p0", "t1_p1", "t1_p2", "t2_p0", "t2_p1"]),
    (9, 9, 0, ["t0_p0", "t0_p1", "t0_p2", "t1_p0", "t1_p1", "t1_p2", "t2_p0", "t2_p1",
               "t2_p2"]),  # every problem, once each
    (1, 2, 5, ["t0_p0", "t0_p1", "held_0", "held_1"]),  # + the select@ problems
])
def test_the_baselines_measured_ahead_are_the_problems_the_run_can_draw(steps, per_step,
                                                                          eval_every, expected):
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.problem import Problem

    def named(name, tier=0):
        return Problem(name=name, source=RELU_1024, tier=tier)

    curriculum = Curriculum({t: [named(f"t{t}_p{i}", t) for i in range(3)] for t in range(3)})
    heldout = [named(f"held_{i}") for i in range(4)]
    cfg = GRPOConfig(num_steps=steps, problems_per_step=per_step, eval_every=eval_every,
                     eval_problems=2)
    assert [p.name for p in baseline_problems(curriculum, heldout, cfg)] == expected
