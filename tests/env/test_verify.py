"""verify_outputs / compare_tensor against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from multiminddev.env.config import EvalConfig
from multiminddev.env.precision import OutputLayout, output_layout
from multiminddev.env.results import StageStatus
from multiminddev.env.verify import (
    EagerErrorScale,
    PrecisionBudget,
    compare_tensor,
    distance_stats,
    eager_error_scales,
    error_magnitudes,
    error_stats,
    layout_mismatches,
    scaled_allowance,
    verify_outputs,
    verify_precision,
    verify_precision_scaled,
)


def _pair(seed=0, shape=(64, 33)):
    rng = np.random.default_rng(seed)
    expected = rng.standard_normal(shape).astype(np.float32)
    return expected, expected.copy()


def test_identical_outputs_pass_every_trial():
    e, a = _pair()
    ref = [[torch.from_numpy(e)] for _ in range(5)]
    cand = [[torch.from_numpy(a)] for _ in range(5)]
    result = verify_outputs(ref, cand, atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.OK
    assert (result.trials_run, result.trials_passed) == (5, 5)


@pytest.mark.parametrize("scale", [1e-6, 1e-5, 5e-5, 2e-4, 1e-3])
def test_pass_fail_agrees_with_numpy_allclose(scale):
    rng = np.random.default_rng(1)
    e = rng.standard_normal((128, 64)).astype(np.float32)
    a = (e + scale * rng.standard_normal(e.shape)).astype(np.float32)
    mismatch = compare_tensor(torch.from_numpy(e), torch.from_numpy(a), atol=1e-4, rtol=1e-4)
    assert (mismatch is None) == bool(np.allclose(a, e, atol=1e-4, rtol=1e-4))


def test_mismatch_summary_matches_numpy():
    e, a = _pair(2)
    a[3, 7] += 1.0
    a[10, 0] -= 0.5
    m = compare_tensor(torch.from_numpy(e), torch.from_numpy(a), atol=1e-4, rtol=1e-4,
                       trial=2, output_index=0)
    assert m is not None and m.reason == "allclose"
    bad = np.argwhere(~np.isclose(a, e, atol=1e-4, rtol=1e-4))
    assert m.first_bad_indices == bad[:5].tolist()
    assert m.max_abs_error == pytest.approx(np.abs(a - e).max(), rel=1e-6)
    assert m.max_rel_error == pytest.approx((np.abs(a - e) / np.abs(e)).max(), rel=1e-5)
    assert m.expected_values[0] == pytest.approx(float(e[3, 7]))
    assert m.actual_values[0] == pytest.approx(float(a[3, 7]))
    assert m.mismatched_fraction == pytest.approx(2 / e.size)
    assert "trial 2" in m.message and "[3, 7]" in m.message


def test_shape_mismatch_is_reported():
    m = compare_tensor(torch.zeros(4, 5), torch.zeros(5, 4), atol=1e-4, rtol=1e-4)
    assert m is not None and m.reason == "shape" and "(5, 4)" in m.message


def test_dtype_mismatch_is_reported_even_when_values_match():
    m = compare_tensor(torch.ones(8, dtype=torch.float16), torch.ones(8), atol=1e-2, rtol=1e-2)
    assert m is not None and m.reason == "dtype" and "float16" in m.message


def test_nan_where_reference_is_finite_fails_as_nan_inf():
    e, a = _pair(3)
    a[0, 0] = np.nan
    m = compare_tensor(torch.from_numpy(e), torch.from_numpy(a), atol=1e-4, rtol=1e-4)
    assert m is not None and m.reason == "nan_inf" and m.first_bad_indices == [[0, 0]]


def test_nan_and_inf_matching_the_reference_pass():
    e = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare_tensor(e, e.clone(), atol=1e-4, rtol=1e-4) is None


def test_wrong_number_of_outputs_fails():
    ref = [[torch.zeros(3), torch.zeros(3)]]
    result = verify_outputs(ref, [[torch.zeros(3)]], atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.FAILED and result.mismatches[0].reason == "count"


def test_half_precision_tolerances_use_exact_upcast():
    rng = np.random.default_rng(4)
    e = rng.standard_normal(1000).astype(np.float16)
    a = (e.astype(np.float32) * 1.004).astype(np.float16)
    ok = compare_tensor(torch.from_numpy(e), torch.from_numpy(a), atol=1e-2, rtol=1e-2)
    assert ok is None
    assert np.allclose(a.astype(np.float64), e.astype(np.float64), atol=1e-2, rtol=1e-2)


def test_failed_trial_counts_and_error_magnitudes():
    e, a = _pair(5)
    good, bad = torch.from_numpy(e), torch.from_numpy(a + 1e-2)
    result = verify_outputs([[good], [good]], [[good.clone()], [bad]], atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.FAILED and result.trials_passed == 1
    assert result.mismatches[0].trial == 1
    abs_err, _ = error_magnitudes(good, bad)
    assert result.max_abs_error == pytest.approx(abs_err) == pytest.approx(1e-2, rel=1e-3)


def test_chunked_fast_path_matches_the_whole_tensor_errors_and_finds_late_mismatches():
    from multiminddev.env import verify

    n = 3 * verify.CHUNK_ELEMENTS + 5
    torch.manual_seed(0)
    expected = torch.randn(n)
    actual = expected + 1e-6 * torch.randn(n)
    fast = verify._all_close_chunked(expected, actual, atol=1e-4, rtol=1e-4)
    diff = (actual - expected).abs()
    assert fast is not None
    assert fast[0] == pytest.approx(float(diff.max()))
    assert fast[1] == pytest.approx(float((diff / expected.abs()).max()), rel=1e-5)
    late_bad = actual.clone()
    late_bad[-1] += 1.0  # in the last, partial chunk
    assert verify._all_close_chunked(expected, late_bad, atol=1e-4, rtol=1e-4) is None
    mismatch = verify.compare_tensor(expected, late_bad, atol=1e-4, rtol=1e-4)
    assert mismatch is not None and mismatch.first_bad_indices == [[n - 1]]
    nan = actual.clone()
    nan[verify.CHUNK_ELEMENTS] = float("nan")
    assert verify._all_close_chunked(expected, nan, atol=1e-4, rtol=1e-4) is None
    assert verify.compare_tensor(expected, nan, atol=1e-4, rtol=1e-4).reason == "nan_inf"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int64, torch.int32, torch.bool])
def test_bit_identical_outputs_pass_with_zero_error(dtype):
    t = (torch.randn(3, 1 << 10) * 5).to(dtype)
    result = verify_outputs([[t]], [[t.clone()]], atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.OK
    assert (result.max_abs_error, result.max_rel_error) == (0.0, 0.0)


def test_bit_identical_nan_and_inf_are_accepted_as_before():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    fast = verify_outputs([[t]], [[t.clone()]], atol=1e-4, rtol=1e-4)
    # the same values as a different bit pattern (-0.0) take the full path: same verdict
    other = t.clone()
    other[4] = -0.0
    full = verify_outputs([[t]], [[other]], atol=1e-4, rtol=1e-4)
    assert fast.status is full.status is StageStatus.OK
    assert (fast.max_abs_error, fast.max_rel_error) == (full.max_abs_error, full.max_rel_error)


def test_one_bad_element_past_the_first_chunk_is_still_found():
    from multiminddev.env.verify import BITWISE_CHUNK_ELEMENTS

    e = torch.randn(3 * BITWISE_CHUNK_ELEMENTS + 5)
    a = e.clone()
    a[-1] += 1.0
    result = verify_outputs([[e]], [[a]], atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.FAILED
    assert result.mismatches[0].first_bad_indices == [[e.numel() - 1]]


def test_trials_after_the_first_failure_are_pass_fail_only():
    e = [torch.randn(1000) for _ in range(4)]
    cand = [e[0] * 2, e[1].clone(), e[2] + 1, e[3].clone()]  # trial 0 and 2 fail
    result = verify_outputs([[t] for t in e], [[t] for t in cand], atol=1e-4, rtol=1e-4)
    assert result.status is StageStatus.FAILED
    assert (result.trials_run, result.trials_passed) == (4, 2)
    first, later = result.mismatches
    assert first.trial == 0 and first.reason == "allclose" and first.first_bad_indices
    assert later.trial == 2 and later.reason == "unexamined" and "trial 0" in later.message
    assert result.error == first.message


def test_chunked_report_matches_a_whole_tensor_reference():
    """The chunked scan's fraction, first indices, values and errors against plain numpy."""
    from multiminddev.env.verify import CHUNK_ELEMENTS

    rng = np.random.default_rng(3)
    e = rng.standard_normal((5, CHUNK_ELEMENTS // 2 + 7)).astype(np.float32)
    a = e.copy()
    bad_flat = [3, CHUNK_ELEMENTS - 1, CHUNK_ELEMENTS + 11, e.size - 1]
    a.reshape(-1)[bad_flat] += 1.0
    a.reshape(-1)[17] = np.nan
    bad_flat = sorted([*bad_flat, 17])
    m = compare_tensor(torch.from_numpy(e), torch.from_numpy(a), atol=1e-4, rtol=1e-4)
    assert m.reason == "nan_inf" and m.mismatched_fraction == len(bad_flat) / e.size
    assert m.first_bad_indices == [list(np.unravel_index(i, e.shape)) for i in bad_flat]
    assert m.expected_values == [float(e.reshape(-1)[i]) for i in bad_flat]
    finite = np.isfinite(a)
    diff = np.abs(a - e)[finite]
    assert m.max_abs_error == pytest.approx(float(diff.max()))
    assert m.max_rel_error == pytest.approx(float((diff / np.abs(e)[finite]).max()))


# ---------------------------------------------------------------------------------------------
# Precision by error budget: real CPU computations of honest and reduced-precision kernels
# ---------------------------------------------------------------------------------------------

BUDGET = PrecisionBudget.from_config(EvalConfig())


def _judge(truth, eager, cand, *, rtol=1e-4):
    return verify_precision([truth], [eager], [cand], budget=BUDGET, rtol=rtol)


def _tf32(x):
    """Round float32 values to TF32's 10-bit mantissa (to nearest), as tensor cores read them."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def _matmul_problem(k=4096, seed=0, n=64):
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, k, generator=gen), torch.randn(k, n, generator=gen)
    return a, b, a.double() @ b.double(), a @ b


def _rows(n=4096, rows=256, seed=1, dtype=torch.float32):
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _sequential_sum(x, acc_dtype):
    """One thread per row, looping over the row in order (accumulator in ``acc_dtype``)."""
    acc = torch.zeros(x.shape[0], dtype=acc_dtype)
    for k in range(x.shape[1]):
        acc = acc + x[:, k].to(acc_dtype)
    return acc


def _pairwise_sum(x):
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


def _kahan_sum(x):
    total, comp = torch.zeros(x.shape[0]), torch.zeros(x.shape[0])
    for k in range(x.shape[1]):
        y = x[:, k] - comp
        t = total + y
        comp = (t - total) - y
        total = t
    return total


def _perturb_ulps(x, max_ulps, seed=2):
    """Move every element by a random number of ulps in [-max_ulps, max_ulps] (fast-math)."""
    steps = torch.randint(-max_ulps, max_ulps + 1, x.shape,
                          generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    return (x.contiguous().view(torch.int32) + steps).view(torch.float32)


def test_tf32_matmul_in_a_float32_problem_is_rejected():
    a, b, truth, eager = _matmul_problem()
    [m] = _judge(truth, eager, _tf32(a) @ _tf32(b))
    assert m.reason == "precision" and "reduced precision" in m.message
    assert "float32" in m.message and "eager PyTorch's" in m.message


def test_float16_compute_upcast_in_a_float32_problem_is_rejected():
    a, b, truth, eager = _matmul_problem()
    [m] = _judge(truth, eager, (a.half() @ b.half()).float())
    assert m.reason == "precision"


@pytest.mark.parametrize("acc_dtype", [torch.float16, torch.bfloat16])
def test_half_accumulation_of_a_float32_sum_is_rejected(acc_dtype):
    x = _rows()
    [m] = _judge(x.double().sum(1), x.sum(1), _sequential_sum(x, acc_dtype).float())
    assert m.reason == "precision"


@pytest.mark.parametrize("kernel", [
    lambda x: _sequential_sum(x, torch.float32), _pairwise_sum, _kahan_sum,
], ids=["sequential", "pairwise", "kahan"])
def test_float32_sums_in_another_order_are_accepted(kernel):
    x = _rows()
    assert _judge(x.double().sum(1), x.sum(1), kernel(x)) == []


def test_float32_matmul_with_a_sequential_k_loop_is_accepted():
    a, b, truth, eager = _matmul_problem()
    acc = torch.zeros(64, 64)
    for k in range(a.shape[1]):
        acc = torch.addcmul(acc, a[:, k:k + 1], b[k:k + 1, :])
    assert _judge(truth, eager, acc) == []


def test_fast_math_exp_a_few_ulps_off_is_accepted():
    x = _rows(n=1024, rows=64)
    eager = torch.exp(x)
    assert _judge(torch.exp(x.double()), eager, _perturb_ulps(eager, 4)) == []


def test_a_few_ulps_pass_where_eager_is_exact():
    x = _rows(n=1024, rows=64)
    eager = torch.relu(x)
    stats = error_stats(torch.relu(x.double()), eager, eager)
    assert stats.eager_rms == 0.0
    assert _judge(torch.relu(x.double()), eager, _perturb_ulps(eager, 2)) == []


def test_reduced_precision_in_a_small_part_of_the_output_fails_the_max_bound():
    a, b, truth, eager = _matmul_problem(n=256)
    cand = eager.clone()
    cand[0, :4] = (_tf32(a[:1]) @ _tf32(b[:, :4]))[0]  # 4 of 65536 elements in TF32
    stats = error_stats(truth, eager, cand)
    assert stats.candidate_rms <= BUDGET.error_multiple * stats.eager_rms  # RMS alone misses it
    [m] = _judge(truth, eager, cand)
    assert m.reason == "precision" and "in part of the output" in m.message


def test_float16_sum_accumulated_in_float32_is_accepted():
    x = _rows(dtype=torch.float16)
    cand = _sequential_sum(x, torch.float32).half()
    assert _judge(x.double().sum(1), x.sum(1), cand, rtol=1e-2) == []


def test_float16_matmul_accumulated_in_float32_is_accepted():
    a, b, _, _ = _matmul_problem(k=1024)
    a, b = a.half(), b.half()
    truth = a.double() @ b.double()
    assert _judge(truth, a @ b, (a.float() @ b.float()).half(), rtol=1e-2) == []


def _small_float16_outputs():
    x = (1e-3 * _rows(n=256, rows=64)).half()
    return torch.tanh(x.double()), torch.tanh(x)


@pytest.mark.parametrize("fill", [0.0, 1e-3])
def test_constant_output_of_a_small_float16_problem_is_rejected(fill):
    truth, eager = _small_float16_outputs()
    cand = torch.full_like(eager, fill)
    assert compare_tensor(eager, cand, atol=1e-2, rtol=1e-2) is None  # a bare atol passes it
    [m] = _judge(truth, eager, cand, rtol=1e-2)
    assert m.reason == "precision" and "wrong" in m.message


def test_constant_output_of_a_bfloat16_problem_is_rejected():
    x = _rows(n=256, rows=64, dtype=torch.bfloat16)
    eager = torch.tanh(x)
    [m] = _judge(torch.tanh(x.double()), eager, torch.zeros_like(eager), rtol=1e-2)
    assert m.reason == "precision"


def test_without_ground_truth_a_constant_float16_output_is_rejected():
    _, eager = _small_float16_outputs()
    [m] = verify_precision(None, [eager], [torch.zeros_like(eager)], budget=BUDGET, rtol=1e-2)
    assert m.reason == "precision"


def test_without_ground_truth_an_honest_float16_kernel_is_accepted():
    x = _rows(dtype=torch.float16)
    cand = _sequential_sum(x, torch.float32).half()
    assert verify_precision(None, [x.sum(1)], [cand], budget=BUDGET, rtol=1e-2) == []


def test_non_finite_elements_are_left_to_verify_outputs():
    x = _rows(n=1024, rows=64)
    truth, eager = x.double().sum(1), x.sum(1)
    truth[3], eager[3] = float("inf"), float("inf")
    cand = _pairwise_sum(x)
    cand[3] = float("inf")
    assert _judge(truth, eager, cand) == []


def test_outputs_of_other_dtypes_or_shapes_are_not_judged():
    ints = torch.arange(6)
    wrong_shape = torch.zeros(2, 3)
    found = verify_precision([ints.double(), torch.ones(3, 2, dtype=torch.float64)],
                             [ints, torch.ones(3, 2)], [ints + 1, wrong_shape],
                             budget=BUDGET, rtol=1e-4)
    assert found == []


def test_error_stats_match_a_direct_float64_computation():
    gen = torch.Generator().manual_seed(5)
    truth = torch.randn(40_000, generator=gen, dtype=torch.float64)  # spans several chunks
    eager = truth.float()
    cand = (truth + 1e-3 * torch.randn(40_000, generator=gen, dtype=torch.float64)).float()
    stats = error_stats(truth, eager, cand)
    da, dr = cand.double() - truth, eager.double() - truth
    assert stats.count == 40_000
    assert stats.candidate_rms == pytest.approx(float(da.pow(2).mean().sqrt()), rel=1e-12)
    assert stats.eager_rms == pytest.approx(float(dr.pow(2).mean().sqrt()), rel=1e-12)
    assert stats.truth_rms == pytest.approx(float(truth.pow(2).mean().sqrt()), rel=1e-12)
    assert stats.candidate_max == float(da.abs().max())
    assert stats.truth_max == float(truth.abs().max())


def test_mismatch_reports_the_trial_and_output():
    a, b, truth, eager = _matmul_problem(k=512)
    ok = eager.clone()
    [m] = verify_precision([truth, truth], [eager, eager], [ok, _tf32(a) @ _tf32(b)],
                           budget=BUDGET, rtol=1e-4, trial=3)
    assert (m.trial, m.output_index) == (3, 1) and m.message.startswith("trial 3, output 1")


# ---------------------------------------------------------------------------------------------
# Dense outputs
# ---------------------------------------------------------------------------------------------


def test_expanded_output_is_rejected_when_the_reference_is_dense():
    ref = output_layout(torch.zeros(8, 16))
    cand = output_layout(torch.zeros(8, 1).expand(8, 16))
    [m] = layout_mismatches([ref], [cand], trial=1)
    assert m.reason == "layout" and "stride 0" in m.message and m.trial == 1


def test_gapped_view_output_is_rejected():
    ref = output_layout(torch.zeros(8, 16))
    cand = output_layout(torch.zeros(8, 32)[:, :16])
    [m] = layout_mismatches([ref], [cand])
    assert m.reason == "layout" and "gaps" in m.message


def test_non_dense_output_is_accepted_when_the_reference_is_not_dense():
    ref = output_layout(torch.zeros(8, 1).expand(8, 16))
    cand = output_layout(torch.zeros(1, 16).expand(8, 16))
    assert layout_mismatches([ref], [cand]) == []


def test_transposed_output_is_dense():
    assert layout_mismatches([output_layout(torch.zeros(8, 16))],
                             [output_layout(torch.zeros(16, 8).t())]) == []


def test_layout_survives_a_round_trip_as_plain_data():
    layout = output_layout(torch.zeros(4, 1).expand(4, 5))
    import json

    again = OutputLayout.from_dict(json.loads(json.dumps(layout.to_dict())))
    assert again == layout


def test_a_few_percent_off_is_caught_on_float16_outputs_near_the_smallest_normal():
    # Every output of a 16384-wide softmax is ~6e-5, float16's smallest normal: an error floor
    # at that size would excuse any error.
    from multiminddev.env.config import EvalConfig
    from multiminddev.env.verify import PrecisionBudget, verify_precision

    torch.manual_seed(0)
    x = torch.randn(64, 16384, dtype=torch.float16)
    truth = torch.softmax(x.double(), -1)
    eager = torch.softmax(x.float(), -1).half()
    off = (truth * (1 + 0.04 * torch.rand(64, 1, dtype=torch.float64))).half()
    budget = PrecisionBudget.from_config(EvalConfig())
    assert verify_precision([truth], [eager], [off], budget=budget, rtol=1e-2)
    assert verify_precision([truth], [eager], [eager.clone()], budget=budget, rtol=1e-2) == []


# ------------------------------------------- the budget on outputs with no ground truth of their own


def _scaled_judge(calibration, judged, kernel):
    """Scales from eager's error on ``calibration`` (its truth, eager), then ``kernel``'s
    output on another draw judged through them: how trials after the first and checked timed
    calls are judged."""
    truth0, eager0 = calibration
    scales = eager_error_scales([truth0], [eager0])
    return verify_precision_scaled(scales, [judged], [kernel], budget=BUDGET, rtol=1e-4, trial=3)


def test_eager_error_scale_is_eagers_error_relative_to_the_truth():
    truth = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    eager = torch.tensor([1.5, -2.0, 4.0], dtype=torch.float32)
    [scale] = eager_error_scales([truth], [eager])
    assert scale.rms_ratio == pytest.approx((0.25 / 3) ** 0.5 / (21 / 3) ** 0.5)
    assert scale.max_ratio == pytest.approx(0.5 / 4.0)
    assert eager_error_scales(None, [eager]) == [None]


def test_scaled_allowance_is_the_budget_on_eagers_estimated_error_plus_that_error():
    stats = error_stats(*(torch.tensor([3.0, 4.0]),) * 3)  # RMS magnitude 3.536, max 4
    scale = EagerErrorScale(rms_ratio=1e-3, max_ratio=2e-3)
    rms_allowed, max_allowed = scaled_allowance(stats, scale, torch.float32, BUDGET)
    eager_rms, eager_max = 1.25 * 1e-3 * stats.truth_rms, 1.25 * 2e-3 * 4.0  # EAGER_SPREAD
    assert rms_allowed == pytest.approx(32 * eager_rms + eager_rms)
    assert max_allowed == pytest.approx(32 * 4 * eager_max + eager_max)


def test_tf32_on_a_later_draw_fails_the_budget_calibrated_on_trial_0():
    _, _, truth0, eager0 = _matmul_problem(seed=0)
    a1, b1, _, eager1 = _matmul_problem(seed=1)
    [m] = _scaled_judge((truth0, eager0), eager1, _tf32(a1) @ _tf32(b1))
    assert m.reason == "precision" and m.trial == 3 and "reduced precision" in m.message


def test_half_accumulation_on_a_later_draw_fails_the_calibrated_budget():
    x0, x1 = _rows(seed=1), _rows(seed=2)
    [m] = _scaled_judge((x0.double().sum(1), x0.sum(1)), x1.sum(1),
                        _sequential_sum(x1, torch.float16).float())
    assert m.reason == "precision"


def test_a_constant_on_a_later_draw_fails_the_calibrated_budget():
    x0, x1 = _rows(seed=1), _rows(seed=2)
    eager1 = x1.sum(1)
    [m] = _scaled_judge((x0.double().sum(1), x0.sum(1)), eager1,
                        torch.full_like(eager1, float(eager1.mean())))
    assert "wrong, not merely imprecise" in m.message


@pytest.mark.parametrize("kernel", [
    lambda x: _sequential_sum(x, torch.float32), _pairwise_sum, _kahan_sum,
], ids=["sequential", "pairwise", "kahan"])
def test_honest_float32_sums_on_later_draws_pass_the_calibrated_budget(kernel):
    x0 = _rows(seed=1)
    for seed in (2, 3, 4):
        x = _rows(seed=seed)
        assert _scaled_judge((x0.double().sum(1), x0.sum(1)), x.sum(1), kernel(x)) == []


def test_an_honest_sequential_matmul_on_a_later_draw_passes_the_calibrated_budget():
    _, _, truth0, eager0 = _matmul_problem(seed=0)
    a, b, _, eager1 = _matmul_problem(seed=5)
    acc = torch.zeros(64, 64)
    for k in range(a.shape[1]):
        acc = torch.addcmul(acc, a[:, k:k + 1], b[k:k + 1, :])
    assert _scaled_judge((truth0, eager0), eager1, acc) == []


def test_without_a_scale_the_magnitude_normalised_comparison_judges():
    x = _rows(n=1024, rows=64).sum(1)
    found = verify_precision_scaled([None], [x], [torch.zeros_like(x)], budget=BUDGET, rtol=1e-4)
    assert [m.reason for m in found] == ["precision"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_distance_stats_match_error_stats_with_eager_as_the_truth(dtype):
    gen = torch.Generator().manual_seed(3)
    eager = torch.randn(700_001, generator=gen).to(dtype)
    cand = (eager.float() + 1e-3 * torch.randn(700_001, generator=gen)).to(dtype)
    cand[5] = float("nan")  # a non-finite chunk is counted without its NaN, as error_stats does
    cand[400_000] = float("inf")
    got, want = distance_stats(eager, cand), error_stats(eager, eager, cand)
    assert got.count == want.count == 700_001 - 2
    for name in ("candidate_sq", "truth_sq", "candidate_max", "truth_max"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-5), name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_passing_path_agrees_with_the_torch_chunks(seed):
    from multiminddev.env import verify

    gen = torch.Generator().manual_seed(seed)
    expected = torch.randn(300_001, generator=gen)
    actual = expected + 3e-5 * torch.randn(300_001, generator=gen)
    fast = verify._all_close_float32(expected, actual, atol=1e-4, rtol=1e-4)
    slow = verify._all_close_chunked(expected.double(), actual.double(), atol=1e-4, rtol=1e-4)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert fast == pytest.approx(slow, rel=1e-5)
    bad = actual.clone()
    bad[299_999] = expected[299_999] + 1.0
    assert verify._all_close_float32(expected, bad, atol=1e-4, rtol=1e-4) is None


def _rand_matmul(seed, rows=128, k=2048):
    """A float32 matmul of non-negative inputs (like adv_matmul_rand_f32), where eager's own
    error is large and TF32's only ~95x it: the narrowest margin of the budget."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.rand(rows, k, generator=gen), torch.rand(k, rows, generator=gen)
    return a, b, a.double() @ b.double(), a @ b


def _tf32_nearest(x):
    scaled = x * 8193.0  # Veltkamp split: 11 significant bits, TF32's precision
    return scaled - (scaled - x)


def test_tf32_on_non_negative_matmul_fails_the_calibrated_budget_on_later_draws():
    _, _, truth0, eager0 = _rand_matmul(0)
    for seed in (1, 2):
        a, b, _, eager = _rand_matmul(seed)
        [m] = _scaled_judge((truth0, eager0), eager, _tf32_nearest(a) @ _tf32_nearest(b))
        assert m.reason == "precision"


def test_sequential_non_negative_matmul_passes_the_calibrated_budget_on_later_draws():
    _, _, truth0, eager0 = _rand_matmul(0)
    for seed in (1, 2):
        a, b, _, eager = _rand_matmul(seed)
        acc = torch.zeros(a.shape[0], b.shape[1])
        for k in range(a.shape[1]):
            acc = torch.addcmul(acc, a[:, k:k + 1], b[k:k + 1, :])
        assert _scaled_judge((truth0, eager0), eager, acc) == []
