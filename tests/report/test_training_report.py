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
