"""Generation through ``multiminddev serve`` (remote backend) against the in-process backend.

    python benchmarks/bench_serve.py --device cuda --prompts 32 --new-tokens 256 \
        --out serve_bench.json
    python benchmarks/bench_serve.py --adapters runs/x/checkpoints/final --role generator

Starts ``multiminddev serve`` in a subprocess on a free port (same model, same adapters), then
on the same Generator prompts (built-in problems):
- tokens/s of ``HFGenerationBackend`` in this process and of ``OpenAIGenerationBackend``
  through the server, sampled at temperature 1 (new tokens only, EOS-truncated);
- log-prob agreement: the server's greedy replies re-scored in this process with the trainer's
  ``token_logprobs`` (max and mean absolute difference per token), and the fraction of prompts
  whose greedy replies are identical token for token.
Prints one JSON object (also written to --out) with the command, device, date and commit.
The two backends hold one model each, so the GPU must fit two copies.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _device_name(device: str) -> str:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({os.cpu_count()} cores)"


def start_server(args: argparse.Namespace, port: int, extra: list[str],
                 log: Path | None = None) -> subprocess.Popen:
    """``multiminddev serve`` on ``args.model`` and ``args.device`` with ``extra`` flags, once
    it reports ready; its output goes to ``log`` (else only its errors are kept, for the
    message if it exits)."""
    import httpx

    command = [sys.executable, "-m", "multiminddev.cli", "serve", "--model", args.model,
               "--device", args.device, "--port", str(port), *extra]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - the server's lifetime
    server = subprocess.Popen(command, stdout=out,
                              stderr=subprocess.STDOUT if log else subprocess.PIPE)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            why = f"see {log}" if log else server.stderr.read().decode()[-2000:]
            raise SystemExit(f"the server exited with {server.returncode}: {why}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("ready"):
                return server
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    server.terminate()
    raise SystemExit("the server did not become ready")


def write_record(args: argparse.Namespace, argv: list[str] | None, fields: dict[str, Any]
                 ) -> None:
    """Print the run's JSON record (command, device, date, commit, then ``fields``) and write
    it to ``args.out`` where given."""
    record = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "device": _device_name(args.device),
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "commit": _commit(), **fields}
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def prompts_for(tokenizer: Any, count: int) -> list[list[int]]:
    from multiminddev.agents.prompts import generator_messages
    from multiminddev.policy import encode_chat
    from multiminddev.tasks.builtin import builtin_problems

    problems = builtin_problems(shapes_per_family=1)
    return [encode_chat(tokenizer, generator_messages(problems[i % len(problems)]))
            for i in range(count)]


async def timed(backend: Any, prompts: list[list[int]], sampling: Any, role: Any
                ) -> tuple[list[Any], float]:
    start = time.perf_counter()
    outputs = await backend.generate(prompts, sampling, role)
    _sync()
    return outputs, time.perf_counter() - start


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def agreement(policy: Any, role: Any, prompts: list[list[int]], remote: list[Any],
              local: list[Any]) -> dict[str, Any]:
    """Re-score the server's greedy replies in this process; compare with what it returned."""
    import torch

    from multiminddev.policy import token_logprobs

    diffs = []
    with policy.use(role) as model, torch.no_grad():
        for prompt, out in zip(prompts, remote):
            if not out.token_ids:
                continue
            ids = torch.tensor([prompt + out.token_ids], device=policy.device)
            mine = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].tolist()
            diffs += [abs(a - b) for a, b in zip(mine, out.logprobs)]
    same = sum(r.token_ids == m.token_ids for r, m in zip(remote, local))
    return {"tokens_compared": len(diffs), "max_abs_logprob_diff": max(diffs, default=0.0),
            "mean_abs_logprob_diff": sum(diffs) / max(len(diffs), 1),
            "identical_greedy_replies": f"{same}/{len(remote)}"}


async def run(args: argparse.Namespace, policy: Any, url: str) -> dict[str, Any]:
    from multiminddev.agents.roles import AgentRole
    from multiminddev.policy import HFGenerationBackend, SamplingParams
    from multiminddev.policy.remote import OpenAIGenerationBackend

    role = AgentRole(args.role)
    prompts = prompts_for(policy.tokenizer, args.prompts)
    local = HFGenerationBackend(policy, max_batch_size=args.batch)
    served = {role.value: role.value} if args.adapters else {}
    remote = OpenAIGenerationBackend(base_url=url, tokenizer=policy.tokenizer, models=served)
    # no seed: seeded requests are never batched together by the server
    sample = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    figures: dict[str, Any] = {}
    try:
        for name, backend in (("in_process", local), ("remote", remote)):
            await timed(backend, prompts[:2], SamplingParams(max_new_tokens=4), role)  # warm-up
            outs, seconds = await timed(backend, prompts, sample, role)
            tokens = sum(len(o.token_ids) for o in outs)
            figures[name] = {"tokens": tokens, "seconds": round(seconds, 3),
                             "tokens_per_s": round(tokens / seconds, 1)}
        remote_greedy, _ = await timed(remote, prompts, greedy, role)
        local_greedy, _ = await timed(local, prompts, greedy, role)
    finally:
        await remote.aclose()
    figures["logprob_agreement"] = agreement(policy, role, prompts, remote_greedy, local_greedy)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--adapters", default=None,
                   help="checkpoint folder with generator/ and optimizer/ (default: none)")
    p.add_argument("--role", default="generator", choices=("generator", "optimizer"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--batch", type=int, default=16, help="in-process max_batch_size")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from multiminddev.policy import PolicyConfig, adapter_paths_in, load_policy

    adapters = adapter_paths_in(args.adapters) if args.adapters else {}
    policy = load_policy(PolicyConfig(model=args.model, device=args.device,
                                      adapter_paths=adapters))
    port = _free_port()
    server = start_server(args, port, ["--adapters", *([args.adapters] if args.adapters else [])])
    try:
        figures = asyncio.run(run(args, policy, f"http://127.0.0.1:{port}/v1"))
    finally:
        server.terminate()
        server.wait(timeout=60)
    write_record(args, argv, {"model": args.model, "adapters": args.adapters, "role": args.role,
                              "prompts": args.prompts, "new_tokens": args.new_tokens, **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
