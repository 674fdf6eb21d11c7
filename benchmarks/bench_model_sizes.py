"""What fits on one GPU: decoding, SFT and GRPO steps of Qwen2.5-Coder-shaped models.

    python benchmarks/bench_model_sizes.py --sizes 0.5B 1.5B 7B --out DIR
    python benchmarks/bench_model_sizes.py --tiny --out DIR      # a 2-layer model, CPU, seconds

No weights are downloaded: each model is built from the public config values of
Qwen2.5-Coder-0.5B/1.5B/7B (``SHAPES``) with random weights, so its speed and memory equal the
real model's while its text is noise. The policy is the project's own: ``build_policy`` puts one
LoRA adapter per agent (generator, optimizer) with ``PolicyConfig``'s rank, alpha and target
modules on the frozen base, with the project's merged sampling where it applies (<= 3B
parameters). The tokenizer is a word-level one with one token per id (``random_tokenizer``),
since Qwen's own cannot be downloaded either.

Per size and base precision (bf16, and 4-bit NF4 through bitsandbytes when it imports), with the
generator adapter active:

- decode tokens/s at batch 1 and batch 16: ``HFGenerationBackend.generate_sync``, temperature 1,
  ``--new-tokens`` per row from a ``--prompt-len`` prompt; tokens/s counts the tokens sampled
  over the seconds spent in ``generate`` (the backend's own log-prob pass is timed apart). A
  random model ends a row at EOS with odds ~1/vocab per token, so the count is what was sampled.
- SFT step: forward, SFT's ``assistant_nll`` on the second half of each row, backward and an
  AdamW step on the adapter, for ``--sft-batch`` rows of ``--seq-len`` tokens (bf16 autocast on
  a GPU, as SFT's Trainer runs).
- GRPO step: GRPO's update on ``--grpo-group`` rows (``train.grpo.build_batch`` of TurnSamples
  with a ``--seq-len`` / 2 token prompt and reply, made-up old log-probs and advantages): the
  KL reference's no-grad log-probs, then ``token_logprobs`` with grad, ``batch_loss`` (the
  project's GRPO loss with ``GRPOConfig``'s defaults), backward, gradient clipping, AdamW step.
- peak memory (``torch.cuda.max_memory_allocated``, the model included) per phase.

An out-of-memory error ends only the measurement it struck (reported as "does not fit"); the
next one runs. Writes ``model_sizes.json`` and ``model_sizes.md`` (the table of
docs/training.md, "What fits on one GPU") under ``--out``.
"""

from __future__ import annotations

import argparse
import enum
import gc
import importlib.util
import json
import math
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import (
    HFGenerationBackend,
    PolicyConfig,
    PolicyError,
    SamplingParams,
    build_policy,
    load_base_model,
    token_logprobs,
)
from multiminddev.rl.losses import assistant_nll
from multiminddev.train.grpo import GRPOConfig, TurnSample, batch_loss, build_batch

GIB = 2**30
ROLE = AgentRole.GENERATOR
EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The architecture values of a Qwen2.5-Coder config.json (public on the model cards)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6

    def config(self) -> Qwen2Config:
        return Qwen2Config(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps, hidden_act="silu", use_sliding_window=False,
            bos_token_id=self.vocab_size - 1, eos_token_id=self.vocab_size - 1)


