"""Training metrics: ``metrics.jsonl`` (read by the report module), TensorBoard, optional W&B.

One JSON object per step in ``<output_dir>/metrics.jsonl`` with at least ``STEP_KEYS``; extra keys
(reward breakdown ``reward/<component>``, loss, learning rate, eval metrics ``eval/...``) ride along.
TensorBoard is always written (``<output_dir>/tensorboard``); W&B only when installed *and* asked
for. Every record carries ``compile_only`` so no plot can pass compile-only rewards off as
measured speedups.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalStatus
from multiminddev.episode.runner import result_score  # one definition of "best"
from multiminddev.report.metrics import geometric_mean

COMPILE_ONLY_NOTE = "compile-only rewards (no GPU)"

PHASES = ("rollout", "reward", "advantage", "update", "log", "checkpoint")

STEP_KEYS = (
    "step",
    "episodes",
    "reward_mean",
    "reward_std",
    "compile_rate",
    "pass_rate",
    "hack_rate",
    "repeat_rate",
    "geomean_speedup",
    "fast_1",
    "kl",
    "entropy",
    "clip_fraction",
    "tokens_per_s",
    "evals_per_s",
    *(f"time_{p}" for p in PHASES),
    "compile_only",
)


@dataclass(kw_only=True)
class MetricsConfig:
    output_dir: Path
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "multiminddev"
    run_name: str | None = None

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)


class PhaseTimer:
    """Wall-clock seconds per named phase of one step: ``with timer("rollout"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def as_metrics(self) -> dict[str, float]:
        return {f"time_{p}": round(self.seconds.get(p, 0.0), 4) for p in PHASES}


class MetricsLogger:
    """Writes each step to metrics.jsonl, TensorBoard and (optionally) W&B."""

    def __init__(self, cfg: MetricsConfig, *, run_config: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
        self.path = cfg.output_dir / "metrics.jsonl"
        self._tb = None
        self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(cfg.output_dir / "tensorboard"))
        if cfg.wandb:
            self._wandb = _init_wandb(cfg, run_config or {})

    def log_step(self, record: dict[str, Any]) -> None:
        missing = [k for k in STEP_KEYS if k not in record]
        if missing:
            raise ValueError(f"metrics record lacks {missing}; the report module needs every STEP_KEY")
        clean = {k: _jsonable(v) for k, v in record.items()}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean) + "\n")
        self._scalars(clean, int(record["step"]))

    def log_eval(self, step: int, metrics: dict[str, Any]) -> None:
        """Held-out evaluation: its own file so the per-step schema stays uniform."""
        clean = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with (self.cfg.output_dir / "eval_metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean) + "\n")
        self._scalars({f"eval/{k}": v for k, v in metrics.items()}, step)

    def _scalars(self, record: dict[str, Any], step: int) -> None:
        numeric = {k: float(v) for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _init_wandb(cfg: MetricsConfig, run_config: dict[str, Any]):
    try:
        import wandb
    except ImportError:
        raise RuntimeError(
            "W&B logging was asked for but wandb is not installed: `pip install wandb` "
            "(or `pip install multiminddev[wandb]`), or drop --wandb"
        ) from None
    return wandb.init(project=cfg.wandb_project, name=cfg.run_name, config=run_config,
                      dir=str(cfg.output_dir))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (the report module and tests read them back)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rollout_metrics(episodes: Iterable[Any], *, compile_only: bool) -> dict[str, float]:
    """Rates over every evaluated turn; speedups over each episode's best correct turn.

    compile/pass/hack rates count turns with an ``eval_result`` (agent turns whose candidate was
    evaluated). ``geomean_speedup`` is exp(mean(log speedup)) over episodes whose best turn is
    correct (0.0 when none is); ``fast_1`` is the fraction of *all* episodes whose best turn is
    correct and faster than eager PyTorch (KernelBench's fast_p with p=1). Both are 0 when
    rewards are compile-only, since nothing ran.
    """
    episodes = list(episodes)
    results = [t.eval_result for e in episodes for t in e.turns
               if getattr(t, "eval_result", None) is not None]
    n = max(len(results), 1)

    best = [_best_speedup(e) for e in episodes]
    correct = [s for s in best if s is not None and s > 0]
    geomean = geometric_mean(correct) if correct else 0.0
    # One curve per hack class, so training shows which hack the policy is trying.
    reasons = Counter(r.reject_reason.value for r in results
                      if r.status is EvalStatus.REJECTED and r.reject_reason is not None)
    per_reason = {f"hack_rate/{reason}": count / n for reason, count in sorted(reasons.items())}
    return per_reason | {
        "compile_rate": sum(r.compiled for r in results) / n,
        "pass_rate": sum(r.correct for r in results) / n,
        "hack_rate": sum(r.status is EvalStatus.REJECTED for r in results) / n,
        "geomean_speedup": 0.0 if compile_only else geomean,
        "fast_1": 0.0 if compile_only or not episodes
        else sum(1 for s in best if s is not None and s > 1.0) / len(episodes),
        "num_evaluations": float(len(results)),
        # Optimizer turns that resubmitted a kernel of an earlier turn unchanged
        "repeat_rate": _repeat_rate(episodes),
    }


def _repeat_rate(episodes: list[Any]) -> float:
    turns = [t for e in episodes for t in e.turns
             if AgentRole(t.role) is AgentRole.OPTIMIZER and getattr(t, "candidate_source", None)]
    return sum(getattr(t, "repeat_of", None) is not None for t in turns) / max(len(turns), 1)


def best_result(episode: Any) -> Any:
    """The episode's best EvalResult by the episode runner's own ranking (or None)."""
    results = [t.eval_result for t in episode.turns if getattr(t, "eval_result", None) is not None]
    return max(results, key=result_score) if results else None


def _best_speedup(episode: Any) -> float | None:
    speeds = [t.eval_result.speedup for t in episode.turns
              if getattr(t, "eval_result", None) is not None and t.eval_result.correct]
    return max(speeds) if speeds else None


def progress_bar(total: int, description: str):
    """A rich progress bar for the step loop (transient=False so the last state stays visible)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    task = progress.add_task(description, total=total, info="")
    return progress, task
