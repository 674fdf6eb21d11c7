"""Matmul variants (tier 2), fused linear layers and attention (tier 3), and the tier 1 data
movement / mat-vec families (transpose, batched transpose, mat-vec, embedding, middle-dim sum).

All matmul-like families share two generic kernels, ``mm_naive`` (one thread per output, all
operands from global memory) and ``mm_fast`` (64x64 shared-memory tiles, 4x4 register blocking
per thread), computing ``C[z] = act(alpha * A[z] @ op(B[z]) + bias)`` with ``op(B) = B`` or
``B^T`` and an optional batch index ``z``.
"""

from __future__ import annotations

from multiminddev.tasks.builtin.rows import _SOFTMAX_FAST, _SOFTMAX_NAIVE
from multiminddev.tasks.builtin.spec import Family, Shape, Solution, shape

_EPILOGUE = r"""
// act: 0 none, 1 relu, 2 exact gelu
__device__ __forceinline__ float epilogue(float acc, const float* bias, long col, float alpha,
                                          int act) {
    float v = acc * alpha + (bias != nullptr ? bias[col] : 0.f);
    if (act == 1) v = fmaxf(v, 0.f);
    else if (act == 2) v = 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    return v;
}
"""

MM_NAIVE = _EPILOGUE + r"""
extern "C" __global__ void mm_naive(const float* __restrict__ A, const float* __restrict__ B,
                                    const float* __restrict__ bias, float* __restrict__ C,
                                    long M, long N, long K, long strideA, long strideB,
                                    long strideC, int transB, float alpha, int act) {
    const long col = blockIdx.x * (long)blockDim.x + threadIdx.x;
    const long row = blockIdx.y * (long)blockDim.y + threadIdx.y;
    const long z = blockIdx.z;
    if (row >= M || col >= N) return;
    const float* a = A + z * strideA + row * K;
    const float* b = B + z * strideB;
    float acc = 0.f;
    for (long k = 0; k < K; ++k) acc += a[k] * (transB ? b[col * K + k] : b[k * N + col]);
    C[z * strideC + row * N + col] = epilogue(acc, bias, col, alpha, act);
}
"""

MM_FAST = _EPILOGUE + r"""
#define BM 64
#define BN 64
#define BK 16
// 256 threads compute a 64x64 tile of C; each thread owns a 4x4 block of outputs at rows
// ty + 16*i and columns tx + 16*j (conflict-free shared-memory reads, coalesced stores).
// Tiles of A (stored k-major) and B are staged in shared memory, zero-padded at the edges.
extern "C" __global__ void __launch_bounds__(256) mm_fast(
    const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
    float* __restrict__ C, long M, long N, long K, long strideA, long strideB, long strideC,
    int transB, float alpha, int act) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const long m0 = (long)blockIdx.y * BM, n0 = (long)blockIdx.x * BN, z = blockIdx.z;
    const float* Ab = A + z * strideA;
    const float* Bb = B + z * strideB;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    for (long k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BM * BK; e += 256) {
            const int mm = e / BK, kk = e % BK;
            const long gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? Ab[gm * K + gk] : 0.f;
        }
        for (int e = tid; e < BN * BK; e += 256) {
            int nn, kk;
            if (transB) { nn = e / BK; kk = e % BK; }
            else { kk = e / BN; nn = e % BN; }
            const long gn = n0 + nn, gk = k0 + kk;
            float v = 0.f;
            if (gn < N && gk < K) v = transB ? Bb[gn * K + gk] : Bb[gk * N + gn];
            Bs[kk][nn] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const long gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const long gn = n0 + tx + 16 * j;
            if (gn < N) C[z * strideC + gm * N + gn] = epilogue(acc[i][j], bias, gn, alpha, act);
        }
    }
}
"""


