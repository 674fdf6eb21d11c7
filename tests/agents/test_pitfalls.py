from multiminddev.agents.pitfalls import (
    PitfallKind,
    Strategy,
    candidate_strategies,
    check_bank_conflicts,
    check_bounds,
    check_divergent_branches,
    check_syncthreads,
    check_uncoalesced,
    detect_strategies,
    extract_cuda_sources,
    find_pitfalls,
    strip_comments,
)

GOOD = r'''
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
'''

REDUCE = r'''
extern "C" __global__ void sum(const float* x, float* out, int n) {
    __shared__ float s[256];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[tid] = i < n ? x[i] : 0.f;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) s[tid] += s[tid + k];
        __syncthreads();
    }
    if (tid == 0) atomicAdd(out, s[0]);
}
'''


def _kinds(hints):
    return {h.kind for h in hints}


def test_clean_kernels_have_no_hints():
    assert find_pitfalls(GOOD) == []
    assert find_pitfalls(REDUCE) == []


def test_strided_thread_index_is_uncoalesced():
    src = GOOD.replace("y[i] = fmaxf(x[i], 0.0f)", "y[i] = x[i * stride]").replace("long n)", "long n, int stride)")
    hints = check_uncoalesced(src)
    assert _kinds(hints) == {PitfallKind.UNCOALESCED} and hints[0].line == 4


def test_row_major_index_from_a_divided_thread_index_is_coalesced():
    src = r'''
extern "C" __global__ void copy(const float* x, float* y, int R, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int r = idx / C; int c = idx % C;
    if (idx < R * C) y[r * C + c] = x[r * C + c];
}'''
    assert check_uncoalesced(src) == [] and check_bounds(src) == []


def test_shared_stride_of_32_is_a_bank_conflict():
    src = REDUCE.replace("s[tid] = i < n", "s[tid * 32 % 256] = i < n")
    hints = check_bank_conflicts(src)
    assert hints and "32-way" in hints[0].message


def test_column_walk_of_a_32_wide_tile_is_a_bank_conflict():
    src = r'''
extern "C" __global__ void t(const float* x, float* y) {
    __shared__ float tile[32][32];
    int tx = threadIdx.x;
    tile[tx][0] = x[tx];
    __syncthreads();
    y[tx] = tile[0][tx];
}'''
    hints = check_bank_conflicts(src)
    assert len(hints) == 1 and "[32 + 1]" in hints[0].message
    assert check_bank_conflicts(src.replace("[32][32]", "[32][33]")) == []


def test_modulo_branch_on_thread_index_is_divergent():
    src = REDUCE.replace("if (tid < k)", "if (tid % (2 * k) == 0)")
    assert _kinds(check_divergent_branches(src)) == {PitfallKind.DIVERGENT_BRANCH}


def test_lane_zero_of_a_warp_is_not_reported_as_divergent():
    src = REDUCE.replace("if (tid == 0)", "if (threadIdx.x % 32 == 0)")
    assert check_divergent_branches(src) == []


def test_missing_bounds_check_is_reported_per_kernel():
    unchecked = GOOD.replace("if (i < n) ", "").replace("relu", "relu2")
    assert _kinds(check_bounds(unchecked)) == {PitfallKind.MISSING_BOUNDS_CHECK}
    # a checked kernel in the same source must not excuse the unchecked one
    assert _kinds(find_pitfalls(GOOD + unchecked)) == {PitfallKind.MISSING_BOUNDS_CHECK}


def test_grid_stride_loop_counts_as_bounds_check():
    src = r'''
extern "C" __global__ void g(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = x[i];
}'''
    assert check_bounds(src) == []
    assert Strategy.GRID_STRIDE in detect_strategies(src)


def test_shared_memory_without_syncthreads():
    src = REDUCE.replace("__syncthreads();", "")
    hints = check_syncthreads(src)
    assert _kinds(hints) == {PitfallKind.MISSING_SYNCTHREADS} and hints[0].line == 3


def test_comments_do_not_count():
    src = REDUCE.replace("__syncthreads();", "// __syncthreads();")
    assert check_syncthreads(src)
    assert strip_comments("a /* x\ny */ b").count("\n") == 1


def test_strategies_are_tagged():
    src = r'''
__global__ void k(const float4* x, float* out) {
    __shared__ float tile[32][33];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    atomicAdd(out, __expf(v));
}'''
    tags = set(detect_strategies(src))
    assert {Strategy.SHARED_MEMORY, Strategy.TILING, Strategy.VECTORIZED, Strategy.WARP_SHUFFLE,
            Strategy.UNROLLING, Strategy.ATOMICS, Strategy.FAST_MATH} <= tags
    assert Strategy.TENSOR_CORES not in tags


def test_cuda_is_extracted_from_a_candidate_module():
    module = f'import torch\nfrom multiminddev.cuda import compile_kernels\nk = compile_kernels(r"""{REDUCE}""")\n'
    assert extract_cuda_sources(module) == [REDUCE]
    assert Strategy.ATOMICS in candidate_strategies(module)
    assert extract_cuda_sources(None) == [] and extract_cuda_sources("def (") == []
