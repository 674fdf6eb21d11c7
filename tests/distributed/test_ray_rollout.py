"""Distributed GRPO rollouts on a real local Ray cluster: two CPU rollout workers over a tiny
real Llama (the SmolLM2 tokenizer), compile-only evaluation, one GRPO step."""

from __future__ import annotations

import functools
import os

import pytest

from multiminddev.distributed.rollout import (
    RolloutLayout,
    StaleWeights,
    layout_from_plan,
    shard_episodes,
)
from multiminddev.train.planner import GPUInfo, plan_gpus
from tests.policy.helpers import save_tiny_model
from tests.problems import RELU_1024

H100 = GPUInfo(index=0, name="H100", total_memory_bytes=80 * 1024**3)


def plan(n: int):
    return plan_gpus([dataclass_replace(H100, index=i) for i in range(n)], 135_000_000)


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


# --------------------------------------------------------------------------- pure layout


def test_shards_cover_every_episode_once_in_order_and_balanced():
    for problems, group, workers in [(1, 4, 2), (3, 4, 2), (5, 2, 3), (2, 2, 8), (8, 4, 3)]:
        shards = shard_episodes(problems, group, workers)
        assert len(shards) == workers
        flat = [slot for shard in shards for slot in shard]
        assert sorted(flat) == [(p, g) for p in range(problems) for g in range(group)]
        assert all(shard == sorted(shard) for shard in shards)  # each in problem order
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_shards_give_every_worker_a_share_of_every_problem():
    shards = shard_episodes(8, 4, 2)
    for shard in shards:
        assert all(sum(1 for p, _ in shard if p == problem) == 2 for problem in range(8))
    # three workers, groups of four: every worker gets one or two episodes of each problem
    for shard in shard_episodes(8, 4, 3):
        counts = [sum(1 for p, _ in shard if p == problem) for problem in range(8)]
        assert min(counts) >= 1 and max(counts) <= 2


def test_without_gpus_the_layout_is_cpu_workers_and_a_cpu_learner():
    layout = layout_from_plan(plan(0), cpu_workers=3)
    assert (layout.rollout_workers, layout.gpus_per_worker, layout.learner_gpu) == (3, 0, None)


@pytest.mark.parametrize("gpus, workers, learner, exclusive", [
    (1, (0,), 0, False),  # one GPU: everything shares it
    (2, (0, 1), 1, False),  # the plan's GPU 1 trains and evaluates: a worker shares it
    (3, (0, 2), 1, True),  # GPU 1 only trains: the learner has it alone
    (4, (0, 2, 3), 1, True),  # the Optimizer-training GPU samples (one learner trains both)
    (8, (0, 1, 3, 4, 5, 6, 7), 2, True),
])
def test_every_gpu_but_an_exclusive_learners_hosts_one_worker(gpus, workers, learner, exclusive):
    layout = layout_from_plan(plan(gpus))
    assert layout.worker_gpus == workers and layout.rollout_workers == len(workers)
    assert layout.learner_gpu == learner and layout.learner_exclusive is exclusive


def test_layout_rejects_zero_workers():
    with pytest.raises(ValueError, match="at least one rollout worker"):
        RolloutLayout(tier="cpu", rollout_workers=0, gpus_per_worker=0, worker_gpus=(),
                      learner_gpu=None, learner_exclusive=False, evaluation="")


# --------------------------------------------------------------------------- a real cluster