def mm_launch(fast: bool, a: str, b: str, bias: str, c: str, m: str, n: str, k: str,
              batch: str = "1", strides: str = "0, 0, 0", trans_b: int = 0, alpha: str = "1.0",
              act: int = 0) -> str:
    """One launch line of the generic matmul (8-space indented)."""
    if fast:
        grid = f"(({n} + 63) // 64, ({m} + 63) // 64, {batch})"
        head = f"        kernels.mm_fast(grid={grid}, block=(256,), "
    else:
        grid = f"(({n} + 15) // 16, ({m} + 15) // 16, {batch})"
        head = f"        kernels.mm_naive(grid={grid}, block=(16, 16), "
    return (head + f"args=({a}, {b}, {bias}, {c}, {m}, {n}, {k}, {strides}, {trans_b}, "
            f"{alpha}, {act}))\n")


def _mm_solution(fast: bool, forward_head: str, launch_kw: dict[str, str | int]):
    def build(dtype: str) -> Solution:
        fwd = forward_head + mm_launch(fast, **launch_kw) + "        return c\n"  # type: ignore[arg-type]
        return Solution(cuda=MM_FAST if fast else MM_NAIVE, forward=fwd)

    return build


def _mm_family(name: str, tier: int, description: str, shapes: tuple[Shape, ...], small: Shape,
               *, inputs: tuple[str, ...], forward: str, forward_args: str, out, flops, bytes_,
               head: str, launch_kw: dict, init_args=(), init_body="", tags=("matmul",)) -> Family:
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=shapes,
        small=small,
        inputs=inputs,
        forward_args=forward_args,
        forward=forward,
        init_args=init_args,
        init_body=init_body,
        output_shape=out,
        bytes_moved=bytes_,
        flops=flops,
        naive=_mm_solution(False, head, launch_kw),
        fast=_mm_solution(True, head, launch_kw),
        atol=2e-3,
        rtol=2e-3,
        fast_min_speedup=1.3,
        tags=tags,
    )


def _mnk(s: Shape) -> tuple[int, int, int]:
    return int(s["M"]), int(s["N"]), int(s["K"])


def _mm_bytes(s: Shape) -> int:
    m, n, k = _mnk(s)
    return 4 * (m * k + k * n + m * n)


_MM2D_HEAD = """\
        a = a.contiguous()
        b = b.contiguous()
        m, k = a.shape
        n = b.shape[{n_dim}]
        c = torch.empty((m, n), device=a.device, dtype=a.dtype)
"""
_LINEAR_HEAD = """\
        x = x.contiguous()
        w = self.linear.weight.contiguous()
        m, k = x.shape
        n = w.shape[0]
        c = torch.empty((m, n), device=x.device, dtype=x.dtype)
"""
_BMM_HEAD = """\
        a = a.contiguous()
        b = b.contiguous()
        batch, m, k = a.shape
        n = b.shape[2]
        c = torch.empty((batch, m, n), device=a.device, dtype=a.dtype)
"""


def _plain_mm(name: str, description: str, shapes: tuple[Shape, ...], small: Shape,
              trans_b: bool) -> Family:
    b_shape = "torch.randn(N, K)" if trans_b else "torch.randn(K, N)"
    return _mm_family(
        name, 2, description, shapes, small,
        inputs=("torch.randn(M, K)", b_shape),
        forward_args="a, b",
        forward=f"        return torch.matmul(a, {'b.T' if trans_b else 'b'})\n",
        out=lambda s: (int(s["M"]), int(s["N"])),
        flops=lambda s: 2 * _mnk(s)[0] * _mnk(s)[1] * _mnk(s)[2],
        bytes_=_mm_bytes,
        head=_MM2D_HEAD.format(n_dim=0 if trans_b else 1),
        launch_kw={"a": "a", "b": "b", "bias": "None", "c": "c", "m": "m", "n": "n", "k": "k",
                   "trans_b": int(trans_b)},
    )


_ACT_TORCH = {0: "{y}", 1: "torch.relu({y})", 2: "F.gelu({y})"}


