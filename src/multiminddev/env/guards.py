"""Runtime anti-hack checks the evaluation worker runs around a candidate's forward.

Each check returns ``list[Finding]`` (empty = fine) with a ``RejectReason``; the worker turns any
finding into status ``rejected``. Per correctness trial (cheap): ``poison_free_cuda_memory``
before the candidate runs, ``TorchComputeGuard`` around its forward, then
``check_streams_synchronized()``, ``check_inputs_unchanged``, ``check_output_aliasing``,
``check_threads`` and ``check_output_types``. Once per evaluation: ``check_stale_output``,
``kernel_time_coverage_events`` (CUDA events around our own launches) or ``kernel_time_coverage``
(profiler) with ``check_kernel_coverage``, and ``check_impossible_speed``.

What they catch (each was a real reward hack; see docs/evaluator.md):

- torch doing the work (aten ops beyond allocation/views during forward): TORCH_COMPUTE;
- an uninitialised ``torch.empty`` holding the reference's freed output: free cached GPU memory
  is filled with NaN bytes first, so such an output is NaN and fails verification;
- work on a side stream still running when the current stream is done, or kernels launched on a
  stream other than the current one: UNSYNCED_STREAM;
- Python threads still alive after forward: THREAD_LEAK;
- inputs modified by forward: INPUT_MUTATION; outputs sharing an input's storage: OUTPUT_ALIASING;
- outputs cached by pointer/identity: new data written into the same input buffers must give
  the new answer: STALE_OUTPUT;
- tensor subclasses as outputs (lazy tensors): MONKEY_PATCH;
- faster than moving the problem's bytes at peak bandwidth: IMPOSSIBLE_SPEED;
- the candidate's own kernels account for little of the GPU time: LOW_KERNEL_COVERAGE.

Not covered here: a ``load_inline`` library's C++ code launching kernels on its own streams is
only visible through its effects (pending-work probe, output changing after the current stream
finished); see the sandbox module for what same-process checks cannot guarantee.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

from multiminddev.env.results import Finding, RejectReason

# aten ops a kernel candidate may run during forward: allocation, views, metadata, scalar reads.
# Not clone/copy_/_to_copy: a copy is done by a torch kernel, and for memory-bound problems the
# copy IS most of the work (transpose + contiguous, casts). ``.contiguous()`` on a contiguous
# tensor dispatches nothing, so honest candidates never trip on it.
DEFAULT_ALLOWED_OPS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
        "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
        "new_full", "fill_", "zero_", "resize_", "view", "_unsafe_view", "_reshape_alias",
        "reshape", "permute", "transpose", "t", "expand", "as_strided", "as_strided_", "detach",
        "alias", "slice", "select", "unsqueeze", "unsqueeze_", "squeeze", "squeeze_", "split",
        "split_with_sizes", "chunk", "unbind", "narrow", "unflatten", "movedim", "view_as",
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense",
        "lift_fresh", "record_stream", "is_same_size", "_has_compatible_shallow_copy_type",
    }
)
POISON_BYTE = 0xFF  # 0xFF.. is NaN in fp64/fp32/fp16/bf16 and -1 in integer types
MIN_PENDING_MS = 2.0  # GPU work still running this long after the current stream finished


def _torch() -> Any:
    import torch

    return torch


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or str(func).split(".")[0]


# ---------------------------------------------------------------------------------------------
# Torch compute during forward
# ---------------------------------------------------------------------------------------------


def _dispatch_mode_base() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


@functools.cache
def _compute_guard_mode() -> type:
    """The dispatch mode class behind ``TorchComputeGuard`` (built once per process)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: N807
        name = _op_name(func)
        guard = self.guard
        if name not in guard.allowed:
            guard.ops[name] = guard.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    # TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first call
    # imports torch._dynamo (~800 modules: 1 s on the CPU machine, 3.3 s on the H200) to build
    # a dynamo-disabled copy, cached on the function as ``__dynamo_disable``. Dynamo never
    # traces this mode (candidates run eagerly in the worker), so the function is its own
    # disabled copy and the import never happens. If torch stops reading that attribute, the
    # import comes back (slower, still correct).
    setattr(__torch_dispatch__, "__dynamo_disable", __torch_dispatch__)
    return type("ComputeGuardMode", (_dispatch_mode_base(),),
                {"__torch_dispatch__": __torch_dispatch__})


