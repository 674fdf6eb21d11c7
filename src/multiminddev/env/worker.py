"""The evaluation worker: a separate process that runs one untrusted candidate per job.

Protocol (parent -> worker over a ``multiprocessing`` Pipe): a job dict, or ``None`` to exit.
Worker -> parent: ``(tag, payload)`` tuples; ``("begin", stage)`` starts a stage whose time limit
the parent enforces by killing the process. Per job, in order:

1. setup (trusted): exec the problem; draw every seed from OS randomness (``EvalConfig.seed``
   only for reproducible debugging); build ``Model`` and ``get_init_inputs()``; draw the
   correctness trials' inputs and the hidden checked timed calls' inputs; compute their
   reference outputs and SEND them before any candidate code is imported. Baselines (eager,
   torch.compile) are timed here too. Then the reference model and outputs are dropped, the
   freed GPU memory is poisoned and torch is reseeded from OS randomness: nothing of the
   reference stays in the candidate's reach.
2. compile: install the sandbox, route ``load_inline`` to the build cache, import the candidate
   from a private temp dir; the NVRTC ``compile_log`` becomes the CompileResult.
3. run: build ``ModelNew`` with the same parameters, run every trial (inputs cloned; with
   defenses: free memory poisoned, runtime guards around the forward) and send the outputs as
   bytes. The parent verifies.
4. guards (once): unsynchronised streams and kernel coverage; benchmark: every timed call gets
   fresh inputs, and hidden checked calls among them are verified by the parent
   (``timed_checks.py``: the draws and the harness's buffers live in a private allocator
   pool, so nothing the candidate allocates holds data that tells checked calls apart).

A *baseline job* (``job["kind"] == "baseline"``, sent by the evaluator's baseline pool, never
with a candidate) runs a lighter setup and the baseline stage only (the evaluator's baseline
pool gives each process up to ``evaluator.BASELINE_JOBS_PER_WORKER`` problems); a process that
ever imported candidate code refuses it. Each baseline timing asks the parent
for the GPU's timing gate first (``timing_gate``), and so does a candidate's job before the
candidate is imported: the parent then keeps the gate for that job until it ends, so no
baseline is timed on that GPU while candidate code can run there.

Covered: a CUDA fault, segfault, abort, OOM or hang kills only this process (the parent replaces
it); reference outputs are out of the candidate's reach before it loads. Not covered: code that
is already running in this process (the candidate) can in principle find the pipe and forge
later messages (e.g. via ``gc``); the static checks and sandbox forbid the means, and with
``max_jobs_per_worker=1`` (default) each process serves one candidate only.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.core.devices import cuda_visible_ids
from multiminddev.env import precision
from multiminddev.env.benchmark import HOLD_SOURCE
from multiminddev.env.candidate import (
    as_output_list,
    candidate_hash,
    load_module_from_source,
    send_tensor_lists,
)
from multiminddev.env.config import EvalConfig, Stage
from multiminddev.env.results import CompileResult, RejectReason, StageStatus, _to_jsonable


class FailureKind:
    """Tags for ("fail", {...}) messages (strings cross the pipe; the parent maps them)."""

    COMPILE = "compile_error"
    RUNTIME = "runtime_error"
    NO_GPU = "no_gpu"
    REJECTED = "rejected"
    INFRA = "infra_error"


@dataclass
class WorkerState:
    gpu: bool
    device_index: int | None  # this process's CUDA device: 0 (it sees one GPU), None without
    device_name: str
    workdir: Path
    stack_dump: Path | None = None
    flush: Any = None
    hold: Any = None  # benchmark.HostReleasedHold, or None: timings spin (benchmark.SpinHold)
    peak_gbps: float | None = None
    sandboxed: bool = False
    guards: Any = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # this job's sub-steps, seconds
    startup: dict[str, float] = field(default_factory=dict)  # worker start-up steps, seconds
    pinned_copies: bool = False  # copy big outputs to the host through pinned memory
    memory_cap: MemoryCap | None = None  # this job's GPU memory cap on candidate code
    registry: Any = None  # the dispatcher's registrations before candidate code loaded
    candidate_loaded: bool = False  # set before any candidate import: no baseline job after it
    timing_gate: bool = False  # this job's timed sections hold the GPU's timing gate


GIB = 1 << 30


@dataclass(frozen=True)
class MemoryCap:
    """The GPU memory the worker process may reserve while candidate code runs."""

    cap_bytes: int
    held_bytes: int  # what the worker held when the candidate loaded (inputs, model, buffers)
    setup_peak_bytes: int  # the reference setup's peak allocation
    factor: float

    def describe(self) -> str:
        return (f"{self.cap_bytes / GIB:.2f} GiB: the {self.held_bytes / GIB:.2f} GiB the "
                f"evaluation held when the candidate loaded, plus {self.factor:g} x the reference's "
                f"peak of {self.setup_peak_bytes / GIB:.2f} GiB or the floor, whichever is more "
                "(EvalConfig.candidate_memory_factor, candidate_memory_floor_gib)")


def candidate_memory_cap(factor: float | None, floor_gib: float, held_bytes: int,
                         setup_peak_bytes: int, total_bytes: int) -> MemoryCap | None:
    """The cap for a candidate: what the worker holds plus ``factor`` times the reference
    setup's peak (at least ``floor_gib``), never above the card; None when off (no factor) or
    when the card's size is unknown."""
    if factor is None or total_bytes <= 0:
        return None
    allowance = max(int(floor_gib * GIB), int(factor * setup_peak_bytes))
    return MemoryCap(cap_bytes=min(total_bytes, held_bytes + allowance), held_bytes=held_bytes,
                     setup_peak_bytes=setup_peak_bytes, factor=factor)


PINNED_MIN_BYTES = 1 << 20