def _linear(name: str, tier: int, description: str, act: int) -> Family:
    return _mm_family(
        name, tier, description,
        (shape(M=2048, K=1024, N=1024), shape(M=4096, K=2048, N=1024),
         shape(M=1000, K=1536, N=3000)),
        shape(M=20, K=40, N=70),
        inputs=("torch.randn(M, K)",),
        forward_args="x",
        forward="        return " + _ACT_TORCH[act].format(y="self.linear(x)") + "\n",
        init_args=(("in_features", "K"), ("out_features", "N")),
        init_body="        self.linear = nn.Linear(in_features, out_features)\n",
        out=lambda s: (int(s["M"]), int(s["N"])),
        flops=lambda s: 2 * _mnk(s)[0] * _mnk(s)[1] * _mnk(s)[2],
        bytes_=_mm_bytes,
        head=_LINEAR_HEAD,
        launch_kw={"a": "x", "b": "w", "bias": "self.linear.bias", "c": "c", "m": "m", "n": "n",
                   "k": "k", "trans_b": 1, "act": act},
        tags=("matmul", "fused") if act else ("matmul",),
    )


def matmul_families() -> list[Family]:
    square = _plain_mm(
        "matmul_square", "Square matrix multiplication C = A @ B",
        (shape(M=1024, K=1024, N=1024), shape(M=2048, K=2048, N=2048),
         shape(M=1537, K=1537, N=1537)),
        shape(M=70, K=40, N=130), trans_b=False,
    )
    tall = _plain_mm(
        "matmul_tall_skinny", "Tall-skinny matmul: many rows, small output width",
        (shape(M=16384, K=1024, N=64), shape(M=32768, K=512, N=128), shape(M=65536, K=256, N=96)),
        shape(M=130, K=40, N=3), trans_b=False,
    )
    trans = _plain_mm(
        "matmul_transposed_b", "Matmul with a transposed second operand: A @ B.T",
        (shape(M=1024, K=1024, N=1024), shape(M=2048, K=512, N=2048),
         shape(M=1000, K=2000, N=1500)),
        shape(M=33, K=50, N=70), trans_b=True,
    )
    bmm = _mm_family(
        "batched_matmul", 2, "Batched matrix multiplication (torch.bmm)",
        (shape(B=32, M=256, K=512, N=256), shape(B=16, M=512, K=512, N=512),
         shape(B=64, M=200, K=300, N=100)),
        shape(B=3, M=35, K=40, N=66),
        inputs=("torch.randn(B, M, K)", "torch.randn(B, K, N)"),
        forward_args="a, b",
        forward="        return torch.bmm(a, b)\n",
        out=lambda s: (int(s["B"]), int(s["M"]), int(s["N"])),
        flops=lambda s: 2 * int(s["B"]) * _mnk(s)[0] * _mnk(s)[1] * _mnk(s)[2],
        bytes_=lambda s: 4 * int(s["B"]) * (_mnk(s)[0] * _mnk(s)[2] + _mnk(s)[2] * _mnk(s)[1]
                                            + _mnk(s)[0] * _mnk(s)[1]),
        head=_BMM_HEAD,
        launch_kw={"a": "a", "b": "b", "bias": "None", "c": "c", "m": "m", "n": "n", "k": "k",
                   "batch": "batch", "strides": "m * k, k * n, m * n"},
    )
    return [
        square, tall, trans, bmm,
        _linear("linear", 2, "Fully connected layer (nn.Linear): x @ W.T + b", act=0),
    ]


_ATTN_HEAD = """\
        q = q.contiguous()
        k = k.contiguous()
        v = v.contiguous()
        batch, heads, s_q, d = q.shape
        s_kv = k.shape[2]
        bh = batch * heads
        scores = torch.empty((batch, heads, s_q, s_kv), device=q.device, dtype=q.dtype)
        probs = torch.empty_like(scores)
        out = torch.empty((batch, heads, s_q, v.shape[3]), device=q.device, dtype=q.dtype)
"""


