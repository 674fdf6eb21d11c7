"""A training run's report: settings and curves before the held-out results; an all-format-
failure result explained as unparsable replies."""

from __future__ import annotations

import json
import re

from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.report.html import write_report


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward_mean": 0.1 * s, "compile_rate": 0.5}) + "\n" for s in range(3)))
    (run / "run_config.json").write_text(json.dumps({"model": "default", "preset": "quickstart",
                                                     "resume": None}))
    return run


def _headings(path):
    return re.findall(r"<h2>(.*?)</h2>", path.read_text())


def test_training_sections_come_before_the_held_out_results(tmp_path):
    run = _run(tmp_path)
    held_out = [EvalResult(status=EvalStatus.NO_GPU, problem="relu").to_dict()]
    heads = _headings(write_report(tmp_path / "out", bench_runs={"eval": held_out},
                                   training_run=run))
    assert heads.index("Run configuration") < heads.index("Training curves") < heads.index("Summary")


def test_run_configuration_lists_the_settings_that_are_set(tmp_path):
    page = write_report(tmp_path / "out", training_run=_run(tmp_path)).read_text()
    table = page[page.index("Run configuration"):]
    assert "quickstart" in table and "resume" not in table.split("</table>")[0]


def test_all_format_failures_are_explained_as_unparsable_replies(tmp_path):
    episode = {"problem": {"name": "relu", "tier": 0}, "turns": [
        {"role": "generator", "candidate_source": None, "parse_failure": "no_code_block"}]}
    page = write_report(tmp_path / "out", bench_runs={"m": [episode, episode]}).read_text()
    assert "every sample is a format failure" in page and "could not be parsed" in page


def _with_sft_and_evaluations(run):
    (run / "sft_results.json").write_text(json.dumps({
        "generator": {"status": "ok", "examples": 120, "steps": 300, "loss_before": 1.25,
                      "loss_after": 0.0625, "seconds": 305.0},
        "optimizer": {"status": "ok", "examples": 90, "steps": 300, "loss_before": 1.5,
                      "loss_after": 0.125, "seconds": 309.0}}))
    for name, correct in (("sft_eval_results.json", 0.744), ("eval_results.json", 0.75)):
        (run / name).write_text(json.dumps({
            "problems": 39, "compile_rate": 0.949, "pass_rate": correct, "reward_mean": 0.55,
            "fast_1": 0.05, "compile_only": False, "measured_on": "NVIDIA H200"}))
    return run


def test_the_sft_section_lists_each_agents_loss(tmp_path):
    page = write_report(tmp_path / "out", training_run=_with_sft_and_evaluations(
        _run(tmp_path))).read_text()
    table = page[page.index("<h2>SFT</h2>"):].split("</table>")[0]
    assert "optimizer" in table and "1.5 -&gt; 0.125" in table and "120" in table


def test_the_held_out_evaluations_follow_the_curves_sft_agents_first(tmp_path):
    path = write_report(tmp_path / "out", training_run=_with_sft_and_evaluations(_run(tmp_path)))
    heads = _headings(path)
    assert (heads.index("Run configuration") < heads.index("SFT") < heads.index("Training curves")
            < heads.index("Held-out evaluation"))
    table = path.read_text().split("<h2>Held-out evaluation</h2>")[1].split("</table>")[0]
    assert table.index("SFT agents") < table.index("final agents") and "74.4%" in table
