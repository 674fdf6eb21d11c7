"""Several seeds of one training run: the launch plan, and the mean +- spread over seeds.

``train --seeds 0 1 2 3`` writes the run's settings once (``OUTPUT_DIR/seeds_config.json``) and
starts one ``train --config OUTPUT_DIR/seeds_config.json --set seed=N --output-dir
OUTPUT_DIR/seed<N>`` per seed (its output in ``seed<N>/train.log``): one after another on a
machine with no GPU or one, and one process per GPU (``CUDA_VISIBLE_DEVICES``) where there are
several. Then, from each seed's final held-out evaluation (``seed<N>/eval_results.json``)::

    OUTPUT_DIR/seeds.json   per stage and metric: mean, std over seeds, per-seed values;
                            the per-seed rows; the seeds that failed and why
    OUTPUT_DIR/seeds.md     the same as a table

The std is the sample standard deviation over seeds (0 for one seed). The figures are those
``eval_results.json`` records: compile and correct rates over evaluated turns, the mean episode
reward, and fast_1 over episodes (0 where rewards were compile-only).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.core.devices import cuda_visible_ids
from multiminddev.train.config_files import write_json_atomically

SEED_METRICS = ("compile_rate", "correct_rate", "reward_mean", "fast_1")
SEEDS_CONFIG_FILE = "seeds_config.json"  # the settings every seed starts from
SEEDS_JSON = "seeds.json"
SEEDS_MD = "seeds.md"
EVAL_RESULTS_FILE = "eval_results.json"  # the pipeline's final held-out evaluation
FINAL_STAGE = "heldout"  # the stage name of the pipeline's final evaluation
SFT_EVAL_RESULTS_FILE = "sft_eval_results.json"  # the SFT agents' evaluation (eval_after_sft)
SFT_STAGE = "sft"
GAIN_STAGE = "gain"  # heldout - sft, per seed
# eval_results.json names the correct rate pass_rate (rollout_metrics' name)
_RECORDED_NAMES = {"compile_rate": "compile_rate", "correct_rate": "pass_rate",
                   "reward_mean": "reward_mean", "fast_1": "fast_1"}


def seed_dir_name(seed: int) -> str:
    return f"seed{seed}"


# --------------------------------------------------------------------------- aggregation

def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample std) of ``values``; the std of one value is 0 (no spread measured)."""
    if not values:
        raise ValueError("mean_and_std needs at least one value")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class SeedRow:
    """One seed's figures for one evaluated stage."""

    seed: int
    stage: str
    metrics: Mapping[str, float]


@dataclass(frozen=True, kw_only=True)
class Spread:
    """A metric over seeds: mean, sample std (0 for one seed), and the values in seed order."""

    mean: float
    std: float
    per_seed: tuple[float, ...]


@dataclass(kw_only=True)
class SeedTable:
    """Per stage (in the order the rows first name them) and metric, the spread over seeds."""

    stages: dict[str, dict[str, Spread]]
    rows: list[SeedRow]
    failed: dict[int, str] = field(default_factory=dict)  # seed -> why it has no figures


def aggregate_seeds(per_seed_rows: Sequence[SeedRow],
                    metrics: Sequence[str] = SEED_METRICS) -> SeedTable:
    """Mean and sample std over the seeds of each stage's ``metrics``. A stage counts the seeds
    that have a row for it; a metric a row lacks is an error (the rows must be alike)."""
    stages: dict[str, dict[str, Spread]] = {}
    by_stage: dict[str, list[SeedRow]] = {}
    for row in per_seed_rows:
        by_stage.setdefault(row.stage, []).append(row)
    for stage, rows in by_stage.items():
        rows = sorted(rows, key=lambda r: r.seed)
        stages[stage] = {}
        for metric in metrics:
            missing = [r.seed for r in rows if metric not in r.metrics]
            if missing:
                raise ValueError(f"stage {stage}: seeds {missing} have no {metric}")
            values = tuple(float(r.metrics[metric]) for r in rows)
            mean, std = mean_and_std(values)
            stages[stage][metric] = Spread(mean=mean, std=std, per_seed=values)
    return SeedTable(stages=stages, rows=list(per_seed_rows))