SHAPES = {
    "0.5B": ModelShape(name="0.5B", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                       tie_word_embeddings=True),
    "1.5B": ModelShape(name="1.5B", hidden_size=1536, intermediate_size=8960,
                       num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       vocab_size=151936, tie_word_embeddings=True),
    "7B": ModelShape(name="7B", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                     tie_word_embeddings=False),
}
# Two layers of the 0.5B's layout at a small width: the whole path runs on a CPU in seconds.
TINY = ModelShape(name="tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                  tie_word_embeddings=True, max_position_embeddings=2048)


class Precision(str, enum.Enum):
    BF16 = "bf16"  # the base in bfloat16 (float32 on a CPU, where the tiny mode runs)
    NF4 = "nf4"  # the base in 4-bit NF4 (bitsandbytes, CUDA only), adapters in full precision


class Status(str, enum.Enum):
    OK = "ok"
    DOES_NOT_FIT = "does not fit"  # torch.OutOfMemoryError
    UNAVAILABLE = "unavailable"  # the precision cannot run here (note says why)


@dataclass(kw_only=True)
class BenchConfig:
    prompt_len: int = 256
    new_tokens: int = 128
    decode_batches: tuple[int, ...] = (1, 16)
    seq_len: int = 1024
    sft_batch: int = 4
    grpo_group: int = 8
    repeats: int = 2  # timed SFT / GRPO steps after one untimed warm-up; the fastest counts
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_len", "new_tokens", "seq_len", "sft_batch", "grpo_group", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"BenchConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 4:
            raise ValueError("BenchConfig.seq_len must be >= 4: half prompt, half reply")
        if not self.decode_batches or min(self.decode_batches) < 1:
            raise ValueError("BenchConfig.decode_batches: list batch sizes >= 1")


# --tiny's workload: short rows and few of them, so that the 2-layer model runs on a CPU in seconds.
TINY_WORKLOAD = BenchConfig(prompt_len=8, new_tokens=8, decode_batches=(1, 4), seq_len=32,
                            sft_batch=2, grpo_group=2, repeats=1)
WORKLOAD_FLAGS = ("prompt_len", "new_tokens", "decode_batches", "seq_len", "sft_batch",
                  "grpo_group", "repeats")


@dataclass(kw_only=True)
class Measurement:
    status: Status
    seconds: float | None = None  # one step (SFT / GRPO), or the generate seconds (decoding)
    tokens_per_s: float | None = None  # decoding only
    peak_gib: float | None = None
    note: str = ""


@dataclass(kw_only=True)
class SizeResult:
    size: str
    precision: Precision
    device: str
    status: Status
    params: int = 0  # the architecture's parameters, whatever the precision
    adapter_params: int = 0  # one agent's LoRA parameters
    model_gib: float | None = None  # memory held by the built policy before any phase
    phases: dict[str, Measurement] = field(default_factory=dict)
    note: str = ""


# --------------------------------------------------------------------------- building


def random_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer with one token per id (``t<id>``) and EOS as the last id: the
    policy and the generation backend need a real tokenizer, Qwen's cannot be downloaded, and
    random weights make any text noise anyway."""
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab[EOS_TOKEN] = vocab_size - 1
    model = Tokenizer(WordLevel(vocab, unk_token="t0"))
    model.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token=EOS_TOKEN,
                                   pad_token=EOS_TOKEN, unk_token="t0")


def build_base(shape: ModelShape, precision: Precision, device: str, workdir: Path) -> Any:
    """The random-weight base: built on ``device`` from the config; for NF4 written once to
    ``workdir`` and loaded back by the project's loader (``load_base_model``), which quantizes
    on load as it does for a downloaded model."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):  # initialised where it runs: a 7B's CPU init takes minutes
        model = AutoModelForCausalLM.from_config(shape.config(), dtype=dtype).to(device)
    if precision is Precision.BF16:
        return model.eval()
    folder = workdir / f"qwen2.5-coder-{shape.name}-random"
    model.save_pretrained(folder)
    del model
    free_memory()
    try:
        return load_base_model(PolicyConfig(model=str(folder), device=device, dtype="bfloat16",
                                            load_in_4bit=True))
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # a 7B's bf16 files take 15 GB of disk


def architecture_params(shape: ModelShape) -> int:
    """The architecture's parameter count (a 4-bit model's packed tensors count fewer)."""
    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(shape.config())
    return sum(p.numel() for p in model.parameters())


def precision_unavailable(precision: Precision, device: str) -> str | None:
    """Why ``precision`` cannot run here, or None."""
    if precision is Precision.NF4:
        if not device.startswith("cuda"):
            return "4-bit: needs a CUDA GPU"
        if importlib.util.find_spec("bitsandbytes") is None:
            return "4-bit: bitsandbytes not installed"
    return None


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- phases


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / GIB if device.startswith("cuda") else None


def _autocast(device: str) -> Any:
    # SFT's Trainer runs bf16 autocast on a GPU (train.sft._training_args); the GRPO update
    # runs the model in its own dtype.
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))


