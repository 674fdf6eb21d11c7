"""Tier 0: elementwise ops and activations (plus the fused elementwise patterns of tier 3).

Memory-bound: sizes give >= 64 MiB of traffic (~20 us at H100 bandwidth). The naive kernels
use one thread per element; the fast ones move 16 bytes per load (float4 / 8 halves) in a
grid-stride loop and fall back to scalar code for a misaligned pointer or the tail.
"""

from __future__ import annotations

from multiminddev.tasks.builtin.spec import (
    DTYPE_CUDA,
    Family,
    Shape,
    Solution,
    cuda_prelude,
    fill,
    shape,
)

_UNARY_NAIVE = r"""
@PRELUDE@
__device__ __forceinline__ float op(float v, float p0, float p1) { return @EXPR@; }

extern "C" __global__ void unary_naive(const @T@* __restrict__ x, @T@* __restrict__ y,
                                       long n, float p0, float p1) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = ST(op(LD(x[i]), p0, p1));
}
"""

_UNARY_FAST = r"""
@PRELUDE@
#define VEC (16 / (int)sizeof(@T@))
__device__ __forceinline__ float op(float v, float p0, float p1) { return @EXPR@; }

// 16-byte loads in a grid-stride loop; a misaligned pointer or the tail takes the scalar path.
extern "C" __global__ void __launch_bounds__(256) unary_fast(const @T@* __restrict__ x,
                                                             @T@* __restrict__ y, long n,
                                                             float p0, float p1) {
    const long stride = (long)gridDim.x * blockDim.x;
    const long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long done = 0;
    const unsigned long long addr_bits =
        reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y);
    if ((addr_bits & 15ULL) == 0) {
        const long nvec = n / VEC;
        const uint4* __restrict__ xv = reinterpret_cast<const uint4*>(x);
        uint4* __restrict__ yv = reinterpret_cast<uint4*>(y);
        for (long i = tid; i < nvec; i += stride) {
            uint4 raw = __ldg(xv + i);
            @T@* e = reinterpret_cast<@T@*>(&raw);
#pragma unroll
            for (int j = 0; j < VEC; ++j) e[j] = ST(op(LD(e[j]), p0, p1));
            yv[i] = raw;
        }
        done = nvec * VEC;
    }
    for (long i = done + tid; i < n; i += stride) y[i] = ST(op(LD(x[i]), p0, p1));
}
"""

_BINARY_NAIVE = r"""
@PRELUDE@
__device__ __forceinline__ float op(float a, float b) { return @EXPR@; }

extern "C" __global__ void binary_naive(const @T@* __restrict__ a, const @T@* __restrict__ b,
                                        @T@* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = ST(op(LD(a[i]), LD(b[i])));
}
"""

_BINARY_FAST = r"""
@PRELUDE@
#define VEC (16 / (int)sizeof(@T@))
__device__ __forceinline__ float op(float a, float b) { return @EXPR@; }

extern "C" __global__ void __launch_bounds__(256) binary_fast(const @T@* __restrict__ a,
                                                              const @T@* __restrict__ b,
                                                              @T@* __restrict__ y, long n) {
    const long stride = (long)gridDim.x * blockDim.x;
    const long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long done = 0;
    const unsigned long long addr_bits = reinterpret_cast<unsigned long long>(a) |
                                         reinterpret_cast<unsigned long long>(b) |
                                         reinterpret_cast<unsigned long long>(y);
    if ((addr_bits & 15ULL) == 0) {
        const long nvec = n / VEC;
        const uint4* __restrict__ av = reinterpret_cast<const uint4*>(a);
        const uint4* __restrict__ bv = reinterpret_cast<const uint4*>(b);
        uint4* __restrict__ yv = reinterpret_cast<uint4*>(y);
        for (long i = tid; i < nvec; i += stride) {
            uint4 ra = __ldg(av + i);
            uint4 rb = __ldg(bv + i);
            @T@* ea = reinterpret_cast<@T@*>(&ra);
            const @T@* eb = reinterpret_cast<const @T@*>(&rb);
#pragma unroll
            for (int j = 0; j < VEC; ++j) ea[j] = ST(op(LD(ea[j]), LD(eb[j])));
            yv[i] = ra;
        }
        done = nvec * VEC;
    }
    for (long i = done + tid; i < n; i += stride) y[i] = ST(op(LD(a[i]), LD(b[i])));
}
"""

