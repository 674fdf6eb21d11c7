"""Worker stages after the candidate is imported: run (correctness trials), guards, benchmark.

Runs inside the worker process (see ``worker.py``). With defenses on, each trial frees a
same-shaped reference output and poisons free GPU memory right before the candidate runs (so
an uninitialised ``torch.empty`` cannot inherit the reference's answer), and the runtime guards
of ``env/guards.py`` watch the forward. The coverage and stale-output checks run once, not per
timed run, to keep the defended path cheap.
"""

from __future__ import annotations

from typing import Any

from multiminddev.env.candidate import as_output_list, send_tensor_lists
from multiminddev.env.config import EvalConfig, Stage
from multiminddev.env.results import Finding, _to_jsonable


def run_candidate_stages(conn: Any, state: Any, cfg: EvalConfig, problem: Any, ref: Any,
                         module: Any) -> bool:
    """Run, guards, benchmark. Returns True when the worker must exit (fatal CUDA error)."""
    import torch

    from multiminddev.env.worker import _report_exception, timed

    stage = Stage.RUN
    clock = state.timings
    try:
        conn.send(("begin", stage.value))
        torch.manual_seed(cfg.seed)
        with timed(clock, "run.model_init"):
            model_new = module.ModelNew(*ref.init_inputs).cuda().eval()
        outputs, findings = _correctness_trials(state, cfg, ref, model_new)
        with timed(clock, "run.send_outputs"):
            send_tensor_lists(conn, "outputs", outputs, transfer=cfg.tensor_transfer)
        if findings:
            return _reject(conn, stage, findings)
        if state.guards is not None:
            stage = Stage.GUARDS
            conn.send(("begin", stage.value))
            guard_out = _one_off_guards(state, cfg, ref, model_new)
            conn.send(("guards", {"coverage": guard_out["coverage"],
                                  "notes": guard_out["notes"]}))
            if guard_out["findings"]:
                return _reject(conn, stage, guard_out["findings"])
        if cfg.benchmark:
            stage = Stage.BENCHMARK
            conn.send(("begin", stage.value))
            with timed(clock, "benchmark"):
                bench, findings = _benchmark_candidate(state, cfg, problem, ref, model_new)
            conn.send(("benchmark", bench))
            if findings:
                return _reject(conn, stage, findings)
        conn.send(("timings", dict(clock)))
        conn.send(("done", {"notes": state.notes}))
        return False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
        return _report_exception(conn, stage, exc, trusted=False, cap=state.memory_cap)


def _reject(conn: Any, stage: Stage, findings: list[Finding]) -> bool:
    first = findings[0]
    conn.send(("fail", {"kind": "rejected", "stage": stage.value, "reason": first.reason.value,
                        "message": f"runtime check {first.rule}: {first.message}",
                        "findings": [_to_jsonable(f) for f in findings]}))
    return False


def _correctness_trials(state: Any, cfg: EvalConfig, ref: Any, model_new: Any
                        ) -> tuple[list[list[Any]], list[Finding]]:
    import torch

    from multiminddev.env.worker import clone_inputs, timed, to_host

    guards, clock = state.guards, state.timings
    packed: list[list[Any]] = []  # per trial, the outputs copied to the CPU
    findings: list[Finding] = []
    for trial_inputs in ref.trial_inputs:
        inputs = clone_inputs(trial_inputs)
        with torch.no_grad():
            if guards is None:
                with timed(clock, "run.forward"):
                    outs = as_output_list(model_new(*inputs))
                    torch.cuda.synchronize()
            else:
                outs, found = _guarded_forward(guards, ref, model_new, trial_inputs, inputs, clock)
                findings.extend(found)
        with timed(clock, "run.copy_outputs"):
            packed.append([to_host(o, state.pinned_copies) for o in outs])
        del outs
        if findings:
            break
    return packed, findings


def _guarded_forward(guards: Any, ref: Any, model_new: Any, pristine: list[Any],
                     inputs: list[Any], clock: dict[str, float]
                     ) -> tuple[list[Any], list[Finding]]:
    import torch

    from multiminddev.env.worker import clone_inputs, timed

    # A reference output of the same shape is freed right before the candidate runs, then
    # free memory is poisoned: returning torch.empty(...) can no longer pass by luck.
    with timed(clock, "run.poison"):
        freed = as_output_list(ref.model(*clone_inputs(pristine)))
        del freed
        guards.poison_free_cuda_memory()
        snapshot = guards.snapshot_tensors(inputs)
    threads = guards.thread_snapshot()
    compute_guard = guards.TorchComputeGuard()
    with timed(clock, "run.forward"):
        with compute_guard:
            outs = as_output_list(model_new(*inputs))
        found: list[Finding] = list(compute_guard.findings)
        found += guards.check_streams_synchronized()  # before any synchronize: pending side work
        torch.cuda.synchronize()
    with timed(clock, "run.checks"):
        found += guards.check_inputs_unchanged(snapshot, inputs)
        found += guards.check_output_aliasing(inputs, outs)
        found += guards.check_output_types(outs)
        found += guards.check_threads(threads)
        found += sandbox_findings()
    return outs, found


