"""Generation and episode throughput of the HF backend.

    python benchmarks/bench_generation.py --model default --batch 1 8 32 --new-tokens 256
    python benchmarks/bench_generation.py --episodes 16 --turns 3       # + episodes/min

Reports, per batch size: sampled tokens/s (new tokens only, EOS-truncated), prompts/s, and the
cost of the log-prob recomputation (RECOMPUTE vs SAMPLER); then, with --episodes, full
Generator -> Tester -> Optimizer episodes per minute through the real evaluator. Every line
says the device it was measured on. Results go to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def bench_generation(policy: Any, batch: int, new_tokens: int, source: Any, repeats: int) -> dict:
    from multiminddev.agents.prompts import generator_messages
    from multiminddev.agents.roles import AgentRole
    from multiminddev.policy import HFGenerationBackend, SamplingParams, encode_chat
    from multiminddev.tasks.problem import load_problem_source

    problem = load_problem_source(_RELU, name="relu")
    prompt = encode_chat(policy.tokenizer, generator_messages(problem))
    backend = HFGenerationBackend(policy, max_batch_size=batch, logprob_source=source)
    compiled = backend.compiled_decoding
    # min_new_tokens is not exposed: a fixed-length measure would hide EOS behaviour, so we
    # report what was actually sampled.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    # warm-up at the measured batch shape (first calls allocate and pick kernels); compiled
    # decoding compiles per cache length, so its warm-up decodes as far as the measured calls
    _sync()
    warm = time.perf_counter()
    backend.generate_sync([prompt] * batch,
                          SamplingParams(max_new_tokens=new_tokens if compiled else 4, seed=1),
                          AgentRole.GENERATOR)
    _sync()
    warmup_s = time.perf_counter() - warm
    times, tokens = [], 0
    backend.seconds = {k: 0.0 for k in backend.seconds}  # the warm-up does not count
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        outs = backend.generate_sync([prompt] * batch, sampling, AgentRole.GENERATOR)
        _sync()
        times.append(time.perf_counter() - start)
        tokens += sum(len(o.token_ids) for o in outs)
    total = sum(times)
    return {"batch": batch, "logprobs": source.value, "prompt_tokens": len(prompt),
            "compiled_decoding": compiled, "warmup_s": warmup_s,
            "new_tokens_per_sample": tokens / (batch * repeats), "tokens_per_s": tokens / total,
            "prompts_per_s": batch * repeats / total, "seconds_per_call": total / repeats,
            "all_call_seconds": times,
            "generate_s_per_call": backend.seconds["generate"] / repeats,
            "logprobs_s_per_call": backend.seconds["logprobs"] / repeats}


def bench_episodes(policy: Any, episodes: int, turns: int, new_tokens: int,
                   save: Path | None = None) -> dict:
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig, run_episodes, write_episodes_jsonl
    from multiminddev.policy import HFGenerationBackend, SamplingParams
    from multiminddev.tasks.problem import load_problem_source

    problem = load_problem_source(_RELU, name="relu")
    backend = HFGenerationBackend(policy, max_batch_size=max(episodes, 1))
    config = EpisodeConfig(max_turns=turns, patience=turns,
                           sampling=SamplingParams(max_new_tokens=new_tokens, seed=0))
    with Evaluator(EvalConfig()) as evaluator:
        evaluator.warm_up()
        start = time.perf_counter()
        result = run_episodes([problem], backend, evaluator, config, group_size=episodes)
        seconds = time.perf_counter() - start
    n_turns = sum(len(e.turns) for e in result)
    if save is not None:
        write_episodes_jsonl(result, save)
    evals = [t.eval_result for e in result for t in e.turns if t.eval_result is not None]
    eval_statuses: dict[str, int] = {}
    for r in evals:
        eval_statuses[r.status.value] = eval_statuses.get(r.status.value, 0) + 1
    format_failures = sum(t.format_failed for e in result for t in e.turns)
    return {"episodes": episodes, "turns": n_turns, "seconds": seconds,
            "episodes_per_min": 60 * episodes / seconds, "turns_per_min": 60 * n_turns / seconds,
            "statuses": sorted({e.status.value for e in result}),
            "eval_statuses": eval_statuses, "format_failures": format_failures}


def profile_generation(policy: Any, batch: int, new_tokens: int) -> dict:
    """Where a decoding step and a log-prob recomputation spend their time (torch.profiler).

    Prints the top operators by self CPU time and by self device time; returns per-variant
    milliseconds per decoding step (adapter model vs merged copy, with and without stop strings)
    and the recomputation's seconds, so a slow path shows up as numbers, not guesses.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from multiminddev.agents.prompts import generator_messages
    from multiminddev.agents.roles import AgentRole
    from multiminddev.policy import HFGenerationBackend, LogprobSource, SamplingParams, encode_chat
    from multiminddev.tasks.problem import load_problem_source

    problem = load_problem_source(_RELU, name="relu")
    prompt = encode_chat(policy.tokenizer, generator_messages(problem))
    role = AgentRole.GENERATOR
    row: dict[str, Any] = {"batch": batch, "new_tokens": new_tokens}
    sampler = policy.sampler
    variants = [("adapter", None, ()), ("adapter_stop", None, ("```\n",))]
    if sampler is not None:
        variants += [("merged", sampler, ()), ("merged_stop", sampler, ("```\n",))]
    for name, sampler_obj, stop in variants:
        policy.sampler = sampler_obj
        backend = HFGenerationBackend(policy, max_batch_size=batch,
                                      logprob_source=LogprobSource.SAMPLER)
        backend.generate_sync([prompt] * batch, SamplingParams(max_new_tokens=4), role)
        backend.seconds = {k: 0.0 for k in backend.seconds}
        outs = backend.generate_sync([prompt] * batch, SamplingParams(
            temperature=1.0, max_new_tokens=new_tokens, stop=stop, seed=0), role)
        steps = max(len(o.token_ids) for o in outs)
        row[f"ms_per_step/{name}"] = 1000 * backend.seconds["generate"] / max(steps, 1)
        row[f"sampler_logprobs_s/{name}"] = backend.seconds["logprobs"]
    policy.sampler = sampler
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available()
                                           else [])
    backend = HFGenerationBackend(policy, max_batch_size=batch,
                                  logprob_source=LogprobSource.RECOMPUTE)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    backend.generate_sync([prompt] * batch, sampling, role)  # warm-up of both passes
    backend.seconds = {k: 0.0 for k in backend.seconds}
    with profile(activities=activities) as prof:
        backend.generate_sync([prompt] * batch, sampling, role)
    row["recompute_generate_s"] = backend.seconds["generate"]
    row["recompute_logprobs_s"] = backend.seconds["logprobs"]
    sort_device = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    for key in ("self_cpu_time_total", sort_device):
        table = prof.key_averages().table(sort_by=key, row_limit=25)
        print(f"--- top operators by {key} (batch {batch}, {new_tokens} new tokens, one "
              f"generate + recompute call)\n{table}", flush=True)
    return row


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--episodes", type=int, default=0, help="also time N concurrent episodes")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="also append each row as a JSON line to this file")
    p.add_argument("--profile", action="store_true",
                   help="profile one decode + recompute per --batch (top ops) instead of timing")
    p.add_argument("--merged-sampling", choices=["auto", "on", "off"], default="auto",
                   help="sample from a merged copy of base + adapter (PolicyConfig.merged_sampling)")
    p.add_argument("--compiled-decoding", nargs="+", choices=["off", "on"], default=["off"],
                   help="eager and/or static-cache compiled decoding (PolicyConfig."
                        "compiled_decoding), each measured in turn on the same policy")
    args = p.parse_args(argv)

    from multiminddev.policy import LogprobSource, PolicyConfig, load_policy

    def emit(row: dict) -> None:
        # Each row as soon as it is measured: a run cut short still reports what it finished.
        print(json.dumps(row) if args.json else _fmt(row), flush=True)
        if args.out:
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    start = time.perf_counter()
    merged = {"auto": None, "on": True, "off": False}[args.merged_sampling]
    policy = load_policy(PolicyConfig(model=args.model, merged_sampling=merged))
    device = _device_name()
    emit({"what": "load_policy", "seconds": time.perf_counter() - start, "device": device,
          "merged_sampling": policy.sampler is not None,
          "dtype": str(next(policy.model_for(policy.roles[0]).parameters()).dtype).removeprefix(
              "torch.")})
    if args.profile:
        for batch in args.batch:
            row = profile_generation(policy, batch, args.new_tokens)
            emit({"what": "profile", "device": device, **row})
        return 0
    for mode in args.compiled_decoding:
        policy.config.compiled_decoding = mode == "on"
        for batch in args.batch:
            for source in LogprobSource:
                row = bench_generation(policy, batch, args.new_tokens, source, args.repeats)
                emit({"what": "generate", "device": device,
                      "merged_sampling": policy.sampler is not None, **row})
    if args.episodes:
        save = args.out.with_name("episodes.jsonl") if args.out else None
        row = bench_episodes(policy, args.episodes, args.turns, args.new_tokens, save)
        emit({"what": "episodes", "device": device, **row})
    return 0


def _fmt(row: dict) -> str:
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


if __name__ == "__main__":
    sys.exit(main())
