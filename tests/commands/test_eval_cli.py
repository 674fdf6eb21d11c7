"""``multiminddev eval`` and ``eval-dir`` on bad inputs: one-line errors, per-candidate results
for unreadable candidates, KernelBench's generation names, unmatched candidates reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiminddev.cli import main
from multiminddev.commands._io import ExitCode
from multiminddev.commands.eval import (
    pair_candidates,
    problem_files,
    result_exit_code,
    summarize,
    unreadable_result,
)
from multiminddev.env.results import EvalResult, EvalStatus, RejectReason
from multiminddev.tasks.problem import load_problem
from tests.commands.helpers import assert_one_line_error, run_cli

NOT_UTF8 = b"import torch\n# \xff\xfe latin-1 residue\n"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """Two built-in relu-family problems and their naive solutions, in KernelBench layout."""
    out = tmp_path_factory.mktemp("export") / "kb"
    assert main(["problems", "export", str(out), "--family", "relu", "--shapes-per-family", "1",
                 "--with-solutions"]) == 0
    return out


def _level(exported: Path) -> Path:
    return next(exported.glob("level*"))


def test_eval_names_a_directory_given_as_candidate(exported, tmp_path, capsys):
    problem = next(_level(exported).glob("*.py"))
    assert_one_line_error(*run_cli(capsys, "eval", problem, tmp_path), contains="is a directory")


def test_eval_names_a_missing_candidate(exported, tmp_path, capsys):
    problem = next(_level(exported).glob("*.py"))
    assert_one_line_error(*run_cli(capsys, "eval", problem, tmp_path / "nope.py"),
                          contains="does not exist")


def test_eval_reports_a_candidate_that_is_not_utf8(exported, tmp_path, capsys):
    problem = next(_level(exported).glob("*.py"))
    bad = tmp_path / "cand.py"
    bad.write_bytes(NOT_UTF8)
    assert_one_line_error(*run_cli(capsys, "eval", problem, bad), contains="is not UTF-8 text")


def test_eval_reports_a_problem_that_is_not_utf8(exported, tmp_path, capsys):
    bad = tmp_path / "1_bad.py"
    bad.write_bytes(NOT_UTF8)
    cand = next((exported / "solutions" / "naive").rglob("*.py"))
    assert_one_line_error(*run_cli(capsys, "eval", bad, cand), contains="is not UTF-8 text")


def test_kernelbench_generation_names_pair_with_the_problem_of_their_level(tmp_path):
    problems = [tmp_path / "level1" / "17_Matmul.py", tmp_path / "level1" / "3_Relu.py",
                tmp_path / "level2" / "17_Conv.py"]
    cands = [tmp_path / "c" / "level_1_problem_17_sample_0_kernel.py",
             tmp_path / "c" / "level_2_problem_17_sample_3_kernel.py",
             tmp_path / "c" / "level_1_problem_3_sample_1_kernel.py",
             tmp_path / "c" / "level_4_problem_3_sample_0_kernel.py"]
    match = pair_candidates(problems, cands)
    assert match.pairs == [(problems[0], cands[0]), (problems[2], cands[1]), (problems[1], cands[2])]
    assert match.unmatched == [cands[3]]


def test_kernelbench_generation_names_pair_by_number_without_level_folders(tmp_path):
    problems = [tmp_path / "probs" / "5_Softmax.py"]
    cand = tmp_path / "c" / "level_1_problem_5_sample_0_kernel.py"
    assert pair_candidates(problems, [cand]).pairs == [(problems[0], cand)]


def test_problem_files_reads_a_kernelbench_checkout(tmp_path):
    for rel in ("KernelBench/level1/1_A.py", "KernelBench/level2/1_B.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert [p.relative_to(tmp_path).as_posix() for p in problem_files(tmp_path)] == [
        "KernelBench/level1/1_A.py", "KernelBench/level2/1_B.py"]


def test_eval_dir_evaluates_the_rest_when_one_candidate_is_not_utf8(exported, tmp_path, capsys):
    level = _level(exported)
    good = min((exported / "solutions" / "naive" / level.name).glob("*.py"))
    cands = tmp_path / "cands"
    cands.mkdir()
    number = good.name.split("_", 1)[0]
    (cands / f"level_{level.name[5:]}_problem_{number}_sample_0_kernel.py").write_text(good.read_text())
    (cands / f"{number}_broken.py").write_bytes(NOT_UTF8)
    (cands / "notes.py").write_text("# matches no problem\n")
    out = tmp_path / "results.jsonl"
    code, stdout, stderr = run_cli(capsys, "eval-dir", level, cands, "--out", out)
    assert code == ExitCode.EVALUATION_FAILED and "Traceback" not in stdout + stderr
    rows = {r["candidate_file"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {f"{number}_broken.py", f"level_{level.name[5:]}_problem_{number}_sample_0_kernel.py"}
    broken = rows[f"{number}_broken.py"]
    assert broken["status"] == "rejected" and "not UTF-8" in broken["message"]
    other = rows[f"level_{level.name[5:]}_problem_{number}_sample_0_kernel.py"]
    assert other["status"] in ("no_gpu", "ok")
    # the unmatched candidate is named on stderr and in the summary, not dropped silently
    assert "notes.py" in stderr and "match no problem" in stderr
    assert "notes.py" in stdout and "matched no problem" in stdout


def test_eval_dir_with_no_match_names_the_layouts(exported, tmp_path, capsys):
    cands = tmp_path / "cands"
    cands.mkdir()
    (cands / "mine.py").write_text("")
    code, out, err = run_cli(capsys, "eval-dir", _level(exported), cands)
    assert code == 2 and "Traceback" not in out + err
    assert err.strip().splitlines()[-1].startswith("error: no candidate file")
    assert "level_1_problem_17_sample_0_kernel.py" in err


def test_eval_dir_refuses_a_directory_as_out(exported, tmp_path, capsys):
    cands = exported / "solutions" / "naive" / _level(exported).name
    assert_one_line_error(*run_cli(capsys, "eval-dir", _level(exported), cands, "--out", tmp_path),
                          contains="is a directory")


def test_eval_dir_names_a_file_given_as_folder(exported, tmp_path, capsys):
    problem = next(_level(exported).glob("*.py"))
    assert_one_line_error(*run_cli(capsys, "eval-dir", problem, tmp_path),
                          contains="is a file, not a directory")


def test_eval_dir_refuses_a_timing_budget_that_is_not_positive(exported, tmp_path, capsys):
    level = _level(exported)
    assert_one_line_error(*run_cli(capsys, "eval-dir", level, level, "--bench-budget", "0"),
                          contains="bench_budget_s must be > 0")


def test_the_timing_budget_reaches_the_evaluators_config():
    from multiminddev.cli import build_parser
    from multiminddev.commands.eval import _config
    from multiminddev.env import EvalConfig

    parser = build_parser()
    given = parser.parse_args(["eval-dir", "p", "c", "--bench-budget", "0.25"])
    default = parser.parse_args(["eval-dir", "p", "c"])
    assert _config(given).bench_budget_s == 0.25
    assert _config(default).bench_budget_s == EvalConfig.bench_budget_s


def test_the_tensor_transfer_reaches_the_evaluators_config():
    from multiminddev.cli import build_parser
    from multiminddev.commands.eval import _config
    from multiminddev.env import EvalConfig

    parser = build_parser()
    assert _config(parser.parse_args(["eval-dir", "p", "c", "--tensor-transfer", "memfd"])
                   ).tensor_transfer == "memfd"
    assert _config(parser.parse_args(["eval", "p", "c", "--tensor-transfer", "pipe"])
                   ).tensor_transfer == "pipe"
    assert _config(parser.parse_args(["eval", "p", "c"])).tensor_transfer == (
        EvalConfig().tensor_transfer)


def test_eval_refuses_an_arch_nvrtc_does_not_compile_for(exported, capsys):
    """argparse's one-line usage error and exit 2, before any evaluator starts."""
    problem = next(_level(exported).glob("*.py"))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(problem), str(problem), "--arch", "sm_999"])
    err = capsys.readouterr().err
    assert exit_info.value.code == ExitCode.BAD_INPUT
    assert err.strip().splitlines()[-1].startswith("multiminddev eval: error: argument --arch")
    assert "sm_90" in err and "\x00" not in err


