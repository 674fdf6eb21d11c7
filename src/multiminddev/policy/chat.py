"""Chat messages -> prompt token ids with the tokenizer's own chat template."""

from __future__ import annotations

from typing import Any


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text, ending where the assistant's reply starts."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # Base models without a template: a plain transcript the model can continue.
    lines = [f"{m['role'].upper()}:\n{m['content']}\n" for m in messages]
    return "\n".join(lines) + "\nASSISTANT:\n"


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids. The template already carries BOS/role tokens, so none are added."""
    text = render_chat(tokenizer, messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_REPLY_MARK = "MMD_REPLY_END_MARK"


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """Token ids that end an assistant reply: the EOS token and the special token the chat
    template writes right after a reply (``<|im_end|>`` for ChatML models).

    Generation must stop at both. Tokenizers converted from GGUF do not always name the
    template's end-of-turn token as EOS (one transformers version read SmolLM2's EOS as
    ``<|im_start|>``); the model then wrote ``<|im_end|>`` and went on until the length limit,
    and those tokens were trained on as if they were part of the reply.
    """
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _REPLY_MARK}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that cannot render a reply: EOS alone
            text = ""
        if _REPLY_MARK in text:
            tail = text.split(_REPLY_MARK, 1)[1]
            tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
            if tail_ids and tail_ids[0] in special and tail_ids[0] not in ids:
                ids.append(int(tail_ids[0]))
    return tuple(ids)
