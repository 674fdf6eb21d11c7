"""Where the held-out reward and fast_1 could still come from, per problem, across runs.

    python3 benchmarks/heldout_headroom.py RUN_DIR [RUN_DIR ...] [--stage sft] [--top 15]

Each RUN_DIR is a bench_learning --output-dir (or a copy of it) with
seed<k>/partial.json. Its rows hold, per held-out problem and stage, whether the episode was
correct, its best correct speedup and its reward. Over every (run, seed) of ``--stage``, per
problem:

- how often it was solved, and its mean reward;
- the reward it earns when solved (the median over every solved observation of the problem in
  any stage of any run), and its best speedup;
- its headroom: the mean over observations of (reward when solved - reward), i.e. what the
  mean held-out reward would gain if this problem were solved every time, divided by the number
  of held-out problems in the summary line.

A problem never solved anywhere gives GRPO no correct sample to reinforce; one solved on some
seeds and not others does. Example: after SFT almost all of the fast_1 came from
cumsum_4096x4096 (3.9x eager) and transpose_4096x4096 (2.6x), both failed by the Generator on
some seeds; the element-wise problems sat at 0.95-1.0x, the bandwidth PyTorch already reaches.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProblemHeadroom:
    problem: str
    observations: int  # (run, seed) pairs of the chosen stage
    solved: int
    mean_reward: float
    solved_reward: float | None  # median reward of solved observations, any stage; None: never
    best_speedup: float  # over solved observations, any stage; 0 if never solved
    headroom: float  # mean of (solved_reward - reward) over the stage's observations

    @property
    def sometimes_solved(self) -> bool:
        return 0 < self.solved < self.observations


def problem_headroom(runs: list[dict[str, list[dict[str, Any]]]], stage: str) -> list[ProblemHeadroom]:
    """``runs``: one ``{stage: rows}`` mapping per (run, seed), rows as partial.json holds them
    (``problem``, ``correct``, ``speedup``, ``reward``). Sorted by headroom, largest first."""
    solved_rewards: dict[str, list[float]] = {}
    best: dict[str, float] = {}
    for stages in runs:
        for rows in stages.values():
            for row in rows:
                if row["correct"]:
                    solved_rewards.setdefault(row["problem"], []).append(row["reward"])
                    best[row["problem"]] = max(best.get(row["problem"], 0.0), row["speedup"])
    observed: dict[str, list[dict[str, Any]]] = {}
    for stages in runs:
        for row in stages.get(stage, []):
            observed.setdefault(row["problem"], []).append(row)
    out = []
    for problem, rows in observed.items():
        target = (statistics.median(solved_rewards[problem]) if problem in solved_rewards
                  else None)
        rewards = [r["reward"] for r in rows]
        out.append(ProblemHeadroom(
            problem=problem, observations=len(rows), solved=sum(bool(r["correct"]) for r in rows),
            mean_reward=statistics.fmean(rewards), solved_reward=target,
            best_speedup=best.get(problem, 0.0),
            headroom=0.0 if target is None else statistics.fmean(max(0.0, target - r)
                                                                  for r in rewards)))
    return sorted(out, key=lambda h: (-h.headroom, h.problem))


def read_runs(dirs: list[Path]) -> list[dict[str, list[dict[str, Any]]]]:
    """Every seed<k>/partial.json's rows under ``dirs`` (a seed without one is skipped)."""
    runs = []
    for d in dirs:
        for partial in sorted(d.glob("seed*/partial.json")):
            runs.append(json.loads(partial.read_text()).get("rows", {}))
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="+")
    p.add_argument("--stage", default="sft", help="the stage whose headroom is summed (sft)")
    p.add_argument("--top", type=int, default=15, help="rows to print")
    args = p.parse_args(argv)
    runs = [r for r in read_runs(args.run_dirs) if args.stage in r]
    if not runs:
        print(f"no seed*/partial.json with a {args.stage!r} stage under {args.run_dirs}",
              file=sys.stderr)
        return 1
    table = problem_headroom(runs, args.stage)
    n_problems = len(table)
    print(f"{len(runs)} (run, seed) evaluations of stage {args.stage!r}, {n_problems} problems")
    print("problem | solved | mean reward | reward when solved | best speedup | headroom")
    for h in table[: args.top]:
        target = "never" if h.solved_reward is None else f"{h.solved_reward:.2f}"
        print(f"{h.problem} | {h.solved}/{h.observations} | {h.mean_reward:.2f} | {target} | "
              f"{h.best_speedup:.2f}x | {h.headroom / n_problems:+.4f}")
    total = sum(h.headroom for h in table) / n_problems
    some = sum(h.headroom for h in table if h.sometimes_solved) / n_problems
    never = [h.problem for h in table if h.solved_reward is None]
    print(f"mean held-out reward if every problem were solved at its solved reward: "
          f"{total:+.4f}; of it on problems solved on some seeds and not others: {some:+.4f}")
    print(f"never solved in any stage: {', '.join(never) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
