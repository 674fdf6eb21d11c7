"""timed_checks: how many checked calls, where they go, and (on a GPU) that checked and
unchecked calls look alike to a candidate while the checked ones are copied aside."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from multiminddev.env.config import EvalConfig
from multiminddev.env.timed_checks import (
    ESCAPE_FRACTION,
    ESCAPE_TARGET,
    CheckedCalls,
    binomial_escape,
    check_plan,
    check_plan_table,
    checks_for_escape,
    choose_check_positions,
    escape_probability,
    fewest_checks,
    runs_for_escape,
    timed_check_count,
)

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


def _escape_by_enumeration(n, k, f):
    """Share of all k-subsets of n calls that miss the first ceil(f * n) (the wrong ones)."""
    wrong = set(range(math.ceil(f * n)))
    subsets = list(itertools.combinations(range(n), min(k, n)))
    return sum(not wrong & set(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "k", "f"), [(8, 3, 0.25), (10, 7, 0.25), (10, 8, 0.25),
                                           (12, 4, 0.5), (9, 2, 0.3), (6, 9, 0.25)])
def test_escape_probability_matches_enumerating_the_check_positions(n, k, f):
    assert escape_probability(n, k, f) == pytest.approx(_escape_by_enumeration(n, k, f))


def test_escape_probability_is_at_most_the_binomial_figure():
    for n in (10, 40, 300):
        for k in (1, 8, 25):
            assert escape_probability(n, k, 0.25) <= binomial_escape(k, 0.25) + 1e-15


def test_escape_probability_is_one_without_checks_or_wrong_calls():
    assert escape_probability(300, 0, 0.25) == 1.0
    assert escape_probability(300, 25, 0.0) == 1.0
    assert escape_probability(0, 25, 0.25) == 1.0


def test_checks_for_escape_is_the_fewest_that_reach_the_target():
    k = checks_for_escape(ESCAPE_TARGET, ESCAPE_FRACTION)
    assert k == 25
    assert binomial_escape(k, 0.25) < 1e-3 <= binomial_escape(k - 1, 0.25)
    assert checks_for_escape(1e-2, 0.5) == 7  # 0.5 ** 7 = 0.0078


def test_default_config_checks_25_calls_up_to_40_mib_per_call():
    cfg = EvalConfig()
    for size in (1 * MIB, 16 * MIB, 40 * MIB):
        k = timed_check_count(cfg.timed_checks, cfg.timed_check_budget_mib, size)
        assert k == 25
        for n in (cfg.min_timed_runs, cfg.max_timed_runs):
            assert escape_probability(n, k, ESCAPE_FRACTION) < ESCAPE_TARGET, (size, n, k)


def test_fewest_checks_reach_the_target_with_the_fewest_timed_calls():
    k = fewest_checks(10)
    assert k == 8  # 8 of 10 calls checked: 3 wrong ones cannot all be missed
    assert escape_probability(10, k, 0.25) < ESCAPE_TARGET <= escape_probability(10, k - 1, 0.25)


def test_runs_for_escape_is_the_longest_run_of_call_counts_below_the_target():
    runs = runs_for_escape(12, 10, 300)
    assert all(escape_probability(n, 12, 0.25) < ESCAPE_TARGET for n in range(10, runs + 1))
    assert escape_probability(runs + 1, 12, 0.25) >= ESCAPE_TARGET
    assert runs_for_escape(25, 10, 300) == 300
    assert runs_for_escape(2, 10, 300) == 10  # nothing reaches it: the fewest calls


@pytest.mark.parametrize("size_mib", [1, 128, 256, 512, 4096])
def test_every_problem_size_gets_a_plan_below_the_escape_target(size_mib):
    cfg = EvalConfig()
    plan = check_plan(size_mib * MIB, wanted=cfg.timed_checks, budget_mib=cfg.timed_check_budget_mib,
                      min_runs=cfg.min_timed_runs, max_runs=cfg.max_timed_runs)
    assert plan.escape < ESCAPE_TARGET
    worst = max(escape_probability(n, plan.checks, 0.25)
                for n in range(cfg.min_timed_runs, plan.max_runs + 1))
    assert plan.escape == worst
    assert cfg.min_timed_runs <= plan.max_runs <= cfg.max_timed_runs


def test_check_plan_table_maps_sizes_to_plans():
    rows = check_plan_table([MIB, 85 * MIB], wanted=25, budget_mib=1024.0, min_runs=10,
                            max_runs=300)
    assert [(r.checks, r.max_runs) for r in rows] == [(25, 300), (12, runs_for_escape(12, 10, 300))]


def test_the_documented_plan_table_is_what_check_plan_table_computes():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluator.md").read_text()
    rows = re.findall(r"^\| (\d+) MiB \| (\d+) \| (\d+) \| ([0-9.e-]+) \|$", doc, re.MULTILINE)
    assert rows, "docs/evaluator.md has no checked-calls-per-size table"
    cfg = EvalConfig()
    plans = check_plan_table([int(r[0]) * MIB for r in rows], wanted=cfg.timed_checks,
                             budget_mib=cfg.timed_check_budget_mib,
                             min_runs=cfg.min_timed_runs, max_runs=cfg.max_timed_runs)
    for row, plan in zip(rows, plans, strict=True):
        assert (int(row[1]), int(row[2]), row[3]) == (plan.checks, plan.max_runs,
                                                      f"{plan.escape:.2g}"), row


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


def _detector(probe_inputs):
    """A candidate's forward that looks for its inputs where the harness may have left them:
    in its first allocation (as drawn, or as the draw's pre-scaling temporary) and in torch's
    generator (redrawing ``get_inputs()`` from ``torch.initial_seed()``). Returns (forward,
    flags): after each call, ``flags[-1]`` is (seen in memory, seen in the generator)."""
    import torch

    flags = []

    def forward(args):
        x = args[0]
        probe = torch.empty_like(x)  # first allocation: whatever the allocator hands back
        in_memory = bool(torch.equal(probe, x) or torch.equal(probe, x * 2))
        torch.manual_seed(torch.initial_seed())
        with torch.device("cuda"):
            in_generator = bool(torch.equal(probe_inputs()[0], x))
        flags.append((in_memory, in_generator))
        return [x * 2]

    return forward, flags


@pytest.mark.gpu
@pytest.mark.parametrize("numel", [4096, 1 << 20], ids=["small-pool", "large-pool"])
def test_no_memory_or_generator_state_tells_a_checked_call_from_an_unchecked_one(numel):
    import types

    import torch

    from multiminddev.env import benchmark as bm
    from multiminddev.env.worker import make_inputs

    # get_inputs() makes a temporary (randn) before its result: both are freed by the harness.
    problem = types.SimpleNamespace(get_inputs=lambda: [torch.randn(numel) * 0.5])
    rng = random.Random(5)

    def draw():
        return make_inputs(problem, rng.randrange(1 << 62))

    check_inputs = [draw() for _ in range(6)]
    forward, flags = _detector(problem.get_inputs)
    calls = CheckedCalls(draw_inputs=draw, check_inputs=check_inputs,
                         output_specs=[((numel,), torch.float32)], forward=forward, rng=rng)
    by_call = {}

    def finish(i, out):
        by_call[i] = flags[-1]
        calls.finish(i, out)

    plan = bm.TimingPlan(warmup_runs=3, min_runs=40, max_runs=40, budget_s=0.1)
    bm.time_calls(bm.TimedCalls(run=calls.run, prepare=calls.prepare, finish=finish), plan,
                  bm.l2_flush_buffer(), on_planned=calls.plan)
    torch.cuda.synchronize()
    unchecked = [by_call[i] for i in range(40) if i not in calls.positions]
    checked = [by_call[i] for i in sorted(calls.positions)]
    assert len(checked) == 6 and len(unchecked) == 34
    assert not any(any(f) for f in unchecked + checked), by_call
    outputs = calls.checked_outputs()  # the honest part: checked outputs are the right ones
    assert all(torch.equal(out[0], inp[0] * 2) for out, inp in zip(outputs, check_inputs))
    assert len(calls.checked_output_layouts()) == 6
    calls.release()


@pytest.mark.gpu
def test_the_detector_sees_an_unchecked_calls_inputs_left_in_the_candidates_pool():
    """Control for the test above: the same detector fires where a draw is freed in the
    candidate's pool and the generator keeps the draw's seed (so it can fail)."""
    import types

    import torch

    from multiminddev.env.worker import make_inputs

    problem = types.SimpleNamespace(get_inputs=lambda: [torch.randn(1 << 20) * 0.5])
    forward, flags = _detector(problem.get_inputs)
    fresh = make_inputs(problem, 1234)
    args = [torch.empty_like(fresh[0]).copy_(fresh[0])]
    del fresh
    forward(args)
    assert flags[-1] == (True, True)


@pytest.mark.gpu
def test_the_harness_pool_is_private_on_the_gpu():
    from multiminddev.env.timed_checks import HarnessPool

    assert HarnessPool().private  # else the harness only scrubs what it frees
