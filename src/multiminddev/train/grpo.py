"""Multi-turn, multi-agent GRPO on one machine.

One step (``GRPOTrainer.train_step``), each phase timed:

1. rollout    curriculum samples ``problems_per_step`` problems; ``run_episodes`` plays
              ``group_size`` episodes per problem (Generator -> Tester -> Optimizer -> ...).
2. reward     ``compute_reward`` on each agent turn's EvalResult, then ``assign_turn_rewards``
              (credit over the turns of the episode).
3. advantage  group-relative per problem group and agent (and turn index, by default).
4. update     for each trainable role, on its own turns only: token-level clipped loss on the
              response tokens (loss mask), + kl_coef * k3 KL to the frozen base
              (``policy.reference()``), ``ppo_epochs`` passes of mini-batches with gradient
              accumulation and clipping, one AdamW per role's adapter.
5. log        metrics.jsonl / TensorBoard / W&B.
6. checkpoint ``rl_checkpoints/latest`` (resumable) and ``best_model_episode_N``.

Episodes come from a ``RolloutSource``: ``LocalRollouts`` plays them in this process with the
learner's own model; ``multiminddev.distributed.rollout.RayRollouts`` plays them on Ray actors,
and ``train.remote_rollouts.RemoteRollouts`` samples them from an OpenAI-compatible server;
the update phase hands either the new adapter weights (``publish``) before the next rollout,
and the step's record says which version sampled it (``weights_version``).

Without a GPU the kernels are compiled but not run: rewards are then compile-only, and every
log line and record says so (``compile_only``).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalStatus
from multiminddev.episode import run_episodes, write_episodes_jsonl
from multiminddev.episode.infra import (
    INFRA_SHARE_LIMIT,
    InfraFailure,
    check_episodes,
    check_share_limit,
)
from multiminddev.policy import token_logprobs
from multiminddev.policy.model import release_cached_gpu_memory
from multiminddev.rewards import CreditConfig, RewardConfig, assign_turn_rewards, compute_reward
from multiminddev.rl.advantages import (
    role_codes,
    stratified_advantages,
    turn_level_advantages,
    weight_by_sign,
)
from multiminddev.rl.losses import LossAgg, assistant_nll, grpo_loss, masked_mean
from multiminddev.train import checkpoints as ck
from multiminddev.train.checkpoints import (
    TrainerState,
    capture_rng,
    find_latest,
    load_latest,
    restore_rng,
    save_final,
    save_latest,
)
from multiminddev.train.metrics import (
    MetricsConfig,
    MetricsLogger,
    PhaseTimer,
    best_result,
    rollout_metrics,
)
from multiminddev.train.sft import collate_examples


class AdvantageMode(str, enum.Enum):
    GROUP = "group"  # baseline: the agent's turns in the problem group (any turn index)
    TURN_LEVEL = "turn_level"  # baseline: same agent, same turn index, same problem group
    LEAVE_ONE_OUT = "leave_one_out"  # RLOO baseline per agent and turn index, no std scaling


class KLReference(str, enum.Enum):
    BASE = "base"  # the frozen pre-trained model (adapters off), the usual GRPO reference
    START = "start"  # each agent as GRPO started (e.g. its SFT checkpoint), frozen


class ImprovementBaseline(str, enum.Enum):
    """What the turns that ``credit.improvement`` re-credits are centred on."""

    GROUP = "group"  # the group's turns of the same index and role, as every other turn
    NONE = "none"  # nothing: the improvement itself is the advantage
    HANDED_OUTCOME = "handed_outcome"  # the group's turns handed a kernel of the same outcome


@dataclass(kw_only=True)
class GRPOConfig:
    num_steps: int = 10
    problems_per_step: int = 4
    group_size: int = 4  # G episodes per problem
    max_turns: int = 3  # agent turns per episode (Generator first, then Optimizer)
    learning_rate: float = 2e-5
    # One agent's own rate, e.g. {"generator": 2e-5}; agents not named use learning_rate. Why:
    # at 5e-5 the Generator's greedy held-out choices drifted onto other problems' templates while
    # the Optimizer barely moved (docs/training.md, "Learning rate").
    role_learning_rates: dict[str, float] = field(default_factory=dict)
    weight_decay: float = 0.0
    ppo_epochs: int = 1  # passes over each batch (PPO-style reuse)
    mini_batch_size: int = 8  # samples per optimizer step
    grad_accum: int = 1  # micro-batches per mini-batch
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2  # > clip_low: DAPO clip-higher (e.g. 0.28)
    dual_clip: float | None = None
    kl_coef: float = 0.02
    # What the KL term pulls toward. After SFT the base compiles nothing and its KL to the SFT
    # agents is 0.7-0.9 per token from the first step (docs/training.md, "KL reference"), so
    # "start" keeps the penalty on drift from the SFT agents instead.
    kl_reference: KLReference = KLReference.BASE
    # SFT anchor (InstructGPT's PPO-ptx): each optimizer step also takes SFT's loss on
    # sft_batch_size of the role's SFT examples, times sft_coef. Off by default. Why: GRPO after
    # SFT on resized shapes lost, on every seed, exactly the held-out problems those shapes had
    # fixed, while its own rewards held (docs/training.md, "Advantage variants").
    sft_coef: float = 0.0
    sft_batch_size: int = 4
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN
    advantage: AdvantageMode = AdvantageMode.TURN_LEVEL
    normalize_std: bool = True  # False: Dr.GRPO (no std scaling)
    filter_zero_variance: bool = False  # DAPO dynamic sampling: drop groups with equal rewards
    # W-REINFORCE: weights of positive / negative advantages (rl.advantages.weight_by_sign);
    # positive_weight=0.1 learns mostly from failed samples
    positive_weight: float = 1.0
    negative_weight: float = 1.0
    # With credit.improvement, a turn after the first is credited with its reward minus the
    # best reward before it. Centred on its group ("group"), it is compared with turns handed
    # other kernels: an Optimizer turn that left a failing kernel failing (improvement 0) gained
    # whenever a groupmate broke a correct one, summing to +4.4 to +11.1 per seed in one run;
    # the seed with the most went from 11 to 0 correct Optimizer turns per step. Not centred
    # ("none"), a break cost about -0.6 and a keep gained about +0.1, so the summed advantage
    # was -23 to -38 per seed, and the most negative seed's Optimizer broke 23 of 24 held-out
    # kernels. "handed_outcome" compares a turn only with its groupmates handed a kernel of the
    # same outcome (correct or not), as rl.advantages.stratified_advantages does
    # (docs/training.md, "Turn credit").
    improvement_baseline: ImprovementBaseline = ImprovementBaseline.GROUP
    reward: RewardConfig = field(default_factory=RewardConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    eval_every: int = 5  # steps between held-out evaluations (and at the end); 0: none
    eval_problems: int = 8  # held-out problems per evaluation
    checkpoint_every: int = 1
    # A rollout (or held-out evaluation) in which more than this share of the episodes ended in
    # an infrastructure error stops training with InfraFailure: left out of the update one by
    # one, they would otherwise leave a step that trained on nothing and logged the reward of
    # the few that worked, and a stage that quietly turned into an evaluator failure. 1: never.
    max_infra_share: float = INFRA_SHARE_LIMIT
    train_roles: tuple[AgentRole, ...] = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)
    seed: int = 0

    def __post_init__(self) -> None:
        self.loss_agg = LossAgg(self.loss_agg)
        try:
            self.kl_reference = KLReference(self.kl_reference)
        except ValueError:
            raise ValueError(f"GRPOConfig.kl_reference={self.kl_reference!r}: use 'base' (the "
                             "pre-trained model) or 'start' (the agents as GRPO started)") from None
        self.advantage = AdvantageMode(self.advantage)
        try:
            self.improvement_baseline = ImprovementBaseline(self.improvement_baseline)
        except ValueError:
            raise ValueError(f"GRPOConfig.improvement_baseline={self.improvement_baseline!r}: use "
                             + ", ".join(repr(b.value) for b in ImprovementBaseline)) from None
        self.train_roles = tuple(AgentRole(r) for r in self.train_roles)
        for name in ("num_steps", "problems_per_step", "max_turns", "ppo_epochs",
                     "mini_batch_size", "grad_accum", "max_new_tokens", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"GRPOConfig.group_size must be >= 2 (a group of one has no "
                             f"relative advantage), got {self.group_size}")
        if self.grad_accum > self.mini_batch_size:
            raise ValueError(f"grad_accum ({self.grad_accum}) > mini_batch_size "
                             f"({self.mini_batch_size}): lower grad_accum or raise mini_batch_size")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"GRPOConfig.learning_rate must be in (0, 1), got {self.learning_rate}")
        rates = {}
        for name, rate in dict(self.role_learning_rates).items():
            role = AgentRole(name) if name in {r.value for r in AgentRole} else None
            if role is None or not role.trainable:
                raise ValueError(f"GRPOConfig.role_learning_rates: {name!r} is not a trained agent; "
                                 "name generator and/or optimizer")
            if not 0 < float(rate) < 1:
                raise ValueError(f"GRPOConfig.role_learning_rates[{role.value!r}] must be in (0, 1), "
                                 f"got {rate}")
            rates[role.value] = float(rate)
        self.role_learning_rates = rates
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError("need 0 <= clip_low < 1 and clip_high >= 0 (0.2 / 0.2, or 0.2 / 0.28)")
        if self.sft_coef < 0 or self.sft_batch_size < 1:
            raise ValueError(f"GRPOConfig needs sft_coef >= 0 (0: no SFT anchor) and "
                             f"sft_batch_size >= 1, got {self.sft_coef} and {self.sft_batch_size}")
        if self.positive_weight < 0 or self.negative_weight < 0:
            raise ValueError(f"GRPOConfig.positive_weight and negative_weight must be >= 0 (1.0: "
                             f"plain GRPO; positive_weight=0.1: W-REINFORCE), got "
                             f"{self.positive_weight} and {self.negative_weight}")
        if self.kl_coef < 0 or self.temperature <= 0 or self.eval_every < 0:
            raise ValueError("kl_coef and eval_every must be >= 0 and temperature > 0 "
                             "(GRPO samples; greedy rollouts have no group variance)")
        if self.improvement_baseline is not ImprovementBaseline.GROUP and not self.credit.improvement:
            raise ValueError(f"GRPOConfig.improvement_baseline={self.improvement_baseline.value!r} "
                             "changes only turns credited with credit.improvement: set "
                             "credit.improvement=True too")
        check_share_limit(self.max_infra_share, "GRPOConfig.max_infra_share")
        if any(not r.trainable for r in self.train_roles) or not self.train_roles:
            raise ValueError("train_roles: list generator and/or optimizer (the Tester has no weights)")

    def learning_rate_for(self, role: AgentRole | str) -> float:
        """The AdamW learning rate of one agent's adapter."""
        return self.role_learning_rates.get(AgentRole(role).value, self.learning_rate)

    @property
    def episodes_per_step(self) -> int:
        return self.problems_per_step * self.group_size

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reward"] = self.reward.to_dict() if hasattr(self.reward, "to_dict") else asdict(self.reward)
        out["credit"] = {k: getattr(v, "value", v) for k, v in asdict(self.credit).items()}
        out["loss_agg"] = self.loss_agg.value
        out["kl_reference"] = self.kl_reference.value
        out["advantage"] = self.advantage.value
        out["train_roles"] = [r.value for r in self.train_roles]
        return out


