"""Shared pieces of the integration tests: the embedded model (loaded once per process), the
episode settings the tests run with, and replayed kernels for compile-only rewards."""

from __future__ import annotations

import functools

from multiminddev.agents.roles import AgentRole
from multiminddev.episode.runner import EpisodeConfig
from multiminddev.integrations.episode_env import KernelEnvConfig
from multiminddev.policy import SamplingParams
from multiminddev.rewards import RewardConfig
from tests.episode.helpers import BROKEN_KERNEL, RELU_KERNEL, fenced
from tests.policy.helpers import require_default_model

G, O = AgentRole.GENERATOR, AgentRole.OPTIMIZER


@functools.cache
def _embedded():
    import torch
    from transformers import AutoModelForCausalLM

    from multiminddev.policy import PolicyConfig, default_model_path, load_tokenizer

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    # dequantized on load: nothing is quantized any more (the Trainer refuses quantized models)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    return model, load_tokenizer(PolicyConfig(model="default"))


def embedded_model():
    """(model, tokenizer) of the embedded SmolLM2-135M, float32 on the CPU, shared by tests."""
    require_default_model()
    return _embedded()


def embedded_backend():
    """The GenerationBackend the integration tests generate with: our in-process HF backend on
    the embedded model. (An OpenAI-compatible server on the same model,
    ``policy.remote.OpenAIGenerationBackend``, can take its place here.)"""
    from multiminddev.integrations.episode_env import SharedModelPolicy
    from multiminddev.policy import HFGenerationBackend

    model, tokenizer = embedded_model()
    return HFGenerationBackend(SharedModelPolicy(model, tokenizer))


def env_config(*, max_turns: int = 2, max_new_tokens: int = 4, max_response_tokens: int = 4096,
               **kwargs) -> KernelEnvConfig:
    """Tiny episodes: few turns, few tokens per reply, every turn run (patience 0)."""
    return KernelEnvConfig(
        episode=EpisodeConfig(max_turns=max_turns, patience=0, reward=RewardConfig(),
                              sampling=SamplingParams(temperature=1.0,
                                                      max_new_tokens=max_new_tokens, seed=0)),
        max_response_tokens=max_response_tokens, **kwargs)


def broken_then_fixed(role: AgentRole, call: int, prompt: int) -> str:
    """Replies for ReplayBackend: a kernel that fails to compile (the first generate call: the
    first turn), then one that compiles. By call, not role: verl's servers are not told it."""
    return fenced(BROKEN_KERNEL if call == 0 else RELU_KERNEL)
