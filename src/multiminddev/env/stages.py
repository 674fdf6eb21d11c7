"""Worker stages after the candidate is imported: run (correctness trials), guards, benchmark.

Runs inside the worker process (see ``worker.py``). With defenses on, each trial frees
output-sized blocks and poisons free GPU memory right before the candidate runs (so an
uninitialised ``torch.empty`` holds NaN, never an earlier answer), and the runtime guards of
``env/guards.py`` watch the forward. The stream and coverage checks run once. The benchmark
gives every timed call fresh inputs and has the parent verify hidden checked calls among them
(``timed_checks.py``), with the torch-compute guard around every call; the checked calls'
outputs go to the parent with their device layouts, so every rule the trials meet applies.
"""

from __future__ import annotations

from typing import Any

from multiminddev.env.candidate import as_output_list, send_tensor_lists
from multiminddev.env.config import EvalConfig, Stage
from multiminddev.env.messages import ANSWERED_BY, output_byte_limit
from multiminddev.env.results import Finding, RejectReason, _to_jsonable


def run_candidate_stages(conn: Any, state: Any, cfg: EvalConfig, problem: Any, ref: Any,
                         module: Any) -> bool:
    """Run, guards, benchmark. Returns True when the worker must exit (fatal CUDA error)."""
    import torch

    from multiminddev.env.worker import _report_exception, forget_seeds, timed

    stage = Stage.RUN
    clock = state.timings
    try:
        conn.send(("begin", stage.value))
        torch.manual_seed(ref.init_seed)  # the same parameters as the reference's Model
        with timed(clock, "run.model_init"):
            model_new = module.ModelNew(*ref.init_inputs).cuda().eval()
        forget_seeds()
        outputs, layouts, findings = _correctness_trials(state, cfg, ref, model_new)
        with timed(clock, "run.send_outputs"):
            send_tensor_lists(conn, "outputs", outputs, transfer=cfg.tensor_transfer,
                              limit_bytes=_limit(ref, "outputs"))
            conn.send(("output_layouts", {"layouts": layouts}))
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
                bench, checked, findings = _benchmark_candidate(state, cfg, ref, model_new)
            conn.send(("benchmark", bench))
            send_tensor_lists(conn, "timed_outputs", checked, transfer=cfg.tensor_transfer,
                              limit_bytes=_limit(ref, "timed_outputs"))
            if findings:
                return _reject(conn, stage, findings)
        # Once, at the end (a snapshot costs ~50-100 ms): registrations made at import, in
        # __init__ or in any call are all still there.
        if (found := registry_findings(state)):
            return _reject(conn, stage, found)
        conn.send(("timings", dict(clock)))
        conn.send(("done", {"notes": state.notes}))
        return False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
        return _report_exception(conn, stage, exc, trusted=False, cap=state.memory_cap,
                                 gpu=state.gpu)


def _limit(ref: Any, tag: str) -> int:
    """What the evaluator accepts for ``tag``: more would end the job as a protocol breach."""
    return output_byte_limit(ref.sent_bytes.get(ANSWERED_BY[tag], 0))


def registry_findings(state: Any) -> list[Finding]:
    """Operators registered or replaced in the dispatcher since candidate code loaded
    (``torch.library``, a ``load_inline`` library's ``TORCH_LIBRARY``, modes left on)."""
    if state.registry is None:
        return []
    from multiminddev.env import registry_guard

    return registry_guard.changes(state.registry, registry_guard.snapshot())


def _reject(conn: Any, stage: Stage, findings: list[Finding]) -> bool:
    first = findings[0]
    conn.send(("fail", {"kind": "rejected", "stage": stage.value, "reason": first.reason.value,
                        "message": f"runtime check {first.rule}: {first.message}",
                        "findings": [_to_jsonable(f) for f in findings]}))
    return False


