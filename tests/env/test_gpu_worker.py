"""GPU tests of the worker's timing primitives (L2 flush, events, peak bandwidth)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_peak_bandwidth_is_plausible():
    from multiminddev.env.benchmark import measure_peak_bandwidth

    gbps = measure_peak_bandwidth(0)
    assert 100 < gbps < 10_000  # any datacenter/consumer GPU of the last decade


def test_time_cuda_times_the_planned_number_of_runs():
    import torch

    from multiminddev.env.benchmark import TimingPlan, l2_flush_buffer, time_cuda

    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    plan = TimingPlan(min_runs=10, max_runs=500, budget_s=2.0)
    stats = time_cuda(lambda: y.copy_(x), plan, l2_flush_buffer(0))
    assert 10 <= stats.runs <= 500
    assert stats.min_ms <= stats.median_ms <= stats.max_ms


def _copy_calls(n_bytes: int = 64 << 20):
    import torch

    from multiminddev.env.benchmark import TimedCalls

    x = torch.randn(n_bytes // 4, device="cuda")

    def prepare(_i):
        return [torch.empty_like(x).copy_(x)]

    return TimedCalls(run=lambda args: args[0].mul_(2.0), prepare=prepare)


def _host_hold():
    from multiminddev.env import worker
    from multiminddev.env.config import EvalConfig

    return worker._warm_kernel_launch(worker._warm_toolchain(EvalConfig()))


def test_the_worker_times_behind_the_host_released_hold():
    from multiminddev.env.benchmark import HostReleasedHold

    assert isinstance(_host_hold(), HostReleasedHold)


def test_the_host_released_hold_measures_what_the_spin_measures_in_less_time():
    import time

    import torch

    from multiminddev.env.benchmark import SpinHold, TimingPlan, l2_flush_buffer, time_calls

    calls, flush, plan = _copy_calls(), l2_flush_buffer(0), TimingPlan(budget_s=0.25)
    figures = {}
    for name, hold in (("spin", SpinHold()), ("host", _host_hold())) * 2:
        torch.cuda.synchronize()
        started = time.perf_counter()
        stats = time_calls(calls, plan, flush, hold=hold)
        figures.setdefault(name, []).append((time.perf_counter() - started, stats.median_ms))
    spin_ms = min(m for _, m in figures["spin"])
    host_ms = min(m for _, m in figures["host"])
    assert abs(host_ms / spin_ms - 1) < 0.05, figures
    assert min(w for w, _ in figures["host"]) < min(w for w, _ in figures["spin"]), figures


def test_a_call_that_synchronises_mid_batch_does_not_wait_for_the_hold_forever():
    import torch

    from multiminddev.env.benchmark import TimedCalls, TimingPlan, l2_flush_buffer, time_calls

    inner = _copy_calls(1 << 20)

    def run(args):
        out = inner.run(args)
        torch.cuda.synchronize()  # waits for everything enqueued, the batch's own hold too
        return out

    calls = TimedCalls(run=run, prepare=inner.prepare)
    stats = time_calls(calls, TimingPlan(min_runs=10, max_runs=20, budget_s=0.01),
                       l2_flush_buffer(0), hold=_host_hold())
    assert stats.runs >= 10 and stats.median_ms > 0


def test_a_call_that_raises_mid_batch_releases_the_hold():
    import torch

    from multiminddev.env.benchmark import TimedCalls, TimingPlan, time_calls

    inner = _copy_calls(1 << 20)
    seen = []

    def run(args):
        seen.append(1)
        if len(seen) > 5:  # past the warm-up, inside the first timed batch
            raise RuntimeError("the candidate failed")
        return inner.run(args)

    hold = _host_hold()
    with pytest.raises(RuntimeError, match="the candidate failed"):
        time_calls(TimedCalls(run=run, prepare=inner.prepare),
                   TimingPlan(min_runs=10, max_runs=20, budget_s=0.01), None, hold=hold)
    # released: the stream drains at once instead of after the hold's full cycles
    hold.hold(10**12)  # ~8 minutes of cycles were it not released
    hold.release()
    torch.cuda.synchronize()