def _attention_solution(fast: bool):
    softmax_src = (_SOFTMAX_FAST if fast else _SOFTMAX_NAIVE).replace("@LOG@", "0")
    softmax_launch = (
        "        kernels.softmax_fast(grid=(bh * s_q,), block=(256,), "
        if fast
        else "        kernels.softmax_naive(grid=((bh * s_q + 255) // 256,), block=(256,), "
    ) + "args=(scores, probs, bh * s_q, s_kv, 1.0))\n"

    def build(dtype: str) -> Solution:
        fwd = (
            _ATTN_HEAD
            + mm_launch(fast, "q", "k", "None", "scores", "s_q", "s_kv", "d", batch="bh",
                        strides="s_q * d, s_kv * d, s_q * s_kv", trans_b=1, alpha="d ** -0.5")
            + softmax_launch
            + mm_launch(fast, "probs", "v", "None", "out", "s_q", "v.shape[3]", "s_kv",
                        batch="bh", strides="s_q * s_kv, s_kv * v.shape[3], s_q * v.shape[3]")
            + "        return out\n"
        )
        cuda = (MM_FAST if fast else MM_NAIVE) + "\n" + softmax_src
        return Solution(cuda=cuda, forward=fwd)

    return build


def _attn_flops(s: Shape) -> int:
    bh, n, d = int(s["B"]) * int(s["H"]), int(s["S"]), int(s["D"])
    return 4 * bh * n * n * d + 5 * bh * n * n


def tier3_matmul_families() -> list[Family]:
    attention = Family(
        name="attention",
        tier=3,
        description="Scaled dot-product attention, unmasked: softmax(q @ k^T / sqrt(d)) @ v",
        shapes=(shape(B=4, H=8, S=1024, D=64), shape(B=2, H=16, S=512, D=128),
                shape(B=8, H=4, S=1000, D=64)),
        small=shape(B=2, H=2, S=70, D=20),
        inputs=("torch.randn(B, H, S, D)", "torch.randn(B, H, S, D)", "torch.randn(B, H, S, D)"),
        forward_args="q, k, v",
        forward=(
            "        scores = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)\n"
            "        return torch.matmul(torch.softmax(scores, dim=-1), v)\n"
        ),
        output_shape=lambda s: (int(s["B"]), int(s["H"]), int(s["S"]), int(s["D"])),
        bytes_moved=lambda s: 4 * 4 * int(s["B"]) * int(s["H"]) * int(s["S"]) * int(s["D"]),
        flops=_attn_flops,
        naive=_attention_solution(False),
        fast=_attention_solution(True),
        atol=1e-3,
        rtol=1e-3,
        fast_min_speedup=1.3,
        tags=("attention", "fused"),
    )
    return [
        _linear("linear_relu", 3, "Linear layer then ReLU: relu(x @ W.T + b)", act=1),
        _linear("linear_gelu", 3, "Linear layer then exact GELU", act=2),
        attention,
    ]


# ---- tier 1: transpose, mat-vec, embedding, middle-dim sum ----

_TRANSPOSE_NAIVE = r"""
// y[b][j][i] = x[b][i][j]; one thread per output element (coalesced writes, strided reads).
extern "C" __global__ void transpose_naive(const float* __restrict__ x, float* __restrict__ y,
                                           long batch, long rows, long cols) {
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= batch * rows * cols) return;
    const long i = t % rows;
    const long j = (t / rows) % cols;
    const long b = t / (rows * cols);
    y[t] = x[(b * rows + i) * cols + j];
}
"""

_TRANSPOSE_FAST = r"""
// 32x32 tiles through shared memory (padded to 33 columns: no bank conflicts), so both the
// global read and the global write are coalesced. Block (32, 8); grid (cols/32, rows/32, batch).
extern "C" __global__ void __launch_bounds__(256) transpose_fast(const float* __restrict__ x,
                                                                 float* __restrict__ y,
                                                                 long batch, long rows, long cols) {
    __shared__ float tile[32][33];
    const long b = blockIdx.z;
    const float* xb = x + b * rows * cols;
    float* yb = y + b * rows * cols;
    const long i0 = (long)blockIdx.y * 32, j0 = (long)blockIdx.x * 32;
    for (int k = threadIdx.y; k < 32; k += 8) {
        const long i = i0 + k, j = j0 + threadIdx.x;
        if (i < rows && j < cols) tile[k][threadIdx.x] = xb[i * cols + j];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += 8) {
        const long j = j0 + k, i = i0 + threadIdx.x;
        if (j < cols && i < rows) yb[j * rows + i] = tile[threadIdx.x][k];
    }
}
"""