def final_eval_rows(seed: int, run_dir: Path) -> list[SeedRow]:
    """The seed's rows: its SFT agents' held-out evaluation (stage ``sft``, from
    ``sft_eval_results.json``, written with ``eval_after_sft``), its final one (stage
    ``heldout``, ``eval_results.json``) and, where both are there, the change from the first to
    the second (stage ``gain``: GRPO - SFT). None when the run wrote neither (e.g.
    ``--skip-eval``). Raises ``ValueError`` on an unreadable file."""
    rows = [row for stage, file in ((SFT_STAGE, SFT_EVAL_RESULTS_FILE),
                                    (FINAL_STAGE, EVAL_RESULTS_FILE))
            for row in _eval_rows(seed, Path(run_dir) / file, stage)]
    if len(rows) == 2:
        sft, final = rows
        rows.append(SeedRow(seed=seed, stage=GAIN_STAGE,
                            metrics={m: final.metrics[m] - sft.metrics[m] for m in SEED_METRICS}))
    return rows


def _eval_rows(seed: int, path: Path, stage: str) -> list[SeedRow]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    missing = [name for name in _RECORDED_NAMES.values() if name not in data]
    if missing:
        raise ValueError(f"{path}: lacks {', '.join(missing)}; is it a train run's final "
                         "evaluation?")
    return [SeedRow(seed=seed, stage=stage,
                    metrics={m: float(data[name]) for m, name in _RECORDED_NAMES.items()})]


# --------------------------------------------------------------------------- files

def table_to_json(table: SeedTable) -> dict[str, Any]:
    return {
        "metrics": list(SEED_METRICS),
        "stages": {stage: {m: {"mean": s.mean, "std": s.std, "per_seed": list(s.per_seed)}
                           for m, s in spreads.items()}
                   for stage, spreads in table.stages.items()},
        "rows": [{"seed": r.seed, "stage": r.stage, **dict(r.metrics)} for r in table.rows],
        "failed": {str(seed): why for seed, why in sorted(table.failed.items())},
    }


