"""Per-episode rows and their aggregation over seeds: the learning benchmark's figures.

A row is one evaluated episode (``episode_row``): whether any turn compiled or was correct, its
best correct speedup, its reward, the turns it took. A seed's record is ``{"seed", "rows":
{stage: [row, ...]}}`` with stages ``base``, ``sft``, ``grpo``, ``grpo@K`` (held-out),
``train_sft``/``train_grpo`` (GRPO's own problems) and ``select@K`` (early stopping).
``aggregate_partial`` gives, per stage every seed reached, the mean and spread over seeds with a
bootstrap interval over pooled episodes, and each GRPO stage's gain over SFT per seed.
``bench_learning.py`` builds these records from ``multiminddev train`` runs; the analysis
scripts beside it (``rescore_heldout.py``, ``analyze_rollouts.py``) read them too, also from
runs recorded before the product had every setting (their ``partial.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

STAGES = ("base", "sft", "grpo")  # held-out stages
# The same agents as "sft" and "grpo", evaluated on a fixed sample of GRPO's training problems;
# reported apart, since these problems are not held out.
TRAIN_STAGES = ("train_sft", "train_grpo")
TRAIN_GAIN_METRICS = ("reward_mean", "correct_rate", "fast_1")
METRICS = ("compile_rate", "correct_rate", "reward_mean", "fast_1")
INFRA_EXIT_CODE = 3  # a stage mostly failed on the evaluator's side
SELECT = "select@"  # stage prefix of the early-stopping evaluations (select@0 is SFT's agents)


def episode_row(episode: Any, reward: float) -> dict[str, Any]:
    """Episode-level outcome: any turn compiled / correct; best correct speedup; best reward."""
    from multiminddev.env.results import EvalStatus

    results = [t.eval_result for t in episode.turns if t.eval_result is not None]
    speeds = [r.speedup for r in results if r.correct]

    def first_turn(passed: Any) -> int:  # 1-based; 0: no turn did
        return next((i for i, t in enumerate(episode.turns, 1)
                     if t.eval_result is not None and passed(t.eval_result)), 0)

    return {"problem": episode.problem.name, "tier": episode.problem.tier,
            "compiled": any(r.compiled for r in results), "correct": bool(speeds),
            "speedup": max(speeds) if speeds else 0.0, "reward": reward,
            "turns": len(episode.turns), "compiled_turn": first_turn(lambda r: r.compiled),
            "correct_turn": first_turn(lambda r: r.correct),
            # Optimizer turns that resubmitted a kernel of an earlier turn unchanged
            "repeats": sum(getattr(t, "repeat_of", None) is not None for t in episode.turns),
            # the evaluation failed on our side (after its retries): counted as a failure here,
            # and reported, so a crowded GPU cannot pass for a worse policy unnoticed
            "infra_error": any(r.status is EvalStatus.INFRA_ERROR for r in results),
            # what the evaluator said, so a stage that mostly failed on our side names the cause
            "infra_message": next((r.message for r in results
                                   if r.status is EvalStatus.INFRA_ERROR), "")}


def stage_rows(episodes: list[Any], cfg: Any) -> list[dict[str, Any]]:
    """One row per held-out episode (``episode_row``), scored with ``cfg``'s reward (a
    GRPOConfig) less the repeat penalty, so runs with and without it compare."""
    from multiminddev.train.grpo import score_episodes

    scoring = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, repeat_penalty=0.0))
    rows = []
    for episode in episodes:
        _, stats = score_episodes([episode], scoring)
        rows.append(episode_row(episode, stats["reward_mean"]))
    return rows


def heldout_eval_config(workers: int | None) -> Any:
    """The evaluator settings of held-out evaluations (and of their re-measurement)."""
    from multiminddev.env.config import EvalConfig

    return EvalConfig(num_workers=workers, num_trials=3, compile_baseline=False,
                      bench_budget_s=0.5)


def stage_infra_failure(stage: str, rows: list[dict[str, Any]], max_share: float) -> str | None:
    """The error of a stage whose episodes (``episode_row`` rows) mostly ended in an
    infrastructure error, more than ``max_share`` of them, naming the evaluator's messages;
    None when the stage's figures stand. Rows from before messages were kept say only that."""
    from multiminddev.episode.infra import infra_failure

    messages = [(r.get("infra_message") or "infrastructure error (message not recorded)")
                if r.get("infra_error") else None for r in rows]
    return infra_failure(messages, what=f"stage {stage}", max_share=max_share)