# Python launch code. The fast grid is capped: the grid-stride loop covers the rest.
_UNARY_NAIVE_FWD = """\
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        kernels.unary_naive(grid=((n + 255) // 256,), block=(256,), args=(x, y, n, @P0@, @P1@))
        return y
"""
_UNARY_FAST_FWD = """\
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        vec = 16 // x.element_size()
        blocks = max(1, min((n // vec + 255) // 256, 4096))
        kernels.unary_fast(grid=(blocks,), block=(256,), args=(x, y, n, @P0@, @P1@))
        return y
"""
_BINARY_NAIVE_FWD = """\
        a = a.contiguous()
        b = b.contiguous()
        y = torch.empty_like(a)
        n = a.numel()
        kernels.binary_naive(grid=((n + 255) // 256,), block=(256,), args=(a, b, y, n))
        return y
"""
_BINARY_FAST_FWD = """\
        a = a.contiguous()
        b = b.contiguous()
        y = torch.empty_like(a)
        n = a.numel()
        vec = 16 // a.element_size()
        blocks = max(1, min((n // vec + 255) // 256, 4096))
        kernels.binary_fast(grid=(blocks,), block=(256,), args=(a, b, y, n))
        return y
"""

_FP32_SHAPES = (shape(M=4096, N=4096), shape(M=8192, N=4096), shape(M=4097, N=4099))
_FP16_SHAPES = (shape("float16", M=8192, N=4096), shape("float16", M=4095, N=8191))


def _nbytes(s: Shape, tensors: int) -> int:
    return tensors * int(s["M"]) * int(s["N"]) * s.itemsize


def _unary_solution(template: str, fwd: str, expr: str, p0: str, p1: str):
    def build(dtype: str) -> Solution:
        cuda = fill(template, PRELUDE=cuda_prelude(dtype), T=DTYPE_CUDA[dtype], EXPR=expr)
        return Solution(cuda=cuda, forward=fill(fwd, P0=p0, P1=p1))

    return build


def _binary_solution(template: str, fwd: str, expr: str):
    def build(dtype: str) -> Solution:
        cuda = fill(template, PRELUDE=cuda_prelude(dtype), T=DTYPE_CUDA[dtype], EXPR=expr)
        return Solution(cuda=cuda, forward=fwd)

    return build


def unary_family(
    name: str,
    description: str,
    torch_expr: str,
    cuda_expr: str,
    *,
    flops_per_elem: int = 1,
    init: tuple[tuple[str, str], ...] = (),
    params: tuple[str, str] = ("0.0", "0.0"),
    half: bool = False,
    tier: int = 0,
    with_fast: bool = True,
) -> Family:
    """``y = f(x)``; ``cuda_expr`` reads ``v`` (float) and ``p0``/``p1`` (``params``)."""
    init_body = "".join(f"        self.{arg} = {arg}\n" for arg, _ in init)
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=_FP32_SHAPES + (_FP16_SHAPES if half else ()),
        small=shape(M=5, N=301),
        inputs=("torch.randn(M, N{dt})",),
        forward=f"        return {torch_expr}\n",
        init_args=init,
        init_body=init_body,
        output_shape=lambda s: (int(s["M"]), int(s["N"])),
        bytes_moved=lambda s: _nbytes(s, 2),
        flops=lambda s: flops_per_elem * int(s["M"]) * int(s["N"]),
        naive=_unary_solution(_UNARY_NAIVE, _UNARY_NAIVE_FWD, cuda_expr, *params),
        fast=(
            _unary_solution(_UNARY_FAST, _UNARY_FAST_FWD, cuda_expr, *params) if with_fast else None
        ),
        tags=("elementwise", "memory-bound"),
    )


def binary_family(
    name: str,
    description: str,
    torch_expr: str,
    cuda_expr: str,
    *,
    half: bool = False,
    tier: int = 0,
    flops_per_elem: int = 1,
    with_fast: bool = True,
) -> Family:
    """``y = f(a, b)`` on two same-shaped tensors; ``cuda_expr`` reads ``a`` and ``b``."""
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=_FP32_SHAPES + (_FP16_SHAPES if half else ()),
        small=shape(M=5, N=301),
        inputs=("torch.randn(M, N{dt})", "torch.randn(M, N{dt})"),
        forward_args="a, b",
        forward=f"        return {torch_expr}\n",
        output_shape=lambda s: (int(s["M"]), int(s["N"])),
        bytes_moved=lambda s: _nbytes(s, 3),
        flops=lambda s: flops_per_elem * int(s["M"]) * int(s["N"]),
        naive=_binary_solution(_BINARY_NAIVE, _BINARY_NAIVE_FWD, cuda_expr),
        fast=_binary_solution(_BINARY_FAST, _BINARY_FAST_FWD, cuda_expr) if with_fast else None,
        tags=("elementwise", "memory-bound"),
    )


