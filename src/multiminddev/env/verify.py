"""Pure output comparison: reference outputs + candidate outputs + tolerances -> ``VerifyResult``.

Runs in the evaluator's own process on CPU tensors that came back from the worker, so a
candidate cannot influence the comparison. Per trial and output: count, shape, dtype, NaN/Inf
(non-finite where the reference is finite) and ``|a - e| <= atol + rtol * |e|``; a failure
becomes a ``TrialMismatch`` with max abs/rel error, the first bad indices and their values.
Trials after the first failing one are only passed or failed (reason "unexamined"), so the
result's max abs/rel error covers the passing trials and the first failing one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
    first_failure: int | None = None
    for trial, (ref_outs, cand_outs) in enumerate(zip(reference, candidate, strict=True)):
        trial_bad, errors = _compare_trial(trial, ref_outs, cand_outs, atol=atol, rtol=rtol,
                                           first_failure=first_failure)
        if trial_bad and first_failure is None:
            first_failure = trial
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
                   *, atol: float, rtol: float, first_failure: int | None = None
                   ) -> tuple[list[TrialMismatch], list[tuple[float, float]]]:
    """Mismatches of one trial, and (max abs, max rel) error of each comparable output.
    After an earlier failing trial (``first_failure``), failing outputs are not examined."""
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
        mismatch, error = _compare(ref, cand, atol=atol, rtol=rtol, trial=trial, output_index=index,
                                   first_failure=first_failure)
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
             trial: int, output_index: int, first_failure: int | None = None
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
    if first_failure is not None:
        # Pass/fail only: the first failure's report is what agents and users read, and a
        # report costs a full pass over the output (0.4 s per 64 MiB on the CPU machine) where
        # the check above stops at the first bad chunk.
        return TrialMismatch(trial=trial, output_index=output_index, reason="unexamined",
                             message=f"{where}: out of tolerance too (see trial {first_failure} "
                                     "for the details)"), None
    scan = _scan_chunked(expected, actual, atol=atol, rtol=rtol)
    if not scan.bad_count:
        return None, scan.errors
    return _mismatch(expected, actual, scan, atol=atol, rtol=rtol, trial=trial,
                     output_index=output_index), scan.errors


@dataclass
class _Scan:
    """One chunked pass over a failing output: what the mismatch report needs."""

    bad_count: int = 0
    nonfinite_bad: bool = False
    first_bad_flat: list[int] = field(default_factory=list)
    max_abs: float = 0.0
    max_rel: float = 0.0
    any_finite: bool = False

    @property
    def errors(self) -> tuple[float, float]:
        return (self.max_abs, self.max_rel) if self.any_finite else (0.0, 0.0)


def _scan_chunked(expected: torch.Tensor, actual: torch.Tensor, *, atol: float, rtol: float
                  ) -> _Scan:
    """Bad elements (out of tolerance, except NaN where the reference is NaN and equal
    infinities), their count, the first few flat indices, and max abs/rel error over elements
    finite in both, in the same one-thread chunks as the passing path: a whole-tensor version
    took 1.3 s per 64 MiB output on the CPU machine, 6.3 s for a wrong candidate's 5 trials."""
    e_flat, a_flat = expected.detach().reshape(-1), actual.detach().reshape(-1)
    dtype = _working_dtype(expected.dtype)
    tiny = torch.finfo(dtype).tiny
    scan = _Scan()
    for start in range(0, e_flat.numel(), CHUNK_ELEMENTS):
        e = e_flat[start:start + CHUNK_ELEMENTS].to(dtype)
        a = a_flat[start:start + CHUNK_ELEMENTS].to(dtype)
        diff = (a - e).abs_()
        e_abs = e.abs()
        finite = torch.isfinite(e) & torch.isfinite(a)
        if bool(finite.any()):
            scan.any_finite = True
            d = diff[finite]
            scan.max_abs = max(scan.max_abs, float(d.max()))
            scan.max_rel = max(scan.max_rel, float((d / e_abs[finite].clamp_min(tiny)).max()))
        close = diff <= e_abs * rtol + atol  # NaN compares False
        bad = ~close & ~(torch.isnan(e) & torch.isnan(a)) & ~(torch.isinf(e) & (a == e))
        count = int(bad.sum())
        if not count:
            continue
        scan.bad_count += count
        scan.nonfinite_bad = scan.nonfinite_bad or bool((~torch.isfinite(a) & bad).any())
        if len(scan.first_bad_flat) < MAX_REPORTED_INDICES:
            where = torch.nonzero(bad).reshape(-1)[:MAX_REPORTED_INDICES - len(scan.first_bad_flat)]
            scan.first_bad_flat += [start + int(i) for i in where]
    return scan


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
    dtype = _working_dtype(expected.dtype)
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


def _mismatch(expected: torch.Tensor, actual: torch.Tensor, scan: _Scan, *, atol: float,
              rtol: float, trial: int, output_index: int) -> TrialMismatch:
    where = f"trial {trial}, output {output_index}"
    reason = "nan_inf" if scan.nonfinite_bad else "allclose"
    abs_err, rel_err = scan.errors
    shape = tuple(expected.shape) or (1,)
    indices = [[int(i) for i in np.unravel_index(flat, shape)][: expected.dim()]
               for flat in scan.first_bad_flat]
    e_flat, a_flat = expected.reshape(-1), actual.reshape(-1)
    exp_vals = [float(e_flat[flat]) for flat in scan.first_bad_flat]
    act_vals = [float(a_flat[flat]) for flat in scan.first_bad_flat]
    fraction = scan.bad_count / max(1, expected.numel())
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


def _working_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32 and narrower floats (exact upcast), fp64 otherwise: fast on big outputs."""
    return torch.float32 if dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float64


def _working(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(_working_dtype(t.dtype))


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
