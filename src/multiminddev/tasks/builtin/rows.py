"""Row-wise ops: reductions (tier 1), cumsum/argmax (tier 1), and softmax and norms (tiers 2-3).

The naive kernels give each row to one thread (simple, but a warp then reads 32 rows at once:
uncoalesced). The fast kernels give each row to a block (or a warp) whose threads stride along
the row (coalesced) and combine partial results with warp shuffles and a little shared memory.
"""

from __future__ import annotations

from multiminddev.tasks.builtin.spec import Family, Shape, Solution, fill, shape

# Block-wide reduction with warp shuffles; the result reaches every thread. blockDim.x must be
# a multiple of 32; the leading barrier keeps a second call from overwriting smem too early.
BLOCK_REDUCE = r"""
#define FULL_MASK 0xffffffffu
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = COMBINE(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ float block_reduce(float v, float* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_reduce(v);
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < warps ? smem[lane] : IDENTITY;
    return warp_reduce(v);
}
"""

_REDUCE_NAIVE = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define IDENTITY (@IDENTITY@)
#define COMBINE(a, b) (@COMBINE@)
#define MAP(v) (@MAP@)
#define FINAL(acc, cols) (@FINAL@)

extern "C" __global__ void row_reduce_naive(const float* __restrict__ x, float* __restrict__ y,
                                            long rows, long cols) {
    long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* p = x + r * cols;
    float acc = IDENTITY;
    for (long c = 0; c < cols; ++c) acc = COMBINE(acc, MAP(p[c]));
    y[r] = FINAL(acc, cols);
}
"""

_REDUCE_FAST = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define IDENTITY (@IDENTITY@)
#define COMBINE(a, b) (@COMBINE@)
#define MAP(v) (@MAP@)
#define FINAL(acc, cols) (@FINAL@)
@BLOCK_REDUCE@
// One block per row: coalesced strided reads, then a shuffle + shared-memory reduction.
extern "C" __global__ void __launch_bounds__(256) row_reduce_fast(const float* __restrict__ x,
                                                                  float* __restrict__ y,
                                                                  long rows, long cols) {
    __shared__ float smem[32];
    const float* p = x + (long)blockIdx.x * cols;
    float acc = IDENTITY;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) acc = COMBINE(acc, MAP(__ldg(p + c)));
    acc = block_reduce(acc, smem);
    if (threadIdx.x == 0) y[blockIdx.x] = FINAL(acc, cols);
}
"""

_ROWS_FWD_HEAD = """\
        x = x.contiguous()
        cols = x.shape[-1]
        rows = x.numel() // cols
"""


def _reduce_solution(fast: bool, identity: str, combine: str, map_: str, final: str):
    def build(dtype: str) -> Solution:
        template = _REDUCE_FAST if fast else _REDUCE_NAIVE
        cuda = fill(template, BLOCK_REDUCE=BLOCK_REDUCE, IDENTITY=identity, COMBINE=combine,
                    MAP=map_, FINAL=final)
        launch = (
            "kernels.row_reduce_fast(grid=(rows,), block=(256,), args=(x, y, rows, cols))"
            if fast
            else "kernels.row_reduce_naive(grid=((rows + 255) // 256,), block=(256,), "
            "args=(x, y, rows, cols))"
        )
        fwd = (
            _ROWS_FWD_HEAD
            + "        y = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)\n"
            + f"        {launch}\n        return y\n"
        )
        return Solution(cuda=cuda, forward=fwd)

    return build


_ROW_SHAPES = (shape(M=4096, N=4096), shape(M=1024, N=16384), shape(M=16384, N=1023))
_ROW_SMALL = shape(M=6, N=300)


def _row_bytes(s: Shape) -> int:
    return 4 * int(s["M"]) * (int(s["N"]) + 1)


