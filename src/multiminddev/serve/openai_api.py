"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` and
vLLM's ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (``lora_path`` must lie in one
of the server's adapter roots: 403 otherwise).

``model`` names the base or a loaded adapter. Extensions, as vLLM has them: a completion
``prompt`` may be token ids; ``return_tokens_as_token_ids: true`` writes each logprobs token as
``"token_id:<id>"`` so a client gets the exact ids back. Log-probs are those of the sampled
tokens under softmax(logits / T) (T = 1 for greedy decoding); ``top_logprobs`` hold only the
sampled token. A ``stop`` string ends the text and is left out of it, as OpenAI and vLLM do
(``token_ids`` and log-probs keep every sampled token). Streaming (``stream: true``) sends server-sent ``data:`` chunks and
``data: [DONE]``; it carries text only, so ``stream`` with ``logprobs`` is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from multiminddev.policy.chat import encode_chat, end_of_turn_ids
from multiminddev.policy.generation import FinishReason, GenerationOutput, SamplingParams
from multiminddev.serve.auth import PathOutsideRootsError, confine_adapter_path
from multiminddev.serve.batching import Batcher, GenerationEvent
from multiminddev.serve.errors import ApiError
from multiminddev.serve.limits import MAX_N
from multiminddev.serve.registry import AdapterError, ModelRegistry, UnknownModelError
from multiminddev.serve.stop_strings import cut_at_stop, safe_length

# A reply is JSON, or server-sent events with ``stream: true``.
STREAMABLE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/event-stream": {}}}}


class _Request(BaseModel):
    # Unknown OpenAI / vLLM fields are ignored, as OpenAI-compatible servers do.
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    return_tokens_as_token_ids: bool = False


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


class LoadAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadAdapterRequest(BaseModel):
    lora_name: str


def router() -> APIRouter:
    api = APIRouter(prefix="/v1")

    @api.get("/models")
    async def list_models(request: Request) -> dict[str, Any]:
        registry: ModelRegistry = request.app.state.registry
        created = int(request.app.state.started_at)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "multiminddev",
                 "root": registry.config.model if name == registry.base_name
                 else registry.adapters[name],
                 "parent": None if name == registry.base_name else registry.base_name}
                for name in registry.names()]
        return {"object": "list", "data": data}

    @api.post("/completions", responses=STREAMABLE)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        registry: ModelRegistry = request.app.state.registry
        if body.echo:
            raise ApiError(400, "echo is not supported; drop it")
        prompts = _completion_prompts(body.prompt, registry)
        sampling = _sampling(body, body.max_tokens or 16, registry, prompts)
        name = _model(registry, body.model)
        if body.stream:
            _check_stream(body, len(prompts), bool(body.logprobs is not None))
            return _sse(_stream_chunks(request, prompts[0], sampling, name, chat=False))
        outputs = await _generate(request, prompts, sampling, name)
        choices = [_completion_choice(i, out, registry, body) for i, out in enumerate(outputs)]
        return _response("text_completion", name, choices, prompts, outputs)

    @api.post("/chat/completions", responses=STREAMABLE)
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        registry: ModelRegistry = request.app.state.registry
        messages = [{"role": m.role, "content": _content_text(m.content)} for m in body.messages]
        try:
            prompt = encode_chat(registry.tokenizer, messages)
        except Exception as exc:
            raise ApiError(400, f"the chat template rejected the messages: {exc}") from exc
        sampling = _sampling(body, body.max_completion_tokens or body.max_tokens or 512,
                             registry, [prompt])
        name = _model(registry, body.model)
        if body.stream:
            _check_stream(body, 1, body.logprobs)
            return _sse(_stream_chunks(request, prompt, sampling, name, chat=True))
        outputs = await _generate(request, [prompt], sampling, name)
        choices = [_chat_choice(i, out, registry, body) for i, out in enumerate(outputs)]
        return _response("chat.completion", name, choices, [prompt], outputs)

    @api.post("/load_lora_adapter")
    async def load_lora_adapter(body: LoadAdapterRequest, request: Request) -> JSONResponse:
        registry: ModelRegistry = request.app.state.registry
        try:
            path = confine_adapter_path(body.lora_path, registry.config.adapter_folders)
        except PathOutsideRootsError as exc:
            raise ApiError(403, str(exc), param="lora_path") from exc
        try:
            await asyncio.to_thread(registry.load_adapter, body.lora_name, str(path))
        except AdapterError as exc:
            raise ApiError(400, str(exc)) from exc
        return JSONResponse({"status": "ok", "message":
                             f"Success: LoRA adapter '{body.lora_name}' added successfully."})

    @api.post("/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadAdapterRequest, request: Request) -> JSONResponse:
        registry: ModelRegistry = request.app.state.registry
        try:
            await asyncio.to_thread(registry.unload_adapter, body.lora_name)
        except AdapterError as exc:
            raise ApiError(404, str(exc)) from exc
        return JSONResponse({"status": "ok", "message":
                             f"Success: LoRA adapter '{body.lora_name}' removed successfully."})

    return api


# --------------------------------------------------------------------------- request -> sampling


def _model(registry: ModelRegistry, name: str) -> str:
    try:
        return registry.check(name)
    except UnknownModelError as exc:
        raise ApiError(404, str(exc), code="model_not_found") from exc


def _completion_prompts(prompt: Any, registry: ModelRegistry) -> list[list[int]]:
    items = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) \
        else [prompt]
    prompts = []
    for item in items:
        ids = (list(registry.tokenizer(item, add_special_tokens=False)["input_ids"])
               if isinstance(item, str) else list(item))
        if not ids:
            raise ApiError(400, "prompt is empty; give at least one token", param="prompt")
        vocab = len(registry.tokenizer)
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        prompts.append(ids)
    if len(prompts) > MAX_N:
        raise ApiError(400, f"at most {MAX_N} prompts per request", param="prompt")
    return prompts


