"""``ServeConfig``: every setting of the ``serve`` server, validated on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.agents.shipped import SHIPPED_DIR
from multiminddev.serve.auth import is_loopback
from multiminddev.serve.limits import Limits

# Adapter (model) names appear in URLs and in the OpenAI ``model`` field.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(kw_only=True)
class ServeConfig:
    # "default" (the embedded SmolLM2 GGUF), a hub id, a local model folder or a .gguf file
    model: str = "default"
    # The OpenAI ``model`` name of the base without adapters.
    base_name: str = "base"
    # LoRA adapters loaded at start, {name: adapter folder}; requests pick one by ``model``.
    # Adapters named "generator" / "optimizer" drive those roles in kernel jobs by default.
    adapters: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"  # auto: cuda if available, else cpu
    dtype: str = "auto"
    max_module_bytes: int = 64_000  # largest module source /v1/kernels/optimize accepts
    max_tokens_limit: int = 4096  # largest max_tokens a completion request may ask for
    max_batch_size: int = 16  # prompts decoded together in one generate call
    # How long a request that finds the model idle waits for others to share its generate call
    # (a client's concurrent requests arrive milliseconds apart); 0: decode at once.
    batch_wait_ms: float = 20.0
    # Kernel jobs: episodes running at once, and jobs waiting behind them before 429.
    max_running_jobs: int = 2
    max_queued_jobs: int = 64
    max_job_turns: int = 8
    # Finished jobs kept in memory for polling (the oldest are dropped first).
    max_finished_jobs: int = 1000
    # The evaluator (multiminddev.env.EvalConfig); None: its defaults.
    eval_config: Any = None
    # Where finished jobs are written as JSON (state_dir/jobs/<id>.json) and where other
    # components (the A/B store) keep their files; None: nothing is written.
    state_dir: str | None = None
    # Kernel jobs' prompts end with the problem's element-type line, as for agents trained on
    # such prompts (the shipped ones): prompts must match training.
    element_type_line: bool = False
    # With a key, every /v1/ route wants "Authorization: Bearer <key>" (serve.auth); a host
    # beyond loopback needs one, since /v1/ holds the admin routes.
    api_key: str | None = None
    # Folders the adapters that requests name (load_lora_adapter, A/B arms) must lie in;
    # empty: the state folder and the shipped agents.
    adapter_roots: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not ADAPTER_NAME.match(self.base_name):
            raise ValueError(f"ServeConfig.base_name={self.base_name!r}: use letters, digits, "
                             "'.', '_' or '-' (at most 64)")
        self.adapters = {str(k): str(v) for k, v in self.adapters.items()}
        for name, path in self.adapters.items():
            if not ADAPTER_NAME.match(name):
                raise ValueError(f"ServeConfig.adapters: name {name!r} must be letters, digits, "
                                 "'.', '_' or '-' (at most 64)")
            if name == self.base_name:
                raise ValueError(f"ServeConfig.adapters: {name!r} is the base model's name; "
                                 "give the adapter another name")
            if not (Path(path) / "adapter_config.json").is_file():
                raise ValueError(f"ServeConfig.adapters[{name!r}]: {path} holds no "
                                 "adapter_config.json; pass a LoRA adapter folder")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("ServeConfig.api_key is empty; give a key or None")
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(f"listening on {self.host} (beyond this machine) needs an API key: "
                             "pass --api-key KEY or set MULTIMINDDEV_API_KEY")
        self.adapter_roots = [str(r) for r in self.adapter_roots]
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServeConfig.port={self.port} must be in 0..65535")
        for name in ("max_module_bytes", "max_tokens_limit", "max_batch_size", "max_running_jobs",
                     "max_job_turns", "max_finished_jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServeConfig.{name} must be >= 1")
        if self.max_queued_jobs < 0:
            raise ValueError("ServeConfig.max_queued_jobs must be >= 0")
        if not 0 <= self.batch_wait_ms <= 10_000:
            raise ValueError(f"ServeConfig.batch_wait_ms={self.batch_wait_ms} must be in "
                             "0..10000 (milliseconds)")

    @property
    def adapter_folders(self) -> list[Path]:
        """The folders request-named adapters must lie in."""
        if self.adapter_roots:
            return [Path(r) for r in self.adapter_roots]
        return [Path(r) for r in (self.state_dir, SHIPPED_DIR) if r is not None]

    @property
    def limits(self) -> Limits:
        return Limits(max_job_turns=self.max_job_turns, max_tokens=self.max_tokens_limit,
                      max_module_bytes=self.max_module_bytes)

    @property
    def jobs_dir(self) -> Path | None:
        return Path(self.state_dir) / "jobs" if self.state_dir else None
