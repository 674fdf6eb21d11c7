"""Pooling and convolution (tier 2), and convolution + ReLU (tier 3). Stride-1, unpadded
convolutions with bias; pooling without padding."""

from __future__ import annotations

from multiminddev.tasks.builtin.spec import Family, Shape, Solution, fill, shape

_POOL_NAIVE = r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define IS_MAX @IS_MAX@
// One thread per output of a (planes, H, W) -> (planes, Ho, Wo) pooling window.
extern "C" __global__ void pool2d_naive(const float* __restrict__ x, float* __restrict__ y,
                                        long planes, long H, long W, long Ho, long Wo,
                                        int k, int s) {
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= planes * Ho * Wo) return;
    const long ow = t % Wo, oh = (t / Wo) % Ho, plane = t / (Wo * Ho);
    const float* p = x + plane * H * W + (oh * s) * W + ow * s;
    float acc = IS_MAX ? -INFINITY : 0.f;
    for (int i = 0; i < k; ++i)
        for (int j = 0; j < k; ++j) {
            const float v = p[i * W + j];
            acc = IS_MAX ? fmaxf(acc, v) : acc + v;
        }
    y[t] = IS_MAX ? acc : acc / (float)(k * k);
}
"""


def _pool_solution(is_max: bool):
    def build(dtype: str) -> Solution:
        fwd = (
            "        x = x.contiguous()\n"
            "        batch, channels, h, w = x.shape\n"
            "        k, s = self.kernel_size, self.stride\n"
            "        ho, wo = (h - k) // s + 1, (w - k) // s + 1\n"
            "        y = torch.empty((batch, channels, ho, wo), device=x.device, dtype=x.dtype)\n"
            "        n = batch * channels * ho * wo\n"
            "        kernels.pool2d_naive(grid=((n + 255) // 256,), block=(256,), "
            "args=(x, y, batch * channels, h, w, ho, wo, k, s))\n"
            "        return y\n"
        )
        return Solution(cuda=fill(_POOL_NAIVE, IS_MAX=int(is_max)), forward=fwd)

    return build


def _pool_out(s: Shape) -> tuple[int, int, int, int]:
    ho = (int(s["H"]) - int(s["KS"])) // int(s["STRIDE"]) + 1
    wo = (int(s["W"]) - int(s["KS"])) // int(s["STRIDE"]) + 1
    return int(s["B"]), int(s["C"]), ho, wo


def _numel(dims: tuple[int, ...]) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def _pool_family(name: str, description: str, fn: str, is_max: bool) -> Family:
    return Family(
        name=name,
        tier=2,
        description=description,
        shapes=(shape(B=16, C=64, H=128, W=128, KS=2, STRIDE=2),
                shape(B=8, C=32, H=256, W=256, KS=3, STRIDE=2),
                shape(B=16, C=48, H=127, W=129, KS=3, STRIDE=1)),
        small=shape(B=2, C=3, H=9, W=12, KS=3, STRIDE=2),
        inputs=("torch.randn(B, C, H, W)",),
        init_args=(("kernel_size", "KS"), ("stride", "STRIDE")),
        init_body="        self.kernel_size = kernel_size\n        self.stride = stride\n",
        forward=f"        return {fn}(x, self.kernel_size, self.stride)\n",
        output_shape=_pool_out,
        bytes_moved=lambda s: 4 * (_numel((int(s["B"]), int(s["C"]), int(s["H"]), int(s["W"])))
                                   + _numel(_pool_out(s))),
        flops=lambda s: _numel(_pool_out(s)) * int(s["KS"]) ** 2,
        naive=_pool_solution(is_max),
        tags=("pooling", "memory-bound"),
    )


_CONV1D_NAIVE = r"""
// x (B, Ci, L), w (Co, Ci, K), bias (Co) -> y (B, Co, L - K + 1); one thread per output.
extern "C" __global__ void conv1d_naive(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ bias, float* __restrict__ y,
                                        long B, long Ci, long Co, long L, long K) {
    const long Lo = L - K + 1;
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= B * Co * Lo) return;
    const long l = t % Lo, co = (t / Lo) % Co, b = t / (Lo * Co);
    const float* xb = x + b * Ci * L + l;
    const float* wc = w + co * Ci * K;
    float acc = 0.f;
    for (long ci = 0; ci < Ci; ++ci)
        for (long k = 0; k < K; ++k) acc += wc[ci * K + k] * xb[ci * L + k];
    y[t] = acc + bias[co];
}
"""


_CONV1D_FAST = r"""
#define CO_TILE 8
#define POS 4
// Register blocking as in conv2d_fast: 8 output channels x 4 output positions per thread.
// Grid (positions / 1024, Co / 8, B); out-of-range channels / positions re-read valid ones
// and are not stored.
extern "C" __global__ void conv1d_fast(const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ bias, float* __restrict__ y,
                                       long B, long Ci, long Co, long L, long K) {
    const long Lo = L - K + 1;
    const long co0 = (long)blockIdx.y * CO_TILE, b = blockIdx.z;
    const long wstride = Ci * K;
    const long last = Co - 1 - co0;
    const long l0 = (long)blockIdx.x * blockDim.x * POS + threadIdx.x;
    long xoff[POS];
#pragma unroll
    for (int q = 0; q < POS; ++q) {
        const long l = l0 + (long)q * blockDim.x;
        xoff[q] = l < Lo ? l : 0;
    }
    float acc[CO_TILE][POS];
#pragma unroll
    for (int u = 0; u < CO_TILE; ++u)
#pragma unroll
        for (int q = 0; q < POS; ++q) acc[u][q] = 0.f;
    for (long ci = 0; ci < Ci; ++ci) {
        const float* xc = x + (b * Ci + ci) * L;
        const float* wc = w + co0 * wstride + ci * K;
        for (long k = 0; k < K; ++k) {
            float xv[POS];
#pragma unroll
            for (int q = 0; q < POS; ++q) xv[q] = __ldg(xc + xoff[q] + k);
#pragma unroll
            for (int u = 0; u < CO_TILE; ++u) {
                const float wv = __ldg(wc + (u < last ? u : last) * wstride + k);
#pragma unroll
                for (int q = 0; q < POS; ++q) acc[u][q] = fmaf(wv, xv[q], acc[u][q]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < CO_TILE; ++u) {
        const long co = co0 + u;
        if (co >= Co) continue;
#pragma unroll
        for (int q = 0; q < POS; ++q) {
            const long l = l0 + (long)q * blockDim.x;
            if (l < Lo) y[(b * Co + co) * Lo + l] = acc[u][q] + bias[co];
        }
    }
}
"""


def _conv1d_solution(fast: bool):
    def build(dtype: str) -> Solution:
        head = (
            "        x = x.contiguous()\n"
            "        w = self.conv.weight.contiguous()\n"
            "        batch, ci, length = x.shape\n"
            "        co, _, k = w.shape\n"
            "        lo = length - k + 1\n"
            "        y = torch.empty((batch, co, lo), device=x.device, dtype=x.dtype)\n"
        )
        args = "args=(x, w, self.conv.bias, y, batch, ci, co, length, k))\n"
        if fast:
            launch = ("        kernels.conv1d_fast(grid=((lo + 1023) // 1024, (co + 7) // 8, "
                      "batch), block=(256,), " + args)
        else:
            launch = ("        n = y.numel()\n"
                      "        kernels.conv1d_naive(grid=((n + 255) // 256,), block=(256,), "
                      + args)
        return Solution(cuda=_CONV1D_FAST if fast else _CONV1D_NAIVE,
                        forward=head + launch + "        return y\n")

    return build


_CONV2D_NAIVE = r"""
#define RELU @RELU@
// x (B, Ci, H, W), w (Co, Ci, K, K) -> y (B, Co, H-K+1, W-K+1); one thread per output.
extern "C" __global__ void conv2d_naive(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ bias, float* __restrict__ y,
                                        long B, long Ci, long Co, long H, long W, long K) {
    const long Ho = H - K + 1, Wo = W - K + 1;
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= B * Co * Ho * Wo) return;
    const long ow = t % Wo, oh = (t / Wo) % Ho, co = (t / (Wo * Ho)) % Co, b = t / (Wo * Ho * Co);
    float acc = 0.f;
    for (long ci = 0; ci < Ci; ++ci) {
        const float* xp = x + ((b * Ci + ci) * H + oh) * W + ow;
        const float* wp = w + (co * Ci + ci) * K * K;
        for (long i = 0; i < K; ++i)
            for (long j = 0; j < K; ++j) acc += wp[i * K + j] * xp[i * W + j];
    }
    float v = acc + bias[co];
    y[t] = RELU ? fmaxf(v, 0.f) : v;
}
"""

_CONV2D_FAST = r"""
#define RELU @RELU@
#define CO_TILE 8
#define PIX 4
// Register blocking: each thread computes 8 output channels x 4 output pixels, so every input
// value it loads feeds 8 FMAs and every weight feeds 4 (the naive kernel loads both per FMA).
// A block's 256 threads take 1024 pixels, strided by 256 so loads stay coalesced.
// Grid (pixels / 1024, Co / 8, B). Channels past Co re-read channel Co-1 and pixels past the
// end re-read pixel 0 (no out-of-bounds reads); neither is stored.
extern "C" __global__ void conv2d_fast(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
    float* __restrict__ y, long B, long Ci, long Co, long H, long W, long K) {
    const long Ho = H - K + 1, Wo = W - K + 1, P = Ho * Wo;
    const long co0 = (long)blockIdx.y * CO_TILE, b = blockIdx.z;
    const long wstride = Ci * K * K;  // weights per output channel
    const long last = Co - 1 - co0;
    const long pix0 = (long)blockIdx.x * blockDim.x * PIX + threadIdx.x;
    long xoff[PIX];
#pragma unroll
    for (int q = 0; q < PIX; ++q) {
        const long pix = pix0 + (long)q * blockDim.x;
        const long p = pix < P ? pix : 0;
        xoff[q] = (p / Wo) * W + p % Wo;
    }
    float acc[CO_TILE][PIX];
#pragma unroll
    for (int u = 0; u < CO_TILE; ++u)
#pragma unroll
        for (int q = 0; q < PIX; ++q) acc[u][q] = 0.f;
    for (long ci = 0; ci < Ci; ++ci) {
        const float* xc = x + (b * Ci + ci) * H * W;
        const float* wc = w + co0 * wstride + ci * K * K;
        for (long i = 0; i < K; ++i)
            for (long j = 0; j < K; ++j) {
                float xv[PIX];
#pragma unroll
                for (int q = 0; q < PIX; ++q) xv[q] = __ldg(xc + xoff[q] + i * W + j);
#pragma unroll
                for (int u = 0; u < CO_TILE; ++u) {
                    const float wv = __ldg(wc + (u < last ? u : last) * wstride + i * K + j);
#pragma unroll
                    for (int q = 0; q < PIX; ++q) acc[u][q] = fmaf(wv, xv[q], acc[u][q]);
                }
            }
    }
#pragma unroll
    for (int u = 0; u < CO_TILE; ++u) {
        const long co = co0 + u;
        if (co >= Co) continue;
#pragma unroll
        for (int q = 0; q < PIX; ++q) {
            const long pix = pix0 + (long)q * blockDim.x;
            if (pix < P) {
                const float v = acc[u][q] + bias[co];
                y[(b * Co + co) * P + pix] = RELU ? fmaxf(v, 0.f) : v;
            }
        }
    }
}
"""


def _conv2d_solution(fast: bool, relu: bool):
    def build(dtype: str) -> Solution:
        head = (
            "        x = x.contiguous()\n"
            "        w = self.conv.weight.contiguous()\n"
            "        batch, ci, h, wd = x.shape\n"
            "        co, _, k, _ = w.shape\n"
            "        ho, wo = h - k + 1, wd - k + 1\n"
            "        y = torch.empty((batch, co, ho, wo), device=x.device, dtype=x.dtype)\n"
        )
        args = "args=(x, w, self.conv.bias, y, batch, ci, co, h, wd, k))\n"
        if fast:
            launch = ("        kernels.conv2d_fast(grid=((ho * wo + 1023) // 1024, (co + 7) // 8, "
                      "batch), block=(256,), " + args)
        else:
            launch = ("        n = y.numel()\n"
                      "        kernels.conv2d_naive(grid=((n + 255) // 256,), block=(256,), "
                      + args)
        cuda = fill(_CONV2D_FAST if fast else _CONV2D_NAIVE, RELU=int(relu))
        return Solution(cuda=cuda, forward=head + launch + "        return y\n")

    return build


def _conv2d_out(s: Shape) -> tuple[int, int, int, int]:
    k = int(s["KS"])
    return int(s["B"]), int(s["CO"]), int(s["H"]) - k + 1, int(s["W"]) - k + 1


def _conv2d_family(name: str, tier: int, description: str, relu: bool) -> Family:
    return Family(
        name=name,
        tier=tier,
        description=description,
        shapes=(shape(B=8, CI=32, CO=64, H=128, W=128, KS=3),
                shape(B=16, CI=16, CO=32, H=128, W=128, KS=5),
                shape(B=4, CI=64, CO=30, H=100, W=100, KS=3)),
        small=shape(B=2, CI=3, CO=10, H=36, W=37, KS=3),
        inputs=("torch.randn(B, CI, H, W)",),
        init_args=(("in_channels", "CI"), ("out_channels", "CO"), ("kernel_size", "KS")),
        init_body="        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)\n",
        forward=f"        return {'torch.relu(self.conv(x))' if relu else 'self.conv(x)'}\n",
        output_shape=_conv2d_out,
        bytes_moved=lambda s: 4 * (int(s["B"]) * int(s["CI"]) * int(s["H"]) * int(s["W"])
                                   + _numel(_conv2d_out(s))
                                   + int(s["CO"]) * int(s["CI"]) * int(s["KS"]) ** 2),
        flops=lambda s: 2 * _numel(_conv2d_out(s)) * int(s["CI"]) * int(s["KS"]) ** 2,
        naive=_conv2d_solution(False, relu),
        fast=_conv2d_solution(True, relu),
        atol=1e-3,
        rtol=1e-3,
        fast_min_speedup=1.1,
        tags=("conv", "fused") if relu else ("conv",),
    )


def tier2_conv_families() -> list[Family]:
    conv1d = Family(
        name="conv1d",
        tier=2,
        description="1D convolution (nn.Conv1d, stride 1, no padding)",
        shapes=(shape(B=16, CI=64, CO=128, L=4096, KS=5), shape(B=32, CI=32, CO=64, L=8192, KS=3),
                shape(B=8, CI=96, CO=80, L=3000, KS=7)),
        small=shape(B=2, CI=3, CO=11, L=1300, KS=3),
        inputs=("torch.randn(B, CI, L)",),
        init_args=(("in_channels", "CI"), ("out_channels", "CO"), ("kernel_size", "KS")),
        init_body="        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)\n",
        forward="        return self.conv(x)\n",
        output_shape=lambda s: (int(s["B"]), int(s["CO"]), int(s["L"]) - int(s["KS"]) + 1),
        bytes_moved=lambda s: 4 * (int(s["B"]) * (int(s["CI"]) + int(s["CO"])) * int(s["L"])),
        flops=lambda s: 2 * int(s["B"]) * int(s["CO"]) * (int(s["L"]) - int(s["KS"]) + 1)
        * int(s["CI"]) * int(s["KS"]),
        naive=_conv1d_solution(False),
        fast=_conv1d_solution(True),
        atol=1e-3,
        rtol=1e-3,
        fast_min_speedup=1.1,
        tags=("conv",),
    )
    return [
        _pool_family("maxpool2d", "2D max pooling (no padding)", "F.max_pool2d", True),
        _pool_family("avgpool2d", "2D average pooling (no padding)", "F.avg_pool2d", False),
        conv1d,
        _conv2d_family("conv2d", 2, "2D convolution (nn.Conv2d, stride 1, no padding)", False),
    ]


def tier3_conv_families() -> list[Family]:
    return [_conv2d_family("conv2d_relu", 3, "2D convolution then ReLU", True)]
