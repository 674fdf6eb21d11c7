"""LoRA adapters over a base loaded from disk, in float (CPU) and in 4-bit NF4 (QLoRA, GPU).

The base is a tiny random Llama saved with ``save_pretrained`` and a word-level tokenizer, so
the test needs neither the embedded GGUF nor a hub. The 4-bit case needs a CUDA GPU and
bitsandbytes (``pip install bitsandbytes``; skipped without it).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.policy.model import PolicyConfig, build_policy, load_base_model

G, O = AgentRole.GENERATOR, AgentRole.OPTIMIZER
VOCAB = 128


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _saved_tiny_llama(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    _word_tokenizer().save_pretrained(path)
    return path


def _one_generator_step(policy, device):
    """One AdamW step on the Generator's adapter: (loss, Generator moved, Optimizer moved)."""
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    generator_params = policy.trainable_parameters(G)
    optimizer_before = [p.detach().clone() for p in policy.trainable_parameters(O)]
    generator_before = [p.detach().clone() for p in generator_params]
    opt = torch.optim.AdamW(generator_params, lr=1e-2)
    with policy.use(G) as model:
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    opt.step()
    moved = any(not torch.equal(b, p.detach()) for b, p in zip(generator_before, generator_params))
    other = any(not torch.equal(b, p.detach())
                for b, p in zip(optimizer_before, policy.trainable_parameters(O)))
    return float(loss), moved, other


def test_lora_over_a_saved_float_base_trains_one_adapter(tmp_path):
    cfg = PolicyConfig(model=str(_saved_tiny_llama(tmp_path)), device="cpu", dtype="float32",
                       lora_rank=4, lora_alpha=8, merged_sampling=False)
    policy = build_policy(load_base_model(cfg), _word_tokenizer(), cfg)
    loss, moved, other = _one_generator_step(policy, "cpu")
    assert torch.isfinite(torch.tensor(loss)) and moved and not other


@pytest.mark.gpu
def test_qlora_trains_adapters_over_a_4bit_base(tmp_path):
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed: pip install bitsandbytes")
    cfg = PolicyConfig(model=str(_saved_tiny_llama(tmp_path)), device="cuda", dtype="bfloat16",
                       lora_rank=4, lora_alpha=8, load_in_4bit=True)
    policy = build_policy(load_base_model(cfg), _word_tokenizer(), cfg)
    four_bit = [m for m in policy.peft_model.modules() if type(m).__name__ == "Linear4bit"]
    assert four_bit, "the base's projections should be bitsandbytes Linear4bit layers"
    assert all(not p.requires_grad for m in four_bit for p in m.parameters(recurse=False))
    loss, moved, other = _one_generator_step(policy, "cuda")
    assert torch.isfinite(torch.tensor(loss)) and moved and not other
    ids = torch.randint(2, VOCAB, (1, 8), device="cuda")
    with torch.no_grad(), policy.use(G) as model:
        adapted = model(input_ids=ids).logits
    with torch.no_grad(), policy.reference() as ref:
        base = ref(input_ids=ids).logits
    assert not torch.equal(adapted, base)  # the KL reference is the 4-bit base, adapters off
