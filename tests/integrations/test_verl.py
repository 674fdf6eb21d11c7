"""verl's agent loop with verl's own classes. verl pins an older transformers than the rest of
the project: these tests run in a virtual environment of their own
(tests/integrations/verl_env.sh) and are skipped where verl is not installed."""

import asyncio
import math

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from multiminddev.agents.roles import AgentRole
from multiminddev.integrations.verl import KernelAgentLoop, shared_evaluator
from multiminddev.integrations.verl_data import (
    AGENT_NAME,
    problem_from_extra_info,
    write_verl_dataset,
)
from multiminddev.policy import SamplingParams
from multiminddev.rewards import RewardConfig
from tests.episode.helpers import ReplayBackend, relu_problem
from tests.integrations.helpers import broken_then_fixed, embedded_backend
from tests.policy.helpers import gguf_tokenizer

PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 2048


class BackendServer:
    """verl's server-manager interface (``generate(request_id, prompt_ids=, sampling_params=)
    -> TokenOutput``) served by one of our generation backends in this process, where verl
    would call a vLLM or SGLang replica."""

    def __init__(self, backend):
        self.backend = backend
        self.requests = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append((request_id, dict(sampling_params)))
        sampling = SamplingParams(temperature=sampling_params["temperature"],
                                  top_p=sampling_params["top_p"],
                                  max_new_tokens=sampling_params["max_tokens"], seed=0)
        (out,) = await self.backend.generate([prompt_ids], sampling, AgentRole.GENERATOR)
        # log-probs only when asked (verl's rollout.calculate_log_probs), as vLLM answers
        return TokenOutput(token_ids=out.token_ids,
                           log_probs=out.logprobs if sampling_params.get("logprobs") else None,
                           stop_reason="completed")


def trainer_config():
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LENGTH,
                                          "response_length": RESPONSE_LENGTH}},
        "data": {"max_prompt_length": PROMPT_LENGTH, "return_raw_chat": True,
                 "filter_overlong_prompts": True},
    })


def agent_loop(server, tokenizer, **settings) -> KernelAgentLoop:
    """The loop as verl's AgentLoopWorker builds it: from the registry, by name."""
    import hydra

    config = trainer_config()
    return hydra.utils.instantiate(
        config={**_agent_loop_registry[AGENT_NAME], **settings},
        trainer_config=DictConfigWrap(config=config), server_manager=server,
        tokenizer=tokenizer, processor=None, hf_model_type="llama", dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data))


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
            "logprobs": True}


def run_loop(loop, problem, sampling=SAMPLING) -> AgentLoopOutput:
    from multiminddev.integrations.verl_data import verl_row

    row = verl_row(problem, 0)
    return asyncio.run(loop.run(dict(sampling), raw_prompt=row["prompt"],
                                extra_info=row["extra_info"], data_source=row["data_source"]))


@pytest.fixture(scope="module")
def evaluator():
    # the loop's own per-process evaluator, with these settings
    return shared_evaluator(num_workers=1, num_trials=2)


@pytest.fixture(scope="module")
def replayed_output(evaluator):
    server = BackendServer(ReplayBackend(gguf_tokenizer(), broken_then_fixed))
    loop = agent_loop(server, gguf_tokenizer(), max_turns=2, patience=0, eval_workers=1,
                      eval_trials=2)
    return run_loop(loop, relu_problem()), loop


def test_loop_is_registered_by_name():
    assert _agent_loop_registry[AGENT_NAME]["_target_"].endswith("KernelAgentLoop")


def test_output_masks_the_tester_report(replayed_output):
    out, _ = replayed_output
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert len(out.response_ids) <= RESPONSE_LENGTH
    mask = out.response_mask
    first_zero = mask.index(0)
    assert mask[0] == 1 and 0 in mask and mask[-1] == 1 and 1 in mask[first_zero:]
    assert out.num_turns == 4  # the user prompt, two replies and the report between them


def test_reward_comes_from_compile_only_evaluations(replayed_output):
    out, loop = replayed_output
    assert loop.evaluator is not None
    credit = RewardConfig().compile_credit
    assert out.extra_fields["kernel_metrics"]["compiled_any"] == 1.0
    assert math.isfinite(out.reward_score)
    assert len(out.extra_fields["turn_scores"]) == 2
    assert max(out.extra_fields["turn_scores"]) <= credit + 1e-9


def test_output_converts_to_verl_tensors(replayed_output):
    out, _ = replayed_output
    tensors = out.as_dict()
    assert tensors["responses"].shape == tensors["response_mask"].shape
    assert tensors["rm_scores"][-1].item() == pytest.approx(out.reward_score)
    assert tensors["rollout_log_probs"].shape == tensors["responses"].shape


