"""Pure output comparison: reference outputs + candidate outputs + tolerances -> ``VerifyResult``.

Runs in the evaluator's own process on CPU tensors that came back from the worker, so a
candidate cannot influence the comparison. Per trial and output: count, shape, dtype, NaN/Inf
(non-finite where the reference is finite) and ``|a - e| <= atol + rtol * |e|``; a failure
becomes a ``TrialMismatch`` with max abs/rel error, the first bad indices and their values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
        trial_bad, errors = _compare_trial(trial, ref_outs, cand_outs, atol=atol, rtol=rtol)
        for abs_err, rel_err in errors:
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
    return _compare_trial(trial, reference, candidate, atol=atol, rtol=rtol)[0]


def _compare_trial(trial: int, reference: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor],
                   *, atol: float, rtol: float
                   ) -> tuple[list[TrialMismatch], list[tuple[float, float]]]:
    """Mismatches of one trial, and (max abs, max rel) error of each comparable output."""
    if len(candidate) != len(reference):
        return [
            TrialMismatch(
                trial=trial,
                output_index=0,
                reason="count",
                message=f"trial {trial}: expected {len(reference)} output tensor(s), "
                f"got {len(candidate)}",
            )
        ], []
    found, errors = [], []
    for index, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        mismatch, error = _compare(ref, cand, atol=atol, rtol=rtol, trial=trial, output_index=index)
        if mismatch is not None:
            found.append(mismatch)
        if error is not None:
            errors.append(error)
    return found, errors


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
    return _compare(expected, actual, atol=atol, rtol=rtol, trial=trial, output_index=output_index)[0]


def _compare(expected: torch.Tensor, actual: torch.Tensor, *, atol: float, rtol: float,
             trial: int, output_index: int
             ) -> tuple[TrialMismatch | None, tuple[float, float] | None]:
    """The mismatch (or None) and the (max abs, max rel) error when shapes and dtypes agree.
    The passing path makes a handful of passes over the data: outputs can be 64 MB."""
    where = f"trial {trial}, output {output_index}"
    structural = _structural_mismatch(expected, actual, where)
    if structural is not None:
        return TrialMismatch(trial=trial, output_index=output_index, reason=structural[0],
                             message=structural[1]), None
    if _bitwise_equal(expected, actual):  # many correct kernels reproduce eager bit for bit
        return None, (0.0, 0.0)
    fast = _all_close_chunked(expected, actual, atol=atol, rtol=rtol)
    if fast is not None:
        return None, fast
    e, a = _working(expected), _working(actual)
    diff = (a - e).abs_()
    e_abs = e.abs()
    close = diff <= e_abs * rtol + atol  # NaN compares False
    if bool(close.all()):
        if not diff.numel():
            return None, (0.0, 0.0)
        rel = diff / e_abs.clamp_min_(torch.finfo(e_abs.dtype).tiny)
        return None, (float(diff.max()), float(rel.max()))
    both_nan = torch.isnan(e) & torch.isnan(a)
    same_inf = torch.isinf(e) & (a == e)
    bad = ~close & ~both_nan & ~same_inf
    errors = error_magnitudes(expected, actual)
    if not bool(bad.any()):
        return None, errors
    return _mismatch(e, a, bad, errors, atol=atol, rtol=rtol, trial=trial,
                     output_index=output_index), errors


# 64 KiB of fp32: the fast path's working set stays in cache, and each op stays under torch's
# intra-op grain size (32768), so it runs on this thread. Chunks that fan out to every core wait
# at a barrier for each busy core: on the 16-core H200 host, worker processes starting beside
# the evaluator turned a 0.03 s verification of 64 MB into 1.4-2.4 s. One thread: ~0.07 s.
CHUNK_ELEMENTS = 1 << 14


def _all_close_chunked(expected: torch.Tensor, actual: torch.Tensor, *, atol: float, rtol: float
                       ) -> tuple[float, float] | None:
    """(max abs, max rel) error when every element is within tolerance, else None.

    The passing path, in cache-sized chunks with reused buffers: the whole-tensor version
    allocates several output-sized temporaries (page faults on 64 MB outputs cost more than the
    arithmetic). Any failing chunk (NaN included: it compares False) returns None, and the
    caller's full path works out what is wrong."""
    e_flat, a_flat = expected.detach().reshape(-1), actual.detach().reshape(-1)
    n = e_flat.numel()
    if n == 0:
        return 0.0, 0.0
    dtype = torch.float32 if expected.dtype in (torch.float32, torch.float16, torch.bfloat16) \
        else torch.float64
    size = min(n, CHUNK_ELEMENTS)
    diff, e_abs, tol = (torch.empty(size, dtype=dtype) for _ in range(3))
    tiny = torch.finfo(dtype).tiny
    max_abs = max_rel = 0.0
    for start in range(0, n, CHUNK_ELEMENTS):
        e = e_flat[start:start + CHUNK_ELEMENTS].to(dtype)
        a = a_flat[start:start + CHUNK_ELEMENTS].to(dtype)
        k = e.numel()
        d, ea, t = diff[:k], e_abs[:k], tol[:k]
        torch.sub(a, e, out=d).abs_()
        torch.abs(e, out=ea)
        torch.mul(ea, rtol, out=t).add_(atol)
        if not bool(torch.le(d, t).all()):
            return None
        max_abs = max(max_abs, float(d.max()))
        max_rel = max(max_rel, float(d.div_(ea.clamp_min_(tiny)).max()))
    return max_abs, max_rel


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BITWISE_CHUNK_ELEMENTS = 1 << 20


def _bitwise_equal(expected: torch.Tensor, actual: torch.Tensor) -> bool:
    """Same bytes (shape and dtype already agree). Equal bytes pass every check below with zero
    error: NaNs in the same places are accepted there too, and equal infinities. Compared with
    numpy on integer views in 1M-element chunks: one thread (see CHUNK_ELEMENTS), no
    output-sized temporaries, and an early exit at the first differing chunk, so outputs that
    are merely close cost one chunk more."""
    as_int = _SAME_WIDTH_INT.get(expected.element_size())
    if as_int is None or expected.dtype.is_complex:
        return False
    e = expected.detach().contiguous().reshape(-1).view(as_int).numpy()
    a = actual.detach().contiguous().reshape(-1).view(as_int).numpy()
    for start in range(0, e.size, BITWISE_CHUNK_ELEMENTS):
        stop = start + BITWISE_CHUNK_ELEMENTS
        if not (e[start:stop] == a[start:stop]).all():
            return False
    return True


def _structural_mismatch(expected: torch.Tensor, actual: Any, where: str) -> tuple[str, str] | None:
    if not isinstance(actual, torch.Tensor):
        return "dtype", f"{where}: expected a tensor, got {actual!r}"[:300]
    if tuple(actual.shape) != tuple(expected.shape):
        return "shape", f"{where}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return "dtype", (f"{where}: dtype {_dtype(actual)} != expected {_dtype(expected)}; "
                         "return the reference's dtype")
    return None


def _mismatch(e: torch.Tensor, a: torch.Tensor, bad: torch.Tensor, errors: tuple[float, float],
              *, atol: float, rtol: float, trial: int, output_index: int) -> TrialMismatch:
    where = f"trial {trial}, output {output_index}"
    nonfinite = ~torch.isfinite(a) & bad
    reason = "nan_inf" if bool(nonfinite.any()) else "allclose"
    abs_err, rel_err = errors
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
