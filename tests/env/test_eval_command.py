"""The eval / eval-dir commands (CLI) on the CPU machine."""

from __future__ import annotations

import json
import shutil

import pytest

from multiminddev.cli import main
from multiminddev.commands._io import ExitCode
from multiminddev.commands.eval import match_candidates, summarize
from multiminddev.env import EvalResult, EvalStatus
from multiminddev.env.results import BenchmarkResult, StageStatus
from tests.conftest import gpu_available
from tests.env._fixtures import FIXTURES


@pytest.mark.skipif(gpu_available(), reason="CPU-machine expectation (no_gpu)")
def test_eval_json_prints_a_result_with_status(capsys):
    code = main(["eval", str(FIXTURES / "problems" / "1_relu.py"),
                 str(FIXTURES / "honest" / "relu_basic.py"), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == ExitCode.UNAVAILABLE and data["status"] == "no_gpu"  # compile-only
    assert data["compile"]["kernels"][0]["name"] == "relu"


def test_missing_file_is_a_usage_error(capsys):
    code = main(["eval", str(FIXTURES / "problems" / "missing.py"),
                 str(FIXTURES / "honest" / "relu_basic.py")])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_candidates_match_by_stem_or_leading_number(tmp_path):
    problems = [tmp_path / "17_Matmul.py", tmp_path / "3_relu.py"]
    cands = [tmp_path / "c" / "17_try2.py", tmp_path / "c" / "3_relu.py", tmp_path / "c" / "x.py"]
    pairs = match_candidates(problems, cands)
    assert pairs == [(problems[0], cands[0]), (problems[1], cands[1])]


def _result(status: EvalStatus, speedup: float = 0.0, compiled: bool = True) -> EvalResult:
    r = EvalResult(status=status, problem="p")
    r.compile.status = StageStatus.OK if compiled else StageStatus.FAILED
    r.benchmark = BenchmarkResult(status=StageStatus.OK, speedup_vs_eager=speedup)
    return r


def test_summary_counts_rates_and_geometric_mean():
    results = [_result(EvalStatus.OK, 2.0), _result(EvalStatus.OK, 8.0),
               _result(EvalStatus.INCORRECT), _result(EvalStatus.COMPILE_ERROR, compiled=False)]
    s = summarize(results)
    assert s["status_counts"] == {"compile_error": 1, "incorrect": 1, "ok": 2}
    assert s["compile_rate"] == 0.75 and s["correct_rate"] == 0.5
    assert s["geomean_speedup_vs_eager"] == pytest.approx(4.0)


@pytest.mark.skipif(gpu_available(), reason="CPU-machine expectation (no_gpu)")
def test_eval_dir_writes_jsonl(tmp_path, capsys):
    cands = tmp_path / "cands"
    cands.mkdir()
    shutil.copy(FIXTURES / "honest" / "relu_basic.py", cands / "1_relu.py")
    shutil.copy(FIXTURES / "wrong" / "relu_compile_error.py", cands / "1_relu_v2.py")
    out = tmp_path / "results.jsonl"
    code = main(["eval-dir", str(FIXTURES / "problems"), str(cands), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == ExitCode.EVALUATION_FAILED  # one candidate does not compile
    assert {r["candidate_file"]: r["status"] for r in rows} == {
        "1_relu.py": "no_gpu", "1_relu_v2.py": "compile_error"}
    assert "2 candidates" in capsys.readouterr().out


@pytest.mark.skipif(gpu_available(), reason="CPU-machine expectation (no_gpu)")
def test_eval_dir_resume_keeps_written_results_and_evaluates_the_rest(tmp_path, capsys):
    cands = tmp_path / "cands"
    cands.mkdir()
    shutil.copy(FIXTURES / "honest" / "relu_basic.py", cands / "1_relu.py")
    shutil.copy(FIXTURES / "wrong" / "relu_compile_error.py", cands / "1_relu_v2.py")
    out = tmp_path / "results.jsonl"
    # An earlier run that was cut off: one result written, then a torn line.
    kept = EvalResult(status=EvalStatus.INCORRECT, problem="relu", message="from the first run")
    out.write_text(json.dumps({"candidate_file": "1_relu.py", **kept.to_dict()}) + "\n{\"cand")
    code = main(["eval-dir", str(FIXTURES / "problems"), str(cands), "--out", str(out), "--resume"])
    assert code == ExitCode.EVALUATION_FAILED  # incorrect and compile_error
    assert "resuming: 1 of 2" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["candidate_file"]: r["status"] for r in rows} == {
        "1_relu.py": "incorrect", "1_relu_v2.py": "compile_error"}


def test_eval_dir_resume_without_out_is_a_usage_error(tmp_path, capsys):
    code = main(["eval-dir", str(FIXTURES / "problems"), str(FIXTURES / "honest"), "--resume"])
    assert code == 2 and "--resume needs --out" in capsys.readouterr().err