@dataclass(kw_only=True)
class TurnSample:
    """One agent turn, ready for the update: what it saw, what it wrote, how good it was."""

    group: int  # problem group within the step
    episode: int  # episode index within the step
    turn_index: int  # index among the episode's agent turns
    role: AgentRole
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    immediate: float  # this turn's own reward
    reward: float  # credit-assigned reward it is trained on
    advantage: float = 0.0
    handed_correct: bool | None = None  # an earlier agent turn passed; None on the first turn


# --------------------------------------------------------------------------- rollout phase

class RolloutSource(Protocol):
    """Where a step's episodes come from. ``publish`` is called with the policy whenever its
    adapters change (before the first rollout and after every update); ``version`` counts the
    updates the weights include, so a source that samples elsewhere can prove it sampled with
    the latest ones. ``tokens_generated`` and ``seconds`` (e.g. ``generate``, ``logprobs``) are
    cumulative counters the trainer logs per step."""

    tokens_generated: int
    seconds: dict[str, float]

    def run_episodes(self, problems: list[Any], group_size: int, config: Any) -> list[Any]: ...

    def publish(self, policy: Any, version: int) -> None: ...


class LocalRollouts:
    """Episodes played in this process by ``backend`` (which samples from the learner's own
    model, so ``publish`` has nothing to send) and scored by ``evaluator``."""

    def __init__(self, backend: Any, evaluator: Any) -> None:
        self.backend, self.evaluator = backend, evaluator

    @property
    def tokens_generated(self) -> int:
        return getattr(self.backend, "tokens_generated", 0)

    @property
    def seconds(self) -> dict[str, float]:
        return dict(getattr(self.backend, "seconds", {}))

    def run_episodes(self, problems: list[Any], group_size: int, config: Any) -> list[Any]:
        out = run_episodes(problems, self.backend, self.evaluator, config, group_size=group_size)
        return asyncio.run(out) if inspect.isawaitable(out) else out

    def publish(self, policy: Any, version: int) -> None:
        pass

    def prefetch_baselines(self, problems: list[Any]) -> int:
        """The evaluator measures ``problems``' baselines now (``Evaluator.prefetch_baselines``
        with ``wait``); returns how many it measured."""
        prefetch = getattr(self.evaluator, "prefetch_baselines", None)
        return prefetch(problems, wait=True) if prefetch is not None else 0


