"""Replay a learning run's GRPO rollouts under another turn credit, on the CPU.

Re-scores each GRPO step's episodes (``seed<N>/episodes.jsonl``, one batch of
``--episodes-per-step``) with GRPOConfig's defaults plus the given options (KEY=VALUE of a
GRPOConfig field, ``credit.KEY=VALUE`` of its CreditConfig),
recomputes the group-relative advantages, and sums the Optimizer's advantages per kind of turn:
turns that broke a correct Generator kernel, kept it correct, fixed a failing one, left it
failing, and (``--pattern``) turns whose kernel contains a given string, e.g. one mutation.
With the run's own options it reproduces the advantages the run trained on.

    python3 benchmarks/replay_credit.py DIR --seeds 2 --pattern 'cast<unsigned long long>(p0)' \\
        --grpo-option normalize_std=false --compare credit.improvement=true
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KINDS = ("broke", "kept", "fixed", "still_failing", "no_kernel")


def optimizer_kind(generator_ok: bool, optimizer_ok: bool, has_kernel: bool) -> str:
    """What an Optimizer turn did to the Generator's kernel."""
    if not has_kernel:
        return "no_kernel"
    if generator_ok:
        return "kept" if optimizer_ok else "broke"
    return "fixed" if optimizer_ok else "still_failing"


def summed_advantages(episodes: list[Any], cfg: Any, per_step: int,
                      pattern: str | None = None) -> dict[str, tuple[int, float]]:
    """kind -> (Optimizer turns, summed advantage), step by step as the run batched them."""
    from multiminddev.train.grpo import assign_advantages, score_episodes

    out = {k: (0, 0.0) for k in (*KINDS, *(["pattern"] if pattern else []))}
    for start in range(0, len(episodes), per_step):
        batch = episodes[start:start + per_step]
        samples, _ = score_episodes(batch, cfg)
        assign_advantages(samples, cfg)
        by_turn = {(s.episode, s.turn_index): s.advantage for s in samples}
        for index, episode in enumerate(batch):
            turns = [t for t in episode.turns if t.role.value in ("generator", "optimizer")]
            if len(turns) < 2 or turns[1].role.value != "optimizer":
                continue
            first, second = turns[0], turns[1]
            advantage = by_turn.get((index, 1))  # the second agent turn
            if advantage is None:
                continue
            ok = [t.eval_result is not None and t.eval_result.correct for t in (first, second)]
            kinds = [optimizer_kind(ok[0], ok[1], second.candidate_source is not None)]
            if pattern and pattern in (second.candidate_source or ""):
                kinds.append("pattern")
            for kind in kinds:
                n, total = out[kind]
                out[kind] = (n + 1, total + advantage)
    return out


def config_with(options: Iterable[str]) -> Any:
    """GRPOConfig with ``options`` (KEY=VALUE; ``credit.KEY=VALUE`` for its CreditConfig), each
    value read by its field's type as a config file's is; a bad one stops the script."""
    from multiminddev.rewards.credit import CreditConfig
    from multiminddev.train.config_files import ConfigError, settings_values
    from multiminddev.train.grpo import GRPOConfig

    plain: dict[str, str] = {}
    credit: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--grpo-option {option!r}: write KEY=VALUE, e.g. kl_coef=0.1")
        key = key.strip()
        (credit if key.startswith("credit.") else plain)[key.removeprefix("credit.")] = value
    try:
        values = settings_values(GRPOConfig, plain, where="--grpo-option")
        if credit:
            values["credit"] = CreditConfig(**settings_values(CreditConfig, credit,
                                                              where="--grpo-option credit"))
        return dataclasses.replace(GRPOConfig(), **values)
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"--grpo-option: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output_dir", type=Path)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--episodes-per-step", type=int, default=24)
    p.add_argument("--pattern", default=None, help="also sum turns whose kernel contains this")
    p.add_argument("--grpo-option", dest="options", action="append", default=[],
                   help="the run's own GRPO options (KEY=VALUE of a GRPOConfig field)")
    p.add_argument("--compare", action="append", default=[],
                   help="options added for the replay to compare with (KEY=VALUE)")
    args = p.parse_args(argv)
    from multiminddev.episode.state import read_episodes_jsonl

    variants = {"as run": config_with(args.options)}
    if args.compare:
        variants[" ".join(args.compare)] = config_with([*args.options, *args.compare])
    for seed in args.seeds:
        path = args.output_dir / f"seed{seed}" / "episodes.jsonl"
        if not path.is_file():
            print(f"seed {seed}: no {path}", file=sys.stderr)
            continue
        episodes = read_episodes_jsonl(path)
        for name, cfg in variants.items():
            sums = summed_advantages(episodes, cfg, args.episodes_per_step, args.pattern)
            print(f"seed {seed}, {name}: Optimizer turns, summed advantage: " + "; ".join(
                f"{k} {n} {total:+.2f}" for k, (n, total) in sums.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
