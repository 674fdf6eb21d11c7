"""Continuous batching over ``LlamaDecoder``: requests of any agent share the decode slots.

``DecodeEngine.submit`` queues requests (a prompt, the index of its LoRA adapter, its sampling
settings) and returns futures. One thread drives the decoder: it prefills queued requests into
free slots, decodes one token for every active slot per step (rows of different adapters in one
forward), samples on the device, and ends a request at an end-of-turn token, at a stop string or
at ``max_new_tokens``, freeing its slot for the next queued request. Requests submitted by
different callers (episodes at different turns, both agents) join the same running batch.

Log-probabilities are those of the sampled tokens under ``softmax(logits / T)`` (T = 1 for
greedy rows), as ``GenerationBackend`` records them.
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from multiminddev.policy.llama_decoder import LlamaDecoder

log = logging.getLogger(__name__)

ENGINE_THREAD_NAME = "mmd-fast-decoding"
STOP_TAIL_TOKENS = 4
LOOKUP_NGRAM = 3  # longest context suffix looked up for a prompt-lookup draft
LOOKUP_TOKENS = 10  # draft tokens verified in one pass
PREFILL_TOKENS = 16384  # padded prompt tokens prefilled in one forward  # tokens decoded beyond a stop string's length when looking for it


@dataclass(kw_only=True)
class DecodeRequest:
    prompt: list[int]
    adapter: int  # 0 = the base, i = the decoder's i-th adapter
    temperature: float  # 0 = greedy
    top_p: float
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    future: Future = field(default_factory=Future)


def sample_tokens(logits: Any, temperature: Any, top_p: Any) -> tuple[Any, Any]:
    """Next tokens [b] and their log-probs [b] from float32 ``logits`` [b, vocab].

    Row i samples from ``softmax(logits / temperature[i])`` restricted to the smallest set of
    most likely tokens whose mass reaches ``top_p[i]`` (the most likely token always stays);
    ``temperature[i] == 0`` takes the argmax. The log-prob is under ``softmax(logits / T)``
    without the top-p cut (T = 1 for greedy rows)."""
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the more likely tokens
    keep = before < top_p[:, None]
    keep[:, 0] = True
    weights = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    picked = torch.multinomial(weights, 1).squeeze(-1)
    sampled = order.gather(-1, picked[:, None]).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def lookup_draft(context: list[int], max_ngram: int, tokens: int) -> list[int]:
    """Up to ``tokens`` tokens that followed the latest earlier occurrence of the context's
    last n tokens (n from ``max_ngram`` down to 2), or [] where none recurs."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), 1, -1):
        pattern = context[length - n:]
        first = pattern[0]
        for start in range(length - n - 1, -1, -1):
            if context[start] == first and context[start:start + n] == pattern:
                return context[start + n:start + n + tokens]
    return []