def _sampling(body: _Request, max_tokens: int, registry: ModelRegistry,
              prompts: list[list[int]]) -> SamplingParams:
    limit = registry.config.max_tokens_limit
    if max_tokens > limit:
        raise ApiError(400, f"max_tokens {max_tokens} exceeds this server's limit of {limit}",
                       param="max_tokens")
    window = registry.context_window
    longest = max(len(p) for p in prompts)
    if longest + max_tokens > window:
        raise ApiError(400, f"prompt ({longest} tokens) + max_tokens ({max_tokens}) exceed the "
                            f"model's context window of {window}")
    try:
        return SamplingParams(temperature=body.temperature, top_p=body.top_p,
                              max_new_tokens=max_tokens, n=body.n, seed=body.seed,
                              stop=_stops(body))
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc


def _stops(body: _Request) -> tuple[str, ...]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return tuple(s for s in stop if s)


def _check_stream(body: _Request, prompts: int, logprobs: bool) -> None:
    if prompts != 1 or body.n != 1:
        raise ApiError(400, "stream supports one prompt with n=1; send several requests")
    if logprobs:
        raise ApiError(400, "stream does not return logprobs; drop one of them")


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = [p.get("text", "") for p in content if p.get("type") == "text"]
    if len(parts) != len(content):
        raise ApiError(400, "only text content parts are supported")
    return "".join(parts)


async def _generate(request: Request, prompts: list[list[int]], sampling: SamplingParams,
                    name: str) -> list[GenerationOutput]:
    return await request.app.state.batcher.generate(prompts, sampling, name)


# --------------------------------------------------------------------------- responses


def _finish(reason: FinishReason) -> str:
    return "length" if reason is FinishReason.LENGTH else "stop"


def _token_label(registry: ModelRegistry, token: int, as_ids: bool) -> str:
    if as_ids:
        return f"token_id:{token}"
    return registry.tokenizer.convert_ids_to_tokens(token)


def _completion_choice(index: int, out: GenerationOutput, registry: ModelRegistry,
                       body: CompletionRequest) -> dict[str, Any]:
    logprobs = None
    if body.logprobs is not None:
        labels = [_token_label(registry, t, body.return_tokens_as_token_ids) for t in out.token_ids]
        offsets, at = [], 0
        for t in out.token_ids:
            offsets.append(at)
            at += len(registry.tokenizer.decode([t], skip_special_tokens=True))
        logprobs = {"tokens": labels, "token_logprobs": list(out.logprobs),
                    "top_logprobs": ([{lab: lp} for lab, lp in zip(labels, out.logprobs)]
                                     if body.logprobs > 0 else None),
                    "text_offset": offsets}
    text, _ = cut_at_stop(out.text, _stops(body))
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": _finish(out.finish_reason), "token_ids": list(out.token_ids)}


