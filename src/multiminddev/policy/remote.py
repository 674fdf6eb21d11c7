"""``OpenAIGenerationBackend``: the ``GenerationBackend`` protocol over an OpenAI-compatible
server — ``multiminddev serve`` or vLLM started with ``--enable-lora`` (docs/serving.md).

Each prompt goes out as token ids to ``/v1/completions`` with ``logprobs`` and vLLM's
``return_tokens_as_token_ids``, so the exact sampled ids and their log-probs come back for the
loss; the model (base or adapter) is chosen per request by the role (``models``). After a GRPO
update, ``reload_adapters({name: folder})`` swaps the served adapters through vLLM's
``/v1/unload_lora_adapter`` and ``/v1/load_lora_adapter``.

One backend may serve several event loops in turn (``LocalRollouts`` and ``RemoteRollouts`` run
each rollout under its own ``asyncio.run``): its HTTP client and concurrency limit belong to the
running loop, made on first use there; those of a closed loop are dropped.

Log-probs: ``multiminddev serve`` returns log p under softmax(logits / T) (T = 1 for greedy),
as the in-process backend records them. vLLM returns the raw (T = 1) distribution unless
started with ``--logprobs-mode processed_logprobs``, which applies temperature and top-p;
sample at T = 1 and top_p = 1 (or recompute) where the two must agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.policy.chat import end_of_turn_ids
from multiminddev.policy.generation import FinishReason, GenerationOutput, SamplingParams

TOKEN_ID_PREFIX = "token_id:"


class RemoteGenerationError(RuntimeError):
    """The server refused or failed a request; the message carries its answer."""


class OpenAIGenerationBackend:
    """Generate through ``{base_url}/completions``; ``models[role]`` names the model (base or
    adapter) each role decodes with, ``default_model`` the rest."""

    def __init__(
        self,
        *,
        base_url: str,
        tokenizer: Any,
        models: Mapping[str, str] | None = None,
        default_model: str = "base",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        context_window: int | None = None,
    ):
        if max_concurrency < 1:
            raise ValueError("OpenAIGenerationBackend.max_concurrency must be >= 1")
        self.base_url = api_url(base_url)
        self.tokenizer = tokenizer
        self.models = {AgentRole(k).value: v for k, v in (models or {}).items()}
        self.default_model = default_model
        self.stop_token_ids = end_of_turn_ids(tokenizer)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._max_concurrency = max_concurrency
        # httpx clients and asyncio semaphores are bound to the loop they first ran on
        self._per_loop: dict[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = {}
        if context_window is not None:
            self.context_window = context_window
        self.tokens_generated = 0
        # Cumulative wall seconds with at least one generate call in flight (overlapping calls
        # count once), as the in-process backend's "generate".
        self.seconds = {"generate": 0.0}
        self._in_flight = 0
        self._busy_since = 0.0

    def _loop_state(self) -> tuple[Any, asyncio.Semaphore]:
        """The running loop's client and semaphore (made on first use in that loop)."""
        import httpx

        loop = asyncio.get_running_loop()
        for old in [o for o in self._per_loop if o.is_closed()]:
            del self._per_loop[old]  # its sockets died with it; nothing left to close
        if loop not in self._per_loop:
            self._per_loop[loop] = (httpx.AsyncClient(timeout=self._timeout_s,
                                                      headers=self._headers),
                                    asyncio.Semaphore(self._max_concurrency))
        return self._per_loop[loop]

    def model_for(self, role: AgentRole | str) -> str:
        return self.models.get(AgentRole(role).value, self.default_model)

    async def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, role: AgentRole
    ) -> list[GenerationOutput]:
        """``len(prompts) * sampling.n`` outputs, prompt 0's samples first; one request per
        prompt, sent concurrently (the server batches)."""
        if any(not p for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        model = self.model_for(role)
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1
        try:
            per_prompt = await asyncio.gather(
                *(self._complete(i, p, sampling, model) for i, p in enumerate(prompts)))
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.seconds["generate"] += time.perf_counter() - self._busy_since
        outputs = [o for group in per_prompt for o in group]
        self.tokens_generated += sum(len(o.token_ids) for o in outputs)
        return outputs

    def request_body(self, prompt: list[int], sampling: SamplingParams, model: str
                     ) -> dict[str, Any]:
        """The ``/v1/completions`` body for one prompt (vLLM extensions included)."""
        body: dict[str, Any] = {
            "model": model, "prompt": list(prompt), "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "n": sampling.n,
            "logprobs": 1, "return_tokens_as_token_ids": True,
            # vLLM: stop at the chat template's end-of-turn token too, and keep it in the
            # tokens (the in-process backend records it as the reply's last token)
            "stop_token_ids": list(self.stop_token_ids), "skip_special_tokens": True,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
            body["include_stop_str_in_output"] = True
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def _seeded(self, sampling: SamplingParams, index: int) -> SamplingParams:
        # One seed per prompt: equal prompts (a GRPO group) must not get equal samples, as they
        # do not from the in-process backend, which seeds once per batch.
        if sampling.seed is None or index == 0:
            return sampling
        return dataclasses.replace(sampling, seed=sampling.seed + index)

    async def _complete(self, index: int, prompt: list[int], sampling: SamplingParams,
                        model: str) -> list[GenerationOutput]:
        body = self.request_body(prompt, self._seeded(sampling, index), model)
        async with self._loop_state()[1]:
            data = await self._post("/completions", body)
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != sampling.n:
            raise RemoteGenerationError(f"{self.base_url}: asked for {sampling.n} samples, "
                                        f"got {len(choices)}")
        return [self._output(index, choice, sampling) for choice in choices]

    def _output(self, index: int, choice: dict[str, Any], sampling: SamplingParams
                ) -> GenerationOutput:
        logprobs = choice.get("logprobs") or {}
        labels = logprobs.get("tokens")
        values = logprobs.get("token_logprobs")
        if labels is None or values is None:
            raise RemoteGenerationError(f"{self.base_url}: the reply has no logprobs; the "
                                        "server must support `logprobs` on completions")
        tokens = [token_id(label) for label in labels]
        reason = choice.get("finish_reason")
        if reason == "length":
            finish = FinishReason.LENGTH
        elif tokens and tokens[-1] in self.stop_token_ids:
            finish = FinishReason.EOS
        else:
            finish = FinishReason.STOP if sampling.stop else FinishReason.EOS
        return GenerationOutput(
            token_ids=tokens, logprobs=[float(v) if v is not None else 0.0 for v in values],
            text=self.tokenizer.decode(tokens, skip_special_tokens=True), finish_reason=finish,
            prompt_index=index)

    # ------------------------------------------------------------------ adapters

    async def list_models(self) -> list[str]:
        return [m["id"] for m in await self.model_cards()]

    async def model_cards(self) -> list[dict[str, Any]]:
        """``/v1/models``' entries (``id``; ``root``: an adapter's folder on vLLM and ours)."""
        data = await self._get("/models")
        return list(data.get("data", []))

    async def load_adapter(self, name: str, path: str) -> None:
        await self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    async def unload_adapter(self, name: str) -> None:
        await self._post("/unload_lora_adapter", {"lora_name": name})

    async def reload_adapters(self, paths: Mapping[str, str]) -> None:
        """Serve the adapters saved at ``paths`` ({name: folder}, e.g. after a GRPO update)
        under the same names: each loaded one is unloaded first (vLLM refuses to load a name
        it already has)."""
        served = set(await self.list_models())
        for name, path in paths.items():
            if name in served:
                await self.unload_adapter(name)
            await self.load_adapter(name, str(path))

    async def aclose(self) -> None:
        """Close the running loop's client (those of closed loops are already gone)."""
        state = self._per_loop.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state[0].aclose()

    # ------------------------------------------------------------------ HTTP

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            reply = await self._loop_state()[0].post(self.base_url + path, json=body)
        except httpx.HTTPError as exc:
            raise RemoteGenerationError(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") \
                from exc
        return _json(reply, path)

    async def _get(self, path: str) -> dict[str, Any]:
        import httpx

        try:
            reply = await self._loop_state()[0].get(self.base_url + path)
        except httpx.HTTPError as exc:
            raise RemoteGenerationError(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") \
                from exc
        return _json(reply, path)


def api_url(base_url: str) -> str:
    """The server's OpenAI API root: ``http://host:port`` or ``.../v1`` -> ``.../v1``. A URL
    without an http(s) scheme and a host is a ``ValueError`` that says what to give."""
    from urllib.parse import urlsplit

    parts = urlsplit(str(base_url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL {base_url!r}: give http(s)://HOST:PORT of an "
                         "OpenAI-compatible server (multiminddev serve, or vLLM)")
    url = str(base_url).strip().rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def list_served_models(base_url: str, *, api_key: str | None = None,
                       timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``GET /v1/models`` (synchronous): the served models' cards (``id``, and ``root``: an
    adapter's folder on vLLM and ``multiminddev serve``). An unreachable server or a reply
    that is not a model list is a ``RemoteGenerationError`` with one line that says so."""
    import httpx

    url = api_url(base_url) + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise RemoteGenerationError(f"{url}: {type(exc).__name__}: {exc}; start the server "
                                    "(multiminddev serve, or vLLM) or fix the URL") from None
    data = _json(reply, url)
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) and "id" in m
                                               for m in models):
        raise RemoteGenerationError(f"{url}: the reply is not an OpenAI model list; is this "
                                    "an OpenAI-compatible server?")
    return models


def token_id(label: str) -> int:
    """``"token_id:123"`` -> 123 (vLLM's ``return_tokens_as_token_ids``)."""
    if not isinstance(label, str) or not label.startswith(TOKEN_ID_PREFIX):
        raise RemoteGenerationError(f"logprobs token {label!r} is not 'token_id:<id>'; the "
                                    "server must support return_tokens_as_token_ids")
    return int(label[len(TOKEN_ID_PREFIX):])


def _json(reply: Any, path: str) -> dict[str, Any]:
    if reply.status_code >= 400:
        try:  # OpenAI's {"error": {"message"}}, older vLLM's {"message"}
            data = reply.json()
            error = data.get("error") if isinstance(data, dict) else None
            message = (error.get("message") if isinstance(error, dict) else error) \
                or (data.get("message") if isinstance(data, dict) else None) or reply.text
        except ValueError:
            message = reply.text
        message = str(message)
        raise RemoteGenerationError(f"{path}: HTTP {reply.status_code}: "
                                    f"{' '.join(message.split())[:300]}")
    if not reply.content:
        return {}
    try:
        return reply.json()
    except ValueError:  # vLLM answers the adapter routes in plain text
        return {"message": reply.text}
