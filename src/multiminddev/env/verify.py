"""Pure output comparison: reference outputs + candidate outputs + tolerances -> ``VerifyResult``.

Runs in the evaluator's own process on CPU tensors that came back from the worker, so a
candidate cannot influence the comparison. Per trial and output: count, shape, dtype, NaN/Inf
(non-finite where the reference is finite) and ``|a - e| <= atol + rtol * |e|``; a failure
becomes a ``TrialMismatch`` with max abs/rel error, the first bad indices and their values.
Trials after the first failing one are only passed or failed (reason "unexamined"), so the
result's max abs/rel error covers the passing trials and the first failing one.

Also here, for every output verified (each trial and each checked timed call):
``verify_precision`` (float32 within a multiple of eager's own error against a float64 ground
truth; float16/bfloat16 by an error normalised by the output's magnitude) on trial 0, and
``verify_precision_scaled`` (the same budget through eager's trial-0 error) on the others; and
``layout_mismatches`` (outputs dense unless the reference's is not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from multiminddev.env.config import EvalConfig
from multiminddev.env.precision import OutputLayout
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
# numpy's elementwise loops and reductions never fan out to other cores, so its chunks can be
# larger: 1 MiB of fp32 (float32 outputs' passing path and the distance from eager).
DISTANCE_CHUNK_ELEMENTS = 1 << 18


def _all_close_chunked(expected: torch.Tensor, actual: torch.Tensor, *, atol: float, rtol: float
                       ) -> tuple[float, float] | None:
    """(max abs, max rel) error when every element is within tolerance, else None.

    The passing path, in cache-sized chunks with reused buffers: the whole-tensor version
    allocates several output-sized temporaries (page faults on 64 MB outputs cost more than the
    arithmetic). Any failing chunk (NaN included: it compares False) returns None, and the
    caller's full path works out what is wrong."""
    if expected.dtype == torch.float32 and actual.dtype == torch.float32:
        return _all_close_float32(expected, actual, atol=atol, rtol=rtol)
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


def _all_close_float32(expected: torch.Tensor, actual: torch.Tensor, *, atol: float,
                       rtol: float) -> tuple[float, float] | None:
    """``_all_close_chunked`` for float32 outputs, through numpy in 1 MiB chunks: numpy's
    elementwise work is single-threaded whatever the chunk size, so the chunks can be larger
    and the per-chunk overhead smaller (about a quarter of the torch chunks' time: every
    checked timed call's output passes here). The same float32 arithmetic and verdicts."""
    e_all = expected.detach().contiguous().reshape(-1).numpy()
    a_all = actual.detach().contiguous().reshape(-1).numpy()
    if e_all.size == 0:
        return 0.0, 0.0
    size = min(e_all.size, DISTANCE_CHUNK_ELEMENTS)
    diff, e_abs, tol = (np.empty(size, dtype=np.float32) for _ in range(3))
    tiny = np.float32(torch.finfo(torch.float32).tiny)
    max_abs = max_rel = 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, which fails below
        for start in range(0, e_all.size, DISTANCE_CHUNK_ELEMENTS):
            e = e_all[start:start + DISTANCE_CHUNK_ELEMENTS]
            a = a_all[start:start + DISTANCE_CHUNK_ELEMENTS]
            d, ea, t = diff[:e.size], e_abs[:e.size], tol[:e.size]
            np.abs(np.subtract(a, e, out=d), out=d)
            np.abs(e, out=ea)
            np.add(np.multiply(ea, np.float32(rtol), out=t), np.float32(atol), out=t)
            if not bool(np.less_equal(d, t).all()):
                return None
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float(np.divide(d, np.maximum(ea, tiny, out=ea), out=d).max()))
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


