"""Plots write valid PNGs (also when empty); training runs load from metrics.jsonl or TensorBoard."""

from __future__ import annotations

import json

from PIL import Image

from multiminddev.report.plots import (
    load_training_metrics,
    plot_speedup_distribution,
    plot_training_curves,
    plot_turn_curves,
)


def _is_png(path) -> bool:
    with Image.open(path) as img:
        return img.format == "PNG"


def test_speedup_histogram_is_png(tmp_path):
    assert _is_png(plot_speedup_distribution({"a": [0.5, 1.2, 3.0], "b": [2.0]}, tmp_path / "s.png"))


def test_empty_speedups_still_make_an_image(tmp_path):
    assert _is_png(plot_speedup_distribution({"cpu": [0.0, 0.0]}, tmp_path / "s.png"))


def test_turn_curves_skip_missing_points(tmp_path):
    curves = {"a": {"attempt": [1, 2], "frac_correct": [0.2, 0.5], "geomean_best_speedup": [None, 1.1]}}
    assert _is_png(plot_turn_curves(curves, tmp_path / "t.png"))


def test_training_curves_with_missing_keys(tmp_path):
    records = [{"step": i, "reward_mean": 0.1 * i} for i in range(3)]
    assert _is_png(plot_training_curves(records, tmp_path / "tr.png"))


def test_load_metrics_jsonl_sorted_by_step(tmp_path):
    lines = [json.dumps({"step": s, "reward_mean": s / 10}) for s in (2, 0, 1)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert [r["step"] for r in load_training_metrics(tmp_path)] == [0, 1, 2]


def test_load_tensorboard_scalars_when_no_jsonl(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tensorboard"))
    for step in range(3):
        writer.add_scalar("reward_mean", 0.5 * step, step)
        writer.add_scalar("kl", 0.01, step)
    writer.close()
    records = load_training_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2]["reward_mean"] == 1.0


def test_resumed_run_keeps_last_record_per_step(tmp_path):
    lines = [{"step": 0, "reward_mean": 0.1}, {"step": 1, "reward_mean": 0.2},
             {"step": 1, "reward_mean": 0.25}, {"step": 2, "reward_mean": 0.3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    records = load_training_metrics(tmp_path)
    assert [r["reward_mean"] for r in records] == [0.1, 0.25, 0.3]