@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    cache = tmp_path_factory.mktemp("ray-mmd-cache")
    # Ray's memory monitor kills actors when the whole machine is short of memory, whoever
    # holds it; on a shared test machine that is other processes' doing, not these workers'.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    env = {"MULTIMINDDEV_CACHE": str(cache), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    # one GPU in Ray's books (none in torch's without one), for the learner's lease
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env},
             logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def one_step(cluster, tiny_model_dir, tmp_path_factory):
    """One GRPO step of a learner in this process with two CPU rollout workers; returns the
    trainer, the learner's adapters before the step and the versions seen."""
    import torch

    from multiminddev.distributed.rollout import RayRollouts, adapter_weights
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import PolicyConfig, SamplingParams, load_policy
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.problem import load_problem_source
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer

    policy_config = PolicyConfig(model=str(tiny_model_dir), lora_rank=4, lora_alpha=8)
    learner = load_policy(policy_config)
    # peft starts LoRA B at zero (each adapter = the base); random B gives the workers'
    # fresh adapters something to catch up with, and the KL term a gradient
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in learner.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    layout = layout_from_plan(plan(0), cpu_workers=2)
    rollouts = RayRollouts.start(layout, policy_config,
                                 functools.partial(Evaluator, EvalConfig(num_workers=1)))
    config = GRPOConfig(num_steps=1, problems_per_step=2, group_size=2, max_turns=1,
                        max_new_tokens=4, mini_batch_size=4, learning_rate=1e-2, eval_every=0)
    episode_config = EpisodeConfig(max_turns=1, patience=0, max_format_failures=5,
                                   sampling=SamplingParams(temperature=1.0, max_new_tokens=4))
    problems = [load_problem_source(RELU_1024, name=f"relu_{i}", tier=0) for i in range(2)]
    out = tmp_path_factory.mktemp("run")
    trainer = GRPOTrainer(config, policy=learner, backend=None, evaluator=None,
                          curriculum=Curriculum.from_problems(problems), rollouts=rollouts,
                          episode_config=episode_config, output_dir=out, compile_only=True)
    before = adapter_weights(learner)
    trainer.train()
    yield {"trainer": trainer, "rollouts": rollouts, "before": before}
    rollouts.close()


def test_the_rollout_comes_from_both_workers(one_step):
    batches = one_step["rollouts"].last_batches
    assert sorted(b["worker"] for b in batches) == [0, 1]
    assert all(b["episodes"] == 2 for b in batches)
    assert all(b["seconds"] > 0 for b in batches)


def test_the_step_records_its_slowest_and_fastest_workers_time(one_step):
    record = one_step["trainer"].history[0]
    slowest, fastest = record["time_rollout_episodes"], record["time_rollout_episodes_fastest"]
    assert 0 < fastest <= slowest <= record["time_rollout"]
    assert slowest == pytest.approx(max(b["seconds"] for b in one_step["rollouts"].last_batches))


