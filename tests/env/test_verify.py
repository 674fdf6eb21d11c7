"""verify_outputs / compare_tensor against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from multiminddev.env.results import StageStatus
from multiminddev.env.verify import compare_tensor, error_magnitudes, verify_outputs


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
