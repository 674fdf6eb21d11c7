"""CUDA helpers candidates use: NVRTC compilation (``cuda.core``) and typed kernel launches."""

from multiminddev.cuda.compiler import CompileOptions, compile_cuda
from multiminddev.cuda.kernels import (
    CompiledKernels,
    Kernel,
    KernelArgumentError,
    KernelCompileError,
    NoGPUError,
    compile_kernels,
)

__all__ = [
    "CompileOptions",
    "CompiledKernels",
    "Kernel",
    "KernelArgumentError",
    "KernelCompileError",
    "NoGPUError",
    "compile_cuda",
    "compile_kernels",
]