def table_from_json(data: Mapping[str, Any]) -> SeedTable:
    """A table as ``table_to_json`` wrote it. Raises ``ValueError`` on a file of another shape."""
    try:
        stages = {stage: {m: Spread(mean=float(v["mean"]), std=float(v["std"]),
                                    per_seed=tuple(float(x) for x in v["per_seed"]))
                          for m, v in spreads.items()}
                  for stage, spreads in data["stages"].items()}
        rows = [SeedRow(seed=int(r["seed"]), stage=str(r["stage"]),
                        metrics={k: float(v) for k, v in r.items() if k not in ("seed", "stage")})
                for r in data.get("rows", [])]
        failed = {int(k): str(v) for k, v in data.get("failed", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a {SEEDS_JSON} table ({type(exc).__name__}: {exc})") from None
    return SeedTable(stages=stages, rows=rows, failed=failed)


def _figure(spread: Spread) -> str:
    if len(spread.per_seed) < 2:
        return f"{spread.mean:.3f}"
    return f"{spread.mean:.3f} +- {spread.std:.3f}"


def table_markdown(table: SeedTable) -> str:
    """seeds.md: mean +- std per stage, then the per-seed rows and the failed seeds."""
    head = "| stage | seeds | " + " | ".join(SEED_METRICS) + " |"
    rule = "|" + "---|" * (len(SEED_METRICS) + 2)
    lines = ["# Over seeds (mean +- sample std)", "", head, rule]
    for stage, spreads in table.stages.items():
        n = len(next(iter(spreads.values())).per_seed) if spreads else 0
        lines.append(f"| {stage} | {n} | "
                     + " | ".join(_figure(spreads[m]) if m in spreads else "-"
                                  for m in SEED_METRICS) + " |")
    lines += ["", "## Per seed", "", "| seed | stage | " + " | ".join(SEED_METRICS) + " |",
              "|" + "---|" * (len(SEED_METRICS) + 2)]
    for r in sorted(table.rows, key=lambda r: (r.stage, r.seed)):
        lines.append(f"| {r.seed} | {r.stage} | "
                     + " | ".join(f"{r.metrics[m]:.3f}" if m in r.metrics else "-"
                                  for m in SEED_METRICS) + " |")
    if table.failed:
        lines += ["", "## Failed seeds", ""]
        lines += [f"- seed {seed}: {why}" for seed, why in sorted(table.failed.items())]
    return "\n".join(lines) + "\n"


def write_seed_table(table: SeedTable, output_dir: Path) -> tuple[Path, Path]:
    """Write ``seeds.json`` and ``seeds.md`` into ``output_dir``; return their paths."""
    output_dir = Path(output_dir)
    json_path, md_path = output_dir / SEEDS_JSON, output_dir / SEEDS_MD
    write_json_atomically(json_path, table_to_json(table))
    md_path.write_text(table_markdown(table), encoding="utf-8")
    return json_path, md_path


def run_figures(run_dir: Path) -> SeedTable:
    """A run folder's figures: its ``seeds.json`` if it has one, else its own final evaluation
    as a one-seed table (its seed from ``run_config.json``, else 0). Raises ``ValueError`` when
    it has neither."""
    run_dir = Path(run_dir)
    if (run_dir / SEEDS_JSON).is_file():
        try:
            data = json.loads((run_dir / SEEDS_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{run_dir / SEEDS_JSON}: not readable JSON ({exc})") from None
        try:
            return table_from_json(data)
        except ValueError as exc:
            raise ValueError(f"{run_dir / SEEDS_JSON}: {exc}") from None
    seed = 0
    record = run_dir / "run_config.json"
    if record.is_file():
        try:
            seed = int(json.loads(record.read_text(encoding="utf-8")).get("seed", 0))
        except (OSError, ValueError, TypeError):
            seed = 0
    rows = final_eval_rows(seed, run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: neither {SEEDS_JSON} nor {EVAL_RESULTS_FILE}; give a "
                         "train run folder that finished its held-out evaluation")
    return aggregate_seeds(rows)


def compare_table(runs: Mapping[str, SeedTable]) -> str:
    """Several runs side by side: one line per run and stage, mean +- std over its seeds."""
    label_w = max([len("run"), *(len(label) for label in runs)])
    stage_w = max([len("stage"), *(len(s) for t in runs.values() for s in t.stages)])
    cols = [max(len(m), 15) for m in SEED_METRICS]
    lines = [f"{'run':<{label_w}}  {'stage':<{stage_w}}  seeds  "
             + "  ".join(f"{m:>{w}}" for m, w in zip(SEED_METRICS, cols))]
    for label, table in runs.items():
        for stage, spreads in table.stages.items():
            n = len(next(iter(spreads.values())).per_seed) if spreads else 0
            cells = [_figure(spreads[m]) if m in spreads else "-" for m in SEED_METRICS]
            lines.append(f"{label:<{label_w}}  {stage:<{stage_w}}  {n:>5}  "
                         + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols)))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the launch plan

@dataclass(frozen=True, kw_only=True)
class SeedLaunch:
    """One seed's process: its command, the environment it adds, and its slot (the launches of
    one slot run one after another; slots run side by side)."""

    seed: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    output_dir: Path
    slot: int


def seed_launch_plan(seeds: Sequence[int], *, gpu_ids: Sequence[str], config_path: Path,
                     output_dir: Path, command: Sequence[str]) -> list[SeedLaunch]:
    """Which command and environment each seed gets.

    ``command`` starts the CLI (e.g. ``[python, -m, multiminddev.cli]``). With two GPUs or more,
    seed i runs on ``gpu_ids[i % len(gpu_ids)]`` alone (``CUDA_VISIBLE_DEVICES``, and
    ``--num-gpus 1``, so a config that names more GPUs does not ask for ones it cannot see),
    one slot per GPU; with none or one, every seed is in slot 0 and the environment is left as
    it is, so the seeds run one after another on what the machine has.
    """
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {' '.join(map(str, seeds))}: each seed once")
    parallel = len(gpu_ids) >= 2
    plan = []
    for i, seed in enumerate(seeds):
        seed_dir = Path(output_dir) / seed_dir_name(seed)
        argv = [*command, "train", "--config", str(config_path), "--set", f"seed={seed}",
                "--output-dir", str(seed_dir)]
        env: dict[str, str] = {}
        slot = 0
        if parallel:
            slot = i % len(gpu_ids)
            env["CUDA_VISIBLE_DEVICES"] = str(gpu_ids[slot])
            argv += ["--num-gpus", "1"]
        plan.append(SeedLaunch(seed=seed, argv=tuple(argv), env=env, output_dir=seed_dir,
                               slot=slot))
    return plan



# --------------------------------------------------------------------------- running the plan

def run_seed_plan(plan: Sequence[SeedLaunch], *, log: Any = None) -> dict[int, str | None]:
    """Run every launch: the launches of a slot one after another, the slots side by side.
    Returns seed -> None (exit 0) or why it failed; a failing seed does not stop the others.
    Each seed's output goes to ``<its output dir>/train.log``; progress lines go to ``log``
    (default stderr)."""
    log = log or sys.stderr
    lock = threading.Lock()
    outcome: dict[int, str | None] = {}

    def say(text: str) -> None:
        with lock:
            print(text, file=log, flush=True)

    def run_slot(launches: list[SeedLaunch]) -> None:
        for launch in launches:
            outcome[launch.seed] = _run_one(launch, say)

    slots: dict[int, list[SeedLaunch]] = {}
    for launch in plan:
        slots.setdefault(launch.slot, []).append(launch)
    threads = [threading.Thread(target=run_slot, args=(launches,), daemon=True)
               for launches in slots.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {launch.seed: outcome.get(launch.seed, "did not run") for launch in plan}


def _run_one(launch: SeedLaunch, say: Any) -> str | None:
    launch.output_dir.mkdir(parents=True, exist_ok=True)
    log_path = launch.output_dir / "train.log"
    where = (f" on GPU {launch.env['CUDA_VISIBLE_DEVICES']}"
             if "CUDA_VISIBLE_DEVICES" in launch.env else "")
    say(f"seeds: seed {launch.seed} started{where} (log: {log_path})")
    start = time.perf_counter()
    try:
        with open(log_path, "w", encoding="utf-8") as out:
            code = subprocess.run(list(launch.argv), env={**os.environ, **launch.env},
                                  stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    except OSError as exc:
        why = f"could not start: {exc}"
    else:
        why = None if code == 0 else f"exit code {code} (see {log_path})"
    minutes = (time.perf_counter() - start) / 60
    say(f"seeds: seed {launch.seed} {'finished' if why is None else 'FAILED: ' + why} "
        f"after {minutes:.1f} min")
    return why


def collect_seed_table(outcome: Mapping[int, str | None], output_dir: Path) -> SeedTable:
    """The table over the seeds that finished; a seed that failed, or finished without a
    readable final evaluation, is listed in ``failed`` with the reason."""
    rows: list[SeedRow] = []
    failed: dict[int, str] = {}
    for seed, why in outcome.items():
        if why is not None:
            failed[seed] = why
            continue
        try:
            seed_rows = final_eval_rows(seed, Path(output_dir) / seed_dir_name(seed))
        except ValueError as exc:
            failed[seed] = str(exc)
            continue
        if not seed_rows:
            failed[seed] = f"finished without {EVAL_RESULTS_FILE} (was the evaluation skipped?)"
        rows += seed_rows
    table = aggregate_seeds(rows)
    table.failed = failed
    return table


def seed_gpu_ids(visible: str | None, device_count: int, num_gpus: int | None) -> list[str]:
    """The GPUs the seeds spread over: those ``CUDA_VISIBLE_DEVICES`` names (all
    ``device_count`` where it is unset), the first ``num_gpus`` of them where that is given."""
    if visible is not None and visible.strip():
        ids = cuda_visible_ids(visible)[:device_count]
    else:
        ids = [str(i) for i in range(device_count)]
    return ids if num_gpus is None else ids[:num_gpus]