def infra_failed_stages(per_seed: list[dict[str, Any]], max_share: float) -> list[str]:
    """``stage_infra_failure``'s errors of every seed's recorded stages (finished seeds read
    back for aggregation): such a stage must not enter a table."""
    return [f"seed {result.get('seed')}: {failure}" for result in per_seed
            for stage, rows in result.get("rows", {}).items()
            if (failure := stage_infra_failure(stage, rows, max_share)) is not None]


def stage_metrics(rows: list[dict[str, Any]], compile_only: bool) -> dict[str, float]:
    n = max(len(rows), 1)
    return {"compile_rate": sum(r["compiled"] for r in rows) / n,
            "correct_rate": sum(r["correct"] for r in rows) / n,
            "reward_mean": sum(r["reward"] for r in rows) / n,
            "fast_1": 0.0 if compile_only else sum(r["correct"] and r["speedup"] > 1.0
                                                   for r in rows) / n,
            "infra_errors": float(sum(r.get("infra_error", False) for r in rows)),
            # episodes whose Optimizer resubmitted an earlier kernel (rows from before: none)
            "repeat_episodes": float(sum(r.get("repeats", 0) > 0 for r in rows))}


def select_rewards(rows: dict[str, list[dict[str, Any]]]) -> dict[int, float]:
    """GRPO step -> mean reward of its select@step evaluation."""
    return {int(stage.removeprefix(SELECT)): sum(r["reward"] for r in rs) / max(len(rs), 1)
            for stage, rs in rows.items() if stage.startswith(SELECT)}


def chosen_step(rows: dict[str, list[dict[str, Any]]], min_gain: float = 0.0) -> int | None:
    """The GRPO step whose agents score best on the select@ problems: going through the steps in
    order, a later one replaces the step chosen so far only when its mean reward is higher by
    more than ``min_gain`` (0: the best, a tie going to the step nearer SFT). None: no select@
    evaluation."""
    rewards = select_rewards(rows)
    chosen = None
    for step in sorted(rewards):
        if chosen is None or rewards[step] > rewards[chosen] + min_gain:
            chosen = step
    return chosen


def share_base_stage(per_seed: list[dict[str, Any]], compile_only: bool,
                     base_run: dict[str, Any] | None = None) -> int:
    """Seeds run with --skip-base borrow the base rows of a seed that measured them, or of a
    --base-only run (``base_run``, its partial.json): greedy decoding of the untouched base does
    not depend on the seed. Returns the lender's seed."""
    lenders = [s for s in per_seed if "base" in s["rows"]]
    if base_run is not None and "base" in base_run.get("rows", {}):
        lenders.append(base_run)
    if not lenders:
        raise ValueError("no seed evaluated the base model: run one seed without --skip-base")
    lender = lenders[0]
    for s in per_seed:
        if "base" not in s["rows"]:
            s["rows"]["base"] = lender["rows"]["base"]
            s["metrics"]["base"] = stage_metrics(lender["rows"]["base"], compile_only)
            s["base_from_seed"] = lender["seed"]
    return lender["seed"]


