"""A small decoder for Llama-family HF models with per-row LoRA adapters and a static KV cache.

It reads the HF model's own weights (no copy when the dtype matches) and computes what decoding
needs: RMSNorm, rotary embeddings from the model's own rotary module (so its rope config
applies), grouped-query attention and the SwiGLU MLP. Each peft LoRA adapter's A and B matrices
are stacked per projection; a row's adapter index selects its block by a one-hot mask
(index 0 = no adapter), so rows of different agents decode in one forward without merging.
The LoRA term follows peft's ``lora.Linear``: ``B(A(x)) * scaling`` computed in the adapter
weights' dtype, added to the base projection.

The decode step has fixed shapes for a given slot count and cache length bucket, so on CUDA it
is captured once per bucket in a CUDA graph (capture takes well under a second; nothing is
compiled). On other devices it runs eagerly over the active rows only.

Supported: ``model_type == "llama"`` without DoRA, with a rope type whose cos/sin do not depend
on the sequence length (``dynamic`` does); ``unsupported_reason`` says why another model is not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CACHE_BUCKET = 256  # cache lengths (and decode graphs) come in multiples of this many positions
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def unsupported_reason(model: Any) -> str | None:
    """Why the fast decoder cannot decode ``model`` (a peft model or a plain HF causal LM), or
    None when it can."""
    base = _causal_lm(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) != "llama":
        return f"model_type {getattr(config, 'model_type', None)!r} is not 'llama'"
    if getattr(config, "quantization_config", None) is not None:
        return "the base is quantized"
    rope = (getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
            or {})
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in _LENGTH_DEPENDENT_ROPE:
        return f"rope type {rope_type!r} depends on the sequence length"
    peft_config = getattr(model, "peft_config", {}) or {}
    for name, adapter in peft_config.items():
        if getattr(adapter, "use_dora", False):
            return f"adapter {name!r} uses DoRA"
        if getattr(adapter, "peft_type", None) is not None and str(
                getattr(adapter.peft_type, "value", adapter.peft_type)) != "LORA":
            return f"adapter {name!r} is not a LoRA adapter"
        targets = getattr(adapter, "target_modules", None)
        if isinstance(targets, str) or not set(targets or ()) <= set(PROJECTIONS):
            return (f"adapter {name!r} targets {targets!r}; the fast decoder applies LoRA to "
                    f"{', '.join(PROJECTIONS)} only")
    return None


def _causal_lm(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _linear_parts(module: Any) -> tuple[Any, Any]:
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    return base.weight, base.bias


@dataclass
class _LayerWeights:
    input_norm: Any
    post_norm: Any
    linears: dict[str, tuple[Any, Any]]  # projection -> (weight, bias or None)


class AdapterStack:
    """Per projection and layer, the adapters' A blocks [n * r, in] and B blocks [out, n * r]
    (scaling folded into B), in float32 or the adapters' dtype; r is the largest rank (smaller
    ranks are zero-padded, which adds exact zeros). ``refresh`` copies the adapters' current
    values in place, so captured CUDA graphs keep reading the same buffers."""

    def __init__(self, model: Any, adapters: tuple[str, ...], layers: int, device: Any):
        self.model = model
        self.adapters = adapters
        self.modules = _lora_modules(model, layers)
        ranks = [m.lora_A[a].weight.shape[0] for per in self.modules for m in per.values()
                 for a in adapters if a in m.lora_A]
        self.rank = max(ranks, default=0)
        self.blocks: list[dict[str, tuple[Any, Any]]] = []
        for per_layer in self.modules:
            blocks = {}
            for name, module in per_layer.items():
                if not any(a in module.lora_A for a in adapters):
                    continue
                weight = module.get_base_layer().weight
                dtype = next(module.lora_A[a].weight.dtype for a in adapters if a in module.lora_A)
                a_block = torch.zeros(len(adapters) * self.rank, weight.shape[1], dtype=dtype,
                                      device=device)
                b_block = torch.zeros(weight.shape[0], len(adapters) * self.rank, dtype=dtype,
                                      device=device)
                blocks[name] = (a_block, b_block)
            self.blocks.append(blocks)
        self._seen: tuple[tuple[int, int], ...] = ()
        self.refresh()

    def _versions(self) -> tuple[tuple[int, int], ...]:
        """(identity, in-place version) of every adapter tensor read: an optimizer step or a
        loaded adapter changes it."""
        return tuple((id(w), w._version) for per in self.modules for m in per.values()
                     for a in self.adapters if a in m.lora_A
                     for w in (m.lora_A[a].weight, m.lora_B[a].weight))

    def refresh_if_changed(self) -> bool:
        """``refresh`` when an adapter tensor changed since the last one; returns whether."""
        if self._versions() == self._seen:
            return False
        self.refresh()
        return True

    @torch.no_grad()
    def refresh(self) -> None:
        self._seen = self._versions()
        r = self.rank
        for per_layer, blocks in zip(self.modules, self.blocks):
            for name, (a_block, b_block) in blocks.items():
                module = per_layer[name]
                for i, adapter in enumerate(self.adapters):
                    a_rows = a_block[i * r:(i + 1) * r]
                    b_cols = b_block[:, i * r:(i + 1) * r]
                    if adapter not in module.lora_A:
                        a_rows.zero_()
                        b_cols.zero_()
                        continue
                    a = module.lora_A[adapter].weight
                    b = module.lora_B[adapter].weight * module.scaling[adapter]
                    a_rows.zero_()
                    b_cols.zero_()
                    a_rows[: a.shape[0]].copy_(a)
                    b_cols[:, : b.shape[1]].copy_(b)

    def row_mask(self, adapter_index: Any) -> Any:
        """[rows, n * r] 1/0 mask of each row's adapter block (index 0 = no adapter). Built
        by comparison, without host synchronisation, so it runs inside a CUDA graph."""
        n, r = len(self.adapters), self.rank
        a_block = next(iter(next(b for b in self.blocks if b).values()))[0]
        indices = torch.arange(1, n + 1, device=adapter_index.device)
        onehot = (adapter_index[:, None] == indices[None]).to(a_block.dtype)  # [rows, n]
        return onehot[:, :, None].expand(-1, n, r).reshape(-1, n * r)

    @property
    def has_blocks(self) -> bool:
        return any(self.blocks)


def _lora_modules(model: Any, layers: int) -> list[dict[str, Any]]:
    """Per layer, {projection: peft LoRA layer} for the projections peft wrapped."""
    found: list[dict[str, Any]] = [{} for _ in range(layers)]
    if not hasattr(model, "peft_config"):
        return found
    decoder = _causal_lm(model).model
    for index, layer in enumerate(decoder.layers):
        for name in PROJECTIONS:
            holder = layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            module = getattr(holder, name)
            if hasattr(module, "lora_A"):
                found[index][name] = module
    return found


class LlamaDecoder:
    """Prefill and decode over a static KV cache of up to ``slots`` rows, reading ``model``'s
    weights.

    ``adapters``: the peft adapter names, in the order of their indices 1..n. ``dtype``: the
    compute dtype (the model's own when None; another dtype casts a copy of the weights)."""

    def __init__(self, model: Any, adapters: tuple[str, ...], *, slots: int,
                 dtype: Any = None, use_cuda_graphs: bool | None = None):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast decoder cannot decode this model: {reason}")
        self.model = model
        lm = _causal_lm(model)
        self.config = lm.config
        inner = lm.model
        self.device = next(lm.parameters()).device
        model_dtype = next(lm.parameters()).dtype
        self.dtype = dtype or model_dtype
        # float32 or wider on both sides: the decoder's log-probs are the training forward's up
        # to float32 rounding, so they need no recomputation
        self.computes_exactly = min(torch.finfo(self.dtype).bits,
                                    torch.finfo(model_dtype).bits) >= 32
        self.slots = slots
        c = self.config
        self.heads = c.num_attention_heads
        self.kv_heads = getattr(c, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.eps = c.rms_norm_eps
        self.max_positions = int(getattr(c, "max_position_embeddings", 0) or 2048)
        self.rotary = inner.rotary_emb
        self.act = inner.layers[0].mlp.act_fn
        cast = self._cast
        self.embed = cast(inner.embed_tokens.weight)
        self.final_norm = cast(inner.norm.weight)
        self.lm_head, head_bias = _linear_parts(lm.lm_head)
        self.lm_head = cast(self.lm_head)
        self.lm_head_bias = cast(head_bias) if head_bias is not None else None
        self.layers = []
        for layer in inner.layers:
            linears = {}
            for name in PROJECTIONS:
                holder = layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else layer.mlp
                weight, bias = _linear_parts(getattr(holder, name))
                linears[name] = (cast(weight), cast(bias) if bias is not None else None)
            self.layers.append(_LayerWeights(cast(layer.input_layernorm.weight),
                                             cast(layer.post_attention_layernorm.weight), linears))
        self.lora = AdapterStack(model, adapters, len(self.layers), self.device)
        # Off unless asked for: replaying the captured step has been seen to diverge from the
        # eager step on an H200 (tests/policy/test_fast_decoding.py keeps that as a strict xfail).
        self.use_cuda_graphs = bool(use_cuda_graphs) and self.device.type == "cuda"
        self.cache_len = self.cache_slots = 0
        self.k_cache: list[Any] = []
        self.v_cache: list[Any] = []
        self.cos = self.sin = None
        self._graphs: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._pool = None

    def _cast(self, tensor: Any) -> Any:
        return tensor.detach().to(self.dtype) if tensor.dtype != self.dtype else tensor.detach()

    # ------------------------------------------------------------------ cache

    def ensure_cache(self, length: int, slots: int = 1) -> None:
        """Room for ``length`` positions (rounded up to a bucket) in the first ``slots`` slots
        (rounded up to a power of two, at most ``self.slots``): the cache grows as requests
        need it, keeping what it holds, and growing drops the captured graphs."""
        length = min(-(-length // CACHE_BUCKET) * CACHE_BUCKET, max(self.max_positions, length))
        slots = min(1 << max(slots - 1, 0).bit_length(), self.slots)
        if length <= self.cache_len and slots <= self.cache_slots:
            return
        length, slots = max(length, self.cache_len), max(slots, self.cache_slots)
        shape = (slots, self.kv_heads, length, self.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        for old, new in zip(self.k_cache + self.v_cache, new_k + new_v):
            new[: self.cache_slots, :, : self.cache_len].copy_(old)
        self.k_cache, self.v_cache = new_k, new_v
        self.cache_len, self.cache_slots = length, slots
        positions = torch.arange(length, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            cos, sin = self.rotary(probe, positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [length, head_dim]
        self._graphs.clear()
        self._pool = None

    # ------------------------------------------------------------------ math

    def _linear(self, x: Any, layer: int, name: str, mask: Any) -> Any:
        weight, bias = self.layers[layer].linears[name]
        out = torch.nn.functional.linear(x, weight, bias)
        block = self.lora.blocks[layer].get(name)
        if block is None or mask is None:
            return out
        a_block, b_block = block
        # peft: lora_B(lora_A(x)) * scaling in the adapter dtype, added to the base output
        low = torch.nn.functional.linear(x.to(a_block.dtype), a_block) * mask
        return out + torch.nn.functional.linear(low, b_block).to(out.dtype)

    def _norm(self, x: Any, weight: Any) -> Any:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def _rope(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _mlp(self, x: Any, layer: int, mask: Any) -> Any:
        gate = self._linear(x, layer, "gate_proj", mask)
        up = self._linear(x, layer, "up_proj", mask)
        return self._linear(self.act(gate) * up, layer, "down_proj", mask)

    @torch.no_grad()
    def prefill(self, slots: list[int], prompts: list[list[int]], adapters: list[int]) -> Any:
        """Run each prompt through the model into its slot's cache (positions 0..n-1), in one
        right-padded batch (causal attention keeps padding out of every real token's view; the
        padding's cache entries lie beyond the prompt, where decoding overwrites them).
        Returns the float32 logits [len(prompts), vocab] after each prompt's last token."""
        b, width = len(prompts), max(len(p) for p in prompts)
        self.ensure_cache(width + 1, max(slots) + 1)
        ids = torch.zeros((b, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt)
        ids = ids.to(self.device)
        rows = torch.tensor(slots, device=self.device)
        mask = None
        if self.lora.has_blocks and any(adapters):
            per_token = torch.tensor(adapters, device=self.device)[:, None].expand(b, width)
            mask = self.lora.row_mask(per_token.reshape(-1)).view(b, width, -1)
        x = self.embed[ids]  # [b, width, hidden]
        cos, sin = self.cos[:width][None, None], self.sin[:width][None, None]
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            q = self._linear(h, i, "q_proj", mask).view(b, width, self.heads, self.head_dim)
            k = self._linear(h, i, "k_proj", mask).view(b, width, self.kv_heads, self.head_dim)
            v = self._linear(h, i, "v_proj", mask).view(b, width, self.kv_heads, self.head_dim)
            q = self._rope(q.transpose(1, 2), cos, sin)
            k = self._rope(k.transpose(1, 2), cos, sin)
            v = v.transpose(1, 2)
            self.k_cache[i][rows, :, :width] = k
            self.v_cache[i][rows, :, :width] = v
            attn = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
            x = x + self._linear(attn.transpose(1, 2).reshape(b, width, -1), i, "o_proj", mask)
            x = x + self._mlp(self._norm(x, layer.post_norm), i, mask)
        ends = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        last = self._norm(x[torch.arange(b, device=self.device), ends], self.final_norm)
        return torch.nn.functional.linear(last, self.lm_head, self.lm_head_bias).float()

    @torch.no_grad()
    def extend(self, slot: int, tokens: list[int], start: int, adapter: int) -> Any:
        """Run ``tokens`` at positions ``start``.. of ``slot`` (its cache holds 0..start-1),
        writing their cache entries; returns the float32 logits [len(tokens), vocab] after each
        (a draft's verification: one pass over several tokens reads the weights once)."""
        n = len(tokens)
        self.ensure_cache(start + n + 1, slot + 1)
        ids = torch.tensor(tokens, device=self.device)
        mask = (self.lora.row_mask(torch.full((n,), adapter, device=self.device))
                if self.lora.has_blocks and adapter else None)
        x = self.embed[ids]
        cos, sin = self.cos[start:start + n][None], self.sin[start:start + n][None]
        end = start + n
        visible = (torch.arange(end, device=self.device)[None]
                   <= torch.arange(start, end, device=self.device)[:, None])  # [n, end]
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            q = self._linear(h, i, "q_proj", mask).view(n, self.heads, self.head_dim).transpose(0, 1)
            k = self._linear(h, i, "k_proj", mask).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            v = self._linear(h, i, "v_proj", mask).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k_cache[i][slot, :, start:end] = k
            self.v_cache[i][slot, :, start:end] = v
            attn = torch.nn.functional.scaled_dot_product_attention(
                q[None], self.k_cache[i][slot:slot + 1, :, :end],
                self.v_cache[i][slot:slot + 1, :, :end], attn_mask=visible,
                enable_gqa=self.kv_heads != self.heads)
            x = x + self._linear(attn[0].transpose(0, 1).reshape(n, -1), i, "o_proj", mask)
            x = x + self._mlp(self._norm(x, layer.post_norm), i, mask)
        return torch.nn.functional.linear(self._norm(x, self.final_norm), self.lm_head,
                                          self.lm_head_bias).float()

    def _step(self, rows: Any, tokens: Any, positions: Any, adapters: Any, length: int,
              read: Any) -> Any:
        """One token for each of ``rows`` (slot indices) at ``positions``; attends over the
        first ``length`` cache positions of the slots ``read`` selects (the same slots as
        ``rows``: a slice where they are contiguous, which reads without a copy). Returns
        float32 logits [rows, vocab]."""
        b = rows.shape[0]
        mask = self.lora.row_mask(adapters) if self.lora.has_blocks else None
        x = self.embed[tokens]  # [b, hidden]
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [b, 1, d]
        group = self.heads // self.kv_heads
        visible = torch.arange(length, device=self.device)[None] <= positions[:, None]
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=self.device)
        bias = bias.masked_fill(~visible, float("-inf"))[:, None, None]  # [b, 1, 1, length]
        scale = self.head_dim ** -0.5
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            q = self._rope(self._linear(h, i, "q_proj", mask).view(b, self.heads, self.head_dim), cos, sin)
            k = self._rope(self._linear(h, i, "k_proj", mask).view(b, self.kv_heads, self.head_dim), cos, sin)
            v = self._linear(h, i, "v_proj", mask).view(b, self.kv_heads, self.head_dim)
            self.k_cache[i][rows, :, positions] = k
            self.v_cache[i][rows, :, positions] = v
            keys, values = self.k_cache[i][read, :, :length], self.v_cache[i][read, :, :length]
            # [b, kv, group, d] x [b, kv, d, length] -> [b, kv, group, length]
            # products in the cache dtype (as SDPA computes them), softmax in float32
            scores = torch.matmul(q.view(b, self.kv_heads, group, self.head_dim),
                                  keys.transpose(-1, -2)).float() * scale + bias
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            attn = torch.matmul(probs, values).reshape(b, -1)
            x = x + self._linear(attn, i, "o_proj", mask)
            x = x + self._mlp(self._norm(x, layer.post_norm), i, mask)
        return torch.nn.functional.linear(self._norm(x, self.final_norm), self.lm_head,
                                          self.lm_head_bias).float()

    @torch.no_grad()
    def step(self, rows: list[int], tokens: list[int], positions: list[int],
             adapters: list[int]) -> Any:
        """Logits [len(rows), vocab] (float32) of the next token of each active slot."""
        self.ensure_cache(max(positions) + 1, max(rows) + 1)
        if not self.use_cuda_graphs:
            as_tensor = lambda values: torch.tensor(values, device=self.device)
            contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
            read = slice(rows[0], rows[0] + len(rows)) if contiguous else as_tensor(rows)
            return self._step(as_tensor(rows), as_tensor(tokens), as_tensor(positions),
                              as_tensor(adapters), max(positions) + 1, read)
        length = min(-(-(max(positions) + 1) // CACHE_BUCKET) * CACHE_BUCKET, self.cache_len)
        graph, io = self._graph(length)
        io["tokens"].zero_()
        io["positions"].zero_()
        io["adapters"].zero_()
        index = torch.tensor(rows, device=self.device)
        io["tokens"][index] = torch.tensor(tokens, device=self.device)
        io["positions"][index] = torch.tensor(positions, device=self.device)
        io["adapters"][index] = torch.tensor(adapters, device=self.device)
        graph.replay()
        return io["logits"][index]

    def _graph(self, length: int) -> tuple[Any, dict[str, Any]]:
        """The decode step over all allocated slots, attending over ``length`` positions, captured in a
        CUDA graph on first use. Idle slots decode a dummy token at position 0 of their own
        cache, which their next prefill overwrites."""
        if length in self._graphs:
            return self._graphs[length]
        io = {name: torch.zeros(self.cache_slots, dtype=torch.long, device=self.device)
              for name in ("tokens", "positions", "adapters")}
        io["rows"] = torch.arange(self.cache_slots, device=self.device)
        run = lambda: self._step(io["rows"], io["tokens"], io["positions"], io["adapters"],
                                 length, slice(None))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: kernels chosen and workspaces allocated outside capture
                run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (log-prob passes, evaluations) may use CUDA meanwhile
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            io["logits"] = run()
        self._pool = graph.pool()
        self._graphs[length] = (graph, io)
        log.debug("fast decoder: captured the decode step for %d slots x %d positions",
                  self.cache_slots, length)
        return graph, io
