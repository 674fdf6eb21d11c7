"""Losses against loop references, plus gradient and clipping properties."""

from __future__ import annotations

import math

import pytest
import torch

from multiminddev.rl.losses import (
    LossAgg,
    aggregate_loss,
    assistant_nll,
    clipped_policy_loss,
    entropy_from_logits,
    grpo_loss,
    kl_k3,
    masked_mean,
    masked_sum,
)


def make_batch(seed=0, b=3, t=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    new = old + (torch.rand(b, t, generator=g) - 0.5) * 0.8
    adv = torch.randn(b, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 1, 0, 1]], dtype=torch.float32)
    return new, old, adv, mask


def loop_token_loss(new, old, a, lo, hi):
    ratio = math.exp(new - old)
    return max(-a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi))


def loop_policy_loss(new, old, adv, mask, agg, lo=0.2, hi=0.2):
    b, t = new.shape
    per_seq, all_tokens = [], []
    for i in range(b):
        toks = [loop_token_loss(new[i, j].item(), old[i, j].item(), adv[i].item(), lo, hi)
                for j in range(t) if mask[i, j] > 0]
        all_tokens += toks
        if toks:
            per_seq.append((sum(toks), len(toks)))
    if agg is LossAgg.TOKEN_MEAN:
        return sum(all_tokens) / len(all_tokens)
    if agg is LossAgg.SEQ_MEAN_TOKEN_MEAN:
        return sum(s / n for s, n in per_seq) / len(per_seq)
    return sum(s / t for s, _ in per_seq) / len(per_seq)


@pytest.mark.parametrize("agg", list(LossAgg))
def test_policy_loss_matches_loop(agg):
    new, old, adv, mask = make_batch()
    loss, _ = clipped_policy_loss(new, old, adv, mask, loss_agg=agg, clip_low=0.1, clip_high=0.15)
    expected = loop_policy_loss(new, old, adv, mask, agg, lo=0.1, hi=0.15)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_masked_mean_and_sum_match_loop():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert masked_sum(x, m).item() == 10.0
    assert masked_mean(x, m).item() == pytest.approx(10.0 / 3)
    assert masked_mean(x, m, dim=-1).tolist() == pytest.approx([2.0, 6.0])


def test_fully_masked_sequence_is_left_out_of_seq_mean():
    loss_mat = torch.tensor([[1.0, 3.0], [100.0, 100.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate_loss(loss_mat, mask, LossAgg.SEQ_MEAN_TOKEN_MEAN).item() == pytest.approx(2.0)


def test_gradient_flows_only_through_masked_tokens():
    new, old, adv, mask = make_batch()
    new = new.clone().requires_grad_(True)
    loss, _ = clipped_policy_loss(new, old, adv, mask, clip_low=0.9, clip_high=10.0)
    loss.backward()
    assert torch.all(new.grad[mask == 0] == 0)
    assert torch.all(new.grad[mask == 1] != 0)


def test_zero_advantage_gives_zero_policy_gradient():
    new, old, _, mask = make_batch()
    new = new.clone().requires_grad_(True)
    loss, _ = clipped_policy_loss(new, old, torch.zeros(3), mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(new.grad == 0)


def _single_token(ratio: float, adv: float, **kw):
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(ratio), requires_grad=True)
    loss, stats = clipped_policy_loss(new, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return new.grad.item(), stats


def test_positive_advantage_just_inside_upper_clip_has_gradient():
    grad, stats = _single_token(1.2 - 1e-4, 1.0)
    assert grad != 0 and stats["clip_fraction"] == 0.0


def test_positive_advantage_just_outside_upper_clip_has_no_gradient():
    grad, stats = _single_token(1.2 + 1e-4, 1.0)
    assert grad == 0 and stats["clip_fraction"] == 1.0


def test_negative_advantage_just_outside_lower_clip_has_no_gradient():
    grad, stats = _single_token(0.8 - 1e-4, -1.0)
    assert grad == 0 and stats["clip_fraction"] == 1.0


def test_negative_advantage_just_inside_lower_clip_has_gradient():
    grad, _ = _single_token(0.8 + 1e-4, -1.0)
    assert grad != 0


def test_positive_advantage_below_lower_bound_is_not_clipped():
    # The pessimistic min keeps the gradient that raises a too-unlikely good token.
    grad, stats = _single_token(0.5, 1.0)
    assert grad != 0 and stats["clip_fraction"] == 0.0


def test_clip_higher_allows_larger_upward_ratio():
    grad, _ = _single_token(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert grad != 0


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(5.0))
    loss, _ = clipped_policy_loss(new, old, torch.tensor([-2.0]), torch.ones(1, 1), dual_clip=3.0)
    assert loss.item() == pytest.approx(6.0)  # min(-A*ratio = 10, -A*c = 6)


def test_stats_approx_kl_and_ratio_mean():
    new, old, adv, mask = make_batch()
    _, stats = clipped_policy_loss(new, old, adv, mask)
    assert stats["approx_kl"] == pytest.approx(masked_mean(old - new, mask).item(), rel=1e-5)
    assert stats["ratio_mean"] == pytest.approx(masked_mean(torch.exp(new - old), mask).item(), rel=1e-5)


def test_k3_is_nonnegative():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1000, generator=g) * 3, torch.randn(1000, generator=g) * 3
    assert torch.all(kl_k3(a, b) >= 0)


def test_k3_is_zero_when_equal():
    x = torch.randn(50)
    assert torch.all(kl_k3(x, x) == 0)


def test_k3_matches_formula():
    new, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -0.5])
    d = ref - new
    assert torch.allclose(kl_k3(new, ref), torch.exp(d) - d - 1)


def test_entropy_matches_categorical():
    logits = torch.randn(2, 3, 11)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-5)