def stage_summary(per_seed: list[dict[str, Any]], stage: str,
                  compile_only: bool) -> dict[str, Any]:
    """``{stage}/{metric}``: mean and std over seeds, bootstrap CI over pooled episodes (those
    of one problem and seed resampled together: --eval-samples' episodes are not independent)."""
    from multiminddev.report.metrics import bootstrap_ci
    from multiminddev.train.seeds import mean_and_std

    pooled = [r for s in per_seed for r in s["rows"][stage]]
    clusters = [rows for s in per_seed for rows in rows_by_problem(s["rows"][stage]).values()]
    out: dict[str, Any] = {}
    for metric in METRICS:
        values = [s["metrics"][stage][metric] for s in per_seed]
        ci = bootstrap_ci(clusters, lambda cs, m=metric: stage_metrics(
            [r for c in cs for r in c], compile_only)[m])
        mean, std = mean_and_std(values)
        out[f"{stage}/{metric}"] = {"mean": mean, "std": std, "ci95": list(ci),
                                    "per_seed": values}
    # Episodes longer than two turns also say what two turns reached (the protocol of earlier runs)
    if pooled and all("correct_turn" in r for r in pooled) and max(r["turns"] for r in pooled) > 2:
        for metric in ("compile_rate", "correct_rate"):
            values = [rate_within_turns(s["rows"][stage], metric, 2) for s in per_seed]
            mean, std = mean_and_std(values)
            out[f"{stage}/{metric}_within_2_turns"] = {"mean": mean, "std": std,
                                                       "per_seed": values}
    return out