@pytest.mark.parametrize("option,value", [("--trials", "0"), ("--workers", "0"),
                                          ("--arch", "hopper")])
def test_eval_refuses_a_bad_option_value(exported, option, value, capsys):
    problem = next(_level(exported).glob("*.py"))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-dir", str(problem.parent), str(problem.parent), option, value])
    assert exit_info.value.code == ExitCode.BAD_INPUT
    assert f"argument {option}" in capsys.readouterr().err


def test_eval_exits_1_for_a_rejected_candidate(exported, tmp_path, capsys):
    """A candidate the static checks reject (torch does the work) is a failed evaluation."""
    problem = next(_level(exported).glob("*.py"))
    cheat = tmp_path / "cheat.py"
    cheat.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n"
                     "    def forward(self, x):\n        return torch.relu(x)\n")
    code, out, err = run_cli(capsys, "eval", problem, cheat, "--json", "--no-benchmark",
                             "--trials", "1")
    assert json.loads(out)["status"] == "rejected"
    assert code == ExitCode.EVALUATION_FAILED and "Traceback" not in err


def _result(status: EvalStatus, reason: RejectReason | None = None) -> EvalResult:
    return EvalResult(status=status, problem="p", reject_reason=reason)


@pytest.mark.parametrize("statuses,code", [
    ([EvalStatus.OK], ExitCode.OK),
    ([EvalStatus.OK, EvalStatus.OK], ExitCode.OK),
    ([EvalStatus.REJECTED], ExitCode.EVALUATION_FAILED),
    ([EvalStatus.COMPILE_ERROR], ExitCode.EVALUATION_FAILED),
    ([EvalStatus.INCORRECT, EvalStatus.OK], ExitCode.EVALUATION_FAILED),
    ([EvalStatus.NO_GPU, EvalStatus.COMPILE_ERROR], ExitCode.EVALUATION_FAILED),
    ([EvalStatus.NO_GPU], ExitCode.UNAVAILABLE),
    ([EvalStatus.NO_GPU, EvalStatus.OK], ExitCode.UNAVAILABLE),
])
def test_the_exit_code_of_a_set_of_results(statuses, code):
    assert result_exit_code([_result(s) for s in statuses]) == code