def reduce_family(name: str, description: str, torch_expr: str, identity: str, combine: str,
                  map_: str = "v", final: str = "acc", flops_per_elem: int = 1) -> Family:
    return Family(
        name=name,
        tier=1,
        description=description,
        shapes=_ROW_SHAPES,
        small=_ROW_SMALL,
        inputs=("torch.randn(M, N)",),
        forward=f"        return {torch_expr}\n",
        output_shape=lambda s: (int(s["M"]),),
        bytes_moved=_row_bytes,
        flops=lambda s: flops_per_elem * int(s["M"]) * int(s["N"]),
        naive=_reduce_solution(False, identity, combine, map_, final),
        fast=_reduce_solution(True, identity, combine, map_, final),
        atol=1e-3,
        rtol=1e-3,
        fast_min_speedup=1.2,
        tags=("reduction", "memory-bound"),
    )


_CUMSUM_NAIVE = r"""
extern "C" __global__ void cumsum_naive(const float* __restrict__ x, float* __restrict__ y,
                                        long rows, long cols) {
    long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float acc = 0.f;
    for (long c = 0; c < cols; ++c) {
        acc += x[r * cols + c];
        y[r * cols + c] = acc;
    }
}
"""

_CUMSUM_FAST = r"""
#define FULL_MASK 0xffffffffu
// One warp per row: 32-wide chunks, Kogge-Stone scan with shuffles, carry between chunks.
// A warp's lanes share one row, so a warp exits (or not) as a whole and shuffles stay valid.
extern "C" __global__ void __launch_bounds__(256) cumsum_fast(const float* __restrict__ x,
                                                              float* __restrict__ y,
                                                              long rows, long cols) {
    const int lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* p = x + r * cols;
    float* q = y + r * cols;
    float carry = 0.f;
    for (long base = 0; base < cols; base += 32) {
        const long c = base + lane;
        float v = c < cols ? __ldg(p + c) : 0.f;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float t = __shfl_up_sync(FULL_MASK, v, o);
            if (lane >= o) v += t;
        }
        if (c < cols) q[c] = v + carry;
        carry += __shfl_sync(FULL_MASK, v, 31);
    }
}
"""


def _cumsum_solution(fast: bool):
    def build(dtype: str) -> Solution:
        launch = (
            "kernels.cumsum_fast(grid=((rows + 7) // 8,), block=(256,), args=(x, y, rows, cols))"
            if fast
            else "kernels.cumsum_naive(grid=((rows + 255) // 256,), block=(256,), "
            "args=(x, y, rows, cols))"
        )
        fwd = (_ROWS_FWD_HEAD + "        y = torch.empty_like(x)\n"
               + f"        {launch}\n        return y\n")
        return Solution(cuda=_CUMSUM_FAST if fast else _CUMSUM_NAIVE, forward=fwd)

    return build


_ARGMAX_NAIVE = r"""
// First index of the maximum, like torch.argmax.
extern "C" __global__ void argmax_naive(const float* __restrict__ x, long* __restrict__ y,
                                        long rows, long cols) {
    long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* p = x + r * cols;
    float best = p[0];
    long best_index = 0;
    for (long c = 1; c < cols; ++c) {
        if (p[c] > best) { best = p[c]; best_index = c; }
    }
    y[r] = best_index;
}
"""


_ARGMAX_FAST = r"""
#define FULL_MASK 0xffffffffu
// Keep the larger value; on a tie the smaller index (torch.argmax returns the first); an
// index < 0 marks "no element yet".
__device__ __forceinline__ void pick(float& v, long& i, float v2, long i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}
__device__ __forceinline__ void warp_pick(float& v, long& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(FULL_MASK, v, o);
        const long i2 = __shfl_xor_sync(FULL_MASK, i, o);
        pick(v, i, v2, i2);
    }
}
// One block per row: coalesced strided scan, then (value, index) shuffle + shared reduction.
extern "C" __global__ void __launch_bounds__(256) argmax_fast(const float* __restrict__ x,
                                                              long* __restrict__ y,
                                                              long rows, long cols) {
    __shared__ float sv[32];
    __shared__ long si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* p = x + (long)blockIdx.x * cols;
    float v = 0.f;
    long i = -1;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) pick(v, i, __ldg(p + c), c);
    warp_pick(v, i);
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    v = lane < warps ? sv[lane] : 0.f;
    i = lane < warps ? si[lane] : -1;
    warp_pick(v, i);
    if (threadIdx.x == 0) y[blockIdx.x] = i;
}
"""