class TorchComputeGuard:
    """Context manager recording aten ops outside ``allowed`` that run inside it.

    A ``TorchDispatchMode`` sees every aten op on every tensor while active, including those a
    ``load_inline`` extension's C++ calls (``torch::matmul`` inside the extension), but not the
    candidate's own CUDA kernels, which never enter the dispatcher.
    """

    def __init__(self, allowed: frozenset[str] | None = None):
        self.allowed = DEFAULT_ALLOWED_OPS if allowed is None else frozenset(allowed)
        self.ops: dict[str, int] = {}
        self._mode: Any = None

    def __enter__(self) -> TorchComputeGuard:
        self._mode = _compute_guard_mode()()
        self._mode.guard = self
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        self._mode = None

    @property
    def findings(self) -> list[Finding]:
        if not self.ops:
            return []
        ops = ", ".join(f"aten::{n} x{c}" for n, c in sorted(self.ops.items()))
        return [Finding(rule="torch_compute_runtime", reason=RejectReason.TORCH_COMPUTE,
                        message=f"torch ops ran during forward: {ops}; compute in your kernels "
                                "(only allocation, views and shape queries are allowed)")]


def warm_up(device: str = "cuda") -> None:
    """Pay the guards' one-time costs in a worker waiting as a spare, not in its first
    candidate's forward: building the dispatch mode class and the first dispatch through it."""
    torch = _torch()
    with TorchComputeGuard():
        torch.empty(1, device=device)


# ---------------------------------------------------------------------------------------------
# Inputs, outputs, threads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TensorSnapshot:
    index: int
    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any
    copy: Any  # a bit-exact clone (same device)


def _tensors(values: Iterable[Any]) -> list[tuple[int, Any]]:
    torch = _torch()
    return [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]


def snapshot_tensors(tensors: Sequence[Any]) -> list[_TensorSnapshot]:
    """Bit-exact copies and metadata of the tensor arguments, taken before forward runs."""
    return [
        _TensorSnapshot(index=i, data_ptr=t.data_ptr(), shape=tuple(t.shape),
                        stride=tuple(t.stride()), dtype=t.dtype, copy=t.detach().clone())
        for i, t in _tensors(tensors)
    ]


def _bits(t: Any) -> Any:
    torch = _torch()
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.element_size() else flat


def _bitwise_equal(a: Any, b: Any) -> bool:
    """Equal bit patterns (NaN-safe: NaN == NaN here, unlike torch.equal on floats)."""
    torch = _torch()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    return bool(torch.equal(_bits(a), _bits(b)))


def check_inputs_unchanged(snapshot: list[_TensorSnapshot], tensors: Sequence[Any]) -> list[Finding]:
    """INPUT_MUTATION when forward changed an input's values, shape, strides or storage."""
    current = dict(_tensors(tensors))
    findings = []
    for snap in snapshot:
        t = current.get(snap.index)
        if t is None:
            continue
        if (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype) != (
                snap.data_ptr, snap.shape, snap.stride, snap.dtype):
            what = "its metadata or storage (resize_/set_/in-place view change)"
        elif not _bitwise_equal(t, snap.copy):
            what = "its values"
        else:
            continue
        findings.append(Finding(rule="input_mutation", reason=RejectReason.INPUT_MUTATION,
                                message=f"forward modified input {snap.index}: {what}; "
                                        "inputs are read-only, write results to new tensors"))
    return findings


def _storage_span(t: Any) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def check_output_aliasing(inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Finding]:
    """OUTPUT_ALIASING when an output's storage overlaps an input's storage."""
    findings = []
    for oi, out in _tensors(outputs):
        o0, o1 = _storage_span(out)
        for ii, inp in _tensors(inputs):
            i0, i1 = _storage_span(inp)
            if o0 < i1 and i0 < o1 and o1 > o0 and i1 > i0:
                findings.append(Finding(
                    rule="output_aliasing", reason=RejectReason.OUTPUT_ALIASING,
                    message=f"output {oi} shares memory with input {ii}; allocate the output "
                            "(torch.empty_like) and have your kernel write it"))
    return findings