def measure_decode(backend: HFGenerationBackend, rows: int, cfg: BenchConfig,
                   rng: random.Random, vocab: int, device: str) -> Measurement:
    prompts = [[rng.randrange(vocab - 1) for _ in range(cfg.prompt_len)] for _ in range(rows)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=cfg.new_tokens, seed=cfg.seed)
    backend.generate_sync(prompts, replace(sampling, max_new_tokens=2), ROLE)  # warm-up
    _reset_peak(device)
    before = backend.seconds["generate"]
    outputs = backend.generate_sync(prompts, sampling, ROLE)
    seconds = backend.seconds["generate"] - before
    tokens = sum(len(o.token_ids) for o in outputs)
    return Measurement(status=Status.OK, seconds=seconds, tokens_per_s=tokens / seconds,
                       peak_gib=_peak_gib(device), note=f"{tokens} tokens")


def _timed_steps(step: Any, cfg: BenchConfig, device: str) -> Measurement:
    """One untimed warm-up step, then ``cfg.repeats`` timed ones; the fastest counts."""
    step()
    _reset_peak(device)
    times = []
    for _ in range(cfg.repeats):
        _sync(device)
        start = time.perf_counter()
        loss = step()
        _sync(device)
        times.append(time.perf_counter() - start)
        if not math.isfinite(loss):
            return Measurement(status=Status.OK, seconds=min(times), peak_gib=_peak_gib(device),
                               note=f"non-finite loss {loss}")
    return Measurement(status=Status.OK, seconds=min(times), peak_gib=_peak_gib(device),
                       note=f"loss {loss:.4f}")


def sft_step_fn(policy: Any, cfg: BenchConfig, rng: random.Random, device: str) -> Any:
    """A closure running one SFT step on the generator adapter; returns the loss."""
    vocab = policy.peft_model.config.vocab_size
    ids = torch.tensor([[rng.randrange(vocab - 1) for _ in range(cfg.seq_len)]
                        for _ in range(cfg.sft_batch)], device=device)
    labels = ids.clone()
    labels[:, : cfg.seq_len // 2] = -100  # the prompt half is not trained on, as in SFT
    mask = torch.ones_like(ids)
    params = policy.trainable_parameters(ROLE)
    optimizer = torch.optim.AdamW(params, lr=2e-4)

    def step() -> float:
        model = policy.model_for(ROLE)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device):
            logits = model(input_ids=ids, attention_mask=mask).logits
        loss = assistant_nll(logits, labels)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def grpo_samples(policy: Any, cfg: BenchConfig, rng: random.Random) -> list[TurnSample]:
    """``cfg.grpo_group`` turns of one group: random prompt and reply tokens, old log-probs
    near a random model's (-log vocab) and unit-scale advantages. The update's arithmetic does
    not depend on the values."""
    vocab = policy.peft_model.config.vocab_size
    half = cfg.seq_len // 2
    samples = []
    for row in range(cfg.grpo_group):
        samples.append(TurnSample(
            group=0, episode=row, turn_index=0, role=ROLE,
            prompt_ids=[rng.randrange(vocab - 1) for _ in range(half)],
            response_ids=[rng.randrange(vocab - 1) for _ in range(cfg.seq_len - half)],
            old_logprobs=[-math.log(vocab) + rng.gauss(0.0, 0.1) for _ in range(cfg.seq_len - half)],
            immediate=0.0, reward=0.0, advantage=rng.gauss(0.0, 1.0)))
    return samples