_GELU_TANH = "0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))"
_GELU_ERF = "0.5f * v * (1.f + erff(v * 0.7071067811865476f))"
_SLOPE = (("negative_slope", "0.01"),)


def tier0_families() -> list[Family]:
    u, b = unary_family, binary_family
    # with_fast=False: the vectorised variant did not measure faster than the naive one on an
    # H200 (tests/tasks/test_gpu_solutions.py; 0.87-1.01x), so it is not offered.
    return [
        u("relu", "ReLU: max(x, 0)", "torch.relu(x)", "fmaxf(v, 0.f)", half=True),
        u("leaky_relu", "Leaky ReLU with a negative slope", "F.leaky_relu(x, self.negative_slope)",
          "v > 0.f ? v : v * p0", init=_SLOPE, params=("self.negative_slope", "0.0"),
          flops_per_elem=2),
        u("gelu_tanh", "GELU, tanh approximation", 'F.gelu(x, approximate="tanh")', _GELU_TANH,
          half=True, flops_per_elem=8),
        u("gelu_erf", "GELU, exact (erf)", "F.gelu(x)", _GELU_ERF, flops_per_elem=5,
          with_fast=False),
        u("sigmoid", "Sigmoid", "torch.sigmoid(x)", "1.f / (1.f + expf(-v))", half=True,
          flops_per_elem=4),
        u("tanh", "Hyperbolic tangent", "torch.tanh(x)", "tanhf(v)", flops_per_elem=4,
          with_fast=False),
        u("silu", "SiLU / swish: x * sigmoid(x)", "F.silu(x)", "v / (1.f + expf(-v))", half=True,
          flops_per_elem=4),
        u("softplus", "Softplus (beta 1, threshold 20)", "F.softplus(x)",
          "v > 20.f ? v : log1pf(expf(v))", flops_per_elem=4),
        u("elu", "ELU with alpha", "F.elu(x, alpha=self.alpha)", "v > 0.f ? v : p0 * expm1f(v)",
          init=(("alpha", "1.0"),), params=("self.alpha", "0.0"), flops_per_elem=4),
        u("hardtanh", "Hardtanh: clamp to [min_val, max_val]",
          "F.hardtanh(x, min_val=self.min_val, max_val=self.max_val)", "fminf(fmaxf(v, p0), p1)",
          init=(("min_val", "-0.5"), ("max_val", "0.5")), params=("self.min_val", "self.max_val"),
          flops_per_elem=2),
        u("abs", "Absolute value", "torch.abs(x)", "fabsf(v)"),
        u("square", "Square: x * x", "x * x", "v * v"),
        u("exp", "Exponential", "torch.exp(x)", "expf(v)", flops_per_elem=2),
        u("scale", "Multiply by a scalar", "x * self.scale", "v * p0",
          init=(("scale", "1.7"),), params=("self.scale", "0.0")),
        u("mish", "Mish: x * tanh(softplus(x))", "F.mish(x)", "v * tanhf(log1pf(expf(v)))",
          flops_per_elem=8),
        u("hardsigmoid", "Hardsigmoid: relu6(x + 3) / 6", "F.hardsigmoid(x)",
          "fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f", flops_per_elem=4, with_fast=False),
        u("hardswish", "Hardswish: x * relu6(x + 3) / 6", "F.hardswish(x)",
          "v * fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f", flops_per_elem=5),
        b("add", "Elementwise sum of two tensors", "a + b", "a + b", half=True),
        b("sub", "Elementwise difference of two tensors", "a - b", "a - b", with_fast=False),
        b("mul", "Elementwise product of two tensors", "a * b", "a * b", half=True),
        b("maximum", "Elementwise maximum of two tensors", "torch.maximum(a, b)", "fmaxf(a, b)"),
    ]


_BIAS_ACT_NAIVE = r"""
__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

extern "C" __global__ void bias_gelu_naive(const float* __restrict__ x,
                                           const float* __restrict__ bias, float* __restrict__ y,
                                           long n, long cols) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(x[i] + bias[i % cols]);
}
"""

_BIAS_ACT_FAST = r"""
__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

// float4 loads/stores of x and y; the bias column advances with each element (any cols works).
extern "C" __global__ void __launch_bounds__(256) bias_gelu_fast(const float* __restrict__ x,
                                                                 const float* __restrict__ bias,
                                                                 float* __restrict__ y, long n,
                                                                 long cols) {
    const long stride = (long)gridDim.x * blockDim.x;
    const long tid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long done = 0;
    const unsigned long long addr_bits =
        reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(y);
    if ((addr_bits & 15ULL) == 0) {
        const long nvec = n / 4;
        for (long i = tid; i < nvec; i += stride) {
            float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
            long c = (i * 4) % cols;
            float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                e[j] = gelu(e[j] + __ldg(bias + c));
                c = (c + 1 == cols) ? 0 : c + 1;
            }
            reinterpret_cast<float4*>(y)[i] = make_float4(e[0], e[1], e[2], e[3]);
        }
        done = nvec * 4;
    }
    for (long i = done + tid; i < n; i += stride) y[i] = gelu(x[i] + bias[i % cols]);
}
"""