def check_output_types(outputs: Sequence[Any]) -> list[Finding]:
    """Outputs must be plain ``torch.Tensor``s: subclasses (lazy tensors) can compute, or fake
    equality, when the harness touches them after timing."""
    torch = _torch()
    bad = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor]
    if not bad:
        return []
    return [Finding(rule="tensor_subclass_output", reason=RejectReason.MONKEY_PATCH,
                    message=f"outputs {bad} are torch.Tensor subclasses; return plain tensors")]


def thread_snapshot() -> frozenset[int]:
    """Idents of the Python threads alive now."""
    return frozenset(t.ident for t in threading.enumerate() if t.ident is not None)


def check_threads(before: frozenset[int], *, grace_s: float = 0.0) -> list[Finding]:
    """THREAD_LEAK when Python threads started during forward are still alive after it."""
    if grace_s:
        time.sleep(grace_s)
    leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    if not leaked:
        return []
    names = ", ".join(sorted(t.name for t in leaked))
    return [Finding(rule="thread_leak", reason=RejectReason.THREAD_LEAK,
                    message=f"threads still running after forward returned: {names}; all work "
                            "must finish (on the current stream) before forward returns")]


# ---------------------------------------------------------------------------------------------
# GPU memory poisoning
# ---------------------------------------------------------------------------------------------


SMALL_REQUEST_BYTES = 1 << 20  # the caching allocator serves requests <= 1 MiB from its small pool


def _inactive_block_sizes(device: int) -> list[int]:
    """Free-block claim sizes for this stream's blocks (all streams' if none match, so a
    changed snapshot format degrades to over-poisoning rather than to none)."""
    sizes = _inactive_block_sizes_for(device, only_current_stream=True)
    return sizes or _inactive_block_sizes_for(device, only_current_stream=False)


def _inactive_block_sizes_for(device: int, *, only_current_stream: bool) -> list[int]:
    """Allocation sizes that claim every free (inactive) cached block on ``device``, largest first.

    A free block in a small-pool segment can be larger than 1 MiB after coalescing, but only
    requests <= 1 MiB are served from that pool, so such blocks are claimed in 1 MiB pieces.
    """
    torch = _torch()
    stream = torch.cuda.current_stream(device).cuda_stream
    sizes = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device) != device:
            continue
        if only_current_stream and segment.get("stream", stream) != stream:
            continue  # other streams' blocks are never handed to this stream's allocations
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            continue  # private pools (CUDA graphs) are not used by ordinary allocations
        small = segment.get("segment_type") == "small"
        for block in segment.get("blocks", []):
            if block.get("state") != "inactive":
                continue
            size = int(block["size"])
            while small and size > SMALL_REQUEST_BYTES:
                sizes.append(SMALL_REQUEST_BYTES)
                size -= SMALL_REQUEST_BYTES
            sizes.append(size)
    return sorted(sizes, reverse=True)


def poison_free_cuda_memory(*, max_blocks: int = 512) -> None:
    """Fill the caching allocator's reserved-but-free GPU memory with NaN bytes (0xFF).

    Defeats returning an uninitialised ``torch.empty`` that lands on a block just freed by the
    reference (Sakana, 2025): the block now holds NaN. Each free block is claimed with an
    allocation of exactly its size (the allocator's best fit then takes that block without
    splitting), filled, and released; the largest-first order keeps small requests out of big
    blocks. Falls back to one allocation of reserved - allocated when no snapshot is available.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    torch.cuda.synchronize()
    try:
        sizes = _inactive_block_sizes(device)[:max_blocks]
    except Exception:  # noqa: BLE001 - snapshot API differences: use the coarse fallback
        sizes = [torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)]
    held = []
    try:
        for size in sizes:
            if size <= 0:
                continue
            block = torch.empty(size, dtype=torch.uint8, device=device)
            block.fill_(POISON_BYTE)
            held.append(block)
    except torch.cuda.OutOfMemoryError:
        pass  # poisoned what fit; never fail the evaluation over it
    finally:
        del held  # freed blocks return to the cache in stream order, after the fills


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


def _pending_ms_after_current_stream() -> float:
    """How long the device stays busy after the current stream's work is complete."""
    torch = _torch()
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    start = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


