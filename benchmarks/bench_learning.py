"""Learning benchmark: a recipe's SFT and GRPO agents on the held-out problems, over seeds, with
the figures per episode.

    python3 benchmarks/bench_learning.py --output-dir runs/learning --seeds 0 1 2 3
    python3 benchmarks/bench_learning.py --output-dir runs/lr2 --set learning_rate=2e-5
    python3 benchmarks/bench_learning.py --output-dir runs/learning --aggregate-only

A thin driver over the product: it runs ``multiminddev train --recipe RECIPE --seeds ...
--set eval_after_sft=true`` (default recipe ``optimizer-grpo-greedy-generator``, the measured
one; ``--set``/``--config`` as ``train`` takes them), then reads each seed's held-out episodes
of the SFT agents (``seed<N>/sft_eval_episodes.jsonl``) and of the final agents
(``eval_episodes.jsonl``) and scores each episode as one row (``learning_rows.episode_row``:
any turn compiled / correct, the best correct speedup, the reward). It writes, beside the
product's own ``seeds.json`` (rates per evaluated turn):

    OUTPUT_DIR/results.json, results.md   per stage (sft, grpo) mean ± std over seeds with a
                                           bootstrap 95% interval over episodes, and the
                                           GRPO - SFT gain per seed; early stopping's choices
    OUTPUT_DIR/outcomes.tsv                per problem, each turn's status per stage and seed
    OUTPUT_DIR/seed<N>/partial.json        the seed's rows (the analysis scripts read them)
    OUTPUT_DIR/seed<N>/episodes_{sft,grpo}.jsonl   the episodes under the analysis scripts' names

A seed whose run failed or wrote no evaluation is named and left out; exit 1 then.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_rows  # a sibling script, not a package

DEFAULT_RECIPE = "optimizer-grpo-greedy-generator"
# stage -> the product's episode file of it in a seed's run folder
STAGE_FILES = {"sft": "sft_eval_episodes.jsonl", "grpo": "eval_episodes.jsonl"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help="a `train --list-recipes` name")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--config", type=Path, default=None, help="a config file, as train takes it")
    p.add_argument("--set", dest="set_options", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting over the recipe, as train takes it (repeatable)")
    p.add_argument("--aggregate-only", action="store_true",
                   help="train nothing: aggregate the seeds' finished runs")
    return p.parse_args(argv)


def train_command(args: argparse.Namespace) -> list[str]:
    """The product's command that trains every seed (the SFT agents evaluated too)."""
    command = [sys.executable, "-m", "multiminddev.cli", "train", "--recipe", args.recipe,
               "--seeds", *map(str, args.seeds), "--output-dir", str(args.output_dir),
               "--set", "eval_after_sft=true"]
    if args.config is not None:
        command += ["--config", str(args.config)]
    for option in args.set_options:
        command += ["--set", option]
    return command


def seed_record(seed: int, seed_dir: Path) -> dict[str, Any]:
    """The seed's rows per stage from its run folder, and its early-stopping record; a
    ``ValueError`` naming the missing file when the run wrote no evaluation."""
    from multiminddev.episode.state import read_episodes_jsonl
    from multiminddev.train.grpo import GRPOConfig

    rows = {}
    for stage, name in STAGE_FILES.items():
        path = seed_dir / name
        if not path.is_file():
            raise ValueError(f"seed {seed}: no {path}")
        rows[stage] = learning_rows.stage_rows(read_episodes_jsonl(path), GRPOConfig())
    settings = json.loads((seed_dir / "run_config.json").read_text())
    record: dict[str, Any] = {"seed": seed, "rows": rows,
                              "sft_problems": settings.get("sft_problems")}
    if (seed_dir / "select.json").is_file():
        record["select"] = json.loads((seed_dir / "select.json").read_text())
    return record


