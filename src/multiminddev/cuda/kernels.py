"""``compile_kernels(src)``: compile CUDA C++ with NVRTC and launch it on torch tensors.

    kernels = compile_kernels(SRC)
    kernels.relu(grid=(blocks,), block=(256,), args=(x, y, n))

Kernels launch on torch's current stream, with torch tensors as pointer arguments; scalar
arguments are converted to the C type in the kernel's signature. On a machine without a GPU
the source still compiles (for ``DEFAULT_ARCH``) so compile errors and resource usage are
known; launching then raises ``NoGPUError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from multiminddev.core.results import CompileResult, StageStatus
from multiminddev.cuda.compiler import CompiledModule, CompileOptions, compile_cuda, define_options
from multiminddev.cuda.signature import (
    POINTEE_TORCH_DTYPES,
    SCALAR_TYPES,
    KernelSignature,
    parse_kernel_signatures,
)

# Every module compiled in this process, oldest first. The evaluation worker reads it to report
# the candidate's compile results and resource usage; it is an observation log, never an input.
compile_log: list[CompileResult] = []
launch_counts: dict[str, int] = {}


class KernelCompileError(RuntimeError):
    """The CUDA source did not compile; ``.result`` holds the log and diagnostics."""

    def __init__(self, result: CompileResult):
        self.result = result
        lines = [f"line {d.line}: {d.message}" for d in result.errors[:5]]
        detail = "\n".join(lines) or result.error[:2000]
        super().__init__(f"CUDA compilation failed ({result.arch}):\n{detail}")


class KernelArgumentError(TypeError):
    """A kernel was launched with arguments that do not match its signature."""


class NoGPUError(RuntimeError):
    """A kernel launch was attempted on a machine without a usable GPU."""


def _torch():
    import torch

    return torch


class _TorchStream:
    """Adapts torch's current stream to the ``__cuda_stream__`` protocol cuda.core accepts."""

    def __init__(self, handle: int):
        self._handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self._handle)


