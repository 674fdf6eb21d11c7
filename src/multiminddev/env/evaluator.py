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

Baselines are the evaluator's: the peak bandwidth and torch.compile timings it holds (memory
plus an authenticated disk cache, ``benchmark.TrustedBaselines``) go to each worker in its job
(``job["peak_gbps"]``, ``job["compiled_baseline"]``); a worker measures one only when the job has
none, in its trusted stage, and the evaluator stores what came back in the ("baseline", ...)
message, which the pool accepts only before the candidate's code is imported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from multiminddev.core.problem import Problem, load_problem
from multiminddev.env.benchmark import TrustedBaselines
from multiminddev.env.candidate import CandidateKind, candidate_hash, detect_kind
from multiminddev.env.config import EvalConfig
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    RejectReason,
    StageStatus,
    StaticCheckResult,
)


class Evaluator:
    def __init__(self, config: EvalConfig | None = None, *,
                 baselines: TrustedBaselines | None = None):
        """``baselines``: the trusted store of figures to use instead of this process's own
        (the Ray evaluation service passes one shared by the cluster); only this evaluator's
        trusted path writes to it."""
        from multiminddev.env.pool import WorkerPool

        self.config = config or EvalConfig()
        self.pool = WorkerPool(self.config)
        self._executor = cf.ThreadPoolExecutor(max_workers=self.pool.size,
                                               thread_name_prefix="mmd-eval")
        self._inline = None
        self._baselines: TrustedBaselines | None = None
        if self.config.benchmark:
            self._baselines = baselines or TrustedBaselines(self.config.cache_path)
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

    def warm_up(self) -> None:
        """Start the workers now instead of on the first evaluation."""
        self.pool.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
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
        result.seconds = time.perf_counter() - start
        return result

    def _evaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        from multiminddev.env.assemble import assemble_result, rejected_by_static

        if not isinstance(problem, Problem):
            problem = load_problem(problem)
        static = run_static(candidate, problem, self.config)
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
        outcome = self.pool.run(
            job, before_send=lambda job, info: self._with_baselines(problem, job, info))
        result = assemble_result(problem, candidate, static, outcome, self.config, inline_compile)
        self._store_baselines(problem, outcome)
        return result

    def _with_baselines(self, problem: Problem, job: dict[str, Any], worker_info: dict[str, Any]
                        ) -> dict[str, Any]:
        """The job plus the cached figures for the worker's GPU (None: the worker measures)."""
        peak, compiled = None, None
        if self._baselines is not None and worker_info.get("gpu"):
            gpu_name, torch_version = str(worker_info.get("device", "")), _torch_version()
            peak = self._baselines.peak_gbps(gpu_name, torch_version)
            compiled = self._baselines.compiled_baseline(problem.source_hash, gpu_name,
                                                         torch_version)
        return {**job, "peak_gbps": peak, "compiled_baseline": compiled}

    def _store_baselines(self, problem: Problem, outcome: Any) -> None:
        """Keep what a worker measured in its trusted baseline stage (the pool drops a
        ("baseline", ...) message sent once candidate code had loaded)."""
        base = outcome.messages.get("baseline")
        if self._baselines is None or not isinstance(base, dict):
            return
        gpu_name, torch_version = str(base.get("gpu_name", "")), str(base.get("torch_version", ""))
        if self._baselines.peak_gbps(gpu_name, torch_version) is None:
            self._baselines.record_peak_gbps(gpu_name, torch_version, base.get("peak_gbps"))
        if (base.get("compiled") is not None and self._baselines.compiled_baseline(
                problem.source_hash, gpu_name, torch_version) is None):
            self._baselines.record_compiled_baseline(problem.source_hash, gpu_name, torch_version,
                                                     base["compiled"])

    def _prebuild_inline(self, candidate: str, job: dict[str, Any]
                         ) -> tuple[CompileResult | None, dict[str, Any]]:
        """Build load_inline extensions in the CPU build pool before the worker needs them."""
        from multiminddev.env import inline_build

        job = {**job, "compile_timeout_s": self.config.inline_build_timeout_s}
        reason = inline_build.torch_can_build_cuda()
        if reason is not None:
            status = StageStatus.SKIPPED if not self.pool.gpu_count else StageStatus.ERROR
            return CompileResult(status=status, backend="load_inline", error=reason), job
        specs = inline_build.extract_inline_specs(candidate)
        if not specs:  # arguments computed at run time: the worker builds (slow, but works)
            return None, {**job, "allow_inline_build": True}
        if self._inline is None:
            self._inline = inline_build.InlineBuilder(
                self.config.cache_path, self.config.arch, self.config.inline_build_workers)
        result, digests = self._inline.build_verified(specs, self.config.inline_build_timeout_s)
        # The worker loads only libraries with these digests (None: the cache has no usable key,
        # so nothing could be verified; prebuilt libraries then load unchecked).
        return result, {**job, "compile_timeout_s": self.config.compile_timeout_s,
                        "inline_libraries": digests}


def _torch_version() -> str:
    import torch

    return torch.__version__


STRUCTURAL_REASONS = (RejectReason.SYNTAX, RejectReason.NO_MODEL_NEW)


def run_static(candidate: str, problem: Problem, config: EvalConfig) -> StaticCheckResult:
    """The static checks (syntax, structure, hack patterns). With ``defenses=False`` only
    structural findings (syntax, no ModelNew) reject; the others are kept as notes."""
    from multiminddev.env.static_checks import run_static_checks

    static = run_static_checks(candidate, problem_dtype=problem.dtype)
    if not config.defenses and static.rejected:
        if not any(f.reason in STRUCTURAL_REASONS for f in static.findings):
            static.status = StageStatus.OK
    return static


def _inline_failure(problem: Problem, candidate: str, static: StaticCheckResult,
                    compile_result: CompileResult) -> EvalResult:
    from multiminddev.env.assemble import compile_failure_message

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
