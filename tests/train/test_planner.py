"""GPU planner: the training guide's layouts for 0, 1, 2-3, 4-7 and 8+ GPUs; fit checks."""

from __future__ import annotations

import pytest

from multiminddev.train.planner import GIB, GPUInfo, PlanTier, estimate_memory, plan_gpus

SMOL = 135_000_000


def gpus(n: int, gib: int = 80) -> list[GPUInfo]:
    return [GPUInfo(index=i, name="H100", total_memory_bytes=gib * GIB) for i in range(n)]


def test_no_gpu_is_a_cpu_plan_with_compile_only_note():
    plan = plan_gpus([], SMOL)
    assert plan.tier is PlanTier.CPU and plan.compile_only and plan.policy_device == "cpu"
    assert any("compile-only" in n for n in plan.notes)


def test_single_gpu_shares_every_role():
    plan = plan_gpus(gpus(1), SMOL)
    assert plan.tier is PlanTier.SINGLE
    assert plan.rollout_gpus == (0,) and plan.generator_gpu == plan.optimizer_gpu == 0
    assert plan.evaluation_gpus == (0,) and plan.fits


@pytest.mark.parametrize("n, evaluation", [(2, (1,)), (3, (2,))])
def test_two_or_three_gpus_share_agents_on_gpu1(n, evaluation):
    plan = plan_gpus(gpus(n), SMOL)
    assert plan.tier is PlanTier.MINIMAL and plan.rollout_gpus == (0,)
    assert plan.generator_gpu == plan.optimizer_gpu == 1 and plan.evaluation_gpus == evaluation


@pytest.mark.parametrize("n", [4, 5, 7])
def test_four_to_seven_gpus_balanced(n):
    plan = plan_gpus(gpus(n), SMOL)
    assert plan.tier is PlanTier.BALANCED and plan.rollout_gpus == (0,)
    assert (plan.generator_gpu, plan.optimizer_gpu) == (1, 2)
    assert plan.evaluation_gpus == tuple(range(3, n))


@pytest.mark.parametrize("n", [8, 12])
def test_eight_plus_gpus_optimal(n):
    plan = plan_gpus(gpus(n), SMOL)
    assert plan.tier is PlanTier.OPTIMAL and plan.rollout_gpus == (0, 1)
    assert (plan.generator_gpu, plan.optimizer_gpu) == (2, 3)
    assert plan.evaluation_gpus == tuple(range(4, n))


def test_num_gpus_caps_detected_and_notes_excess():
    assert plan_gpus(gpus(8), SMOL, num_gpus=4).tier is PlanTier.BALANCED
    plan = plan_gpus(gpus(2), SMOL, num_gpus=8)
    assert plan.num_gpus == 2 and any("asked for 8" in n for n in plan.notes)


def test_model_too_big_does_not_fit_and_says_what_to_do():
    plan = plan_gpus(gpus(1, gib=16), 70_000_000_000)
    assert not plan.fits and any("--batch-size" in n for n in plan.notes)


def test_full_finetune_needs_more_memory_than_lora():
    assert estimate_memory(SMOL, full_finetune=True).total > estimate_memory(SMOL).total


def test_render_plan_prints_roles():
    from rich.console import Console

    from multiminddev.train.planner import render_plan

    console = Console(record=True, width=120)
    render_plan(plan_gpus(gpus(4), SMOL), console)
    text = console.export_text()
    assert "Generator training" in text and "cuda:1" in text