def grpo_step_fn(policy: Any, cfg: BenchConfig, rng: random.Random, device: str) -> Any:
    """A closure running GRPO's update on one mini-batch (GRPOTrainer.update_role's work for
    one optimizer step: reference log-probs, then optimizer_step); returns the loss."""
    grpo = GRPOConfig(mini_batch_size=cfg.grpo_group)
    pad = policy.tokenizer.pad_token_id
    batch = build_batch(grpo_samples(policy, cfg, rng), pad, policy.device)
    params = policy.trainable_parameters(ROLE)
    optimizer = torch.optim.AdamW(params, lr=grpo.learning_rate, weight_decay=grpo.weight_decay)

    def step() -> float:
        with torch.no_grad(), policy.reference(ROLE) as ref:
            batch.ref_logprobs = token_logprobs(ref, batch.input_ids, batch.attention_mask,
                                                temperature=grpo.temperature)
        model = policy.model_for(ROLE)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        new = token_logprobs(model, batch.input_ids, batch.attention_mask,
                             temperature=grpo.temperature)
        loss, _ = batch_loss(new, batch, grpo)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grpo.max_grad_norm)
        optimizer.step()
        model.eval()
        return float(loss.detach())

    return step


def guarded(measure: Any, device: str) -> Measurement:
    """Run one measurement; an out-of-memory error becomes DOES_NOT_FIT and its memory is
    handed back so that the next measurement starts clean."""
    try:
        return measure()
    except torch.OutOfMemoryError as exc:
        note = str(exc).split("\n")[0][:160]
    peak = _peak_gib(device)
    free_memory()
    return Measurement(status=Status.DOES_NOT_FIT, peak_gib=peak, note=note)


# --------------------------------------------------------------------------- one size


def bench_size(shape: ModelShape, precision: Precision, cfg: BenchConfig, device: str,
               workdir: Path) -> SizeResult:
    label = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    result = SizeResult(size=shape.name, precision=precision, device=label, status=Status.OK)
    reason = precision_unavailable(precision, device)
    if reason is not None:
        result.status, result.note = Status.UNAVAILABLE, reason
        return result
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    policy = base = None
    try:
        result.params = architecture_params(shape)
        base = build_base(shape, precision, device, workdir)
        policy = build_policy(base, random_tokenizer(shape.vocab_size), PolicyConfig(
            device=device, load_in_4bit=precision is Precision.NF4))
        base = None  # the policy holds the model now
        result.adapter_params = sum(p.numel() for p in policy.trainable_parameters(ROLE))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            result.model_gib = torch.cuda.memory_allocated() / GIB
        run_phases(policy, result, cfg, rng, device, shape.vocab_size)
    except torch.OutOfMemoryError as exc:
        result.status, result.note = Status.DOES_NOT_FIT, str(exc).split("\n")[0][:160]
    except PolicyError as exc:
        result.status, result.note = Status.UNAVAILABLE, str(exc)[:200]
    finally:
        del policy, base  # the last references: free_memory can hand their memory back
        free_memory()
    return result


def run_phases(policy: Any, result: SizeResult, cfg: BenchConfig, rng: random.Random,
               device: str, vocab: int) -> None:
    backend = HFGenerationBackend(policy, max_batch_size=max(cfg.decode_batches))
    for rows in cfg.decode_batches:
        result.phases[f"decode_b{rows}"] = guarded(
            lambda rows=rows: measure_decode(backend, rows, cfg, rng, vocab, device), device)
        print_phase(result, f"decode_b{rows}")
    result.phases["sft_step"] = guarded(
        lambda: _timed_steps(sft_step_fn(policy, cfg, rng, device), cfg, device), device)
    print_phase(result, "sft_step")
    free_memory()
    result.phases["grpo_step"] = guarded(
        lambda: _timed_steps(grpo_step_fn(policy, cfg, rng, device), cfg, device), device)
    print_phase(result, "grpo_step")


def print_phase(result: SizeResult, phase: str) -> None:
    m = result.phases[phase]
    figure = (f"{m.tokens_per_s:.1f} tok/s" if m.tokens_per_s is not None
              else f"{m.seconds:.3f} s" if m.seconds is not None else m.status.value)
    peak = f", peak {m.peak_gib:.2f} GiB" if m.peak_gib is not None else ""
    print(f"{result.device} | {result.size} {result.precision.value} {phase}: {figure}{peak}"
          f" ({m.note})", flush=True)


# --------------------------------------------------------------------------- report

def _cell(m: Measurement | None, attr: str, fmt: str) -> str:
    if m is None:
        return "-"
    if m.status is not Status.OK:
        return m.status.value
    value = getattr(m, attr)
    return format(value, fmt) if value is not None else "-"


