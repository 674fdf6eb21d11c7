"""The trainable policy (frozen base + one LoRA adapter per agent) and generation backends.

Importing this package does not import torch, transformers or peft; they load on first use.
"""

from multiminddev.policy.chat import encode_chat, render_chat
from multiminddev.policy.generation import (
    FinishReason,
    GenerationBackend,
    GenerationOutput,
    HFGenerationBackend,
    LogprobSource,
    SamplingParams,
    release_compiled_decoding,
)
from multiminddev.policy.logprobs import position_ids_from_mask, token_logprobs
from multiminddev.policy.model import (
    Policy,
    PolicyConfig,
    PolicyError,
    adapter_paths_in,
    build_policy,
    build_separate_policy,
    default_model_path,
    load_base_model,
    load_policy,
    load_tokenizer,
)

__all__ = [
    "FinishReason",
    "GenerationBackend",
    "GenerationOutput",
    "HFGenerationBackend",
    "LogprobSource",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "SamplingParams",
    "adapter_paths_in",
    "build_policy",
    "build_separate_policy",
    "default_model_path",
    "encode_chat",
    "load_base_model",
    "load_policy",
    "load_tokenizer",
    "position_ids_from_mask",
    "release_compiled_decoding",
    "render_chat",
    "token_logprobs",
]
