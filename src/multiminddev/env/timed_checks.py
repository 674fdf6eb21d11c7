"""Every timed call is a checked call: fresh inputs per call, hidden checks among them.

The candidate's timing (``stages._benchmark_candidate``) runs ``n`` calls, fixed before the
first one from a time budget. Each call gets inputs of its own, drawn by the problem's
``get_inputs()`` from fresh OS randomness and copied into newly allocated buffers, so a result
cached across calls (by identity, address, sampled values or a full hash) is the answer to other
data. At ``k`` positions, drawn at random once ``n`` is known, the copied-in data is instead one
of the input sets the trusted setup prepared before the candidate loaded, whose reference outputs
the evaluator already holds; those calls' outputs are copied aside and verified in the evaluator.
Checked and unchecked calls do the same work in the same order (draw, allocate, copy in, flush,
run, record the output's layout, copy the output out), so nothing the candidate can observe
(values, addresses, strides, time between calls) tells them apart. What the harness allocates
and frees around a call stays out of the candidate's allocations: the fresh draw (with every
temporary ``get_inputs()`` makes), the prepared inputs and the output buffers live in a private
allocator pool (``HarnessPool``), so the caching allocator never hands their blocks, and the
data left in them (which equals an unchecked call's inputs), to the candidate; and torch's
generators are reseeded after every draw, so their state does not replay it. The argument
buffers the candidate receives are the only harness allocations in its pool, made the same way
in every call.

A candidate wrong on a fraction ``f`` of the ``n`` timed calls escapes all ``k`` checks with
probability ``escape_probability(n, k, f)`` (hypergeometric; about ``(1 - f) ** k``): the
parent reports it at ``f = 1/4`` (``ESCAPE_FRACTION``). ``check_plan`` keeps it below
``ESCAPE_TARGET``: ``k = checks_for_escape()`` (25) checks where their memory fits, and where
fewer fit, fewer timed calls (a few checks cover a larger share of them).

Covered: result caching, replayed inputs, skipping work only while timed, telling checked
calls by the memory or generator state the harness leaves. Not covered: a candidate that reads
this process's memory at addresses it was not given (native ``load_inline`` code that finds
them; reading past the end of its own buffers stays in segments the pool does not use); the
static allowlist keeps candidate Python away from these objects, and the OS isolation and the
parent-side verification bound what native code can forge.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from multiminddev.env.precision import OutputLayout, output_layout

MIB = 1 << 20
# A candidate wrong on a quarter of its timed calls escapes every check with probability below
# one in a thousand: the figure ``checks_for_escape`` sizes the checked calls for.
ESCAPE_FRACTION = 0.25
ESCAPE_TARGET = 1e-3


def escape_probability(n_calls: int, n_checks: int, wrong_fraction: float) -> float:
    """Probability that ``k = min(n_checks, n_calls)`` checked positions, drawn without
    replacement from ``n_calls`` timed calls, all miss the ``ceil(f * n_calls)`` wrong ones
    (hypergeometric: ``C(n - w, k) / C(n, k)``; pure). 1.0 when no call is checked or none is
    wrong; 0.0 once ``k > n - w``."""
    if n_calls <= 0:
        return 1.0
    wrong = min(n_calls, math.ceil(wrong_fraction * n_calls - 1e-9))
    k = max(0, min(n_checks, n_calls))
    if wrong <= 0 or k == 0:
        return 1.0
    if k > n_calls - wrong:
        return 0.0
    return math.comb(n_calls - wrong, k) / math.comb(n_calls, k)


def binomial_escape(n_checks: int, wrong_fraction: float) -> float:
    """``(1 - f) ** k``: the escape probability with checks drawn independently, the limit of
    ``escape_probability`` for many calls and an upper bound on it (pure)."""
    return (1.0 - wrong_fraction) ** max(0, n_checks)


def checks_for_escape(target: float = ESCAPE_TARGET,
                      wrong_fraction: float = ESCAPE_FRACTION) -> int:
    """The fewest checked calls ``k`` with ``(1 - f) ** k < target``: below ``target`` for any
    number of timed calls (the hypergeometric figure is never above the binomial; pure).
    25 for the defaults (0.75 ** 25 = 7.5e-4)."""
    if not 0 < wrong_fraction < 1 or not 0 < target < 1:
        raise ValueError("checks_for_escape needs 0 < wrong_fraction < 1 and 0 < target < 1")
    return math.floor(math.log(target) / math.log(1.0 - wrong_fraction)) + 1


def timed_check_count(wanted: int, budget_mib: float, bytes_per_call: int, floor: int = 2) -> int:
    """Checked calls per timing run: ``wanted``, fewer when their inputs and outputs together
    would exceed ``budget_mib`` (they are held on the GPU and sent to the evaluator), never
    fewer than ``floor`` (pure)."""
    if bytes_per_call <= 0:
        return wanted
    return max(min(floor, wanted), min(wanted, int(budget_mib * MIB // bytes_per_call)))


def worst_escape(n_checks: int, min_runs: int, max_runs: int,
                 wrong_fraction: float = ESCAPE_FRACTION) -> float:
    """The largest ``escape_probability`` over every number of timed calls the timing may pick
    in ``[min_runs, max_runs]`` (pure)."""
    return max(escape_probability(n, n_checks, wrong_fraction)
               for n in range(min_runs, max(min_runs, max_runs) + 1))


def runs_for_escape(n_checks: int, min_runs: int, max_runs: int, *,
                    wrong_fraction: float = ESCAPE_FRACTION,
                    target: float = ESCAPE_TARGET) -> int:
    """The most timed calls, within ``[min_runs, max_runs]``, such that every count from
    ``min_runs`` up to it keeps ``escape_probability`` below ``target``: fewer calls make a
    few checks cover a larger share of them. ``min_runs`` where even that count does not
    (pure)."""
    runs = min_runs
    for n in range(min_runs, max_runs + 1):
        if escape_probability(n, n_checks, wrong_fraction) >= target:
            break
        runs = n
    return runs


def fewest_checks(min_runs: int, *, wrong_fraction: float = ESCAPE_FRACTION,
                  target: float = ESCAPE_TARGET) -> int:
    """The fewest checks that keep the escape below ``target`` with ``min_runs`` timed calls
    (pure): the floor of the check count however large the calls (8 for 10 calls)."""
    k = 1
    while k < min_runs and escape_probability(min_runs, k, wrong_fraction) >= target:
        k += 1
    return k


@dataclass(frozen=True)
class CheckPlan:
    """How a problem's timing is checked: ``checks`` checked calls among at most ``max_runs``
    timed calls, and the worst chance that a candidate wrong on ``ESCAPE_FRACTION`` of them
    passes every check (over the call counts the timing may pick)."""

    bytes_per_call: int  # one call's input plus output bytes
    checks: int
    max_runs: int
    escape: float


def check_plan(bytes_per_call: int, *, wanted: int, budget_mib: float, min_runs: int,
               max_runs: int) -> CheckPlan:
    """``wanted`` checks within the memory budget (never fewer than ``fewest_checks``), and
    the timed calls capped where fewer checks would otherwise let the escape reach
    ``ESCAPE_TARGET`` (pure)."""
    checks = timed_check_count(wanted, budget_mib, bytes_per_call, floor=fewest_checks(min_runs))
    runs = max_runs
    if worst_escape(checks, min_runs, max_runs) >= ESCAPE_TARGET:
        runs = runs_for_escape(checks, min_runs, max_runs)
    return CheckPlan(bytes_per_call=bytes_per_call, checks=checks, max_runs=runs,
                     escape=worst_escape(checks, min_runs, runs))


def check_plan_table(sizes: Sequence[int], *, wanted: int, budget_mib: float, min_runs: int,
                     max_runs: int) -> list[CheckPlan]:
    """Problem size (bytes per call) -> checked calls -> timed calls -> escape (pure)."""
    return [check_plan(size, wanted=wanted, budget_mib=budget_mib, min_runs=min_runs,
                       max_runs=max_runs) for size in sizes]


def choose_check_positions(n_calls: int, n_checks: int, rng: random.Random) -> dict[int, int]:
    """``{call index: check index}`` for ``min(n_calls, n_checks)`` distinct calls drawn
    uniformly from ``range(n_calls)``; check indices follow call order (pure given ``rng``)."""
    calls = sorted(rng.sample(range(n_calls), min(n_calls, n_checks)))
    return {call: check for check, call in enumerate(calls)}


def tensor_bytes(values: Sequence[Any]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


class HarnessPool:
    """A caching-allocator pool of the harness's own: blocks allocated inside ``allocating()``
    are reused only by later allocations inside it, never handed to the candidate's
    ``torch.empty``, so the data the harness leaves in them cannot reach the candidate through
    an uninitialised allocation. Where torch has no ``MemPool``, ``scrub`` overwrites what the
    harness frees instead (the draw's own temporaries then stay unscrubbed)."""

    def __init__(self) -> None:
        self._pool = _usable_mem_pool()

    @property
    def private(self) -> bool:
        return self._pool is not None

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        import torch

        if self._pool is None:
            yield
            return
        with torch.cuda.use_mem_pool(self._pool):
            yield

    def scrub(self, values: Sequence[Any]) -> None:
        """Zero the tensors the harness is about to free (only without a private pool)."""
        import torch

        if self._pool is None:
            for value in values:
                if type(value) is torch.Tensor and value.is_cuda:
                    value.zero_()


def _usable_mem_pool() -> Any:
    """A ``torch.cuda.MemPool`` that took an allocation, or None where torch has none or it
    fails here (the harness then scrubs what it frees instead of failing the timing)."""
    import torch

    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        return None
    try:
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            probe = torch.empty(1, device="cuda")
        del probe
        return pool
    except (RuntimeError, TypeError, AttributeError):
        return None


def reseed_generators() -> None:
    """Reseed torch's CPU and CUDA generators from OS randomness: after a draw, their seed and
    state say nothing about the inputs just drawn (a candidate could otherwise redraw them
    and compare with its arguments: equal only on unchecked calls)."""
    import torch

    torch.manual_seed(random.SystemRandom().randrange(1 << 62))  # seeds every CUDA device too


@dataclass
class CheckedCalls:
    """The three parts of a timed call (see ``benchmark.TimedCalls``) for one candidate.

    ``draw_inputs()`` returns a fresh input list (new random data each call);
    ``check_inputs[k]`` are the prepared input sets; ``output_specs`` the reference outputs'
    (shape, dtype), which size the buffers outputs are copied into; ``forward(args)`` runs the
    candidate (inside the compute guard, if any) and returns its outputs as a list."""

    draw_inputs: Callable[[], list[Any]]
    check_inputs: list[list[Any]]
    output_specs: list[tuple[tuple[int, ...], Any]]
    forward: Callable[[list[Any]], list[Any]]
    rng: random.Random
    positions: dict[int, int] = field(default_factory=dict)
    checked: list[list[Any] | None] = field(default_factory=list)
    # The checked calls' output layouts, taken on the device before the copy (which is dense):
    # the parent holds every checked output to the density rule, as it does the trials'.
    checked_layouts: list[list[Any] | None] = field(default_factory=list)
    # The distinct output layouts of every call, checked or not (layouts are metadata, so the
    # density rule covers the unchecked calls too; kept as their to_dict() forms).
    call_layouts: list[list[dict[str, Any] | None]] = field(default_factory=list)
    # Timed calls that returned an object passing isinstance(torch.Tensor) without being one
    # (a lazy output whose own methods would run later, in the harness): checked or not.
    posing_calls: list[int] = field(default_factory=list)
    # The harness's pool (where the prepared inputs were drawn); None: one of its own.
    pool: HarnessPool | None = None
    _sinks: list[list[Any]] = field(default_factory=list)
    _scratch: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        import torch

        if self.pool is None:
            self.pool = HarnessPool()

        def buffers() -> list[Any]:
            return [torch.empty(shape, dtype=dtype, device="cuda")
                    for shape, dtype in self.output_specs]

        # Allocated before timing, in the harness's pool, so a checked call allocates exactly
        # what an unchecked one does and no candidate allocation lands beside these buffers.
        with self.pool.allocating():
            self._sinks = [buffers() for _ in self.check_inputs]
            self._scratch = buffers()
        self.checked = [None] * len(self.check_inputs)
        self.checked_layouts = [None] * len(self.check_inputs)

    def plan(self, n_calls: int) -> None:
        self.positions = choose_check_positions(n_calls, len(self.check_inputs), self.rng)

    def prepare(self, i: int) -> list[Any]:
        """The call's arguments: new buffers in the candidate's pool, filled from a fresh draw
        or, at a check position, from a prepared input set. The draw happens in every call, in
        the harness's pool, and the generators are reseeded after it."""
        import torch

        with self.pool.allocating():
            fresh = self.draw_inputs()
        reseed_generators()
        check = self.positions.get(i)
        source = fresh if check is None else self.check_inputs[check]
        args = [torch.empty_like(s).copy_(s) if isinstance(s, torch.Tensor) else s
                for s in source]
        self.pool.scrub(fresh)
        return args

    def run(self, args: list[Any]) -> list[Any]:
        return self.forward(args)

    def finish(self, i: int, outputs: list[Any]) -> None:
        check = self.positions.get(i)
        sinks = self._scratch if check is None else self._sinks[check]
        if any(_poses_as_tensor(out) for out in outputs):
            self.posing_calls.append(i)
        layouts = [_layout(out) for out in outputs]  # every call: the same host work
        seen = [lay.to_dict() if lay is not None else None for lay in layouts]
        if seen not in self.call_layouts:
            self.call_layouts.append(seen)
        copied = _copy_outputs(outputs, sinks)
        if check is not None:
            # An output that does not fit its buffer (wrong shape, dtype, not a tensor) is kept
            # as it is: verification reports the mismatch.
            self.checked[check] = copied
            self.checked_layouts[check] = layouts

    def checked_outputs(self) -> list[list[Any]]:
        """The outputs of the checked calls that ran, in check order."""
        return [outs for outs in self.checked if outs is not None]

    def release(self) -> None:
        """Drop the harness's buffers and pool and return their memory to the driver (call it
        once the checked outputs are on the host; a pool given to it is freed once its owner
        drops it too): the poisoning of free memory before later code then meets no block of
        a pool nothing uses."""
        import torch

        self._sinks, self._scratch = [], []
        self.checked = [None] * len(self.checked)
        self.pool = None
        torch.cuda.empty_cache()

    def checked_output_layouts(self) -> list[list[dict[str, Any] | None]]:
        """The layouts (``OutputLayout.to_dict()``, None for a non-tensor) of the checked
        calls that ran, in check order: one list per ``checked_outputs()`` entry."""
        return [[lay.to_dict() if lay is not None else None for lay in layouts]
                for outs, layouts in zip(self.checked, self.checked_layouts, strict=True)
                if outs is not None and layouts is not None]


def _layout(value: Any) -> OutputLayout | None:
    """The layout of a plain tensor output (None for anything else, a tensor look-alike
    included: its own methods are never called here)."""
    import torch

    return output_layout(value) if type(value) is torch.Tensor else None


def _poses_as_tensor(value: Any) -> bool:
    """An object that answers isinstance(torch.Tensor) (through ``__class__``) but is not one."""
    import torch

    return type(value) is not torch.Tensor and isinstance(value, torch.Tensor)


def _copy_outputs(outputs: list[Any], sinks: list[Any]) -> list[Any]:
    """Copy each output into its buffer (same shape and dtype); anything else is returned
    unchanged. The copy runs on the current stream after the call's end event."""
    import torch

    if len(outputs) != len(sinks):
        return list(outputs)
    kept = []
    for out, sink in zip(outputs, sinks, strict=True):
        fits = (type(out) is torch.Tensor and out.shape == sink.shape
                and out.dtype == sink.dtype and out.is_cuda)
        if fits:
            sink.copy_(out)
            kept.append(sink)
        else:
            kept.append(out)
    return kept