def _argmax_solution(fast: bool):
    def build(dtype: str) -> Solution:
        launch = (
            "kernels.argmax_fast(grid=(rows,), block=(256,), args=(x, y, rows, cols))"
            if fast
            else "kernels.argmax_naive(grid=((rows + 255) // 256,), block=(256,), "
            "args=(x, y, rows, cols))"
        )
        fwd = (
            _ROWS_FWD_HEAD
            + "        y = torch.empty(x.shape[:-1], device=x.device, dtype=torch.int64)\n"
            + f"        {launch}\n        return y\n"
        )
        return Solution(cuda=_ARGMAX_FAST if fast else _ARGMAX_NAIVE, forward=fwd)

    return build


def tier1_row_families() -> list[Family]:
    r = reduce_family
    return [
        r("sum_dim", "Sum over the last dimension of a matrix", "torch.sum(x, dim=1)",
          "0.f", "a + b"),
        r("mean_dim", "Mean over the last dimension of a matrix", "torch.mean(x, dim=1)",
          "0.f", "a + b", final="acc / (float)cols"),
        r("max_dim", "Max over the last dimension of a matrix", "torch.amax(x, dim=1)",
          "-INFINITY", "fmaxf(a, b)"),
        r("min_dim", "Min over the last dimension of a matrix", "torch.amin(x, dim=1)",
          "INFINITY", "fminf(a, b)"),
        r("row_l2_norm", "Euclidean norm of each row", "torch.linalg.vector_norm(x, ord=2, dim=1)",
          "0.f", "a + b", map_="v * v", final="sqrtf(acc)", flops_per_elem=2),
        Family(
            name="cumsum",
            tier=1,
            description="Inclusive prefix sum along the last dimension",
            shapes=(shape(M=4096, N=4096), shape(M=16384, N=1024), shape(M=2048, N=8191)),
            small=_ROW_SMALL,
            inputs=("torch.randn(M, N)",),
            forward="        return torch.cumsum(x, dim=1)\n",
            output_shape=lambda s: (int(s["M"]), int(s["N"])),
            bytes_moved=lambda s: 8 * int(s["M"]) * int(s["N"]),
            flops=lambda s: int(s["M"]) * int(s["N"]),
            naive=_cumsum_solution(False),
            fast=_cumsum_solution(True),
            atol=1e-3,
            rtol=1e-3,
            fast_min_speedup=1.2,
            tags=("scan", "memory-bound"),
        ),
        Family(
            name="argmax_dim",
            tier=1,
            description="Index of the maximum over the last dimension (int64 output)",
            shapes=(shape(M=4096, N=4096), shape(M=16384, N=1024), shape(M=1024, N=16383)),
            small=_ROW_SMALL,
            inputs=("torch.randn(M, N)",),
            forward="        return torch.argmax(x, dim=1)\n",
            output_shape=lambda s: (int(s["M"]),),
            bytes_moved=lambda s: 4 * int(s["M"]) * int(s["N"]) + 8 * int(s["M"]),
            flops=lambda s: int(s["M"]) * int(s["N"]),
            naive=_argmax_solution(False),
            fast=_argmax_solution(True),
            fast_min_speedup=1.2,
            tags=("reduction", "memory-bound"),
        ),
    ]


# ---- softmax family (tier 2 softmax / log_softmax, tier 3 scaled softmax) ----

