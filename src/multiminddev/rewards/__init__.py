"""Rewards as pure functions of EvalResults, and turn credit assignment."""

from multiminddev.rewards.credit import (
    CreditConfig,
    CreditMode,
    FinalReward,
    assign_turn_rewards,
    discounted_returns,
    mix_immediate_final,
)
from multiminddev.rewards.functions import RewardBreakdown, RewardConfig, RewardKind, compute_reward

__all__ = [
    "CreditConfig",
    "CreditMode",
    "FinalReward",
    "RewardBreakdown",
    "RewardConfig",
    "RewardKind",
    "assign_turn_rewards",
    "compute_reward",
    "discounted_returns",
    "mix_immediate_final",
]
