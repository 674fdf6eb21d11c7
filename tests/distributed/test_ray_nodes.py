"""The distributed code on simulated clusters of 4 and 8 nodes (``ray.cluster_utils.Cluster``,
one CPU and an 80 MB object store per node): ``eval-dir --ray`` spread over every node, and a
GRPO step whose rollout loses a node mid-way. On this CPU machine evaluations are compile-only
and rollout workers sample from a tiny real Llama (the SmolLM2 tokenizer), as in
test_ray_eval.py and test_ray_rollout.py."""

from __future__ import annotations

import functools
import json
import os
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from multiminddev.commands._io import ExitCode
from multiminddev.distributed.cluster import RAY_NAMESPACE
from multiminddev.distributed.rollout import RayRollouts, layout_from_plan
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode import EpisodeConfig
from multiminddev.policy import PolicyConfig, SamplingParams
from multiminddev.tasks.curriculum import Curriculum
from multiminddev.tasks.problem import load_problem_source
from multiminddev.train.grpo import GRPOConfig, GRPOTrainer
from multiminddev.train.planner import plan_gpus
from tests.conftest import gpu_available
from tests.env._fixtures import FIXTURES
from tests.policy.helpers import save_tiny_model
from tests.problems import RELU_1024

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(gpu_available(), reason="compile-only results need a CPU machine")]

NODE_COUNTS = (4, 8)
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}
# Ray kills workers when the whole machine's memory passes 95%; on a shared test machine that is
# other processes' doing, and would add unplanned losses to the one node this test removes.
NO_MEMORY_MONITOR = {"memory_monitor_refresh_ms": 0}
# eval-dir pairs a candidate with a problem by its leading number; compile-only on a CPU
# machine, so a kernel that compiles ends no_gpu and the broken one compile_error.
EVAL_DIR_CANDIDATES = {
    "1_relu_basic.py": ("honest/relu_basic.py", "no_gpu"),
    "1_relu_vec4.py": ("honest/relu_vec4.py", "no_gpu"),
    "1_relu_compile_error.py": ("wrong/relu_compile_error.py", "compile_error"),
    "2_sum_dim_shared.py": ("honest/sum_dim_shared.py", "no_gpu"),
    "2_sum_dim_rowthread.py": ("honest/sum_dim_rowthread.py", "no_gpu"),
    "3_softmax_block.py": ("honest/softmax_block.py", "no_gpu"),
    "3_softmax_warp.py": ("honest/softmax_warp.py", "no_gpu"),
    "4_matmul_naive.py": ("honest/matmul_naive.py", "no_gpu"),
}
GROUP_SIZE = 2
# Long enough that a worker is still decoding when its node goes (a random model rarely ends
# early), short enough for a CPU.
MAX_NEW_TOKENS = 128


@pytest.fixture(scope="module", params=NODE_COUNTS, ids=lambda n: f"{n}-nodes")
def cluster(request, tmp_path_factory):
    """A head and ``n - 1`` worker nodes, one CPU each, and this process connected to them."""
    from ray.cluster_utils import Cluster

    n = request.param
    cache = tmp_path_factory.mktemp(f"ray-mmd-cache-{n}")
    env = {"MULTIMINDDEV_CACHE": str(cache), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    sim = Cluster(initialize_head=True,
                  head_node_args={**NODE_ARGS, "include_dashboard": False,
                                  "_system_config": NO_MEMORY_MONITOR})
    for _ in range(n - 1):
        sim.add_node(**NODE_ARGS)
    ray.init(address=sim.address, namespace=RAY_NAMESPACE, log_to_driver=False,
             runtime_env={"env_vars": env}, logging_level="ERROR")
    sim.wait_for_nodes()
    yield sim, n
    ray.shutdown()
    sim.shutdown()


def alive_node_ids() -> set[str]:
    return {node["NodeID"] for node in ray.nodes() if node["Alive"]}


# ----------------------------------------------------------------------------- eval-dir


def test_eval_dir_is_spread_over_every_node_and_loses_no_candidate(cluster, tmp_path):
    from multiminddev.cli import main

    sim, n = cluster
    assert len(alive_node_ids()) == n
    problems, cands = tmp_path / "problems", tmp_path / "cands"
    problems.mkdir()
    cands.mkdir()
    for problem in ("1_relu", "2_sum_dim", "3_softmax", "4_matmul"):
        (problems / f"{problem}.py").write_text((FIXTURES / "problems" / f"{problem}.py").read_text())
    for name, (fixture, _) in EVAL_DIR_CANDIDATES.items():
        (cands / name).write_text((FIXTURES / fixture).read_text())
    out = tmp_path / "results.jsonl"

    # one evaluation actor per node: each reserves the one CPU a node has; the broken
    # candidate's compile error makes the exit code "an evaluation failed"
    assert main(["eval-dir", str(problems), str(cands), "--no-benchmark", "--workers", str(n),
                 "--out", str(out), "--ray", "auto"]) == ExitCode.EVALUATION_FAILED

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["candidate_file"] for r in rows) == sorted(EVAL_DIR_CANDIDATES)
    assert {r["candidate_file"]: r["status"] for r in rows} == {
        name: status for name, (_, status) in EVAL_DIR_CANDIDATES.items()}
    assert all(r["attempts"] == 1 for r in rows)


