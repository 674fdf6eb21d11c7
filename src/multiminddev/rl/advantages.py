"""Group-relative advantages (GRPO, Dr.GRPO, RLOO) as pure torch functions.

Each sample (an episode, or one agent turn of an episode) has a scalar reward and a group id
(the prompt / problem it was sampled for). The advantage is the reward relative to its group:

- GRPO: ``(r - mean_g) / (std_g + eps)`` with the unbiased (Bessel) std, as ``torch.std`` and
  ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage``.
- Dr.GRPO (``normalize_std=False``): ``r - mean_g`` (no std scaling: no difficulty bias).
- RLOO (``leave_one_out=True``): ``r - mean of the *other* members``, equal to
  ``n/(n-1) * (r - mean_g)``; with ``normalize_std`` it is also divided by the group std.

A group of one carries no relative information, so its advantage is 0. (verl instead uses mean 0
and std 1 for such groups, i.e. the raw reward; we prefer not to push a lone sample by its raw
reward.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from multiminddev.agents.roles import AgentRole


def group_relative_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    leave_one_out: bool = False,
) -> Tensor:
    """Advantages relative to each sample's group. Shapes: rewards [B], group_ids [B] -> [B].

    ``group_ids`` are any integers (they need not be contiguous). Computed without gradient.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length "
            f"(got {tuple(rewards.shape)} and {tuple(group_ids.shape)})"
        )
    with torch.no_grad():
        r = rewards.detach().to(torch.float64)  # float64: group sums of many rewards stay exact
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
        count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
        total = torch.zeros_like(count).index_add_(0, inverse, r)
        mean = total / count
        centred = r - mean[inverse]
        sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        n = count[inverse]
        adv = centred * n / (n - 1).clamp(min=1) if leave_one_out else centred
        if normalize_std:
            adv = adv / (std[inverse] + eps)
        adv = torch.where(n > 1, adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def role_codes(roles: Sequence[AgentRole | str]) -> Tensor:
    """Integer code per role (its position in :class:`AgentRole`), for grouping. [N] -> [N]."""
    order = list(AgentRole)
    return torch.tensor([order.index(AgentRole(r)) for r in roles], dtype=torch.long)


def turn_level_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    turn_index: Tensor,
    roles: Tensor | None = None,
    *,
    per_turn: bool = True,
    per_role: bool = True,
    normalize_std: bool = True,
    eps: float = 1e-6,
    leave_one_out: bool = False,
) -> Tensor:
    """Advantages per (episode, turn) sample, grouped by problem group, turn index and agent role.

    Shapes: rewards [N], group_ids [N] (the episode's group), turn_index [N], roles [N] (ints,
    see :func:`role_codes`) -> [N]. With ``per_turn`` the Optimizer's 3rd turn is compared only with
    the 3rd turns of the other episodes in its group; with ``per_role`` Generator and Optimizer
    turns are never compared with each other. Episodes that stopped early leave later-turn groups
    smaller; a group of one gets advantage 0.
    """
    keys = [group_ids.to(torch.long)]
    if per_turn:
        keys.append(turn_index.to(torch.long))
    if per_role:
        if roles is None:
            raise ValueError("per_role=True needs roles (use role_codes(...)), or pass per_role=False")
        keys.append(roles.to(torch.long))
    _, combined = torch.unique(torch.stack(keys, dim=1), dim=0, return_inverse=True)
    return group_relative_advantages(
        rewards, combined, normalize_std=normalize_std, eps=eps, leave_one_out=leave_one_out
    )


def stratified_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    strata: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Rewards centred on the samples of the same group and the same stratum. [N], [N], [N] -> [N].

    For turns that started from different states: an Optimizer turn handed a correct kernel is
    compared only with its groupmates handed a correct kernel, one handed a failing kernel only
    with those handed a failing one. A sample alone in its (group, stratum) is centred on its
    stratum across all groups instead; alone there too, it gets 0. So one kind of start is never
    credited for another kind's outcomes, and in a group the advantages of each stratum with two
    or more samples sum to zero.
    """
    if not (rewards.shape == group_ids.shape == strata.shape) or rewards.dim() != 1:
        raise ValueError(f"rewards, group_ids and strata must be 1-D of one length (got "
                         f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(strata.shape)})")
    strata = strata.to(torch.long)
    _, cell = torch.unique(torch.stack([group_ids.to(torch.long), strata], dim=1), dim=0,
                           return_inverse=True)
    within = group_relative_advantages(rewards, cell, normalize_std=normalize_std, eps=eps)
    across = group_relative_advantages(rewards, strata, normalize_std=normalize_std, eps=eps)
    count = torch.bincount(cell)[cell]
    return torch.where(count > 1, within, across)


def weight_by_sign(adv: Tensor, *, positive: float = 1.0, negative: float = 1.0) -> Tensor:
    """Scale positive and negative advantages separately. [N] -> [N]; zeros stay zero.

    ``positive < 1`` is W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative
    Reinforcement in LLM Reasoning", lambda = 0.1): learning then comes mostly from lowering
    the failed samples, which keeps the rest of the policy's ranking as it was. Reinforcing
    the successes at full weight sharpens the policy toward them, and in our runs a 135M model
    then wrote the rewarded templates for other problems too (docs/training.md, "Advantage variants").
    Applied after the group-relative step, so a group's advantages no longer sum to zero.
    """
    if positive < 0 or negative < 0:
        raise ValueError(f"advantage weights must be >= 0, got positive={positive}, negative={negative}")
    return torch.where(adv > 0, adv * positive, adv * negative)


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """One advantage per sequence spread over its tokens; 0 where masked. [B], [B, T] -> [B, T]."""
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(f"need adv [B] and mask [B, T] (got {tuple(adv.shape)}, {tuple(mask.shape)})")
    return adv[:, None] * mask.to(adv.dtype)