# ---------------------------------------------------------------------------------------------
# Precision by error budget
# ---------------------------------------------------------------------------------------------
#
# A candidate's error is measured against a float64 ground truth ``g`` of the reference model
# and compared with eager PyTorch's own error against the same ``g``; both as RMS (robust to a
# few outliers) and as max (catches reduced precision in a small part of the output). Measured
# on the CPU machine (units: ulps of the output's RMS, eps(dtype) * rms(g)):
#   honest float32 kernels against torch's cascade sum / BLAS matmul, error / eager's error:
#     sequential per-thread sum of n terms 0.14 * sqrt(n) (9x at 4096, 25x at 32768),
#     32-lane strided + tree 2-4x, pairwise 0.7x, Kahan 0.3x; sequential matmul K=4096 4.5x
#   reduced precision in a float32 problem, error / eager's error (and in RMS ulps):
#     TF32 or float16 inputs to a float32 matmul 1000-1200x (2400 ulps, any K),
#     bfloat16 inputs 8000-9000x, float16 accumulation of 4096 terms 70000x, bfloat16 5e5x
# Eager's error is a few ulps or less when well-conditioned, and 0 for exact ops (relu, copies),
# so the budget is a multiple of the larger of eager's error and ``floor_ulps`` ulps.
# float16/bfloat16 outputs are dominated by their final rounding (~0.3 ulp RMS) whatever the
# order of a float32 accumulation, so their multiple is smaller: with 8, a constant or zero
# output (1024 ulps of float16 RMS, 128 of bfloat16) fails however small its values are.
# Without a ground truth the check falls back to the same idea against eager itself: the RMS of
# ``a - r`` within max(rtol, multiple * floor ulps) of eager's RMS magnitude.

PRECISION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(kw_only=True, frozen=True)
class PrecisionBudget:
    """How far a candidate's error may exceed eager's (see EvalConfig.precision_* for each)."""

    error_multiple: float  # float32 outputs, RMS error
    half_error_multiple: float  # float16 / bfloat16 outputs, RMS error
    max_error_factor: float  # the max-error bound's multiple is this times the RMS one
    floor_ulps: float  # eager's error counts as at least this many ulps of the output

    @classmethod
    def from_config(cls, cfg: EvalConfig) -> PrecisionBudget:
        return cls(error_multiple=cfg.precision_error_multiple,
                   half_error_multiple=cfg.precision_half_error_multiple,
                   max_error_factor=cfg.precision_max_error_factor,
                   floor_ulps=cfg.precision_floor_ulps)

    def multiple(self, dtype: torch.dtype) -> float:
        return self.error_multiple if dtype == torch.float32 else self.half_error_multiple


@dataclass
class ErrorStats:
    """Errors of a candidate ``a`` and of eager ``r`` against a truth ``g``, over the elements
    finite in all three (float64 sums; one chunked pass)."""

    count: int = 0
    candidate_sq: float = 0.0  # sum (a - g)^2
    eager_sq: float = 0.0  # sum (r - g)^2
    truth_sq: float = 0.0  # sum g^2
    candidate_max: float = 0.0  # max |a - g|
    eager_max: float = 0.0
    truth_max: float = 0.0  # max |g|

    def rms(self, total: float) -> float:
        return math.sqrt(total / self.count) if self.count else 0.0

    @property
    def candidate_rms(self) -> float:
        return self.rms(self.candidate_sq)

    @property
    def eager_rms(self) -> float:
        return self.rms(self.eager_sq)

    @property
    def truth_rms(self) -> float:
        return self.rms(self.truth_sq)


def error_stats(truth: torch.Tensor, eager: torch.Tensor, candidate: torch.Tensor) -> ErrorStats:
    """``ErrorStats`` in one pass of one-thread chunks (see CHUNK_ELEMENTS) with reused float64
    buffers; a chunk holding a NaN or Inf is redone without its non-finite elements. No BLAS
    (``torch.dot`` fans out to every core, and waits for busy ones: 2.7 s per 16M elements
    on the loaded CPU machine against 0.15 s this way)."""
    g_flat, r_flat, a_flat = (t.detach().reshape(-1) for t in (truth, eager, candidate))
    n = g_flat.numel()
    stats = ErrorStats()
    if n == 0:
        return stats
    size = min(n, CHUNK_ELEMENTS)
    buffers = tuple(torch.empty(size, dtype=torch.float64) for _ in range(3))
    for start in range(0, n, CHUNK_ELEMENTS):
        stop = min(n, start + CHUNK_ELEMENTS)
        sources = (g_flat[start:stop], r_flat[start:stop], a_flat[start:stop])
        count, sums = stop - start, _chunk_sums(*_chunk_errors(buffers, *sources))
        if not all(math.isfinite(v) for v in sums):
            g, dr, da = _chunk_errors(buffers, *sources)
            finite = torch.isfinite(g) & torch.isfinite(dr) & torch.isfinite(da)
            count = int(finite.sum())
            if not count:
                continue
            sums = _chunk_sums(g[finite], dr[finite], da[finite])
        stats.count += count
        stats.truth_sq += sums[0]
        stats.eager_sq += sums[1]
        stats.candidate_sq += sums[2]
        stats.truth_max = max(stats.truth_max, sums[3])
        stats.eager_max = max(stats.eager_max, sums[4])
        stats.candidate_max = max(stats.candidate_max, sums[5])
    return stats


