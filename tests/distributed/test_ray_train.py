"""``train --ray``: the pipeline with GRPO's rollouts on a local Ray cluster it starts itself,
on a tiny real Llama (no SFT, one GRPO step, compile-only rewards); and the pure helpers that
place the learner."""

from __future__ import annotations

import json
import os

import pytest

from multiminddev.distributed.grpo import cluster_gpu_list, driver_cuda_index, learner_device
from multiminddev.distributed.rollout import layout_from_plan
from multiminddev.train.planner import GPUInfo, plan_gpus

H100 = GPUInfo(index=0, name="H100", total_memory_bytes=80 * 1024**3)


def test_remote_gpus_follow_the_drivers_and_are_taken_to_be_like_its_first():
    gpus = cluster_gpu_list([H100], 3)
    assert [g.index for g in gpus] == [0, 1, 2] and {g.name for g in gpus} == {"H100"}
    assert cluster_gpu_list([], 2)[1].total_memory_bytes == 80 * 1024**3


def test_a_leased_gpu_maps_through_cuda_visible_devices():
    assert driver_cuda_index("3", None) == 3
    assert driver_cuda_index("3", "2,3") == 1
    with pytest.raises(ValueError, match="hides"):
        driver_cuda_index("0", "2,3")


def test_the_learner_runs_on_the_plans_gpu_or_the_cpu():
    four = layout_from_plan(plan_gpus([H100] * 4, 135_000_000))
    assert learner_device(four, 4, None) == "cuda:1"
    assert learner_device(four, 4, "2") == "cuda:2"  # the GPU Ray leased wins
    assert learner_device(four, 0, None) == "cpu"  # a driver without a GPU
    assert learner_device(layout_from_plan(plan_gpus([], 1)), 0, None) == "cpu"


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    pytest.importorskip("ray")
    from multiminddev.distributed.grpo import run_ray_pipeline
    # Ray's memory monitor kills actors when the whole machine is short of memory, whoever
    # holds it; on a shared test machine that is other processes' doing, not these workers'.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    from multiminddev.train.pipeline import TrainSettings
    from tests.policy.helpers import gguf_tokenizer, tiny_base_model

    model = tmp_path_factory.mktemp("tiny-llama")
    tiny_base_model().save_pretrained(model)
    gguf_tokenizer().save_pretrained(model)
    out = tmp_path_factory.mktemp("run")
    settings = TrainSettings(output_dir=out, model=str(model), preset="quick-test", skip_sft=True,
                             num_steps=1, batch_size=1, group_size=2, max_turns=1,
                             max_new_tokens=4, lora_rank=4, compiled_decoding=False)
    result = run_ray_pipeline(settings)
    return out, result


def test_the_layout_is_recorded_with_where_each_worker_landed(ray_run):
    import torch

    out, _ = ray_run
    record = json.loads((out / "layout.json").read_text())
    workers = record["layout"]["rollout_workers"]
    assert sorted(w["worker"] for w in record["workers"]) == list(range(workers))
    if torch.cuda.is_available():
        assert record["learner_device"].startswith("cuda:")
    else:  # the CPU plan: two CPU workers
        assert (workers, record["learner_device"]) == (2, "cpu")


@pytest.mark.gpu
def test_on_gpus_each_worker_holds_a_gpu_of_its_own(ray_run):
    out, _ = ray_run
    record = json.loads((out / "layout.json").read_text())
    held = [(w["node"], tuple(w["gpu_ids"])) for w in record["workers"]]
    assert all(len(ids) == 1 for _, ids in held) and len(set(held)) == len(held)


def test_the_ray_run_trains_one_step(ray_run):
    out, result = ray_run
    assert result.rl_steps == 1
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_the_held_out_evaluation_is_played_by_the_rollout_workers(ray_run):
    out, result = ray_run
    record = json.loads((out / "eval_results.json").read_text())
    workers = json.loads((out / "layout.json").read_text())["layout"]["rollout_workers"]
    assert record["evaluated_by"] == f"{workers} Ray rollout workers"
    assert record["problems"] >= 1 and result.evaluation["reward_mean"] == record["reward_mean"]


def test_the_workers_decoding_time_is_logged_within_the_rollouts(ray_run):
    out, _ = ray_run
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert 0 < record["time_rollout_generate"] <= record["time_rollout"]


def test_train_takes_ray_with_or_without_an_address():
    from multiminddev.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "--ray"]).ray == ""  # a local cluster
    assert parser.parse_args(["train", "--ray", "auto"]).ray == "auto"
    assert parser.parse_args(["train"]).ray is None