def test_sampling_follows_verl_with_the_turn_token_cap(replayed_output):
    _, loop = replayed_output
    server = loop.server_manager
    assert len(server.requests) == 2
    for _, params in server.requests:
        assert params["temperature"] == SAMPLING["temperature"] and params["top_k"] == -1
        assert params["max_tokens"] <= 1024


def test_no_server_logprobs_leave_them_to_verl(evaluator):
    server = BackendServer(ReplayBackend(gguf_tokenizer(), broken_then_fixed))
    loop = agent_loop(server, gguf_tokenizer(), max_turns=1, eval_workers=1, eval_trials=2)
    out = run_loop(loop, relu_problem(), {**SAMPLING, "logprobs": False})
    assert out.response_logprobs is None and out.response_ids


def test_embedded_model_through_the_server_interface(evaluator):
    backend = embedded_backend()
    server = BackendServer(backend)
    loop = agent_loop(server, backend.tokenizer, max_turns=2, max_new_tokens=4, patience=0,
                      eval_workers=1, eval_trials=2)
    out = run_loop(loop, relu_problem())
    assert sum(out.response_mask) <= 8  # two replies of at most 4 tokens
    assert len(out.response_ids) == len(out.response_mask)
    own = [lp for lp, m in zip(out.response_logprobs, out.response_mask) if m]
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in own)
    assert math.isfinite(out.reward_score)


def test_the_loop_generates_through_our_openai_compatible_server(evaluator):
    """verl's server interface in front of this project's ``serve`` (real HTTP, the embedded
    model), reached by the remote generation backend: the same masks and a finite reward."""
    pytest.importorskip("fastapi")
    from multiminddev.policy import PolicyConfig, load_tokenizer
    from multiminddev.policy.remote import OpenAIGenerationBackend
    from multiminddev.serve import ServeConfig, create_app
    from tests.policy.helpers import require_default_model
    from tests.serve.server_helpers import UvicornThread

    require_default_model()
    running = UvicornThread(create_app(ServeConfig(device="cpu"))).start()
    try:
        tokenizer = load_tokenizer(PolicyConfig(model="default"))
        backend = OpenAIGenerationBackend(base_url=f"{running.url}/v1", tokenizer=tokenizer)
        loop = agent_loop(BackendServer(backend), tokenizer, max_turns=2, max_new_tokens=4,
                          patience=0, eval_workers=1, eval_trials=2)
        out = run_loop(loop, relu_problem())
    finally:
        running.stop()
    assert 0 < sum(out.response_mask) <= 8
    assert len(out.response_ids) == len(out.response_mask)
    assert math.isfinite(out.reward_score)


def test_verl_dataset_reads_our_parquet(tmp_path):
    problems = [relu_problem("relu_a"), relu_problem("relu_b")]
    path = write_verl_dataset(problems, tmp_path / "train.parquet")
    config = trainer_config().data
    config.cache_dir = str(tmp_path / "cache")
    dataset = RLHFDataset(str(path), gguf_tokenizer(), config)
    assert len(dataset) == 2
    row = dataset[1]
    assert row["agent_name"] == AGENT_NAME
    assert problem_from_extra_info(row["extra_info"]) == problems[1]
    assert row["raw_prompt"][-1]["role"] == "user" and "relu_b" in row["raw_prompt"][-1]["content"]


def test_episode_status_is_recorded(replayed_output):
    out, _ = replayed_output
    assert out.extra_fields["kernel_status"] == "max_turns"  # both turns ran


def test_example_command_composes_with_verl_config():
    """Every override of examples/verl/run_qwen_grpo.sh is a key of verl's own trainer config."""
    import os
    import re
    import shlex
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir

    root = Path(__file__).resolve().parents[2]
    body = (root / "examples/verl/run_qwen_grpo.sh").read_text().split("verl.trainer.main_ppo")[1]
    words = shlex.split(body.replace("\\\n", " "))  # as the shell splits the command
    overrides = [re.sub(r"\$[A-Z]+", "x", w) for w in words if "=" in w and not w.startswith("$")]
    assert len(overrides) > 30
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_NAME


def test_example_agent_loop_settings_are_loop_keywords():
    import inspect
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (entry,) = OmegaConf.load(root / "examples/verl/agent_loop.yaml")
    assert entry.name == AGENT_NAME
    assert entry._target_ == _agent_loop_registry[AGENT_NAME]["_target_"]
    keywords = set(inspect.signature(KernelAgentLoop.__init__).parameters)
    assert set(entry) - {"name", "_target_"} <= keywords
