"""PNG plots for reports (matplotlib, Agg backend: no display needed) and training-run loading.

Each ``plot_*`` function writes one PNG and returns its path; an empty input still yields a
figure that says why it is empty (e.g. a compile-only run has no speedups), never a missing file.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multiminddev.report.files import read_jsonl_rows, write_atomic
from multiminddev.report.metrics import NOT_MEASURED

TRAINING_PANELS = (
    ("Reward", ("reward_mean",), "reward_std"),
    ("Compile / pass rate", ("compile_rate", "pass_rate", "hack_rate", "repeat_rate"), None),
    ("KL to reference", ("kl",), None),
    ("Throughput", ("tokens_per_s", "evals_per_s"), None),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    _pyplot().close(fig)
    return write_atomic(path, buffer.getvalue())


def _empty_note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_speedup_distribution(speedups: Mapping[str, Sequence[float]], path: Path) -> Path:
    """Histogram of correct kernels' speedups over eager, log-scale x, one series per label."""
    plt = _pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    positive = {k: [s for s in v if s and math.isfinite(s) and s > 0] for k, v in speedups.items()}
    values = [s for v in positive.values() for s in v]
    if not values:
        _empty_note(ax, "no correct, timed kernels\n(compile-only run without a GPU?)")
    else:
        lo, hi = min(min(values), 0.5), max(max(values), 2.0)
        bins = np.logspace(math.log10(lo) - 0.05, math.log10(hi) + 0.05, 30)
        for label, v in positive.items():
            if v:
                ax.hist(v, bins=bins, alpha=0.55, label=f"{label} (n={len(v)})")
        ax.set_xscale("log")
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

        # Powers of two label the axis: a decade-only log axis shows just "1x" for the usual
        # 0.25x-8x range of kernel speedups.
        span = range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)
        ax.xaxis.set_major_locator(FixedLocator([2.0 ** k for k in span]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xlabel("speedup vs eager PyTorch (log scale; dashed = 1x)")
        ax.set_ylabel("correct kernels")
        ax.legend(fontsize=8)
    ax.set_title("Speedup distribution")
    return _save(fig, path)


def plot_per_tier(per_tier: Mapping[str, Mapping[str, Mapping[str, Any]]], path: Path) -> Path:
    """Grouped bars of correctness and fast_1 per tier, one bar group per label.

    ``per_tier[label][tier]`` is a summary dict (``correct_rate``, ``fast_p``).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    tiers = sorted({t for v in per_tier.values() for t in v}, key=lambda t: int(t))
    labels = list(per_tier)
    width = 0.8 / max(len(labels), 1)
    metrics = (("correct", lambda s: s.get("correct_rate")), ("fast_1", lambda s: s["fast_p"].get("1")))
    for ax, (name, get) in zip(axes, metrics):
        if not tiers:
            _empty_note(ax, "no tier information")
            continue
        if all(get(v[t]) is None for v in per_tier.values() for t in v):
            _empty_note(ax, NOT_MEASURED)  # no bar at 0: nothing was measured (no GPU)
            ax.set_title(name)
            continue
        for i, label in enumerate(labels):
            ys = [(get(per_tier[label][t]) or 0.0) if t in per_tier[label] else 0.0 for t in tiers]
            xs = [j + i * width for j in range(len(tiers))]
            ax.bar(xs, ys, width=width, label=label)
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(tiers))])
        ax.set_xticklabels([f"tier {t}" for t in tiers])
        ax.set_ylim(0, 1)
        ax.set_title(name)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def plot_turn_curves(curves: Mapping[str, Mapping[str, Sequence[Any]]], path: Path) -> Path:
    """Correct-so-far and best-speedup-so-far against the attempt number, one line per label."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    panels = (("frac_correct", "fraction correct so far"),
              ("geomean_best_speedup", "geomean best speedup so far"))
    for ax, (key, title) in zip(axes, panels):
        drawn = False
        for label, c in curves.items():
            pts = [(x, y) for x, y in zip(c.get("attempt", []), c.get(key, [])) if y is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
                drawn = True
        if not drawn:
            _empty_note(ax, "no data")
        else:
            ax.set_xlabel("attempt (agent turn)")
            ax.legend(fontsize=8)
        ax.set_title(title)
    return _save(fig, path)


EVAL_PANELS = (
    ("Held-out reward", ("reward_mean",), None),
    ("Held-out compile / pass / fast_1", ("compile_rate", "pass_rate", "fast_1"), None),
)


def plot_training_curves(records: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """2x2 panels over training steps: reward (mean +- std), rates, KL, throughput."""
    return _plot_panels(records, TRAINING_PANELS, (2, 2), path)


def plot_eval_curves(records: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Periodic held-out evaluations during training (the trainer's ``eval_metrics.jsonl``)."""
    return _plot_panels(records, EVAL_PANELS, (1, 2), path)


def _plot_panels(records: Sequence[Mapping[str, Any]], panels: Sequence[tuple], shape: tuple[int, int],
                 path: Path) -> Path:
    plt = _pyplot()
    rows, cols = shape
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.25 * rows), squeeze=False)
    for ax, (title, keys, band) in zip(axes.flat, panels):
        drawn = False
        for i, key in enumerate(keys):
            pts = [(r["step"], r[key], r.get(band) if band else None)
                   for r in records if _number(r.get(key)) and "step" in r]
            if not pts:
                continue
            xs, ys, std = zip(*pts)
            # Throughputs differ by orders of magnitude: the second one gets its own y axis.
            target = ax.twinx() if title == "Throughput" and i == 1 else ax
            target.plot(xs, ys, label=key, color=f"C{i}", marker="o" if len(xs) < 30 else None)
            target.set_ylabel(key if target is not ax else "")
            if band is not None and all(_number(s) for s in std):
                ax.fill_between(xs, [y - s for y, s in zip(ys, std)],
                                [y + s for y, s in zip(ys, std)], alpha=0.2)
            drawn = True
        if drawn:
            ax.set_xlabel("step")
            # One legend for the panel, the twin axis's line included.
            lines = [line for a in (ax, *ax.get_shared_x_axes().get_siblings(ax)) if a is not ax
                     for line in a.get_lines()]
            handles = ax.get_lines() + [line for line in lines if line not in ax.get_lines()]
            ax.legend(handles, [h.get_label() for h in handles], fontsize=8)
        else:
            _empty_note(ax, "not logged")
        ax.set_title(title)
    if any(r.get("compile_only") for r in records):
        fig.suptitle("compile-only rewards (no GPU): no measured speedups", fontsize=10)
    return _save(fig, path)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --- training runs ---------------------------------------------------------------------------


def load_training_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Per-step records of a training run: its ``metrics.jsonl`` (the trainer's format, see
    ``multiminddev.train.metrics``), else scalars from TensorBoard event files. Sorted by step;
    a step logged twice (a run resumed from an earlier checkpoint) keeps its last record."""
    run_dir = Path(run_dir)
    for path in [run_dir / "metrics.jsonl", *sorted(run_dir.rglob("metrics.jsonl"))]:
        if path.is_file():
            return read_step_records(path)
    return _tensorboard_records(run_dir)


def load_eval_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The held-out evaluations logged during training (``eval_metrics.jsonl``), if any."""
    run_dir = Path(run_dir)
    for path in [run_dir / "eval_metrics.jsonl", *sorted(run_dir.rglob("eval_metrics.jsonl"))]:
        if path.is_file():
            return read_step_records(path)
    return []


def read_step_records(path: Path) -> list[dict[str, Any]]:
    """The records with a ``step``, last one per step; lines that are not JSON objects (a run
    killed mid-write leaves a torn last line) are skipped."""
    by_step: dict[Any, dict[str, Any]] = {}
    for record in read_jsonl_rows(path).rows:
        if isinstance(record.get("step"), (int, float)):
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def _tensorboard_records(run_dir: Path) -> list[dict[str, Any]]:
    event_dirs = sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")})
    if not event_dirs:
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    by_step: dict[int, dict[str, Any]] = {}
    for d in event_dirs:
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(tag):
                by_step.setdefault(ev.step, {"step": ev.step})[tag] = ev.value
    return [by_step[s] for s in sorted(by_step)]
