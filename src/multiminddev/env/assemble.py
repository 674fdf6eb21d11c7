"""Turn what a worker reported (``JobOutcome``) into one ``EvalResult`` with a readable message.

Precedence: a forged trusted message, then a runtime anti-hack rejection, then wrong outputs
(incorrect), then the rejections decided here (kernel coverage, impossible speed), then the first
failure (compile error, runtime error, timeout, death), then ok. Verification happens here,
in the evaluator's process, from the reference outputs the worker sent before the candidate
was imported. So do the coverage and roofline decisions: the worker only reports its numbers
(coverage fraction, median time); the thresholds, the problem's bytes and the peak bandwidth
(from the evaluator's own cache, or measured before the candidate loaded) are the parent's.
"""

from __future__ import annotations

import math
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

from multiminddev.core.problem import Problem
from multiminddev.env.candidate import candidate_hash, unpack_tensor
from multiminddev.env.config import EvalConfig, Stage
from multiminddev.env.guards import check_impossible_speed, check_kernel_coverage
from multiminddev.env.pool import JobOutcome
from multiminddev.env.precision import OutputLayout
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    Finding,
    RejectReason,
    StageStatus,
    StaticCheckResult,
    TimingStats,
    TrialMismatch,
    VerifyResult,
    _from_jsonable,
)
from multiminddev.env.timed_checks import ESCAPE_FRACTION, escape_probability
from multiminddev.env.verify import (
    PrecisionBudget,
    eager_error_scales,
    layout_mismatches,
    verify_outputs,
    verify_precision,
    verify_precision_scaled,
)

_FAILURE_STATUS = {
    "compile_error": EvalStatus.COMPILE_ERROR,
    "runtime_error": EvalStatus.RUNTIME_ERROR,
    "no_gpu": EvalStatus.NO_GPU,
    "rejected": EvalStatus.REJECTED,
    "infra_error": EvalStatus.INFRA_ERROR,
}
_TRUSTED_STAGES = (Stage.SETUP.value, Stage.BASELINE.value)


def rejected_by_static(problem: Problem, candidate: str, static: StaticCheckResult) -> EvalResult:
    first = static.findings[0] if static.findings else Finding(
        rule="static", reason=RejectReason.OTHER, message="static checks failed")
    where = f" (line {first.line})" if first.line else ""
    return EvalResult(
        status=EvalStatus.REJECTED, problem=problem.name, candidate_hash=candidate_hash(candidate),
        static=static, reject_reason=first.reason,
        message=f"rejected by static check {first.rule}{where}: {first.message}",
    )


def assemble_result(problem: Problem, candidate: str, static: StaticCheckResult,
                    outcome: JobOutcome, cfg: EvalConfig,
                    inline_compile: CompileResult | None = None) -> EvalResult:
    result = EvalResult(status=EvalStatus.OK, problem=problem.name,
                        candidate_hash=candidate_hash(candidate), static=static,
                        device=outcome.device, worker_restarted=outcome.worker_restarted)
    if outcome.infra_error and not outcome.messages:
        result.status, result.message = EvalStatus.INFRA_ERROR, outcome.infra_error
        return result
    result.compile = _compile_result(outcome, inline_compile)
    verify_start = time.perf_counter()
    result.verify = _verify(problem, outcome, cfg)
    result.timings = timing_breakdown(outcome, time.perf_counter() - verify_start)
    result.benchmark = _benchmark(problem, outcome, cfg)
    status, message, reason = _overall(result, outcome, cfg)
    result.status, result.message, result.reject_reason = status, message, reason
    return result


def timing_breakdown(outcome: JobOutcome, verify_seconds: float) -> dict[str, float]:
    """Stage times seen by the parent, the worker's own sub-step times (a diagnostic the
    candidate could in principle forge: never used for rewards), the parent's waits (for a
    slot, a ready worker, the GPU's timing gate) and the parent's comparison."""
    timings = {f"stage.{name}": round(sec, 4) for name, sec in outcome.stages_seconds.items()}
    worker = outcome.messages.get("timings")
    if isinstance(worker, dict):
        timings.update({f"worker.{name}": round(float(sec), 4) for name, sec in worker.items()
                        if isinstance(name, str) and isinstance(sec, (int, float))})
    timings.update({f"parent.wait.{name}": round(sec, 4) for name, sec in outcome.waits.items()})
    timings.update({f"worker_startup.{name}": round(sec, 4)
                    for name, sec in outcome.worker_startup.items()})
    timings["parent.verify"] = round(verify_seconds, 4)
    return timings


