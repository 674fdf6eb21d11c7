"""The training run's held-out evaluation writes each episode as it ends, with the record a
resumed run checks (train/pipeline.py ``heldout_episodes``), end to end with a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiminddev.cli import main

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "problems"


@pytest.mark.slow
def test_heldout_evaluation_logs_one_line_per_problem_with_its_record(tmp_path, caplog):
    helpers = pytest.importorskip("tests.policy.helpers")
    model_dir = tmp_path / "tiny"
    helpers.tiny_base_model().save_pretrained(model_dir)
    helpers.gguf_tokenizer().save_pretrained(model_dir)
    run = tmp_path / "run"
    argv = ["train", "--model", str(model_dir), "--skip-sft", "--skip-rl",
            "--heldout", str(PROBLEMS), "--output-dir", str(run), "--max-new-tokens", "8"]
    with caplog.at_level("WARNING"):
        assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "eval_episodes.jsonl").read_text().splitlines()]
    names = sorted(p.stem for p in PROBLEMS.glob("*.py"))
    assert sorted(r["problem"]["name"] for r in rows) == names
    assert {r["sample"] for r in rows} == {0}
    record = json.loads((run / "eval_episodes.record.json").read_text())
    assert record["problems"] == [r["problem"]["name"] for r in sorted(
        rows, key=lambda r: names.index(r["problem"]["name"]))]
    assert record["rl_step"] == 0
    results = json.loads((run / "eval_results.json").read_text())
    assert results["problems"] == len(names)
    # one runner per problem, one warning about the window per run
    assert sum("exceed the model's window" in m for m in caplog.messages) <= 1
