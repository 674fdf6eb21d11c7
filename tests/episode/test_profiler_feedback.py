"""Profiler feedback in episodes: the Tester's report on a verified kernel carries its Nsight
Compute figures where ncu and a GPU are present, and is the usual report where they are not."""

from __future__ import annotations

import shutil

import pytest

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode import EpisodeConfig, run_episodes
from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced, relu_problem
from tests.policy.helpers import gguf_tokenizer


def _episode(profiler_feedback: bool):
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: fenced(RELU_KERNEL))
    config = EpisodeConfig(max_turns=2, patience=0, target_speedup=0,
                           profiler_feedback=profiler_feedback)
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as evaluator:
        (episode,) = run_episodes([relu_problem()], backend, evaluator, config)
    return episode


def test_without_a_gpu_the_switch_leaves_the_report_as_it_is():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU test covers the switch")
    episode = _episode(profiler_feedback=True)
    assert all(t.profile is None for t in episode.turns)
    assert "Profiler" not in episode.turns[0].feedback


@pytest.mark.gpu
def test_the_optimizer_is_handed_the_verified_kernels_profile():
    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    episode = _episode(profiler_feedback=True)
    first = episode.turns[0]
    assert first.profile is not None and first.profile["status"] == "ok", first.profile
    assert "Profiler (Nsight Compute" in first.feedback
    assert "achieved occupancy" in episode.turns[1].messages[-1]["content"]  # the Optimizer's prompt
