"""Turn credit assignment: from per-turn rewards to the reward each agent turn is trained on.

An episode is a list of turns (Generator, Tester, Optimizer, Tester, ...). The caller scores each
agent turn with :func:`multiminddev.rewards.functions.compute_reward` on the EvalResult of the
candidate that turn wrote (its *immediate* reward); Tester turns carry no reward of their own.
:func:`assign_turn_rewards` then spreads credit over the turns:

- ``FINAL_ONLY``: every agent turn gets the episode's final reward.
- ``DISCOUNTED``: the discounted return ``G_t = r_t + gamma * G_{t+1}`` over the turn list (a
  Tester turn contributes 0 but still counts as one step of discount: the discount counts
  turns of the conversation, not agent turns).
- ``MIXED`` (default): ``w * r_t + (1 - w) * final * gamma**(T - 1 - t)`` with ``w = 0.3``
  (30% immediate, 70% discounted final outcome): a turn is credited mostly with where its
  episode ended, and partly with its own kernel.

The final reward is the best agent-turn reward (``FinalReward.BEST``, the episode keeps its best
kernel) or the last one (``FinalReward.LAST``). The Tester always earns 0: it is rule-based and
never trained.

``improvement`` (off by default): every agent turn after the first is credited with what it
added, its immediate reward minus the best immediate reward before it (the kernel it was asked
to improve), instead of the mode's credit. Why: an Optimizer turn's mode credit carries the
Generator's outcome (the final reward is the episode's best kernel, often the Generator's), and
its group-relative baseline spans episodes whose Generators did differently. An Optimizer that
broke a correct kernel then out-scored one handed a failing kernel: in recorded rollouts one
compile-breaking mutation, written into 41 Optimizer turns, got a summed advantage of +1.5 and
took over that seed's held-out Optimizer (docs/training.md, "Turn credit").
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from multiminddev.agents.roles import AgentRole


class CreditMode(str, enum.Enum):
    FINAL_ONLY = "final_only"
    DISCOUNTED = "discounted"
    MIXED = "mixed"


class FinalReward(str, enum.Enum):
    BEST = "best"  # the best agent-turn reward (the episode's best kernel)
    LAST = "last"  # the last agent turn's reward (the episode's final kernel)


@dataclass(kw_only=True)
class CreditConfig:
    mode: CreditMode = CreditMode.MIXED
    gamma: float = 0.9  # discount per turn of the conversation
    immediate_weight: float = 0.3  # MIXED: 30% the turn's own reward, 70% the final one
    final: FinalReward = FinalReward.BEST
    # turns after the first agent turn: credited with their reward minus the best one before
    improvement: bool = False

    def __post_init__(self) -> None:
        try:
            self.mode = CreditMode(self.mode)
            self.final = FinalReward(self.final)
        except ValueError as exc:
            raise ValueError(
                f"{exc}; CreditConfig.mode is one of {[m.value for m in CreditMode]}, "
                f"final one of {[f.value for f in FinalReward]}"
            ) from None
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(
                f"gamma must be in [0, 1] (got {self.gamma}); 0.9 by default, 1.0 for no discount"
            )
        if not 0.0 <= self.immediate_weight <= 1.0:
            raise ValueError(
                f"immediate_weight must be in [0, 1] (got {self.immediate_weight}); the default is 0.3"
            )


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}``, ``G_T = 0``. Shapes: [T] -> [T]."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def mix_immediate_final(
    immediate: Sequence[float], final: float, gamma: float, immediate_weight: float = 0.3
) -> list[float]:
    """The mixed credit: ``w * immediate[t] + (1 - w) * final * gamma**(T - 1 - t)``. [T] -> [T]."""
    n = len(immediate)
    return [
        immediate_weight * float(r) + (1.0 - immediate_weight) * final * gamma ** (n - 1 - t)
        for t, r in enumerate(immediate)
    ]


def assign_turn_rewards(
    turn_roles: Sequence[AgentRole], turn_rewards: Sequence[float], cfg: CreditConfig
) -> list[float]:
    """Per-turn training rewards; Tester turns get 0. Shapes: [T], [T] -> [T].

    ``turn_rewards[t]`` is the immediate reward of turn t (ignored for Tester turns).
    """
    if len(turn_roles) != len(turn_rewards):
        raise ValueError(
            f"turn_roles has {len(turn_roles)} entries but turn_rewards {len(turn_rewards)}; "
            "pass one reward per turn (any value for Tester turns)"
        )
    roles = [AgentRole(r) for r in turn_roles]
    agent = [role.trainable for role in roles]
    immediate = [float(r) if a else 0.0 for r, a in zip(turn_rewards, agent)]
    agent_rewards = [r for r, a in zip(immediate, agent) if a]
    if not agent_rewards:
        return [0.0] * len(roles)
    final = max(agent_rewards) if cfg.final is FinalReward.BEST else agent_rewards[-1]
    if cfg.mode is CreditMode.FINAL_ONLY:
        credited = [final] * len(roles)
    elif cfg.mode is CreditMode.DISCOUNTED:
        credited = discounted_returns(immediate, cfg.gamma)
    else:
        credited = mix_immediate_final(immediate, final, cfg.gamma, cfg.immediate_weight)
    if cfg.improvement:
        credited = improvement_credit(immediate, agent, credited)
    return [c if a else 0.0 for c, a in zip(credited, agent)]


def improvement_credit(immediate: Sequence[float], agent: Sequence[bool],
                       credited: Sequence[float]) -> list[float]:
    """``credited`` with every agent turn after the first replaced by ``immediate[t]`` minus the
    best immediate reward of the agent turns before it. Shapes: [T], [T], [T] -> [T]."""
    out = list(credited)
    best: float | None = None
    for t, (r, is_agent) in enumerate(zip(immediate, agent)):
        if not is_agent:
            continue
        if best is not None:
            out[t] = float(r) - best
        best = float(r) if best is None else max(best, float(r))
    return out