class DecodeEngine:
    """The scheduler and its thread over one decoder (see the module docstring)."""

    def __init__(self, decoder: LlamaDecoder, tokenizer: Any, stop_token_ids: tuple[int, ...]):
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.stop_token_ids = frozenset(stop_token_ids)
        self.tokens_generated = 0
        self.passes = 0  # decoder forward passes (prefills, steps, draft verifications)
        self._queue: collections.deque[DecodeRequest] = collections.deque()
        self._active: dict[int, DecodeRequest] = {}  # slot -> request
        self._wake = threading.Condition()
        self._decoder_lock = threading.Lock()  # held for each decoder call and each refresh
        self._thread: threading.Thread | None = None

    @property
    def slots(self) -> int:
        return self.decoder.slots

    def refresh_adapters(self) -> None:
        """Copy the adapters' weights into the decoder where a training step (or a load) changed
        them since the last copy."""
        with self._decoder_lock:
            self.decoder.lora.refresh_if_changed()

    def submit(self, requests: list[DecodeRequest]) -> list[Future]:
        with self._wake:
            self._queue.extend(requests)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=ENGINE_THREAD_NAME,
                                                daemon=True)
                self._thread.start()
            self._wake.notify()
        return [r.future for r in requests]

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._active:
                    self._wake.wait()
            try:
                self._admit()
                if self._active:
                    self._decode_step()
            except Exception as exc:  # every waiting caller hears of it; the thread goes on
                log.debug("fast decoding failed", exc_info=True)
                self._fail_all(exc)

    def _admit(self) -> None:
        """Prefill queued requests into free slots (lowest first, so active slots stay
        contiguous where they can), in batches of at most ``PREFILL_TOKENS`` padded tokens."""
        while True:
            with self._wake:
                free = [s for s in range(self.slots) if s not in self._active]
                batch: list[tuple[int, DecodeRequest]] = []
                while self._queue and len(batch) < len(free):
                    width = max([len(r.prompt) for _, r in batch] + [len(self._queue[0].prompt)])
                    if batch and width * (len(batch) + 1) > PREFILL_TOKENS:
                        break
                    batch.append((free[len(batch)], self._queue.popleft()))
                self._active.update(batch)
            if not batch:
                return
            slots = [slot for slot, _ in batch]
            requests = [r for _, r in batch]
            with self._decoder_lock:
                logits = self.decoder.prefill(slots, [r.prompt for r in requests],
                                              [r.adapter for r in requests])
                self.passes += 1
            tokens, logprobs = self._sample(logits, requests)
            for slot, request, token, logprob in zip(slots, requests, tokens, logprobs):
                self._record(slot, request, token, logprob)

    def _decode_step(self) -> None:
        with self._wake:
            active = sorted(self._active.items())
        if len(active) == 1 and self._lookup_step(*active[0]):
            return
        rows = [slot for slot, _ in active]
        requests = [r for _, r in active]
        last = [r.token_ids[-1] for r in requests]
        positions = [len(r.prompt) + len(r.token_ids) - 1 for r in requests]
        with self._decoder_lock:
            logits = self.decoder.step(rows, last, positions, [r.adapter for r in requests])
            self.passes += 1
        tokens, logprobs = self._sample(logits, requests)
        for slot, request, token, logprob in zip(rows, requests, tokens, logprobs):
            self._record(slot, request, token, logprob)

    def _lookup_step(self, slot: int, request: DecodeRequest) -> bool:
        """Prompt-lookup decoding for a lone greedy row on an eager decoder: the tokens that
        followed the latest earlier occurrence of the context's last few tokens are a draft,
        verified in one pass; the row keeps the draft's prefix that greedy decoding picks
        anyway, then greedy's own next token. The same tokens as one step at a time (up to
        rounding between the two passes), in fewer passes where replies copy their context
        (code rewritten from the prompt). Returns False where it does not apply."""
        if request.temperature > 0 or self.decoder.use_cuda_graphs:
            return False
        room = request.max_new_tokens - len(request.token_ids) - 1
        draft = lookup_draft(request.prompt + request.token_ids, LOOKUP_NGRAM, LOOKUP_TOKENS)
        draft = draft[:room]
        if not draft:
            return False
        start = len(request.prompt) + len(request.token_ids) - 1
        with self._decoder_lock:
            logits = self.decoder.extend(slot, [request.token_ids[-1], *draft], start,
                                         request.adapter)
            self.passes += 1
        logp = torch.log_softmax(logits, dim=-1)
        best = logits.argmax(dim=-1)
        picked = logp.gather(-1, best[:, None]).squeeze(-1)
        for token, logprob, proposed in zip(best.tolist(), picked.tolist(), draft + [None]):
            self._record(slot, request, token, logprob)
            if request.future.done() or token != proposed:
                break
        return True

    def _sample(self, logits: Any, requests: list[DecodeRequest]) -> tuple[list[int], list[float]]:
        device = logits.device
        if all(r.temperature <= 0 for r in requests):  # greedy: no sort, no draw
            logp = torch.log_softmax(logits, dim=-1)
            tokens = logits.argmax(dim=-1)
            return tokens.tolist(), logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        temperature = torch.tensor([r.temperature for r in requests], device=device)
        top_p = torch.tensor([r.top_p for r in requests], device=device)
        tokens, logprobs = sample_tokens(logits, temperature, top_p)
        return tokens.tolist(), logprobs.tolist()

    def _record(self, slot: int, request: DecodeRequest, token: int, logprob: float) -> None:
        request.token_ids.append(token)
        request.logprobs.append(logprob)
        self.tokens_generated += 1
        if not self._finished(request):
            return
        with self._wake:
            self._active.pop(slot, None)
        request.future.set_result(request)

    def _finished(self, request: DecodeRequest) -> bool:
        if request.token_ids[-1] in self.stop_token_ids:
            return True
        if len(request.token_ids) >= request.max_new_tokens:
            return True
        if request.stop:
            tail = max(len(s) for s in request.stop) + STOP_TAIL_TOKENS
            text = self.tokenizer.decode(request.token_ids[-tail:], skip_special_tokens=True)
            return any(s in text for s in request.stop)
        return False

    def _fail_all(self, exc: Exception) -> None:
        with self._wake:
            failed = list(self._active.values()) + list(self._queue)
            self._active.clear()
            self._queue.clear()
        for request in failed:
            if not request.future.done():
                request.future.set_exception(exc)
