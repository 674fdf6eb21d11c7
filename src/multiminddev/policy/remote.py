"""``OpenAIGenerationBackend``: the ``GenerationBackend`` protocol over an OpenAI-compatible
server — ``multiminddev serve`` or vLLM started with ``--enable-lora`` (docs/serving.md).

Each prompt goes out as token ids to ``/v1/completions`` with ``logprobs`` and vLLM's
``return_tokens_as_token_ids``, so the exact sampled ids and their log-probs come back for the
loss; the model (base or adapter) is chosen per request by the role (``models``). After a GRPO
update, ``reload_adapters({name: folder})`` swaps the served adapters through vLLM's
``/v1/unload_lora_adapter`` and ``/v1/load_lora_adapter``.

Log-probs: ``multiminddev serve`` returns log p under softmax(logits / T) (T = 1 for greedy),
as the in-process backend records them. vLLM returns the raw (T = 1) distribution unless
started with ``--logprobs-mode processed_logprobs``, which applies temperature and top-p;
sample at T = 1 and top_p = 1 (or recompute) where the two must agree.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
        import httpx

        if max_concurrency < 1:
            raise ValueError("OpenAIGenerationBackend.max_concurrency must be >= 1")
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.tokenizer = tokenizer
        self.models = {AgentRole(k).value: v for k, v in (models or {}).items()}
        self.default_model = default_model
        self.stop_token_ids = end_of_turn_ids(tokenizer)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self._limit = asyncio.Semaphore(max_concurrency)
        if context_window is not None:
            self.context_window = context_window
        self.tokens_generated = 0

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
        per_prompt = await asyncio.gather(
            *(self._complete(i, p, sampling, model) for i, p in enumerate(prompts)))
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
        async with self._limit:
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
        data = await self._get("/models")
        return [m["id"] for m in data.get("data", [])]

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
        await self._client.aclose()

    # ------------------------------------------------------------------ HTTP

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            reply = await self._client.post(self.base_url + path, json=body)
        except httpx.HTTPError as exc:
            raise RemoteGenerationError(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") \
                from exc
        return _json(reply, path)

    async def _get(self, path: str) -> dict[str, Any]:
        import httpx

        try:
            reply = await self._client.get(self.base_url + path)
        except httpx.HTTPError as exc:
            raise RemoteGenerationError(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") \
                from exc
        return _json(reply, path)


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
