"""Policy-gradient losses as pure torch functions (PPO clip, DAPO clip-higher, k3 KL).

Conventions follow ``verl.trainer.ppo.core_algos`` so results can be compared: per-token
log-probabilities ``[B, T]``, a loss mask ``[B, T]`` (1 = agent token, 0 = prompt, feedback,
padding) and the aggregation modes of verl's ``agg_loss``:

- ``TOKEN_MEAN`` (DAPO): mean over every unmasked token in the batch; long replies weigh more.
- ``SEQ_MEAN_TOKEN_MEAN`` (original GRPO): mean per sequence, then over sequences.
- ``SEQ_MEAN_TOKEN_SUM_NORM`` (Dr.GRPO): token sum per sequence divided by a constant horizon
  (``norm_len``, default ``T``), then mean over sequences: no length bias.

Sequences with no unmasked token are left out of the sequence means (as in verl).

``assistant_nll`` is SFT's loss, for an SFT anchor in GRPO's update (InstructGPT's PPO-ptx).
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor


class LossAgg(str, enum.Enum):
    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1. Same shapes; reduces all dims or ``dim``."""
    prod = x * mask.to(x.dtype)
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` where ``mask`` is 1 (0 where nothing is unmasked). Reduces all dims or ``dim``."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def aggregate_loss(
    loss_mat: Tensor, mask: Tensor, agg: LossAgg, *, norm_len: int | None = None
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (see the module docstring)."""
    agg = LossAgg(agg)
    if agg is LossAgg.TOKEN_MEAN:
        return masked_mean(loss_mat, mask)
    m = mask.to(loss_mat.dtype)
    tokens = m.sum(dim=-1)
    has_tokens = (tokens > 0).to(loss_mat.dtype)
    n_seq = has_tokens.sum().clamp(min=1.0)
    token_sum = (loss_mat * m).sum(dim=-1)
    if agg is LossAgg.SEQ_MEAN_TOKEN_MEAN:
        per_seq = token_sum / tokens.clamp(min=1.0)
        return (per_seq * has_tokens).sum() / n_seq
    horizon = float(norm_len if norm_len is not None else loss_mat.shape[-1])
    return (token_sum * has_tokens).sum() / n_seq / horizon


def clipped_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN,
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, ``max(-A*ratio, -A*clip(ratio, 1-clip_low, 1+clip_high))``.

    Shapes: logprobs, old_logprobs, mask [B, T]; advantages [B, T] or [B] -> scalar loss.
    ``clip_high > clip_low`` is DAPO's clip-higher. ``dual_clip`` (c > 1, off by default) bounds
    the loss of negative-advantage tokens at ``-A*c`` (Ye et al. 2019, verl's ``clip_ratio_c``).
    Stats (floats): ``clip_fraction`` (tokens whose clipped term is the active one),
    ``approx_kl`` (mean ``old - new``), ``ratio_mean``.
    """
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0 (got {clip_low}, {clip_high})")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip}); 3.0 is usual, None turns it off")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    # Clamp the log-ratio before exp so one extreme token cannot make the ratio inf (as verl).
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        bounded = torch.minimum(loss_mat, -advantages * dual_clip)
        loss_mat = torch.where(advantages < 0, bounded, loss_mat)
    loss = aggregate_loss(loss_mat, mask, loss_agg, norm_len=norm_len)
    with torch.no_grad():
        stats = {
            "clip_fraction": masked_mean((clipped > unclipped).to(ratio.dtype), mask).item(),
            "approx_kl": masked_mean(-log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return loss, stats


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(policy || ref), elementwise: ``exp(d) - d - 1``, ``d = ref - new``.

    Non-negative, 0 where equal; ``d`` is clamped to [-20, 20] and the result to [-10, 10] for
    stability, as verl's ``low_var_kl``. Shapes: [...] , [...] -> [...].
    """
    d = torch.clamp(ref_logprobs - logprobs, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of ``softmax(logits)`` over the last dim: ``logsumexp(z) - sum(p * z)``.

    Shapes: [..., V] -> [...]. With ``chunk_size`` the rows are processed ``chunk_size`` at a
    time so only one chunk's softmax is held in memory (large vocabularies).
    """
    if chunk_size is None:
        p = torch.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - (p * logits).sum(dim=-1)
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(flat[i : i + chunk_size]) for i in range(0, flat.shape[0], chunk_size)]
    out = torch.cat(parts) if parts else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    *,
    kl_coef: float = 0.02,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN,
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy loss plus ``kl_coef`` times the k3 KL to the reference, both aggregated alike.

    Shapes as :func:`clipped_policy_loss`; ``ref_logprobs`` [B, T] (None or ``kl_coef == 0``: no KL
    term). Stats add ``pg_loss``, ``kl`` and ``loss``.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0 (got {kl_coef}); 0.02 is the default")
    pg, stats = clipped_policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
        dual_clip=dual_clip, loss_agg=loss_agg, norm_len=norm_len,
    )
    loss = pg
    stats["pg_loss"] = pg.item()
    if ref_logprobs is not None and kl_coef > 0:
        kl = aggregate_loss(kl_k3(logprobs, ref_logprobs), mask, loss_agg, norm_len=norm_len)
        loss = pg + kl_coef * kl
        stats["kl"] = kl.item()
    stats["loss"] = loss.item()
    return loss, stats


def assistant_nll(logits: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """SFT's loss: mean next-token cross-entropy over the labelled (assistant) tokens.

    Shapes: logits [B, T, V], labels [B, T] (``ignore_index`` where nothing is trained) ->
    scalar. Position t's logits predict label t + 1, as in causal LM training. No labelled
    token: 0 (with a gradient of zeros), not NaN.
    """
    targets = labels[:, 1:]
    if not bool((targets != ignore_index).any()):
        return logits.sum() * 0.0
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=ignore_index)