@contextlib.contextmanager
def _patched_launches(on_launch: Callable[[Any, Any, Callable[[], Any]], Any]) -> Iterator[None]:
    """Route every multiminddev kernel launch through ``on_launch(kernel, stream, launch)`` for
    the block (``launch()`` performs the real one); ``Kernel.__call__`` is restored after."""
    from multiminddev.cuda.kernels import Kernel

    original = Kernel.__call__

    def patched(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        stream = kwargs.get("stream", args[4] if len(args) > 4 else None)
        return on_launch(kernel, stream, lambda: original(kernel, *args, **kwargs))

    Kernel.__call__ = patched
    try:
        yield
    finally:
        Kernel.__call__ = original


class _LaunchStreamMonitor:
    """Records multiminddev kernel launches on a stream other than torch's current stream."""

    def __init__(self) -> None:
        self.off_stream: list[str] = []
        self._patch: Any = None

    def __enter__(self) -> Self:
        torch = _torch()

        def on_launch(kernel: Any, stream: Any, launch: Callable[[], Any]) -> Any:
            if stream is not None and getattr(stream, "cuda_stream", None) != (
                    torch.cuda.current_stream().cuda_stream):
                self.off_stream.append(kernel.name)
            return launch()

        self._patch = _patched_launches(on_launch)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.__exit__(*exc)


def check_streams_synchronized(run_fn: Callable[[], Any] | None = None, *,
                               min_pending_ms: float = MIN_PENDING_MS) -> list[Finding]:
    """UNSYNCED_STREAM: work the timer (events on the current stream) would not see.

    Without ``run_fn`` (call it right after forward, before any synchronize): measures how long
    the GPU stays busy after the current stream finished; side-stream work still running for
    ``min_pending_ms`` or more is reported. With ``run_fn`` (once per evaluation): runs it with
    kernel launches monitored for non-current streams, checks the current stream did not change,
    and compares the outputs read when the current stream finished with the outputs after a
    device-wide synchronize (a side stream still writing them makes the two differ).
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return []
    if run_fn is None:
        return _pending_finding(_pending_ms_after_current_stream(), min_pending_ms)

    torch.cuda.synchronize()
    stream_before = torch.cuda.current_stream().cuda_stream
    with _LaunchStreamMonitor() as monitor:
        outputs = run_fn()
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    event = torch.cuda.Event()
    event.record()
    event.synchronize()
    early = [(i, o.detach().clone()) for i, o in _tensors(outputs)]
    findings = _pending_finding(_pending_ms_after_current_stream(), min_pending_ms)
    changed = [i for i, copy in early if not _bitwise_equal(copy, outputs[i])]
    if changed:
        findings.append(Finding(rule="output_written_after_stream", reason=RejectReason.UNSYNCED_STREAM,
                                message=f"outputs {changed} changed after the current stream "
                                        "finished: work on another stream is still writing them"))
    if monitor.off_stream:
        findings.append(Finding(rule="launch_off_current_stream", reason=RejectReason.UNSYNCED_STREAM,
                                message=f"kernels {sorted(set(monitor.off_stream))} launched on a "
                                        "stream other than torch.cuda.current_stream()"))
    if torch.cuda.current_stream().cuda_stream != stream_before:
        findings.append(Finding(rule="current_stream_changed", reason=RejectReason.UNSYNCED_STREAM,
                                message="forward changed torch's current stream"))
    return findings


def _pending_finding(pending_ms: float, min_pending_ms: float) -> list[Finding]:
    """A finding when work was pending, unless the host itself is stalling (then the wall-clock
    probe is inconclusive: an idle synchronize right after must be fast)."""
    if pending_ms < min_pending_ms:
        return []
    if _pending_ms_after_current_stream() > 0.1 * min_pending_ms:
        return []  # even an idle device took long: host preemption, not side-stream work
    return [Finding(rule="pending_gpu_work", reason=RejectReason.UNSYNCED_STREAM,
                    message=f"GPU work kept running {pending_ms:.2f} ms after the current stream "
                            "finished: launch everything on torch.cuda.current_stream()")]


# ---------------------------------------------------------------------------------------------
# Stale outputs (pointer caches)
# ---------------------------------------------------------------------------------------------


def _refill_in_place(inputs: Sequence[Any], new_inputs: Sequence[Any] | None) -> bool:
    """Write new data into the same input tensors; returns False when nothing changed.

    With ``new_inputs`` (another draw of the problem's ``get_inputs``) those values are copied
    in; otherwise each input's own values are shuffled, which keeps their distribution (valid
    indices stay valid, positive inputs stay positive).
    """
    torch = _torch()
    changed = False
    news = list(new_inputs) if new_inputs is not None else [None] * len(inputs)
    for t, new in zip(inputs, news, strict=False):
        if not isinstance(t, torch.Tensor) or t.numel() < 2:
            continue
        before = t.detach().clone()
        with torch.no_grad():
            if isinstance(new, torch.Tensor) and new.shape == t.shape:
                t.copy_(new)
            else:  # permute on the tensor's own device: fast even for 16M elements
                generator = torch.Generator(device=t.device)
                generator.manual_seed(20240229)
                perm = torch.randperm(t.numel(), generator=generator, device=t.device)
                t.copy_(t.detach().reshape(-1)[perm].reshape(t.shape))
        changed |= not _bitwise_equal(before, t)
    return changed


def check_stale_output(run_fn: Callable[..., Any], inputs: Sequence[Any],
                       reference_fn: Callable[..., Any], *, new_inputs: Sequence[Any] | None = None,
                       atol: float = 1e-2, rtol: float = 1e-2) -> list[Finding]:
    """STALE_OUTPUT: after writing new data into the SAME input tensors, the output must match
    ``reference_fn`` on the new data (defeats caches keyed by data pointer or identity).

    ``run_fn(*inputs)`` and ``reference_fn(*inputs)`` return a tensor or a list of tensors.
    Tolerances are loose on purpose: this looks for reuse, verification checks precision.
    """
    torch = _torch()
    as_list = (lambda x: list(x) if isinstance(x, (list, tuple)) else [x])
    first = [o.detach().clone() for o in as_list(run_fn(*inputs)) if isinstance(o, torch.Tensor)]
    if not _refill_in_place(inputs, new_inputs):
        return []  # constant inputs: nothing to learn
    second = [o for o in as_list(run_fn(*inputs)) if isinstance(o, torch.Tensor)]
    expected = [o for o in as_list(reference_fn(*inputs)) if isinstance(o, torch.Tensor)]
    for i, (got, want) in enumerate(zip(second, expected, strict=False)):
        if got.shape == want.shape and torch.allclose(got.float(), want.float(), atol=atol,
                                                      rtol=rtol, equal_nan=True):
            continue
        stale = i < len(first) and _bitwise_equal(first[i], got)
        detail = ("is identical to the output for the previous data" if stale
                  else "does not match the reference for the new data")
        return [Finding(rule="stale_output", reason=RejectReason.STALE_OUTPUT,
                        message=f"after new values were written into the same input buffers, "
                                f"output {i} {detail}: do not cache results across calls")]
    return []


# ---------------------------------------------------------------------------------------------
# Roofline and kernel-time coverage
# ---------------------------------------------------------------------------------------------


def check_impossible_speed(median_ms: float, bytes_moved: int | None, peak_gbps: float | None,
                           slack: float = 0.9) -> list[Finding]:
    """IMPOSSIBLE_SPEED when the run is faster than moving ``bytes_moved`` at peak bandwidth.

    The floor is ``bytes_moved / peak``; a median below ``slack * floor`` cannot be real (with the
    L2 flushed between runs) and means the work was skipped, cached or done elsewhere.
    """
    if not bytes_moved or not peak_gbps or peak_gbps <= 0:
        return []
    if not 0 < slack <= 1:
        raise ValueError(f"slack must be in (0, 1], got {slack}; 0.9 allows 11% above peak")
    floor_ms = bytes_moved / (peak_gbps * 1e9) * 1e3
    if median_ms >= slack * floor_ms:
        return []
    return [Finding(rule="impossible_speed", reason=RejectReason.IMPOSSIBLE_SPEED,
                    message=f"median {median_ms:.4f} ms is below the roofline floor "
                            f"{floor_ms:.4f} ms ({bytes_moved} bytes at {peak_gbps:.0f} GB/s): "
                            "the work cannot have been done")]


def coverage_from_kernel_times(kernel_times: Iterable[tuple[str, float]],
                               own_kernel_names: Iterable[str]) -> float | None:
    """Share of GPU kernel time spent in the candidate's own kernels.

    A profiled kernel counts only when its function name (``kernel_function_name``: the
    profiler's demangled or mangled name without return type, template arguments and
    parameters) is exactly one of ``own_kernel_names``, or that name in the candidate's own
    anonymous namespace. Never by substring: a vendor kernel such as ``ampere_sgemm_relu_nn`` or
    torch's ``at::native::relu_kernel`` does not become the candidate's because it contains the
    candidate's kernel name."""
    names = {n for n in own_kernel_names if n}
    times = list(kernel_times)
    total = sum(t for _, t in times)
    if not names or total <= 0:
        return None
    own_names = names | {f"{ANONYMOUS_NAMESPACE}::{n}" for n in names}
    own = sum(t for name, t in times if kernel_function_name(name) in own_names)
    return own / total


ANONYMOUS_NAMESPACE = "(anonymous namespace)"
_OPEN, _CLOSE = "(<[", ")>]"


def kernel_function_name(profiled: str) -> str:
    """The qualified function name of a kernel as a profiler reports it.

    ``relu`` (extern "C") -> ``relu``; ``void my_kernel<float, 4>(float const*, int)`` ->
    ``my_kernel``; ``at::native::vectorized_elementwise_kernel<4, ...>(int, ...)`` ->
    ``at::native::vectorized_elementwise_kernel``; mangled ``_ZN2ns6kernelEPf`` -> ``ns::kernel``.
    """
    text = profiled.strip()
    if text.startswith("_Z"):
        return _demangled_function_name(text) or text
    if text.endswith(")"):
        text = text[: _matching_open(text, len(text) - 1)].rstrip()
    if text.endswith(">"):
        text = text[: _matching_open(text, len(text) - 1)].rstrip()
    return _after_last_top_level_space(text)


def _matching_open(text: str, close_at: int) -> int:
    """Index of the bracket that opens the one closing at ``close_at`` (0 if unbalanced)."""
    depth = 0
    for i in range(close_at, -1, -1):
        if text[i] in _CLOSE:
            depth += 1
        elif text[i] in _OPEN:
            depth -= 1
            if depth == 0:
                return i
    return 0


def _after_last_top_level_space(text: str) -> str:
    """Drops a return type: what follows the last space outside brackets."""
    depth, cut = 0, 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i + 1
    return text[cut:]


def _demangled_function_name(mangled: str) -> str | None:
    """The qualified name of an Itanium-mangled function (``_Z<name>`` or ``_ZN<parts>E``),
    from its source-name components only; None for forms this does not read."""
    i = 3 if mangled.startswith("_ZL") else 2  # L: internal linkage (a static function)
    nested = mangled.startswith("_ZN")
    if nested:
        i = 3
        while i < len(mangled) and mangled[i] in "rVKRO":  # cv / ref qualifiers of methods
            i += 1
    parts: list[str] = []
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while j < len(mangled) and mangled[j].isdigit():
            j += 1
        length = int(mangled[i:j])
        part = mangled[j:j + length]
        if len(part) != length:
            return None
        parts.append(ANONYMOUS_NAMESPACE if part.startswith("_GLOBAL__N") else part)
        i = j + length
        if not nested:
            break
        if i < len(mangled) and mangled[i] == "I":  # template arguments of a nested component
            return None
    if not parts or (nested and (i >= len(mangled) or mangled[i] != "E")):
        return None
    return "::".join(parts)


def kernel_time_coverage(run_fn: Callable[[], Any], own_kernel_names: Iterable[str]) -> float | None:
    """Fraction of the CUDA kernel time of one ``run_fn()`` spent in the candidate's kernels,
    matched by exact function name (``coverage_from_kernel_times``).

    None when there are no names to look for, no GPU, or the profiler saw no kernel time.
    """
    torch = _torch()
    names = list(own_kernel_names)
    if not names or not torch.cuda.is_available():
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        # "Profiler clears events at the end of each cycle": true and harmless for one cycle,
        # but printed once per worker, i.e. once per evaluated candidate.
        warnings.filterwarnings("ignore", message="Profiler clears events")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_fn()
            torch.cuda.synchronize()
        events = prof.events()
    # Device-side events (kernels, memsets, copies) carry the GPU time; CPU ops are skipped so
    # nothing is counted twice.
    times = [(e.name, float(e.device_time_total)) for e in events
             if getattr(e, "device_type", None) == DeviceType.CUDA]
    return coverage_from_kernel_times(times, names)


def coverage_from_event_times(own_ms: Iterable[float], total_ms: float) -> float | None:
    """Share of a run's GPU time (``total_ms``) spent in the candidate's own launches; None when
    nothing was timed. Clamped to 1: launches on another stream can overlap the interval (the
    stream guard deals with those)."""
    if not total_ms or total_ms <= 0 or not math.isfinite(total_ms):
        return None
    return min(1.0, max(0.0, sum(own_ms)) / total_ms)


class _OwnLaunchTimer:
    """Brackets each launch of the candidate's own multiminddev kernels with CUDA events on its
    stream. Own means: the kernel belongs to one of the given compile results (by identity, the
    very objects this job's compiles produced), not merely that it has a familiar name."""

    def __init__(self, own_compiles: Iterable[Any]):
        self._own = list(own_compiles)  # kept alive so their ids stay theirs
        self._own_ids = {id(c) for c in self._own}
        self.launches: list[tuple[str, Any, Any]] = []
        self._patch: Any = None

    def owns(self, kernel: Any) -> bool:
        owner = getattr(kernel, "_owner", None)
        return id(getattr(owner, "compile_result", None)) in self._own_ids

    def __enter__(self) -> Self:
        torch = _torch()

        def on_launch(kernel: Any, stream: Any, launch: Callable[[], Any]) -> Any:
            if not self.owns(kernel):
                return launch()
            on = None
            if stream is not None:
                on = stream if isinstance(stream, torch.cuda.Stream) else torch.cuda.ExternalStream(
                    stream.cuda_stream)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(on)
            result = launch()
            end.record(on)
            self.launches.append((kernel.name, start, end))
            return result

        self._patch = _patched_launches(on_launch)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.__exit__(*exc)

    def own_ms(self) -> list[float]:
        return [start.elapsed_time(end) for _, start, end in self.launches]


COVERAGE_HOLD_CYCLES = 16_000_000  # ~8 ms of GPU spin while the host enqueues one forward


def kernel_time_coverage_events(run_fn: Callable[[], Any], own_compiles: Iterable[Any]
                                ) -> float | None:
    """Like ``kernel_time_coverage`` for NVRTC kernels, from CUDA events instead of the profiler
    (CUPTI's first use costs seconds per process, and every candidate gets a fresh process).
    ``own_compiles``: the ``CompileResult`` objects of the candidate's own ``compile_kernels``
    calls (``multiminddev.cuda.kernels.compile_log``); launches of kernels from those modules
    are its own, matched by identity.

    The run starts behind a GPU spin kernel, as in ``benchmark.time_cuda``, so the interval
    between the begin and end events holds GPU work only, not gaps while Python enqueues; if the
    host took longer than the spin, the run is repeated behind a longer one. Each launch of the
    candidate's own kernels is bracketed by its own events. None without own compiles or a GPU.
    """
    from multiminddev.env.benchmark import _cycles_to_cover, _hold_gpu

    torch = _torch()
    own = list(own_compiles)
    if not own or not torch.cuda.is_available():
        return None
    hold = COVERAGE_HOLD_CYCLES
    for _ in range(2):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with _OwnLaunchTimer(own) as timer:
            enqueue_start = time.perf_counter()
            _hold_gpu(torch, hold)
            begin.record()
            run_fn()
            end.record()
            host_seconds = time.perf_counter() - enqueue_start
        torch.cuda.synchronize()
        needed = _cycles_to_cover(host_seconds)
        if needed <= hold:
            break
        hold = needed
    return coverage_from_event_times(timer.own_ms(), begin.elapsed_time(end))


def check_kernel_coverage(fraction: float | None, threshold: float = 0.5) -> list[Finding]:
    """LOW_KERNEL_COVERAGE when the candidate's kernels are under ``threshold`` of the GPU time."""
    if fraction is None or fraction >= threshold:
        return []
    return [Finding(rule="kernel_time_coverage", reason=RejectReason.LOW_KERNEL_COVERAGE,
                    message=f"the candidate's own kernels account for {fraction:.0%} of its GPU "
                            f"time (minimum {threshold:.0%}); do the work in your kernels")]