def _compile_result(outcome: JobOutcome, inline_compile: CompileResult | None) -> CompileResult:
    payload = outcome.messages.get("compile")
    if payload is None:
        return inline_compile or CompileResult(status=StageStatus.SKIPPED)
    result: CompileResult = _from_jsonable(CompileResult, payload["result"])
    if inline_compile is not None and inline_compile.status is StageStatus.OK:
        # The worker only loaded the library; the build time is the build pool's.
        result.seconds += inline_compile.seconds
        result.cached = inline_compile.cached
        result.log = inline_compile.log or result.log
    return result


def _verify(problem: Problem, outcome: JobOutcome, cfg: EvalConfig) -> VerifyResult:
    ref, cand = outcome.messages.get("reference"), outcome.messages.get("outputs")
    atol, rtol = problem.tolerances
    if ref is None or cand is None:
        return VerifyResult(status=StageStatus.SKIPPED, atol=atol, rtol=rtol)
    start = time.perf_counter()
    reference, candidate = _unpacked(ref), _unpacked(cand)
    if len(candidate) < len(reference):  # a runtime rejection stopped the trials early
        reference = reference[: len(candidate)]
    result = verify_outputs(reference, candidate, atol=atol, rtol=rtol)
    if result.status is StageStatus.OK:
        rules = OutputRules.from_outcome(outcome, cfg, reference, rtol=rtol)
        _verify_layout_and_precision(result, outcome, rules, reference, candidate)
        if result.status is StageStatus.OK:
            _verify_timed_checks(result, outcome, rules, atol=atol, rtol=rtol)
    # Time spent running the trials in the worker plus comparing here.
    result.seconds = outcome.stages_seconds.get(Stage.RUN.value, 0.0) + time.perf_counter() - start
    return result


def _verify_layout_and_precision(result: VerifyResult, outcome: JobOutcome, rules: OutputRules,
                                 reference: list[list[Any]], candidate: list[list[Any]]) -> None:
    """Outputs within tolerance must also be dense where the reference's are, and within the
    precision budget: trial 0 against the float64 ground truth, every other trial through
    eager's error on trial 0 (``OutputRules``; in place)."""
    cand_layouts = (outcome.messages.get("output_layouts") or {}).get("layouts") or []
    found = rules.layout_mismatches(cand_layouts, label="trial")
    for trial in range(len(candidate) if not found else 0):
        found = rules.precision_mismatches(reference[trial], candidate[trial], trial=trial,
                                           own_truth=trial == 0)
        if found:
            break
    if found:
        result.status = StageStatus.FAILED
        result.mismatches.extend(found)
        result.error = found[0].message


@dataclass(frozen=True)
class OutputRules:
    """The rules every verified output meets besides the tolerance (density where the
    reference's output is dense, the precision budget), with what they need from the
    worker's trusted setup: the reference layouts, trial 0's float64 ground truth and eager's
    relative error on it."""

    cfg: EvalConfig
    rtol: float
    reference_layouts: list[Any] | None
    truth: list[Any] | None  # trial 0's float64 outputs, None: unavailable
    scales: list[Any]  # verify.EagerErrorScale per output (None: no truth for it)

    @classmethod
    def from_outcome(cls, outcome: JobOutcome, cfg: EvalConfig, reference: list[list[Any]], *,
                     rtol: float) -> OutputRules:
        ref_layouts = (outcome.messages.get("reference_layouts") or {}).get("layouts")
        truth_message = outcome.messages.get("ground_truth")
        truth = _unpacked(truth_message)[0] if truth_message else None
        scales = eager_error_scales(truth, reference[0]) if cfg.precision_check and reference else []
        return cls(cfg=cfg, rtol=rtol, truth=truth, scales=scales,
                   reference_layouts=_layouts(ref_layouts) if ref_layouts is not None else None)

    def layout_mismatches(self, layouts_per_call: list[Any], *, label: str
                          ) -> list[TrialMismatch]:
        """The first non-dense outputs, by call (``label`` names a call in messages)."""
        if self.reference_layouts is None:
            return []
        for call, layouts in enumerate(layouts_per_call):
            found = layout_mismatches(self.reference_layouts, _layouts(layouts or []), trial=call)
            if found:
                return [_relabel(m, label) for m in found]
        return []

    def precision_mismatches(self, reference: list[Any], candidate: list[Any], *, trial: int,
                             own_truth: bool, label: str = "trial") -> list[TrialMismatch]:
        if not self.cfg.precision_check:
            return []
        budget = PrecisionBudget.from_config(self.cfg)
        if own_truth:
            found = verify_precision(self.truth, reference, candidate, budget=budget,
                                     rtol=self.rtol, trial=trial)
        else:
            found = verify_precision_scaled(self.scales, reference, candidate, budget=budget,
                                            rtol=self.rtol, trial=trial)
        return [_relabel(m, label) for m in found]