def _transpose_solution(fast: bool, batched: bool):
    def build(dtype: str) -> Solution:
        if batched:
            head = "        x = x.contiguous()\n        batch, rows, cols = x.shape\n"
            alloc = "        y = torch.empty((batch, cols, rows), device=x.device, dtype=x.dtype)\n"
        else:
            head = "        x = x.contiguous()\n        batch = 1\n        rows, cols = x.shape\n"
            alloc = "        y = torch.empty((cols, rows), device=x.device, dtype=x.dtype)\n"
        if fast:
            launch = ("        kernels.transpose_fast(grid=((cols + 31) // 32, (rows + 31) // 32, "
                      "batch), block=(32, 8), args=(x, y, batch, rows, cols))\n")
        else:
            launch = ("        n = batch * rows * cols\n"
                      "        kernels.transpose_naive(grid=((n + 255) // 256,), block=(256,), "
                      "args=(x, y, batch, rows, cols))\n")
        cuda = _TRANSPOSE_FAST if fast else _TRANSPOSE_NAIVE
        return Solution(cuda=cuda, forward=head + alloc + launch + "        return y\n")

    return build


_MATVEC_NAIVE = r"""
extern "C" __global__ void matvec_naive(const float* __restrict__ A, const float* __restrict__ v,
                                        float* __restrict__ y, long rows, long cols) {
    const long r = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float acc = 0.f;
    for (long c = 0; c < cols; ++c) acc += A[r * cols + c] * v[c];
    y[r] = acc;
}
"""

_MATVEC_FAST = r"""
#define FULL_MASK 0xffffffffu
// One warp per row: lanes stride along the row (coalesced), then a shuffle reduction.
extern "C" __global__ void __launch_bounds__(256) matvec_fast(const float* __restrict__ A,
                                                              const float* __restrict__ v,
                                                              float* __restrict__ y,
                                                              long rows, long cols) {
    const int lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // whole warps exit together
    const float* a = A + r * cols;
    float acc = 0.f;
    for (long c = lane; c < cols; c += 32) acc = fmaf(__ldg(a + c), __ldg(v + c), acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
    if (lane == 0) y[r] = acc;
}
"""


def _matvec_solution(fast: bool):
    def build(dtype: str) -> Solution:
        grid = "((rows + 7) // 8,)" if fast else "((rows + 255) // 256,)"
        kernel = "matvec_fast" if fast else "matvec_naive"
        fwd = (
            "        a = a.contiguous()\n        v = v.contiguous()\n"
            "        rows, cols = a.shape\n"
            "        y = torch.empty((rows,), device=a.device, dtype=a.dtype)\n"
            f"        kernels.{kernel}(grid={grid}, block=(256,), args=(a, v, y, rows, cols))\n"
            "        return y\n"
        )
        return Solution(cuda=_MATVEC_FAST if fast else _MATVEC_NAIVE, forward=fwd)

    return build


_EMBEDDING_NAIVE = r"""
// y[t][d] = W[idx[t]][d]; an out-of-range index writes 0 instead of reading out of bounds.
extern "C" __global__ void embedding_naive(const long* __restrict__ idx,
                                           const float* __restrict__ W, float* __restrict__ y,
                                           long tokens, long dim, long vocab) {
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= tokens * dim) return;
    const long row = idx[t / dim];
    y[t] = (row >= 0 && row < vocab) ? W[row * dim + t % dim] : 0.f;
}
"""


