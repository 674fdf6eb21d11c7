"""Every timed call is a checked call: fresh inputs per call, hidden checks among them.

The candidate's timing (``stages._benchmark_candidate``) runs ``n`` calls, fixed before the
first one from a time budget. Each call gets inputs of its own, drawn by the problem's
``get_inputs()`` from fresh OS randomness and copied into newly allocated buffers, so a result
cached across calls (by identity, address, sampled values or a full hash) is the answer to other
data. At ``k`` positions, drawn at random once ``n`` is known, the copied-in data is instead one
of the input sets the trusted setup prepared before the candidate loaded, whose reference outputs
the evaluator already holds; those calls' outputs are copied aside and verified in the evaluator.
Checked and unchecked calls do the same work in the same order (draw, allocate, copy in, flush,
run, copy the output out), so nothing the candidate can observe (values, addresses, strides,
time between calls) tells them apart. A candidate that skips work on a fraction ``f`` of the
calls (``f > 1/2`` to move the median) escapes all ``k`` checks with probability about
``(1 - f) ** k``.

Covered: result caching, replayed inputs, skipping work only while timed. Not covered: a
candidate that reads this process's memory to find the check positions (native ``load_inline``
code can); the static allowlist keeps candidate Python away from these objects, and the OS
isolation and the parent-side verification bound what native code can forge.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20


def timed_check_count(wanted: int, budget_mib: float, bytes_per_call: int) -> int:
    """Checked calls per timing run: ``wanted``, fewer when their inputs and outputs together
    would exceed ``budget_mib`` (they are held on the GPU and sent to the evaluator), never
    fewer than 2 (pure)."""
    if bytes_per_call <= 0:
        return wanted
    return max(2, min(wanted, int(budget_mib * MIB // bytes_per_call)))


def choose_check_positions(n_calls: int, n_checks: int, rng: random.Random) -> dict[int, int]:
    """``{call index: check index}`` for ``min(n_calls, n_checks)`` distinct calls drawn
    uniformly from ``range(n_calls)``; check indices follow call order (pure given ``rng``)."""
    calls = sorted(rng.sample(range(n_calls), min(n_calls, n_checks)))
    return {call: check for check, call in enumerate(calls)}


def tensor_bytes(values: Sequence[Any]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


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
    # Timed calls that returned an object passing isinstance(torch.Tensor) without being one
    # (a lazy output whose own methods would run later, in the harness): checked or not.
    posing_calls: list[int] = field(default_factory=list)
    _sinks: list[list[Any]] = field(default_factory=list)
    _scratch: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        import torch

        def buffers() -> list[Any]:
            return [torch.empty(shape, dtype=dtype, device="cuda")
                    for shape, dtype in self.output_specs]

        # Allocated before timing, so a checked call allocates exactly what an unchecked one does.
        self._sinks = [buffers() for _ in self.check_inputs]
        self._scratch = buffers()
        self.checked = [None] * len(self.check_inputs)

    def plan(self, n_calls: int) -> None:
        self.positions = choose_check_positions(n_calls, len(self.check_inputs), self.rng)

    def prepare(self, i: int) -> list[Any]:
        import torch

        fresh = self.draw_inputs()
        check = self.positions.get(i)
        source = fresh if check is None else self.check_inputs[check]
        return [torch.empty_like(s).copy_(s) if isinstance(s, torch.Tensor) else s
                for s in source]

    def run(self, args: list[Any]) -> list[Any]:
        return self.forward(args)

    def finish(self, i: int, outputs: list[Any]) -> None:
        check = self.positions.get(i)
        sinks = self._scratch if check is None else self._sinks[check]
        if any(_poses_as_tensor(out) for out in outputs):
            self.posing_calls.append(i)
        copied = _copy_outputs(outputs, sinks)
        if check is not None:
            # An output that does not fit its buffer (wrong shape, dtype, not a tensor) is kept
            # as it is: verification reports the mismatch.
            self.checked[check] = copied

    def checked_outputs(self) -> list[list[Any]]:
        """The outputs of the checked calls that ran, in check order."""
        return [outs for outs in self.checked if outs is not None]


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