def test_evaluation_actors_take_one_node_each(cluster):
    from multiminddev.distributed.ray_eval import RayEvalConfig, RayEvaluator

    sim, n = cluster
    with RayEvaluator(EvalConfig(benchmark=False, compile_timeout_s=30),
                      RayEvalConfig(cpu_actors=n)) as ev:
        deadline = time.monotonic() + 300
        while not all(a["ready"] for a in ev.actors()) and time.monotonic() < deadline:
            time.sleep(0.05)  # placed: its evaluator built, before its workers are warm
        placed = [a.get("node_id") for a in ev.actors()]
    assert len(placed) == n and set(placed) == alive_node_ids()


# ----------------------------------------------------------------------------- a lost node


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _trainer(rollouts, policy_config, problems: int, out) -> GRPOTrainer:
    import torch

    from multiminddev.policy import load_policy

    learner = load_policy(policy_config)
    # peft starts LoRA B at zero; random B gives the update a gradient to follow
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in learner.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    episodes = problems * GROUP_SIZE
    config = GRPOConfig(num_steps=1, problems_per_step=problems, group_size=GROUP_SIZE,
                        max_turns=1, max_new_tokens=MAX_NEW_TOKENS, mini_batch_size=episodes,
                        learning_rate=1e-2, eval_every=0)
    episode_config = EpisodeConfig(
        max_turns=1, patience=0, max_format_failures=5,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS))
    curriculum = Curriculum.from_problems(
        [load_problem_source(RELU_1024, name=f"relu_{i}", tier=0) for i in range(problems)])
    return GRPOTrainer(config, policy=learner, backend=None, evaluator=None,
                       curriculum=curriculum, rollouts=rollouts, episode_config=episode_config,
                       output_dir=out, compile_only=True)


def _train_in_background(trainer: GRPOTrainer) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def train() -> None:
        try:
            trainer.train()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            errors.append(exc)

    thread = threading.Thread(target=train, name="grpo-step", daemon=True)
    thread.start()
    return thread, errors


def _wait_for_rollout(rollouts: RayRollouts, thread: threading.Thread,
                      timeout_s: float = 600.0) -> None:
    """Until the step's rollout has sent the workers their shards."""
    deadline = time.monotonic() + timeout_s
    while rollouts.rollouts_started < 1:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the GRPO step never started its rollout")
        time.sleep(0.01)


def test_a_step_that_loses_a_node_mid_rollout_loses_no_episode(cluster, tiny_model_dir,
                                                               tmp_path):
    """``n - 1`` rollout workers, one per node, leave one node's CPU free; a worker node goes
    while its worker decodes, and the step still ends with every episode of every group."""
    sim, n = cluster
    workers = n - 1
    policy_config = PolicyConfig(model=str(tiny_model_dir), lora_rank=4, lora_alpha=8)
    rollouts = RayRollouts.start(layout_from_plan(plan_gpus([], 135_000_000), cpu_workers=workers),
                                 policy_config,
                                 functools.partial(Evaluator, EvalConfig(num_workers=1)))
    try:
        head = ray.get_runtime_context().get_node_id()
        nodes_of_workers = [p["node"] for p in rollouts.placements]
        assert len(set(nodes_of_workers)) == workers  # one worker per node
        victim = next(i for i, node in enumerate(nodes_of_workers) if node != head)
        victim_node = next(node for node in sim.worker_nodes
                           if node.node_id == nodes_of_workers[victim])
        trainer = _trainer(rollouts, policy_config, problems=workers, out=tmp_path / "run")

        thread, errors = _train_in_background(trainer)
        _wait_for_rollout(rollouts, thread)
        sim.remove_node(victim_node, allow_graceful=False)
        thread.join(timeout=600)

        assert not thread.is_alive(), "the GRPO step did not end"
        assert not errors, f"the GRPO step raised {errors[0]!r}"
        assert trainer.step == 1 and len(trainer.history) == 1 and rollouts.version == 1
        assert rollouts.restarts == 1
        batches = {b["worker"]: b for b in rollouts.last_batches}
        assert sorted(batches) == list(range(workers))
        assert [b["attempts"] for _, b in sorted(batches.items())] == [
            2 if i == victim else 1 for i in range(workers)]
        # balanced: the round-robin shares of 2 episodes per worker, none lost or doubled
        assert all(b["episodes"] == GROUP_SIZE for b in batches.values())
        lines = (trainer.output_dir / "episodes.jsonl").read_text().splitlines()
        episodes = [json.loads(line) for line in lines]
        assert [e["group"] for e in episodes] == [g for g in range(workers)
                                                  for _ in range(GROUP_SIZE)]
        assert len({e["episode_id"] for e in episodes}) == workers * GROUP_SIZE
        assert all(t["response_ids"] for e in episodes for t in e["turns"])
        # the replacement took the free CPU: the workers are again on distinct live nodes
        now = [p["node"] for p in rollouts.placements]
        assert victim_node.node_id not in now and len(set(now)) == workers
        assert set(now) <= alive_node_ids()
    finally:
        rollouts.close()
