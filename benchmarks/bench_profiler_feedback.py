"""Does the profiler's report change what the Optimizer achieves? The same agents on the same
problems, with and without Nsight Compute figures in the Tester's report.

    PYTHONPATH=src python3 benchmarks/bench_profiler_feedback.py --out runs/profiler_feedback \
        [--adapters RUN_DIR/rl_checkpoints/final_model | none] [--element-type-line] \
        [--problems builtin:tier0,tier1:heldout] [--turns 4] [--samples 1] [--temperature 0]

Both variants run the same episodes (greedy by default, so they differ only where the report
does): turn 1 is the Generator's, turns 2.. the Optimizer's, each handed the best kernel so far
and the Tester's report on it. Without ``--adapters`` the agents the package ships are used (as
``multiminddev bench`` does). Writes ``OUT/{plain,profiler}/episodes.jsonl`` and
``OUT/profiler_feedback.json``: per variant the compile, correct and fast_1 rates and the mean
best speedup over episodes, the problems whose best speedup differs between the variants, and
how many Optimizer turns got figures (0 means ncu or the GPU was missing: the comparison then
measures nothing). Needs a GPU and ``ncu`` on PATH.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

VARIANTS = ("plain", "profiler")
FAST = 1.0  # fast_1: correct and at least as fast as eager PyTorch


def episode_figures(episode: dict[str, Any]) -> dict[str, Any]:
    """An episode's outcome: any turn compiled / correct, its best correct speedup, and how many
    of its turns' reports carried profiler figures."""
    results = [t.get("eval_result") or {} for t in episode["turns"]]
    speeds = [(r.get("benchmark") or {}).get("speedup_vs_eager") or 0.0
              for r in results if r.get("status") == "ok"]
    return {"problem": episode["problem"]["name"],
            "compiled": any(r.get("status") not in (None, "compile_error", "rejected")
                            for r in results),
            "correct": bool(speeds), "speedup": max(speeds, default=0.0),
            "profiled_turns": sum(1 for t in episode["turns"]
                                  if (t.get("profile") or {}).get("status") == "ok")}


def variant_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    n = max(len(rows), 1)
    return {"episodes": float(len(rows)),
            "compile_rate": sum(r["compiled"] for r in rows) / n,
            "correct_rate": sum(r["correct"] for r in rows) / n,
            "fast_1": sum(r["correct"] and r["speedup"] >= FAST for r in rows) / n,
            "mean_best_speedup": sum(r["speedup"] for r in rows) / n,
            "profiled_turns": float(sum(r["profiled_turns"] for r in rows))}


def compare(plain: list[dict[str, Any]], profiled: list[dict[str, Any]],
            tolerance: float = 0.05) -> dict[str, Any]:
    """Both variants' summaries and the problems whose best speedup moved by more than
    ``tolerance`` (relative) between them."""
    by_problem = {r["problem"]: r for r in plain}
    changed = []
    for row in profiled:
        before = by_problem.get(row["problem"])
        if before is None:
            continue
        base = max(before["speedup"], 1e-9)
        if abs(row["speedup"] - before["speedup"]) > tolerance * base:
            changed.append({"problem": row["problem"], "plain": before["speedup"],
                            "profiler": row["speedup"]})
    return {"plain": variant_summary(plain), "profiler": variant_summary(profiled),
            "changed_problems": changed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default=None, help="base model (default: the shipped agents')")
    p.add_argument("--adapters", default=None,
                   help="folder with generator/ and optimizer/ adapters; 'none': the model "
                        "alone; default: the shipped agents")
    p.add_argument("--element-type-line", action="store_true",
                   help="prompts end with the element-type line (agents trained with it)")
    p.add_argument("--problems", default="builtin:tier0,tier1:heldout")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=800)
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)

    from multiminddev.agents.shipped import shipped_agents
    from multiminddev.commands.bench import _load_problems, bench_policies, policy_runs
    from multiminddev.env import EvalConfig
    from multiminddev.episode.runner import EpisodeConfig
    from multiminddev.policy import SamplingParams

    if shutil.which("ncu") is None:
        print("warning: ncu is not on PATH: the profiler variant gets no figures", file=sys.stderr)
    shipped = None
    if args.adapters is None and args.model is None:
        shipped = shipped_agents()
        if shipped is None:
            print("error: the package ships no agents; give --adapters DIR or --adapters none",
                  file=sys.stderr)
            return 2
    adapters = [] if args.adapters in (None, "none") else [Path(args.adapters)]
    runs = policy_runs([args.model] if args.model else ([] if adapters or shipped
                                                        else ["default"]), adapters, shipped)
    (label, policy_cfg), = runs.items()
    problems = _load_problems(args.problems, args.limit)
    element_type = args.element_type_line or (shipped is not None and shipped.element_type_line)
    rows: dict[str, list[dict[str, Any]]] = {}
    for variant in VARIANTS:
        episode_cfg = EpisodeConfig(
            max_turns=args.turns, element_type=element_type, patience=0, target_speedup=0,
            profiler_feedback=variant == "profiler",
            sampling=SamplingParams(temperature=args.temperature,
                                    max_new_tokens=args.max_new_tokens))
        episodes = bench_policies({variant: policy_cfg}, problems, episode_config=episode_cfg,
                                  eval_config=EvalConfig(num_workers=args.workers),
                                  group_size=args.samples, out_dir=args.out, progress=True)
        rows[variant] = [episode_figures(e) for e in episodes[variant]]
    result = {"agents": label, "problems": args.problems, "turns": args.turns,
              "temperature": args.temperature, **compare(rows["plain"], rows["profiler"])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profiler_feedback.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
