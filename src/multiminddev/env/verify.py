"""Pure output comparison: reference outputs + candidate outputs + tolerances -> ``VerifyResult``.

Runs in the evaluator's own process on CPU tensors that came back from the worker, so a
candidate cannot influence the comparison. Per trial and output: count, shape, dtype, NaN/Inf
(non-finite where the reference is finite) and ``|a - e| <= atol + rtol * |e|``; a failure
becomes a ``TrialMismatch`` with max abs/rel error, the first bad indices and their values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multiminddev.env.results import StageStatus, TrialMismatch, VerifyResult

MAX_REPORTED_INDICES = 5


def verify_outputs(
    reference: Sequence[Sequence[torch.Tensor]],
    candidate: Sequence[Sequence[torch.Tensor]],
    *,
    atol: float,
    rtol: float,
) -> VerifyResult:
    """Compare per-trial output lists; ``reference[t][k]`` is output ``k`` of trial ``t``."""
    mismatches: list[TrialMismatch] = []
    passed, max_abs, max_rel = 0, 0.0, 0.0
    if len(candidate) != len(reference):
        return VerifyResult(
            status=StageStatus.FAILED,
            trials_run=len(candidate),
            atol=atol,
            rtol=rtol,
            error=f"expected outputs for {len(reference)} trials, got {len(candidate)}",
        )
    for trial, (ref_outs, cand_outs) in enumerate(zip(reference, candidate, strict=True)):
        trial_bad = compare_trial(trial, ref_outs, cand_outs, atol=atol, rtol=rtol)
        for ref, cand in zip(ref_outs, cand_outs, strict=False):
            if ref.shape == cand.shape and cand.dtype == ref.dtype:
                abs_err, rel_err = error_magnitudes(ref, cand)
                max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
        if trial_bad:
            mismatches.extend(trial_bad)
        else:
            passed += 1
    ok = passed == len(reference)
    return VerifyResult(
        status=StageStatus.OK if ok else StageStatus.FAILED,
        trials_run=len(reference),
        trials_passed=passed,
        atol=atol,
        rtol=rtol,
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        mismatches=mismatches,
        error="" if ok else mismatches[0].message,
    )


def compare_trial(
    trial: int,
    reference: Sequence[torch.Tensor],
    candidate: Sequence[torch.Tensor],
    *,
    atol: float,
    rtol: float,
) -> list[TrialMismatch]:
    if len(candidate) != len(reference):
        return [
            TrialMismatch(
                trial=trial,
                output_index=0,
                reason="count",
                message=f"trial {trial}: expected {len(reference)} output tensor(s), "
                f"got {len(candidate)}",
            )
        ]
    found = []
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        mismatch = compare_tensor(ref, cand, atol=atol, rtol=rtol, trial=trial, output_index=index)
        if mismatch is not None:
            found.append(mismatch)
    return found


def compare_tensor(
    expected: torch.Tensor,
    actual: torch.Tensor,
    *,
    atol: float,
    rtol: float,
    trial: int = 0,
    output_index: int = 0,
) -> TrialMismatch | None:
    """None when ``actual`` matches ``expected``; else a readable mismatch."""
    where = f"trial {trial}, output {output_index}"
    if not isinstance(actual, torch.Tensor):
        return TrialMismatch(
            trial=trial,
            output_index=output_index,
            reason="dtype",
            message=f"{where}: expected a tensor, got {type(actual).__name__}",
        )
    if tuple(actual.shape) != tuple(expected.shape):
        return TrialMismatch(
            trial=trial,
            output_index=output_index,
            reason="shape",
            message=f"{where}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}",
        )
    if actual.dtype != expected.dtype:
        return TrialMismatch(
            trial=trial,
            output_index=output_index,
            reason="dtype",
            message=f"{where}: dtype {_dtype(actual)} != expected {_dtype(expected)}; "
            "return the reference's dtype",
        )
    e, a = _working(expected), _working(actual)
    close = (a - e).abs() <= atol + rtol * e.abs()  # NaN compares False
    if bool(close.all()):
        return None
    both_nan = torch.isnan(e) & torch.isnan(a)
    same_inf = torch.isinf(e) & (a == e)
    bad = ~close & ~both_nan & ~same_inf
    if not bool(bad.any()):
        return None
    nonfinite = ~torch.isfinite(a) & bad
    reason = "nan_inf" if bool(nonfinite.any()) else "allclose"
    abs_err, rel_err = error_magnitudes(expected, actual)
    bad_idx = torch.nonzero(bad)[:MAX_REPORTED_INDICES]
    indices = [[int(i) for i in row] for row in bad_idx.tolist()]
    exp_vals = [float(e[tuple(ix)]) for ix in indices]
    act_vals = [float(a[tuple(ix)]) for ix in indices]
    fraction = float(bad.sum()) / max(1, bad.numel())
    first = indices[0] if indices else []
    what = "non-finite values (NaN/Inf)" if reason == "nan_inf" else "values out of tolerance"
    message = (
        f"{where}: {fraction:.2%} {what} (atol={atol:g}, rtol={rtol:g}); max abs error "
        f"{abs_err:.3g}, max rel error {rel_err:.3g}; first at index {first}: expected "
        f"{exp_vals[0]:.6g}, got {act_vals[0]:.6g}"
    )
    return TrialMismatch(
        trial=trial,
        output_index=output_index,
        reason=reason,
        max_abs_error=abs_err,
        max_rel_error=rel_err,
        mismatched_fraction=fraction,
        first_bad_indices=indices,
        expected_values=exp_vals,
        actual_values=act_vals,
        message=message,
    )


def _working(t: torch.Tensor) -> torch.Tensor:
    """fp32 for fp32 and narrower floats (exact upcast), fp64 otherwise: fast on big outputs."""
    if t.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return t.detach().to(torch.float32)
    return t.detach().to(torch.float64)


def error_magnitudes(expected: torch.Tensor, actual: torch.Tensor) -> tuple[float, float]:
    """Max |a - e| and max |a - e| / |e| over elements where both are finite (0 if none)."""
    e, a = _working(expected), _working(actual)
    finite = torch.isfinite(e) & torch.isfinite(a)
    if not bool(finite.any()):
        return 0.0, 0.0
    diff = (a - e).abs()[finite]
    denom = e.abs()[finite].clamp_min(torch.finfo(e.dtype).tiny)
    return float(diff.max()), float((diff / denom).max())


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")