def _relabel(mismatch: TrialMismatch, label: str) -> TrialMismatch:
    """The mismatch with its message naming a ``label`` (e.g. "timed check") for "trial"."""
    if label != "trial" and mismatch.message.startswith("trial "):
        mismatch.message = label + mismatch.message[len("trial"):]
    return mismatch


def _layouts(items: list[Any]) -> list[Any]:
    return [OutputLayout.from_dict(d) if isinstance(d, dict) else None for d in items]


def _unpacked(message: dict[str, Any]) -> list[list[Any]]:
    return [[unpack_tensor(p) for p in trial] for trial in message["outputs"]]


def _verify_timed_checks(result: VerifyResult, outcome: JobOutcome, rules: OutputRules, *,
                         atol: float, rtol: float) -> None:
    """Verify the outputs of the hidden checked calls among the timed ones (in place): the
    tolerance, dtype and shape, density and the precision budget, as for the trials. Every
    check the timing planned must come back: min(planned checks, timed calls); the escape
    probability at a quarter of wrong calls is recorded."""
    bench, sent = outcome.messages.get("benchmark"), outcome.messages.get("timed_outputs")
    planned = outcome.messages.get("timed_reference")
    if bench is None or planned is None:
        return  # no timing ran (benchmark off, or a failure first): nothing to check
    expected = _unpacked(planned)
    runs = int((bench.get("candidate") or {}).get("runs", 0))
    want = min(len(expected), runs)
    got = _unpacked(sent) if sent is not None else []
    result.timed_checks_run = want
    result.timed_check_escape = escape_probability(runs, want, ESCAPE_FRACTION)
    if len(got) != want:
        _fail_timed(result, f"{want} checked timed calls were planned, {len(got)} came back")
        return
    layouts = bench.get("checked_layouts")
    if rules.reference_layouts is not None and (not isinstance(layouts, list)
                                                or len(layouts) != want):
        _fail_timed(result, f"{want} checked timed calls ran, the layouts of "
                            f"{len(layouts) if isinstance(layouts, list) else 0} came back")
        return
    if rules.reference_layouts is not None and not _layout_lists(bench.get("timed_layouts")):
        _fail_timed(result, f"{runs} timed calls ran, no layout of theirs came back")
        return
    timed = verify_outputs(expected[:want], got, atol=atol, rtol=rtol)
    result.timed_checks_passed = timed.trials_passed
    result.max_abs_error = max(result.max_abs_error, timed.max_abs_error)
    result.max_rel_error = max(result.max_rel_error, timed.max_rel_error)
    if timed.status is not StageStatus.OK:
        result.mismatches.extend(timed.mismatches)
        _fail_timed(result, timed.error.replace("trial", "timed check", 1))
        return
    found = rules.layout_mismatches(layouts or [], label="timed check")
    if not found:  # the distinct layouts of every timed call, checked or not
        found = rules.layout_mismatches(_layout_lists(bench.get("timed_layouts")),
                                        label="timed call")
    for call in range(want if not found else 0):
        found = rules.precision_mismatches(expected[call], got[call], trial=call,
                                           own_truth=False, label="timed check")
        if found:
            break
    if found:
        result.timed_checks_passed = 0
        result.mismatches.extend(found)
        _fail_timed(result, found[0].message)


def _layout_lists(value: Any) -> list[Any]:
    """The worker's per-call layout lists, or none where the message carries no list."""
    return [item for item in value if isinstance(item, list)] if isinstance(value, list) else []


def _fail_timed(result: VerifyResult, detail: str) -> None:
    result.status = StageStatus.FAILED
    result.error = (f"a timed call returned a wrong result ({detail}): every call gets new "
                    "inputs, so compute the answer on every call, with no caching")