def _embedding_bytes(s: Shape) -> int:
    """Ids read, distinct rows read (repeated ids hit the cache: count only the expected
    number of distinct rows among uniform draws), output written. A lower bound, since the
    evaluator rejects runs faster than bytes_moved at peak bandwidth."""
    vocab, dim, tokens = int(s["V"]), int(s["D"]), int(s["B"]) * int(s["L"])
    distinct = vocab * (1.0 - (1.0 - 1.0 / vocab) ** tokens)
    return int(8 * tokens + 4 * dim * (tokens + distinct))


def _embedding_naive(dtype: str) -> Solution:
    fwd = (
        "        idx = idx.contiguous()\n"
        "        w = self.embedding.weight.contiguous()\n"
        "        vocab, dim = w.shape\n"
        "        tokens = idx.numel()\n"
        "        y = torch.empty((*idx.shape, dim), device=w.device, dtype=w.dtype)\n"
        "        n = tokens * dim\n"
        "        kernels.embedding_naive(grid=((n + 255) // 256,), block=(256,), "
        "args=(idx, w, y, tokens, dim, vocab))\n"
        "        return y\n"
    )
    return Solution(cuda=_EMBEDDING_NAIVE, forward=fwd)


_SUM_MID_NAIVE = r"""
// x: (B, R, C) -> y: (B, C), summing over R. Threads of a warp take neighbouring c: coalesced.
extern "C" __global__ void sum_mid_naive(const float* __restrict__ x, float* __restrict__ y,
                                         long batch, long reduce, long cols) {
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= batch * cols) return;
    const long b = t / cols, c = t % cols;
    const float* p = x + b * reduce * cols + c;
    float acc = 0.f;
    for (long r = 0; r < reduce; ++r) acc += p[r * cols];
    y[t] = acc;
}
"""


_SUM_MID_FAST = r"""
// Block (32, 8) owns 32 columns of one batch: 8 thread rows split the reduced dimension
// (8x the naive kernel's parallelism, still coalesced), then shared memory adds the 8 partials.
// Grid (cols / 32, batch).
extern "C" __global__ void __launch_bounds__(256) sum_mid_fast(const float* __restrict__ x,
                                                               float* __restrict__ y, long batch,
                                                               long reduce, long cols) {
    __shared__ float part[8][33];
    const long c = (long)blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;
    float acc = 0.f;
    if (c < cols) {
        const float* p = x + b * reduce * cols + c;
        for (long r = threadIdx.y; r < reduce; r += 8) acc += __ldg(p + r * cols);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) total += part[k][threadIdx.x];
        y[b * cols + c] = total;
    }
}
"""


def _sum_mid_solution(fast: bool):
    def build(dtype: str) -> Solution:
        if fast:
            launch = ("        kernels.sum_mid_fast(grid=((cols + 31) // 32, batch), "
                      "block=(32, 8), args=(x, y, batch, reduce, cols))\n")
        else:
            launch = ("        n = batch * cols\n"
                      "        kernels.sum_mid_naive(grid=((n + 255) // 256,), block=(256,), "
                      "args=(x, y, batch, reduce, cols))\n")
        fwd = (
            "        x = x.contiguous()\n"
            "        batch, reduce, cols = x.shape\n"
            "        y = torch.empty((batch, cols), device=x.device, dtype=x.dtype)\n"
            + launch + "        return y\n"
        )
        return Solution(cuda=_SUM_MID_FAST if fast else _SUM_MID_NAIVE, forward=fwd)

    return build


def _transpose_family() -> Family:
    return Family(
        name="transpose",
        tier=1,
        description="Matrix transpose into a contiguous result",
        shapes=(shape(M=4096, N=4096), shape(M=8192, N=2048), shape(M=4095, N=3001)),
        small=shape(M=37, N=70),
        inputs=("torch.randn(M, N)",),
        forward="        return x.transpose(0, 1).contiguous()\n",
        output_shape=lambda s: (int(s["N"]), int(s["M"])),
        bytes_moved=lambda s: 8 * int(s["M"]) * int(s["N"]),
        flops=lambda s: 0,
        naive=_transpose_solution(False, False),
        fast=_transpose_solution(True, False),
        fast_min_speedup=1.2,
        tags=("data-movement", "memory-bound"),
    )


