"""Peak GPU memory and time of one SFT micro-batch, with and without the logits cut.

    python benchmarks/bench_sft_memory.py --model default --batch 4 8 --out DIR

SFT's collator can ask the model for logits only from the batch's first assistant token on
(``collate_examples(..., logits_from_labels=True)``); the loss and gradients are the same (see
tests/train/test_sft.py). This measures what that saves where it matters: one forward and
backward pass of the LoRA-wrapped model, as the Trainer runs it, on the longest Optimizer and
Generator SFT examples of bench_learning's SFT data (its default problem spec, comments
stripped as in the learning runs), at each batch size. Every line says the device. Results go
to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_SFT_PROBLEMS = ("builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2"
                        "+builtin:breadth:shapes1")


def longest_examples(tokenizer: Any, role: Any, problems: list[Any], count: int,
                     max_len: int) -> list[dict[str, list[int]]]:
    """The role's ``count`` longest SFT examples, tokenized as SFT tokenizes them."""
    from multiminddev.agents.roles import AgentRole
    from multiminddev.train.sft import tokenize_chat
    from multiminddev.train.sft_data import sft_examples

    options = ({"variants": ("naive",)} if AgentRole(role) is AgentRole.GENERATOR
               else {"strip_comments": True})
    examples = [tokenize_chat(tokenizer, e.messages, max_len)
                for e in sft_examples(role, problems, **options)]
    return sorted(examples, key=lambda e: len(e["input_ids"]), reverse=True)[:count]


def measure_step(model: Any, batch: dict[str, Any]) -> dict[str, float]:
    """Peak memory above the resting model and the seconds of one forward + backward."""
    import torch

    device = next(model.parameters()).device
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    resting = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    # as the Trainer runs SFT on a GPU with bf16 (sft._training_args)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_bf16_supported()):
        loss = model(**batch).loss
    loss.backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - resting
    model.zero_grad(set_to_none=True)
    return {"loss": float(loss), "peak_gib": peak / 2**30, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--batch", type=int, nargs="+", default=[4, 8])
    p.add_argument("--sft-problems", default=DEFAULT_SFT_PROBLEMS)
    p.add_argument("--max-seq-length", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per case (the first "
                   "pass of each shape also runs once untimed, for CUDA's warm-up)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_sft_memory measures GPU memory: run it on a machine with a CUDA GPU",
              file=sys.stderr)
        return 2
    from multiminddev.agents.roles import AgentRole
    from multiminddev.policy import PolicyConfig, load_policy
    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.sft import _trainable_model, collate_examples

    policy = load_policy(PolicyConfig(model=args.model))
    problems = load_problems(args.sft_problems)
    tokenizer = policy.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = torch.cuda.get_device_name(0)
    rows = []
    for role in (AgentRole.OPTIMIZER, AgentRole.GENERATOR):
        model = _trainable_model(policy, role, full_finetune=False)
        model.train()
        examples = longest_examples(tokenizer, role, problems, max(args.batch), args.max_seq_length)
        for size in args.batch:
            for cut in (False, True):
                batch = collate_examples(pad_id, logits_from_labels=cut)(examples[:size])
                measure_step(model, batch)  # warm-up
                runs = [measure_step(model, batch) for _ in range(args.repeats)]
                row = {"device": device, "role": role.value, "batch": size, "logits_cut": cut,
                       "width": int(batch["input_ids"].shape[1]),
                       "logits_kept": int(batch.get("logits_to_keep", batch["input_ids"].shape[1])),
                       "loss": runs[-1]["loss"],
                       "peak_gib": max(r["peak_gib"] for r in runs),
                       "seconds": min(r["seconds"] for r in runs)}
                rows.append(row)
                print(f"{device} | {role.value} batch {size} width {row['width']} "
                      f"logits {'cut to ' + str(row['logits_kept']) if cut else 'all'}: "
                      f"loss {row['loss']:.5f}, peak +{row['peak_gib']:.2f} GiB, "
                      f"{row['seconds'] * 1000:.0f} ms", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sft_memory.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
