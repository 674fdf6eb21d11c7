"""GRPO rollouts sampled by an OpenAI-compatible server (``multiminddev serve``, or vLLM started
with ``--enable-lora``): ``RemoteRollouts``, a ``RolloutSource`` (train.grpo).

The learner keeps the model for the update; the server holds the same base model with one LoRA
adapter per agent and samples every rollout turn through ``OpenAIGenerationBackend`` (token ids
and their log-probs come back for the loss). Kernels are evaluated here, by the trainer's
evaluator.

After each update ``publish`` saves each agent's adapter to
``<output_dir>/served_adapters/v<version>/<role>/`` and has the server load it under the same
name (``/v1/unload_lora_adapter`` + ``/v1/load_lora_adapter``); the server reads that folder
itself, so it must run on this machine or share the file system at the same path. The server's
model list gives each adapter's folder (``root``): ``publish`` checks that it is the new
version's, and every rollout checks it again before it samples, so each step's record
(``weights_version``) says which weights sampled it. Older version folders go once the server
holds the new one.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.episode import arun_episodes
from multiminddev.policy.remote import OpenAIGenerationBackend, list_served_models
from multiminddev.train.checkpoints import save_role

SERVED_ADAPTERS_DIR = "served_adapters"


class StaleAdapters(RuntimeError):
    """The server does not serve the adapters the learner published last."""


def base_model_name(models: list[dict[str, Any]]) -> str:
    """The served base model's id: the entry without a ``parent`` (an adapter names its base
    there, on vLLM and ``multiminddev serve``); the first entry if none says."""
    if not models:
        raise StaleAdapters("the server lists no model")
    return next((m["id"] for m in models if not m.get("parent")), models[0]["id"])


def version_folder(output_dir: Path, version: int) -> Path:
    return Path(output_dir) / SERVED_ADAPTERS_DIR / f"v{version}"


class RemoteRollouts:
    """A ``RolloutSource`` whose episodes are sampled by the server behind ``backend``
    (its ``models`` map each agent to its served adapter's name) and scored by ``evaluator``
    (anything with ``aevaluate``, such as ``env.Evaluator``). ``output_dir``: where the
    published adapters go (``served_adapters/v<version>/<role>/``); the server must be able to
    read that folder at the same path (same machine or a shared file system)."""

    def __init__(self, backend: OpenAIGenerationBackend, evaluator: Any, *,
                 output_dir: Path | str) -> None:
        self.backend, self.evaluator = backend, evaluator
        self.output_dir = Path(output_dir)
        self.version: int | None = None  # the weights the server holds (publish's count)
        self.served: dict[str, str] = {}  # adapter name -> the folder the server loaded
        self.publish_seconds = 0.0

    @classmethod
    def connect(cls, base_url: str, *, tokenizer: Any, evaluator: Any, output_dir: Path | str,
                roles: tuple[AgentRole, ...] = (AgentRole.GENERATOR, AgentRole.OPTIMIZER),
                adapter_names: Mapping[str, str] | None = None, api_key: str | None = None,
                max_concurrency: int = 64) -> RemoteRollouts:
        """A source for the server at ``base_url``: each of ``roles`` samples from the adapter
        named ``adapter_names[role]`` (default: the role's name, e.g. ``generator``), loaded by
        the first ``publish``; other roles from the served base model."""
        names = {AgentRole(r).value: n for r, n in (adapter_names or {}).items()}
        models = {r.value: names.get(r.value, r.value) for r in map(AgentRole, roles)}
        base = base_model_name(list_served_models(base_url, api_key=api_key))
        backend = OpenAIGenerationBackend(base_url=base_url, tokenizer=tokenizer, models=models,
                                          default_model=base, api_key=api_key,
                                          max_concurrency=max_concurrency)
        return cls(backend, evaluator, output_dir=output_dir)

    # ---------------------------------------------------------------- RolloutSource

    @property
    def tokens_generated(self) -> int:
        return self.backend.tokens_generated

    @property
    def seconds(self) -> dict[str, float]:
        return dict(self.backend.seconds)

    def run_episodes(self, problems: list[Any], group_size: int, config: Any) -> list[Any]:
        """``group_size`` episodes per problem, sampled by the server once it is shown to hold
        the adapters published last."""
        if self.version is None:
            raise StaleAdapters("publish the learner's adapters before the first rollout")

        async def run() -> list[Any]:
            await self._check_served()
            return await arun_episodes(problems, self.backend, self.evaluator, config,
                                       group_size=group_size)

        return asyncio.run(run())

    def publish(self, policy: Any, version: int) -> None:
        """Save the policy's adapters of the served roles under ``v<version>/`` and have the
        server load them; older version folders go once it holds the new ones."""
        if getattr(policy, "separate", False):
            raise ValueError("rollouts on a server load LoRA adapters; full fine-tuning "
                             "(separate models) is not supported there: drop --full-finetune")
        start = time.perf_counter()
        folder = version_folder(self.output_dir, version)
        if folder.exists():  # a resumed run publishes its version again
            shutil.rmtree(folder)
        paths: dict[str, str] = {}
        for role in policy.roles:
            if role.value in self.backend.models:
                saved = save_role(policy, role, folder)
                paths[self.backend.model_for(role)] = str(saved.resolve())
        if not paths:
            raise ValueError(f"none of the policy's agents ({[r.value for r in policy.roles]}) "
                             f"is served: models maps {sorted(self.backend.models)}")

        async def reload() -> None:
            await self.backend.reload_adapters(paths)
            await self._check_served(paths)

        asyncio.run(reload())
        self.version, self.served = version, paths
        for old in folder.parent.glob("v*"):
            if old != folder and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        self.publish_seconds += time.perf_counter() - start

    async def _check_served(self, paths: Mapping[str, str] | None = None) -> None:
        """Raises ``StaleAdapters`` unless the server serves each adapter from its folder in
        ``paths`` (default: those published last). A server whose model list gives no
        ``root`` is taken at its word."""
        paths = self.served if paths is None else paths
        cards = {m["id"]: m for m in await self.backend.model_cards()}
        for name, path in paths.items():
            card = cards.get(name)
            root = None if card is None else card.get("root")
            if card is None or (root is not None and str(root) != path):
                raise StaleAdapters(
                    f"the server at {self.backend.base_url} serves {name!r} from "
                    f"{None if card is None else root}, not {path} (version {self.version}); "
                    "was it restarted or reloaded by someone else? Give each run its own server")

    def close(self) -> None:
        """Nothing to release: the backend's clients close with their event loops."""


class RemoteScaleOut:
    """The pipeline's scale-out hooks (``run_pipeline(scale_out=)``) for a rollout server:
    the GPU plan and the learner's device are this machine's; GRPO's episodes are sampled by
    the server at ``base_url`` and evaluated by the pipeline's evaluator."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._rollouts: RemoteRollouts | None = None

    def gpus(self) -> list[Any]:
        from multiminddev.train.planner import detect_gpus

        return detect_gpus()

    def place(self, ctx: Any) -> str:
        return ctx.plan.policy_device

    def rollouts(self, ctx: Any) -> RemoteRollouts:
        if self._rollouts is None:
            self._rollouts = RemoteRollouts.connect(
                self.base_url, tokenizer=ctx.policy.tokenizer, evaluator=ctx.evaluator,
                output_dir=ctx.settings.output_dir, roles=tuple(ctx.policy.roles))
            ctx.console.print(f"GRPO rollouts sampled by the server at "
                              f"{self._rollouts.backend.base_url}")
        return self._rollouts

    def close(self) -> None:
        self._rollouts = None