def keep_for_analysis(record: dict[str, Any], seed_dir: Path) -> None:
    """``partial.json`` and ``episodes_<stage>.jsonl`` (hard links where the filesystem has
    them): the names the analysis scripts read."""
    (seed_dir / "partial.json").write_text(json.dumps(
        {"seed": record["seed"], "rows": record["rows"], "sft_problems": record["sft_problems"]}))
    for stage, name in STAGE_FILES.items():
        target = seed_dir / f"episodes_{stage}.jsonl"
        target.unlink(missing_ok=True)
        try:
            os.link(seed_dir / name, target)
        except OSError:
            shutil.copyfile(seed_dir / name, target)


def results_lines(summary: dict[str, Any], per_seed: list[dict[str, Any]], note: str) -> list[str]:
    metrics = learning_rows.METRICS
    lines = [f"Measured on: {note}", "", "| stage | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    lines += [f"| {stage} | " + " | ".join(learning_rows.summary_cell(summary[f"{stage}/{m}"])
                                            for m in metrics) + " |"
              for stage in summary["stages"]]
    lines += ["", "mean ± std over seeds [bootstrap 95% CI over pooled episodes]", ""]
    for metric in ("reward_mean", "fast_1", "correct_rate"):
        if (g := summary.get(f"gain/grpo/{metric}")) is not None:
            lines.append(f"- GRPO - SFT {metric}: {g['mean']:+.3f} "
                         f"({learning_rows.spread_text(g)}); per seed "
                         f"{[round(x, 3) for x in g['per_seed']]}")
    lines += learning_rows.within_two_turns_lines(summary)
    chosen = [(s["seed"], s["select"]) for s in per_seed if "select" in s]
    if chosen:
        lines.append("- Early stopping kept the agents of step, per seed: "
                     + ", ".join(f"seed {seed}: {sel['chosen_step']} (select@ rewards "
                                 f"{ {int(k): round(v, 3) for k, v in sel['rewards'].items()} })"
                                 for seed, sel in chosen))
    return lines


def aggregate(args: argparse.Namespace) -> int:
    per_seed, missing = [], {}
    compile_only, devices = False, set()
    for seed in args.seeds:
        seed_dir = args.output_dir / f"seed{seed}"
        try:
            record = seed_record(seed, seed_dir)
            evaluation = json.loads((seed_dir / "eval_results.json").read_text())
        except (OSError, ValueError) as exc:
            missing[seed] = " ".join(str(exc).split())
            continue
        compile_only |= bool(evaluation.get("compile_only"))
        devices.add(str(evaluation.get("measured_on", "?")))
        keep_for_analysis(record, seed_dir)
        per_seed.append(record)
    for seed, why in missing.items():
        print(f"seed {seed} left out: {why}", file=sys.stderr)
    if not per_seed:
        print("error: no seed has both held-out evaluations", file=sys.stderr)
        return 1
    summary = learning_rows.aggregate_partial(per_seed, compile_only)
    note = (f"{', '.join(sorted(devices))}; recipe {args.recipe}; seeds "
            f"{[s['seed'] for s in per_seed]}" + ("; COMPILE-ONLY (no GPU)" if compile_only else ""))
    lines = results_lines(summary, per_seed, note)
    (args.output_dir / "results.json").write_text(json.dumps(
        {"note": note, "command": " ".join(train_command(args)), "summary": summary,
         "select": {s["seed"]: s["select"] for s in per_seed if "select" in s},
         "left_out": missing}, indent=2))
    (args.output_dir / "results.md").write_text("\n".join(lines) + "\n")
    learning_rows.write_outcomes(args.output_dir, [s["seed"] for s in per_seed])
    print("\n".join(lines))
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.aggregate_only:
        command = train_command(args)
        print("running: " + " ".join(command), flush=True)
        subprocess.run(command, check=False)  # a failed seed is named by the aggregation
    return aggregate(args)


if __name__ == "__main__":
    raise SystemExit(main())
