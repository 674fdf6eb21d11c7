"""Runtime guards on CPU tensors (the GPU-only parts are in test_gpu_hacks.py)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from multiminddev.env import guards
from multiminddev.env.results import RejectReason


def _reasons(findings):
    return [f.reason for f in findings]


# --- TorchComputeGuard ----------------------------------------------------------------------


def test_compute_guard_does_not_import_dynamo():
    # The dispatch mode's first use used to import torch._dynamo (seconds per fresh worker).
    # A fresh interpreter: this test process may have imported it already.
    code = ("import sys, torch\n"
            "from multiminddev.env import guards\n"
            "guards.warm_up('cpu')\n"
            "with guards.TorchComputeGuard() as g:\n"
            "    x = torch.ones(2, 2)\n"
            "    torch.empty(4).view(2, 2)\n"
            "    x @ x\n"
            "assert g.ops == {'mm': 1}, g.ops\n"
            "assert 'torch._dynamo' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_nested_compute_guards_record_separately():
    x = torch.ones(2, 2)
    with guards.TorchComputeGuard() as outer:
        x @ x
        with guards.TorchComputeGuard() as inner:
            x + x
    assert "mm" in outer.ops and inner.ops == {"add": 1}


def test_compute_guard_catches_matmul():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with guards.TorchComputeGuard() as guard:
        torch.mm(a, b)
    assert _reasons(guard.findings) == [RejectReason.TORCH_COMPUTE]
    assert "aten::mm" in guard.findings[0].message


def test_compute_guard_allows_allocation_and_views():
    x = torch.randn(4, 6)
    with guards.TorchComputeGuard() as guard:
        y = torch.empty_like(x)
        x.view(6, 4).permute(1, 0).transpose(0, 1)
        x.reshape(24).unsqueeze(0).squeeze(0)
        x.contiguous()
        torch.zeros(3).zero_()
        y.new_empty((2, 2))
        x[1:3, 2]
        x.shape, x.stride(), x.numel()
    assert guard.findings == []


def test_compute_guard_counts_clone_as_compute():
    # A copy is torch doing the data movement; for memory-bound problems it is the work.
    x = torch.randn(4, 4)
    with guards.TorchComputeGuard() as guard:
        x.t().contiguous()
    assert "aten::clone" in guard.findings[0].message


def test_compute_guard_sees_tensor_operators():
    x = torch.randn(5)
    with guards.TorchComputeGuard() as guard:
        _ = (x + 1) * x
    assert {"add", "mul"} <= set(guard.ops)


def test_compute_guard_custom_allow_list():
    x = torch.randn(5)
    with guards.TorchComputeGuard(allowed=frozenset({"relu"})) as guard:
        torch.relu(x)
    assert guard.findings == []


# --- inputs, outputs, threads ---------------------------------------------------------------


def test_unchanged_inputs_pass_even_with_nan():
    x = torch.tensor([1.0, float("nan"), 3.0])
    snap = guards.snapshot_tensors([x, 7])
    assert guards.check_inputs_unchanged(snap, [x, 7]) == []


def test_in_place_change_is_input_mutation():
    x = torch.randn(16)
    snap = guards.snapshot_tensors([x])
    x.relu_()
    findings = guards.check_inputs_unchanged(snap, [x])
    assert _reasons(findings) == [RejectReason.INPUT_MUTATION]
    assert "values" in findings[0].message


def test_resize_is_input_mutation():
    x = torch.randn(16)
    snap = guards.snapshot_tensors([x])
    x.resize_(4, 4)
    assert "metadata" in guards.check_inputs_unchanged(snap, [x])[0].message


def test_fresh_output_does_not_alias():
    x = torch.randn(4, 4)
    assert guards.check_output_aliasing([x], [torch.empty_like(x)]) == []


@pytest.mark.parametrize("make_output", [lambda x: x, lambda x: x.view(-1), lambda x: x[2:]])
def test_input_views_alias(make_output):
    x = torch.randn(4, 4)
    assert _reasons(guards.check_output_aliasing([x], [make_output(x)])) == [
        RejectReason.OUTPUT_ALIASING]


def test_tensor_subclass_output_is_rejected():
    class Lazy(torch.Tensor):
        pass

    x = torch.randn(3)
    assert guards.check_output_types([x]) == []
    assert _reasons(guards.check_output_types([x.as_subclass(Lazy)])) == [RejectReason.MONKEY_PATCH]


def test_thread_left_running_is_a_leak():
    before = guards.thread_snapshot()
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="late-writer")
    worker.start()
    try:
        findings = guards.check_threads(before)
        assert _reasons(findings) == [RejectReason.THREAD_LEAK]
        assert "late-writer" in findings[0].message
    finally:
        stop.set()
        worker.join()
    assert guards.check_threads(before) == []


# --- stale outputs --------------------------------------------------------------------------


def _relu(x):
    return torch.relu(x)


def test_fresh_computation_is_not_stale():
    x = torch.randn(64)
    assert guards.check_stale_output(_relu, [x], _relu) == []


def test_pointer_cache_is_stale():
    cache = {}

    def cached_relu(x):  # the hack: results keyed by the input's address
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = torch.relu(x)
        return cache[x.data_ptr()]

    x = torch.randn(64)
    ptr = x.data_ptr()
    findings = guards.check_stale_output(cached_relu, [x], _relu)
    assert _reasons(findings) == [RejectReason.STALE_OUTPUT]
    assert "identical" in findings[0].message
    assert x.data_ptr() == ptr  # new data went into the same buffer


def test_stale_check_uses_given_new_inputs():
    x, new = torch.randn(32), torch.randn(32)
    guards.check_stale_output(_relu, [x], _relu, new_inputs=[new])
    assert torch.equal(x, new)


def test_constant_inputs_give_no_verdict():
    x = torch.ones(8)
    assert guards.check_stale_output(lambda t: torch.zeros(8), [x], _relu) == []


# --- roofline, coverage ---------------------------------------------------------------------


def test_impossible_speed_below_roofline_floor():
    # 128 MiB at 3000 GB/s takes 0.0447 ms; 0.01 ms is impossible, 0.05 ms is plausible.
    bytes_moved = 134_217_728
    assert _reasons(guards.check_impossible_speed(0.01, bytes_moved, 3000.0)) == [
        RejectReason.IMPOSSIBLE_SPEED]
    assert guards.check_impossible_speed(0.05, bytes_moved, 3000.0) == []


def test_slack_allows_measurement_noise_near_peak():
    floor_ms = 1e9 / (1000.0 * 1e9) * 1e3  # 1 GB at 1000 GB/s = 1 ms
    assert guards.check_impossible_speed(0.95 * floor_ms, 10**9, 1000.0, slack=0.9) == []
    assert guards.check_impossible_speed(0.85 * floor_ms, 10**9, 1000.0, slack=0.9) != []


def test_unknown_roofline_gives_no_verdict():
    assert guards.check_impossible_speed(1e-6, None, 3000.0) == []
    assert guards.check_impossible_speed(1e-6, 1000, None) == []


def test_bad_slack_is_refused():
    with pytest.raises(ValueError, match="slack"):
        guards.check_impossible_speed(1.0, 1000, 100.0, slack=1.5)


def test_coverage_is_own_share_of_kernel_time():
    times = [("relu", 30.0), ("void at::native::vectorized_elementwise_kernel<4>", 10.0),
             ("_Z9my_kernelPfS_l", 60.0)]
    assert guards.coverage_from_kernel_times(times, ["relu"]) == pytest.approx(0.3)
    assert guards.coverage_from_kernel_times(times, ["relu", "my_kernel"]) == pytest.approx(0.9)


def test_a_vendor_kernel_containing_the_candidates_kernel_name_is_not_its_own():
    times = [("relu", 10.0), ("ampere_sgemm_relu_128x64_nn", 60.0),
             ("void at::native::relu_kernel<float>(float*, int)", 20.0),
             ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_relu_64x64>(Params)", 10.0)]
    assert guards.coverage_from_kernel_times(times, ["relu"]) == pytest.approx(0.1)


def test_a_vendor_kernel_inside_the_candidates_kernel_name_is_not_its_own():
    times = [("my_relu_kernel(float const*, float*, int)", 40.0), ("relu", 60.0)]
    assert guards.coverage_from_kernel_times(times, ["my_relu_kernel"]) == pytest.approx(0.4)


@pytest.mark.parametrize(("profiled", "name"), [
    ("relu", "relu"),
    ("relu_kernel(float const*, float*, int)", "relu_kernel"),
    ("void add_kernel<float, 4>(float const*, float const*, float*, int)", "add_kernel"),
    (("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::f, "
      "at::detail::Array<char*, 2> >(int, f, at::detail::Array<char*, 2>)"),
     "at::native::vectorized_elementwise_kernel"),
    ("(anonymous namespace)::relu(float*)", "(anonymous namespace)::relu"),
    ("void (anonymous namespace)::relu<float>(float*)", "(anonymous namespace)::relu"),
    ("_Z11relu_kernelPKfPfi", "relu_kernel"),
    ("_ZN2ns6kernelEPf", "ns::kernel"),
    ("_ZN12_GLOBAL__N_14reluEPf", "(anonymous namespace)::relu"),
    ("_Z4reluIfEvPT_", "relu"),
    ("_ZL4reluPf", "relu"),
    ("ampere_sgemm_relu_128x64_nn", "ampere_sgemm_relu_128x64_nn"),
])
def test_kernel_function_name_reads_profiler_names(profiled, name):
    assert guards.kernel_function_name(profiled) == name


def test_the_candidates_anonymous_namespace_kernels_are_its_own_but_not_other_namespaces():
    times = [("(anonymous namespace)::relu(float*)", 30.0), ("ns::relu(float*)", 70.0)]
    assert guards.coverage_from_kernel_times(times, ["relu"]) == pytest.approx(0.3)


def test_coverage_unknown_without_names_or_time():
    assert guards.coverage_from_kernel_times([("relu", 1.0)], []) is None
    assert guards.coverage_from_kernel_times([], ["relu"]) is None


def test_event_coverage_is_own_launch_time_over_the_run_and_capped_at_one():
    assert guards.coverage_from_event_times([30.0, 15.0], 90.0) == pytest.approx(0.5)
    assert guards.coverage_from_event_times([], 90.0) == 0.0
    assert guards.coverage_from_event_times([120.0], 100.0) == 1.0  # side-stream overlap
    assert guards.coverage_from_event_times([1.0], 0.0) is None
    assert guards.coverage_from_event_times([1.0], float("nan")) is None


def test_launch_timer_puts_the_kernel_call_back_even_after_an_error():
    from multiminddev.cuda.kernels import Kernel

    original = Kernel.__call__
    with pytest.raises(RuntimeError, match="forward failed"), guards._OwnLaunchTimer([]):
        assert Kernel.__call__ is not original
        raise RuntimeError("forward failed")
    assert Kernel.__call__ is original


def test_low_coverage_threshold():
    assert guards.check_kernel_coverage(0.49) != [] and guards.check_kernel_coverage(0.5) == []
    assert guards.check_kernel_coverage(None) == []
    assert guards.check_kernel_coverage(0.2)[0].reason is RejectReason.LOW_KERNEL_COVERAGE


def test_gpu_only_guards_are_no_ops_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU suite")
    guards.poison_free_cuda_memory()
    assert guards.check_streams_synchronized() == []
    assert guards.kernel_time_coverage(lambda: None, ["relu"]) is None
    assert guards.kernel_time_coverage_events(lambda: None, [object()]) is None


def test_launch_timer_owns_kernels_of_the_given_compiles_only():
    from multiminddev.cuda import compile_kernels

    src = 'extern "C" __global__ void relu(float* y) { y[0] = 0.f; }'
    mine, other = compile_kernels(src, arch="sm_90"), compile_kernels(src, arch="sm_90")
    timer = guards._OwnLaunchTimer([mine.compile_result])
    assert timer.owns(mine.relu)
    assert not timer.owns(other.relu)  # same source, same name: another module all the same
