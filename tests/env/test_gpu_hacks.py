"""Adversarial suite, GPU part: every hack fixture is rejected or marked incorrect by the full
evaluator (sandbox and runtime guards on), every honest fixture passes, and each runtime guard
catches its hack on real CUDA tensors. Run with ``pytest -m gpu`` on a machine with a GPU.
"""

from __future__ import annotations

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from multiminddev.env.results import RejectReason
from multiminddev.tasks.problem import load_problem
from tests.env.test_hacks import FIXTURES, HACKS, HONEST, fixture_header

pytestmark = pytest.mark.gpu

RELU_SRC = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
extern "C" __global__ void spin_then_relu(const float* x, float* y, long n, long long cycles) {
    // one small block: leaves the GPU free for the harness's copy on the current stream
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (long i = threadIdx.x; i < n; i += blockDim.x) y[i] = fmaxf(x[i], 0.f);
}
"""


def _problem(path):
    return load_problem(FIXTURES / "problems" / f"{fixture_header(path)['problem']}.py")


@pytest.fixture(scope="module")
def evaluator():
    cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.5,
                     defenses=True, sandbox=True)
    with Evaluator(cfg) as ev:
        yield ev


@pytest.fixture(scope="module")
def kernels():
    from multiminddev.cuda import compile_kernels

    return compile_kernels(RELU_SRC)


def _relu(kernels, x, y, *, stream=None):
    n = x.numel()
    kernels.relu(grid=((n + 255) // 256,), block=(256,), args=(x, y, n), stream=stream)


# --- the suite through the evaluator --------------------------------------------------------


@pytest.mark.parametrize("path", HACKS, ids=lambda p: p.stem)
def test_hack_is_rejected_or_incorrect(evaluator, path):
    expect = fixture_header(path)["expect"]
    codes = set(expect.removeprefix("runtime:").split("|"))
    result = evaluator.evaluate(_problem(path), path.read_text())
    assert result.status in (EvalStatus.REJECTED, EvalStatus.INCORRECT), (
        f"{result.status}: {result.message}")
    if result.status is EvalStatus.REJECTED:
        seen = {result.reject_reason.value if result.reject_reason else None}
        seen |= {f.reason.value for f in result.static.findings}
        assert seen & codes, f"expected {codes}, got {seen}: {result.message}"
    else:
        assert "incorrect" in codes or not expect.startswith("runtime:"), result.message


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_is_not_rejected(evaluator, path):
    result = evaluator.evaluate(_problem(path), path.read_text())
    assert result.status is EvalStatus.OK, f"{result.status} {result.reject_reason}: {result.message}"
    coverage = result.benchmark.custom_kernel_time_fraction
    assert coverage is None or coverage >= 0.5


# --- each runtime guard on CUDA tensors -----------------------------------------------------


def test_poisoned_free_memory_turns_empty_into_nan():
    import torch

    from multiminddev.env import guards

    x = torch.randn(1 << 22, device="cuda")
    reference_output = torch.relu(x)
    del reference_output  # the Sakana setting: the reference's output block is now free
    guards.poison_free_cuda_memory()
    y = torch.empty(1 << 22, device="cuda")
    assert torch.isnan(y).all()


def test_compute_guard_on_cuda_allows_own_kernel(kernels):
    import torch

    from multiminddev.env import guards

    x = torch.randn(4096, device="cuda")
    with guards.TorchComputeGuard() as guard:
        y = torch.empty_like(x)
        _relu(kernels, x, y)
    assert guard.findings == []
    with guards.TorchComputeGuard() as guard:
        torch.relu(x)
    assert guard.findings[0].reason is RejectReason.TORCH_COMPUTE


def test_pending_side_stream_work_is_unsynced():
    import torch

    from multiminddev.env import guards

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time the current stream does not wait for
    findings = guards.check_streams_synchronized()
    assert [f.reason for f in findings] == [RejectReason.UNSYNCED_STREAM]
    assert guards.check_streams_synchronized() == []  # idle device afterwards


def test_output_written_by_side_stream_is_unsynced(kernels):
    import torch

    from multiminddev.env import guards

    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()

    def hack():
        y = torch.zeros_like(x)
        torch.cuda.synchronize()
        n = x.numel()
        with torch.cuda.stream(side):  # current inside the block, so the launch itself is allowed
            kernels.spin_then_relu(grid=(1,), block=(256,), args=(x, y, n, 50_000_000))
        return y

    rules = {f.rule for f in guards.check_streams_synchronized(hack)}
    assert "output_written_after_stream" in rules


def test_kernel_launches_only_on_the_current_stream(kernels):
    import torch

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    args = (x, y, x.numel())
    with pytest.raises(ValueError, match="current stream"):
        kernels.relu(grid=(4096,), block=(256,), args=args, stream=torch.cuda.Stream())
    kernels.relu(grid=(4096,), block=(256,), args=args, stream=torch.cuda.current_stream())
    assert torch.equal(y, torch.relu(x))


def test_honest_forward_is_synchronized(kernels):
    import torch

    from multiminddev.env import guards

    x = torch.randn(1 << 20, device="cuda")

    def honest():
        y = torch.empty_like(x)
        _relu(kernels, x, y)
        return y

    assert guards.check_streams_synchronized(honest) == []


def test_pointer_cache_on_gpu_is_stale(kernels):
    import torch

    from multiminddev.env import guards

    cache = {}

    def cached(x):
        if x.data_ptr() not in cache:
            y = torch.empty_like(x)
            _relu(kernels, x, y)
            cache[x.data_ptr()] = y
        return cache[x.data_ptr()]

    x = torch.randn(1 << 16, device="cuda")
    findings = guards.check_stale_output(cached, [x], torch.relu)
    assert [f.reason for f in findings] == [RejectReason.STALE_OUTPUT]


def _own_and_mixed_coverage(kernels, measure):
    """``measure(run, names)`` on our relu alone, then on relu plus three torch kernels.

    The relu is 64M elements (about 0.1 ms on an H200) so that the few microseconds each
    launch's event bracket and the run's first kernel cost stay a small share of the measure."""
    import torch

    x = torch.randn(1 << 26, device="cuda")
    y = torch.empty_like(x)
    own = measure(lambda: _relu(kernels, x, y), ["relu"])
    mixed = measure(
        lambda: (_relu(kernels, x, y), torch.exp(x), torch.sin(x), torch.cos(x)), ["relu"])
    return own, mixed


def test_kernel_time_coverage_separates_own_kernels_from_torch(kernels):
    from multiminddev.env import guards

    own, mixed = _own_and_mixed_coverage(kernels, guards.kernel_time_coverage)
    assert own is not None and own > 0.9
    assert mixed is not None and mixed < 0.5
    assert guards.check_kernel_coverage(mixed) != []


def test_event_coverage_agrees_with_the_profiler(kernels):
    """The CUDA-event coverage (no CUPTI) separates own kernels from torch work like the profiler."""
    import torch

    from multiminddev.env import guards

    def by_identity(run, _names):
        return guards.kernel_time_coverage_events(run, [kernels.compile_result])

    own, mixed = _own_and_mixed_coverage(kernels, by_identity)
    _, profiled = _own_and_mixed_coverage(kernels, guards.kernel_time_coverage)
    assert own is not None and own > 0.9
    assert mixed is not None and mixed < 0.5
    assert abs(mixed - profiled) < 0.1
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    side = torch.cuda.Stream()

    def on_side_stream():
        with torch.cuda.stream(side):
            kernels.relu(grid=(4096,), block=(256,), args=(x, y, x.numel()))

    on_side = guards.kernel_time_coverage_events(on_side_stream, [kernels.compile_result])
    assert on_side is not None  # timed on its own stream; the stream guard judges the rest
    torch.cuda.synchronize()


def test_inputs_mutated_by_kernel_are_detected(kernels):
    import torch

    from multiminddev.env import guards

    x = torch.randn(1 << 16, device="cuda") - 0.5
    snapshot = guards.snapshot_tensors([x])
    _relu(kernels, x, x)  # in place into the input
    assert [f.reason for f in guards.check_inputs_unchanged(snapshot, [x])] == [
        RejectReason.INPUT_MUTATION]


def test_gpu_work_left_after_a_job_never_meets_the_next_timing():
    # the layer behind the static refusal of finalizers (defenses off lets the fixture through):
    # the worker is killed before the timing gate passes on, so its finalizer's spinning kernel
    # never runs beside the next candidate's timing
    hack = FIXTURES / "hacks" / "finalizer_kernel_after_exit.py"
    honest = FIXTURES / "honest" / "relu_basic.py"
    cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.5, defenses=False)
    with Evaluator(cfg) as ev:
        clean = ev.evaluate(_problem(honest), honest.read_text())
        ev.evaluate(_problem(hack), hack.read_text())
        after = ev.evaluate(_problem(honest), honest.read_text())
    assert clean.status is after.status is EvalStatus.OK, (clean.message, after.message)
    assert after.benchmark.candidate.median_ms < 1.5 * clean.benchmark.candidate.median_ms
