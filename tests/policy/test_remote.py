"""``OpenAIGenerationBackend`` against this project's own server (real HTTP, the embedded
model on the CPU), compared with the in-process backend on the same adapter."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import SamplingParams, encode_chat
from multiminddev.policy.remote import (
    OpenAIGenerationBackend,
    RemoteGenerationError,
    token_id,
)
from tests.policy.helpers import require_default_model
from tests.serve.server_helpers import UvicornThread, make_adapter

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
MESSAGES = [{"role": "user", "content": "Write a CUDA kernel that adds two vectors."}]


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    require_default_model()
    return make_adapter(tmp_path_factory.mktemp("adapter") / "tuned")


@pytest.fixture(scope="module")
def server(adapter_dir, tmp_path_factory):
    from multiminddev.serve import ServeConfig, create_app

    # Adapters reloaded by the tests lie below pytest's base temporary folder.
    config = ServeConfig(device="cpu", adapters={"generator": str(adapter_dir)},
                         adapter_roots=[str(tmp_path_factory.getbasetemp())])
    running = UvicornThread(create_app(config)).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tokenizer(server):
    return server.app.state.registry.tokenizer


def backend_for(server, tokenizer, **kwargs):
    return OpenAIGenerationBackend(base_url=server.url, tokenizer=tokenizer,
                                   models={"generator": "generator"}, **kwargs)


def generate(server, tokenizer, prompts, sampling, role=AgentRole.GENERATOR, **kwargs):
    async def go():
        backend = backend_for(server, tokenizer, **kwargs)
        try:
            return await backend.generate(prompts, sampling, role)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_token_id_reads_vllm_labels():
    assert token_id("token_id:42") == 42
    with pytest.raises(RemoteGenerationError):
        token_id("hello")


def test_outputs_carry_token_ids_logprobs_and_their_text(server, tokenizer):
    prompt = encode_chat(tokenizer, MESSAGES)
    (out,) = generate(server, tokenizer, [prompt], GREEDY)
    assert 0 < len(out.token_ids) == len(out.logprobs) <= GREEDY.max_new_tokens
    assert all(lp <= 0 for lp in out.logprobs)
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_samples_come_prompt_by_prompt(server, tokenizer):
    prompts = [encode_chat(tokenizer, MESSAGES), tokenizer("def f(x):")["input_ids"]]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3, n=2, seed=0)
    outputs = generate(server, tokenizer, prompts, sampling)
    assert [o.prompt_index for o in outputs] == [0, 0, 1, 1]


def test_logprobs_match_the_in_process_backend(server, tokenizer, adapter_dir):
    """The remote greedy reply, re-scored by the in-process policy with the same adapter."""
    import torch

    from multiminddev.policy import PolicyConfig, load_policy, token_logprobs

    prompt = encode_chat(tokenizer, MESSAGES)
    (remote,) = generate(server, tokenizer, [prompt], GREEDY)
    policy = load_policy(PolicyConfig(device="cpu", agents=(AgentRole.GENERATOR,),
                                      adapter_paths={"generator": str(adapter_dir)}))
    ids = torch.tensor([prompt + remote.token_ids])
    with policy.use(AgentRole.GENERATOR) as model, torch.no_grad():
        local = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].tolist()
    assert remote.logprobs == pytest.approx(local, abs=1e-3)


def test_one_backend_serves_one_event_loop_after_another(server, tokenizer):
    """As LocalRollouts and RemoteRollouts use it: each rollout under its own asyncio.run."""
    backend = backend_for(server, tokenizer)
    prompt = encode_chat(tokenizer, MESSAGES)
    first = asyncio.run(backend.generate([prompt], GREEDY, AgentRole.GENERATOR))
    second = asyncio.run(backend.generate([prompt], GREEDY, AgentRole.GENERATOR))
    assert first[0].token_ids == second[0].token_ids and first[0].token_ids
    assert backend.tokens_generated == 2 * len(first[0].token_ids)


def test_the_role_picks_the_model(server, tokenizer):
    prompt = encode_chat(tokenizer, MESSAGES)
    (tuned,) = generate(server, tokenizer, [prompt], GREEDY, role=AgentRole.GENERATOR)
    (base,) = generate(server, tokenizer, [prompt], GREEDY, role=AgentRole.OPTIMIZER)
    assert tuned.logprobs != pytest.approx(base.logprobs, abs=1e-3)


def test_reload_adapters_serves_the_new_weights(server, tokenizer, tmp_path):
    prompt = encode_chat(tokenizer, MESSAGES)
    (before,) = generate(server, tokenizer, [prompt], GREEDY)
    update = make_adapter(tmp_path / "step_1", seed=7)

    async def reload():
        backend = backend_for(server, tokenizer)
        try:
            await backend.reload_adapters({"generator": str(update)})
            return await backend.list_models()
        finally:
            await backend.aclose()

    assert asyncio.run(reload()) == ["base", "generator"]
    (after,) = generate(server, tokenizer, [prompt], GREEDY)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)


def test_a_server_error_says_what_the_server_said(server, tokenizer):
    async def unknown_model():
        backend = OpenAIGenerationBackend(base_url=server.url, tokenizer=tokenizer,
                                          default_model="nope")
        try:
            await backend.generate([[1, 2, 3]], GREEDY, AgentRole.OPTIMIZER)
        finally:
            await backend.aclose()

    with pytest.raises(RemoteGenerationError, match="not loaded"):
        asyncio.run(unknown_model())


@pytest.mark.gpu
def test_logprobs_match_the_in_process_backend_on_the_gpu(adapter_dir):
    """On CUDA (bfloat16): a server on the GPU, its greedy replies re-scored in-process."""
    import torch

    from multiminddev.policy import PolicyConfig, load_policy, token_logprobs
    from multiminddev.serve import ServeConfig, create_app

    config = ServeConfig(device="cuda", adapters={"generator": str(adapter_dir)})
    running = UvicornThread(create_app(config)).start()
    try:
        tokenizer = running.app.state.registry.tokenizer
        prompt = encode_chat(tokenizer, MESSAGES)
        sampling = SamplingParams(temperature=0.0, max_new_tokens=64)
        (remote,) = generate(running, tokenizer, [prompt], sampling)
    finally:
        running.stop()
    policy = load_policy(PolicyConfig(device="cuda", agents=(AgentRole.GENERATOR,),
                                      adapter_paths={"generator": str(adapter_dir)}))
    ids = torch.tensor([prompt + remote.token_ids], device=policy.device)
    with policy.use(AgentRole.GENERATOR) as model, torch.no_grad():
        local = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].tolist()
    assert remote.logprobs == pytest.approx(local, abs=5e-2)


def test_equal_prompts_get_their_own_samples_under_one_seed(server, tokenizer):
    prompt = encode_chat(tokenizer, MESSAGES)
    sampling = SamplingParams(temperature=1.5, max_new_tokens=12, seed=3)
    first, second = generate(server, tokenizer, [prompt, prompt], sampling)
    assert first.token_ids != second.token_ids
