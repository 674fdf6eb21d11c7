"""SFT: assistant-only labels from the chat template; a few steps lower the loss."""

from __future__ import annotations

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.train.sft import IGNORE_INDEX, SFTConfig, SFTStatus, run_sft, tokenize_chat
from tests.policy.helpers import gguf_tokenizer, tiny_policy

EXAMPLES = [
    [{"role": "user", "content": f"Write a kernel that adds {i}."},
     {"role": "assistant", "content": f"```python\nclass ModelNew: pass  # add {i}\n```"}]
    for i in range(4)
]


def test_labels_cover_only_assistant_tokens():
    tok = gguf_tokenizer()
    enc = tokenize_chat(tok, EXAMPLES[0], max_len=4096)
    labelled = [t for t, lab in zip(enc["input_ids"], enc["labels"]) if lab != IGNORE_INDEX]
    text = tok.decode(labelled)
    assert "class ModelNew: pass  # add 0" in text
    assert "Write a kernel" not in text and "system" not in text


def test_multi_turn_labels_every_assistant_message():
    tok = gguf_tokenizer()
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "first reply"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "second reply"}]
    enc = tokenize_chat(tok, msgs, max_len=4096)
    text = tok.decode([t for t, lab in zip(enc["input_ids"], enc["labels"]) if lab != IGNORE_INDEX])
    assert "first reply" in text and "second reply" in text and "user" not in text


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="batch_size"):
        SFTConfig(batch_size=0)
    with pytest.raises(ValueError, match="exclude"):
        SFTConfig(full_finetune=True, qlora=True)


def test_sft_on_four_examples_lowers_loss_and_saves_adapter(tmp_path):
    from datasets import Dataset

    policy = tiny_policy()
    before = [p.detach().clone() for p in policy.trainable_parameters(AgentRole.OPTIMIZER)]
    cfg = SFTConfig(output_dir=tmp_path, max_steps=12, batch_size=4, learning_rate=5e-3,
                    logging_steps=4, report_to=())
    result = run_sft(AgentRole.GENERATOR, policy.config, Dataset.from_dict({"messages": EXAMPLES}),
                     cfg, policy=policy)
    assert result.status is SFTStatus.OK
    assert result.loss_after < result.loss_before
    assert (tmp_path / "sft_checkpoints" / "generator" / "adapter_config.json").exists()
    after = policy.trainable_parameters(AgentRole.OPTIMIZER)
    assert all((a == b).all() for a, b in zip(before, after)), "the other agent's adapter moved"


def test_sft_counts_the_examples_cut_at_max_seq_length(tmp_path):
    """A reply cut at max_seq_length loses its end; run_sft says how many were cut."""
    from datasets import Dataset

    tok = gguf_tokenizer()
    lengths = [len(tokenize_chat(tok, m, 4096)["input_ids"]) for m in EXAMPLES]
    limit = min(lengths) - 2  # every example is longer; dropped == 0: each keeps reply tokens
    cfg = SFTConfig(output_dir=tmp_path, max_steps=1, batch_size=4, max_seq_length=limit,
                    report_to=())
    policy = tiny_policy()
    result = run_sft(AgentRole.GENERATOR, policy.config,
                     Dataset.from_dict({"messages": EXAMPLES}), cfg, policy=policy)
    assert (result.status, result.truncated, result.dropped) == (SFTStatus.OK, 4, 0)
    roomy = SFTConfig(output_dir=tmp_path / "roomy", max_steps=1, batch_size=4,
                      max_seq_length=max(lengths), report_to=())
    policy = tiny_policy()
    assert run_sft(AgentRole.GENERATOR, policy.config, Dataset.from_dict({"messages": EXAMPLES}),
                   roomy, policy=policy).truncated == 0  # exactly at the limit is not cut


@pytest.mark.parametrize("num_items", [None, 17])
def test_logits_from_labels_gives_the_whole_sequences_loss_and_gradients(num_items):
    """The trimmed batch (logits only from before the first assistant token) scores the same
    loss and gradients as the whole sequence, for the model's own causal-LM loss, with and
    without the Trainer's token count for gradient accumulation."""
    import torch

    from multiminddev.train.sft import collate_examples

    tok = gguf_tokenizer()
    examples = [tokenize_chat(tok, EXAMPLES[0], 4096),  # rows of different lengths and prompts
                tokenize_chat(tok, [{"role": "user", "content": "a much longer request " * 6},
                                    *EXAMPLES[1][1:]], 4096)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    whole = collate_examples(pad)(examples)
    trimmed = collate_examples(pad, logits_from_labels=True)(examples)
    width = whole["input_ids"].shape[1]
    assert 0 < trimmed["logits_to_keep"] < width / 2  # most positions are prompt
    assert trimmed["labels"].shape == (2, trimmed["logits_to_keep"])
    assert int((trimmed["labels"] != IGNORE_INDEX).sum()) == int((whole["labels"] != IGNORE_INDEX).sum())
    model = tiny_policy().peft_model
    model.train()
    extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    results = []
    for batch in (whole, trimmed):
        model.zero_grad()
        loss = model(**batch, **extra).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                         if p.grad is not None}))
    (loss_whole, grads_whole), (loss_trimmed, grads_trimmed) = results
    torch.testing.assert_close(loss_trimmed, loss_whole, rtol=1e-5, atol=1e-6)
    assert grads_whole and grads_whole.keys() == grads_trimmed.keys()
    for name, grad in grads_whole.items():
        torch.testing.assert_close(grads_trimmed[name], grad, rtol=1e-4, atol=1e-6)


def test_a_batch_with_no_assistant_token_is_left_whole():
    from multiminddev.train.sft import collate_examples

    batch = collate_examples(0, logits_from_labels=True)(
        [{"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX] * 3}])
    assert "logits_to_keep" not in batch and batch["labels"].shape == (1, 3)
