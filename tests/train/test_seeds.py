"""Several seeds: the mean +- std over seeds, the launch plan, the files and the compare table."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multiminddev.train.seeds import (
    FINAL_STAGE,
    SEED_METRICS,
    SeedRow,
    aggregate_seeds,
    collect_seed_table,
    compare_table,
    final_eval_rows,
    mean_and_std,
    run_figures,
    run_seed_plan,
    seed_gpu_ids,
    seed_launch_plan,
    table_from_json,
    table_markdown,
    write_seed_table,
)


def _row(seed, stage="heldout", compile_rate=0.5, correct_rate=0.25, reward_mean=0.0, fast_1=0.0):
    return SeedRow(seed=seed, stage=stage,
                   metrics={"compile_rate": compile_rate, "correct_rate": correct_rate,
                            "reward_mean": reward_mean, "fast_1": fast_1})


def _eval_results(run_dir: Path, *, compile_rate, pass_rate, reward_mean, fast_1, seed=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval_results.json").write_text(json.dumps(
        {"problems": 4, "reward_mean": reward_mean, "compile_only": False,
         "measured_on": "test", "compile_rate": compile_rate, "pass_rate": pass_rate,
         "hack_rate": 0.0, "geomean_speedup": 1.0, "fast_1": fast_1}))
    if seed is not None:
        (run_dir / "run_config.json").write_text(json.dumps({"seed": seed}))


# --------------------------------------------------------------------------- the math

def test_mean_and_std_match_the_textbook_sample_formula():
    values = [0.2, 0.4, 0.9]
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (3 - 1))
    assert mean_and_std(values) == pytest.approx((mean, std))


def test_one_value_has_no_spread():
    assert mean_and_std([0.7]) == (0.7, 0.0)


def test_aggregate_seeds_gives_mean_and_std_per_stage_and_metric():
    rows = [_row(0, correct_rate=0.5, reward_mean=1.0), _row(1, correct_rate=0.7, reward_mean=3.0),
            _row(0, stage="sft", correct_rate=0.1), _row(1, stage="sft", correct_rate=0.3)]
    table = aggregate_seeds(rows)
    assert list(table.stages) == ["heldout", "sft"]
    correct = table.stages["heldout"]["correct_rate"]
    assert correct.mean == pytest.approx(0.6)
    assert correct.std == pytest.approx(math.sqrt(0.02))  # (0.1^2 + 0.1^2) / (2 - 1)
    assert table.stages["heldout"]["reward_mean"].std == pytest.approx(math.sqrt(2.0))
    assert table.stages["sft"]["correct_rate"].mean == pytest.approx(0.2)


def test_aggregate_seeds_orders_the_per_seed_values_by_seed():
    table = aggregate_seeds([_row(3, fast_1=0.3), _row(1, fast_1=0.1)])
    assert table.stages["heldout"]["fast_1"].per_seed == (0.1, 0.3)


def test_a_row_without_a_metric_is_an_error():
    bad = SeedRow(seed=1, stage="heldout", metrics={"compile_rate": 1.0})
    with pytest.raises(ValueError, match="seeds \\[1\\] have no correct_rate"):
        aggregate_seeds([_row(0), bad])


# --------------------------------------------------------------------------- reading runs

def test_final_eval_rows_read_pass_rate_as_the_correct_rate(tmp_path):
    _eval_results(tmp_path, compile_rate=0.75, pass_rate=0.5, reward_mean=0.2, fast_1=0.25)
    (row,) = final_eval_rows(4, tmp_path)
    assert (row.seed, row.stage) == (4, FINAL_STAGE)
    assert dict(row.metrics) == {"compile_rate": 0.75, "correct_rate": 0.5, "reward_mean": 0.2,
                                 "fast_1": 0.25}


def test_a_run_without_a_final_evaluation_has_no_rows(tmp_path):
    assert final_eval_rows(0, tmp_path) == []


def test_collect_lists_failed_seeds_and_seeds_without_figures(tmp_path):
    _eval_results(tmp_path / "seed0", compile_rate=1.0, pass_rate=0.5, reward_mean=0.0, fast_1=0.0)
    (tmp_path / "seed2").mkdir()
    table = collect_seed_table({0: None, 1: "exit code 1", 2: None}, tmp_path)
    assert table.stages[FINAL_STAGE]["compile_rate"].per_seed == (1.0,)
    assert set(table.failed) == {1, 2}
    assert table.failed[1] == "exit code 1"


def test_the_json_table_reads_back_the_same(tmp_path):
    table = aggregate_seeds([_row(0, reward_mean=0.5), _row(1, reward_mean=0.25)])
    table.failed = {2: "exit code 1"}
    json_path, md_path = write_seed_table(table, tmp_path)
    assert table_from_json(json.loads(json_path.read_text())) == table
    assert md_path.read_text() == table_markdown(table)


def test_the_markdown_table_shows_mean_plus_minus_std_and_failed_seeds():
    table = aggregate_seeds([_row(0, correct_rate=0.5), _row(1, correct_rate=0.7)])
    table.failed = {2: "exit code 1"}
    text = table_markdown(table)
    assert "| heldout | 2 | 0.500 +- 0.000 | 0.600 +- 0.141 |" in text
    assert "- seed 2: exit code 1" in text


# --------------------------------------------------------------------------- compare

def test_compare_reads_seeds_json_or_a_single_runs_evaluation(tmp_path):
    many = tmp_path / "many"
    many.mkdir()
    write_seed_table(aggregate_seeds([_row(0, correct_rate=0.5), _row(1, correct_rate=0.7)]),
                     many)
    single = tmp_path / "single"
    _eval_results(single, compile_rate=0.9, pass_rate=0.4, reward_mean=0.1, fast_1=0.2, seed=7)
    assert run_figures(single).rows[0].seed == 7
    lines = compare_table({"many": run_figures(many), "single": run_figures(single)}).splitlines()
    assert lines[0].split() == ["run", "stage", "seeds", *SEED_METRICS]
    assert lines[1].split()[:5] == ["many", "heldout", "2", "0.500", "+-"]
    assert "0.600 +- 0.141" in lines[1]
    assert lines[2].split() == ["single", "heldout", "1", "0.900", "0.400", "0.100", "0.200"]


def test_compare_refuses_a_folder_without_figures(tmp_path):
    with pytest.raises(ValueError, match="neither seeds.json nor eval_results.json"):
        run_figures(tmp_path)


def test_a_malformed_seeds_json_is_named(tmp_path):
    (tmp_path / "seeds.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="seeds.json: not a seeds.json table"):
        run_figures(tmp_path)


# --------------------------------------------------------------------------- the launch plan

def _plan(seeds, gpu_ids, tmp_path):
    return seed_launch_plan(seeds, gpu_ids=gpu_ids, config_path=tmp_path / "seeds_config.json",
                            output_dir=tmp_path, command=("python", "-m", "multiminddev.cli"))


def test_without_a_gpu_the_seeds_run_one_after_another_with_the_replayed_settings(tmp_path):
    plan = _plan([0, 1], [], tmp_path)
    assert [p.slot for p in plan] == [0, 0]
    assert all(p.env == {} for p in plan)
    assert plan[1].argv == ("python", "-m", "multiminddev.cli", "train", "--config",
                            str(tmp_path / "seeds_config.json"), "--set", "seed=1",
                            "--output-dir", str(tmp_path / "seed1"))
    assert plan[1].output_dir == tmp_path / "seed1"


def test_one_gpu_runs_the_seeds_one_after_another_on_it(tmp_path):
    plan = _plan([0, 1, 2], ["0"], tmp_path)
    assert {p.slot for p in plan} == {0}
    assert all(p.env == {} and "--num-gpus" not in p.argv for p in plan)


def test_four_gpus_give_each_seed_its_own_gpu(tmp_path):
    plan = _plan([0, 1, 2, 3], ["0", "1", "2", "3"], tmp_path)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan] == ["0", "1", "2", "3"]
    assert [p.slot for p in plan] == [0, 1, 2, 3]
    assert all(p.argv[-2:] == ("--num-gpus", "1") for p in plan)


def test_more_seeds_than_gpus_queue_on_the_gpus_in_turn(tmp_path):
    plan = _plan([5, 6, 7], ["2", "3"], tmp_path)
    assert [(p.seed, p.env["CUDA_VISIBLE_DEVICES"], p.slot) for p in plan] == [
        (5, "2", 0), (6, "3", 1), (7, "2", 0)]


def test_a_repeated_seed_is_refused(tmp_path):
    with pytest.raises(ValueError, match="each seed once"):
        _plan([1, 1], [], tmp_path)


def test_the_gpus_are_the_visible_ones_capped_by_num_gpus():
    assert seed_gpu_ids(None, 4, None) == ["0", "1", "2", "3"]
    assert seed_gpu_ids("4,6", 2, None) == ["4", "6"]
    assert seed_gpu_ids(None, 4, 2) == ["0", "1"]
    assert seed_gpu_ids("", 0, None) == []


def test_a_planned_command_starts_the_cli(tmp_path):
    # the plan's command is one the launcher can run: the CLI answers --help through it
    plan = seed_launch_plan([0], gpu_ids=[], config_path=tmp_path / "c.json",
                            output_dir=tmp_path, command=(sys.executable, "-m", "multiminddev.cli"))
    argv = [*plan[0].argv[:4], "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                              str(Path(__file__).parents[2] / "src"),
                              os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0 and "--seeds" in done.stdout


def test_a_failing_seed_does_not_stop_the_others(tmp_path):
    # a stand-in CLI that fails for seed 1: the runner, not training, is what is tested here
    script = ("import sys; seed = int(sys.argv[sys.argv.index('--set') + 1].split('=')[1]); "
              "print('seed', seed); sys.exit(3 if seed == 1 else 0)")
    plan = seed_launch_plan([0, 1, 2], gpu_ids=["0", "1"], config_path=tmp_path / "c.json",
                            output_dir=tmp_path, command=(sys.executable, "-c", script))
    log = io.StringIO()
    outcome = run_seed_plan(plan, log=log)
    assert outcome[0] is None and outcome[2] is None
    assert outcome[1].startswith("exit code 3")
    assert (tmp_path / "seed2" / "train.log").read_text() == "seed 2\n"
    assert "seed 1 FAILED: exit code 3" in log.getvalue()


def test_a_run_with_an_sft_evaluation_gives_the_gain_over_sft(tmp_path):
    from multiminddev.train.seeds import GAIN_STAGE, SFT_STAGE

    figures = {"compile_rate": 1.0, "pass_rate": 0.5, "reward_mean": 0.25, "fast_1": 0.0}
    (tmp_path / "sft_eval_results.json").write_text(json.dumps(figures))
    (tmp_path / "eval_results.json").write_text(json.dumps({**figures, "reward_mean": 0.5}))
    rows = {row.stage: row for row in final_eval_rows(1, tmp_path)}
    assert set(rows) == {SFT_STAGE, FINAL_STAGE, GAIN_STAGE}
    assert rows[GAIN_STAGE].metrics == {"compile_rate": 0.0, "correct_rate": 0.0,
                                        "reward_mean": 0.25, "fast_1": 0.0}
