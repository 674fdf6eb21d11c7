"""``Evaluator``: the in-process evaluation service (static checks -> worker -> verify -> result).

    with Evaluator(EvalConfig(num_workers=1)) as ev:
        result = ev.evaluate(problem, candidate_source)
        results = ev.evaluate_many([(problem, src), ...])
        future = ev.submit(problem, candidate_source)
        result = await ev.aevaluate(problem, candidate_source)

Every call returns an ``EvalResult`` with a one-line ``message``; nothing a candidate does makes
these raise. Workers start from a forkserver (or spawn), so a script that builds an Evaluator
needs the usual ``if __name__ == "__main__":`` guard. Static checks run here; compilation, execution and timing run in worker processes
(``pool.py``); outputs are verified here (``verify.py``), outside the candidate's process.

Baselines are the evaluator's: the peak bandwidth, eager and torch.compile timings it holds
(memory plus an authenticated disk cache, ``benchmark.TrustedBaselines``) go to each worker in its
job (``job["peak_gbps"]``, ``job["eager_baseline"]``, ``job["compiled_baseline"]``); a worker
measures one only when the job has none, in its trusted stage, and the evaluator stores what came
back in the ("baseline", ...) message, which the pool accepts only before the candidate's code is
imported. ``prefetch_baselines(problems)`` has them measured ahead, by a separate pool of
trusted baseline workers that never load candidate code, while the evaluation slots go on with
other problems; a candidate waits for its own problem's (``EvalConfig.baseline_wait_s``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from multiminddev.core.problem import Problem, load_problem
from multiminddev.env import inline_build
from multiminddev.env.benchmark import BASELINE_FIGURES, TrustedBaselines, figures_to_measure
from multiminddev.env.candidate import CandidateKind, candidate_hash, detect_kind
from multiminddev.env.config import EvalConfig
from multiminddev.env.inline_build_process import InlineBuildLimits
from multiminddev.env.pool import WorkerPool
from multiminddev.env.prefetch import BaselinePrefetch
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    RejectReason,
    StageStatus,
    StaticCheckResult,
)
from multiminddev.env.static_checks import run_static_checks

logger = logging.getLogger(__name__)


class Evaluator:
    def __init__(self, config: EvalConfig | None = None, *,
                 baselines: TrustedBaselines | None = None):
        """``baselines``: the trusted store of figures to use instead of this process's own
        (the Ray evaluation service passes one shared by the cluster); only this evaluator's
        trusted path writes to it."""
        self.config = config or EvalConfig()
        self.pool = WorkerPool(self.config)
        # Two threads per slot: while one runs a job in the slot's worker, the other does the
        # parent's part of the next (static checks, waiting for its baseline) or of the last
        # (verification), so the worker never waits for the parent.
        # Plus one per baseline worker: an evaluation may wait for its problem's prefetched
        # torch.compile figure after its job, and such waits should not keep jobs from slots.
        threads = PARENT_THREADS_PER_SLOT * self.pool.size + self.config.baseline_workers
        self._executor = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mmd-eval")
        self._inline = None
        self._baselines: TrustedBaselines | None = None
        if self.config.benchmark:
            self._baselines = baselines or TrustedBaselines(self.config.cache_path)
        self._baseline_pool: Any = None  # trusted baseline workers, started on first prefetch
        self._prefetch: Any = None  # prefetch.BaselinePrefetch
        self._prefetch_lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ public API

    def evaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        return self.submit(problem, candidate).result()

    def submit(self, problem: Problem | str | Path, candidate: str) -> cf.Future[EvalResult]:
        if self._closed:
            future: cf.Future[EvalResult] = cf.Future()
            future.set_result(_infra_result(problem, candidate, "the evaluator is closed"))
            return future
        return self._executor.submit(self._evaluate_safely, problem, candidate)

    def evaluate_many(self, pairs: Iterable[tuple[Problem | str | Path, str]]) -> list[EvalResult]:
        futures = [self.submit(p, c) for p, c in pairs]
        return [f.result() for f in futures]

    async def aevaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        return await asyncio.wrap_future(self.submit(problem, candidate))

    def prefetch_baselines(self, problems: Iterable[Problem | str | Path], *,
                           wait: bool = False) -> int:
        """Measure the baselines of ``problems`` ahead of their candidates, in this order
        (pass them in the order their candidates will be submitted), each problem once, on
        ``EvalConfig.baseline_workers`` trusted workers that never load candidate code. Figures
        already cached are not measured again. Returns how many problems were newly scheduled;
        0 where nothing is timed (no GPU, ``benchmark=False``, ``baseline_workers=0``).
        ``wait``: return once every one of ``problems``' measurements has ended.

        Call it when no other work (a policy generating, a trainer) computes on these GPUs: the
        timing gate keeps baselines apart from this evaluator's candidates, not from other
        processes, and the figures are cached for every later run."""
        if (self._closed or self._baselines is None or not self.config.baseline_workers
                or not self.pool.gpu_count):
            return 0
        loaded = [p if isinstance(p, Problem) else load_problem(p) for p in problems]
        with self._prefetch_lock:
            if self._prefetch is None:
                config = dataclasses.replace(
                    self.config, num_workers=self.config.baseline_workers, spare_workers=0,
                    max_jobs_per_worker=BASELINE_JOBS_PER_WORKER)
                self._baseline_pool = WorkerPool(config, gates=self.pool.gates)
                self._prefetch = BaselinePrefetch(self._measure_baselines,
                                                  self.config.baseline_workers)
        scheduled = len(self._prefetch.schedule((p.source_hash, p) for p in loaded))
        if wait:
            for problem in loaded:
                self._prefetch.wait(problem.source_hash, None)
        return scheduled

    def _measure_baselines(self, problem: Problem) -> Any:
        """One baseline job on the baseline pool; stores what its trusted stage measured."""
        pool = self._baseline_pool
        job = {"kind": "baseline", "problem": problem.to_dict(), "config": pool._config_dict}
        outcome = pool.run(job, before_send=lambda job, info: self._with_baselines(problem, job,
                                                                                   info))
        self._store_baselines(problem, outcome)
        missed = prefetch_miss(outcome, compile_baseline=self.config.compile_baseline)
        if missed:  # its candidates will measure in their own jobs: say why, once per problem
            logger.warning("prefetched baselines of %s not kept (%s); its candidates measure "
                           "them in their own jobs", problem.name, missed)
        return outcome

    def warm_up(self) -> None:
        """Start the workers now instead of on the first evaluation."""
        self.pool.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._prefetch is not None:
            self._prefetch.close()
        if self._baseline_pool is not None:
            self._baseline_pool.close()
        self.pool.close()
        if self._inline is not None:
            self._inline.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ one evaluation

    def _evaluate_safely(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        """One evaluation; an infrastructure error is retried (``EvalConfig.infra_retries``)."""
        start = time.perf_counter()
        retries = self.config.infra_retries
        for attempt in range(retries + 1):
            try:
                result = self._evaluate(problem, candidate)
            except Exception as exc:  # noqa: BLE001 - our bug must not kill the caller's loop
                result = _infra_result(problem, candidate,
                                       f"evaluator error: {type(exc).__name__}: {exc}")
            if result.status is not EvalStatus.INFRA_ERROR or self._closed or attempt == retries:
                break
            time.sleep(self.config.infra_retry_delay_s * (attempt + 1))
        if result.status is EvalStatus.INFRA_ERROR and attempt:
            result.message = f"{result.message} (after {attempt + 1} attempts)"
        # The evaluation's own time: a wait for a free slot (behind other evaluations) is not.
        result.seconds = time.perf_counter() - start - result.timings.get("parent.wait.slot", 0.0)
        return result

    def _evaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        # env.assemble imports torch; the Evaluator loads without it (the CLI imports it).
        from multiminddev.env.assemble import assemble_result, rejected_by_static

        if not isinstance(problem, Problem):
            problem = load_problem(problem)
        static_start = time.perf_counter()
        static = run_static(candidate, problem, self.config)
        static_seconds = time.perf_counter() - static_start
        if static.rejected:
            return rejected_by_static(problem, candidate, static)
        # inline_libraries: the verified prebuilt load_inline libraries the worker may load
        # (key -> SHA-256); none unless this candidate's were built and checked just now.
        job: dict[str, Any] = {"problem": problem.to_dict(), "candidate": candidate,
                               "config": self.pool._config_dict, "inline_libraries": {}}
        inline_compile = None
        if detect_kind(candidate) is CandidateKind.LOAD_INLINE:
            inline_compile, job = self._prebuild_inline(candidate, job)
            if inline_compile is not None and inline_compile.status is not StageStatus.OK:
                if inline_compile.status is not StageStatus.SKIPPED or self.pool.gpu_count:
                    return _inline_failure(problem, candidate, static, inline_compile)
        waits: dict[str, float] = {}
        sent: list[dict[str, Any]] = []  # the job as the worker got it

        def complete(job: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
            sent.append(self._with_baselines(problem, job, info, waits=waits))
            return sent[-1]

        outcome = self.pool.run(job, before_send=complete)
        if sent and sent[-1].get(BASELINES_PENDING):
            self._add_prefetched_figures(problem, outcome, sent[-1][BASELINES_PENDING], waits)
        result = assemble_result(problem, candidate, static, outcome, self.config, inline_compile)
        self._store_baselines(problem, outcome)
        result.timings.update({"parent.static": round(static_seconds, 4),
                               "parent.wait.baseline": round(waits.get("baseline", 0.0), 4)})
        base = outcome.messages.get("baseline")
        if isinstance(base, dict):  # figures this evaluation's own worker had to measure
            result.timings["baseline.measured_in_job"] = float(len(base.get("measured") or ()))
        return result

    def _with_baselines(self, problem: Problem, job: dict[str, Any], worker_info: dict[str, Any],
                        waits: dict[str, float] | None = None) -> dict[str, Any]:
        """The job plus the cached figures for the worker's GPU (None: the worker measures).

        With ``waits`` (a candidate's job) and the problem's baseline job scheduled, the
        figures that job measures and the store lacks are left to it (``BASELINES_PENDING``):
        the candidate's stages need no baseline, so its job starts at once and the evaluation
        waits for them only after it (``_add_prefetched_figures``), while a torch.compile
        baseline takes seconds to compile. Once that job has ended, whatever it did not keep
        is measured in the candidate's job. A problem whose figures are all cached never waits."""
        if self._baselines is None or not worker_info.get("gpu"):
            return {**job, **dict.fromkeys(BASELINE_FIGURES)}
        gpu_name, torch_version = str(worker_info.get("device", "")), _torch_version()
        figures = self._baselines.figures(problem.source_hash, gpu_name, torch_version,
                                          eager=self.config.reuse_eager_baseline)
        pending = figures_to_measure(figures, compile_baseline=self.config.compile_baseline,
                                     eager=self.config.reuse_eager_baseline)
        if (waits is not None and pending and self._prefetch is not None
                and self._prefetch.pending(problem.source_hash)):
            return {**job, **figures, BASELINES_PENDING: pending}
        return {**job, **figures}

    def _add_prefetched_figures(self, problem: Problem, outcome: Any, pending: list[str],
                                waits: dict[str, float]) -> None:
        """Put the figures left to the problem's baseline job into the job's baseline report
        once that job has ended (at most ``EvalConfig.baseline_wait_s``), read from the trusted
        store, never from the worker. Without the torch.compile figure (torch.compile can fail
        on a model) the report's note says why; without the eager or peak figure the
        evaluation is an infrastructure error, so a retry measures them in its own job."""
        base = outcome.messages.get("baseline")
        if not isinstance(base, dict) or "benchmark" not in outcome.messages:
            return  # the candidate was not timed (it failed first): no figure is compared
        _, waits["baseline"] = self._prefetch.wait(problem.source_hash, self.config.baseline_wait_s)
        stored = self._baselines.figures(problem.source_hash, str(base.get("gpu_name", "")),
                                         str(base.get("torch_version", "")))
        report = dict(base)
        for figure in pending:
            report[REPORT_KEYS[figure]] = stored[figure]
        outcome.messages["baseline"] = report
        lost = [figure for figure in pending if report[REPORT_KEYS[figure]] is None]
        if "compiled_baseline" in lost and not report.get("note"):
            report["note"] = ("torch.compile baseline not measured: the problem's baseline job "
                              "did not keep one (the log says why)")
        if set(lost) - {"compiled_baseline"} and not outcome.infra_error:
            outcome.infra_error = (f"the problem's baseline job did not keep "
                                   f"{', '.join(sorted(set(lost) - {'compiled_baseline'}))} "
                                   "(the log says why); a new attempt measures them itself")

    def _store_baselines(self, problem: Problem, outcome: Any) -> None:
        """Keep what a worker measured in its trusted baseline stage (the pool drops a
        ("baseline", ...) message sent once candidate code had loaded)."""
        base = outcome.messages.get("baseline")
        if self._baselines is None or not isinstance(base, dict):
            return
        gpu_name, torch_version = str(base.get("gpu_name", "")), str(base.get("torch_version", ""))
        ungated = base.get("ungated") or ()  # timed while another process might use the GPU
        if "peak_gbps" not in ungated and self._baselines.peak_gbps(gpu_name, torch_version) is None:
            self._baselines.record_peak_gbps(gpu_name, torch_version, base.get("peak_gbps"))
        if ("eager_baseline" not in ungated and base.get("eager") is not None
                and self._baselines.eager_baseline(problem.source_hash, gpu_name,
                                                   torch_version) is None):
            self._baselines.record_eager_baseline(problem.source_hash, gpu_name, torch_version,
                                                  base["eager"])
        if ("compiled_baseline" not in ungated and base.get("compiled") is not None
                and self._baselines.compiled_baseline(
                problem.source_hash, gpu_name, torch_version) is None):
            self._baselines.record_compiled_baseline(problem.source_hash, gpu_name, torch_version,
                                                     base["compiled"])

    def _prebuild_inline(self, candidate: str, job: dict[str, Any]
                         ) -> tuple[CompileResult | None, dict[str, Any]]:
        """Build load_inline extensions in the CPU build pool before the worker needs them."""
        job = {**job, "compile_timeout_s": self.config.inline_build_timeout_s}
        reason = inline_build.torch_can_build_cuda()
        if reason is not None:
            status = StageStatus.SKIPPED if not self.pool.gpu_count else StageStatus.ERROR
            return CompileResult(status=status, backend="load_inline", error=reason), job
        specs = inline_build.extract_inline_specs(candidate)
        if not specs:  # arguments computed at run time: the worker builds (slow, but works)
            return None, {**job, "allow_inline_build": True}
        result, digests = self.inline_builder().build_verified(specs, self.config.inline_build_timeout_s)
        # The worker loads only libraries with these digests (None: the cache has no usable key,
        # so nothing could be verified; prebuilt libraries then load unchecked).
        return result, {**job, "compile_timeout_s": self.config.compile_timeout_s,
                        "inline_libraries": digests}


    def inline_builder(self) -> inline_build.InlineBuilder:
        """The trusted ``load_inline`` build pool, made on first use; its builds get the
        workers' isolation and the configured time limit."""
        if self._inline is None:
            self._inline = inline_build.InlineBuilder(
                self.config.cache_path, self.config.arch, self.config.inline_build_workers,
                limits=InlineBuildLimits(isolation=self.config.isolation,
                                         wall_seconds=self.config.inline_build_timeout_s))
        return self._inline


def prefetch_miss(outcome: Any, *, compile_baseline: bool) -> str:
    """Why a baseline job left figures unmeasured or unkept ("" when it did not): its worker
    failed, timed out or died, a figure was timed without the gate, or torch.compile failed."""
    if outcome.infra_error:
        return outcome.infra_error
    if outcome.timed_out_stage:
        return f"timed out in {outcome.timed_out_stage}"
    if outcome.died_in_stage:
        return f"the worker died in {outcome.died_in_stage} (exit {outcome.exitcode})"
    if outcome.failure:
        return str(outcome.failure.get("message") or outcome.failure.get("kind"))[:300]
    base = outcome.messages.get("baseline")
    if not isinstance(base, dict):
        return ""  # nothing was missing
    if base.get("ungated"):
        return f"timed without the GPU's timing gate: {', '.join(base['ungated'])}"
    if compile_baseline and base.get("compiled") is None:
        return base.get("note") or "no torch.compile figure"
    return ""


PARENT_THREADS_PER_SLOT = 2
# The figures a candidate's job leaves to its problem's scheduled baseline job (its worker
# measures none of them; the evaluator adds them after the job), and where each goes in the
# worker's ("baseline", ...) report.
BASELINES_PENDING = "baselines_pending"
REPORT_KEYS = {"peak_gbps": "peak_gbps", "eager_baseline": "eager",
               "compiled_baseline": "compiled"}
# Problems one baseline worker measures before it is replaced (a fresh process, about a second
# off the candidates' path, also bounds what a long run's compiled graphs and caches can
# accumulate). Each problem's torch.compile figure is kept in a reused worker because the worker
# compiles in process (``worker._baselines``): 48 of 48 problems on 4 workers, H100, 2026-11-26.
BASELINE_JOBS_PER_WORKER = 16


def _torch_version() -> str:
    import torch

    return torch.__version__


STRUCTURAL_REASONS = (RejectReason.SYNTAX, RejectReason.NO_MODEL_NEW)


def run_static(candidate: str, problem: Problem, config: EvalConfig) -> StaticCheckResult:
    """The static checks (syntax, structure, hack patterns). With ``defenses=False`` only
    structural findings (syntax, no ModelNew) reject; the others are kept as notes."""
    static = run_static_checks(candidate, problem_dtype=problem.dtype)
    if not config.defenses and static.rejected:
        if not any(f.reason in STRUCTURAL_REASONS for f in static.findings):
            static.status = StageStatus.OK
    return static


def _inline_failure(problem: Problem, candidate: str, static: StaticCheckResult,
                    compile_result: CompileResult) -> EvalResult:
    from multiminddev.env.assemble import compile_failure_message

    if compile_result.findings:  # built, but the library imports refused symbols
        first = compile_result.findings[0]
        found = "; ".join(f"{f.rule}: {f.message}" for f in compile_result.findings)
        return EvalResult(status=EvalStatus.REJECTED, problem=problem.name,
                          candidate_hash=candidate_hash(candidate), static=static,
                          compile=compile_result, reject_reason=first.reason,
                          message=f"rejected by library check {found}",
                          device="cpu (build pool)")
    status = {StageStatus.FAILED: EvalStatus.COMPILE_ERROR, StageStatus.TIMEOUT: EvalStatus.TIMEOUT,
              }.get(compile_result.status, EvalStatus.INFRA_ERROR)
    return EvalResult(status=status, problem=problem.name, candidate_hash=candidate_hash(candidate),
                      static=static, compile=compile_result,
                      message=compile_failure_message(compile_result), device="cpu (build pool)")


def _infra_result(problem: Any, candidate: str, message: str) -> EvalResult:
    name = problem.name if isinstance(problem, Problem) else str(problem)
    return EvalResult(status=EvalStatus.INFRA_ERROR, problem=name,
                      candidate_hash=candidate_hash(candidate or ""), message=message,
                      benchmark=BenchmarkResult(status=StageStatus.SKIPPED))