def test_entropy_chunked_equals_unchunked():
    logits = torch.randn(3, 7, 13)
    assert torch.allclose(entropy_from_logits(logits, chunk_size=4), entropy_from_logits(logits), atol=1e-6)


def test_grpo_loss_is_policy_loss_plus_kl():
    new, old, adv, mask = make_batch()
    ref = old - 0.1
    loss, stats = grpo_loss(new, old, adv, mask, ref, kl_coef=0.02)
    pg, _ = clipped_policy_loss(new, old, adv, mask)
    kl = masked_mean(kl_k3(new, ref), mask)
    assert loss.item() == pytest.approx(pg.item() + 0.02 * kl.item(), rel=1e-6)
    assert stats["kl"] == pytest.approx(kl.item(), rel=1e-6)


def test_grpo_loss_without_reference_is_policy_loss():
    new, old, adv, mask = make_batch()
    loss, stats = grpo_loss(new, old, adv, mask, None)
    assert "kl" not in stats
    assert loss.item() == pytest.approx(clipped_policy_loss(new, old, adv, mask)[0].item())


def test_invalid_clip_raises():
    new, old, adv, mask = make_batch()
    with pytest.raises(ValueError, match="clip_low"):
        clipped_policy_loss(new, old, adv, mask, clip_low=1.5)


@pytest.mark.parametrize("agg", list(LossAgg))
def test_policy_loss_matches_verl(agg):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    new, old, adv, mask = make_batch()
    adv_tok = adv[:, None].expand_as(new)
    ref_loss, clipfrac, ppo_kl, _ = core_algos.compute_policy_loss(
        old, new, adv_tok, mask, cliprange=0.2, cliprange_low=0.2, cliprange_high=0.28,
        clip_ratio_c=3.0, loss_agg_mode=agg.value,
    )
    loss, stats = clipped_policy_loss(new, old, adv, mask, clip_high=0.28, dual_clip=3.0, loss_agg=agg)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert stats["clip_fraction"] == pytest.approx(clipfrac.item(), abs=1e-6)
    assert stats["approx_kl"] == pytest.approx(ppo_kl.item(), rel=1e-5)


def test_k3_matches_verl_low_var_kl():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    new, ref = torch.randn(4, 6), torch.randn(4, 6)
    assert torch.allclose(kl_k3(new, ref), core_algos.kl_penalty(new, ref, "low_var_kl"))


def test_assistant_nll_matches_a_loop_over_labelled_tokens():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, 11, generator=g)
    labels = torch.tensor([[-100, -100, 4, 7, -100, 2], [-100, 1, 1, -100, -100, -100]])
    terms = [-torch.log_softmax(logits[b, t - 1], -1)[labels[b, t]]
             for b in range(2) for t in range(1, 6) if labels[b, t] != -100]
    assert float(assistant_nll(logits, labels)) == pytest.approx(float(sum(terms) / len(terms)),
                                                                  rel=1e-5)


def test_assistant_nll_without_labels_is_zero_with_a_zero_gradient():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    loss = assistant_nll(logits, torch.full((1, 4), -100))
    loss.backward()
    assert float(loss) == 0.0 and torch.count_nonzero(logits.grad) == 0
