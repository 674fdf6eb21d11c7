"""Run the corpus's CUDA kernels on the CPU, to check their results without a GPU.

The kernel source is compiled with the host C++ compiler against a small header that gives
every GPU thread of a block its own OS thread: ``threadIdx``/``blockIdx`` are thread-local,
``__syncthreads`` is a block-wide ``std::barrier``, warp shuffles exchange values through a
per-warp barrier, and ``__shared__`` variables are function statics (blocks run one after
another). Launches then take CPU tensors. This is a *semantic* check of the index math,
bounds and reductions of kernels written in the subset of CUDA the corpus uses; it says
nothing about speed, and it cannot see races that only a real GPU's scheduling exposes.

``emulated_namespace(solution_source)`` executes a reference solution with
``compile_kernels`` swapped for ``compile_for_cpu``; ``ModelNew`` then runs on CPU tensors. Its
outputs come from guarded buffers (``GuardedTorch``), so an out-of-bounds write shows up; the
tests also put inputs inside NaN margins, so an out-of-bounds read shows up in the result.
Needs ``g++`` (C++20); callers skip when it is missing.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from multiminddev.cuda.signature import parse_kernel_signatures

HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <math.h>

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
typedef _Float16 __half;
static inline float __half2float(__half h) { return (float)h; }
static inline __half __float2half(float f) { return (__half)f; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class A, class B> static inline A min(A a, B b) { return a < (A)b ? a : (A)b; }
template <class A, class B> static inline A max(A a, B b) { return a > (A)b ? a : (A)b; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static

thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

struct WarpState {
    std::barrier<> bar;
    unsigned long long vals[32];
    explicit WarpState(int n) : bar(n) {}
};
static std::barrier<>* g_block_barrier = nullptr;
static std::vector<std::unique_ptr<WarpState>> g_warps;
thread_local int t_linear = 0;

static inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
// A shuffle: every lane publishes its value, then reads its source lane's (any 4/8-byte type).
template <class T> static inline T warp_exchange(T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "shuffles move 4 or 8 bytes");
    WarpState& w = *g_warps[t_linear / 32];
    const int lane = t_linear % 32;
    std::memcpy(&w.vals[lane], &v, sizeof(T));
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, &w.vals[src_lane], sizeof(T));
    w.bar.arrive_and_wait();
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    return warp_exchange(v, (t_linear % 32) ^ o);
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
    return warp_exchange(v, src & 31);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, int d) {
    const int lane = t_linear % 32;
    return warp_exchange(v, lane >= d ? lane - d : lane);
}

static void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
    gridDim = grid;
    blockDim = block;
    const int n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> block_barrier(n);
        g_block_barrier = &block_barrier;
        g_warps.clear();
        for (int w = 0; w * 32 < n; ++w)
            g_warps.push_back(std::make_unique<WarpState>(std::min(32, n - w * 32)));
        std::vector<std::thread> threads;
        for (int t = 0; t < n; ++t) {
            threads.emplace_back([&, t] {
                t_linear = t;
                threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                blockIdx = {bx, by, bz};
                body();
                // an exited thread no longer takes part in barriers
                g_warps[t / 32]->bar.arrive_and_drop();
                block_barrier.arrive_and_drop();
            });
        }
        for (auto& th : threads) th.join();
    }
}
"""


def _launcher(name: str, params: tuple) -> str:
    args = []
    for i, p in enumerate(params):
        c_type = f"{p.c_type}*" if p.is_pointer else p.c_type
        args.append(f"*({c_type}*)args[{i}]")
    return (
        f'extern "C" void emu_launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
        f"unsigned by, unsigned bz, void** args) {{\n"
        f"    run_grid(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}},\n"
        f"             [&] {{ {name}({', '.join(args)}); }});\n"
        "}\n"
    )




_FLAGS = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-w"]


def _workdir() -> Path:
    workdir = Path(tempfile.gettempdir()) / "mmd-cuda-emu"
    (workdir / "include").mkdir(parents=True, exist_ok=True)
    for header in ("cuda_fp16.h", "cuda_runtime.h"):  # included by kernels; HEADER covers them
        (workdir / "include" / header).write_text("#pragma once\n")
    return workdir


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"emulator build failed:\n{done.stderr[:4000]}")


@functools.cache
def _header() -> Path:
    """HEADER as a precompiled header (most of a build's time is <thread>/<barrier>)."""
    workdir = _workdir()
    digest = hashlib.sha256((HEADER + repr(_FLAGS)).encode()).hexdigest()[:16]
    header = workdir / f"emu_{digest}.h"
    if not Path(f"{header}.gch").exists():
        header.write_text("#pragma once\n" + HEADER)
        _run(["g++", *_FLAGS, "-x", "c++-header", "-o", f"{header}.gch.tmp", str(header)])
        Path(f"{header}.gch.tmp").replace(f"{header}.gch")
    return header