def test_a_summary_without_a_gpu_says_not_measured_not_zero():
    summary = summarize([_result(EvalStatus.NO_GPU), _result(EvalStatus.COMPILE_ERROR)])
    assert summary["correct_rate"] is None
    assert json.loads(json.dumps(summary))["correct_rate"] is None


def test_a_file_that_is_not_utf8_counts_as_bad_input_not_as_a_hack(exported, tmp_path):
    problem = load_problem(next(_level(exported).glob("*.py")))
    result = unreadable_result(problem, tmp_path / "x.py", "x.py is not UTF-8 text")
    assert result.reject_reason is RejectReason.ENCODING
    assert summarize([result])["status_counts"] == {"bad_input": 1}


def test_eval_dir_with_an_unreachable_ray_address_fails_at_once(exported, capsys):
    """Exit 69 (unavailable), one line naming the address, within seconds: ray.init alone
    waits on such an address for minutes without a word."""
    import socket
    import time

    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    level = _level(exported)
    solutions = exported / "solutions" / "naive" / level.name
    start = time.monotonic()
    code, out, err = run_cli(capsys, "eval-dir", level, solutions, "--ray", f"127.0.0.1:{port}")
    assert time.monotonic() - start < 30
    assert_one_line_error(code, out, err, contains=f"127.0.0.1:{port}",
                          exit_code=ExitCode.UNAVAILABLE)
