"""Batched sampling behind a small async protocol.

Episodes talk only to ``GenerationBackend.generate(prompts, sampling, role)``, so the same
episode code runs with the in-process HF backend here and with a vLLM / VERL AgentLoop backend
later. A backend also exposes the ``tokenizer`` the prompts were encoded with.

Log-probabilities (``HFGenerationBackend``): by default the sampled tokens are re-scored with
one forward pass through ``token_logprobs`` — the exact function the trainer uses — so the
recorded logprobs equal the trainer's recomputation (ratio 1 before an update). With
``logprob_source=LogprobSource.SAMPLER`` they come from the sampler's own logits instead
(no extra forward, tiny KV-cache numeric differences). Either way they are log-probs under
``softmax(logits / temperature)`` — the sampling distribution at temperature T without the
top-p truncation (exactly the sampling distribution when top_p = 1). Greedy decoding
(temperature 0) records log-probs at temperature 1.

Fast decoding (``PolicyConfig.fast_decoding``, on by default on a CPU): for Llama-family models with
LoRA adapters on one base, ``HFGenerationBackend`` hands its prompts to the policy's shared
``DecodeEngine`` (policy/decode_engine.py over policy/llama_decoder.py): continuous batching
across calls, each row with its own agent's adapter, CUDA-graph decode steps on a GPU. Tokens,
finish reasons and text follow the same rules as below. Log-probs: where the model and the
decoder both compute in float32 or wider (the CPU), the decoder's own are the training forward's
up to float32 rounding (within 1e-4 on the embedded model, tested), so no second pass runs;
in bf16/fp16 the training model recomputes them (``RECOMPUTE``), or they come from the fast
decoder's logits with ``LogprobSource.SAMPLER``. Other models, and a fast decoder
that fails, fall back to the transformers path with a log line.

Compiled decoding (``PolicyConfig.compiled_decoding``): a static KV cache lets transformers
torch.compile the decoding step (CUDA graphs). Each new (batch, cache length) shape costs a
compile or a graph capture, so batches are padded to a power of two (repeating the last prompt;
the extra rows are dropped) and prompts to a multiple of ``PROMPT_WIDTH_BUCKET`` tokens (left
padding is masked, positions follow the mask, so outputs do not change).
"""

from __future__ import annotations

import asyncio
import atexit
import enum
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from multiminddev.agents.roles import AgentRole
from multiminddev.policy.chat import end_of_turn_ids
from multiminddev.policy.logprobs import token_logprobs

log = logging.getLogger(__name__)

PROMPT_WIDTH_BUCKET = 128  # compiled decoding pads prompts to a multiple of this
# Compiled decoding decodes at most this many rows at once. Batches of 8 and 16 decode correctly
# on an H100 (the GPU test, bench_generation, the quickstart); 64-row batches (39 prompts, 3
# processes on one H200) failed with an AssertionError
# inside torch.compile and CUDA "illegal memory access" warnings, cause not yet found, so larger
# batches are split. Decoding stays launch-bound, so four 16-row batches cost about four times
# one, still ~5x less than one eager 64-row batch.
COMPILED_DECODING_MAX_ROWS = 16
# Dynamo's default of 8 compiled variants per function would be spent by a handful of buckets,
# after which it silently runs eager.
COMPILED_DECODING_RECOMPILE_LIMIT = 64


DECODE_THREAD_NAME = "mmd-compiled-decoding"
RELEASE_TIMEOUT_S = 120.0  # release_compiled_decoding's wait for the decoding thread


@functools.cache
def _decode_executor() -> ThreadPoolExecutor:
    """The one thread every compiled generate runs in, whoever calls it. torch.compile's CUDA
    graph trees keep their state per thread (graphs, memory pools), while episodes call
    generate from whichever event-loop worker thread is free; one thread keeps a process's
    graphs in one place. (Whether threads caused the learning run's failure is not known.)"""
    # Released before the interpreter joins its threads: threading's exit hooks run before
    # concurrent.futures joins this worker (registered earlier), and before atexit, where
    # inductor shuts its compile workers down.
    getattr(threading, "_register_atexit", atexit.register)(release_compiled_decoding)
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=DECODE_THREAD_NAME)


