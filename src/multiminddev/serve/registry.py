"""``ModelRegistry``: one base model and any number of named LoRA adapters on it.

Every request names a model: the base (adapters off) or an adapter (that adapter active), as
vLLM does with ``--enable-lora``. All generation runs under one lock, so requests for different
adapters never see each other's adapter switched in mid-decode; requests are served one
generate call at a time (each call decodes up to ``max_batch_size`` prompts together).

Generation reuses ``HFGenerationBackend`` (the trainer's sampler), so tokens and log-probs
served here are those the in-process backend would record: log p under softmax(logits / T),
recomputed with ``token_logprobs`` (temperature 0 records them at T = 1).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multiminddev.policy.chat import end_of_turn_ids
from multiminddev.policy.generation import HFGenerationBackend, SamplingParams, left_pad
from multiminddev.policy.model import PolicyConfig, load_base_model, load_tokenizer
from multiminddev.serve.config import ADAPTER_NAME, ServeConfig


class AdapterError(ValueError):
    """An adapter could not be loaded or unloaded; the message says why."""


class UnknownModelError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class ModelRegistry:
    """Base model + named adapters. ``load()`` reads the weights (slow); until then
    ``loaded`` is False and generation raises."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.base_name = config.base_name
        self.tokenizer: Any = None
        self.policy_config: Any = None
        self._base: Any = None  # the plain model (before any adapter)
        self._peft: Any = None  # the PeftModel once an adapter was loaded
        self.adapters: dict[str, str] = {}  # name -> folder
        self.lock = threading.RLock()  # held for every forward pass on the shared model
        self._backends: dict[tuple[tuple[str, str], ...], HFGenerationBackend] = {}

    # ------------------------------------------------------------------ loading

    @property
    def loaded(self) -> bool:
        return self._base is not None

    def load(self) -> None:
        self.policy_config = PolicyConfig(model=self.config.model, device=self.config.device,
                                          dtype=self.config.dtype)
        self.tokenizer = load_tokenizer(self.policy_config)
        self._base = load_base_model(self.policy_config)
        for name, path in self.config.adapters.items():
            self.load_adapter(name, path)

    def names(self) -> list[str]:
        return [self.base_name, *self.adapters]

    def check(self, name: str) -> str:
        if name != self.base_name and name not in self.adapters:
            raise UnknownModelError(f"model {name!r} is not loaded; loaded: {self.names()}")
        return name

    def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) adapter ``name`` from a peft adapter folder."""
        from peft import PeftModel

        if not ADAPTER_NAME.match(name or ""):
            raise AdapterError(f"lora_name {name!r}: use letters, digits, '.', '_' or '-'")
        if name == self.base_name:
            raise AdapterError(f"lora_name {name!r} is the base model's name; choose another")
        if not (Path(path) / "adapter_config.json").is_file():
            raise AdapterError(f"lora_path {path}: no adapter_config.json there; pass a LoRA "
                               "adapter folder on the server's file system")
        with self.lock:
            if name in self.adapters:
                self._peft.delete_adapter(name)
                del self.adapters[name]
            try:
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(self._base, path, adapter_name=name)
                else:
                    self._peft.load_adapter(path, adapter_name=name)
            except (ValueError, OSError, RuntimeError, KeyError) as exc:
                raise AdapterError(f"adapter {path} does not fit the base model: "
                                   f"{' '.join(str(exc).split())[:300]}") from exc
            self._peft.eval()
            self.adapters[name] = str(path)
            if self._peft.active_adapter not in self.adapters:  # it was deleted: use a live one
                self._peft.set_adapter(name)

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            if name not in self.adapters:
                raise AdapterError(f"adapter {name!r} is not loaded; loaded adapters: "
                                   f"{sorted(self.adapters)}")
            self._peft.delete_adapter(name)
            del self.adapters[name]
            if self.adapters:  # peft keeps the deleted one as active; point it at a live one
                self._peft.set_adapter(next(iter(self.adapters)))

    # ------------------------------------------------------------------ models

    @contextlib.contextmanager
    def activate(self, name: str) -> Iterator[Any]:
        """The shared model with ``name`` active, under the lock for the whole block."""
        with self.lock:
            self.check(name)
            if not self.loaded:
                raise RuntimeError("the model is still loading")
            if self._peft is None:
                yield self._base
            elif name == self.base_name:
                if not self.adapters:  # peft cannot disable adapters it no longer has
                    yield self._peft.get_base_model()
                else:
                    with self._peft.disable_adapter():
                        yield self._peft
            else:
                self._peft.set_adapter(name)
                yield self._peft

    @property
    def device(self) -> Any:
        return next(self._base.parameters()).device

    @property
    def context_window(self) -> int:
        return int(getattr(self._base.config, "max_position_embeddings", 0) or 2048)

    def backend(self, models: dict[str, str] | None = None, default: str | None = None
                ) -> HFGenerationBackend:
        """A ``GenerationBackend`` whose role ``r`` decodes with model ``models[r]`` (else
        ``default``, else the base)."""
        models = dict(models or {})
        default = default or self.base_name
        key = (*sorted(models.items()), ("", default))
        if key not in self._backends:
            view = _NamedModels(self, models, default)
            self._backends[key] = HFGenerationBackend(view, max_batch_size=self.config.max_batch_size,
                                                      compiled_decoding=False)
        return self._backends[key]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, name: str) -> list[Any]:
        """Blocking: ``len(prompts) * sampling.n`` outputs of model ``name``."""
        self.check(name)
        return self.backend(default=name).generate_sync(prompts, sampling, name)  # type: ignore[arg-type]

    def stream(self, prompt: list[int], sampling: SamplingParams, name: str,
               emit: Any) -> None:
        """Blocking: decode one prompt, calling ``emit(token_ids)`` as tokens arrive and
        ``emit(None)`` at the end. No log-probs (they come from a pass after decoding)."""
        import torch
        from transformers.generation.streamers import BaseStreamer

        class _Streamer(BaseStreamer):
            prompt_seen = False

            def put(self, value: Any) -> None:
                if not self.prompt_seen:  # generate hands over the prompt first
                    self.prompt_seen = True
                    return
                emit([int(t) for t in value.reshape(-1).tolist()])

            def end(self) -> None:
                pass

        pad = self.tokenizer.pad_token_id
        ids, mask = left_pad([prompt], pad if pad is not None else self.tokenizer.eos_token_id,
                             self.device)
        kwargs: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens,
                                  "eos_token_id": list(end_of_turn_ids(self.tokenizer)),
                                  "pad_token_id": self.tokenizer.pad_token_id,
                                  "streamer": _Streamer()}
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=0)
        else:
            kwargs.update(do_sample=False)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        try:
            with self.activate(name) as model, torch.no_grad():
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        finally:
            emit(None)


class _NamedModels:
    """What ``HFGenerationBackend`` needs of a policy, over the registry: ``use(role)``
    activates the model named for that role."""

    def __init__(self, registry: ModelRegistry, models: dict[str, str], default: str):
        self.registry = registry
        self.models = models
        self.default = default
        self.tokenizer = registry.tokenizer
        self.config = registry.policy_config

    def name_for(self, role: Any) -> str:
        return self.models.get(getattr(role, "value", role), self.default)

    @contextlib.contextmanager
    def use(self, role: Any) -> Iterator[Any]:
        with self.registry.activate(self.name_for(role)) as model:
            yield model

    def sampling_model(self, role: Any, dtype: Any = None) -> Any:
        return None  # generate with the model ``use`` yielded

    @property
    def device(self) -> Any:
        return self.registry.device

    @property
    def context_window(self) -> int:
        return self.registry.context_window
