"""Trusted-setup helpers for the precision and layout checks: a float64 ground truth of the
reference model, and the layout facts of an output tensor.

Runs in the worker before any candidate code loads. The parent judges a candidate's float32
output against the float64 ground truth, allowing a multiple of eager PyTorch's own error
(``verify.verify_precision``), and refuses non-dense outputs (``verify.layout_mismatches``).

torch is imported inside functions only, so importing ``multiminddev.env`` stays light.

Covered: models whose every floating op runs in float64 once the model and the floating inputs
are converted. Not covered (the ground truth is reported unavailable, with the reason, and the
parent falls back to a magnitude-normalised comparison against eager): models that fix a dtype
inside ``forward`` (``x.float()``, ``dtype=torch.float32``), ops without float64 kernels,
models that cannot be deep-copied, and a float64 copy that does not fit in GPU memory.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from multiminddev.env.candidate import as_output_list


@dataclass(kw_only=True)
class GroundTruth:
    """The reference model's outputs computed in float64, or why there are none.

    ``outputs`` are on the CPU, one per model output: floating outputs as float64 (complex as
    complex128), other outputs (integer, bool, non-tensors) as the float64 model returned them.
    A float64 output is twice the bytes of the float32 reference output; the float64 copy of
    the model takes twice its parameters' memory on the GPU while it runs."""

    outputs: list[Any] | None
    reason: str = ""  # why ``outputs`` is None
    seconds: float = 0.0

    @property
    def available(self) -> bool:
        return self.outputs is not None


def ground_truth_outputs(model: Any, inputs: Sequence[Any]) -> GroundTruth:
    """Run a float64 deep copy of ``model`` on float64 copies of the floating ``inputs``.

    Integer and bool inputs, and non-tensor inputs, go in unchanged. Leaves ``model``, the
    ``inputs`` and the RNG states (CPU and the inputs' GPUs) as they were. The default dtype is
    float64 during the call, so tensors the model creates inside ``forward`` are float64 too.
    Any floating tensor of another dtype seen by an op during the call (an explicit cast, a
    dtype fixed in the model) makes the result unavailable: such a "ground truth" would be no
    more precise than eager, and judging a candidate against it would reject honest kernels."""
    import torch

    start = time.perf_counter()
    try:
        twin = copy.deepcopy(model)
    except Exception as exc:  # noqa: BLE001 - any failure only means "no ground truth"
        return _unavailable(f"the model cannot be deep-copied: {_describe(exc)}", start)
    devices = sorted({x.device.index or 0 for x in _tensors(inputs) if x.device.type == "cuda"})
    default_dtype = torch.get_default_dtype()
    try:
        twin = _widen_attributes(twin.double())
        wide = [_widen(x) for x in inputs]
        watch = _LowPrecisionWatch()
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.set_default_dtype(torch.float64)
            with watch.mode():
                outputs = as_output_list(twin(*wide))
        if watch.seen:
            return _unavailable(f"the model computes in {watch.seen} under float64 inputs "
                                f"(op {watch.op}): it fixes a dtype inside forward", start)
        for index, out in enumerate(outputs):
            if _is_floating(out) and out.dtype not in (torch.float64, torch.complex128):
                return _unavailable(f"output {index} is {_dtype_name(out.dtype)} under float64 "
                                    "inputs: the model fixes its output dtype", start)
        host = [out.detach().to("cpu") if isinstance(out, torch.Tensor) else out for out in outputs]
        del outputs
    except torch.cuda.OutOfMemoryError:
        return _unavailable("the float64 model does not fit in GPU memory", start)
    except Exception as exc:  # noqa: BLE001 - an op without float64 support, a dtype check, ...
        return _unavailable(f"the model does not run in float64: {_describe(exc)}", start)
    finally:
        torch.set_default_dtype(default_dtype)
        # The float64 copy's memory stays in torch's cache: blocks handed back to the driver
        # could come back to a candidate's allocation with their contents, while cached free
        # blocks are poisoned before candidate code runs.
        del twin
    return GroundTruth(outputs=host, seconds=time.perf_counter() - start)


@dataclass(kw_only=True, frozen=True)
class OutputLayout:
    """Layout facts of one output tensor, taken on the device (copying to the host makes a
    non-dense tensor contiguous). Plain data: sent from the worker as ``to_dict()``."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dense: bool  # non-overlapping and dense: every element has its own address, no gaps

    def __post_init__(self) -> None:  # lists after a round trip through JSON
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "stride", tuple(int(s) for s in self.stride))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputLayout:
        return cls(shape=data["shape"], stride=data["stride"], dense=bool(data["dense"]))


def output_layout(value: Any) -> OutputLayout | None:
    """The layout of a tensor output (None for anything else). Call it on the device."""
    import torch

    if not isinstance(value, torch.Tensor):
        return None
    shape, stride = tuple(value.shape), tuple(value.stride())
    return OutputLayout(shape=shape, stride=stride, dense=is_dense(shape, stride))


def is_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a strided layout is non-overlapping and dense: some permutation of the
    dimensions is contiguous. Size-1 dimensions (any stride) and empty tensors do not count.
    An ``expand()``ed tensor (stride 0), an overlapping view or a view with gaps is not."""
    if any(size == 0 for size in shape):
        return True
    dims = sorted(((st, size) for size, st in zip(shape, stride, strict=True) if size != 1))
    expected = 1
    for st, size in dims:
        if st != expected:
            return False
        expected *= size
    return True


# ---------------------------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------------------------


@dataclass
class _LowPrecisionWatch:
    """Records the first floating tensor that is not float64 (complex128) seen by an op."""

    seen: str = ""
    op: str = ""

    def mode(self) -> Any:
        mode = _watch_mode_class()()
        mode.watch = self
        return mode


@functools.cache
def _watch_mode_class() -> type:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    wide = (torch.float64, torch.complex128)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        watch = self.watch
        if not watch.seen:
            for x in tree_flatten((args, kwargs, out))[0]:
                if isinstance(x, torch.Tensor) and _is_floating(x) and x.dtype not in wide:
                    watch.seen, watch.op = _dtype_name(x.dtype), str(func)
                    break
        return out

    # As in guards.py: skip the torch._dynamo import TorchDispatchMode would make on first use.
    setattr(__torch_dispatch__, "__dynamo_disable", __torch_dispatch__)
    return type("LowPrecisionWatchMode", (TorchDispatchMode,),
                {"__torch_dispatch__": __torch_dispatch__})


def _widen(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.to(torch.complex128)
        return value.to(torch.float64) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_widen(v) for v in value)
    return value


def _widen_attributes(model: Any) -> Any:
    """Floating tensors kept as plain attributes (``self.scale = torch.tensor(0.5)``), which
    ``Module.double()`` leaves alone, widened too (the model is the deep copy)."""
    import torch

    for module in model.modules() if isinstance(model, torch.nn.Module) else ():
        for name, value in list(vars(module).items()):
            if _is_floating(value) and not isinstance(value, torch.nn.Parameter):
                setattr(module, name, _widen(value))
    return model


def _tensors(values: Sequence[Any]) -> list[Any]:
    import torch

    found: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors(value))
    return found


def _is_floating(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _unavailable(reason: str, start: float) -> GroundTruth:
    return GroundTruth(outputs=None, reason=reason, seconds=time.perf_counter() - start)