def release_compiled_decoding() -> bool:
    """Free what compiled decoding holds: the decoding thread's CUDA graph trees and compiled
    code (``torch._dynamo.reset`` in that thread, since graph trees are per thread), the thread
    itself, and inductor's compile-worker processes. Returns whether there was anything to free.

    Called at exit, and by whoever is done decoding. Processes that had decoded with compiled
    decoding ended with a segmentation fault after their work, inside inductor's own at-exit
    ``shutdown_compile_workers``: releasing these while the process is whole avoids that
    teardown (the GPU test runs since it was added have exited cleanly).
    A later compiled generate starts a new thread and compiles again."""
    import sys

    if _decode_executor.cache_info().currsize == 0:
        return False
    executor = _decode_executor()
    _decode_executor.cache_clear()
    reset = False
    try:
        import torch

        # a generate still running (an interrupted run) finishes first; a stuck one is left
        executor.submit(torch._dynamo.reset).result(timeout=RELEASE_TIMEOUT_S)
        reset = True
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except (RuntimeError, TimeoutError) as exc:  # threads shutting down, a stuck thread, CUDA
        log.warning("compiled decoding: could not reset its thread's graphs (%s)", exc)
    executor.shutdown(wait=reset)
    if "torch._inductor.async_compile" in sys.modules:
        sys.modules["torch._inductor.async_compile"].shutdown_compile_workers()
    log.debug("compiled decoding released: graphs reset, thread ended, compile workers shut down")
    return True


