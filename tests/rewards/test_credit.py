"""Turn credit assignment against hand-computed cases."""

from __future__ import annotations

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.rewards.credit import (
    CreditConfig,
    CreditMode,
    FinalReward,
    assign_turn_rewards,
    discounted_returns,
    mix_immediate_final,
)

G, T, O = AgentRole.GENERATOR, AgentRole.TESTER, AgentRole.OPTIMIZER
ROLES = [G, T, O, T]


def test_discounted_returns_hand_computed():
    # G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])


def test_discounted_returns_gamma_one_is_suffix_sum():
    assert discounted_returns([1.0, 2.0, 3.0], 1.0) == pytest.approx([6.0, 5.0, 3.0])


def test_discounted_returns_empty():
    assert discounted_returns([], 0.9) == []


def test_mix_immediate_final_is_seed_30_70():
    # t0: 0.3*0.2 + 0.7*1*0.9^2; t1: 0.7*0.9; t2: 0.3 + 0.7
    got = mix_immediate_final([0.2, 0.0, 1.0], 1.0, 0.9, 0.3)
    assert got == pytest.approx([0.06 + 0.567, 0.63, 1.0])


def test_mixed_mode_tester_earns_nothing():
    got = assign_turn_rewards(ROLES, [0.1, 99.0, 1.0, 99.0], CreditConfig(mode=CreditMode.MIXED))
    # final = best agent reward = 1.0; t0: 0.03 + 0.7*0.9^3; t2: 0.3 + 0.7*0.9
    assert got == pytest.approx([0.03 + 0.7 * 0.729, 0.0, 0.3 + 0.63, 0.0])


def test_final_only_best():
    got = assign_turn_rewards(ROLES, [0.5, 0.0, 0.2, 0.0], CreditConfig(mode=CreditMode.FINAL_ONLY))
    assert got == pytest.approx([0.5, 0.0, 0.5, 0.0])


def test_final_only_last():
    cfg = CreditConfig(mode=CreditMode.FINAL_ONLY, final=FinalReward.LAST)
    assert assign_turn_rewards(ROLES, [0.5, 0.0, 0.2, 0.0], cfg) == pytest.approx([0.2, 0.0, 0.2, 0.0])


def test_discounted_mode_counts_tester_turns_as_steps():
    # immediate [0.1, 0, 1.0, 0]: G2 = 1.0, G1 = 0.9, G0 = 0.1 + 0.81
    got = assign_turn_rewards(ROLES, [0.1, 5.0, 1.0, 5.0], CreditConfig(mode=CreditMode.DISCOUNTED))
    assert got == pytest.approx([0.91, 0.0, 1.0, 0.0])


def test_tester_only_episode_is_all_zero():
    assert assign_turn_rewards([T, T], [1.0, 1.0], CreditConfig()) == [0.0, 0.0]


def test_roles_given_as_strings_are_accepted():
    got = assign_turn_rewards(["generator", "tester"], [0.4, 1.0], CreditConfig(mode=CreditMode.FINAL_ONLY))
    assert got == pytest.approx([0.4, 0.0])


def test_length_mismatch_raises_with_fix():
    with pytest.raises(ValueError, match="one reward per turn"):
        assign_turn_rewards(ROLES, [1.0], CreditConfig())


def test_config_validates_gamma():
    with pytest.raises(ValueError, match="gamma"):
        CreditConfig(gamma=1.5)


def test_config_validates_mode_name():
    with pytest.raises(ValueError, match="mode is one of"):
        CreditConfig(mode="sometimes")


def test_improvement_credits_later_turns_with_what_they_added():
    cfg = CreditConfig(mode=CreditMode.MIXED, improvement=True)
    roles = [G, T, O, T, O, T]
    got = assign_turn_rewards(roles, [0.65, 9.0, 0.0, 9.0, 0.74, 9.0], cfg)
    mixed = assign_turn_rewards(roles, [0.65, 9.0, 0.0, 9.0, 0.74, 9.0],
                                CreditConfig(mode=CreditMode.MIXED))
    # the Generator keeps its mode credit; each Optimizer turn: its reward minus the best before
    assert got == pytest.approx([mixed[0], 0.0, 0.0 - 0.65, 0.0, 0.74 - 0.65, 0.0])


def test_improvement_ranks_a_broken_kernel_below_a_failing_one_kept_failing():
    # Two episodes of one group. A: the Generator's kernel is correct (0.65), the Optimizer
    # breaks it (0.0). B: the Generator's kernel fails (0.1), so does the Optimizer's (0.1).
    # Mode credit ranks A's Optimizer above B's (the episode's best kernel is the Generator's);
    # improvement credit ranks it below.
    a, b = [0.65, 0.0, 0.0, 0.0], [0.1, 0.0, 0.1, 0.0]
    mixed = CreditConfig(mode=CreditMode.MIXED)
    assert assign_turn_rewards(ROLES, a, mixed)[2] > assign_turn_rewards(ROLES, b, mixed)[2]
    better = CreditConfig(mode=CreditMode.MIXED, improvement=True)
    assert assign_turn_rewards(ROLES, a, better)[2] < assign_turn_rewards(ROLES, b, better)[2]


def test_improvement_leaves_a_one_turn_episode_alone():
    cfg = CreditConfig(mode=CreditMode.FINAL_ONLY, improvement=True)
    assert assign_turn_rewards([G, T], [0.4, 0.0], cfg) == pytest.approx([0.4, 0.0])
