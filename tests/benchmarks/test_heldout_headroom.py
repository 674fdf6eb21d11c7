"""The held-out headroom table, on rows in bench_learning's partial.json schema."""

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def headroom():
    return load_script("heldout_headroom")


def _row(problem, correct, reward, speedup=0.0):
    return {"problem": problem, "correct": correct, "reward": reward, "speedup": speedup}


def test_headroom_is_the_mean_shortfall_from_the_solved_reward(headroom):
    runs = [  # three seeds' SFT rows; a GRPO row solves "t" once more at another reward
        {"sft": [_row("t", True, 0.9, 2.6), _row("e", True, 0.74, 0.96), _row("a", False, 0.1)]},
        {"sft": [_row("t", False, 0.1), _row("e", True, 0.74, 0.97), _row("a", False, 0.1)]},
        {"sft": [_row("t", False, -0.1), _row("e", True, 0.74, 0.95), _row("a", False, 0.1)],
         "grpo": [_row("t", True, 0.7, 1.5)]},
    ]
    table = {h.problem: h for h in headroom.problem_headroom(runs, "sft")}
    t = table["t"]
    assert (t.observations, t.solved) == (3, 1)
    assert t.solved_reward == pytest.approx(0.8)  # median of 0.9 and 0.7, any stage
    assert t.best_speedup == 2.6
    assert t.headroom == pytest.approx((0.0 + 0.7 + 0.9) / 3)  # a better-than-target row adds 0
    assert t.sometimes_solved
    assert table["e"].headroom == pytest.approx(0.0) and not table["e"].sometimes_solved
    assert table["a"].solved_reward is None and table["a"].headroom == 0.0
    assert [h.problem for h in headroom.problem_headroom(runs, "sft")] == ["t", "a", "e"]


def test_main_reads_every_seed_of_every_run(headroom, tmp_path, capsys):
    for run, correct in (("r1", True), ("r2", False)):
        seed = tmp_path / run / "seed0"
        seed.mkdir(parents=True)
        rows = {"sft": [_row("t", correct, 0.9 if correct else 0.1, 2.0)]}
        (seed / "partial.json").write_text(json.dumps({"seed": 0, "rows": rows}))
    assert headroom.main([str(tmp_path / "r1"), str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out
    assert "2 (run, seed) evaluations" in out
    assert "t | 1/2 | 0.50 | 0.90 | 2.00x | +0.4000" in out
    assert headroom.main([str(tmp_path / "r1"), "--stage", "grpo"]) == 1