def decode_buckets(batch: int, width: int) -> tuple[int, int]:
    """(rows, prompt width) a batch is padded to for compiled decoding."""
    rows = 1 << max(batch - 1, 0).bit_length()
    return rows, -(-width // PROMPT_WIDTH_BUCKET) * PROMPT_WIDTH_BUCKET


class FinishReason(str, enum.Enum):
    EOS = "eos"  # the model ended its turn
    STOP = "stop"  # a stop string was produced (kept in the text and tokens)
    LENGTH = "length"  # max_new_tokens reached


class LogprobSource(str, enum.Enum):
    RECOMPUTE = "recompute"  # forward pass with token_logprobs (matches training exactly)
    SAMPLER = "sampler"  # the logits generate() sampled from


@dataclass(kw_only=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 1024
    stop: tuple[str, ...] = ()
    n: int = 1  # samples per prompt
    seed: int | None = None

    def __post_init__(self) -> None:
        self.stop = tuple(self.stop)
        if self.temperature < 0:
            raise ValueError("SamplingParams.temperature must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("SamplingParams.top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("SamplingParams.max_new_tokens must be >= 1")
        if self.n < 1:
            raise ValueError("SamplingParams.n must be >= 1")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams.stop: empty stop strings would stop at once")

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(kw_only=True)
class GenerationOutput:
    token_ids: list[int]  # the sampled response tokens (EOS included when produced)
    logprobs: list[float]  # one per token, see the module docstring
    text: str
    finish_reason: FinishReason
    prompt_index: int = 0  # which prompt it answers (outputs of one prompt are adjacent)
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    tokenizer: Any

    async def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        """``len(prompts) * sampling.n`` outputs, prompt 0's samples first."""
        ...


@functools.cache
def _warn_eos_differs_once(eos: str, stops: str) -> None:
    log.warning("the tokenizer's EOS is %s but its chat template ends a reply with another "
                "token; generation stops at any of %s", eos, stops)


def _warn_eos_differs(tokenizer: Any, stop_ids: tuple[int, ...]) -> None:
    names = [f"{tokenizer.convert_ids_to_tokens(i)} ({i})" for i in stop_ids]
    _warn_eos_differs_once(names[0], ", ".join(names))


class HFGenerationBackend:
    """``model.generate`` with the role's adapter active, batched with left padding."""

    def __init__(
        self,
        policy: Any,
        *,
        max_batch_size: int = 16,
        logprob_source: LogprobSource = LogprobSource.RECOMPUTE,
        compiled_decoding: bool | None = None,
        sampling_dtype: Any = None,
        fast_decoding: bool | None = None,
    ):
        if max_batch_size < 1:
            raise ValueError("HFGenerationBackend.max_batch_size must be >= 1")
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.stop_token_ids = end_of_turn_ids(policy.tokenizer)
        if len(self.stop_token_ids) > 1:
            _warn_eos_differs(policy.tokenizer, self.stop_token_ids)
        self.max_batch_size = max_batch_size
        self.logprob_source = LogprobSource(logprob_source)
        self._lock = threading.Lock()  # one generate at a time on the shared model
        self.tokens_generated = 0
        # Cumulative seconds in model.generate and in the log-prob pass: where sampling time goes.
        self.seconds = {"generate": 0.0, "logprobs": 0.0}
        # None: the policy's setting. Turned off for good (with a warning) if a compiled
        # generate ever fails.
        self.compiled_decoding = bool(getattr(policy.config, "compiled_decoding", False)
                                      if compiled_decoding is None else compiled_decoding)
        if self.compiled_decoding:
            _raise_recompile_limit()
        # None: the model's own dtype; else Policy.sampling_model's copy in this dtype
        self.sampling_dtype = sampling_dtype
        # None: the policy's setting. Where it applies it takes precedence over compiled
        # decoding; turned off for good (with a warning) if the fast decoder ever fails.
        if fast_decoding is None:
            fast_decoding = getattr(policy.config, "fast_decoding", False)
        if fast_decoding is None:  # the policy's default: on a CPU only
            fast_decoding = str(getattr(policy, "device", "cpu")).startswith("cpu")
        self.fast_decoding = bool(fast_decoding)
        self._engine: Any = None

    async def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        # A thread keeps the event loop free for evaluations submitted meanwhile.
        return await asyncio.to_thread(self.generate_sync, prompts, sampling, role)

    def generate_sync(
        self, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        if any(not p for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        engine = self._fast_engine()
        if engine is not None:
            try:
                return self._generate_fast(engine, prompts, sampling, role)
            except Exception as exc:
                log.warning("fast decoding failed (%s: %s); decoding with transformers from now "
                            "on", type(exc).__name__, exc, exc_info=True)
                self.fast_decoding = False
        if self.compiled_decoding and not threading.current_thread().name.startswith(
                DECODE_THREAD_NAME):
            return _decode_executor().submit(self._generate_sync, prompts, sampling, role).result()
        return self._generate_sync(prompts, sampling, role)

    def _generate_sync(
        self, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        import torch

        if any(not p for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        expanded = [(i, p) for i, p in enumerate(prompts) for _ in range(sampling.n)]
        outputs: list[GenerationOutput] = []
        with self._lock, self.policy.use(role) as model:
            was_training = model.training
            model.eval()
            # Sampling may run on a merged copy (same weights, fewer ops); log-probs are always
            # recomputed with the training model itself.
            sampler = self.policy.sampling_model(role, self.sampling_dtype)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            step = (min(self.max_batch_size, COMPILED_DECODING_MAX_ROWS)
                    if self.compiled_decoding else self.max_batch_size)
            try:
                for start in range(0, len(expanded), step):
                    chunk = expanded[start : start + step]
                    outputs.extend(self._generate_batch(model, chunk, sampling, sampler))
            finally:
                model.train(was_training)
        self.tokens_generated += sum(len(o.token_ids) for o in outputs)
        return outputs

    def _generate_batch(
        self, model: Any, chunk: list[tuple[int, list[int]]], sampling: SamplingParams,
        sampler: Any = None,
    ) -> list[GenerationOutput]:
        import torch

        compiled = self.compiled_decoding
        prompts = [p for _, p in chunk]
        width = None
        if compiled:
            rows, width = decode_buckets(len(prompts), max(len(p) for p in prompts))
            prompts = prompts + [prompts[-1]] * (rows - len(prompts))
        input_ids, attention_mask = left_pad(prompts, self._pad_id, self.policy.device, width=width)
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "pad_token_id": self._pad_id,
            "eos_token_id": list(self.stop_token_ids),
            "return_dict_in_generate": True,
            "output_logits": self.logprob_source is LogprobSource.SAMPLER,
        }
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature,
                          top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        if compiled:
            kwargs.update(_static_cache_kwargs(input_ids.device))
        start = time.perf_counter()
        try:
            with torch.no_grad():
                out = (sampler or model).generate(input_ids=input_ids,
                                                  attention_mask=attention_mask, **kwargs)
        except Exception as exc:
            if not compiled:
                raise
            # the traceback travels with the warning: "AssertionError: " alone did not say where
            log.warning("compiled decoding failed (%s: %s); decoding eagerly from now on",
                        type(exc).__name__, exc, exc_info=True)
            self.compiled_decoding = False
            return self._generate_batch(model, chunk, sampling, sampler)
        rows = len(chunk)  # padding rows of compiled decoding are dropped here
        new_tokens = out.sequences[:rows, input_ids.shape[1] :].tolist()  # .tolist() synchronises
        middle = time.perf_counter()
        kept = [self._cut(tokens, sampling) for tokens in new_tokens]
        if self.logprob_source is LogprobSource.SAMPLER:
            step_logits = tuple(step[:rows] for step in out.logits)
            logprobs = _sampler_logprobs(step_logits, new_tokens, kept,
                                         sampling.logprob_temperature)
        else:
            logprobs = self._recompute_logprobs(model, chunk, kept, sampling.logprob_temperature)
        self.seconds["generate"] += middle - start
        self.seconds["logprobs"] += time.perf_counter() - middle
        return [
            GenerationOutput(
                token_ids=tokens,
                logprobs=lps,
                text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                finish_reason=reason,
                prompt_index=index,
            )
            for (index, _), (tokens, reason), lps in zip(chunk, kept, logprobs)
        ]

    @property
    def context_window(self) -> int:
        return self.policy.context_window

    def _fast_engine(self) -> Any:
        """The policy's shared fast decoding engine for this backend's batch size and dtype, or
        None where fast decoding is off or does not apply (said once in the log)."""
        if not self.fast_decoding:
            return None
        if self._engine is not None and self._engine.decoder.device == self.policy.device:
            return self._engine
        self._engine = None
        engine, reason = shared_decode_engine(self.policy, self.max_batch_size,
                                              self.sampling_dtype, self.stop_token_ids)
        if engine is None:
            log.info("fast decoding does not apply (%s); decoding with transformers", reason)
            self.fast_decoding = False
        self._engine = engine
        return engine

    def _generate_fast(
        self, engine: Any, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        """Decode with the shared engine (rows of every caller and adapter in one batch), then
        log-probs as the module docstring says."""
        import torch

        from multiminddev.policy.decode_engine import DecodeRequest

        adapter = decode_adapter_index(self.policy, role)
        expanded = [(i, p) for i, p in enumerate(prompts) for _ in range(sampling.n)]
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        start = time.perf_counter()
        engine.refresh_adapters()  # training steps move the adapters between calls
        requests = [DecodeRequest(prompt=list(p), adapter=adapter,
                                  temperature=sampling.temperature, top_p=sampling.top_p,
                                  max_new_tokens=sampling.max_new_tokens, stop=sampling.stop)
                    for _, p in expanded]
        done = [future.result() for future in engine.submit(requests)]
        middle = time.perf_counter()
        kept = [self._cut(r.token_ids, sampling) for r in done]
        if self.logprob_source is LogprobSource.SAMPLER or engine.decoder.computes_exactly:
            logprobs = [r.logprobs[: len(tokens)] for r, (tokens, _) in zip(done, kept)]
        else:
            logprobs = []
            with self._lock, self.policy.use(role) as model:
                was_training = model.training
                model.eval()
                try:
                    for first in range(0, len(expanded), self.max_batch_size):
                        last = first + self.max_batch_size
                        logprobs.extend(self._recompute_logprobs(
                            model, expanded[first:last], kept[first:last],
                            sampling.logprob_temperature))
                finally:
                    model.train(was_training)
        self.seconds["generate"] += middle - start
        self.seconds["logprobs"] += time.perf_counter() - middle
        self.tokens_generated += sum(len(tokens) for tokens, _ in kept)
        return [
            GenerationOutput(token_ids=tokens, logprobs=lps,
                             text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                             finish_reason=reason, prompt_index=index,
                             extra={"decoder": "fast"})
            for (index, _), (tokens, reason), lps in zip(expanded, kept, logprobs)
        ]

    @property
    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def _cut(self, tokens: list[int], sampling: SamplingParams) -> tuple[list[int], FinishReason]:
        """The tokens actually sampled: up to the first stop string or end-of-turn token
        (padding dropped)."""
        end = next((i + 1 for i, t in enumerate(tokens) if t in self.stop_token_ids), None)
        head = tokens[:end] if end is not None else list(tokens)
        if sampling.stop:
            stop_at = _stop_prefix_length(head, sampling.stop, self.tokenizer)
            if stop_at is not None:
                return head[:stop_at], FinishReason.STOP
        if end is not None:
            return head, FinishReason.EOS
        return head, FinishReason.LENGTH

    def _recompute_logprobs(
        self,
        model: Any,
        chunk: list[tuple[int, list[int]]],
        kept: list[tuple[list[int], FinishReason]],
        temperature: float,
    ) -> list[list[float]]:
        import torch

        # Left-pad prompts, right-pad responses: the prompt ends at one column for every row,
        # so each row's response occupies the same slice.
        ids, mask = left_pad([p for _, p in chunk], self._pad_id, self.policy.device)
        width = max((len(t) for t, _ in kept), default=0)
        if width == 0:
            return [[] for _ in kept]
        resp = torch.full((len(kept), width), self._pad_id, dtype=ids.dtype, device=ids.device)
        resp_mask = torch.zeros_like(resp)
        for row, (tokens, _) in enumerate(kept):
            resp[row, : len(tokens)] = torch.tensor(tokens, dtype=ids.dtype)
            resp_mask[row, : len(tokens)] = 1
        full_ids = torch.cat([ids, resp], dim=1)
        full_mask = torch.cat([mask, resp_mask], dim=1)
        with torch.no_grad():
            lps = token_logprobs(model, full_ids, full_mask, temperature=temperature)
        lps = lps[:, ids.shape[1] :].tolist()
        return [row[: len(tokens)] for row, (tokens, _) in zip(lps, kept)]


def decode_adapter_index(policy: Any, role: AgentRole) -> int:
    """The fast decoder's adapter index of ``role`` (0 = the base)."""
    _, adapters = policy.decoding_adapters()
    name = policy.adapter_name(role)
    return adapters.index(name) + 1 if name is not None else 0


def shared_decode_engine(policy: Any, slots: int, dtype: Any, stop_token_ids: tuple[int, ...]
                         ) -> tuple[Any, str | None]:
    """(the engine every backend over ``policy`` with these slots and dtype shares, None) or
    (None, why the fast decoder does not apply). A policy offers fast decoding through
    ``decoding_adapters()`` (its peft or plain HF model and the adapter names the decoder
    stacks), ``adapter_name(role)`` and a ``decode_engines`` dict that keeps the engines."""
    if not hasattr(policy, "decoding_adapters") or not hasattr(policy, "decode_engines"):
        return None, f"{type(policy).__name__} offers no decoding_adapters()"
    from multiminddev.policy.decode_engine import DecodeEngine
    from multiminddev.policy.llama_decoder import LlamaDecoder, unsupported_reason

    target = policy.decoding_adapters()
    if target is None:
        return None, "the agents are separate models"
    model, adapters = target
    reason = unsupported_reason(model)
    if reason is not None:
        return None, reason
    key = (slots, dtype, policy.device, tuple(adapters))  # a new adapter set: a new engine
    engine = policy.decode_engines.get(key)
    if engine is None:
        decoder = LlamaDecoder(model, tuple(adapters), slots=slots, dtype=dtype,
                               use_cuda_graphs=getattr(policy.config, "decode_cuda_graphs", False))
        engine = policy.decode_engines[key] = DecodeEngine(decoder, policy.tokenizer,
                                                           stop_token_ids)
        log.debug("fast decoding: an engine of %d slots on %s", slots, policy.device)
    return engine, None


def _sampler_logprobs(
    step_logits: tuple[Any, ...],
    new_tokens: list[list[int]],
    kept: list[tuple[list[int], FinishReason]],
    temperature: float,
) -> list[list[float]]:
    import torch

    if not step_logits:
        return [[] for _ in kept]
    steps = len(step_logits)
    targets = torch.tensor([row[:steps] for row in new_tokens], device=step_logits[0].device)
    # Step by step: stacking [B, steps, V] float32 logits first would hold several GB for a
    # batch of 32 x 800 steps on top of generate's own copy.
    picked = torch.empty(targets.shape, dtype=torch.float32, device=targets.device)
    for t, step in enumerate(step_logits):
        scaled = step.float() / temperature
        picked[:, t] = (scaled.gather(-1, targets[:, t : t + 1]).squeeze(-1)
                        - torch.logsumexp(scaled, -1))
    rows = picked.tolist()
    return [row[: len(tokens)] for row, (tokens, _) in zip(rows, kept)]


def _stop_prefix_length(tokens: list[int], stops: tuple[str, ...], tokenizer: Any) -> int | None:
    """Fewest leading tokens whose text contains a stop string, or None."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if not any(s in text for s in stops):
        return None
    lo, hi = 1, len(tokens)  # "contains a stop string" is monotone in the prefix length
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = tokenizer.decode(tokens[:mid], skip_special_tokens=True)
        if any(s in prefix for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _static_cache_kwargs(device: Any) -> dict[str, Any]:
    """generate() arguments for compiled decoding: on CUDA transformers compiles the decoding
    step itself (its auto-compile, CUDA graphs); elsewhere the static cache runs eagerly, which
    keeps the padded path testable without a GPU."""
    if getattr(device, "type", str(device)) == "cuda":
        from transformers import CompileConfig

        return {"cache_implementation": "static",
                "compile_config": CompileConfig(fullgraph=False, mode="reduce-overhead")}
    return {"cache_implementation": "static", "disable_compile": True}


def _raise_recompile_limit() -> None:
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), COMPILED_DECODING_RECOMPILE_LIMIT))


def left_pad(prompts: list[list[int]], pad_id: int, device: Any,
             width: int | None = None) -> tuple[Any, Any]:
    """[B, T] input ids and attention mask, prompts right-aligned; T = ``width`` if given (at
    least the longest prompt)."""
    import torch

    width = max(max(len(p) for p in prompts), width or 0)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)
