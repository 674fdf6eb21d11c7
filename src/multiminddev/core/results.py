"""Result dataclasses for every evaluation stage.

Every stage returns one of these with a status enum; user errors never raise and no stage
returns ``None``. All results are JSON-serialisable through ``to_dict`` / ``from_dict`` so they
cross process boundaries (worker -> evaluator -> Ray) and land in episode JSONL unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any


class EvalStatus(str, enum.Enum):
    """Overall outcome of evaluating one candidate."""

    OK = "ok"  # compiled, correct on every trial, timed
    INCORRECT = "incorrect"  # ran but outputs differ from the reference
    COMPILE_ERROR = "compile_error"  # NVRTC / nvcc / Python syntax failure
    RUNTIME_ERROR = "runtime_error"  # raised, faulted (illegal address, segfault) or OOM
    TIMEOUT = "timeout"  # a stage ran past its time limit (hang, infinite loop)
    REJECTED = "rejected"  # static or runtime anti-hack check refused it
    NO_GPU = "no_gpu"  # static + compile done; nothing could run on this machine
    INFRA_ERROR = "infra_error"  # our fault, not the candidate's: worker failed to start, ...


class StageStatus(str, enum.Enum):
    """Outcome of one stage."""

    OK = "ok"
    FAILED = "failed"  # the candidate's fault (see the stage's error fields)
    SKIPPED = "skipped"  # not reached, or not possible here (no GPU)
    TIMEOUT = "timeout"
    ERROR = "error"  # infrastructure error


class RejectReason(str, enum.Enum):
    """Machine-readable reason codes for rejected candidates, one per hack class."""

    SYNTAX = "syntax"
    NO_MODEL_NEW = "no_model_new"
    NO_KERNEL = "no_kernel"  # no kernel defined or none launched
    TORCH_COMPUTE = "torch_compute"  # torch ops doing the work in forward
    REFERENCE_USE = "reference_use"  # uses / inherits the reference Model
    TRY_EXCEPT_FALLBACK = "try_except_fallback"
    CONCURRENCY = "concurrency"  # threads, processes, side streams, events, graphs
    MONKEY_PATCH = "monkey_patch"  # patching torch / time / the harness
    FILE_ACCESS = "file_access"
    POINTER_CACHE = "pointer_cache"  # caching outputs keyed by data pointers
    FORBIDDEN_IMPORT = "forbidden_import"
    SANDBOX_VIOLATION = "sandbox_violation"  # audit hook refused an operation
    INPUT_MUTATION = "input_mutation"
    OUTPUT_ALIASING = "output_aliasing"
    STALE_OUTPUT = "stale_output"  # same outputs for new inputs at same addresses
    UNSYNCED_STREAM = "unsynced_stream"
    THREAD_LEAK = "thread_leak"
    LOW_KERNEL_COVERAGE = "low_kernel_coverage"  # its kernels don't account for the GPU time
    IMPOSSIBLE_SPEED = "impossible_speed"  # faster than the roofline floor
    PRECISION_DOWNGRADE = "precision_downgrade"
    ENCODING = "encoding"  # the candidate file is not UTF-8 text: bad input, not a hack
    OTHER = "other"


@dataclass(kw_only=True)
class Finding:
    """One static or runtime check finding (a rule, where, and why)."""

    rule: str
    reason: RejectReason
    message: str
    line: int | None = None


@dataclass(kw_only=True)
class StaticCheckResult:
    status: StageStatus
    findings: list[Finding] = field(default_factory=list)
    candidate_kind: str = "unknown"  # "nvrtc" | "load_inline" | "unknown"

    @property
    def rejected(self) -> bool:
        return self.status is StageStatus.FAILED


@dataclass(kw_only=True)
class Diagnostic:
    """One compiler message with its source line (line numbers are of the CUDA source)."""

    severity: str  # "error" | "warning"
    message: str
    line: int | None = None


@dataclass(kw_only=True)
class KernelResources:
    """ptxas resource usage of one kernel."""

    name: str
    registers: int = 0
    shared_mem_bytes: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    barriers: int = 0


@dataclass(kw_only=True)
class CompileResult:
    status: StageStatus
    backend: str = "nvrtc"  # "nvrtc" | "load_inline"
    arch: str = ""
    seconds: float = 0.0
    cached: bool = False
    log: str = ""
    diagnostics: list[Diagnostic] = field(default_factory=list)
    kernels: list[KernelResources] = field(default_factory=list)
    error: str = ""
    # Refusals found in what was built (a load_inline library's imported symbols): the
    # candidate is rejected with these, not reported as a compile error.
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


@dataclass(kw_only=True)
class TrialMismatch:
    """Readable summary of one failed correctness trial."""

    trial: int
    output_index: int
    reason: str  # "shape" | "dtype" | "nan_inf" | "allclose" | "count" | "unexamined" (a
    # trial after the first failing one: pass/fail only, see verify_outputs) | "precision"
    # (error beyond a multiple of eager's against a float64 truth) | "layout" (not dense)
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatched_fraction: float = 0.0
    first_bad_indices: list[list[int]] = field(default_factory=list)
    expected_values: list[float] = field(default_factory=list)
    actual_values: list[float] = field(default_factory=list)
    message: str = ""


@dataclass(kw_only=True)
class VerifyResult:
    status: StageStatus
    trials_run: int = 0
    trials_passed: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatches: list[TrialMismatch] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    # Hidden checked calls among the timed ones (every timed call had fresh inputs).
    timed_checks_run: int = 0
    timed_checks_passed: int = 0
    # Probability that a candidate wrong on a quarter of its timed calls passes every checked
    # one (hypergeometric over the timed calls; env/timed_checks.escape_probability). None
    # where no timing ran.
    timed_check_escape: float | None = None

    @property
    def pass_rate(self) -> float:
        return self.trials_passed / self.trials_run if self.trials_run else 0.0


@dataclass(kw_only=True)
class TimingStats:
    """Per-run times in milliseconds, from CUDA events with an L2 flush before each run."""

    median_ms: float = 0.0
    mean_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    std_ms: float = 0.0
    iqr_ms: float = 0.0
    runs: int = 0

    @property
    def relative_spread(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0


@dataclass(kw_only=True)
class BenchmarkResult:
    status: StageStatus
    candidate: TimingStats = field(default_factory=TimingStats)
    eager: TimingStats = field(default_factory=TimingStats)
    compiled: TimingStats | None = None  # torch.compile baseline; None when disabled/failed
    speedup_vs_eager: float = 0.0
    speedup_vs_compile: float | None = None
    bytes_moved: int | None = None
    achieved_gbps: float | None = None
    peak_gbps: float | None = None
    fraction_of_peak: float | None = None
    custom_kernel_time_fraction: float | None = None
    gpu_name: str = ""
    torch_version: str = ""
    error: str = ""
    seconds: float = 0.0


@dataclass(kw_only=True)
class EvalResult:
    """Everything known about one candidate on one problem."""

    status: EvalStatus
    problem: str
    candidate_hash: str = ""
    static: StaticCheckResult = field(
        default_factory=lambda: StaticCheckResult(status=StageStatus.SKIPPED)
    )
    compile: CompileResult = field(default_factory=lambda: CompileResult(status=StageStatus.SKIPPED))
    verify: VerifyResult = field(default_factory=lambda: VerifyResult(status=StageStatus.SKIPPED))
    benchmark: BenchmarkResult = field(
        default_factory=lambda: BenchmarkResult(status=StageStatus.SKIPPED)
    )
    reject_reason: RejectReason | None = None
    message: str = ""  # one line for humans: what happened and what to do
    worker_restarted: bool = False
    seconds: float = 0.0
    device: str = ""  # what it was measured on ("NVIDIA H100 80GB HBM3", "cpu (compile only)")
    # Where the seconds went: "stage.<stage>" as the parent saw it, "worker.<step>" measured in
    # the worker (reference setup, poisoning, forward, output copies, guards...), "parent.verify".
    timings: dict[str, float] = field(default_factory=dict)
    # Evaluation services it was sent to: more than 1 when the one running it was lost (a Ray
    # evaluation actor or its node died) and it ran again on another; ``message`` says so.
    attempts: int = 1

    @property
    def compiled(self) -> bool:
        return self.compile.status is StageStatus.OK

    @property
    def correct(self) -> bool:
        return self.status is EvalStatus.OK

    @property
    def speedup(self) -> float:
        return self.benchmark.speedup_vs_eager if self.correct else 0.0

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        return _from_jsonable(cls, data)


def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:  # NaN is not JSON
        return None
    return obj


_NESTED = {
    "static": StaticCheckResult,
    "compile": CompileResult,
    "verify": VerifyResult,
    "benchmark": BenchmarkResult,
    "findings": Finding,
    "diagnostics": Diagnostic,
    "kernels": KernelResources,
    "mismatches": TrialMismatch,
    "candidate": TimingStats,
    "eager": TimingStats,
    "compiled": TimingStats,
}
# Enum fields by class: a key alone does not say (Finding.reason is a RejectReason,
# TrialMismatch.reason a plain string such as "allclose").
_ENUMS: dict[tuple[type, str], type[enum.Enum]] = {
    (Finding, "reason"): RejectReason,
    (EvalResult, "reject_reason"): RejectReason,
}


def _from_jsonable(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in names:
            continue
        if key == "status" and value is not None:
            value = (EvalStatus if cls is EvalResult else StageStatus)(value)
        elif (cls, key) in _ENUMS and value is not None:
            value = _ENUMS[(cls, key)](value)
        elif key in _NESTED and value is not None:
            sub = _NESTED[key]
            if isinstance(value, list):
                value = [_from_jsonable(sub, v) for v in value]
            else:
                value = _from_jsonable(sub, value)
        kwargs[key] = value
    return cls(**kwargs)
