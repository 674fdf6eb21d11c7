"""Per-token log-probabilities: the one function sampling and training both use.

Using the same function for the logprobs recorded at sampling time and for the trainer's
recomputation keeps the importance ratio exactly 1 before the first update (no silent
sampler/trainer mismatch, the failure mode verl and vLLM users chase).
"""

from __future__ import annotations

from typing import Any


def position_ids_from_mask(attention_mask: Any) -> Any:
    """Positions that skip left padding (what ``generate`` uses), so padded rows score alike."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


def token_logprobs(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    *,
    temperature: float = 1.0,
    chunk_rows: int = 4,
) -> Any:
    """log p(x_t | x_<t) for every token, at sampling temperature ``temperature``.

    Shapes: input_ids, attention_mask [B, T] -> float32 [B, T], aligned with input_ids:
    ``out[b, t]`` is the log-prob of ``input_ids[b, t]`` given the tokens before it;
    ``out[:, 0]``, padded positions and the first real token after left padding are 0. Multiply by a loss mask of the same
    shape. The distribution is ``softmax(logits / temperature)`` in float32 (no top-p/top-k
    truncation). Gradients flow when called with grad enabled.
    """
    import torch

    if temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0, got {temperature}")
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).logits
    batch, length = input_ids.shape
    out = torch.zeros(batch, length, dtype=torch.float32, device=logits.device)
    # Row chunks bound the float32 copy of [B, T, V] logits (V ~ 50k-150k).
    for start in range(0, batch, chunk_rows):
        rows = slice(start, start + chunk_rows)
        chunk = logits[rows, :-1].float() / temperature
        targets = input_ids[rows, 1:].unsqueeze(-1)
        picked = chunk.gather(-1, targets).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
        out[rows, 1:] = picked
    # A token scores only when it and the token before it are real: the first real token of a
    # left-padded row gets 0, exactly as position 0 of an unpadded row.
    mask = attention_mask.to(out.dtype)
    valid = torch.zeros_like(mask)
    valid[:, 1:] = mask[:, 1:] * mask[:, :-1]
    return out * valid