def _chat_choice(index: int, out: GenerationOutput, registry: ModelRegistry,
                 body: ChatRequest) -> dict[str, Any]:
    logprobs = None
    if body.logprobs:
        content = []
        for t, lp in zip(out.token_ids, out.logprobs):
            label = _token_label(registry, t, body.return_tokens_as_token_ids)
            raw = list(registry.tokenizer.decode([t]).encode())
            entry = {"token": label, "logprob": lp, "bytes": raw}
            content.append({**entry, "top_logprobs": [entry] if body.top_logprobs else []})
        logprobs = {"content": content}
    text, _ = cut_at_stop(out.text, _stops(body))
    return {"index": index, "message": {"role": "assistant", "content": text},
            "logprobs": logprobs, "finish_reason": _finish(out.finish_reason),
            "token_ids": list(out.token_ids)}


def _response(kind: str, name: str, choices: list[dict[str, Any]], prompts: list[list[int]],
              outputs: list[GenerationOutput]) -> dict[str, Any]:
    n = len(outputs) // max(len(prompts), 1)
    prompt_tokens = sum(len(p) for p in prompts) * n
    completion_tokens = sum(len(o.token_ids) for o in outputs)
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


# --------------------------------------------------------------------------- streaming


def _sse(chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _stream_chunks(request: Request, prompt: list[int], sampling: SamplingParams,
                         name: str, *, chat: bool) -> AsyncIterator[dict[str, Any]]:
    """Chunks of text as tokens are decoded; the decoding runs in a worker thread and hands
    token ids over through a queue. The stream's tokens and time to first chunk are reported
    to the batcher's observers (the metrics)."""
    registry: ModelRegistry = request.app.state.registry
    batcher: Batcher = request.app.state.batcher
    arrived = time.perf_counter()
    first_chunk: float | None = None
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[int] | None] = asyncio.Queue()
    worker = asyncio.ensure_future(asyncio.to_thread(
        registry.stream, prompt, sampling, name,
        lambda ids: loop.call_soon_threadsafe(queue.put_nowait, ids)))
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())

    def chunk(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"id": ident, "object": "chat.completion.chunk", "created": created,
                    "model": name, "choices": [choice]}
        return {"id": ident, "object": "text_completion", "created": created, "model": name,
                "choices": [{"index": 0, "text": text or "", "logprobs": None,
                             "finish_reason": finish}]}

    if chat:
        yield chunk(None, None, first=True)

    stop_ids = set(end_of_turn_ids(registry.tokenizer))
    tokens: list[int] = []
    sent = ""
    stopped = False
    while not stopped and (ids := await queue.get()) is not None:
        tokens.extend(ids)
        text = registry.tokenizer.decode(tokens, skip_special_tokens=True)
        # a partial multi-byte character decodes to U+FFFD: wait for the rest of it
        if text.endswith("\ufffd"):
            continue
        text, stopped = cut_at_stop(text, sampling.stop)
        ready = text if stopped else text[:safe_length(text, sampling.stop)]
        if len(ready) > len(sent):
            first_chunk = first_chunk or time.perf_counter() - arrived
            yield chunk(ready[len(sent):], None)
            sent = ready
    await worker  # a decoding error surfaces here and ends the stream
    if not stopped:  # the held-back tail of a stop string that never completed
        text = registry.tokenizer.decode(tokens, skip_special_tokens=True)
        if len(text) > len(sent):
            yield chunk(text[len(sent):], None)
    ended = bool(tokens) and tokens[-1] in stop_ids
    finish = "stop" if ended or stopped or len(tokens) < sampling.max_new_tokens else "length"
    total = time.perf_counter() - arrived
    batcher.report(GenerationEvent(model=name, tokens=len(tokens), total_s=total,
                                   time_to_first_token_s=first_chunk or total))
    yield chunk(None, finish)