def _batched_transpose_family() -> Family:
    return Family(
        name="batched_transpose",
        tier=1,
        description="Swap the last two dims of a 3D tensor into a contiguous result",
        shapes=(shape(B=16, M=1024, N=1024), shape(B=64, M=256, N=1024),
                shape(B=8, M=1000, N=2050)),
        small=shape(B=3, M=33, N=40),
        inputs=("torch.randn(B, M, N)",),
        forward="        return x.transpose(1, 2).contiguous()\n",
        output_shape=lambda s: (int(s["B"]), int(s["N"]), int(s["M"])),
        bytes_moved=lambda s: 8 * int(s["B"]) * int(s["M"]) * int(s["N"]),
        flops=lambda s: 0,
        naive=_transpose_solution(False, True),
        fast=_transpose_solution(True, True),
        fast_min_speedup=1.2,
        tags=("data-movement", "memory-bound"),
    )


def _matvec_family() -> Family:
    return Family(
        name="matvec",
        tier=1,
        description="Matrix-vector product A @ v",
        shapes=(shape(M=8192, K=4096), shape(M=4096, K=8192), shape(M=30000, K=1000)),
        small=shape(M=13, K=50),
        inputs=("torch.randn(M, K)", "torch.randn(K)"),
        forward_args="a, v",
        forward="        return torch.matmul(a, v)\n",
        output_shape=lambda s: (int(s["M"]),),
        bytes_moved=lambda s: 4 * (int(s["M"]) * int(s["K"]) + int(s["K"]) + int(s["M"])),
        flops=lambda s: 2 * int(s["M"]) * int(s["K"]),
        naive=_matvec_solution(False),
        fast=_matvec_solution(True),
        atol=1e-3,
        rtol=1e-3,
        fast_min_speedup=1.2,
        tags=("matvec", "memory-bound"),
    )


def _embedding_family() -> Family:
    return Family(
        name="embedding",
        tier=1,
        description="Embedding lookup (nn.Embedding) of int64 token ids",
        shapes=(shape(V=32000, D=1024, B=16, L=1024), shape(V=50000, D=768, B=32, L=512),
                shape(V=8000, D=2000, B=8, L=1000)),
        small=shape(V=50, D=6, B=2, L=7),
        inputs=("torch.randint(0, V, (B, L))",),
        forward_args="idx",
        init_args=(("num_embeddings", "V"), ("embedding_dim", "D")),
        init_body="        self.embedding = nn.Embedding(num_embeddings, embedding_dim)\n",
        forward="        return self.embedding(idx)\n",
        output_shape=lambda s: (int(s["B"]), int(s["L"]), int(s["D"])),
        bytes_moved=_embedding_bytes,
        flops=lambda s: 0,
        naive=_embedding_naive,
        tags=("gather", "memory-bound"),
    )


def _sum_mid_family() -> Family:
    return Family(
        name="sum_dim1_3d",
        tier=1,
        description="Sum over the middle dimension of a 3D tensor",
        shapes=(shape(B=16, R=1024, C=1024), shape(B=128, R=256, C=512),
                shape(B=10, R=999, C=2000)),
        small=shape(B=3, R=21, C=300),
        inputs=("torch.randn(B, R, C)",),
        forward="        return torch.sum(x, dim=1)\n",
        output_shape=lambda s: (int(s["B"]), int(s["C"])),
        bytes_moved=lambda s: 4 * int(s["B"]) * int(s["C"]) * (int(s["R"]) + 1),
        flops=lambda s: int(s["B"]) * int(s["R"]) * int(s["C"]),
        naive=_sum_mid_solution(False),
        fast=_sum_mid_solution(True),
        fast_min_speedup=1.2,
        atol=1e-3,
        rtol=1e-3,
        tags=("reduction", "memory-bound"),
    )


def tier1_linalg_families() -> list[Family]:
    return [_transpose_family(), _batched_transpose_family(), _matvec_family(),
            _embedding_family(), _sum_mid_family()]