def rows_by_problem(stage_rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A stage's rows grouped by problem, in the order the problems first appear."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in stage_rows:
        grouped.setdefault(row["problem"], []).append(row)
    return grouped


def rate_within_turns(rows: list[dict[str, Any]], metric: str, turns: int) -> float:
    """The share of episodes whose first compiled (or correct) turn came within ``turns``."""
    key = {"compile_rate": "compiled_turn", "correct_rate": "correct_turn"}[metric]
    return sum(0 < r[key] <= turns for r in rows) / max(len(rows), 1)


def gain_summary(per_seed: list[dict[str, Any]], stage: str, metric: str,
                 baseline: str = "sft") -> dict[str, Any]:
    """``stage`` minus ``baseline`` (SFT) per seed; it counts only if its mean exceeds its
    spread."""
    from multiminddev.train.seeds import mean_and_std

    gains = [s["metrics"][stage][metric] - s["metrics"][baseline][metric] for s in per_seed]
    mean, spread = mean_and_std(gains)
    if len(gains) < 2:  # one seed measures no spread, and a gain must exceed its spread
        spread = math.inf
    return {"mean": mean, "std": spread, "per_seed": gains, "exceeds_spread": mean > spread}


def spread_text(gain: dict[str, Any]) -> str:
    """A gain's spread as results.md says it; one seed has none (gain_summary counts it as
    infinite, so that no single seed meets a target)."""
    if math.isinf(gain["std"]):
        return "one seed: no spread, so it cannot exceed it"
    return f"std over seeds {gain['std']:.3f}"


def episode_counts(per_seed: list[dict[str, Any]], stage: str) -> dict[str, list[int]]:
    """Per seed, the stage's episodes whose evaluation failed on our side (counted as failures)
    and those whose Optimizer resubmitted a kernel, where every row records it (older records
    do not)."""
    rows = [r for s in per_seed for r in s["rows"][stage]]
    out: dict[str, list[int]] = {}
    if all("infra_error" in r for r in rows):
        out[f"{stage}/infra_errors"] = [sum(r["infra_error"] for r in s["rows"][stage])
                                        for s in per_seed]
    if rows and all("repeats" in r for r in rows):
        out[f"{stage}/repeat_episodes"] = [sum(r["repeats"] > 0 for r in s["rows"][stage])
                                           for s in per_seed]
    return out


def train_distribution_summary(per_seed: list[dict[str, Any]],
                               compile_only: bool) -> dict[str, Any]:
    """The train_* stages (--train-eval-problems) every seed measured, summarised as
    ``stage_summary`` does, and ``train_gain/{metric}``: train_grpo minus train_sft per seed, as
    ``gain_summary``. ``train_eval`` names the problems, their spec, and the seeds that lack a
    stage (a stage some seeds lack is not aggregated: its mean would be over other seeds). Empty
    where no seed measured a train_* stage (runs without the option, older records)."""
    measured = [st for st in TRAIN_STAGES if any(st in s["rows"] for s in per_seed)]
    if not measured:
        return {}
    stages = [st for st in measured if all(st in s["rows"] for s in per_seed)]
    specs = {s.get("train_eval_problems") or "an unrecorded spec" for s in per_seed
             if any(st in s["rows"] for st in measured)}
    out: dict[str, Any] = {"train_eval": {
        "problems_spec": " | ".join(sorted(specs)),
        "problems": sorted({r["problem"] for s in per_seed for st in measured
                            for r in s["rows"].get(st, [])}),
        "stages": stages,
        "missing": {st: [s.get("seed") for s in per_seed if st not in s["rows"]]
                    for st in measured if st not in stages}}}
    for stage in stages:
        for s in per_seed:  # older seed results carry rows of these stages but no metrics
            s.setdefault("metrics", {})[stage] = stage_metrics(s["rows"][stage], compile_only)
        out.update(stage_summary(per_seed, stage, compile_only))
        out.update(episode_counts(per_seed, stage))
    if set(TRAIN_STAGES) <= set(stages):
        for metric in TRAIN_GAIN_METRICS:
            out[f"train_gain/{metric}"] = gain_summary(per_seed, "train_grpo", metric,
                                                       baseline="train_sft")
    return out


def intermediate_stages(per_seed: list[dict[str, Any]]) -> list[str]:
    """GRPO stages every seed has ("grpo@4", ..., then "grpo"), in step order."""
    common = set.intersection(*(set(s["rows"]) for s in per_seed)) if per_seed else set()
    marks = sorted((int(st.split("@")[1]), st) for st in common if st.startswith("grpo@"))
    return [st for _, st in marks] + (["grpo"] if "grpo" in common else [])


def aggregate_partial(per_seed: list[dict[str, Any]], compile_only: bool,
                      base_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Like ``aggregate`` over the stages every seed reached (a run cut short): each GRPO
    stage, intermediate ones included, against SFT."""
    for s in per_seed:
        s.setdefault("metrics", {}).update(
            {st: stage_metrics(rows, compile_only) for st, rows in s["rows"].items()})
    if any("base" in s["rows"] for s in per_seed) or base_run is not None:
        share_base_stage(per_seed, compile_only, base_run)
    stages = [st for st in ("base", "sft") if all(st in s["rows"] for s in per_seed)]
    stages += intermediate_stages(per_seed)
    out: dict[str, Any] = {"stages": stages}
    for stage in stages:
        out.update(stage_summary(per_seed, stage, compile_only))
        if stage.startswith("grpo") and "sft" in stages:
            for metric in ("reward_mean", "fast_1", "correct_rate"):
                out[f"gain/{stage}/{metric}"] = gain_summary(per_seed, stage, metric)
    out.update(train_distribution_summary(per_seed, compile_only))
    return out


def within_two_turns_lines(summary: dict[str, Any],
                           stages: tuple[str, ...] | None = None) -> list[str]:
    """The rates two turns reached, where the episodes ran longer; of ``stages`` (None: the
    held-out ones, every stage but the train_* ones, which have a section of their own)."""
    def shown(stage: str) -> bool:
        return stage not in TRAIN_STAGES if stages is None else stage in stages

    return [f"- {key.replace('/', ' ')}: {e['mean']:.3f} ± {e['std']:.3f}; per seed "
            f"{[round(x, 3) for x in e['per_seed']]}"
            for key, e in summary.items()
            if key.endswith("_within_2_turns") and shown(key.split("/")[0])]


def summary_cell(entry: dict[str, Any]) -> str:
    """One stage-metric of a summary as results.md's tables show it."""
    return (f"{entry['mean']:.3f} ± {entry['std']:.3f} "
            f"[{entry['ci95'][0]:.3f}, {entry['ci95'][1]:.3f}]")


def episode_count_lines(summary: dict[str, Any], stages: tuple[str, ...] | list[str]) -> list[str]:
    """The per-seed infrastructure-error and resubmission counts of ``stages``."""
    lines = ["- Episodes with an infrastructure error (counted as failures above), per seed: "
             + "; ".join(f"{stage} {summary.get(f'{stage}/infra_errors', 'not recorded')}"
                         for stage in stages)]
    if any(f"{stage}/repeat_episodes" in summary for stage in stages):
        lines.append("- Episodes whose Optimizer resubmitted an earlier kernel unchanged, per seed: "
                     + "; ".join(f"{stage} {summary.get(f'{stage}/repeat_episodes', 'not recorded')}"
                                 for stage in stages))
    return lines


def train_distribution_lines(summary: dict[str, Any]) -> list[str]:
    """The section on the train_* stages (--train-eval-problems) of results.md and
    results_partial.md; none where no seed measured them."""
    info = summary.get("train_eval")
    if info is None:
        return []
    title = (f"## GRPO's training distribution ({len(info['problems'])} problems from "
             f"{info['problems_spec']}), not held out")
    lines = ["", title, ""]
    if info["stages"]:
        lines += ["| stage | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
        lines += [f"| {stage} | " + " | ".join(summary_cell(summary[f"{stage}/{m}"])
                                              for m in METRICS) + " |"
                  for stage in info["stages"]]
        lines += ["", ("The same seeds' SFT and GRPO agents, evaluated as on the held-out "
                       "problems; mean ± std over seeds [bootstrap 95% CI over pooled episodes]"),
                  ""]
    for m in TRAIN_GAIN_METRICS:
        if (g := summary.get(f"train_gain/{m}")) is not None:
            lines.append(f"- train_grpo - train_sft {m}: {g['mean']:+.3f} ({spread_text(g)}); "
                         f"per seed {[round(x, 3) for x in g['per_seed']]}")
    lines += within_two_turns_lines(summary, TRAIN_STAGES)
    if info["stages"]:
        lines += episode_count_lines(summary, info["stages"])
    lines += [f"- {stage}: not measured by seeds {seeds}, so not aggregated"
              for stage, seeds in info["missing"].items()]
    return lines


def turn_status(turn: dict[str, Any]) -> str:
    """One turn's outcome: the evaluator's status, or why nothing was evaluated."""
    if turn.get("eval_result"):
        return turn["eval_result"]["status"]
    return turn.get("parse_failure") or "not_evaluated"


def outcome_table(output_dir: Path, seeds: list[int]) -> str:
    """Per problem, the status of each turn (generator>optimizer...) per stage and seed, from
    the seeds' episodes_<stage>.jsonl: which problems a stage won or lost. Held-out problems,
    and GRPO's training problems in the train_* stages' columns (after the held-out ones)."""
    def stage_key(stage: str) -> tuple[int, int, str]:
        if stage.startswith("grpo@"):
            return (2, int(stage.removeprefix("grpo@")), "")
        if stage.startswith(SELECT):  # select@4 before select@12
            return (5 + len(TRAIN_STAGES), int(stage.removeprefix(SELECT)), "")
        order = {"base": 0, "sft": 1, "grpo": 3, **{st: 4 + i for i, st in enumerate(TRAIN_STAGES)}}
        return (order.get(stage, 4 + len(TRAIN_STAGES)), 0, stage)

    found = {p.stem.removeprefix("episodes_") for s in seeds
             for p in (output_dir / f"seed{s}").glob("episodes_*.jsonl")}
    columns = [(stage, s) for stage in sorted(found, key=stage_key) for s in seeds]
    cells: dict[str, dict[tuple[str, int], str]] = {}
    for stage, s in columns:
        path = output_dir / f"seed{s}" / f"episodes_{stage}.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            episode = json.loads(line)
            # --eval-samples' episodes of one problem share a cell, separated by " | "
            cell = cells.setdefault(episode["problem"]["name"], {})
            statuses = ">".join(turn_status(t) for t in episode["turns"])
            cell[(stage, s)] = (f"{cell[(stage, s)]} | {statuses}" if (stage, s) in cell
                                else statuses)
    lines = [("# problem (held-out; in train_* columns one of GRPO's training problems), then "
              "per stage and seed the status of each turn (generator>optimizer...), from "
              "episodes_<stage>.jsonl"),
             "\t".join(["problem", *(f"{stage}/s{s}" for stage, s in columns)])]
    for problem, row in cells.items():
        lines.append("\t".join([problem, *(row.get(c, "-") for c in columns)]))
    return "\n".join(lines) + "\n"


def write_outcomes(output_dir: Path, seeds: list[int]) -> None:
    (output_dir / "outcomes.tsv").write_text(outcome_table(output_dir, seeds))