_SOFTMAX_NAIVE = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define LOG_OUTPUT @LOG@
// One thread per row: max pass, sum-of-exp pass, write pass.
extern "C" __global__ void softmax_naive(const float* __restrict__ x, float* __restrict__ y,
                                         long rows, long cols, float scale) {
    long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* p = x + r * cols;
    float* q = y + r * cols;
    float m = -INFINITY;
    for (long c = 0; c < cols; ++c) m = fmaxf(m, p[c] * scale);
    float s = 0.f;
    for (long c = 0; c < cols; ++c) s += expf(p[c] * scale - m);
#if LOG_OUTPUT
    const float log_s = logf(s);
    for (long c = 0; c < cols; ++c) q[c] = p[c] * scale - m - log_s;
#else
    const float inv = 1.f / s;
    for (long c = 0; c < cols; ++c) q[c] = expf(p[c] * scale - m) * inv;
#endif
}
"""

_SOFTMAX_FAST = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define LOG_OUTPUT @LOG@
#define FULL_MASK 0xffffffffu
// Merge two (max, sum of exp(x - max)) pairs: the online-softmax recurrence.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return;  // both empty
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}
// One block per row: a single read pass computes max and sum together (online softmax),
// shuffles and shared memory merge the per-thread pairs, a second pass writes.
extern "C" __global__ void __launch_bounds__(256) softmax_fast(const float* __restrict__ x,
                                                               float* __restrict__ y,
                                                               long rows, long cols, float scale) {
    __shared__ float sm_m[32], sm_s[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float* p = x + (long)blockIdx.x * cols;
    float* q = y + (long)blockIdx.x * cols;
    float m = -INFINITY, s = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = __ldg(p + c) * scale;
        if (v > m) { s = s * expf(m - v) + 1.f; m = v; }
        else s += expf(v - m);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        merge(m, s, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, s, o));
    if (lane == 0) { sm_m[warp] = m; sm_s[warp] = s; }
    __syncthreads();
    m = lane < warps ? sm_m[lane] : -INFINITY;
    s = lane < warps ? sm_s[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        merge(m, s, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, s, o));
#if LOG_OUTPUT
    const float log_s = logf(s);
    for (long c = threadIdx.x; c < cols; c += blockDim.x) q[c] = __ldg(p + c) * scale - m - log_s;
#else
    const float inv = 1.f / s;
    for (long c = threadIdx.x; c < cols; c += blockDim.x)
        q[c] = expf(__ldg(p + c) * scale - m) * inv;
#endif
}
"""


def _softmax_solution(fast: bool, log: bool, scale_expr: str):
    def build(dtype: str) -> Solution:
        cuda = fill(_SOFTMAX_FAST if fast else _SOFTMAX_NAIVE, LOG=int(log))
        launch = (
            "kernels.softmax_fast(grid=(rows,), block=(256,), "
            if fast
            else "kernels.softmax_naive(grid=((rows + 255) // 256,), block=(256,), "
        )
        fwd = (
            _ROWS_FWD_HEAD
            + "        y = torch.empty_like(x)\n"
            + f"        {launch}args=(x, y, rows, cols, {scale_expr}))\n        return y\n"
        )
        return Solution(cuda=cuda, forward=fwd)

    return build


def _softmax_family(name: str, tier: int, description: str, forward: str, *, log: bool,
                    scaled: bool) -> Family:
    scale_expr = "self.scale" if scaled else "1.0"
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=(shape(M=4096, N=4096), shape(M=1024, N=16384), shape(M=8192, N=1000)),
        small=_ROW_SMALL,
        inputs=("torch.randn(M, N)",),
        init_args=(("scale", "0.125"),) if scaled else (),
        init_body="        self.scale = scale\n" if scaled else "",
        forward=forward,
        output_shape=lambda s: (int(s["M"]), int(s["N"])),
        bytes_moved=lambda s: 8 * int(s["M"]) * int(s["N"]),
        flops=lambda s: 5 * int(s["M"]) * int(s["N"]),
        naive=_softmax_solution(False, log, scale_expr),
        fast=_softmax_solution(True, log, scale_expr),
        fast_min_speedup=1.2,
        tags=("softmax", "memory-bound"),
    )


