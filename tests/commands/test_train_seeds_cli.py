"""``train --seeds`` parsing and refusals, and ``bench --compare`` on fixture run folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

from multiminddev.cli import build_parser
from multiminddev.commands._io import ExitCode
from multiminddev.commands.train import seeds_problem
from tests.commands.helpers import assert_one_line_error, run_cli


def _eval_results(run_dir, *, compile_rate, pass_rate, reward_mean=0.0, fast_1=0.0):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval_results.json").write_text(json.dumps(
        {"problems": 2, "reward_mean": reward_mean, "compile_only": True, "measured_on": "cpu",
         "compile_rate": compile_rate, "pass_rate": pass_rate, "hack_rate": 0.0,
         "geomean_speedup": 0.0, "fast_1": fast_1}))


def test_seeds_parse_as_a_list():
    args = build_parser().parse_args(["train", "--seeds", "0", "1", "2", "3"])
    assert args.seeds == [0, 1, 2, 3] and args.seed is None
    assert seeds_problem(args) is None


def test_seed_and_seeds_together_are_a_one_line_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--seed", "1", "--seeds", "0", "1",
                             "--output-dir", tmp_path)
    assert_one_line_error(code, out, err, contains="--seed and --seeds exclude each other")
    assert not (tmp_path / "seeds_config.json").exists()


def test_seeds_with_resume_is_a_one_line_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--seeds", "0", "1", "--resume", tmp_path)
    assert_one_line_error(code, out, err, contains="--seeds starts fresh runs")


def test_a_repeated_seed_is_a_one_line_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--seeds", "0", "0", "--output-dir", tmp_path)
    assert_one_line_error(code, out, err, contains="give each seed once")


def test_a_bad_model_stops_before_any_seed_starts(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--seeds", "0", "1", "--model",
                             tmp_path / "no-such-model", "--output-dir", tmp_path / "run")
    assert_one_line_error(code, out, err, contains="no-such-model",
                          exit_code=ExitCode.UNAVAILABLE)
    assert not (tmp_path / "run" / "seed0").exists()


def test_bench_compare_prints_runs_side_by_side(capsys, tmp_path):
    seeds = tmp_path / "seeds_run"
    _eval_results(seeds / "seed0", compile_rate=0.5, pass_rate=0.25)
    _eval_results(seeds / "seed1", compile_rate=0.7, pass_rate=0.25)
    from multiminddev.train.seeds import collect_seed_table, write_seed_table

    write_seed_table(collect_seed_table({0: None, 1: None}, seeds), seeds)
    _eval_results(tmp_path / "one_run", compile_rate=1.0, pass_rate=0.5)
    code, out, err = run_cli(capsys, "bench", "--compare", seeds, tmp_path / "one_run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("seeds_run") and "0.600 +- 0.141" in lines[1]
    assert lines[2].split()[:5] == ["one_run", "heldout", "1", "1.000", "0.500"]


def test_bench_compare_of_a_folder_without_figures_is_a_one_line_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "--compare", tmp_path)
    assert_one_line_error(code, out, err, contains="neither seeds.json nor eval_results.json")


def test_bench_compare_of_a_missing_folder_is_a_one_line_error(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "--compare", tmp_path / "nope")
    assert_one_line_error(code, out, err, contains="does not exist")


def test_every_seed_runs_from_the_written_settings_and_failures_are_recorded(capsys, tmp_path,
                                                                             monkeypatch):
    # The seeds' problem spec is one the pipeline refuses as it starts, before any model loads:
    # each seed process starts, fails, and the others still run.
    src = str(Path(__file__).parents[2] / "src")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [src, os.environ.get(
        "PYTHONPATH")])))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, out, err = run_cli(capsys, "train", "--seeds", "3", "5", "--problems",
                             "builtin:nosuchfamily", "--output-dir", tmp_path)
    assert code == 1
    assert out == ""  # no seed gave figures: no table to print
    record = json.loads((tmp_path / "seed5" / "run_config.json").read_text())
    assert (record["seed"], record["train_problems"]) == (5, "builtin:nosuchfamily")
    seeds = json.loads((tmp_path / "seeds.json").read_text())
    assert set(seeds["failed"]) == {"3", "5"}
    assert "seed 3 FAILED" in err and "seed 5 FAILED" in err