def sandbox_findings() -> list[Finding]:
    """Operations the sandbox refused so far, even ones the candidate caught and hid."""
    try:
        from multiminddev.env import sandbox
    except ImportError:
        return []
    return sandbox.violations() if sandbox.is_installed() else []


def _one_off_guards(state: Any, cfg: EvalConfig, ref: Any, model_new: Any
                    ) -> dict[str, Any]:
    """Once per evaluation: side-stream probe with output re-read, stale-output check (new
    data in the same input buffers), and the share of GPU time in the candidate's kernels."""
    import torch

    from multiminddev.env.worker import clone_inputs, timed

    guards = state.guards
    inputs = clone_inputs(ref.trial_inputs[0])
    notes: list[str] = []

    def run_fn(*args: Any) -> list[Any]:
        with torch.no_grad():
            return as_output_list(model_new(*args))

    def expected_fn(*args: Any) -> list[Any]:
        with torch.no_grad():
            return as_output_list(ref.model(*args))

    with timed(state.timings, "guards.streams"):
        findings = guards.check_streams_synchronized(lambda: run_fn(*inputs))
    if not findings:
        other = clone_inputs(ref.trial_inputs[1]) if len(ref.trial_inputs) > 1 else None
        with timed(state.timings, "guards.stale_output"):
            findings += guards.check_stale_output(run_fn, inputs, expected_fn, new_inputs=other)
    coverage = None
    if not findings:
        with timed(state.timings, "guards.coverage"):
            coverage = _kernel_coverage(guards, cfg, lambda: run_fn(*inputs), notes)
        findings += guards.check_kernel_coverage(coverage, cfg.min_kernel_coverage)
        if coverage is None:
            notes.append("kernel coverage unavailable (no kernel names or no timing data)")
    findings += sandbox_findings()
    return {"findings": findings, "coverage": coverage, "notes": notes}


def _kernel_coverage(guards: Any, cfg: EvalConfig, run: Any, notes: list[str]
                     ) -> float | None:
    """Share of the forward's GPU time in the candidate's own kernels (a measurement: the
    evaluator compares it with ``cfg.min_kernel_coverage`` and decides).

    NVRTC kernels launch through our ``Kernel`` class, so CUDA events around the launches of the
    candidate's own modules (matched by identity) measure it cheaply. The profiler (CUPTI:
    seconds on its first use in a process) is used for ``load_inline`` kernels, which we cannot
    see launch, and to confirm a low event-based figure (events also count launch gaps, so many
    tiny launches look worse than they are); it matches the candidate's kernels by exact
    function name, never by substring."""
    nvrtc, inline = own_kernel_names_by_backend()
    from_events = None if inline else guards.kernel_time_coverage_events(run, own_nvrtc_compiles())
    if from_events is not None and from_events >= cfg.min_kernel_coverage:
        return from_events
    try:
        profiled = guards.kernel_time_coverage(run, sorted({*nvrtc, *inline}))
    except Exception as exc:  # noqa: BLE001 - the profiler is a second opinion, not a must
        notes.append(f"profiler unavailable ({type(exc).__name__}: {exc}"[:200] + ")")
        return from_events
    return profiled if profiled is not None else from_events


def own_nvrtc_compiles() -> list[Any]:
    """The ``CompileResult`` objects of the candidate's successful ``compile_kernels`` calls:
    a launched kernel is the candidate's when its module's result is one of these objects."""
    from multiminddev.cuda import kernels as kernels_mod
    from multiminddev.env.results import StageStatus

    return [r for r in kernels_mod.compile_log if r.status is StageStatus.OK]


def own_kernel_names_by_backend() -> tuple[list[str], list[str]]:
    """Exact names of the kernels this process's candidate compiled: (NVRTC ``extern "C"``
    names from ptxas, load_inline's ``__global__`` function names from its CUDA sources)."""
    from multiminddev.cuda import kernels as kernels_mod
    from multiminddev.env import inline_build

    def names(results: list[Any]) -> list[str]:
        return sorted({k.name for r in results for k in r.kernels})

    return names(kernels_mod.compile_log), names(inline_build.inline_log)


def _benchmark_candidate(state: Any, cfg: EvalConfig, problem: Any, ref: Any, model_new: Any
                         ) -> tuple[dict[str, Any], list[Finding]]:
    import torch

    from multiminddev.env import benchmark as bm
    from multiminddev.env.worker import clone_inputs, timing_plan

    inputs = clone_inputs(ref.trial_inputs[0])
    with torch.no_grad():
        stats = bm.time_cuda(lambda: model_new(*inputs), timing_plan(cfg), state.flush)
    findings: list[Finding] = []
    if state.guards is not None and problem.bytes_moved and state.peak_gbps:
        findings += state.guards.check_impossible_speed(stats.median_ms, problem.bytes_moved,
                                                        state.peak_gbps)
    if state.guards is not None:
        findings += sandbox_findings()
    return {"candidate": bm.stats_to_dict(stats)}, findings