# ---- row normalisations: layernorm, rmsnorm, l2-normalise (+ residual variants) ----
# MODE 0: layernorm (w, b), 1: rmsnorm (w), 2: x / max(||x||, eps). HAS_RES adds a residual
# input first; without it the kernel ignores the `res` pointer.

_NORM_COMMON = r"""
#define MODE @MODE@
#define HAS_RES @HAS_RES@
__device__ __forceinline__ float load_in(const float* p, const float* rp, long c) {
#if HAS_RES
    return __ldg(p + c) + __ldg(rp + c);
#else
    return __ldg(p + c);
#endif
}
__device__ __forceinline__ float row_scale(float ss, long cols, float eps) {
#if MODE == 2
    return 1.f / fmaxf(sqrtf(ss), eps);
#else
    return rsqrtf(ss / (float)cols + eps);
#endif
}
__device__ __forceinline__ float affine(float v, const float* w, const float* b, long c) {
#if MODE == 0
    return v * w[c] + b[c];
#elif MODE == 1
    return v * w[c];
#else
    return v;
#endif
}
"""

_NORM_NAIVE = _NORM_COMMON + r"""
extern "C" __global__ void rownorm_naive(const float* __restrict__ x, const float* __restrict__ res,
                                         const float* __restrict__ w, const float* __restrict__ b,
                                         float* __restrict__ y, long rows, long cols, float eps) {
    long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* p = x + r * cols;
    const float* rp = res + r * cols;
    float* q = y + r * cols;
    float mean = 0.f;
#if MODE == 0
    for (long c = 0; c < cols; ++c) mean += load_in(p, rp, c);
    mean /= (float)cols;
#endif
    float ss = 0.f;
    for (long c = 0; c < cols; ++c) {
        const float d = load_in(p, rp, c) - mean;
        ss += d * d;
    }
    const float k = row_scale(ss, cols, eps);
    for (long c = 0; c < cols; ++c) q[c] = affine((load_in(p, rp, c) - mean) * k, w, b, c);
}
"""

_NORM_FAST = _NORM_COMMON + r"""
#define IDENTITY 0.f
#define COMBINE(a, b) ((a) + (b))
@BLOCK_REDUCE@
// One block per row; block reductions for the mean and the sum of squared deviations
// (two-pass, so no cancellation), then a coalesced write pass.
extern "C" __global__ void __launch_bounds__(256) rownorm_fast(
    const float* __restrict__ x, const float* __restrict__ res, const float* __restrict__ w,
    const float* __restrict__ b, float* __restrict__ y, long rows, long cols, float eps) {
    __shared__ float smem[32];
    const long r = blockIdx.x;
    const float* p = x + r * cols;
    const float* rp = res + r * cols;
    float* q = y + r * cols;
    float mean = 0.f;
#if MODE == 0
    float part = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) part += load_in(p, rp, c);
    mean = block_reduce(part, smem) / (float)cols;
#endif
    float ss = 0.f;
    for (long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = load_in(p, rp, c) - mean;
        ss += d * d;
    }
    const float k = row_scale(block_reduce(ss, smem), cols, eps);
    for (long c = threadIdx.x; c < cols; c += blockDim.x)
        q[c] = affine((load_in(p, rp, c) - mean) * k, w, b, c);
}
"""


def _norm_solution(fast: bool, mode: int, residual: bool, w: str, b: str, eps: str):
    def build(dtype: str) -> Solution:
        template = _NORM_FAST if fast else _NORM_NAIVE
        cuda = fill(template, BLOCK_REDUCE=BLOCK_REDUCE, MODE=mode, HAS_RES=int(residual))
        res = "residual" if residual else "x"
        grid = "(rows,)" if fast else "((rows + 255) // 256,)"
        kernel = "rownorm_fast" if fast else "rownorm_naive"
        head = "        residual = residual.contiguous()\n" if residual else ""
        fwd = (
            _ROWS_FWD_HEAD
            + head
            + "        y = torch.empty_like(x)\n"
            + f"        kernels.{kernel}(grid={grid}, block=(256,), "
            f"args=(x, {res}, {w}, {b}, y, rows, cols, {eps}))\n        return y\n"
        )
        return Solution(cuda=cuda, forward=fwd)

    return build