def _correctness_trials(state: Any, cfg: EvalConfig, ref: Any, model_new: Any
                        ) -> tuple[list[list[Any]], list[list[Any]], list[Finding]]:
    """Outputs of every trial on the host, their layouts on the GPU (a host copy is always
    dense, so an ``expand()``ed output shows only here), and the guards' findings."""
    import torch

    from multiminddev.env.precision import output_layout
    from multiminddev.env.worker import clone_inputs, timed, to_host

    guards, clock = state.guards, state.timings
    packed: list[list[Any]] = []  # per trial, the outputs copied to the CPU
    layouts: list[list[Any]] = []
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
            layouts.append([lay.to_dict() if (lay := output_layout(o)) is not None else None
                            for o in outs])
            packed.append([to_host(o, state.pinned_copies) for o in outs])
        del outs
        if findings:
            break
    return packed, layouts, findings


def _guarded_forward(guards: Any, ref: Any, model_new: Any, pristine: list[Any],
                     inputs: list[Any], clock: dict[str, float]
                     ) -> tuple[list[Any], list[Finding]]:
    import torch

    from multiminddev.env.worker import timed

    # Blocks the size of the reference's outputs are freed right before the candidate runs,
    # then free memory is poisoned: returning torch.empty(...) gives NaN, never an old answer.
    with timed(clock, "run.poison"):
        freed = [torch.empty(shape, dtype=dtype, device="cuda")
                 for shape, dtype in ref.output_specs if dtype is not None]
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
    """Once per evaluation: side-stream probe with output re-read, and the share of GPU time in
    the candidate's own kernels. (Outputs reused across calls are caught by the benchmark's
    checked calls, which give every call new data.)"""
    import torch

    from multiminddev.env.worker import clone_inputs, timed

    guards = state.guards
    inputs = clone_inputs(ref.trial_inputs[0])
    notes: list[str] = []

    def run_fn(*args: Any) -> list[Any]:
        with torch.no_grad():
            return as_output_list(model_new(*args))

    with timed(state.timings, "guards.streams"):
        findings = guards.check_streams_synchronized(lambda: run_fn(*inputs))
    coverage = None
    if not findings:
        with timed(state.timings, "guards.coverage"):
            coverage = _kernel_coverage(guards, cfg, lambda: run_fn(*inputs), notes)
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


def _benchmark_candidate(state: Any, cfg: EvalConfig, ref: Any, model_new: Any
                         ) -> tuple[dict[str, Any], list[list[Any]], list[Finding]]:
    """Time the candidate on fresh inputs per call with hidden checked calls among them
    (``timed_checks.py``). Returns the timing, the checked calls' outputs on the host (the
    parent verifies them) and findings (torch compute during a timed call, sandbox refusals)."""
    import torch

    from multiminddev.env import benchmark as bm
    from multiminddev.env.timed_checks import CheckedCalls
    from multiminddev.env.worker import timing_plan, to_host

    guard = state.guards.TorchComputeGuard() if state.guards is not None else None

    def forward(args: list[Any]) -> list[Any]:
        with torch.no_grad():
            if guard is None:
                return as_output_list(model_new(*args))
            with guard:  # the same guard as in the correctness trials, around every call
                return as_output_list(model_new(*args))

    calls = CheckedCalls(draw_inputs=ref.draw_inputs, check_inputs=ref.check_inputs,
                         output_specs=ref.output_specs, forward=forward, rng=ref.rng,
                         pool=ref.harness_pool)
    timed_calls = bm.TimedCalls(run=calls.run, prepare=calls.prepare, finish=calls.finish)
    stats = bm.time_calls(timed_calls, timing_plan(cfg, ref.checks), state.flush,
                          on_planned=calls.plan, hold=state.hold)
    torch.cuda.synchronize()
    checked = [[to_host(o, state.pinned_copies) for o in outs] for outs in calls.checked_outputs()]
    layouts = calls.checked_output_layouts()
    calls.release()
    findings: list[Finding] = list(guard.findings) if guard is not None else []
    if calls.posing_calls:
        findings.append(Finding(
            rule="output_type", reason=RejectReason.MONKEY_PATCH,
            message=f"{len(calls.posing_calls)} timed call(s) returned an object that claims to "
                    "be a torch.Tensor without being one (a lazy output computes later, "
                    "untimed); return plain tensors"))
    if state.guards is not None:
        findings += sandbox_findings()
    return ({"candidate": bm.stats_to_dict(stats), "checked_calls": len(checked),
             "checked_layouts": layouts, "timed_layouts": calls.call_layouts}, checked, findings)