def _bias_gelu_solution(fast: bool):
    kernel = "bias_gelu_fast" if fast else "bias_gelu_naive"
    grid = "max(1, min((n // 4 + 255) // 256, 4096))" if fast else "(n + 255) // 256"

    def build(dtype: str) -> Solution:
        fwd = (
            "        x = x.contiguous()\n"
            "        bias = self.bias.contiguous()\n"
            "        y = torch.empty_like(x)\n"
            "        n = x.numel()\n"
            f"        kernels.{kernel}(grid=({grid},), block=(256,), "
            "args=(x, bias, y, n, x.shape[-1]))\n"
            "        return y\n"
        )
        return Solution(cuda=_BIAS_ACT_FAST if fast else _BIAS_ACT_NAIVE, forward=fwd)

    return build


_SWIGLU_NAIVE = r"""
extern "C" __global__ void swiglu_naive(const float* __restrict__ x, float* __restrict__ y,
                                        long rows, long hidden) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= rows * hidden) return;
    long r = i / hidden, h = i % hidden;
    float gate = x[r * 2 * hidden + h];
    float up = x[r * 2 * hidden + hidden + h];
    y[i] = gate / (1.f + expf(-gate)) * up;
}
"""


def _swiglu_naive(dtype: str) -> Solution:
    fwd = (
        "        x = x.contiguous()\n"
        "        rows = x.numel() // x.shape[-1]\n"
        "        hidden = x.shape[-1] // 2\n"
        "        y = torch.empty((*x.shape[:-1], hidden), device=x.device, dtype=x.dtype)\n"
        "        n = rows * hidden\n"
        "        kernels.swiglu_naive(grid=((n + 255) // 256,), block=(256,), "
        "args=(x, y, rows, hidden))\n"
        "        return y\n"
    )
    return Solution(cuda=_SWIGLU_NAIVE, forward=fwd)


def fused_elementwise_families() -> list[Family]:
    """Tier 3 fused elementwise patterns: residual + activation, bias + GELU, SwiGLU."""
    add_relu = binary_family(
        "add_relu", "Residual add then ReLU: relu(a + b)", "torch.relu(a + b)",
        "fmaxf(a + b, 0.f)", tier=3, flops_per_elem=2,
    )
    bias_gelu = Family(
        name="bias_gelu",
        tier=3,
        description="Bias add (per column) then exact GELU",
        shapes=(shape(M=8192, N=2048), shape(M=4096, N=4096), shape(M=16384, N=1023)),
        small=shape(M=5, N=37),
        inputs=("torch.randn(M, N)",),
        init_args=(("features", "N"),),
        init_body="        self.bias = nn.Parameter(torch.randn(features))\n",
        forward="        return F.gelu(x + self.bias)\n",
        output_shape=lambda s: (int(s["M"]), int(s["N"])),
        bytes_moved=lambda s: 4 * (2 * int(s["M"]) * int(s["N"]) + int(s["N"])),
        flops=lambda s: 6 * int(s["M"]) * int(s["N"]),
        naive=_bias_gelu_solution(False),
        # The vectorised variant measured 0.83x of the naive one on an H200
        # (tests/tasks/test_gpu_solutions.py): a "fast" solution must measure faster, so none.
        fast=None,
        tags=("fused", "memory-bound"),
    )
    swiglu = Family(
        name="swiglu",
        tier=3,
        description="SwiGLU on a packed input: silu(x[..., :H]) * x[..., H:]",
        shapes=(shape(M=8192, H=2048), shape(M=4096, H=4096), shape(M=16384, H=1000)),
        small=shape(M=5, H=19),
        inputs=("torch.randn(M, 2 * H)",),
        forward="        gate, up = x.chunk(2, dim=-1)\n        return F.silu(gate) * up\n",
        output_shape=lambda s: (int(s["M"]), int(s["H"])),
        bytes_moved=lambda s: 4 * 3 * int(s["M"]) * int(s["H"]),
        flops=lambda s: 5 * int(s["M"]) * int(s["H"]),
        naive=_swiglu_naive,
        tags=("fused", "memory-bound"),
    )
    return [add_relu, bias_gelu, swiglu]
