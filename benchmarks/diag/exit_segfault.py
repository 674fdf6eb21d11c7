"""Diagnose a segfault at interpreter exit after compiled decoding (seen in GPU test runs).

Loads the embedded model, decodes two prompts with compiled decoding, then exits normally after
the cleanup named by ``--cleanup``; the process's exit code says whether teardown crashed:
    python3 -X faulthandler benchmarks/diag/exit_segfault.py --cleanup bare|auto|workers|reset

- bare: ``release_compiled_decoding``'s exit hook removed: the state before that fix;
- auto: as shipped (the exit hook releases compiled decoding before threads are joined);
- workers / reset: only inductor's compile workers shut down, or only the decoding thread's
  graphs reset and the thread ended, explicitly before returning (the hook removed).
"""

from __future__ import annotations

import argparse
import sys
import threading

import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import (
    HFGenerationBackend,
    LogprobSource,
    PolicyConfig,
    SamplingParams,
    encode_chat,
    load_policy,
)
from multiminddev.policy.generation import _decode_executor, release_compiled_decoding


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cleanup", choices=("bare", "auto", "workers", "reset"), default="auto")
    args = p.parse_args()
    policy = load_policy(PolicyConfig(model="default", compiled_decoding=True))
    prompts = [encode_chat(policy.tokenizer, [{"role": "user", "content": t}])
               for t in ("Write a CUDA relu kernel.", "Explain what a warp is.")]
    backend = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER)
    out = backend.generate_sync(prompts, SamplingParams(temperature=0.0, max_new_tokens=32),
                                AgentRole.GENERATOR)
    print("compiled:", backend.compiled_decoding, "tokens:", [len(o.token_ids) for o in out],
          flush=True)
    # threading's exit hooks, a private list of functools.partials (in a diagnosis only)
    hooks = threading._threading_atexits
    ours = [h for h in hooks if getattr(h, "func", h) is release_compiled_decoding]
    if args.cleanup != "auto":
        for hook in ours:
            hooks.remove(hook)
    print(f"exit hooks of release_compiled_decoding: {len(ours)}, kept: "
          f"{args.cleanup == 'auto'}", flush=True)
    if args.cleanup == "reset":  # CUDA graph trees live in the decoding thread
        _decode_executor().submit(torch._dynamo.reset).result()
        torch.cuda.synchronize()
        _decode_executor().shutdown(wait=True)
    if args.cleanup == "workers":
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
    print("cleanup done:", args.cleanup, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
