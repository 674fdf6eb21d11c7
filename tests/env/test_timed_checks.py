"""timed_checks: how many checked calls, where they go, and (on a GPU) that checked and
unchecked calls look alike to a candidate while the checked ones are copied aside."""

from __future__ import annotations

import random

import pytest

from multiminddev.env.timed_checks import CheckedCalls, choose_check_positions, timed_check_count

MIB = 1 << 20


def test_check_count_is_the_wanted_count_for_small_calls():
    assert timed_check_count(8, 1024.0, 4 * MIB) == 8


def test_check_count_shrinks_to_the_memory_budget_but_not_below_two():
    assert timed_check_count(8, 1024.0, 256 * MIB) == 4
    assert timed_check_count(8, 1024.0, 4096 * MIB) == 2


def test_positions_are_distinct_calls_in_range_numbered_in_call_order():
    positions = choose_check_positions(100, 8, random.Random(1))
    assert len(positions) == 8 and all(0 <= call < 100 for call in positions)
    assert [positions[c] for c in sorted(positions)] == list(range(8))


def test_positions_cover_the_whole_run_not_only_its_start():
    rng = random.Random(0)
    late = sum(max(choose_check_positions(300, 8, rng)) >= 150 for _ in range(200))
    assert late > 190  # P(all 8 in the first half) = 2**-8 per draw


def test_fewer_calls_than_checks_checks_every_call():
    assert sorted(choose_check_positions(3, 8, random.Random(0))) == [0, 1, 2]


@pytest.mark.gpu
def test_checked_calls_copy_the_checked_outputs_and_give_fresh_inputs():
    import torch

    check_inputs = [[torch.full((4,), float(k), device="cuda")] for k in range(3)]
    seen = []

    def forward(args):
        seen.append(args[0].clone())
        return [args[0] * 2]

    calls = CheckedCalls(draw_inputs=lambda: [torch.randn(4, device="cuda")],
                         check_inputs=check_inputs, output_specs=[((4,), torch.float32)],
                         forward=forward, rng=random.Random(3))
    calls.plan(10)
    for i in range(10):
        calls.finish(i, calls.run(calls.prepare(i)))
    torch.cuda.synchronize()
    got = calls.checked_outputs()
    assert [float(outs[0][0]) for outs in got] == [0.0, 2.0, 4.0]
    distinct = {tuple(t.tolist()) for t in seen}
    assert len(distinct) == 10  # no two calls saw the same data


@pytest.mark.gpu
def test_a_wrong_shape_on_a_checked_call_is_kept_for_verification():
    import torch

    calls = CheckedCalls(draw_inputs=lambda: [torch.randn(4, device="cuda")],
                         check_inputs=[[torch.ones(4, device="cuda")]],
                         output_specs=[((4,), torch.float32)],
                         forward=lambda args: [args[0][:2]], rng=random.Random(0))
    calls.plan(1)
    calls.finish(0, calls.run(calls.prepare(0)))
    assert calls.checked_outputs()[0][0].shape == (2,)
