"""compile_kernels: signatures, typed argument conversion, clear errors."""

import numpy as np
import pytest

from multiminddev.cuda import KernelArgumentError, KernelCompileError, NoGPUError, compile_kernels
from multiminddev.cuda.signature import parse_kernel_signatures
from tests.conftest import gpu_available

SRC = r"""
// a comment with extern "C" __global__ void fake(int x) in it
extern "C" __global__ void axpy(const float* __restrict__ x, float* y, float a, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" {
__global__ void __launch_bounds__(256) fill(int* out, unsigned int n, int v) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
}
"""


def test_signatures_parsed_from_source():
    sigs = parse_kernel_signatures(SRC)
    assert set(sigs) == {"axpy", "fill"}
    assert [(p.name, p.c_type, p.is_pointer) for p in sigs["axpy"].params] == [
        ("x", "float", True),
        ("y", "float", True),
        ("a", "float", False),
        ("n", "long", False),
    ]
    assert sigs["fill"].params[1].numpy_dtype == "uint32"


def test_scalar_arguments_converted_to_signature_types():
    kernels = compile_kernels(SRC, arch="sm_90")
    converted = kernels.fill.convert_args([None, 10, -3])
    assert converted[1].dtype == np.uint32 and converted[2].dtype == np.int32


def test_wrong_argument_count_is_clear():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(KernelArgumentError, match="takes 4 arguments, got 2"):
        kernels.axpy.convert_args([None, None])


def test_float_for_integer_is_refused():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(KernelArgumentError, match="got float"):
        kernels.fill.convert_args([None, 1.5, 0])


def test_cpu_tensor_for_pointer_is_refused():
    torch = pytest.importorskip("torch")
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(KernelArgumentError, match="tensor is on cpu"):
        kernels.axpy.convert_args([torch.zeros(4), torch.zeros(4), 1.0, 4])


def test_unknown_kernel_name_lists_the_real_ones():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(AttributeError, match="axpy"):
        kernels.saxpy


def test_compile_error_raises_with_line_numbers():
    with pytest.raises(KernelCompileError, match="line 5"):
        compile_kernels(SRC.replace("a * x[i]", "a * z[i]"), arch="sm_90")


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU path")
def test_launch_without_gpu_raises_no_gpu_error():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(NoGPUError, match="no usable GPU"):
        kernels.fill(grid=1, block=32, args=(None, 0, 0))


def test_block_over_1024_threads_is_refused_before_launch():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(KernelArgumentError, match="limit is 1024"):
        kernels.fill(grid=1, block=(64, 32), args=(None, 0, 0))


def test_bad_grid_is_refused():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(KernelArgumentError, match="positive integers"):
        kernels.fill(grid=(0,), block=32, args=(None, 0, 0))


def test_a_launcher_of_an_unknown_kernel_names_the_ones_there_are():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(AttributeError, match="axpy"):
        kernels.launcher("axpby")


@pytest.mark.skipif(gpu_available(), reason="checks the no-GPU path")
def test_a_launcher_without_a_gpu_says_so():
    kernels = compile_kernels(SRC, arch="sm_90")
    with pytest.raises(NoGPUError):
        kernels.launcher("axpy")