class Kernel:
    def __init__(self, signature: KernelSignature, owner: CompiledKernels):
        self.signature = signature
        self._owner = owner
        self._handle: Any = None

    @property
    def name(self) -> str:
        return self.signature.name

    def __repr__(self) -> str:
        return f"<Kernel {self.signature.describe()}>"

    def convert_args(self, args: Sequence[Any]) -> list[Any]:
        """Typed launch arguments; raises KernelArgumentError naming the bad parameter."""
        params = self.signature.params
        if len(args) != len(params):
            raise KernelArgumentError(
                f"{self.signature.describe()} takes {len(params)} arguments, got {len(args)}"
            )
        tensor_type = _torch().Tensor
        converted = []
        for i, (param, value) in enumerate(zip(params, args, strict=True)):
            if param.is_pointer:
                if isinstance(value, tensor_type) and value.is_cuda:
                    allowed = POINTEE_TORCH_DTYPES.get(param.c_type)
                    if allowed is None or _dtype_name(value.dtype) in allowed:
                        # cuda.core passes 8-byte numpy scalars by value: the pointer ABI
                        converted.append(np.uint64(value.data_ptr()))
                        continue
                elif value is None:
                    converted.append(np.uint64(0))
                    continue
                raise KernelArgumentError(self._pointer_error(i, param, value))
            ctor = _SCALAR_CTORS.get(param.c_type)
            if ctor is None or isinstance(value, tensor_type) or (
                isinstance(value, float) and param.numpy_dtype[0] in "ub"  # int/uint/bool
            ):
                raise KernelArgumentError(self._scalar_error(i, param, value))
            try:
                converted.append(ctor(value))
            except (TypeError, ValueError, OverflowError) as exc:
                raise KernelArgumentError(f"{self._where(i, param)}: cannot convert {value!r}: {exc}")
        return converted

    def _where(self, i: int, param: Any) -> str:
        return f"argument {i} ({param.name!r}) of {self.signature.describe()}"

    def _pointer_error(self, i: int, param: Any, value: Any) -> str:
        where = self._where(i, param)
        if isinstance(value, _torch().Tensor):
            if not value.is_cuda:
                return f"{where} is a pointer; the tensor is on {value.device}"
            return f"{where} points to {param.c_type}; the tensor's dtype is {_dtype_name(value.dtype)}"
        return (
            f"{where} is a pointer ({param.c_type}*); pass a CUDA torch tensor, "
            f"got {type(value).__name__}"
        )

    def _scalar_error(self, i: int, param: Any, value: Any) -> str:
        where = self._where(i, param)
        if isinstance(value, _torch().Tensor):
            return (
                f"{where} is a scalar {param.c_type}; got a tensor (pass .item() or the "
                "pointer type in the kernel signature)"
            )
        if param.numpy_dtype is None:
            return (
                f"{where}: unsupported scalar type {param.c_type!r}; use int, long, "
                "float, double, size_t, bool or a fixed-width integer type"
            )
        return f"{where} is {param.c_type}; got float {value!r}"

    def __call__(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        args: Sequence[Any] = (),
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        config = self._owner._config_for(grid, block, shared_mem)
        converted = self.convert_args(args)
        kernel = self._owner._load(self.name)
        torch = _torch()
        handle = torch.cuda.current_stream().cuda_stream
        # Kernels run on torch's current stream, which the evaluator's timing and the output
        # copies follow: ``stream=`` may name that stream and no other.
        if stream is not None and int(stream.cuda_stream) != handle:
            raise ValueError("kernels launch on torch's current stream: pass "
                             "stream=torch.cuda.current_stream() or leave stream out")
        _cuda_core().launch(self._owner._stream_for(handle), config, kernel, *converted)
        launch_counts[self.name] = launch_counts.get(self.name, 0) + 1


def _cuda_core():
    import cuda.core

    return cuda.core


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


_SCALAR_CTORS = {c: np.dtype(n).type for c, n in SCALAR_TYPES.items()}


def _dims(value: int | Sequence[int], what: str) -> tuple[int, ...]:
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise KernelArgumentError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return dims


class CompiledKernels:
    """The kernels of one compiled source, as attributes (``kernels.relu(...)``)."""

    def __init__(self, module: CompiledModule, signatures: dict[str, KernelSignature]):
        self.module = module
        self.signatures = signatures
        self._kernels = {name: Kernel(sig, self) for name, sig in signatures.items()}
        self._object_code: Any = None
        self._loaded: dict[str, Any] = {}
        self._streams: dict[int, Any] = {}
        self._configs: dict[tuple, Any] = {}

    @property
    def compile_result(self) -> CompileResult:
        return self.module.result

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(
            f"no kernel named {name!r}; this source defines {sorted(kernels)} "
            '(kernels must be declared extern "C" __global__)'
        )

    def __getitem__(self, name: str) -> Kernel:
        return self.__getattr__(name)

    def __iter__(self):
        return iter(self._kernels.values())

    def launcher(self, name: str, grid: int | Sequence[int] = 1,
                 block: int | Sequence[int] = 1) -> Callable[..., None]:
        """``launch(*args)``: kernel ``name`` at a fixed shape on torch's current stream, with
        arguments as cuda.core takes them (numpy scalars), neither checked nor counted. For
        trusted harness code that launches one kernel often (``env.benchmark``)."""
        kernel = self._load(self[name].name)  # self[name]: an unknown name says so
        config = self._config_for(grid, block, 0)
        torch, core = _torch(), _cuda_core()

        def launch(*args: Any) -> None:
            core.launch(self._stream_for(torch.cuda.current_stream().cuda_stream), config,
                        kernel, *args)

        return launch

    def _load(self, name: str) -> Any:
        if name in self._loaded:
            return self._loaded[name]
        torch = _torch()
        if not torch.cuda.is_available():
            raise NoGPUError(
                f"kernel {name!r} compiled for {self.module.result.arch}, but this machine has no "
                "usable GPU; run on a machine with an NVIDIA GPU (multiminddev doctor checks)"
            )
        from cuda.core import Device, ObjectCode

        Device(torch.cuda.current_device()).set_current()
        if self._object_code is None:
            self._object_code = ObjectCode.from_cubin(self.module.cubin)
        self._loaded[name] = self._object_code.get_kernel(name)
        return self._loaded[name]

    def _config_for(self, grid: Any, block: Any, shared_mem: int) -> Any:
        """LaunchConfig, validated once per distinct shape (launch overhead matters in timing)."""
        key = (
            grid if isinstance(grid, int) else tuple(grid),
            block if isinstance(block, int) else tuple(block),
            shared_mem,
        )
        config = self._configs.get(key)
        if config is None:
            grid_t, block_t = _dims(grid, "grid"), _dims(block, "block")
            threads = int(np.prod(block_t))
            if threads > 1024:
                raise KernelArgumentError(
                    f"block {block_t} has {threads} threads; the limit is 1024"
                )
            config = _cuda_core().LaunchConfig(
                grid=grid_t, block=block_t, shmem_size=int(shared_mem)
            )
            self._configs[key] = config
        return config

    def _stream_for(self, handle: int) -> Any:
        if handle not in self._streams:
            from cuda.core import Device

            self._streams[handle] = Device().create_stream(_TorchStream(handle))
        return self._streams[handle]


def compile_kernels(
    source: str,
    *,
    arch: str | None = None,
    use_fast_math: bool = False,
    defines: Sequence[str] | Mapping[str, int | float | bool] = (),
) -> CompiledKernels:
    """Compile ``source`` with NVRTC; raises KernelCompileError with line-numbered errors.

    ``defines``: ``["TILE=32"]`` or ``{"TILE": 32}``, names and numbers only (ValueError else).
    """
    options = CompileOptions(arch=arch, use_fast_math=use_fast_math,
                             defines=define_options(defines))
    module = compile_cuda(source, options)
    compile_log.append(module.result)
    if module.result.status is not StageStatus.OK:
        raise KernelCompileError(module.result)
    signatures = parse_kernel_signatures(source)
    missing = [k for k in module.kernel_names if k not in signatures]
    for name in missing:  # kernels we could not parse still launch, but without type checks
        signatures[name] = KernelSignature(name=name, params=())
    return CompiledKernels(module, signatures)
