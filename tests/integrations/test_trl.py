import math

import pytest

trl = pytest.importorskip("trl")

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.integrations.episode_env import run_rollouts
from multiminddev.integrations.trl import (
    KernelReward,
    KernelRolloutFunc,
    kernel_dataset,
    prompt_key,
    rollout_batch,
)
from multiminddev.rewards import RewardConfig
from tests.episode.helpers import ReplayBackend, relu_problem
from tests.integrations.helpers import broken_then_fixed, embedded_backend, env_config
from tests.policy.helpers import gguf_tokenizer, tiny_base_model


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as ev:
        yield ev


@pytest.fixture(scope="module")
def replayed_batch(evaluator):
    backend = ReplayBackend(gguf_tokenizer(), broken_then_fixed)
    rollouts = run_rollouts([relu_problem()], backend, evaluator, env_config(), group_size=2)
    return rollout_batch(rollouts)


def test_batch_has_trl_keys_of_matching_lengths(replayed_batch):
    batch = replayed_batch
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask"} <= set(batch)
    for ids, lps, mask in zip(batch["completion_ids"], batch["logprobs"], batch["env_mask"]):
        assert len(ids) == len(lps) == len(mask)
        assert set(mask) == {0, 1}


def test_kernel_reward_reproduces_the_rollout_reward(replayed_batch):
    reward = KernelReward.from_config(env_config())
    n = len(replayed_batch["completion_ids"])
    values = reward([None] * n, [None] * n, kernel_turns=replayed_batch["kernel_turns"])
    assert values == pytest.approx(replayed_batch["kernel_reward"])


def test_kernel_reward_scores_with_its_own_reward_config(replayed_batch):
    """Another reward over the same EvalResults: a larger compile credit pays more."""
    n = len(replayed_batch["completion_ids"])
    base = KernelReward()([None] * n, [None] * n, kernel_turns=replayed_batch["kernel_turns"])
    richer = KernelReward(RewardConfig(compile_credit=0.5))(
        [None] * n, [None] * n, kernel_turns=replayed_batch["kernel_turns"])
    assert all(r > b for r, b in zip(richer, base))


def test_rollout_func_rejects_a_prompt_of_another_problem(evaluator):
    rollout = KernelRolloutFunc([relu_problem()], evaluator, env_config())
    with pytest.raises(KeyError, match="kernel_dataset"):
        rollout.problem_for([{"role": "user", "content": "something else"}])


def test_grpo_trainer_trains_a_step_on_episodes(evaluator, tmp_path):
    """TRL's own GRPOTrainer: two episodes of two turns, one update; TRL counts only the
    env_mask=1 tokens as completion tokens. The trained model is a tiny random Llama with the
    embedded model's tokenizer (an update of the 135M model costs minutes on a shared CPU;
    examples/trl_grpo.py trains that one)."""
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = tiny_base_model(), gguf_tokenizer()
    problem = relu_problem()
    env = env_config()
    rollout = KernelRolloutFunc([problem], evaluator, env)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=2048, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, learning_rate=1e-6)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          reward_funcs=[KernelReward.from_config(env)],
                          train_dataset=kernel_dataset([problem]), rollout_func=rollout)
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "rewards/kernel_reward/mean" in e)
    assert math.isfinite(logged["rewards/kernel_reward/mean"])
    rollouts = rollout.last_rollouts
    assert len(rollouts) == 2
    policy_tokens = [sum(r.response_mask) for r in rollouts]
    assert logged["completions/mean_length"] == pytest.approx(sum(policy_tokens) / 2)
    assert logged["rewards/kernel_reward/mean"] == pytest.approx(
        sum(r.reward for r in rollouts) / 2)


def test_dataset_prompts_are_the_rollout_keys():
    problem = relu_problem()
    rollout = KernelRolloutFunc([problem], evaluator=None, config=env_config())
    (row,) = kernel_dataset([problem])
    assert rollout.problem_for(row["prompt"]) == problem
    assert prompt_key(row["prompt"]) in rollout.problems


def test_rollout_func_on_the_embedded_model(evaluator):
    """The rollout function generating with our HF backend on the embedded model: one
    completion per prompt row, TRL's keys aligned, log-probs of the policy's tokens finite."""
    problem = relu_problem()
    backend = embedded_backend()
    rollout = KernelRolloutFunc([problem], evaluator, env_config(), backend=backend)
    (row,) = kernel_dataset([problem])
    batch = rollout([row["prompt"], row["prompt"]], trainer=None)
    assert len(batch["completion_ids"]) == 2
    for ids, lps, mask, turns in zip(batch["completion_ids"], batch["logprobs"],
                                     batch["env_mask"], batch["kernel_turns"]):
        assert len(ids) == len(lps) == len(mask)
        assert len(turns) == 2 and sum(mask) <= 8  # two replies of at most 4 tokens
        assert all(math.isfinite(lp) and lp <= 0.0 for lp, m in zip(lps, mask) if m)
    assert all(math.isfinite(r) for r in batch["kernel_reward"])


@pytest.mark.gpu
@pytest.mark.slow
def test_example_script_trains_the_embedded_model_on_a_gpu(tmp_path):
    """examples/trl_grpo.py: two GRPO steps of the embedded model (LoRA) on real evaluations;
    every step logs a finite reward."""
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_example", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rc = example.main(["--steps", "2", "--limit", "2", "--num-generations", "2",
                       "--prompts-per-step", "1", "--max-new-tokens", "128",
                       "--output-dir", str(tmp_path)])
    assert rc == 0
    history = json.loads((tmp_path / "log_history.json").read_text())
    rewards = [e["rewards/kernel_reward/mean"] for e in history
               if "rewards/kernel_reward/mean" in e]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)


def test_rollout_func_generates_through_our_openai_compatible_server(evaluator):
    """The same rollout function with its policy behind HTTP: this project's ``serve`` on the
    embedded model, reached by the remote generation backend (as a vLLM server would be)."""
    pytest.importorskip("fastapi")
    from multiminddev.policy import PolicyConfig, load_tokenizer
    from multiminddev.policy.remote import OpenAIGenerationBackend
    from multiminddev.serve import ServeConfig, create_app
    from tests.policy.helpers import require_default_model
    from tests.serve.server_helpers import UvicornThread

    require_default_model()
    server = UvicornThread(create_app(ServeConfig(device="cpu"))).start()
    try:
        tokenizer = load_tokenizer(PolicyConfig(model="default"))
        backend = OpenAIGenerationBackend(base_url=f"{server.url}/v1", tokenizer=tokenizer)
        problem = relu_problem()
        rollout = KernelRolloutFunc([problem], evaluator, env_config(), backend=backend)
        (row,) = kernel_dataset([problem])
        batch = rollout([row["prompt"]], trainer=None)
    finally:
        server.stop()
    (ids,), (lps,), (mask,) = batch["completion_ids"], batch["logprobs"], batch["env_mask"]
    assert len(ids) == len(lps) == len(mask) and 0 < sum(mask) <= 8
    assert all(math.isfinite(lp) and lp <= 0.0 for lp, m in zip(lps, mask) if m)
    assert math.isfinite(batch["kernel_reward"][0])
