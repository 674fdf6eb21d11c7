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
