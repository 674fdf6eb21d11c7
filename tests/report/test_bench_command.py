"""``multiminddev report`` on files written here in the real schemas, and ``multiminddev bench``
end to end with a tiny real model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.cli import main
from multiminddev.commands.bench import policy_runs
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    StageStatus,
    VerifyResult,
)
from multiminddev.episode.state import Episode, EpisodeStatus, Turn, write_episodes_jsonl
from multiminddev.tasks.problem import load_problem_source

PROBLEM_SRC = '''
import torch, torch.nn as nn
MULTIMINDDEV = {"tier": 1, "family": "relu"}
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(1024)]
def get_init_inputs():
    return []
'''

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _result(status: EvalStatus, speedup: float = 0.0) -> EvalResult:
    ok = status is EvalStatus.OK
    return EvalResult(
        status=status, problem="relu",
        compile=CompileResult(status=StageStatus.OK),
        verify=VerifyResult(status=StageStatus.OK if ok else StageStatus.FAILED, trials_run=5,
                            trials_passed=5 if ok else 0),
        benchmark=BenchmarkResult(status=StageStatus.OK if ok else StageStatus.SKIPPED,
                                  speedup_vs_eager=speedup),
        device="NVIDIA H100 80GB HBM3",
    )


def _episodes(speedups: list[float]) -> list[Episode]:
    problem = load_problem_source(PROBLEM_SRC, name="relu")
    out = []
    for i, s in enumerate(speedups):
        first = Turn(index=0, role=AgentRole.GENERATOR, text="...", candidate_source="src",
                     eval_result=_result(EvalStatus.INCORRECT))
        second = Turn(index=1, role=AgentRole.OPTIMIZER, text="...", candidate_source="src2",
                      eval_result=_result(EvalStatus.OK, s))
        out.append(Episode(problem=problem, episode_id=f"relu-0-{i}", turns=[first, second],
                           status=EpisodeStatus.MAX_TURNS, best_result=second.eval_result))
    return out


@pytest.fixture
def bench_files(tmp_path):
    episodes = write_episodes_jsonl(_episodes([1.5, 0.8]), tmp_path / "sft" / "episodes.jsonl")
    eval_dir = tmp_path / "kb_results.jsonl"  # as `multiminddev eval-dir --out` writes it
    eval_dir.write_text("".join(
        json.dumps({"candidate_file": f"1_relu_{i}.py", **_result(EvalStatus.OK, 2.5).to_dict()}) + "\n"
        for i in range(2)))
    return episodes, eval_dir


def test_report_command_from_bench_and_eval_dir_files(tmp_path, bench_files):
    episodes, eval_dir = bench_files
    out = tmp_path / "report"
    assert main(["report", "--bench", str(episodes), "--bench", str(eval_dir), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())["labels"]
    assert set(summary) == {"sft", "kb_results"}
    assert summary["sft"]["per_turn"]["frac_correct"] == pytest.approx([0.0, 1.0])
    assert summary["kb_results"]["geomean_speedup_vs_eager"] == pytest.approx(2.5)
    assert (out / "report.html").read_text().count("<img") >= 2


def test_report_command_reads_bench_out_folder_and_training_run(tmp_path, bench_files):
    from multiminddev.train.metrics import STEP_KEYS, MetricsConfig, MetricsLogger

    run = tmp_path  # holds sft/episodes.jsonl; add a training run's metrics.jsonl
    logger = MetricsLogger(MetricsConfig(output_dir=run / "train", tensorboard=False))
    for step in range(3):
        logger.log_step({**{k: 0.1 for k in STEP_KEYS}, "step": step, "compile_only": True})
    logger.log_eval(2, {"reward_mean": 0.3, "compile_rate": 0.5, "pass_rate": 0.0, "fast_1": 0.0})
    logger.close()
    write_episodes_jsonl(_episodes([3.0]), run / "eval_episodes.jsonl")  # the final held-out eval
    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "sft" in page and "Training run" in page and "compile-only" in page
    assert (out / "training.png").is_file() and (out / "training_eval.png").is_file()
    labels = json.loads((out / "summary.json").read_text())["labels"]
    assert f"{run.name} (held-out eval)" in labels


def test_report_command_labels_in_order(tmp_path, bench_files):
    episodes, eval_dir = bench_files
    out = tmp_path / "report"
    args = ["report", "--bench", str(episodes), "--label", "ckpt-A", "--bench", str(eval_dir),
            "--label", "kernelbench-harness", "--out", str(out)]
    assert main(args) == 0
    assert list(json.loads((out / "summary.json").read_text())["labels"]) == ["ckpt-A", "kernelbench-harness"]


def test_report_command_without_inputs_is_usage_error(tmp_path):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "o")]) == 2


def test_policy_runs_label_models_and_checkpoints(tmp_path):
    ckpt = tmp_path / "rl_checkpoints" / "best_model_episode_5"
    (ckpt / "generator").mkdir(parents=True)
    (ckpt / "generator" / "adapter_config.json").write_text("{}")
    runs = policy_runs(["default", "default"], [ckpt])
    assert list(runs) == ["default", "default#2", "rl_checkpoints/best_model_episode_5"]
    assert runs["rl_checkpoints/best_model_episode_5"].adapter_paths == {"generator": str(ckpt / "generator")}


def test_bench_rejects_folder_without_adapters(tmp_path, capsys):
    args = ["bench", "--adapters", str(tmp_path), "--problems", str(FIXTURES / "problems" / "1_relu.py"),
            "--out", str(tmp_path / "o")]
    assert main(args) == 2
    assert "adapter" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_end_to_end_with_tiny_model(tmp_path):
    helpers = pytest.importorskip("tests.policy.helpers")
    model_dir = tmp_path / "tiny"
    helpers.tiny_base_model().save_pretrained(model_dir)
    helpers.gguf_tokenizer().save_pretrained(model_dir)
    out = tmp_path / "bench"
    args = ["bench", "--model", str(model_dir), "--problems", str(FIXTURES / "problems" / "1_relu.py"),
            "--samples", "2", "--turns", "2", "--max-new-tokens", "8", "--no-benchmark",
            "--no-compile-baseline", "--out", str(out)]
    assert main(args) == 0
    label_dir = next(p for p in out.iterdir() if p.is_dir())
    lines = (label_dir / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2  # 1 problem x 2 samples
    summary = json.loads((label_dir / "summary.json").read_text())
    assert summary["episodes"] == 2
    assert (out / "report.html").is_file()


def test_report_command_reads_tiers_from_problem_spec(tmp_path):
    results = tmp_path / "kb.jsonl"
    rows = [_result(EvalStatus.OK, 1.5).to_dict() | {"problem": "2_sum_dim"},
            _result(EvalStatus.INCORRECT).to_dict() | {"problem": "1_relu"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report"
    args = ["report", "--bench", str(results), "--problems", str(FIXTURES / "problems"), "--out", str(out)]
    assert main(args) == 0
    per_tier = json.loads((out / "summary.json").read_text())["labels"]["kb"]["per_tier"]
    assert per_tier["0"]["correct_rate"] == 0.0 and per_tier["1"]["correct_rate"] == 1.0