_NORM_SHAPES = (shape(M=4096, N=4096), shape(M=16384, N=1024), shape(M=2048, N=8000))

_RMS_INIT = (
    "        self.weight = nn.Parameter(torch.ones(dim))\n"
    "        self.eps = eps\n"
)
_RMS_FWD = (
    "        return {h} * torch.rsqrt({h}.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight\n"
)


def _norm_family(name: str, tier: int, description: str, *, mode: int, residual: bool) -> Family:
    inputs = ("torch.randn(M, N)",) + (("torch.randn(M, N)",) if residual else ())
    if mode == 0:
        init_args, init_body = (("dim", "N"),), "        self.norm = nn.LayerNorm(dim)\n"
        w, b, eps = "self.norm.weight", "self.norm.bias", "self.norm.eps"
        forward = f"        return self.norm({'x + residual' if residual else 'x'})\n"
    elif mode == 1:
        init_args, init_body = (("dim", "N"), ("eps", "1e-6")), _RMS_INIT
        w, b, eps = "self.weight", "self.weight", "self.eps"
        if residual:
            forward = "        h = x + residual\n" + _RMS_FWD.format(h="h")
        else:
            forward = _RMS_FWD.format(h="x")
    else:
        init_args, init_body = (), ""
        w, b, eps = "x", "x", "1e-12"
        forward = "        return F.normalize(x, p=2.0, dim=1)\n"
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=_NORM_SHAPES,
        small=_ROW_SMALL,
        inputs=inputs,
        forward_args="x, residual" if residual else "x",
        init_args=init_args,
        init_body=init_body,
        forward=forward,
        output_shape=lambda s: (int(s["M"]), int(s["N"])),
        bytes_moved=lambda s: 4 * (3 if residual else 2) * int(s["M"]) * int(s["N"]),
        flops=lambda s: 8 * int(s["M"]) * int(s["N"]),
        naive=_norm_solution(False, mode, residual, w, b, eps),
        fast=_norm_solution(True, mode, residual, w, b, eps),
        atol=1e-3 if mode != 2 else None,
        rtol=1e-3 if mode != 2 else None,
        fast_min_speedup=1.2,
        tags=("normalization", "memory-bound"),
    )


def tier2_row_families() -> list[Family]:
    return [
        _softmax_family("softmax", 2, "Softmax over the last dimension",
                        "        return torch.softmax(x, dim=1)\n", log=False, scaled=False),
        _softmax_family("log_softmax", 2, "Log-softmax over the last dimension",
                        "        return torch.log_softmax(x, dim=1)\n", log=True, scaled=False),
        _norm_family("layernorm", 2, "LayerNorm over the last dimension (affine)", mode=0,
                     residual=False),
        _norm_family("rmsnorm", 2, "RMSNorm over the last dimension (learned scale)", mode=1,
                     residual=False),
        _norm_family("l2_normalize", 2, "Divide each row by its L2 norm (F.normalize)", mode=2,
                     residual=False),
    ]


def tier3_row_families() -> list[Family]:
    return [
        _softmax_family("scaled_softmax", 3, "Softmax of a scaled input: softmax(x * scale)",
                        "        return torch.softmax(x * self.scale, dim=1)\n", log=False,
                        scaled=True),
        _norm_family("residual_layernorm", 3, "Residual add then LayerNorm: norm(x + residual)",
                     mode=0, residual=True),
        _norm_family("residual_rmsnorm", 3, "Residual add then RMSNorm", mode=1, residual=True),
    ]