def compiler_available() -> bool:
    """g++ is present and builds the emulator header (C++20 <barrier>)."""
    if shutil.which("g++") is None:
        return False
    try:
        _header()
    except RuntimeError:
        return False
    return True


@functools.cache
def _build(source: str) -> ctypes.CDLL:
    signatures = parse_kernel_signatures(source)
    launchers = "".join(_launcher(n, s.params) for n, s in signatures.items())
    header = _header()
    text = "#line 1\n" + source + "\n" + launchers
    digest = hashlib.sha256((header.name + text).encode()).hexdigest()[:16]
    workdir = header.parent
    lib = workdir / f"{digest}.so"
    if not lib.exists():
        src = workdir / f"{digest}.cpp"
        src.write_text(text)
        _run(["g++", *_FLAGS, "-shared", "-include", str(header), "-I", str(workdir / "include"),
              "-o", f"{lib}.tmp", str(src)])
        Path(f"{lib}.tmp").replace(lib)
    return ctypes.CDLL(str(lib))


class EmulatedKernel:
    def __init__(self, lib: ctypes.CDLL, signature: Any):
        self.signature = signature
        self._fn = getattr(lib, f"emu_launch_{signature.name}")

    def __call__(self, grid, block, args=(), shared_mem=0, stream=None) -> None:
        import torch

        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        block = (block,) if isinstance(block, int) else tuple(block)
        grid, block = (grid + (1, 1))[:3], (block + (1, 1))[:3]
        params = self.signature.params
        assert len(args) == len(params), f"{self.signature.describe()}: {len(args)} args"
        holders = []
        for param, value in zip(params, args, strict=True):
            if param.is_pointer:
                assert value is None or isinstance(value, torch.Tensor)
                holders.append(ctypes.c_void_p(0 if value is None else value.data_ptr()))
            else:
                arr = np.array(value, dtype=param.numpy_dtype)
                holders.append(arr)
        pointers = (ctypes.c_void_p * len(holders))()
        for i, h in enumerate(holders):
            pointers[i] = ctypes.addressof(h) if isinstance(h, ctypes.c_void_p) else h.ctypes.data
        self._fn(*[ctypes.c_uint(int(v)) for v in grid + block], pointers)


class EmulatedKernels:
    def __init__(self, source: str):
        lib = _build(source)
        self.signatures = parse_kernel_signatures(source)
        self._kernels = {n: EmulatedKernel(lib, s) for n, s in self.signatures.items()}

    def __getattr__(self, name: str) -> EmulatedKernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(name)


def compile_for_cpu(source: str, **_: Any) -> EmulatedKernels:
    return EmulatedKernels(source)


IMPORT_LINE = "from multiminddev.cuda import compile_kernels"
_IMPORT_TORCH = re.compile(r"^import torch$", re.MULTILINE)
GUARD_ELEMENTS = 64


class GuardedTorch:
    """``torch``, except that ``empty``/``empty_like`` return views into larger buffers whose
    margins hold a known pattern (NaN, or a sentinel for integers): after ``forward``,
    ``intact()`` says whether any kernel wrote outside the tensors it was given."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._buffers: list[tuple[Any, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def empty(self, *size: Any, **kwargs: Any) -> Any:
        return self._guard(self._torch.empty(*size, **kwargs))

    def empty_like(self, t: Any, **kwargs: Any) -> Any:
        return self._guard(self._torch.empty_like(t, **kwargs))

    def _fill(self, dtype: Any) -> float:
        return float("nan") if dtype.is_floating_point else -12345

    def _guard(self, t: Any) -> Any:
        n = t.numel()
        buffer = self._torch.full((n + 2 * GUARD_ELEMENTS,), self._fill(t.dtype), dtype=t.dtype,
                                  device=t.device)
        self._buffers.append((buffer, n))
        return buffer[GUARD_ELEMENTS : GUARD_ELEMENTS + n].view(t.shape)

    def intact(self) -> bool:
        for buffer, n in self._buffers:
            margins = self._torch.cat([buffer[:GUARD_ELEMENTS], buffer[GUARD_ELEMENTS + n :]])
            if margins.is_floating_point():
                if not bool(self._torch.isnan(margins).all()):
                    return False
            elif not bool((margins == -12345).all()):
                return False
        return True


def emulated_namespace(solution_source: str) -> dict[str, Any]:
    """Execute a reference solution with its kernels compiled for the CPU emulator and its
    ``torch.empty*`` outputs guarded; ``namespace["torch"].intact()`` checks the guards."""
    if IMPORT_LINE not in solution_source or not _IMPORT_TORCH.search(solution_source):
        raise ValueError("the solution does not import torch / compile_kernels the usual way")
    namespace: dict[str, Any] = {
        "__name__": "emulated_solution",
        "compile_kernels": compile_for_cpu,
        "torch": GuardedTorch(),
    }
    text = _IMPORT_TORCH.sub("", solution_source.replace(IMPORT_LINE, ""))
    exec(compile(text, "solution", "exec"), namespace)  # noqa: S102 - our reference solutions
    return namespace