def baseline_problems(curriculum: Any, heldout: Sequence[Any], cfg: GRPOConfig) -> list[Any]:
    """The problems whose baselines a run measures before its first rollout: the curriculum's,
    those drawn soonest first, at most as many as the run draws (``num_steps x
    problems_per_step``), then the select@ problems when the run evaluates them."""
    problems = curriculum.problems_in_draw_order()[: cfg.num_steps * cfg.problems_per_step]
    if cfg.eval_every:
        problems += list(heldout[: cfg.eval_problems])
    return problems


# --------------------------------------------------------------------------- reward phase

def checkpoint_score(record: dict[str, Any], eval_stats: dict[str, float] | None, *,
                     heldout_decides: bool) -> float | None:
    """The reward that ranks a step for ``best_model_episode_N``; None: this step is not ranked.

    A run that evaluates held-out problems ranks only its evaluated steps, by held-out reward:
    a step's rollout reward is on other problems and, at temperature, another scale, so
    comparing it with a held-out best picked steps by chance. Without held-out problems, the
    rollout reward ranks every step."""
    if eval_stats is not None:
        return eval_stats["reward_mean"]
    return None if heldout_decides else record["reward_mean"]


def score_episodes(episodes: list[Any], cfg: GRPOConfig) -> tuple[list[TurnSample], dict[str, float]]:
    """Rewards per agent turn (credit-assigned) as TurnSamples, plus reward statistics.

    Episodes of one problem form a group (``episode.group`` if the runner sets it, else the
    problem's name). Statistics: episode reward = its best agent-turn immediate reward;
    ``reward/<component>`` = mean of each reward component over agent turns. An episode with an
    infrastructure error (a crowded GPU, a worker that would not start) is left out of both:
    its reward says nothing about the policy (``infra_error_episodes`` counts them).

    Each scored agent turn also gets its reward written on it (``turn.reward``: the immediate
    reward; ``turn.reward_breakdown``: its components and ``credited``), so the episode log
    (episodes.jsonl) shows what every turn was trained on.
    """
    groups: dict[Any, int] = {}
    samples: list[TurnSample] = []
    episode_rewards: list[float] = []
    components: dict[str, list[float]] = {}
    infra_errors = 0
    for e_idx, episode in enumerate(episodes):
        if any(_is_infra_error(t) for t in episode.turns):
            infra_errors += 1
            continue
        key = getattr(episode, "group", None)
        key = key if key is not None else episode.problem.name
        group = groups.setdefault(key, len(groups))
        roles = [AgentRole(t.role) for t in episode.turns]
        immediate = []
        breakdowns: dict[int, dict[str, float]] = {}
        for t_idx, (turn, role) in enumerate(zip(episode.turns, roles)):
            if not role.trainable:
                immediate.append(0.0)
                continue
            breakdown = compute_reward(turn.eval_result, cfg.reward,
                                       getattr(turn, "candidate_source", None),
                                       repeated=getattr(turn, "repeat_of", None) is not None)
            immediate.append(breakdown.total)
            breakdowns[t_idx] = dict(breakdown.components)
            for name, value in breakdown.components.items():
                components.setdefault(name, []).append(value)
        credited = assign_turn_rewards(roles, immediate, cfg.credit)
        agent = [i for i, r in enumerate(roles) if r.trainable]
        for i in agent:
            turn = episode.turns[i]
            turn.reward = immediate[i]
            turn.reward_breakdown = {**breakdowns[i], "credited": credited[i]}
        episode_rewards.append(max((immediate[i] for i in agent), default=0.0))
        passed = [_passed(episode.turns[i]) for i in agent]
        for k, i in enumerate(agent):
            turn = episode.turns[i]
            if not turn.response_ids:
                continue
            samples.append(TurnSample(
                group=group, episode=e_idx, turn_index=k, role=roles[i],
                prompt_ids=list(turn.prompt_ids), response_ids=list(turn.response_ids),
                old_logprobs=list(turn.logprobs), immediate=immediate[i], reward=credited[i],
                handed_correct=any(passed[:k]) if k else None))
    n = max(len(episode_rewards), 1)
    mean = sum(episode_rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in episode_rewards) / n)
    stats = {"reward_mean": mean, "reward_std": std,
             "turn_reward_mean": sum(s.reward for s in samples) / max(len(samples), 1),
             "infra_error_episodes": float(infra_errors)}
    stats.update({f"reward/{k}": sum(v) / len(episode_rewards or [0]) for k, v in components.items()})
    return samples, stats


