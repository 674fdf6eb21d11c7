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