def _benchmark(problem: Problem, outcome: JobOutcome, cfg: EvalConfig) -> BenchmarkResult:
    base, bench = outcome.messages.get("baseline"), outcome.messages.get("benchmark")
    if not cfg.benchmark:
        return BenchmarkResult(status=StageStatus.SKIPPED, error="benchmark disabled")
    if base is None or bench is None:
        return BenchmarkResult(status=StageStatus.SKIPPED)
    cand = _from_jsonable(TimingStats, bench["candidate"])
    if base.get("eager") is None:  # its baseline job kept none (outcome.infra_error says so)
        return BenchmarkResult(status=StageStatus.ERROR, candidate=cand,
                               error="no eager baseline to compare with")
    eager = _from_jsonable(TimingStats, base["eager"])
    compiled = _from_jsonable(TimingStats, base["compiled"]) if base.get("compiled") else None
    result = BenchmarkResult(
        status=StageStatus.OK, candidate=cand, eager=eager, compiled=compiled,
        gpu_name=base.get("gpu_name", ""), torch_version=base.get("torch_version", ""),
        peak_gbps=base.get("peak_gbps"), bytes_moved=problem.bytes_moved, error=base.get("note", ""),
        seconds=outcome.stages_seconds.get(Stage.BENCHMARK.value, 0.0)
        + outcome.stages_seconds.get(Stage.BASELINE.value, 0.0),
    )
    if cand.median_ms > 0:
        result.speedup_vs_eager = eager.median_ms / cand.median_ms
        if compiled is not None and compiled.median_ms > 0:
            result.speedup_vs_compile = compiled.median_ms / cand.median_ms
        if problem.bytes_moved:
            result.achieved_gbps = problem.bytes_moved / (cand.median_ms * 1e-3) / 1e9
            if result.peak_gbps:
                result.fraction_of_peak = result.achieved_gbps / result.peak_gbps
    result.custom_kernel_time_fraction = reported_coverage(outcome)
    return result


def _overall(result: EvalResult, outcome: JobOutcome, cfg: EvalConfig
             ) -> tuple[EvalStatus, str, RejectReason | None]:
    failure = outcome.failure or {}
    if outcome.refused_message:
        return _refused_message(result, outcome)
    if outcome.late_trusted:
        return _forged_messages(result, outcome.late_trusted)
    late = failure.get("stage") in (Stage.GUARDS.value, Stage.BENCHMARK.value)
    if failure.get("kind") == "rejected" and not (late and result.verify.status is StageStatus.FAILED):
        # A wrong kernel also "fails" the once-per-evaluation checks (stale output compares
        # with the reference); then incorrect is the explanation, not a hack.
        reason = RejectReason(failure.get("reason", RejectReason.OTHER.value))
        _mark_stage(result, failure.get("stage", ""), StageStatus.FAILED, failure.get("message", ""))
        return EvalStatus.REJECTED, f"rejected: {failure.get('message', '')}", reason
    if result.verify.status is StageStatus.FAILED:
        return EvalStatus.INCORRECT, f"incorrect: {result.verify.error}; fix the kernel so its " \
            "outputs match the reference", None
    decided = parent_findings(result, outcome, cfg) if cfg.defenses else []
    if decided:
        stage, finding = decided[0]
        message = f"runtime check {finding.rule}: {finding.message}"
        _mark_stage(result, stage.value, StageStatus.FAILED, message)
        return EvalStatus.REJECTED, f"rejected: {message}", finding.reason
    if outcome.timed_out_stage:
        return _timeout(result, outcome, cfg)
    if outcome.died_in_stage:
        return _death(result, outcome)
    if failure:
        return _failure(result, failure)
    if outcome.infra_error:
        return EvalStatus.INFRA_ERROR, outcome.infra_error, None
    if "done" not in outcome.messages:
        return EvalStatus.INFRA_ERROR, "the worker stopped without a result", None
    return EvalStatus.OK, _ok_message(result), None


def parent_findings(result: EvalResult, outcome: JobOutcome, cfg: EvalConfig
                    ) -> list[tuple[Stage, Finding]]:
    """The rejections the evaluator decides from the worker's reported numbers, with the
    stage each belongs to: own-kernel share of GPU time below ``cfg.min_kernel_coverage``
    (LOW_KERNEL_COVERAGE), then a median below the roofline floor of the problem's bytes at the
    peak bandwidth (IMPOSSIBLE_SPEED)."""
    found = [(Stage.GUARDS, f) for f in check_kernel_coverage(
        reported_coverage(outcome), cfg.min_kernel_coverage)]
    bench = result.benchmark
    if bench.status is StageStatus.OK and bench.candidate.runs:
        found += [(Stage.BENCHMARK, f) for f in check_impossible_speed(
            bench.candidate.median_ms, bench.bytes_moved, bench.peak_gbps)]
        wall = outcome.stages_seconds.get(Stage.BENCHMARK.value)
        found += [(Stage.BENCHMARK, f) for f in check_timing_within_wall_clock(
            bench.candidate, wall)]
    return found