def _passed(turn: Any) -> bool:
    result = getattr(turn, "eval_result", None)
    return result is not None and result.correct


def _is_infra_error(turn: Any) -> bool:
    result = getattr(turn, "eval_result", None)
    return result is not None and result.status is EvalStatus.INFRA_ERROR


# --------------------------------------------------------------------------- advantage phase

def assign_advantages(samples: list[TurnSample], cfg: GRPOConfig) -> list[TurnSample]:
    """Group-relative advantages in place; returns the samples to train on (DAPO filter)."""
    import torch

    if not samples:
        return []
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    groups = torch.tensor([s.group for s in samples])
    turns = torch.tensor([s.turn_index for s in samples])
    roles = role_codes([s.role for s in samples])
    adv = turn_level_advantages(
        rewards, groups, turns, roles,
        per_turn=cfg.advantage is not AdvantageMode.GROUP, per_role=True,
        normalize_std=cfg.normalize_std and cfg.advantage is not AdvantageMode.LEAVE_ONE_OUT,
        leave_one_out=cfg.advantage is AdvantageMode.LEAVE_ONE_OUT)
    baseline = cfg.improvement_baseline
    if cfg.credit.improvement and baseline is not ImprovementBaseline.GROUP:
        # the turns credit.improvement re-credited: every agent turn after the first
        later = turns > 0
        if baseline is ImprovementBaseline.NONE:
            improvement = rewards
        else:
            # a stratum: turn index, role and whether the kernel handed on had passed
            handed = torch.tensor([bool(s.handed_correct) for s in samples], dtype=torch.long)
            _, strata = torch.unique(torch.stack([turns, roles, handed], dim=1), dim=0,
                                     return_inverse=True)
            improvement = torch.zeros_like(rewards)
            improvement[later] = stratified_advantages(
                rewards[later], groups[later], strata[later], normalize_std=cfg.normalize_std)
        adv = torch.where(later, improvement.to(adv.dtype), adv)
    adv = weight_by_sign(adv, positive=cfg.positive_weight, negative=cfg.negative_weight)
    for s, a in zip(samples, adv.tolist()):
        s.advantage = float(a)
    if cfg.filter_zero_variance:
        return [s for s in samples if s.advantage != 0.0]
    return samples