def markdown_table(results: list[SizeResult], cfg: BenchConfig) -> str:
    """The docs table: one row per size and base precision; peak GiB is the largest peak of
    the phases that fit (model included)."""
    columns = (["size", "base", "params"] + [f"decode tok/s b{n}" for n in cfg.decode_batches]
               + ["SFT step s", "GRPO step s", "peak GiB", "note"])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        peaks = [m.peak_gib for m in r.phases.values()
                 if m.status is Status.OK and m.peak_gib is not None]
        params = (f"{r.params / 1e9:.2f}B" if r.params >= 1e8 else f"{r.params / 1e6:.2f}M"
                  if r.params else "-")
        note = r.note or "; ".join(f"{k}: {m.note}" for k, m in r.phases.items()
                                   if m.status is Status.DOES_NOT_FIT)
        cells = [r.size, r.precision.value, params]
        cells += [_cell(r.phases.get(f"decode_b{n}"), "tokens_per_s", ".1f")
                  for n in cfg.decode_batches]
        cells += [_cell(r.phases.get("sft_step"), "seconds", ".3f"),
                  _cell(r.phases.get("grpo_step"), "seconds", ".3f"),
                  f"{max(peaks):.1f}" if peaks else "-", note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, results: list[SizeResult], cfg: BenchConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record = {"config": asdict(cfg), "results": [asdict(r) for r in results]}
    (out / "model_sizes.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "model_sizes.md").write_text(markdown_table(results, cfg))


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=list(SHAPES), metavar="SIZE",
                   help=f"model sizes among {list(SHAPES)} (default: all)")
    p.add_argument("--tiny", action="store_true",
                   help="a 2-layer model instead of --sizes: runs on a CPU in seconds")
    p.add_argument("--precisions", nargs="+", default=[p.value for p in Precision],
                   metavar="P", help=f"base precisions among {[p.value for p in Precision]}")
    p.add_argument("--device", default="auto", help="auto: cuda if present, else cpu")
    # Unset workload flags take BenchConfig's defaults, or TINY_WORKLOAD's with --tiny.
    p.add_argument("--prompt-len", type=int)
    p.add_argument("--new-tokens", type=int)
    p.add_argument("--decode-batches", type=int, nargs="+")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--sft-batch", type=int)
    p.add_argument("--grpo-group", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The workload: the flags given, the rest from TINY_WORKLOAD (--tiny) or the defaults."""
    chosen = {name: getattr(args, name) for name in WORKLOAD_FLAGS
              if getattr(args, name) is not None}
    if "decode_batches" in chosen:
        chosen["decode_batches"] = tuple(chosen["decode_batches"])
    return replace(TINY_WORKLOAD, **chosen) if args.tiny else BenchConfig(**chosen)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = [s for s in args.sizes if s not in SHAPES]
    bad_precisions = [p for p in args.precisions if p not in {x.value for x in Precision}]
    if unknown or bad_precisions:
        print(f"bench_model_sizes: unknown sizes {unknown} / precisions {bad_precisions}: "
              f"pick sizes from {list(SHAPES)} and precisions from "
              f"{[p.value for p in Precision]}", file=sys.stderr)
        return 2
    try:
        cfg = bench_config(args)
    except ValueError as exc:
        print(f"bench_model_sizes: {exc}", file=sys.stderr)
        return 2
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_model_sizes: --device cuda but this machine has no CUDA GPU", file=sys.stderr)
        return 2
    shapes = [TINY] if args.tiny else [SHAPES[s] for s in args.sizes]
    results = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mmd-sizes-") as workdir:
        for shape in shapes:
            for precision in (Precision(p) for p in args.precisions):
                result = bench_size(shape, precision, cfg, device, Path(workdir))
                if result.note:
                    print(f"{result.device} | {shape.name} {precision.value}: "
                          f"{result.status.value} ({result.note})", flush=True)
                results.append(result)
                write_outputs(args.out, results, cfg)  # what is done survives a later crash
    print(markdown_table(results, cfg), end="")
    print(f"bench_model_sizes: {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