WALL_CLOCK_SLACK_S = 0.05  # clock granularity and message latency


def check_timing_within_wall_clock(stats: TimingStats, wall_s: float | None) -> list[Finding]:
    """The timed calls' GPU time the worker reports (mean x runs) cannot exceed the benchmark
    stage's duration on the evaluator's own clock. This bounds a reported figure from above
    only: a figure forged downward is kept out by the timer being out of the candidate's reach
    (static allowlist, OS isolation), not by any clock the parent can read."""
    if wall_s is None or not stats.runs:
        return []
    reported_s = stats.mean_ms * stats.runs / 1000.0
    if reported_s <= wall_s + WALL_CLOCK_SLACK_S:
        return []
    return [Finding(rule="timing_wall_clock", reason=RejectReason.MONKEY_PATCH,
                    message=f"the worker reported {reported_s:.3f} s of timed GPU work in a "
                            f"benchmark stage that lasted {wall_s:.3f} s on the evaluator's "
                            "clock: the timing was tampered with")]


def reported_coverage(outcome: JobOutcome) -> float | None:
    """The worker's own-kernel time fraction; None when it sent none or not a fraction."""
    value = (outcome.messages.get("guards") or {}).get("coverage")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def _refused_message(result: EvalResult, outcome: JobOutcome
                     ) -> tuple[EvalStatus, str, RejectReason | None]:
    """A frame that was not a plain-data message (``env/messages.py``). The harness sends only
    plain data, so once the candidate loaded the frame is its code writing on the evaluator's
    pipe, which nothing inside the sandbox can do; before that, the worker itself is broken."""
    if not outcome.refused_after_load:
        return (EvalStatus.INFRA_ERROR, "the evaluation worker sent a message outside the "
                f"protocol before the candidate loaded: {outcome.refused_message}", None)
    _mark_stage(result, Stage.RUN.value, StageStatus.FAILED, "message outside the protocol")
    return (EvalStatus.REJECTED, "rejected: the candidate's process wrote its own frame on the "
            f"evaluator's pipe ({outcome.refused_message}); candidate code may not reach the "
            "evaluator", RejectReason.SANDBOX_VIOLATION)


def _forged_messages(result: EvalResult, tags: list[str]
                     ) -> tuple[EvalStatus, str, RejectReason]:
    """Only the worker's trusted stages send these tags, all before the candidate loads; one
    that arrives later came from the candidate's process, trying to rewrite the evidence."""
    _mark_stage(result, Stage.RUN.value, StageStatus.FAILED, "forged evaluator messages")
    names = ", ".join(sorted(set(tags)))
    return (EvalStatus.REJECTED, f"rejected: the candidate's process sent the evaluator's own "
            f"{names} message(s) after the candidate loaded (an attempt to forge the result)",
            RejectReason.MONKEY_PATCH)


def _timeout(result: EvalResult, outcome: JobOutcome, cfg: EvalConfig
             ) -> tuple[EvalStatus, str, None]:
    stage = outcome.timed_out_stage or ""
    if stage in _TRUSTED_STAGES:
        return (EvalStatus.INFRA_ERROR, f"the reference problem ran past the {stage} time limit; "
                f"raise EvalConfig.{stage}_timeout_s or shrink the problem", None)
    where = _candidate_frame(outcome.hang_stack)
    _mark_stage(result, stage, StageStatus.TIMEOUT, f"ran past the {stage} time limit"
                + (f"; stack when killed:\n{outcome.hang_stack}" if outcome.hang_stack else ""))
    at = f" at {where}" if where else ""
    return (EvalStatus.TIMEOUT, f"timed out in {stage}{at} (hang or infinite loop?); the worker "
            "was killed and replaced; make sure every kernel and loop terminates", None)


