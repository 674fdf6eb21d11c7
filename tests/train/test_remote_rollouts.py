"""GRPO with its rollouts sampled by this project's own OpenAI-compatible server (real HTTP,
uvicorn in a thread) over a tiny real Llama with the SmolLM2 tokenizer; the learner holds the
same base in this process; compile-only evaluation; one GRPO step."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from multiminddev.agents.roles import AgentRole
from multiminddev.train.remote_rollouts import (
    RemoteRollouts,
    StaleAdapters,
    base_model_name,
)
from tests.policy.helpers import save_tiny_model
from tests.problems import RELU_1024
from tests.serve.server_helpers import UvicornThread

FIXED_PROMPT = "Write a CUDA kernel that adds two vectors."


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    from multiminddev.serve import ServeConfig, create_app
    from multiminddev.serve.metrics import ServeMetrics, install_metrics

    # The learner publishes adapters under its run folders, which lie below pytest's base
    # temporary folder: the server may read adapters there and nowhere else.
    app = create_app(ServeConfig(model=str(tiny_model_dir), device="cpu",
                                 adapter_roots=[str(tmp_path_factory.getbasetemp())]))
    install_metrics(app, ServeMetrics())  # counts the server's requests
    running = UvicornThread(app).start()
    yield running
    running.stop()


def completion_requests(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "mmd_http_requests_total"
               and s.labels.get("endpoint") == "/v1/completions")


def server_greedy(rollouts: RemoteRollouts, prompt: list[int]):
    """The server's greedy reply to ``prompt`` with the Generator's served adapter."""
    from multiminddev.policy import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    return asyncio.run(rollouts.backend.generate([prompt], sampling, AgentRole.GENERATOR))[0]


def learner_logprobs(policy, prompt: list[int], response: list[int]) -> list[float]:
    import torch

    from multiminddev.policy import token_logprobs

    ids = torch.tensor([prompt + response])
    with policy.use(AgentRole.GENERATOR) as model, torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def one_step(server, tiny_model_dir, tmp_path_factory):
    """One GRPO step whose rollout the server samples; what the tests compare is read here,
    around the step: the learner's log-probs of the sampled tokens with the weights that
    sampled them, and the server's and learner's greedy log-probs before and after."""
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import PolicyConfig, SamplingParams, encode_chat, load_policy
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.problem import load_problem_source
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer

    learner = load_policy(PolicyConfig(model=str(tiny_model_dir), device="cpu",
                                       agents=(AgentRole.GENERATOR,), lora_rank=4, lora_alpha=8))
    # peft starts LoRA B at zero (the adapter = the base); random B makes the served adapter
    # differ from the base and gives the KL term a gradient, so the update moves the adapter
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in learner.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    out = tmp_path_factory.mktemp("run")
    evaluator = Evaluator(EvalConfig(num_workers=1))
    rollouts = RemoteRollouts.connect(server.url, tokenizer=learner.tokenizer,
                                      evaluator=evaluator, output_dir=out,
                                      roles=(AgentRole.GENERATOR,))
    config = GRPOConfig(num_steps=1, problems_per_step=1, group_size=2, max_turns=1,
                        max_new_tokens=4, mini_batch_size=2, learning_rate=1e-2, eval_every=0,
                        train_roles=(AgentRole.GENERATOR,))
    episode_config = EpisodeConfig(max_turns=1, patience=0, max_format_failures=5,
                                   sampling=SamplingParams(temperature=1.0, max_new_tokens=4))
    problem = load_problem_source(RELU_1024, name="relu", tier=0)
    trainer = GRPOTrainer(config, policy=learner, backend=None, evaluator=evaluator,
                          curriculum=Curriculum.from_problems([problem]), rollouts=rollouts,
                          episode_config=episode_config, output_dir=out, compile_only=True)
    prompt = encode_chat(learner.tokenizer, [{"role": "user", "content": FIXED_PROMPT}])
    rollouts.publish(learner, 0)
    before = {"server": server_greedy(rollouts, prompt),
              "weights": {k: v.clone() for k, v in get_peft_model_state_dict(
                  learner.peft_model, adapter_name="generator").items()},
              "requests": completion_requests(server.url)}
    trainer.train()
    after = {k: v.clone() for k, v in get_peft_model_state_dict(
        learner.peft_model, adapter_name="generator").items()}
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    turns = [t for e in episodes for t in e["turns"]]
    # the learner's own log-probs of the sampled tokens with the weights that sampled them
    set_peft_model_state_dict(learner.peft_model, before["weights"], adapter_name="generator")
    sampled_by_learner = [learner_logprobs(learner, t["prompt_ids"], t["response_ids"])
                          for t in turns]
    set_peft_model_state_dict(learner.peft_model, after, adapter_name="generator")
    server_after = server_greedy(rollouts, prompt)
    yield {"trainer": trainer, "rollouts": rollouts, "before": before, "turns": turns,
           "sampled_by_learner": sampled_by_learner, "server_after": server_after,
           "learner_after": learner_logprobs(learner, prompt, server_after.token_ids),
           "requests_after": completion_requests(server.url), "prompt": prompt,
           "moved": any(not torch.equal(after[k], v) for k, v in before["weights"].items())}
    evaluator.close()


def test_the_rollouts_tokens_come_from_the_server(one_step):
    turns, rollouts = one_step["turns"], one_step["rollouts"]
    assert len(turns) == 2 and all(t["response_ids"] for t in turns)
    # one completion request per episode's turn (plus the greedy probe after the step)
    assert one_step["requests_after"] - one_step["before"]["requests"] == len(turns) + 1
    assert rollouts.tokens_generated >= sum(len(t["response_ids"]) for t in turns)


def test_after_the_update_the_server_gives_the_learners_logprobs(one_step):
    assert one_step["moved"], "the update changed no adapter tensor; the comparison proves nothing"
    after = one_step["server_after"]
    assert after.logprobs == pytest.approx(one_step["learner_after"], abs=1e-3)
    before = one_step["before"]["server"]
    assert (after.token_ids != before.token_ids
            or after.logprobs != pytest.approx(before.logprobs, abs=1e-3))


def test_the_servers_old_logprobs_are_the_learners_before_the_update(one_step):
    for turn, learner in zip(one_step["turns"], one_step["sampled_by_learner"]):
        assert turn["logprobs"] == pytest.approx(learner, abs=1e-3)


def test_each_step_records_the_weights_that_sampled_it_and_old_versions_go(one_step):
    trainer, rollouts = one_step["trainer"], one_step["rollouts"]
    assert trainer.history[0]["weights_version"] == 0  # sampled before the step's update
    assert rollouts.version == trainer.step == 1
    folders = sorted(p.name for p in (trainer.output_dir / "served_adapters").iterdir())
    assert folders == ["v1"]
    assert rollouts.served == {"generator": str(
        (trainer.output_dir / "served_adapters" / "v1" / "generator").resolve())}


def test_a_server_reloaded_by_someone_else_is_refused(one_step, tmp_path):
    from multiminddev.train.checkpoints import save_role

    rollouts = one_step["rollouts"]
    other = save_role(one_step["trainer"].policy, AgentRole.GENERATOR, tmp_path)
    asyncio.run(rollouts.backend.reload_adapters({"generator": str(other)}))
    try:
        with pytest.raises(StaleAdapters, match="not .*v1"):
            rollouts.run_episodes([], 2, None)
    finally:
        asyncio.run(rollouts.backend.reload_adapters(rollouts.served))


def test_a_rollout_before_any_publish_is_refused(one_step, tmp_path):
    rollouts = RemoteRollouts(one_step["rollouts"].backend, None, output_dir=tmp_path)
    with pytest.raises(StaleAdapters, match="publish"):
        rollouts.run_episodes([], 2, None)


def test_the_base_model_is_the_entry_without_a_parent():
    cards = [{"id": "generator", "parent": "/m"}, {"id": "/m", "parent": None}]
    assert base_model_name(cards) == "/m"
    assert base_model_name([{"id": "base"}]) == "base"


# --------------------------------------------------------------------------- the command line

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, message", [
    (["--rollout-server", "localhost:8000"], "give http(s)://HOST:PORT"),
    (["--rollout-server", "http://127.0.0.1:1", "--ray"], "pick one"),
    (["--rollout-server", "http://127.0.0.1:{port}"], "start the server"),
])
def test_train_refuses_a_rollout_server_it_cannot_use_in_one_line(argv, message, tmp_path,
                                                                   capsys):
    from multiminddev.cli import main

    out = tmp_path / "run"
    argv = [a.format(port=free_port()) for a in argv]
    assert main(["train", "--output-dir", str(out), *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_train_with_a_rollout_server_samples_every_step_there(server, tiny_model_dir, tmp_path):
    """The product path: ``train --rollout-server URL`` (no SFT, one GRPO step)."""
    from multiminddev.cli import main

    out, requests = tmp_path / "run", completion_requests(server.url)
    assert main(["train", "--model", str(tiny_model_dir), "--preset", "quick-test",
                 "--skip-sft", "--skip-eval", "--num-steps", "1", "--batch-size", "1",
                 "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "4",
                 "--lora-rank", "4", "--compiled-decoding", "off", "--output-dir", str(out),
                 "--rollout-server", server.url]) == 0
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["weights_version"] == 0 and record["episodes"] == 2
    assert completion_requests(server.url) - requests == 2  # one per episode's single turn
    assert [p.name for p in (out / "served_adapters").iterdir()] == ["v1"]
