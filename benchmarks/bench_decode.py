"""Decoding throughput: transformers ``generate`` (the HF backend) against the fast decoder.

    python benchmarks/bench_decode.py --model default --batch 1 64 --new-tokens 256
    python benchmarks/bench_decode.py --model default --optimize      # + `optimize` end to end

On the same prompts (the Generator's prompt for a ReLU problem, once per row), per batch size:
  hf     ``HFGenerationBackend(fast_decoding=False)``: ``model.generate`` with the role's adapter
         (merged into a copy of the base when the policy samples merged), one role per call;
         half the rows decode with the generator's adapter, half with the optimizer's, in two
         calls one after the other.
  fast   the fast decoder: the same rows in two concurrent ``generate`` calls (one per role),
         which the engine decodes in one batch with the adapters applied per row.
Both sample at temperature 1 with up to ``--new-tokens`` tokens and record log-probs from the
sampler, so the figures compare decoding; ``tokens_per_s`` counts the tokens actually sampled
(EOS-truncated) over the calls' wall time. The adapters are randomised (peft starts LoRA B at
zero, which would make both adapters the base) so the two agents really decode differently.
``--optimize`` also times ``multiminddev optimize builtin:tier0:heldout:relu --turns 2
--temperature 0`` in a fresh process (model load included). Every row names its device.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

OPTIMIZE_COMMAND = ["optimize", "builtin:tier0:heldout:relu", "--turns", "2",
                    "--temperature", "0"]


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def randomise_adapters(policy: Any, seed: int = 0, scale: float = 0.02) -> None:
    """Small random LoRA B matrices, so each agent's adapter changes its output."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=generator) * scale).to(p.dtype))


def decode_both_roles(backend: Any, prompts: list[list[int]], sampling: Any,
                      concurrent: bool) -> list[Any]:
    """Half the prompts with the generator's adapter, half with the optimizer's: in two
    threads at once (``concurrent``) or one call after the other."""
    from multiminddev.agents.roles import AgentRole

    half = max(len(prompts) // 2, 1)
    calls = [(prompts[:half], AgentRole.GENERATOR), (prompts[half:], AgentRole.OPTIMIZER)]
    calls = [(p, role) for p, role in calls if p]
    results: list[list[Any]] = [[] for _ in calls]
    if not concurrent:
        return [o for p, role in calls for o in backend.generate_sync(p, sampling, role)]

    def work(index: int) -> None:
        results[index] = backend.generate_sync(calls[index][0], sampling, calls[index][1])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for r in results for o in r]


def bench_decode(policy: Any, path: str, batch: int, new_tokens: int, repeats: int) -> dict:
    from multiminddev.agents.prompts import generator_messages
    from multiminddev.policy import HFGenerationBackend, LogprobSource, SamplingParams, encode_chat
    from multiminddev.tasks.problem import load_problem_source

    problem = load_problem_source(_RELU, name="relu")
    prompt = encode_chat(policy.tokenizer, generator_messages(problem))
    backend = HFGenerationBackend(policy, max_batch_size=batch,
                                  logprob_source=LogprobSource.SAMPLER,
                                  fast_decoding=path == "fast")
    prompts = [prompt] * batch
    _sync()
    warm = time.perf_counter()  # first calls allocate, pick kernels, capture graphs
    decode_both_roles(backend, prompts, SamplingParams(max_new_tokens=new_tokens, seed=1),
                      concurrent=path == "fast")
    _sync()
    warmup_s = time.perf_counter() - warm
    times, tokens, outputs = [], 0, []
    for repeat in range(repeats):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=repeat)
        _sync()
        start = time.perf_counter()
        outputs = decode_both_roles(backend, prompts, sampling, concurrent=path == "fast")
        _sync()
        times.append(time.perf_counter() - start)
        tokens += sum(len(o.token_ids) for o in outputs)
    total = sum(times)
    return {"path": path, "batch": batch, "prompt_tokens": len(prompt), "warmup_s": warmup_s,
            "fast_decoder_used": all(o.extra.get("decoder") == "fast" for o in outputs),
            "new_tokens_per_sample": tokens / (batch * repeats), "tokens_per_s": tokens / total,
            "seconds_per_call": total / repeats}


def time_optimize(model: str) -> dict:
    """``multiminddev optimize`` of one problem, two turns, in a fresh process."""
    command = [sys.executable, "-m", "multiminddev.cli", *OPTIMIZE_COMMAND, "--model", model,
               "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    return {"what": "optimize", "command": " ".join(["multiminddev", *OPTIMIZE_COMMAND]),
            "seconds": seconds, "exit_code": done.returncode,
            "stderr_tail": done.stderr.strip().splitlines()[-1:] if done.returncode > 1 else []}


_RELU = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(1 << 20, device="cuda" if torch.cuda.is_available() else "cpu")]

def get_init_inputs():
    return []
'''


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="'default', a hub id, a folder or a .gguf")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--paths", nargs="+", choices=["hf", "fast"], default=["hf", "fast"])
    p.add_argument("--optimize", action="store_true",
                   help="also time `multiminddev optimize` of one problem, two turns")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="also append each row as a JSON line to this file")
    args = p.parse_args(argv)
    if any(b < 1 for b in args.batch) or args.new_tokens < 1 or args.repeats < 1:
        print("bench_decode: --batch, --new-tokens and --repeats must be >= 1", file=sys.stderr)
        return 2

    from multiminddev.policy import PolicyConfig, PolicyError, load_policy

    def emit(row: dict) -> None:
        print(json.dumps(row) if args.json else _fmt(row), flush=True)
        if args.out:
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    start = time.perf_counter()
    try:
        policy = load_policy(PolicyConfig(model=args.model))
    except (PolicyError, ValueError) as exc:
        print(f"bench_decode: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    randomise_adapters(policy)
    device = _device_name()
    emit({"what": "load_policy", "seconds": time.perf_counter() - start, "device": device})
    rows: dict[tuple[str, int], dict] = {}
    for batch in args.batch:
        for path in args.paths:
            row = bench_decode(policy, path, batch, args.new_tokens, args.repeats)
            rows[(path, batch)] = row
            emit({"what": "decode", "device": device, **row})
        if ("hf", batch) in rows and ("fast", batch) in rows:
            emit({"what": "speedup", "device": device, "batch": batch,
                  "fast_over_hf": rows[("fast", batch)]["tokens_per_s"]
                  / rows[("hf", batch)]["tokens_per_s"]})
    if args.optimize:
        emit({"device": device, **time_optimize(args.model)})
    return 0


def _fmt(row: dict) -> str:
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


if __name__ == "__main__":
    sys.exit(main())