def record_advantages(episodes: list[Any], samples: list[TurnSample]) -> None:
    """Write each trained turn's advantage into its ``reward_breakdown`` (the episode log);
    a turn left out of the update (no reply, DAPO's zero-variance filter) has none."""
    for s in samples:
        agent_turns = [t for t in episodes[s.episode].turns if AgentRole(t.role).trainable]
        agent_turns[s.turn_index].reward_breakdown["advantage"] = s.advantage


# --------------------------------------------------------------------------- update phase

@dataclass(kw_only=True)
class Batch:
    """Right-padded token batch: ``mask`` is 1 exactly on response (agent) tokens."""

    input_ids: Any  # [B, T] long
    attention_mask: Any  # [B, T]
    loss_mask: Any  # [B, T]
    old_logprobs: Any  # [B, T] float32, response positions only
    advantages: Any  # [B]
    ref_logprobs: Any = None  # [B, T]


def build_batch(samples: list[TurnSample], pad_id: int, device: Any = "cpu") -> Batch:
    import torch

    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    shape = (len(samples), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attn = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape, dtype=torch.float32)
    old = torch.zeros(shape, dtype=torch.float32)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[row, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        attn[row, : p + r] = 1
        mask[row, p : p + r] = 1.0
        old[row, p : p + r] = torch.tensor(s.old_logprobs[:r], dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return Batch(input_ids=ids.to(device), attention_mask=attn.to(device),
                 loss_mask=mask.to(device), old_logprobs=old.to(device), advantages=adv.to(device))


def batch_loss(new_logprobs: Any, batch: Batch, cfg: GRPOConfig) -> tuple[Any, dict[str, float]]:
    """GRPO loss of a batch from the current policy's per-token logprobs [B, T]."""
    loss, stats = grpo_loss(
        new_logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask, batch.ref_logprobs,
        kl_coef=cfg.kl_coef, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip, loss_agg=cfg.loss_agg)
    # Monte-Carlo entropy estimate: the mean negative log-prob of the sampled tokens.
    stats["entropy"] = float(-masked_mean(new_logprobs.detach(), batch.loss_mask))
    stats.setdefault("kl", 0.0)
    return loss, stats


def _slice(batch: Batch, idx: Any) -> Batch:
    return Batch(**{k: (v[idx] if v is not None else None) for k, v in vars(batch).items()})


class GRPOTrainer:
    """Owns the loop; the policy, backend, evaluator and curriculum are passed in."""

    def __init__(self, config: GRPOConfig, *, policy: Any, backend: Any, evaluator: Any,
                 curriculum: Any, episode_config: Any, output_dir: Path,
                 heldout: list[Any] | None = None, metrics: Any = None,
                 compile_only: bool | None = None, console: Any = None,
                 sft_anchor: Mapping[AgentRole, Sequence[dict[str, list[int]]]] | None = None,
                 rollouts: RolloutSource | None = None) -> None:
        """``sft_anchor``: per role, tokenized SFT examples (``train.sft.tokenize_chat``'s
        ``input_ids`` / ``labels``) for ``cfg.sft_coef``; a role without any trains on GRPO's
        loss alone. ``rollouts``: where episodes are played; None: in this process with
        ``backend`` and ``evaluator`` (``LocalRollouts``)."""
        import torch

        self.cfg = config
        self.policy, self.backend, self.evaluator = policy, backend, evaluator
        self.rollouts = rollouts if rollouts is not None else LocalRollouts(backend, evaluator)
        self.curriculum, self.episode_config = curriculum, episode_config
        self.heldout = list(heldout or [])
        self.output_dir = Path(output_dir)
        self.rl_dir = self.output_dir / "rl_checkpoints"
        self.roles = [r for r in config.train_roles if r in policy.roles]
        if not self.roles:
            raise ValueError(f"none of train_roles {[r.value for r in config.train_roles]} has "
                             f"parameters in the policy ({[r.value for r in policy.roles]})")
        self.optimizers = {
            r: torch.optim.AdamW(policy.trainable_parameters(r), lr=config.learning_rate_for(r),
                                 weight_decay=config.weight_decay) for r in self.roles}
        self.compile_only = (not torch.cuda.is_available()) if compile_only is None else compile_only
        self.metrics = metrics or MetricsLogger(MetricsConfig(output_dir=self.output_dir),
                                                run_config=config.to_dict())
        self.rng = random.Random(config.seed)
        self.step = 0
        self.episodes_done = 0
        self.best_reward: float | None = None
        self.best_episode: int | None = None
        self.history: list[dict[str, Any]] = []
        self.console = console
        self._baselines_prefetched = False
        self.baseline_prefetch: dict[str, float] = {}  # problems measured, seconds (first train)
        self.sft_anchor = {AgentRole(r): list(v) for r, v in (sft_anchor or {}).items() if v}
        if config.sft_coef > 0 and not self.sft_anchor:
            raise ValueError("GRPOConfig.sft_coef > 0 needs SFT examples: pass sft_anchor= "
                             "(tokenized SFT examples per role), or set sft_coef=0")
        torch.manual_seed(config.seed)

    # ---------------------------------------------------------------- the loop (one screen)

    def train(self, progress: Any = None, task: Any = None,
              until: int | None = None) -> list[dict[str, Any]]:
        """Steps until ``cfg.num_steps`` (or step ``until``, to pause for a caller's held-out
        evaluation; a later call goes on from there)."""
        self.freeze_start_reference()
        self.prefetch_baselines()
        self.rollouts.publish(self.policy, self.step)  # the weights as training (re)starts
        stop = self.cfg.num_steps if until is None else min(until, self.cfg.num_steps)
        while self.step < stop:
            timer = PhaseTimer()
            with timer("rollout"):
                episodes, rollout_stats = self.rollout()
                self.compile_only |= any(getattr(e, "compile_only", False) for e in episodes)
                self.check_infra_errors(episodes, f"GRPO step {self.step + 1}'s rollout")
            with timer("reward"):
                samples, reward_stats = score_episodes(episodes, self.cfg)
                self.record_curriculum(episodes)
            with timer("advantage"):
                samples = assign_advantages(samples, self.cfg)
                record_advantages(episodes, samples)
            with timer("update"):
                update_stats = self.update(samples)
                self.rollouts.publish(self.policy, self.step + 1)
            self.step += 1
            self.episodes_done += len(episodes)
            with timer("log"):
                record = self.make_record(episodes, rollout_stats, reward_stats, update_stats, timer)
                self.write_episodes(episodes)
                eval_stats = self.maybe_evaluate()
            with timer("checkpoint"):
                self.maybe_checkpoint(record, eval_stats)
            record.update(timer.as_metrics())
            self.metrics.log_step(record)
            self.history.append(record)
            self.report_progress(record, progress, task)
        return self.history

    def prefetch_baselines(self) -> None:
        """Once, before the first rollout: the baselines (eager, torch.compile, the GPU's peak)
        of the problems this run can draw (at most ``num_steps x problems_per_step`` of the
        curriculum's, those drawn soonest first) and of the select@ problems are measured while
        no policy decodes on the GPUs. A step then measures no baseline inside a candidate's
        evaluation, where it held an evaluation slot, and a step's time is its candidates'.
        Figures are cached per GPU model and torch version, so a later run measures only new
        problems'. A source without ``prefetch_baselines`` (a policy server, which may be
        decoding for others) leaves them to first sight."""
        prefetch = getattr(self.rollouts, "prefetch_baselines", None)
        if prefetch is None or self._baselines_prefetched:
            return
        self._baselines_prefetched = True
        problems = baseline_problems(self.curriculum, self.heldout, self.cfg)
        if self.console is not None and not self.compile_only:
            self.console.print(f"measuring the baselines of up to {len(problems)} problems before "
                               "the first rollout (cached for later runs) ...")
        start = time.perf_counter()
        measured = prefetch(problems)  # 0 where nothing is timed (no GPU)
        self.baseline_prefetch = {"problems": float(measured),
                                  "seconds": time.perf_counter() - start}
        if self.console is not None and measured:
            self.console.print(f"baselines: {measured} problems measured in "
                               f"{self.baseline_prefetch['seconds']:.0f}s")

    def freeze_start_reference(self) -> None:
        """With ``kl_reference="start"``, freeze the agents as they are now as the KL reference.
        Called when training starts and before a resume loads its adapters (a resumed run was
        started from the same checkpoints), not at construction: a caller may still run SFT
        on the policy between the two (train/pipeline.py does)."""
        if (self.cfg.kl_reference is KLReference.START and self.cfg.kl_coef > 0
                and not all(r in self.policy.start_references for r in self.roles)):
            self.policy.freeze_start_reference(self.roles)

    # ---------------------------------------------------------------- phases

    def rollout(self) -> tuple[list[Any], dict[str, float]]:
        self.check_rollout_temperatures()
        problems = self.curriculum.sample(self.cfg.problems_per_step, self.rng)
        tokens_before = self.rollouts.tokens_generated
        # The backend's cumulative seconds in model.generate and in the log-prob pass: their
        # share of time_rollout says whether a step waits on decoding or on kernel evaluations.
        backend_before = dict(self.rollouts.seconds)
        start = time.perf_counter()
        episodes = self.run_episodes(problems, self.cfg.group_size)
        seconds = max(time.perf_counter() - start, 1e-9)
        tokens = self.rollouts.tokens_generated - tokens_before
        if not tokens:
            tokens = sum(len(t.response_ids or []) for e in episodes for t in e.turns)
        evals = sum(1 for e in episodes for t in e.turns if getattr(t, "eval_result", None))
        backend = {f"time_rollout_{k}": v - backend_before.get(k, 0.0)
                   for k, v in self.rollouts.seconds.items()}
        stats = {"tokens_per_s": tokens / seconds, "evals_per_s": evals / seconds,
                 "tokens": float(tokens), **backend}
        # A source that samples elsewhere (Ray workers, a server) holds a published version:
        # the count of updates in the weights that sampled this step.
        version = getattr(self.rollouts, "version", None)
        if version is not None:
            stats["weights_version"] = float(version)
        restarts = getattr(self.rollouts, "restarts", None)  # Ray workers replaced so far
        if restarts is not None:
            stats["rollout_worker_restarts"] = float(restarts)
        return episodes, stats

    def check_rollout_temperatures(self) -> None:
        """A trained role must sample at ``cfg.temperature``: the update recomputes its
        tokens' log-probs at that temperature, and the clipped ratio compares them with the
        rollout's. Roles GRPO does not train may decode otherwise (greedy, say)."""
        for role in self.roles:
            temperature = self.episode_config.sampling_for(role).temperature
            if not math.isclose(temperature, self.cfg.temperature):
                raise ValueError(
                    f"GRPO trains {role.value} at temperature {self.cfg.temperature:g}, but its "
                    f"rollout turns sample at {temperature:g}: set the episode config's "
                    f"temperature for {role.value} to GRPOConfig.temperature, or leave "
                    f"{role.value} out of train_roles")

    def check_infra_errors(self, episodes: list[Any], what: str) -> None:
        """Raises ``InfraFailure`` when more than ``cfg.max_infra_share`` of ``episodes`` ended
        in an infrastructure error; their episodes are logged first, for the causes."""
        try:
            check_episodes(episodes, what=what, max_share=self.cfg.max_infra_share)
        except InfraFailure:
            self.write_episodes(episodes)
            raise

    def run_episodes(self, problems: list[Any], group_size: int) -> list[Any]:
        return self.rollouts.run_episodes(problems, group_size, self.episode_config)

    def record_curriculum(self, episodes: list[Any]) -> None:
        """Each episode's best result counts once for its problem's tier."""
        for episode in episodes:
            result = best_result(episode)
            self.curriculum.record(episode.problem, result if result is not None else
                                   {"compiled": False, "correct": False})
        self.curriculum.maybe_advance()

    def update(self, samples: list[TurnSample]) -> dict[str, float]:
        stats: dict[str, list[float]] = {}
        for role in self.roles:
            mine = [s for s in samples if s.role is role]
            if not mine:
                continue
            for key, value in self.update_role(role, mine).items():
                stats.setdefault(key, []).append(value)
                stats.setdefault(f"{role.value}/{key}", []).append(value)
        release_cached_gpu_memory()  # the next rollout's evaluation workers share this GPU
        return {k: sum(v) / len(v) for k, v in stats.items()}

    def update_role(self, role: AgentRole, samples: list[TurnSample]) -> dict[str, float]:
        """PPO-style epochs over mini-batches of the role's own turns."""
        import torch

        cfg = self.cfg
        pad = self.policy.tokenizer.pad_token_id or 0
        batch = build_batch(samples, pad, self.policy.device)
        temperature = cfg.temperature
        batch.ref_logprobs = (self.reference_logprobs(batch, temperature, role)
                              if cfg.kl_coef > 0 else None)
        params = self.policy.trainable_parameters(role)
        optimizer = self.optimizers[role]
        stats: dict[str, list[float]] = {}
        generator = torch.Generator().manual_seed(self.rng.randrange(2**31))
        with self.policy.use(role) as model:
            model.train()
            for _ in range(cfg.ppo_epochs):
                order = torch.randperm(len(samples), generator=generator)
                for start in range(0, len(samples), cfg.mini_batch_size):
                    mini = order[start : start + cfg.mini_batch_size]
                    anchor = self.anchor_examples(role)
                    for k, v in self.optimizer_step(model, _slice(batch, mini.to(batch.input_ids.device)),
                                                    params, optimizer, temperature, anchor).items():
                        stats.setdefault(k, []).append(v)
            model.eval()
        return {k: sum(v) / len(v) for k, v in stats.items()}

    def anchor_examples(self, role: AgentRole) -> list[dict[str, list[int]]]:
        """``cfg.sft_batch_size`` of the role's SFT examples for one optimizer step (none when
        the anchor is off, so the trainer's random stream is as without it)."""
        pool = self.sft_anchor.get(role, [])
        if self.cfg.sft_coef <= 0 or not pool:
            return []
        return [pool[self.rng.randrange(len(pool))] for _ in range(self.cfg.sft_batch_size)]

    def optimizer_step(self, model: Any, mini: Batch, params: list[Any], optimizer: Any,
                       temperature: float,
                       anchor: Sequence[dict[str, list[int]]] = ()) -> dict[str, float]:
        import torch

        optimizer.zero_grad(set_to_none=True)
        n = mini.input_ids.shape[0]
        micro = max(1, math.ceil(n / self.cfg.grad_accum))
        stats: dict[str, float] = {}
        for start in range(0, n, micro):
            part = _slice(mini, slice(start, start + micro))
            new = token_logprobs(model, part.input_ids, part.attention_mask, temperature=temperature)
            loss, s = batch_loss(new, part, self.cfg)
            weight = part.input_ids.shape[0] / n
            (loss * weight).backward()
            for k, v in s.items():
                stats[k] = stats.get(k, 0.0) + v * weight
        if anchor:
            stats["sft_loss"] = self.anchor_backward(model, anchor)
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
        optimizer.step()
        return stats

    def anchor_backward(self, model: Any, examples: Sequence[dict[str, list[int]]]) -> float:
        """Adds ``sft_coef`` times SFT's loss on ``examples`` to the step's gradients;
        returns that loss (unweighted)."""
        pad = self.policy.tokenizer.pad_token_id or 0
        batch = {k: v.to(self.policy.device) for k, v in collate_examples(pad)(list(examples)).items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = assistant_nll(logits, batch["labels"])
        (self.cfg.sft_coef * loss).backward()
        return float(loss)

    def reference_logprobs(self, batch: Batch, temperature: float,
                           role: AgentRole | None = None) -> Any:
        import torch

        rows = []
        with torch.no_grad(), self.policy.reference(role) as ref:
            for start in range(0, batch.input_ids.shape[0], self.cfg.mini_batch_size):
                sl = slice(start, start + self.cfg.mini_batch_size)
                rows.append(token_logprobs(ref, batch.input_ids[sl], batch.attention_mask[sl],
                                           temperature=temperature))
        return torch.cat(rows)

    # ---------------------------------------------------------------- log / eval / checkpoint

    def make_record(self, episodes, rollout_stats, reward_stats, update_stats, timer) -> dict:
        record: dict[str, Any] = {"step": self.step, "episodes": self.episodes_done,
                                  "compile_only": self.compile_only}
        record.update(reward_stats)
        record.update(rollout_metrics(episodes, compile_only=self.compile_only))
        record.update(rollout_stats)
        record.update({"kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0})
        record.update(update_stats)
        if hasattr(self.curriculum, "summary"):
            record.update(self.curriculum.summary())
        record.update(timer.as_metrics())
        return record

    def write_episodes(self, episodes: list[Any]) -> None:
        write_episodes_jsonl(episodes, self.output_dir / "episodes.jsonl", append=True)

    def evaluate(self) -> dict[str, float]:
        """Held-out problems, one episode each, with the current adapters."""
        problems = self.heldout[: self.cfg.eval_problems]
        episodes = self.run_episodes(problems, 1)
        check_episodes(episodes, what=f"the held-out evaluation after GRPO step {self.step}",
                       max_share=self.cfg.max_infra_share)
        _, reward_stats = score_episodes(episodes, self.cfg)
        out = {"reward_mean": reward_stats["reward_mean"], "num_problems": float(len(problems))}
        out.update(rollout_metrics(episodes, compile_only=self.compile_only))
        return out

    def maybe_evaluate(self) -> dict[str, float] | None:
        every, last = self.cfg.eval_every, self.step == self.cfg.num_steps
        if not self.heldout or not every or not (self.step % every == 0 or last):
            return None  # eval_every=0: no evaluation during training (the pipeline's final one)
        stats = self.evaluate()
        self.metrics.log_eval(self.step, {**stats, "compile_only": self.compile_only})
        return stats

    def maybe_checkpoint(self, record: dict[str, Any], eval_stats: dict[str, float] | None) -> None:
        score = checkpoint_score(record, eval_stats,
                                 heldout_decides=bool(self.heldout) and self.cfg.eval_every > 0)
        if score is not None and (self.best_reward is None or score > self.best_reward):
            self.best_reward, self.best_episode = score, self.episodes_done
            # every agent, trained or not, so the checkpoint is a whole team (one folder per agent)
            ck.save_best(self.rl_dir, episode=self.episodes_done, policy=self.policy,
                         roles=self.policy.roles, config=self.cfg.to_dict(),
                         metrics={"reward_mean": score, "step": self.step,
                                  "compile_only": self.compile_only, "heldout": eval_stats is not None})
        if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.num_steps:
            self.save_checkpoint()

    def state(self):
        return TrainerState(step=self.step, episodes=self.episodes_done,
                            best_reward=self.best_reward, best_episode=self.best_episode,
                            curriculum=self.curriculum.state_dict(), rng=capture_rng(),
                            extra={"trainer_rng": self.rng.getstate(), "history": self.history})

    def save_checkpoint(self) -> Path:
        return save_latest(self.rl_dir, policy=self.policy, roles=self.roles,
                           optimizers=self.optimizers, state=self.state(), config=self.cfg.to_dict())

    def resume(self, path: Path) -> None:
        """Restore adapters, optimizers, curriculum, RNG and counters from a ``latest/``."""
        self.freeze_start_reference()  # the agents as this run started, before the latest load
        state, _ = load_latest(find_latest(path), policy=self.policy, roles=self.roles,
                               optimizers=self.optimizers)
        self.step, self.episodes_done = state.step, state.episodes
        self.best_reward, self.best_episode = state.best_reward, state.best_episode
        if state.curriculum is not None:
            self.curriculum.load_state_dict(state.curriculum)
        restore_rng(state.rng)
        self.rng.setstate(state.extra["trainer_rng"])
        self.history = list(state.extra.get("history", []))

    def finish(self) -> Path:
        summary = {"steps": self.step, "episodes": self.episodes_done,
                   "best_reward": self.best_reward, "best_episode": self.best_episode,
                   "compile_only": self.compile_only, "history": self.history}
        path = save_final(self.rl_dir, policy=self.policy, roles=self.policy.roles,
                          training_metrics=summary)
        self.metrics.close()
        return path

    def report_progress(self, record: dict[str, Any], progress: Any, task: Any) -> None:
        note = " [compile-only rewards (no GPU)]" if self.compile_only else ""
        info = (f"reward {record['reward_mean']:+.3f} compile {record['compile_rate']:.2f} "
                f"pass {record['pass_rate']:.2f} kl {record['kl']:.4f}{note}")
        if progress is not None:
            progress.update(task, completed=self.step, info=info)
        elif self.console is not None:
            self.console.print(f"step {self.step}/{self.cfg.num_steps}: {info}")