def _candidate_frame(stack: str) -> str:
    """The innermost frame of the candidate's own file in a faulthandler dump ('' if none)."""
    frames = [line.strip() for line in stack.splitlines() if "mmd_candidate_" in line]
    if not frames:
        return ""
    match = re.search(r'line (\d+) in (\S+)', frames[0])
    return f"candidate line {match.group(1)} ({match.group(2)})" if match else ""


def _death(result: EvalResult, outcome: JobOutcome) -> tuple[EvalStatus, str, None]:
    stage = outcome.died_in_stage or ""
    how = _exit_description(outcome.exitcode)
    if stage in _TRUSTED_STAGES:
        return EvalStatus.INFRA_ERROR, f"the worker died in {stage} ({how}) running the reference", None
    _mark_stage(result, stage, StageStatus.FAILED, f"worker process died ({how})")
    return (EvalStatus.RUNTIME_ERROR, f"the worker process died in {stage} ({how}): a crash in "
            "the candidate's host or device code; the worker was replaced", None)


def _failure(result: EvalResult, failure: dict[str, Any]) -> tuple[EvalStatus, str, None]:
    status = _FAILURE_STATUS.get(failure.get("kind", ""), EvalStatus.INFRA_ERROR)
    message = failure.get("message", "")
    stage = failure.get("stage", "")
    if status is EvalStatus.COMPILE_ERROR:
        return status, compile_failure_message(result.compile, message), None
    if status is EvalStatus.NO_GPU:
        return status, _no_gpu_message(result), None
    _mark_stage(result, stage, StageStatus.FAILED if status is EvalStatus.RUNTIME_ERROR
                else StageStatus.ERROR, message)
    if status is EvalStatus.RUNTIME_ERROR:
        if failure.get("traceback"):
            result.verify.error = result.verify.error or failure["traceback"][-2000:]
        return status, f"runtime error in {message}; fix the error and resubmit", None
    return status, message, None


def _mark_stage(result: EvalResult, stage: str, status: StageStatus, error: str) -> None:
    if stage == Stage.COMPILE.value:
        if result.compile.status in (StageStatus.OK, StageStatus.SKIPPED) and status is StageStatus.TIMEOUT:
            result.compile.status, result.compile.error = status, error
    elif stage in (Stage.RUN.value, Stage.GUARDS.value):
        if result.verify.status is StageStatus.SKIPPED:
            result.verify.status, result.verify.error = status, error
    elif stage == Stage.BENCHMARK.value:
        result.benchmark.status, result.benchmark.error = status, error


def _exit_description(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def compile_failure_message(compile_result: CompileResult, fallback: str = "") -> str:
    errors = compile_result.errors
    if errors:
        first = errors[0]
        where = f"line {first.line}" if first.line else "an unknown line"
        more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
        return (f"compile error ({compile_result.backend}) at {where}: {first.message}{more}; "
                "fix the CUDA source")
    if compile_result.status is StageStatus.SKIPPED:
        return f"compile skipped: {compile_result.error}"
    detail = compile_result.error.strip().splitlines()[0] if compile_result.error.strip() else ""
    return fallback or f"compile failed ({compile_result.backend}): {detail or 'see compile.log'}"


def _no_gpu_message(result: EvalResult) -> str:
    c = result.compile
    if c.status is StageStatus.OK:
        what = (f"compiled {len(c.kernels)} kernel(s) for {c.arch} in {c.seconds:.2f} s"
                f"{' (cached)' if c.cached else ''}")
    elif c.status is StageStatus.SKIPPED:
        what = f"compile skipped ({c.error})" if c.error else "nothing compiled"
    else:
        what = f"compile {c.status.value}"
    return (f"{what}; no GPU on this machine, so correctness and speed were not measured; "
            "run on a GPU machine for the full evaluation")


def _ok_message(result: EvalResult) -> str:
    v, b = result.verify, result.benchmark
    text = f"correct on {v.trials_passed}/{v.trials_run} trials"
    if b.status is StageStatus.OK:
        text += (f"; {b.speedup_vs_eager:.2f}x vs eager ({b.candidate.median_ms:.4g} ms vs "
                 f"{b.eager.median_ms:.4g} ms)")
        if b.speedup_vs_compile is not None:
            text += f", {b.speedup_vs_compile:.2f}x vs torch.compile"
        if b.fraction_of_peak is not None and math.isfinite(b.fraction_of_peak):
            text += f", {b.fraction_of_peak:.0%} of peak bandwidth"
    else:
        text += " (not timed)"
    return text
