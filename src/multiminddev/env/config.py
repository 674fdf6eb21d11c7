"""``EvalConfig``: every knob of the evaluation environment, validated on construction.

Default stage time limits keep one evaluation of an NVRTC candidate well under a minute; the
``load_inline`` compat path gets its own, longer build limit because nvcc + ninja take ~50 s.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


class StartMethod(str, enum.Enum):
    """How worker processes start. FORKSERVER forks fresh workers from a server that has
    already imported torch (fast, and CUDA is never initialised before the fork); SPAWN starts
    each from scratch (slowest, most isolated)."""

    FORKSERVER = "forkserver"
    SPAWN = "spawn"


class Isolation(str, enum.Enum):
    """OS-level isolation of each worker process (see env/isolation.py). AUTO: user, mount and
    network namespaces with a read-only view of the filesystem where the kernel allows them,
    else a logged warning and the in-process sandbox alone; NAMESPACES: the same, but a worker
    that cannot get them fails to start (an infrastructure error) instead of running without;
    NONE: off (the in-process sandbox alone)."""

    AUTO = "auto"
    NAMESPACES = "namespaces"
    NONE = "none"


class Stage(str, enum.Enum):
    """Worker stages; each has its own time limit enforced by the parent."""

    SETUP = "setup"  # build the reference Model, inputs and reference outputs
    BASELINE = "baseline"  # time eager and torch.compile reference (trusted code)
    COMPILE = "compile"  # import the candidate (NVRTC compiles happen here)
    RUN = "run"  # correctness trials
    GUARDS = "guards"  # one-off runtime anti-hack checks (streams, stale output, coverage)
    BENCHMARK = "benchmark"  # candidate timing


CANDIDATE_STAGES = (Stage.COMPILE, Stage.RUN, Stage.GUARDS, Stage.BENCHMARK)
TENSOR_TRANSFERS = ("pipe", "memfd")


def default_tensor_transfer() -> str:
    """"memfd" where the OS has memory files (Linux), else "pipe"."""
    return "memfd" if hasattr(os, "memfd_create") else "pipe"


def default_baseline_workers(cpus: int | None = None) -> int:
    """Baseline workers when none are asked for: half the CPU cores, at least 2, at most 8."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 2)
    return max(2, min(8, cpus // 2))


@dataclass(kw_only=True)
class EvalConfig:
    # Concurrency: evaluation slots (one job each); None -> pool.default_slot_count: two per
    # GPU with the timing gate (candidates still take the GPU one at a time), one without.
    num_workers: int | None = None
    max_jobs_per_worker: int = 1  # 1: a fresh process per candidate (no state leaks between them)
    # Started ahead per slot so the next job does not wait for a worker's startup (toolchain
    # and CUDA context, ~0.5 s on an H200 machine; a first CUPTI use, seconds, happens only for
    # candidates that need the profiler). None: 3 per slot with a GPU, 1 without
    # (compile-only workers start fast and CPUs are scarce there).
    spare_workers: int | None = None
    start_method: StartMethod = StartMethod.FORKSERVER
    # Correctness. Inputs are drawn from fresh OS randomness for every evaluation, so a
    # candidate cannot replay them; ``seed`` makes them reproducible for debugging only (a
    # candidate that knows the seed can precompute the answers).
    num_trials: int = 5
    seed: int | None = None
    # Timed calls whose outputs are checked: each timed call gets fresh inputs, and this many
    # of them, at positions drawn at random once the number of calls is fixed, use inputs
    # whose reference outputs the trusted setup computed. A candidate wrong on a fraction f of
    # the calls escapes every check with probability at most (1 - f) ** timed_checks: 25
    # keeps it below 1e-3 for f >= 1/4 (timed_checks.checks_for_escape). Where 25 calls'
    # inputs and outputs exceed timed_check_budget_mib (held on the GPU, sent to and verified
    # by the evaluator), fewer checks among fewer timed calls keep it there
    # (timed_checks.check_plan): 25 up to 40 MiB per call, 8 among 10 calls from 128 MiB.
    timed_checks: int = 25
    timed_check_budget_mib: float = 1024.0
    # Time limits (seconds), enforced by the parent which kills the worker
    timeout_s: float = 60.0  # cap on all candidate stages together (inline builds excluded)
    startup_timeout_s: float = 120.0
    setup_timeout_s: float = 60.0
    baseline_timeout_s: float = 120.0  # first torch.compile of a problem; then cached on disk
    compile_timeout_s: float = 30.0
    inline_build_timeout_s: float = 300.0
    run_timeout_s: float = 20.0
    guards_timeout_s: float = 20.0
    benchmark_timeout_s: float = 30.0
    # Benchmark
    benchmark: bool = True
    warmup_runs: int = 3
    min_timed_runs: int = 10
    max_timed_runs: int = 300
    bench_budget_s: float = 1.0  # per timed function: sets how many calls are timed
    compile_baseline: bool = True  # also time torch.compile(Model) (cached per problem/GPU/torch)
    # The eager figure is a baseline like torch.compile's: measured once per (problem, GPU,
    # torch) and cached, so an evaluation times only its candidate and every candidate of a
    # problem is compared with the same figure. False: every evaluation times eager again.
    reuse_eager_baseline: bool = True
    # Trusted processes that measure baselines ahead of the candidates
    # (``Evaluator.prefetch_baselines``): no candidate code ever loads in them, and while they
    # compile one problem's torch.compile baseline the evaluation slots go on with others.
    # A compile is seconds of one core, so on a cold cache they set the pace when every
    # candidate is of a new problem: half the cores, 2 to 8.
    baseline_workers: int = field(default_factory=default_baseline_workers)
    # How long an evaluation waits, after its own job, for its problem's prefetched
    # torch.compile figure; past it, the result has no torch.compile speedup and says why.
    baseline_wait_s: float = 180.0
    # One GPU, one timing: a baseline is timed only while no candidate code of this evaluator
    # can run on that GPU (a candidate's job holds the GPU's gate from before its candidate
    # loads to its end), so a baseline measured alongside evaluations is not slowed by them.
    timing_gate: bool = True
    cache_dir: str | None = None  # None -> $MULTIMINDDEV_CACHE or ~/.cache/multiminddev
    # Defenses
    defenses: bool = True  # runtime guards (torch-compute, aliasing, stale output, ...)
    sandbox: bool = True  # install the sandbox in the worker before candidate code loads
    min_kernel_coverage: float = 0.5  # own kernels' share of GPU time below this -> rejected
    # Compile target where no GPU is present (None -> sm_90)
    arch: str | None = None
    inline_build_workers: int = 2  # parallel CPU processes building load_inline candidates
    # How output tensors reach the evaluator: "memfd" (written once into an anonymous memory
    # file, sealed, whose descriptor is handed over and closed in the worker; the evaluator maps
    # it, the worker goes on at once; Linux, the default there) or "pipe" (bytes through the
    # worker's pipe; the worker waits until the evaluator has read them: on an H200 machine 0.72 s
    # against memfd's 0.27 s for one problem's reference outputs).
    tensor_transfer: str = field(default_factory=default_tensor_transfer)
    # An infrastructure error (a worker that could not start, a GPU crowded by other processes)
    # says nothing about the candidate: evaluate it again, after a pause that grows per attempt.
    infra_retries: int = 1
    infra_retry_delay_s: float = 2.0
    # GPU memory a candidate may take beyond what its worker holds when it loads: this many times
    # the reference setup's peak, and at least candidate_memory_floor_gib. Without a cap one
    # candidate's wrong-shaped output took 50.8 GiB in a worker and ran two of three trainers
    # sharing an H100 out of memory. None: no cap.
    candidate_memory_factor: float | None = 4.0
    candidate_memory_floor_gib: float = 2.0
    # Precision by error budget (verify.verify_precision): a float32 output's error against a
    # float64 ground truth of the reference may be at most precision_error_multiple times eager
    # PyTorch's own (RMS over the output). Honest float32 kernels measured 0.3-9x eager on
    # 4096-term sums (sequential loops 0.14 * sqrt(n) x: 32 holds them up to n ~ 50,000); TF32
    # or float16 inputs measured 1000x and more, float16/bfloat16 accumulation 70,000x and more.
    precision_check: bool = True
    precision_error_multiple: float = 32.0
    # float16/bfloat16 outputs: the final rounding dominates whatever the accumulation order, so
    # a smaller multiple; 8 still fails a constant output (1024 float16 ulps, 128 bfloat16 ulps).
    precision_half_error_multiple: float = 8.0
    # The largest element error may be this times the RMS multiple times eager's largest error:
    # honest sequential sums measured 1-1.5x their RMS ratio; catches reduced precision used
    # on a small part of the output, which barely moves the RMS.
    precision_max_error_factor: float = 4.0
    # Eager's error counts as at least this many ulps of the output's magnitude (RMS, or max
    # for the max bound): exact ops (relu, copies) have zero eager error, and honest fast-math
    # (__expf, rsqrtf) is a few ulps off.
    precision_floor_ulps: float = 1.0
    # OS-level isolation of workers: namespaces and a read-only filesystem view (AUTO falls back
    # with a warning where the kernel refuses them; `multiminddev doctor` says which is active).
    isolation: Isolation = Isolation.AUTO
    # Size cap of each worker's private /tmp and /dev/shm (memory-backed tmpfs) under isolation.
    isolation_tmpfs_mib: int = 2048

    def __post_init__(self) -> None:
        if isinstance(self.start_method, str) and not isinstance(self.start_method, StartMethod):
            self.start_method = StartMethod(self.start_method)
        if not isinstance(self.isolation, Isolation):
            try:
                self.isolation = Isolation(self.isolation)
            except ValueError:
                raise ValueError(f"isolation={self.isolation!r}: use one of "
                                 f"{[i.value for i in Isolation]}") from None
        _positive_int(self, "isolation_tmpfs_mib")
        _positive_int(self, "num_trials", "max_jobs_per_worker", "min_timed_runs", "max_timed_runs")
        _positive_int(self, "inline_build_workers")
        if not isinstance(self.baseline_workers, int) or self.baseline_workers < 0:
            raise ValueError(f"baseline_workers must be an integer >= 0 (0: each evaluation's "
                             f"worker measures its own baselines), got {self.baseline_workers!r}")
        if self.baseline_wait_s < 0:
            raise ValueError(f"baseline_wait_s must be >= 0 seconds, got {self.baseline_wait_s}")
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 or None (the default per GPU), got {self.num_workers}")
        if (self.spare_workers is not None and self.spare_workers < 0) or self.warmup_runs < 0:
            raise ValueError("spare_workers and warmup_runs must be >= 0")
        for f in fields(self):
            if f.name.endswith("_timeout_s") or f.name in ("timeout_s", "bench_budget_s"):
                if getattr(self, f.name) <= 0:
                    raise ValueError(f"{f.name} must be > 0 seconds, got {getattr(self, f.name)}")
        if self.infra_retries < 0 or self.infra_retry_delay_s < 0:
            raise ValueError("infra_retries and infra_retry_delay_s must be >= 0 (0 retries: "
                             "report an infrastructure error at once)")
        if self.tensor_transfer not in TENSOR_TRANSFERS:
            raise ValueError(f"tensor_transfer={self.tensor_transfer!r}: use one of {TENSOR_TRANSFERS}")
        if self.tensor_transfer == "memfd" and not hasattr(os, "memfd_create"):
            raise ValueError("tensor_transfer='memfd' needs os.memfd_create (Linux); use 'pipe'")
        if self.min_timed_runs > self.max_timed_runs:
            raise ValueError(
                f"min_timed_runs ({self.min_timed_runs}) must be <= max_timed_runs "
                f"({self.max_timed_runs})"
            )
        if self.timed_checks < 1 or self.timed_check_budget_mib <= 0:
            raise ValueError("timed_checks must be >= 1 and timed_check_budget_mib > 0: every "
                             "timing run must check some of its calls' outputs")
        if not 0 <= self.min_kernel_coverage <= 1:
            raise ValueError("min_kernel_coverage is a fraction in [0, 1]")
        if self.candidate_memory_factor is not None and self.candidate_memory_factor <= 0:
            raise ValueError("candidate_memory_factor must be > 0 (times the reference's peak GPU "
                             f"memory), or None for no cap; got {self.candidate_memory_factor}")
        if self.candidate_memory_floor_gib <= 0:
            raise ValueError("candidate_memory_floor_gib must be > 0 GiB, got "
                             f"{self.candidate_memory_floor_gib}")
        for name in ("precision_error_multiple", "precision_half_error_multiple",
                     "precision_max_error_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (a multiple of eager PyTorch's own error), "
                                 f"got {getattr(self, name)}; set precision_check=False to skip "
                                 "the check")
        if self.precision_floor_ulps <= 0:
            raise ValueError("precision_floor_ulps must be > 0 (ulps of the output's magnitude), "
                             f"got {self.precision_floor_ulps}")
        if self.arch is not None and not re.fullmatch(r"sm_\d+[a-z]?", self.arch):
            raise ValueError(f"arch must look like 'sm_90' or 'sm_90a', got {self.arch!r}")
        if self.cache_dir is None:  # resolved once, so the evaluator and its workers agree
            self.cache_dir = str(self.cache_path)

    def stage_timeout(self, stage: Stage) -> float:
        return float(getattr(self, f"{stage.value}_timeout_s"))

    @property
    def cache_path(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir)
        env = os.environ.get("MULTIMINDDEV_CACHE")
        return Path(env) if env else Path.home() / ".cache" / "multiminddev"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start_method"] = self.start_method.value
        data["isolation"] = self.isolation.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _positive_int(cfg: EvalConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
