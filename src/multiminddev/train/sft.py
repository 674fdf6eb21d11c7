"""Supervised fine-tuning of one agent (Generator or Optimizer) on chat ``messages``.

Uses transformers' ``Trainer`` (TRL is optional and not needed: the only thing SFTTrainer would
add here is assistant-only loss, which ``tokenize_chat`` does through the chat template). Each
agent trains its own LoRA adapter on the shared frozen base (``policy.use(role)``), or the whole
model with ``full_finetune=True``; QLoRA (4-bit base) is switched on when bitsandbytes and a GPU
are present. Output: ``<output_dir>/sft_checkpoints/<role>/`` (one folder per agent).
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import math
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import load_policy
from multiminddev.policy.model import release_cached_gpu_memory
from multiminddev.train.checkpoints import SFT_DIR, save_role

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


class SFTStatus(str, enum.Enum):
    OK = "ok"
    EMPTY_DATASET = "empty_dataset"  # no example had an assistant token to learn


@dataclass(kw_only=True)
class SFTConfig:
    output_dir: Path = Path("runs/sft")
    num_epochs: float = 3.0
    max_steps: int = -1  # > 0 overrides num_epochs
    batch_size: int = 4
    grad_accum: int = 1
    learning_rate: float = 2e-4
    warmup_ratio: float = 0.03  # fraction of steps (transformers 5 takes it as warmup_steps < 1)
    weight_decay: float = 0.0
    max_seq_length: int = 2048
    full_finetune: bool = False
    qlora: bool | None = None  # None: on when bitsandbytes and a GPU are present
    logging_steps: int = 10
    loss_eval_examples: int = 16  # examples scored before/after (a forward pass each)
    seed: int = 0
    report_to: tuple[str, ...] = ("tensorboard",)

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        if self.num_epochs <= 0 and self.max_steps <= 0:
            raise ValueError("SFTConfig needs num_epochs > 0 or max_steps > 0")
        for name in ("batch_size", "grad_accum", "max_seq_length", "logging_steps",
                     "loss_eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"SFTConfig.learning_rate must be in (0, 1), got {self.learning_rate}")
        if self.full_finetune and self.qlora:
            raise ValueError("full_finetune and qlora exclude each other: a 4-bit base cannot be "
                             "trained in full; drop one of them")

    @property
    def checkpoint_root(self) -> Path:
        return self.output_dir / SFT_DIR


@dataclass(kw_only=True)
class SFTResult:
    status: SFTStatus
    role: AgentRole
    output_dir: Path | None
    num_examples: int = 0
    steps: int = 0
    loss_before: float = math.nan  # mean assistant-token loss on loss_eval_examples, before
    loss_after: float = math.nan  # ... and after training
    dropped: int = 0  # examples with no assistant token left after truncation
    truncated: int = 0  # examples cut at max_seq_length: their reply's end is not learned
    train_loss: float = math.nan  # Trainer's running mean
    seconds: float = 0.0
    qlora: bool = False
    log_history: list[dict[str, Any]] = field(default_factory=list)


def tokenize_chat(tokenizer, messages: list[dict[str, str]], max_len: int) -> dict[str, list[int]]:
    """input_ids and labels (-100 except on assistant tokens) via the tokenizer's chat template.

    Each assistant message's tokens are located by rendering the conversation up to it (with the
    generation prompt) and through it; the difference is what the model must learn to produce.
    """
    def render(msgs, gen_prompt: bool) -> list[int]:
        out = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen_prompt)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    input_ids = render(messages, False)
    labels = [IGNORE_INDEX] * len(input_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(messages[:i], True))
        end = len(render(messages[: i + 1], False))
        labels[start:end] = input_ids[start:end]
    return {"input_ids": input_ids[:max_len], "labels": labels[:max_len]}


def collate_examples(pad_id: int, logits_from_labels: bool = False):
    """Pads tokenized examples (``tokenize_chat``'s) into a batch: ids, attention mask, labels.

    ``logits_from_labels``: the batch also asks the model for logits only from the position
    before the batch's first assistant token on (``logits_to_keep``), with ``labels`` cut to
    those positions, so that a causal LM's own loss is the same as on the whole sequence. Why:
    the prompt's full-vocabulary logits were most of SFT's memory (3 GiB per float32 copy at
    8 x 2048 tokens), and an Optimizer example is about 60% prompt.
    """
    import torch

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, b in enumerate(batch):
            n = len(b["input_ids"])
            ids[row, :n] = torch.tensor(b["input_ids"])
            labels[row, :n] = torch.tensor(b["labels"])
            mask[row, :n] = 1
        out = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        labelled = (labels != IGNORE_INDEX).any(dim=0).nonzero()
        if logits_from_labels and len(labelled) and int(labelled[0]) > 0:
            # logits at position t score token t + 1: keep from the one before the first label
            keep = width - int(labelled[0]) + 1
            out["labels"], out["logits_to_keep"] = labels[:, width - keep:], keep
        return out

    return collate


def mean_assistant_loss(model, examples: list[dict[str, list[int]]], pad_id: int,
                        batch_size: int = 4) -> float:
    """Token-weighted mean cross-entropy on assistant tokens (no grad)."""
    import torch

    from multiminddev.rl.losses import assistant_nll

    collate = collate_examples(pad_id)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = {k: v.to(device) for k, v in collate(examples[i : i + batch_size]).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            total += float(assistant_nll(logits, batch["labels"], IGNORE_INDEX)) * n
            count += n
    model.train(was_training)
    return total / max(count, 1)


def qlora_available() -> bool:
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes") is not None


def _policy_config_for(policy_cfg, cfg: SFTConfig):
    """Full fine-tuning = one trainable model per agent; QLoRA = a 4-bit base when supported."""
    if cfg.full_finetune:
        return replace(policy_cfg, separate_models=True), False
    use_qlora = qlora_available() if cfg.qlora is None else cfg.qlora
    if not use_qlora:
        return policy_cfg, False
    names = {f.name for f in fields(policy_cfg)}
    for flag in ("load_in_4bit", "qlora", "quantize_4bit"):
        if flag in names:
            return replace(policy_cfg, **{flag: True}), True
    if cfg.qlora:
        raise ValueError("qlora=True but PolicyConfig has no 4-bit loading option; "
                         "train plain LoRA (drop --qlora)")
    return policy_cfg, False


def run_sft(role: AgentRole, policy_cfg, dataset, cfg: SFTConfig, *, policy=None) -> SFTResult:
    """Train ``role``'s adapter (or the full model) on ``dataset['messages']``.

    ``policy`` may be passed to reuse an already loaded model (tests, the pipeline); otherwise it
    is loaded from ``policy_cfg``. The adapter is saved to ``cfg.checkpoint_root / role``.
    """
    from transformers import Trainer

    role = AgentRole(role)
    if not role.trainable:
        raise ValueError(f"{role.value} is rule-based and has no weights to fine-tune; "
                         f"use --role generator, optimizer or both")
    start = time.perf_counter()
    qlora = False
    if policy is None:
        policy_cfg, qlora = _policy_config_for(policy_cfg, cfg)
        policy = load_policy(policy_cfg)
    model = _trainable_model(policy, role, cfg.full_finetune)
    tokenizer = policy.tokenizer
    # one token past the limit tells a cut example from one that fits exactly
    longer = [tokenize_chat(tokenizer, m, cfg.max_seq_length + 1) for m in dataset["messages"]]
    truncated = sum(len(e["input_ids"]) > cfg.max_seq_length for e in longer)
    encoded = [{k: v[: cfg.max_seq_length] for k, v in e.items()} for e in longer]
    examples = [e for e in encoded if any(t != IGNORE_INDEX for t in e["labels"])]
    dropped = len(encoded) - len(examples)
    if truncated:
        # a cut reply never shows its end (closing fence, end-of-turn), so the agent may learn
        # to run on (25 of the Optimizer's 246 corpus examples are longer than 2048 tokens)
        log.warning("SFT %s: %d of %d examples were cut at max_seq_length=%d and lose their "
                    "reply's end", role.value, truncated, len(encoded), cfg.max_seq_length)
    out_dir = cfg.checkpoint_root / role.value
    if not examples:
        log.warning("SFT %s: all %d examples lost their reply to truncation at max_seq_length=%d;"
                    " raise max_seq_length", role.value, len(encoded), cfg.max_seq_length)
        return SFTResult(status=SFTStatus.EMPTY_DATASET, role=role, output_dir=None,
                         dropped=dropped, truncated=truncated,
                         seconds=time.perf_counter() - start)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scored = examples[: cfg.loss_eval_examples]
    loss_before = mean_assistant_loss(model, scored, pad_id, cfg.batch_size)
    trainer = Trainer(model=model, args=_training_args(cfg, out_dir / "trainer"),
                      train_dataset=_ListDataset(examples),
                      data_collator=collate_examples(pad_id, logits_from_labels=True))
    output = trainer.train()
    release_cached_gpu_memory()  # evaluation workers on this GPU come next
    loss_after = mean_assistant_loss(model, scored, pad_id, cfg.batch_size)
    save_role(policy, role, cfg.checkpoint_root)
    return SFTResult(status=SFTStatus.OK, role=role, output_dir=out_dir,
                     num_examples=len(examples), steps=output.global_step, dropped=dropped,
                     truncated=truncated,
                     loss_before=loss_before, loss_after=loss_after,
                     train_loss=float(output.training_loss), qlora=qlora,
                     seconds=time.perf_counter() - start,
                     log_history=list(trainer.state.log_history))


class _ListDataset:
    """A list as a torch-style dataset (the Trainer only needs len and getitem)."""

    def __init__(self, items: list[dict[str, list[int]]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.items[i]


def _trainable_model(policy, role: AgentRole, full_finetune: bool):
    if full_finetune and not policy.separate:
        raise ValueError("full fine-tuning needs a policy with separate_models=True "
                         "(run_sft sets it when it loads the policy itself)")
    model = policy.model_for(role)  # activates role's adapter: only its tensors train
    policy.trainable_parameters(role)  # marks them requires_grad
    _forget_gguf_quantizer(model)
    return model


def _forget_gguf_quantizer(model) -> None:
    """A GGUF checkpoint is dequantized to float on load, but transformers keeps its GGUF
    "quantizer" on the model and the Trainer then refuses to train it; the weights are plain
    floats, so drop the marker."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quantizer = getattr(base, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and getattr(method, "value", method) == "gguf":
        base.hf_quantizer = None
        base.is_quantized = False


def _training_args(cfg: SFTConfig, out_dir: Path):
    import torch
    from transformers import TrainingArguments

    on_gpu = torch.cuda.is_available()
    report_to = [r for r in cfg.report_to
                 if r != "tensorboard" or importlib.util.find_spec("tensorboard") is not None]
    return TrainingArguments(
        output_dir=str(out_dir),
        num_train_epochs=cfg.num_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate,
        # A warm-up step at lr 0 would waste a fifth of a 5-step run: none for short runs.
        warmup_steps=0 if 0 < cfg.max_steps < 20 else cfg.warmup_ratio,
        weight_decay=cfg.weight_decay,
        logging_steps=cfg.logging_steps,
        save_strategy="no",
        report_to=report_to or "none",
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        use_cpu=not on_gpu,
        seed=cfg.seed,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
