"""Advantages against straightforward loop implementations (and verl, where installed)."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.rl.advantages import (
    broadcast_to_tokens,
    group_relative_advantages,
    role_codes,
    stratified_advantages,
    turn_level_advantages,
    weight_by_sign,
)


def loop_grpo(rewards, groups, *, normalize_std=True, eps=1e-6, leave_one_out=False):
    members = defaultdict(list)
    for r, g in zip(rewards, groups):
        members[g].append(r)
    out = []
    for r, g in zip(rewards, groups):
        xs = members[g]
        if len(xs) == 1:
            out.append(0.0)
            continue
        mean = sum(xs) / len(xs)
        adv = r - (sum(xs) - r) / (len(xs) - 1) if leave_one_out else r - mean
        if normalize_std:
            adv /= statistics.stdev(xs) + eps
        out.append(adv)
    return out


REWARDS = [0.1, 0.9, 0.5, 0.5, 1.2, -0.5, 0.0, 0.3, 0.7]
GROUPS = [7, 7, 7, 3, 3, 3, 3, 11, 11]


def test_grpo_matches_loop():
    got = group_relative_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS))
    assert got.tolist() == pytest.approx(loop_grpo(REWARDS, GROUPS), rel=1e-5, abs=1e-6)


def test_dr_grpo_without_std_matches_loop():
    got = group_relative_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), normalize_std=False)
    assert got.tolist() == pytest.approx(loop_grpo(REWARDS, GROUPS, normalize_std=False), abs=1e-6)


def test_leave_one_out_matches_loop():
    got = group_relative_advantages(
        torch.tensor(REWARDS), torch.tensor(GROUPS), normalize_std=False, leave_one_out=True
    )
    expected = loop_grpo(REWARDS, GROUPS, normalize_std=False, leave_one_out=True)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_group_advantages_sum_to_zero():
    got = group_relative_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), normalize_std=False)
    for g in set(GROUPS):
        idx = [i for i, x in enumerate(GROUPS) if x == g]
        assert got[idx].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_identical_rewards_give_zero_advantage():
    got = group_relative_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert torch.all(got == 0)


def test_singleton_group_gets_zero_advantage():
    got = group_relative_advantages(torch.tensor([5.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert got[0].item() == 0.0


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same length"):
        group_relative_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_turn_level_groups_by_turn_and_role():
    rewards = [0.0, 1.0, 0.2, 0.6, 0.3, 0.9, 0.1, 0.4]
    groups = [0, 0, 0, 0, 0, 0, 0, 0]
    turns = [0, 0, 0, 0, 2, 2, 2, 2]
    roles = [AgentRole.GENERATOR] * 4 + [AgentRole.OPTIMIZER] * 2 + [AgentRole.GENERATOR] * 2
    got = turn_level_advantages(
        torch.tensor(rewards), torch.tensor(groups), torch.tensor(turns), role_codes(roles)
    )
    keys = [(g, t, r) for g, t, r in zip(groups, turns, roles)]
    assert got.tolist() == pytest.approx(loop_grpo(rewards, keys), rel=1e-5, abs=1e-6)


def test_turn_level_without_role_split_pools_roles():
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.7])
    groups = torch.zeros(4, dtype=torch.long)
    turns = torch.tensor([1, 1, 1, 1])
    roles = role_codes(["generator", "optimizer", "generator", "optimizer"])
    got = turn_level_advantages(rewards, groups, turns, roles, per_role=False)
    expected = group_relative_advantages(rewards, groups)
    assert torch.allclose(got, expected)


def test_broadcast_to_tokens_zero_where_masked():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert got.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]


def test_matches_verl_grpo():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np

    scores = torch.tensor(REWARDS)
    token_rewards = torch.zeros(len(REWARDS), 4)
    token_rewards[:, -1] = scores
    mask = torch.ones(len(REWARDS), 4)
    ref, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, np.array(GROUPS))
    got = group_relative_advantages(scores, torch.tensor(GROUPS))
    assert torch.allclose(broadcast_to_tokens(got, mask), ref, atol=1e-5)


def test_matches_verl_rloo():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np

    scores = torch.tensor(REWARDS)
    token_rewards = torch.zeros(len(REWARDS), 3)
    token_rewards[:, -1] = scores
    mask = torch.ones(len(REWARDS), 3)
    ref, _ = core_algos.compute_rloo_outcome_advantage(token_rewards, mask, np.array(GROUPS))
    got = group_relative_advantages(scores, torch.tensor(GROUPS), normalize_std=False, leave_one_out=True)
    assert torch.allclose(broadcast_to_tokens(got, mask), ref, atol=1e-5)


def test_weight_by_sign_scales_each_sign_like_a_loop():
    adv = torch.tensor([1.5, -0.5, 0.0, -2.0, 0.25])
    got = weight_by_sign(adv, positive=0.1, negative=0.7)
    expected = [a * 0.1 if a > 0 else a * 0.7 for a in adv.tolist()]
    assert got.tolist() == pytest.approx(expected)
    assert weight_by_sign(adv).tolist() == adv.tolist()  # default weights: plain GRPO


def test_weight_by_sign_keeps_zero_advantages_at_zero_and_rejects_negative_weights():
    assert weight_by_sign(torch.zeros(3), positive=5.0, negative=5.0).tolist() == [0.0] * 3
    with pytest.raises(ValueError, match="must be >= 0"):
        weight_by_sign(torch.ones(2), positive=-0.1)


def loop_stratified(rewards, groups, strata, *, normalize_std=True):
    cells = loop_grpo(rewards, list(zip(groups, strata)), normalize_std=normalize_std)
    across = loop_grpo(rewards, strata, normalize_std=normalize_std)
    size = defaultdict(int)
    for key in zip(groups, strata):
        size[key] += 1
    return [c if size[key] > 1 else a for c, a, key in zip(cells, across, zip(groups, strata))]


STRATA = [1, 1, 0, 1, 0, 0, 1, 0, 1]  # e.g. handed a correct (1) or a failing (0) kernel


@pytest.mark.parametrize("normalize_std", [True, False])
def test_stratified_matches_loop(normalize_std):
    got = stratified_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), torch.tensor(STRATA),
                                normalize_std=normalize_std)
    expected = loop_stratified(REWARDS, GROUPS, STRATA, normalize_std=normalize_std)
    assert got.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_stratified_compares_a_sample_only_with_its_stratum():
    # group 0: two turns handed correct kernels (one kept it: 0.1, one broke it: -0.7) and two
    # handed failing ones (both left them failing: 0.0); group 1: one turn alone in stratum 1
    rewards = torch.tensor([0.1, -0.7, 0.0, 0.0, 0.5, -0.1])
    groups = torch.tensor([0, 0, 0, 0, 1, 2])
    strata = torch.tensor([1, 1, 0, 0, 1, 0])
    got = stratified_advantages(rewards, groups, strata, normalize_std=False).tolist()
    # the failing starts gain nothing from the break; the lone sample is centred on stratum 1
    # across groups (mean (0.1 - 0.7 + 0.5) / 3), the last on stratum 0 (mean -0.1 / 3)
    assert got == pytest.approx([0.4, -0.4, 0.0, 0.0, 0.5 + 0.1 / 3, -0.1 + 0.1 / 3])
    assert sum(got[:2]) == pytest.approx(0.0) and sum(got[2:4]) == pytest.approx(0.0)
    alone = stratified_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1]))
    assert alone.tolist() == [0.0]
    with pytest.raises(ValueError, match="1-D of one length"):
        stratified_advantages(rewards, groups, strata[:2])