def _pinned_copies_faster(nbytes: int = 16 << 20) -> bool:
    """Whether device-to-host copies of big outputs are faster through freshly pinned memory
    than into pageable memory on this machine (page-fault and pinning costs differ a lot
    between bare metal and sandboxed kernels, so measure once instead of guessing)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()

    def pageable() -> None:
        src.cpu()

    def pinned() -> None:
        torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).copy_(src)

    def best(fn: Any) -> float:
        fn()  # first use pays one-time initialisation
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    try:
        return best(pinned) < best(pageable)
    except RuntimeError:  # pinning refused (e.g. locked-memory limits): stay pageable
        return False


def to_host(value: Any, pinned: bool) -> Any:
    """A CPU copy of a tensor (others unchanged); big GPU tensors via pinned memory if faster."""
    import torch

    if type(value) not in (torch.Tensor, torch.nn.Parameter):  # never an object's own .cpu()
        return value
    if pinned and value.is_cuda and value.numel() * value.element_size() >= PINNED_MIN_BYTES:
        host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        host.copy_(value)  # synchronous: the data is on the host when this returns
        return host
    return value.cpu()


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Any:
    """Add the block's wall time to ``timings[name]``: where an evaluation's seconds go."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def failure_summary(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of an exception, plus its message's last line where the message
    spans several: an error raised in a subprocess (inductor's compile workers) carries the
    child's whole traceback, whose cause is at the end (pure)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    if len(lines) > 1:
        cause = lines[-1][: max(limit // 2, 40)]
        text = f"{text[: max(limit - len(cause) - 5, 20)]} ... {cause}"
    return text[:limit]


def only_device_environment(index: int, inherited: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker that must see its parent's GPU ``index`` alone:
    that entry of the parent's own list (indices, UUIDs or MIG names) where it has one, else
    the index itself (pure). With every GPU visible, candidate code could allocate on, copy to
    or launch work on the others and so disturb their evaluations and baseline timings, which
    the timing gate of its own GPU does not cover."""
    if inherited is None:
        return str(index)
    entries = cuda_visible_ids(inherited)
    if not 0 <= index < len(entries):
        raise ValueError(f"GPU {index} is not among CUDA_VISIBLE_DEVICES={inherited!r}")
    return entries[index]


def worker_main(conn: Any, device_index: int | None, config: dict[str, Any]) -> None:
    """Process entry point: initialise, announce readiness, then serve jobs until EOF/None."""
    from multiminddev.env.messages import PlainConnection

    conn = PlainConnection(conn)  # the evaluator decodes plain data only (env/messages.py)
    if device_index is not None:  # before anything in this process initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = only_device_environment(
            device_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    enter_worker_process(conn, config)
    try:
        state = _init_worker(device_index, EvalConfig.from_dict(config))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which marks infra_error
        with contextlib.suppress(Exception):
            conn.send(("startup_failed", {"message": f"{type(exc).__name__}: {exc}"}))
        return
    conn.send(("ready", {"pid": os.getpid(), "gpu": state.gpu, "device": state.device_name,
                         "stack_dump": str(state.stack_dump), "startup": state.startup,
                         "pinned_copies": state.pinned_copies}))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        run = _run_baseline_job if job.get("kind") == "baseline" else _run_job
        fatal = run(conn, state, job)
        if fatal:  # a CUDA error poisons the context: leave, the parent starts a fresh worker
            return


def enter_worker_process(conn: Any, config: dict[str, Any]) -> Any:
    """Isolate this worker (first: namespaces need a single-threaded process); behind the
    boundary, leave multiprocessing's resource tracker out. Returns the IsolationReport.

    The worker's /dev/shm is a tmpfs of its own mount namespace, freed with it, and the tracker
    it inherits runs outside that namespace. A named semaphore or shared-memory block made here
    (by torch or a library in the worker) would be registered with that tracker; a worker that
    is killed (every worker whose candidate held the timing gate is) never unregisters it, and
    at its shutdown the tracker unlinks the name in the host's /dev/shm, where it never was,
    printing ``resource_tracker: '/mp-...': [Errno 2] No such file or directory`` once per
    evaluation. Nothing here can leak past the namespace, so nothing is registered."""
    from multiminddev.env.isolation import isolate_worker_process

    report = isolate_worker_process(conn, config)
    if report.active:
        from multiprocessing import resource_tracker

        resource_tracker.register = _untracked
        resource_tracker.unregister = _untracked
    return report


def _untracked(name: str, rtype: str) -> None:
    """multiprocessing's register/unregister for a process whose /dev/shm dies with it."""


def _init_worker(device_index: int | None, cfg: EvalConfig) -> WorkerState:
    startup: dict[str, float] = {}
    with timed(startup, "import_torch"):
        import torch

    # TF32 off on both sides: the reference and the candidate compute in full fp32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    workdir = Path(tempfile.mkdtemp(prefix="mmd-worker-"))
    use_private_compile_caches(workdir)  # sandbox or not: no worker shares a compile cache
    stack_dump = _register_stack_dump()
    with timed(startup, "toolchain"):
        warm_module = _warm_toolchain(cfg)
    from multiminddev.env import inline_build

    with timed(startup, "inline_routing"):  # job-independent: off the evaluation's clock
        inline_build.install_routing(Path(cfg.cache_dir or "."), inline_build.inline_arch(cfg.arch))
    gpu = device_index is not None and torch.cuda.is_available()
    if not gpu:
        from multiminddev.cuda import compiler

        # compile_kernels resolves arch = explicit or GPU's or DEFAULT_ARCH; honour config.arch.
        compiler.DEFAULT_ARCH = cfg.arch or compiler.DEFAULT_ARCH
        return WorkerState(gpu=False, device_index=None, workdir=workdir, stack_dump=stack_dump,
                           device_name=f"cpu (compile only, {cfg.arch or compiler.DEFAULT_ARCH})",
                           startup=startup)
    from multiminddev.env.benchmark import l2_flush_buffer

    with timed(startup, "dynamo_import"):  # a no-op under the forkserver (preloaded there)
        import torch._dynamo  # noqa: F401 - its operator registrations predate the snapshot
    local = 0  # the parent's GPU ``device_index`` is this process's only one (worker_main)
    with timed(startup, "cuda_init"):
        torch.cuda.set_device(local)
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # creates the context
    state = WorkerState(gpu=True, device_index=local, workdir=workdir, stack_dump=stack_dump,
                        device_name=torch.cuda.get_device_name(local), startup=startup)
    with timed(startup, "l2_flush_buffer"):
        state.flush = l2_flush_buffer(local)
    with timed(startup, "kernel_launch"):
        state.hold = _warm_kernel_launch(warm_module)
    with timed(startup, "host_copy_probe"):
        state.pinned_copies = _pinned_copies_faster()
    if cfg.sandbox:
        from multiminddev.env import sandbox

        with timed(startup, "sandbox_prepare"):
            sandbox.prepare_sandbox()
    if cfg.defenses:
        from multiminddev.env import guards

        state.guards = guards
        with timed(startup, "guards"):
            guards.warm_up()
    return state


def _warm_kernel_launch(module: Any) -> Any:
    """The first cuda.core module load and launch in a process set up its launch path; pay it
    here, while this worker waits as a spare, not inside a candidate's compile stage. (Not
    through compile_kernels: the candidate's compile log must hold only its own kernels.)
    Returns the timing's batch hold (``benchmark.HostReleasedHold``), or None where it cannot
    run (the module was built for another GPU, or pinned memory has no device address): the
    timing then spins instead."""
    import torch

    from multiminddev.cuda import compiler, kernels
    from multiminddev.env.benchmark import HOLD_KERNEL, HostReleasedHold

    if module.result.arch != compiler.current_device_arch():
        return None  # built for another target (EvalConfig.arch): nothing to launch here
    warm = kernels.CompiledKernels(module, kernels.parse_kernel_signatures(WARM_SOURCE))
    warm.mmd_warm(grid=(1,), block=(1,), args=(torch.ones(1, dtype=torch.int32, device="cuda"),))
    try:
        hold = HostReleasedHold.create(warm.launcher(HOLD_KERNEL))
        hold.hold(1_000)  # released below, or over after its cycles
        hold.release()
    except Exception:  # noqa: BLE001 - the spin is the fallback, never a failure
        hold = None
    torch.cuda.synchronize()
    return hold


WARM_SOURCE = 'extern "C" __global__ void mmd_warm(int* p) { if (p) *p = 0; }\n' + HOLD_SOURCE


def _warm_toolchain(cfg: EvalConfig) -> Any:
    """Locate headers and load NVRTC now, in trusted code: the first lookup runs helper
    processes (ldconfig, a cuda.pathfinder probe) that the sandbox refuses later. Returns the
    compiled warm-up module (launched once on a GPU by ``_warm_kernel_launch``)."""
    from multiminddev.cuda import compiler

    compiler.cuda_include_paths()
    compiler.current_device_arch()
    return compiler.compile_cuda(WARM_SOURCE, compiler.CompileOptions(arch=cfg.arch, use_cache=False))


def _register_stack_dump() -> Path | None:
    """On SIGUSR1 write every thread's Python stack to a file: before killing a worker that
    ran past its time limit, the parent asks for it to say *where* the candidate hung."""
    import faulthandler
    import signal

    try:
        fd, name = tempfile.mkstemp(prefix="mmd-stack-", suffix=".txt")
        handle = os.fdopen(fd, "w")
        faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True)
        _KEEP_OPEN.append(handle)
        return Path(name)
    except (OSError, AttributeError, ValueError):
        return None


_KEEP_OPEN: list[Any] = []  # the dump file must stay open for faulthandler


def _run_job(conn: Any, state: WorkerState, job: dict[str, Any]) -> bool:
    """Run one job; returns True when the process must exit (CUDA context poisoned)."""
    from multiminddev.core.problem import Problem

    cfg = EvalConfig.from_dict(job["config"])
    problem = Problem.from_dict(job["problem"])
    _expect_inline_libraries(job)
    state.timing_gate = bool(job.get("timing_gate"))
    send = conn.send
    stage = Stage.SETUP
    state.timings = {}
    clock = state.timings
    if state.sandboxed:  # a reused worker: violations belong to the job that caused them
        from multiminddev.env import sandbox

        sandbox.clear_violations()
    try:
        reference = None
        if state.gpu:
            _lift_memory_cap(state)  # the trusted setup is not capped; its peak sets the cap
            send(("begin", Stage.SETUP.value))
            with timed(clock, "setup.reference"):
                reference = _setup_reference(problem, cfg, state.pinned_copies)
            with timed(clock, "setup.send_reference"):
                reference.sent_bytes = {
                    "reference": send_tensor_lists(conn, "reference", reference.outputs,
                                                   transfer=cfg.tensor_transfer),
                    "timed_reference": send_tensor_lists(conn, "timed_reference",
                                                         reference.check_outputs,
                                                         transfer=cfg.tensor_transfer)}
                _send_ground_truth(conn, cfg, reference)
            if cfg.benchmark:
                stage = Stage.BASELINE
                send(("begin", stage.value))
                with timed(clock, "baseline"):
                    baseline = _baselines(conn, state, cfg, reference, job)
                send(("baseline", baseline))
            _seal_reference(state, reference)
            state.memory_cap = _cap_candidate_memory(cfg)
            if state.timing_gate and cfg.benchmark:  # to the job's end: no baseline timed here
                with timed(clock, "gate_wait"):
                    _ask_for_gate(conn)
        if state.guards is not None:
            from multiminddev.env import registry_guard

            state.registry = registry_guard.snapshot()
        stage = Stage.COMPILE
        send(("begin", stage.value))
        with timed(clock, "compile.import"):
            module = _import_candidate(conn, state, cfg, job["candidate"],
                                       job_allows_build=job.get("allow_inline_build", False))
        if module is None:
            return False
        if not state.gpu:
            send(("fail", {"kind": FailureKind.NO_GPU, "stage": stage.value,
                           "message": "compiled; this machine has no GPU to run it"}))
            return False
        from multiminddev.env import stages

        return stages.run_candidate_stages(conn, state, cfg, problem, reference, module)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
        return _report_exception(conn, stage, exc, trusted=stage in (Stage.SETUP, Stage.BASELINE),
                                 cap=state.memory_cap, gpu=state.gpu)


def _run_baseline_job(conn: Any, state: WorkerState, job: dict[str, Any]) -> bool:
    """Measure one problem's missing baselines (trusted code only) and report them; returns
    True when the process must exit. Figures the job carries are not measured again."""
    import torch

    from multiminddev.core.problem import Problem
    from multiminddev.env.benchmark import figures_to_measure

    cfg = EvalConfig.from_dict(job["config"])
    stage = Stage.SETUP
    state.timings = {}
    clock = state.timings
    try:
        if state.candidate_loaded:  # the pools never do this; the worker refuses it anyway
            raise RuntimeError("this worker imported candidate code: it measures no baselines")
        todo = figures_to_measure(job, compile_baseline=cfg.compile_baseline,
                                  eager=cfg.reuse_eager_baseline)
        if not state.gpu or not todo:
            conn.send(("done", {"notes": [] if state.gpu else ["no GPU: nothing measured"]}))
            return False
        _lift_memory_cap(state)
        with timed(clock, "setup.reference"):
            reference = _baseline_reference(Problem.from_dict(job["problem"]), cfg)
        stage = Stage.BASELINE
        conn.send(("begin", stage.value))
        with timed(clock, "baseline"):
            baseline = _baselines(conn, state, cfg, reference, job)
        conn.send(("baseline", baseline))
        reference.drop_model()
        import torch._dynamo

        torch._dynamo.reset()  # should the pool send another problem: drop the compiled graphs
        torch.cuda.empty_cache()
        conn.send(("timings", dict(clock)))
        conn.send(("done", {"notes": []}))
        return False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a message
        return _report_exception(conn, stage, exc, trusted=True, gpu=state.gpu)


def _baseline_reference(problem: Any, cfg: EvalConfig) -> Reference:
    """The reference model and its input generator, as ``_setup_reference`` builds them,
    without the trials' and checked calls' outputs (a baseline job needs none)."""
    import torch

    directory = Path(tempfile.mkdtemp(prefix="mmd-problem-"))
    name = f"mmd_problem_{problem.source_hash}"
    module = load_module_from_source(problem.source, name, directory)
    sys.modules.pop(name, None)
    rng = evaluation_rng(cfg.seed)
    init_seed = rng.randrange(SEED_RANGE)
    torch.manual_seed(init_seed)
    init_inputs = list(module.get_init_inputs())
    torch.manual_seed(init_seed)
    model = module.Model(*init_inputs).cuda().eval()
    ref = Reference(init_seed=init_seed, init_inputs=init_inputs, trial_inputs=[],
                    check_inputs=[], outputs=[], check_outputs=[], output_specs=[],
                    output_layouts=[], ground_truth=None, problem_module=module, rng=rng,
                    model=model)
    inputs = ref.draw_inputs()
    outputs = _reference_outputs(model, inputs, False, ref)  # records the output specs
    ref.checks = timing_check_plan(cfg, inputs, outputs)  # its timed calls: as a candidate's
    return ref


def _ask_for_gate(conn: Any) -> bool:
    """Ask the parent for the GPU's timing gate and wait for its answer: True when granted,
    False when the parent gave up waiting ("open")."""
    conn.send(("gate", "acquire"))
    return conn.recv() == ("gate", "granted")


@contextlib.contextmanager
def timing_gate(conn: Any, enabled: bool, timings: dict[str, float]) -> Any:
    """Hold the GPU's timing gate for a trusted timing; yields whether it was granted
    (always True when off). The parent takes it back when told, or when the job ends."""
    if not enabled:
        yield True
        return
    with timed(timings, "gate_wait"):
        granted = _ask_for_gate(conn)
    try:
        yield granted
    finally:
        conn.send(("gate", "release"))


def _send_ground_truth(conn: Any, cfg: EvalConfig, reference: Reference) -> None:
    """The float64 ground truth of trial 0 (when the reference runs in float64) and the
    reference outputs' layouts: the parent's precision and density checks read them."""
    truth = reference.ground_truth
    layouts = [lay.to_dict() if lay is not None else None for lay in reference.output_layouts]
    conn.send(("reference_layouts", {"layouts": layouts,
                                     "ground_truth_note": truth.reason if truth else "off"}))
    if truth is not None and truth.available:
        send_tensor_lists(conn, "ground_truth", [truth.outputs], transfer=cfg.tensor_transfer)


def _seal_reference(state: WorkerState, reference: Reference) -> None:
    """Before candidate code loads: drop the reference model and its outputs (the evaluator
    has them), overwrite the freed GPU memory that held them (an uninitialised allocation
    cannot inherit an answer), and reseed torch from OS randomness."""
    reference.drop_model()
    if state.guards is not None:
        state.guards.poison_free_cuda_memory()
    forget_seeds()


def _lift_memory_cap(state: WorkerState) -> None:
    import torch

    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.reset_peak_memory_stats()
    state.memory_cap = None


def _cap_candidate_memory(cfg: EvalConfig) -> MemoryCap | None:
    """Caps this process's GPU memory before candidate code loads: a candidate that allocates
    far more than the problem needs fails alone (out of memory here) instead of starving the
    processes sharing the GPU (trainers, other evaluations)."""
    import torch

    _, total = torch.cuda.mem_get_info()
    cap = candidate_memory_cap(cfg.candidate_memory_factor, cfg.candidate_memory_floor_gib,
                               torch.cuda.memory_reserved(), torch.cuda.max_memory_allocated(),
                               total)
    if cap is not None:
        torch.cuda.set_per_process_memory_fraction(cap.cap_bytes / total)
    return cap


@dataclass
class Reference:
    """What the trusted setup leaves for the candidate stages. The reference model itself is
    dropped before the candidate loads (``drop_model``): nothing of it, and none of its outputs,
    stays in the candidate's reach."""

    init_seed: int  # seeds Model's and ModelNew's parameters alike
    init_inputs: list[Any]
    trial_inputs: list[list[Any]]  # pristine inputs on the GPU, one list per correctness trial
    check_inputs: list[list[Any]]  # inputs of the hidden checked calls among the timed ones
    outputs: list[list[Any]]  # reference outputs of the trials (CPU), sent then dropped
    check_outputs: list[list[Any]]  # reference outputs of the checked calls (CPU), likewise
    output_specs: list[tuple[tuple[int, ...], Any]]  # (shape, dtype) of each output
    output_layouts: list[Any]  # precision.OutputLayout of each output (None: not a tensor)
    ground_truth: Any  # precision.GroundTruth of trial 0 (float64 reference), sent then dropped
    problem_module: Any
    rng: random.Random  # draws every seed; OS randomness unless EvalConfig.seed is set
    model: Any = None
    checks: Any = None  # timed_checks.CheckPlan: how many checked calls, at most how many timed
    harness_pool: Any = None  # timed_checks.HarnessPool holding check_inputs (None: none drawn)
    # The tensor bytes of the reference messages sent to the evaluator, by tag: they bound
    # what the candidate's answering messages may carry (``messages.output_byte_limit``).
    sent_bytes: dict[str, int] = field(default_factory=dict)

    def draw_inputs(self) -> list[Any]:
        """A fresh input list for one timed call (new random data every call)."""
        return make_inputs(self.problem_module, self.rng.randrange(SEED_RANGE))

    def drop_model(self) -> None:
        self.model = None
        self.outputs, self.check_outputs, self.ground_truth = [], [], None


SEED_RANGE = 1 << 62


def evaluation_rng(seed: int | None) -> random.Random:
    """OS randomness (nothing in the process can replay it), or a seeded generator when the
    configuration asks for reproducible inputs."""
    return random.SystemRandom() if seed is None else random.Random(seed)


def _setup_reference(problem: Any, cfg: EvalConfig, pinned: bool = False) -> Reference:
    import torch

    from multiminddev.env.timed_checks import HarnessPool

    directory = Path(tempfile.mkdtemp(prefix="mmd-problem-"))
    name = f"mmd_problem_{problem.source_hash}"
    module = load_module_from_source(problem.source, name, directory)
    sys.modules.pop(name, None)  # the candidate should not find the reference by name
    rng = evaluation_rng(cfg.seed)
    init_seed = rng.randrange(SEED_RANGE)
    torch.manual_seed(init_seed)
    init_inputs = list(module.get_init_inputs())
    torch.manual_seed(init_seed)
    model = module.Model(*init_inputs).cuda().eval()
    ref = Reference(init_seed=init_seed, init_inputs=init_inputs, trial_inputs=[],
                    check_inputs=[], outputs=[], check_outputs=[], output_specs=[],
                    output_layouts=[], ground_truth=None, problem_module=module, rng=rng,
                    model=model)
    for _ in range(cfg.num_trials):
        ref.trial_inputs.append(ref.draw_inputs())
        ref.outputs.append(_reference_outputs(model, ref.trial_inputs[-1], pinned, ref))
    if cfg.precision_check:  # trial 0's truth; the parent scales every other output's budget
        ref.ground_truth = precision.ground_truth_outputs(model, ref.trial_inputs[0])
    ref.checks = timing_check_plan(cfg, ref.trial_inputs[0], ref.outputs[0])
    # The checked calls' inputs live in the harness's pool: no block the candidate allocates
    # shares a segment with them, so reading past the end of its own buffers cannot find them.
    ref.harness_pool = HarnessPool()
    for _ in range(ref.checks.checks):
        with ref.harness_pool.allocating():
            ref.check_inputs.append(ref.draw_inputs())
        ref.check_outputs.append(_reference_outputs(model, ref.check_inputs[-1], pinned, ref))
    return ref


def _reference_outputs(model: Any, inputs: list[Any], pinned: bool, ref: Reference) -> list[Any]:
    """The reference's outputs for ``inputs`` on the CPU; the first call records their specs."""
    import torch

    with torch.no_grad():
        outs = as_output_list(model(*inputs))
    if not ref.output_specs:
        ref.output_specs = [(tuple(o.shape), o.dtype) if isinstance(o, torch.Tensor) else ((), None)
                            for o in outs]
        ref.output_layouts = [precision.output_layout(o) for o in outs]
    return [to_host(o, pinned) for o in outs]


def forget_seeds() -> None:
    """Reseed torch from OS randomness: ``torch.initial_seed()`` and the generators' states
    then say nothing about the evaluation's inputs or parameters."""
    import torch

    rng = random.SystemRandom()
    torch.manual_seed(rng.randrange(SEED_RANGE))
    if torch.cuda.is_available():  # its own value: the CPU generator's draws reveal nothing here
        torch.cuda.manual_seed_all(rng.randrange(SEED_RANGE))


def make_inputs(module: Any, seed: int) -> list[Any]:
    """``get_inputs()`` drawn on the GPU (factory calls default to CUDA: 64 MB of randn takes
    milliseconds instead of a second on the CPU); problems that insist on CPU still work."""
    import torch

    torch.manual_seed(seed)
    try:
        with torch.device("cuda"):
            return [to_device(x) for x in module.get_inputs()]
    except Exception:  # noqa: BLE001 - e.g. a problem mixing numpy and torch: draw on the CPU
        torch.manual_seed(seed)
        return [to_device(x) for x in module.get_inputs()]


def to_device(x: Any) -> Any:
    import torch

    return x.cuda() if isinstance(x, torch.Tensor) else x


def clone_inputs(inputs: list[Any]) -> list[Any]:
    import torch

    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _baselines(conn: Any, state: WorkerState, cfg: EvalConfig, ref: Reference,
               job: dict[str, Any]) -> dict[str, Any]:
    """Eager and torch.compile timings of the reference, plus the GPU's peak bandwidth.

    Trusted stage, before any candidate code loads. ``job["peak_gbps"]``,
    ``job["eager_baseline"]`` and ``job["compiled_baseline"]`` (TimingStats as dicts) come from
    the evaluator's authenticated cache; each is measured here only when the job has none, and
    reported in the returned payload (the ("baseline", ...) message; ``measured`` names what
    was measured here), from which the evaluator stores it. The worker never reads or writes
    the shared baselines cache: a candidate running later in this process could otherwise
    plant figures for the evaluations after it. Each timing holds the GPU's timing gate
    (``job["timing_gate"]``); torch.compile's first call, which compiles, does not. A figure
    timed without the gate (the parent gave up waiting for it) is named in ``ungated``: used
    for this job, never stored."""
    import torch

    from multiminddev.env import benchmark as bm

    gate, clock = bool(job.get("timing_gate")), state.timings
    gpu_name, torch_version = bm.gpu_identity(state.device_index)
    # A candidate's job may leave figures to the problem's baseline job; the evaluator adds
    # them after this job (``evaluator.BASELINES_PENDING``).
    pending = set(job.get("baselines_pending") or ())
    todo = [figure for figure in bm.figures_to_measure(
        job, compile_baseline=cfg.compile_baseline,
        eager=job.get("kind") != "baseline" or cfg.reuse_eager_baseline) if figure not in pending]
    measured: list[str] = []
    ungated: list[str] = []
    peak_gbps = job.get("peak_gbps")
    if "peak_gbps" in todo:
        with timing_gate(conn, gate, clock) as granted, timed(clock, "baseline.peak"):
            peak_gbps = bm.measure_peak_bandwidth(state.device_index)
        torch.cuda.empty_cache()  # give back the copy buffers (poisoning walks free blocks)
        measured.append("peak_gbps")
        ungated += [] if granted else ["peak_gbps"]
    state.peak_gbps = peak_gbps
    eager = job.get("eager_baseline")
    if "eager_baseline" in todo:
        with timing_gate(conn, gate, clock) as granted, timed(clock, "baseline.eager"):
            eager = bm.stats_to_dict(time_like_candidate(state, cfg, ref, ref.model))
        measured.append("eager_baseline")
        ungated += [] if granted else ["eager_baseline"]
    out: dict[str, Any] = {"eager": eager, "compiled": None, "peak_gbps": peak_gbps,
                           "gpu_name": gpu_name, "torch_version": torch_version, "note": "",
                           "measured": measured, "ungated": ungated}
    if cfg.compile_baseline and "compiled_baseline" not in todo:
        out["compiled"] = job.get("compiled_baseline")
    elif cfg.compile_baseline:
        try:
            import torch._inductor.config as inductor_config

            compiled_model = torch.compile(ref.model)
            # Compiled here, in this process: inductor's compile subprocess pool, once ready,
            # failed every triton compile of a worker's later problems (H100, torch 2.11), so a
            # worker could measure only its first problem's figure. One problem's few kernels
            # compile as fast in process, and baseline workers run side by side.
            with (timed(clock, "baseline.torch_compile"),  # CPU work mostly: ungated
                  inductor_config.patch(compile_threads=1), torch.no_grad()):
                compiled_model(*ref.draw_inputs())
                torch.cuda.synchronize()
            with timing_gate(conn, gate, clock) as granted, timed(clock, "baseline.compiled"):
                compiled = time_like_candidate(state, cfg, ref, compiled_model)
            out["compiled"] = bm.stats_to_dict(compiled)
            measured.append("compiled_baseline")
            ungated += [] if granted else ["compiled_baseline"]
        except Exception as exc:  # noqa: BLE001 - a baseline failure is noted, not fatal
            out["note"] = f"torch.compile baseline failed: {failure_summary(exc)}"
    return out


def time_like_candidate(state: WorkerState, cfg: EvalConfig, ref: Reference, model: Any) -> Any:
    """Time ``model`` exactly as the candidate is timed (fresh inputs copied into new buffers
    before every call, the L2 flush, the same number of calls for the same budget), so a
    speedup compares like with like."""
    import torch

    from multiminddev.env import benchmark as bm
    from multiminddev.env.timed_checks import CheckedCalls

    def forward(args: list[Any]) -> list[Any]:
        with torch.no_grad():
            return as_output_list(model(*args))

    calls = CheckedCalls(draw_inputs=ref.draw_inputs, check_inputs=[],
                         output_specs=ref.output_specs, forward=forward, rng=ref.rng)
    timed_calls = bm.TimedCalls(run=calls.run, prepare=calls.prepare, finish=calls.finish)
    stats = bm.time_calls(timed_calls, timing_plan(cfg, ref.checks), state.flush,
                          on_planned=calls.plan, hold=state.hold)
    calls.release()
    return stats


def timing_plan(cfg: EvalConfig, checks: Any = None) -> Any:
    """The timing of a candidate or baseline: at most ``checks.max_runs`` timed calls (a
    ``timed_checks.CheckPlan``; fewer than ``cfg.max_timed_runs`` where few checks fit)."""
    from multiminddev.env.benchmark import TimingPlan

    max_runs = cfg.max_timed_runs if checks is None else min(cfg.max_timed_runs, checks.max_runs)
    return TimingPlan(warmup_runs=cfg.warmup_runs, min_runs=cfg.min_timed_runs,
                      max_runs=max(cfg.min_timed_runs, max_runs), budget_s=cfg.bench_budget_s)


def timing_check_plan(cfg: EvalConfig, inputs: list[Any], outputs: list[Any]) -> Any:
    """The ``timed_checks.CheckPlan`` of a problem whose one call takes ``inputs`` and gives
    ``outputs``: how many checked calls, among at most how many timed calls."""
    from multiminddev.env.timed_checks import check_plan, tensor_bytes

    return check_plan(tensor_bytes(inputs) + tensor_bytes(outputs), wanted=cfg.timed_checks,
                      budget_mib=cfg.timed_check_budget_mib, min_runs=cfg.min_timed_runs,
                      max_runs=cfg.max_timed_runs)


def _import_candidate(conn: Any, state: WorkerState, cfg: EvalConfig, source: str,
                      job_allows_build: bool = False) -> Any:
    """Sandbox, then import the candidate; sends ("compile", ...) or ("fail", ...)."""
    from multiminddev.cuda import KernelCompileError, NoGPUError
    from multiminddev.cuda import kernels as kernels_mod
    from multiminddev.env import inline_build

    if cfg.sandbox and not state.sandboxed:
        with timed(state.timings, "compile.sandbox"):
            _install_sandbox(state, cfg, allow_build=bool(job_allows_build))
    first_nvrtc, first_inline = len(kernels_mod.compile_log), len(inline_build.inline_log)
    state.candidate_loaded = True
    name = f"mmd_candidate_{candidate_hash(source)}_{time.monotonic_ns()}"
    known = (KernelCompileError, inline_build.InlineBuildError, NoGPUError,
             inline_build.InlineBuildUnavailable, inline_build.InlineLibraryRefused)
    try:
        with timed(state.timings, "compile.exec"):  # the candidate's module body: its compiles
            module = load_module_from_source(source, name, state.workdir)
    except known as exc:
        return _known_import_failure(conn, state, exc, first_nvrtc, first_inline)
    except BaseException:
        # Any other import failure: report what compiled so far, then the exception.
        conn.send(("compile", _compile_payload(kernels_mod.compile_log[first_nvrtc:],
                                               inline_build.inline_log[first_inline:])))
        raise
    conn.send(("compile", _compile_payload(kernels_mod.compile_log[first_nvrtc:],
                                           inline_build.inline_log[first_inline:])))
    from multiminddev.env.stages import sandbox_findings

    refused = sandbox_findings()
    if refused:
        conn.send(("fail", {"kind": FailureKind.REJECTED, "stage": Stage.COMPILE.value,
                            "reason": RejectReason.SANDBOX_VIOLATION.value,
                            "message": refused[0].message}))
        return None
    if not hasattr(module, "ModelNew"):
        conn.send(("fail", {"kind": FailureKind.REJECTED, "stage": Stage.COMPILE.value,
                            "reason": RejectReason.NO_MODEL_NEW.value,
                            "message": "the candidate defines no ModelNew class"}))
        return None
    return module


def _known_import_failure(conn: Any, state: WorkerState, exc: BaseException,
                          first_nvrtc: int, first_inline: int) -> None:
    """Report a compile error, a failed load_inline build, or 'cannot run here'."""
    from multiminddev.cuda import KernelCompileError
    from multiminddev.cuda import kernels as kernels_mod
    from multiminddev.env import inline_build

    nvrtc = kernels_mod.compile_log[first_nvrtc:]
    inline = inline_build.inline_log[first_inline:]
    if isinstance(exc, inline_build.InlineLibraryRefused) and exc.findings:
        conn.send(("compile", _compile_payload(nvrtc, inline)))
        conn.send(("fail", {"kind": FailureKind.REJECTED, "stage": Stage.COMPILE.value,
                            "reason": exc.findings[0].reason.value,
                            "message": exc.findings[0].message}))
        return
    if isinstance(exc, (KernelCompileError, inline_build.InlineBuildError)):
        if isinstance(exc, KernelCompileError) and not nvrtc:
            nvrtc = [exc.result]
        conn.send(("compile", _compile_payload(nvrtc, inline)))
        conn.send(("fail", {"kind": FailureKind.COMPILE, "stage": Stage.COMPILE.value,
                            "message": _compile_message(exc.result)}))
        return
    payload = _compile_payload(nvrtc, inline)
    if isinstance(exc, inline_build.InlineBuildUnavailable):
        payload["result"] = _to_jsonable(CompileResult(
            status=StageStatus.SKIPPED, backend="load_inline", error=str(exc)))
    conn.send(("compile", payload))
    conn.send(("fail", {"kind": _unavailable_kind(state, exc), "stage": Stage.COMPILE.value,
                        "message": str(exc)}))


def _unavailable_kind(state: WorkerState, exc: BaseException) -> str:
    """A "cannot run here" error during the candidate's import: no GPU on a compile-only
    worker; an infrastructure error when the trusted load_inline routing found no toolchain on
    a GPU worker; otherwise the candidate's own error. The candidate's code can raise these
    classes too, and a failure blamed on the machine is retried and left out of training."""
    from multiminddev.env import inline_build

    if not state.gpu:
        return FailureKind.NO_GPU
    if type(exc) is inline_build.InlineBuildUnavailable:
        return FailureKind.INFRA
    return FailureKind.RUNTIME


def _install_sandbox(state: WorkerState, cfg: EvalConfig, *, allow_build: bool) -> None:
    """The sandbox, writable only in this worker's private directory (its compile caches
    included); ``allow_build`` lets ``ninja`` run (a load_inline candidate whose sources could
    not be built ahead, outside the sandbox).

    The shared cache (``cfg.cache_dir``) stays readable, not writable: ``load_inline`` routing
    loads the libraries the evaluator's trusted builder put under ``<cache>/inline``, and a
    candidate must not be able to plant a library or cubin there for the evaluations after it."""
    from multiminddev.env import sandbox

    use_private_compile_caches(state.workdir)
    # nm/objdump: the symbol check of a library built here, before it loads (native_symbols).
    policy = sandbox.SandboxPolicy(
        allowed_executables=("ninja", "nm", "objdump") if allow_build else ())
    sandbox.install_sandbox(state.workdir, policy)
    state.sandboxed = True


PRIVATE_CACHE_DIRS = {"MULTIMINDDEV_CACHE": "compile-cache", "TORCH_EXTENSIONS_DIR": "torch-extensions"}


def use_private_compile_caches(workdir: Path) -> None:
    """Point this worker's NVRTC cache and torch's extension directory into ``workdir``.

    Candidate code compiles in this process; with the shared caches it could write a poisoned
    cubin or library under the key of a later, honest candidate. Its own compiles land here,
    where no other evaluation looks. (The sandbox keeps these two locations writable and
    pins them through its environment scrub.) Must run before candidate code loads."""
    for name, sub in PRIVATE_CACHE_DIRS.items():
        path = Path(workdir) / sub
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)


def _expect_inline_libraries(job: dict[str, Any]) -> None:
    """The prebuilt load_inline libraries this job may load: those the evaluator verified
    (``job["inline_libraries"]``, key -> SHA-256); set for every job, before candidate code."""
    from multiminddev.env import inline_build

    inline_build.expect_libraries(job.get("inline_libraries"))


def _compile_payload(nvrtc: list[CompileResult], inline: list[CompileResult]) -> dict[str, Any]:
    return {"result": _to_jsonable(merge_compile_results([*nvrtc, *inline]))}


def merge_compile_results(results: list[CompileResult]) -> CompileResult:
    """One CompileResult for all the modules a candidate compiled (first failure wins)."""
    if not results:
        return CompileResult(status=StageStatus.SKIPPED, backend="none",
                             error="the candidate compiled no kernel at import time")
    failed = [r for r in results if r.status is not StageStatus.OK]
    base = failed[0] if failed else results[0]
    return CompileResult(
        status=base.status,
        backend=base.backend,
        arch=base.arch,
        seconds=sum(r.seconds for r in results),
        cached=all(r.cached for r in results),
        log="\n".join(r.log for r in results if r.log)[-20000:],
        diagnostics=[d for r in results for d in r.diagnostics],
        kernels=[k for r in results for k in r.kernels],
        error=base.error,
    )


def _compile_message(result: CompileResult) -> str:
    errors = result.errors
    if errors:
        first = errors[0]
        where = f"line {first.line}" if first.line else "unknown line"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"CUDA compile error at {where} of the kernel source: {first.message}{more}"
    return f"CUDA compile failed: {result.error.strip().splitlines()[0] if result.error.strip() else 'see log'}"


def _report_exception(conn: Any, stage: Stage, exc: BaseException, *, trusted: bool,
                      cap: MemoryCap | None = None, gpu: bool = True) -> bool:
    """Send a ("fail", ...) for ``exc``; returns True when the CUDA context is unusable.
    ``cap``: the job's GPU memory cap on candidate code, if any. An exception from candidate
    code is blamed on the machine (no GPU, a crowded GPU) only when the machine confirms it:
    candidate code can raise any exception class with any message."""
    text = f"{type(exc).__name__}: {exc}".strip()
    lowered = text.lower()
    fatal = "cuda error" in lowered or "illegal" in lowered or "cudaerror" in lowered
    if trusted:
        kind, message = FailureKind.INFRA, f"the reference problem failed in {stage.value}: {text[:400]}"
    elif _is_sandbox_violation(exc):
        kind, message = FailureKind.REJECTED, f"sandbox refused an operation: {text[:400]}"
    elif not gpu and _is_no_gpu(exc):
        kind, message = FailureKind.NO_GPU, f"needs a GPU: {text[:300]}"
    elif (verdict := _out_of_memory_verdict(exc, stage, cap)) is not None:
        kind, message = verdict
    else:
        kind, message = FailureKind.RUNTIME, f"{stage.value}: {_short(text)}"
    payload = {"kind": kind, "stage": stage.value, "message": message,
               "traceback": "".join(traceback.format_exception(exc))[-4000:], "fatal": fatal}
    if kind == FailureKind.REJECTED:
        payload["reason"] = RejectReason.SANDBOX_VIOLATION.value
    with contextlib.suppress(Exception):
        conn.send(("fail", payload))
    return fatal


# An out-of-memory error is the candidate's doing when its process held, with the failed
# request, at least this share of the GPU; below it, other processes (a trainer's cache, other
# evaluation workers) had taken the memory, and the candidate is not to blame.
CANDIDATE_OOM_SHARE = 0.5
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_REQUEST = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB|TiB)")


def requested_bytes(oom_text: str) -> int:
    """The failed request of torch's out-of-memory message ("Tried to allocate 3.00 GiB"); 0
    when the message does not say."""
    match = _REQUEST.search(oom_text)
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else 0


def device_was_crowded(requested: int, process_bytes: int, total_bytes: int,
                       share: float = CANDIDATE_OOM_SHARE) -> bool:
    """True when an out-of-memory error came from other processes' use of the GPU: this process
    held ``process_bytes`` and asked for ``requested`` more, less than ``share`` of the GPU."""
    return total_bytes > 0 and process_bytes + requested < share * total_bytes


def over_memory_cap(requested: int, process_bytes: int, cap: MemoryCap | None) -> bool:
    """True when an out-of-memory error is the cap's doing: the process held ``process_bytes``
    and asked for ``requested`` more, past the cap (less the allocator's rounding)."""
    return cap is not None and process_bytes + requested > cap.cap_bytes - CAP_ROUNDING_BYTES


CAP_ROUNDING_BYTES = 32 << 20  # the caching allocator rounds large requests up (2 MiB steps)


def _out_of_memory_verdict(exc: BaseException, stage: Stage,
                           cap: MemoryCap | None) -> tuple[str, str] | None:
    """(kind, message) for an out-of-memory ``exc``: the candidate's runtime error when it went
    past the cap, an infrastructure error when other processes had taken the GPU; None for any
    other exception, or when the candidate asked for the memory (a plain runtime error)."""
    text = f"{type(exc).__name__}: {exc}"
    try:
        import torch

        if type(exc) is not torch.cuda.OutOfMemoryError:  # exactly torch's, not a look-alike
            return None
        free, total = torch.cuda.mem_get_info()
        held = torch.cuda.memory_reserved()
    except Exception:  # noqa: BLE001 - no usable device to ask: leave the error to the candidate
        return None
    asked = requested_bytes(text)
    if cap is not None and over_memory_cap(asked, held, cap):
        return FailureKind.RUNTIME, (
            f"{stage.value}: out of GPU memory: the candidate asked for {asked / GIB:.2f} GiB more "
            f"while its evaluation held {held / GIB:.2f} GiB, past its cap of {cap.describe()}. "
            "Allocate outputs and scratch buffers the size Model's are.")
    if not device_was_crowded(asked, held, total) or free >= asked + CAP_ROUNDING_BYTES:
        return None  # the GPU has the memory now: its absence is not what stopped the candidate
    return FailureKind.INFRA, (
        f"the GPU ran out of memory while this evaluation held {held / GIB:.2f} GiB and asked "
        f"for {asked / GIB:.2f} GiB more, of {total / GIB:.1f} GiB ({free / GIB:.2f} GiB free): "
        "other processes hold the rest, so this is not the candidate's fault. Free GPU memory "
        "(a trainer's cache, other jobs) or run fewer processes on this GPU.")


def _short(text: str) -> str:
    first = text.splitlines()[0] if text else ""
    return first[:400]


def _is_sandbox_violation(exc: BaseException) -> bool:
    return any("sandbox" in cls.__name__.lower() for cls in type(exc).__mro__)


def _is_no_gpu(exc: BaseException) -> bool:
    from multiminddev.cuda import NoGPUError

    if isinstance(exc, NoGPUError):
        return True
    text = str(exc).lower()
    return "not compiled with cuda" in text or "no nvidia driver" in text or "no cuda gpus" in text