def _chunk_errors(buffers: tuple[torch.Tensor, ...], g_src: torch.Tensor, r_src: torch.Tensor,
                  a_src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g, r - g and a - g of one chunk in float64, written into the start of ``buffers``."""
    k = g_src.numel()
    g, dr, da = (b[:k] for b in buffers)
    g.copy_(g_src)
    dr.copy_(r_src).sub_(g)
    da.copy_(a_src).sub_(g)
    return g, dr, da


def _chunk_sums(*values: torch.Tensor) -> tuple[float, ...]:
    """Sums of squares, then maxima of absolute values, of each tensor (overwritten)."""
    maxima = [float(v.abs_().max()) for v in values]
    return tuple(float(v.mul_(v).sum()) for v in values) + tuple(maxima)


def verify_precision(
    ground_truth: Sequence[Any] | None,
    reference: Sequence[Any],
    candidate: Sequence[Any],
    *,
    budget: PrecisionBudget,
    rtol: float,
    trial: int = 0,
) -> list[TrialMismatch]:
    """Precision mismatches (reason "precision") of one trial's outputs.

    ``ground_truth[k]``: output ``k`` of the float64 model (``precision.ground_truth_outputs``),
    or ``ground_truth`` None when unavailable; ``reference[k]``: eager's output in the
    problem's dtype; ``candidate[k]``: the candidate's. CPU tensors. Only float32, float16
    and bfloat16 outputs whose shape and dtype match the reference's are judged: anything else
    is ``verify_outputs``' to report. ``rtol`` is the problem's, used only without a truth."""
    found = []
    for index, (ref, cand) in enumerate(zip(reference, candidate)):
        if not (isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor)):
            continue
        if ref.dtype not in PRECISION_DTYPES or cand.dtype != ref.dtype or cand.shape != ref.shape:
            continue
        truth = ground_truth[index] if ground_truth is not None and index < len(ground_truth) else None
        if isinstance(truth, torch.Tensor) and truth.shape == ref.shape:
            mismatch = _budget_mismatch(error_stats(truth, ref, cand), ref.dtype, budget,
                                        trial=trial, output_index=index)
        else:
            mismatch = _normwise_mismatch(ref, cand, budget, rtol=rtol, trial=trial,
                                          output_index=index)
        if mismatch is not None:
            found.append(mismatch)
    return found


# Outputs without a float64 ground truth of their own (trials after the first, the checked
# timed calls) are held to the same budget through eager's error on trial 0, relative to the
# output's magnitude: an honest candidate's distance from eager is at most its own error plus
# eager's (triangle inequality). Eager's error differs between input draws, so its trial-0
# figure counts EAGER_SPREAD times over: the RMS error of an output of thousands of elements
# moves by a few percent between draws, and small outputs meet the floor of one ulp. TF32 in a
# float32 matmul is 1000x eager's error on randn inputs, ~95x on non-negative ones (measured
# on the CPU machine), against the 41x this allows.
EAGER_SPREAD = 1.25


@dataclass(kw_only=True, frozen=True)
class EagerErrorScale:
    """Eager's error against the float64 truth of one output, relative to the truth's
    magnitude (RMS error / RMS truth, max error / max truth)."""

    rms_ratio: float
    max_ratio: float


def eager_error_scales(ground_truth: Sequence[Any] | None, reference: Sequence[Any]
                       ) -> list[EagerErrorScale | None]:
    """Per output of trial 0: eager's relative error against the float64 ground truth, or
    None where there is no usable truth (then ``verify_precision_scaled`` falls back to the
    magnitude-normalised comparison)."""
    scales: list[EagerErrorScale | None] = []
    for index, ref in enumerate(reference):
        truth = ground_truth[index] if ground_truth is not None and index < len(ground_truth) else None
        usable = (isinstance(ref, torch.Tensor) and isinstance(truth, torch.Tensor)
                  and ref.dtype in PRECISION_DTYPES and truth.shape == ref.shape)
        if not usable:
            scales.append(None)
            continue
        stats = error_stats(truth, ref, ref)
        scales.append(EagerErrorScale(
            rms_ratio=stats.eager_rms / stats.truth_rms if stats.truth_rms else 0.0,
            max_ratio=stats.eager_max / stats.truth_max if stats.truth_max else 0.0))
    return scales


def verify_precision_scaled(
    scales: Sequence[EagerErrorScale | None],
    reference: Sequence[Any],
    candidate: Sequence[Any],
    *,
    budget: PrecisionBudget,
    rtol: float,
    trial: int = 0,
) -> list[TrialMismatch]:
    """Precision mismatches (reason "precision") of outputs with no ground truth of their own:
    the candidate's distance from eager ``r`` must be within the budget of
    ``verify_precision`` applied to eager's error estimated from ``scales`` (trial 0's), plus
    that estimate. Outputs without a scale get the magnitude-normalised comparison."""
    found = []
    for index, (ref, cand) in enumerate(zip(reference, candidate)):
        if not (isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor)):
            continue
        if ref.dtype not in PRECISION_DTYPES or cand.dtype != ref.dtype or cand.shape != ref.shape:
            continue
        if _bitwise_equal(ref, cand):  # eager's own bits: zero distance, nothing to judge
            continue
        scale = scales[index] if index < len(scales) else None
        if scale is None:
            mismatch = _normwise_mismatch(ref, cand, budget, rtol=rtol, trial=trial,
                                          output_index=index)
        else:
            mismatch = _scaled_mismatch(distance_stats(ref, cand), scale, ref.dtype, budget,
                                        trial=trial, output_index=index)
        if mismatch is not None:
            found.append(mismatch)
    return found


def distance_stats(reference: torch.Tensor, candidate: torch.Tensor) -> ErrorStats:
    """``error_stats(reference, reference, candidate)`` (the candidate's distance from eager
    and eager's magnitude) in one pass. Float32 outputs go through numpy in 1 MiB chunks
    (single-threaded like the torch chunks, with float64 sums, a quarter of their time: this
    pass runs on every checked timed call); a chunk with a NaN or Inf, and other dtypes, take
    ``error_stats``."""
    if reference.dtype != torch.float32 or candidate.dtype != torch.float32:
        return error_stats(reference, reference, candidate)
    r_all = reference.detach().contiguous().reshape(-1).numpy()
    a_all = candidate.detach().contiguous().reshape(-1).numpy()
    stats = ErrorStats()
    size = min(r_all.size, DISTANCE_CHUNK_ELEMENTS)
    distance, scratch = np.empty(size, dtype=np.float32), np.empty(size, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite chunks: error_stats
        for start in range(0, r_all.size, DISTANCE_CHUNK_ELEMENTS):
            r = r_all[start:start + DISTANCE_CHUNK_ELEMENTS]
            a = a_all[start:start + DISTANCE_CHUNK_ELEMENTS]
            d, q = distance[:r.size], scratch[:r.size]
            np.abs(np.subtract(a, r, out=d), out=d)
            d_max = float(d.max())
            d_sq = float(np.add.reduce(np.multiply(d, d, out=q), dtype=np.float64))
            r_max = float(np.abs(r, out=q).max())
            r_sq = float(np.add.reduce(np.multiply(r, r, out=q), dtype=np.float64))
            if not all(math.isfinite(v) for v in (d_max, d_sq, r_max, r_sq)):
                chunk = error_stats(*(torch.from_numpy(x) for x in (r, r, a)))
                d_max, d_sq, r_max, r_sq = (chunk.candidate_max, chunk.candidate_sq,
                                            chunk.truth_max, chunk.truth_sq)
                count = chunk.count
            else:
                count = r.size
            stats.count += count
            stats.candidate_sq += d_sq
            stats.truth_sq += r_sq
            stats.candidate_max = max(stats.candidate_max, d_max)
            stats.truth_max = max(stats.truth_max, r_max)
    return stats


def scaled_allowance(stats: ErrorStats, scale: EagerErrorScale, dtype: torch.dtype,
                     budget: PrecisionBudget) -> tuple[float, float]:
    """(allowed RMS, allowed max) distance from eager for an output whose magnitudes are in
    ``stats`` (truth = eager), given eager's relative error ``scale`` on trial 0 (pure)."""
    eps, tiny = torch.finfo(dtype).eps, _error_floor(dtype)
    multiple = budget.multiple(dtype)
    eager_rms = EAGER_SPREAD * scale.rms_ratio * stats.truth_rms
    eager_max = EAGER_SPREAD * scale.max_ratio * stats.truth_max
    allowed_rms = multiple * max(eager_rms, budget.floor_ulps * eps * stats.truth_rms, tiny)
    allowed_max = (multiple * budget.max_error_factor
                   * max(eager_max, budget.floor_ulps * eps * stats.truth_max, tiny))
    return allowed_rms + eager_rms, allowed_max + eager_max


def _scaled_mismatch(stats: ErrorStats, scale: EagerErrorScale, dtype: torch.dtype,
                     budget: PrecisionBudget, *, trial: int, output_index: int
                     ) -> TrialMismatch | None:
    allowed_rms, allowed_max = scaled_allowance(stats, scale, dtype, budget)
    if stats.candidate_rms <= allowed_rms and stats.candidate_max <= allowed_max:
        return None
    use_rms = stats.candidate_rms > allowed_rms
    measure = "RMS" if use_rms else "largest"
    distance = stats.candidate_rms if use_rms else stats.candidate_max
    allowed = allowed_rms if use_rms else allowed_max
    relative = stats.candidate_rms / stats.truth_rms if stats.truth_rms else math.inf
    where, name = f"trial {trial}, output {output_index}", str(dtype).removeprefix("torch.")
    if relative > WRONG_VALUES_FRACTION:
        what = "is wrong, not merely imprecise: compute every element"
    else:
        what = ("computes in reduced precision; do the arithmetic and accumulate in float32 "
                "(no TF32, float16 or bfloat16 inputs or accumulators)" if dtype == torch.float32
                else "computes in reduced precision; accumulate in float32 and round once")
        what += "" if use_rms else " (in part of the output)"
    message = (f"{where}: your {name} output {what} ({measure} distance from eager PyTorch "
               f"{distance:.3g}, allowed {allowed:.3g}: the float64 error budget of trial 0 "
               f"applied to this output; RMS distance {relative:.3g} of its RMS magnitude)")
    return TrialMismatch(trial=trial, output_index=output_index, reason="precision",
                         max_abs_error=stats.candidate_max, max_rel_error=relative,
                         message=message)


def _budget_mismatch(stats: ErrorStats, dtype: torch.dtype, budget: PrecisionBudget, *,
                     trial: int, output_index: int) -> TrialMismatch | None:
    eps, tiny = torch.finfo(dtype).eps, _error_floor(dtype)
    multiple = budget.multiple(dtype)
    allowed_rms = multiple * max(stats.eager_rms, budget.floor_ulps * eps * stats.truth_rms, tiny)
    allowed_max = (multiple * budget.max_error_factor
                   * max(stats.eager_max, budget.floor_ulps * eps * stats.truth_max, tiny))
    if stats.candidate_rms <= allowed_rms and stats.candidate_max <= allowed_max:
        return None
    use_rms = stats.candidate_rms > allowed_rms
    measure = "RMS" if use_rms else "largest"
    cand_err = stats.candidate_rms if use_rms else stats.candidate_max
    eager_err = stats.eager_rms if use_rms else stats.eager_max
    allowed = allowed_rms if use_rms else allowed_max
    relative = stats.candidate_rms / stats.truth_rms if stats.truth_rms else math.inf
    where, name = f"trial {trial}, output {output_index}", str(dtype).removeprefix("torch.")
    times = (f"{_times(cand_err / eager_err)} eager PyTorch's" if eager_err else
             "above eager PyTorch's (exact here)")
    facts = (f"{measure} error against a float64 ground truth {cand_err:.3g}, eager's "
             f"{eager_err:.3g}, allowed {allowed:.3g}; RMS error {relative:.3g} of the output's "
             f"RMS magnitude {stats.truth_rms:.3g}")
    if relative > WRONG_VALUES_FRACTION:
        message = (f"{where}: your {name} output is wrong, not merely imprecise ({facts}): "
                   "small outputs can pass the per-element atol while being wrong; compute "
                   "every element")
    else:
        fix = ("do the arithmetic and accumulate in float32 (no TF32, float16 or bfloat16 inputs "
               "or accumulators)" if dtype == torch.float32 else
               "accumulate in float32 and round to the output dtype once, at the end")
        part = "" if use_rms else " in part of the output"
        message = (f"{where}: your {name} kernel's error is {times} ({facts}): it computes in "
                   f"reduced precision{part}; {fix}")
    return TrialMismatch(trial=trial, output_index=output_index, reason="precision",
                         max_abs_error=stats.candidate_max, max_rel_error=relative,
                         message=message)


def _times(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def _error_floor(dtype: torch.dtype) -> float:
    """The smallest error worth telling apart from none: the spacing of the dtype's subnormals
    (``tiny * eps``). Not ``tiny`` itself: float16's smallest normal, 6.1e-5, is the size of
    every output of a 16384-wide softmax, so a floor there would excuse any error at all."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


# RMS error above this fraction of the RMS magnitude: the values are wrong, not imprecise (the
# message says so). 5% is ~400,000 float32 ulps, 50 float16 ulps, 6 bfloat16 ulps.
WRONG_VALUES_FRACTION = 0.05


def _normwise_mismatch(reference: torch.Tensor, candidate: torch.Tensor, budget: PrecisionBudget,
                       *, rtol: float, trial: int, output_index: int) -> TrialMismatch | None:
    """Without a ground truth: the RMS of ``a - r`` must be within max(rtol, multiple * floor
    ulps) of eager's RMS magnitude (not a bare atol, which a constant passes on small outputs)."""
    stats = error_stats(reference, reference, candidate)
    dtype = reference.dtype
    limit = max(rtol, budget.multiple(dtype) * budget.floor_ulps * torch.finfo(dtype).eps)
    allowed = limit * stats.truth_rms
    if stats.candidate_rms <= max(allowed, _error_floor(dtype)):
        return None
    relative = stats.candidate_rms / stats.truth_rms if stats.truth_rms else math.inf
    where = f"trial {trial}, output {output_index}"
    message = (f"{where}: RMS difference from eager PyTorch {stats.candidate_rms:.3g} is "
               f"{relative:.3g} of the output's RMS magnitude {stats.truth_rms:.3g} (allowed "
               f"{limit:.3g}): values are wrong or computed in reduced precision; compute every "
               "element, with float32 arithmetic and accumulation")
    return TrialMismatch(trial=trial, output_index=output_index, reason="precision",
                         max_abs_error=stats.candidate_max, max_rel_error=relative,
                         message=message)


# ---------------------------------------------------------------------------------------------
# Dense outputs
# ---------------------------------------------------------------------------------------------


def layout_mismatches(reference: Sequence[OutputLayout | None],
                      candidate: Sequence[OutputLayout | None], *, trial: int = 0
                      ) -> list[TrialMismatch]:
    """Mismatches (reason "layout") for candidate outputs that are not dense (an ``expand()``ed
    stride-0 tensor, an overlapping or gapped view) where the reference's output is dense: such
    an output stores fewer values than it claims, or points at memory it did not write.
    Layouts come from ``precision.output_layout`` on the device; None for non-tensors."""
    found = []
    for index, (ref, cand) in enumerate(zip(reference, candidate)):
        if ref is None or cand is None or cand.dense or not ref.dense:
            continue
        zero = [d for d, (size, st) in enumerate(zip(cand.shape, cand.stride)) if st == 0 and size > 1]
        what = (f"stride 0 in dim(s) {zero}: an expand()ed or broadcast view" if zero else
                "overlapping or with gaps: a strided view of a buffer")
        found.append(TrialMismatch(
            trial=trial, output_index=index, reason="layout",
            message=(f"trial {trial}, output {index}: the output is not dense (shape "
                     f"{list(cand.shape)}, stride {list(cand.stride)}; {what}) while the "
                     "reference's is; allocate the full output (torch.empty(shape)) and have "
                     "your kernel write every element")))
    return found