def test_episodes_carry_token_ids_and_old_logprobs_in_their_groups(one_step):
    import json

    lines = (one_step["trainer"].output_dir / "episodes.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines]
    assert [e["group"] for e in episodes] == [0, 0, 1, 1]
    for turn in (t for e in episodes for t in e["turns"]):
        assert turn["response_ids"] and len(turn["logprobs"]) == len(turn["response_ids"])


def test_after_the_update_the_workers_hold_the_learners_adapters(one_step):
    import torch

    from multiminddev.distributed.rollout import adapter_weights

    learner = adapter_weights(one_step["trainer"].policy)
    moved = [not torch.equal(learner[r][k], one_step["before"][r][k])
             for r in learner for k in learner[r]]
    assert any(moved), "the update changed no adapter tensor; the comparison proves nothing"
    for worker in one_step["rollouts"].worker_adapter_weights():
        assert worker.keys() == learner.keys()
        for role, tensors in learner.items():
            assert worker[role].keys() == tensors.keys()
            assert all(torch.equal(worker[role][k], v) for k, v in tensors.items())


def test_cpu_workers_have_no_baselines_to_measure_ahead_and_keep_playing(one_step):
    from multiminddev.tasks.problem import load_problem_source

    rollouts = one_step["rollouts"]
    problems = [load_problem_source(RELU_1024, name=f"relu_ahead_{i}", tier=0) for i in range(3)]
    assert rollouts.prefetch_baselines(problems) == 0  # nothing is timed without a GPU
    # the trainer asked its workers once, before the first rollout: none measured on CPUs
    assert one_step["trainer"].baseline_prefetch["problems"] == 0.0


def test_the_weight_version_advances_with_the_update(one_step):
    rollouts = one_step["rollouts"]
    assert [b["version"] for b in rollouts.last_batches] == [0, 0]  # sampled before the update
    assert rollouts.version == one_step["trainer"].step == 1


def test_an_evaluation_is_spread_over_the_workers_with_the_policys_adapters_as_they_are(
        one_step):
    """select@ and held-out evaluations under ``train --ray``: after early stopping loads an
    earlier step's agents, the workers must judge those, decoding as the evaluation decodes,
    and give the episodes an in-process evaluation gives."""
    import torch

    from multiminddev.distributed.rollout import adapter_weights, load_adapter_weights
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import HFGenerationBackend, LogprobSource, SamplingParams
    from multiminddev.tasks.problem import load_problem_source
    from multiminddev.train.grpo import LocalRollouts

    trainer, rollouts = one_step["trainer"], one_step["rollouts"]
    learner = trainer.policy
    trained = adapter_weights(learner)
    load_adapter_weights(learner, one_step["before"])  # the agents of step 0, as early stopping
    greedy = EpisodeConfig(max_turns=1, patience=0, max_format_failures=5,
                           sampling=SamplingParams(temperature=0.0, max_new_tokens=6))
    decoding = {"logprob_source": LogprobSource.SAMPLER, "max_batch_size": 4,
                "compiled_decoding": False, "sampling_dtype": torch.float32}
    problems = [load_problem_source(RELU_1024, name=f"relu_eval_{i}", tier=0) for i in range(3)]

    remote = rollouts.evaluate(learner, problems, greedy, decoding)

    assert sorted(b["worker"] for b in rollouts.last_batches) == [0, 1]
    assert sum(b["episodes"] for b in rollouts.last_batches) == 3
    before = one_step["before"]
    for worker in rollouts.worker_adapter_weights():
        assert all(torch.equal(worker[r][k], v) for r in before for k, v in before[r].items())
    evaluator = Evaluator(EvalConfig(num_workers=1))
    try:
        local = LocalRollouts(HFGenerationBackend(learner, **decoding),
                              evaluator).run_episodes(problems, 1, greedy)
    finally:
        evaluator.close()
    assert [e.problem.name for e in remote] == [p.name for p in problems]
    assert ([t.response_ids for e in remote for t in e.turns]
            == [t.response_ids for e in local for t in e.turns])
    assert any(t.response_ids for e in remote for t in e.turns)
    load_adapter_weights(learner, trained)  # as the other tests found them
    rollouts.publish(learner, trainer.step)


def test_a_worker_that_dies_is_replaced_and_its_episodes_are_played(one_step):
    """Killing a rollout worker (as an OOM kill or a lost node would) loses no episode: a
    replacement loads the published adapters and plays the dead worker's shard again."""
    import ray
    import torch

    from multiminddev.distributed.rollout import adapter_weights
    from multiminddev.tasks.problem import load_problem_source

    trainer, rollouts = one_step["trainer"], one_step["rollouts"]
    dead, restarts = rollouts.workers[0], rollouts.restarts
    ray.kill(dead, no_restart=True)
    problems = [load_problem_source(RELU_1024, name=f"relu_kill_{i}", tier=0) for i in range(2)]

    episodes = rollouts.run_episodes(problems, 2, trainer.episode_config)

    assert len(episodes) == 4 and [e.group for e in episodes] == [0, 0, 1, 1]
    assert rollouts.restarts == restarts + 1 and rollouts.workers[0] is not dead
    assert {b["worker"]: b["attempts"] for b in rollouts.last_batches} == {0: 2, 1: 1}
    assert all(b["version"] == rollouts.version for b in rollouts.last_batches)
    learner = adapter_weights(trainer.policy)
    replacement = rollouts.worker_adapter_weights()[0]
    assert all(torch.equal(replacement[r][k], v) for r in learner for k, v in learner[r].items())


def test_a_worker_dead_at_publish_is_replaced_with_the_new_adapters(one_step):
    import ray

    trainer, rollouts = one_step["trainer"], one_step["rollouts"]
    restarts = rollouts.restarts
    ray.kill(rollouts.workers[1], no_restart=True)
    rollouts.publish(trainer.policy, trainer.step)
    assert rollouts.restarts == restarts + 1 and rollouts.version == trainer.step


def test_a_rollout_before_any_publish_is_refused(cluster):
    from multiminddev.distributed.rollout import RayRollouts

    rollouts = RayRollouts([], layout_from_plan(plan(0)), [])
    with pytest.raises(StaleWeights, match="publish"):
        rollouts.run_episodes([], 2, None)


@pytest.fixture(scope="module")
def shared_kernel(cluster):
    """A real evaluator (compile-only here), an honest kernel and its problem."""
    from multiminddev.env import EvalConfig, Evaluator
    from tests.env._fixtures import FIXTURES, problem_for

    path = FIXTURES / "honest" / "relu_basic.py"
    with Evaluator(EvalConfig(num_workers=1)) as evaluator:
        yield evaluator, problem_for(path), path.read_text()


def _share():
    import ray

    from multiminddev.distributed.rollout import EvaluationShare

    return ray.remote(EvaluationShare).options(num_cpus=0).remote()


def test_a_kernel_two_workers_hold_is_evaluated_once_for_both(shared_kernel):
    import asyncio

    import ray

    from multiminddev.distributed.rollout import SharedEvaluator

    evaluator, problem, source = shared_kernel
    share = _share()
    workers = [SharedEvaluator(evaluator, share, rollout=1, worker=w) for w in (0, 1)]

    async def both():
        return await asyncio.gather(*(w.aevaluate(problem, source) for w in workers))

    first, second = asyncio.run(both())
    assert first.status is second.status and first.status.value in ("no_gpu", "ok")
    assert first.to_dict() == second.to_dict()
    assert ray.get(share.counts.remote()) == {"claims": 1, "answers": 1, "open": 1}
    ray.get(share.forget.remote(1))
    assert ray.get(share.counts.remote())["open"] == 0


def test_a_common_kernel_goes_to_the_worker_with_a_free_slot(shared_kernel):
    """Worker 0 (one evaluation slot) is busy with kernel A when worker 1 asks for kernel B,
    which worker 0 holds too: worker 1 evaluates B, though worker 0 asked for it first."""
    import asyncio

    import ray

    from multiminddev.distributed.rollout import SharedEvaluator
    from multiminddev.episode.runner import source_hash

    evaluator, problem, source = shared_kernel
    assert evaluator.config.num_workers == 1
    # texts no other test evaluated: each is compiled, which takes far longer than a claim
    kernel_a, kernel_b = (source + f"\n# the same kernel, text {t}\n" for t in "ab")
    share = _share()
    busy, free = (SharedEvaluator(evaluator, share, rollout=3, worker=w) for w in (0, 1))
    key = (3, problem.source_hash + problem.name)
    key_a, key_b = (*key, source_hash(kernel_a)), (*key, source_hash(kernel_b))

    async def race():
        first = [asyncio.ensure_future(busy.aevaluate(problem, k)) for k in (kernel_a, kernel_b)]
        while key_a not in await share.owners.remote(3):
            await asyncio.sleep(0.01)
        assert not first[0].done()  # worker 0 is evaluating A, B waits for its slot
        return await asyncio.gather(*first, free.aevaluate(problem, kernel_b))

    results = asyncio.run(race())
    assert all(r.status.value in ("no_gpu", "ok") for r in results)
    assert ray.get(share.owners.remote(3)) == {key_a: 0, key_b: 1}
    assert ray.get(share.counts.remote())["answers"] == 1  # worker 0 got B from worker 1


def test_a_dead_workers_claims_are_released_and_its_waiters_evaluate(shared_kernel):
    import asyncio

    import ray

    from multiminddev.distributed.rollout import SharedEvaluator
    from multiminddev.episode.runner import source_hash

    evaluator, problem, source = shared_kernel
    share = _share()
    key = (7, problem.source_hash + problem.name, source_hash(source))
    assert ray.get(share.claim.remote(key, 1))  # worker 1 claims it, then dies
    waiter = SharedEvaluator(evaluator, share, rollout=7, worker=0)

    async def wait_then_release():
        pending = asyncio.ensure_future(waiter.aevaluate(problem, source))
        await asyncio.sleep(0.5)
        assert not pending.done()  # waiting for worker 1's result
        assert await share.release.remote(7, 1) == 1
        return await pending

    result = asyncio.run(wait_then_release())
    assert result.status.value in ("no_gpu", "ok")
    assert ray.get(share.counts.remote())["answers"] == 0  # it evaluated the kernel itself


def test_a_share_that_cannot_be_reached_costs_only_time(shared_kernel):
    import asyncio

    import ray

    from multiminddev.distributed.rollout import SharedEvaluator

    evaluator, problem, source = shared_kernel
    share = _share()
    ray.kill(share)
    result = asyncio.run(SharedEvaluator(evaluator, share, 1, 0).aevaluate(problem, source))
    assert result.status.value in ("no_gpu", "ok")


def test_the_learners_lease_keeps_its_gpu_from_rollout_workers(cluster):
    from multiminddev.distributed.grpo import RayScaleOut

    scale_out = RayScaleOut()  # joins the running cluster
    assert scale_out._lease_learner_gpu() == "0"
    assert cluster.available_resources().get("GPU", 0) == 0  # no worker can be placed there
    scale_out.close()
    assert cluster.is_initialized()  # it joined the cluster, so it leaves it running
