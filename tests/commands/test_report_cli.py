"""``multiminddev report`` on the README's form (RUN_DIR alone) and on bad JSONL."""

from __future__ import annotations

import json

from multiminddev.env.results import EvalResult, EvalStatus
from tests.commands.helpers import assert_one_line_error, run_cli


def _result_line(problem: str) -> str:
    return json.dumps({"candidate_file": f"{problem}.py",
                       **EvalResult(status=EvalStatus.NO_GPU, problem=problem).to_dict()}) + "\n"


def test_report_run_dir_alone_writes_into_the_run_and_says_where(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.1}\n'
                                       '{"step": 2, "reward_mean": 0.3}\n')
    code, out, err = run_cli(capsys, "report", run)
    assert code == 0 and "Traceback" not in err
    assert (run / "report.html").is_file()
    assert out.strip().splitlines()[-1] == f"report: {run / 'report.html'}"


def test_report_skips_torn_and_non_utf8_lines_with_a_count(tmp_path, capsys):
    bench = tmp_path / "results.jsonl"
    bench.write_bytes((_result_line("a") + _result_line("b")).encode() + b"\xff\xfe\n{\"cut")
    code, out, err = run_cli(capsys, "report", "--bench", bench, "--out", tmp_path / "rep")
    assert code == 0 and "Traceback" not in out + err
    assert "skipped 2 lines" in err and "line 3, 4" in err
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["labels"]["results"]["n"] == 2


def test_report_of_a_file_without_results_is_a_one_line_error(tmp_path, capsys):
    bench = tmp_path / "x.jsonl"
    bench.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    code, out, err = run_cli(capsys, "report", "--bench", bench, "--out", tmp_path / "rep")
    assert_one_line_error(code, out, err, contains="holds no episodes or EvalResults")
    assert not (tmp_path / "rep").exists()


def test_report_of_json_that_is_not_results_is_a_one_line_error(tmp_path, capsys):
    bench = tmp_path / "x.jsonl"
    bench.write_text('{"a": 1}\n')
    assert_one_line_error(*run_cli(capsys, "report", "--bench", bench, "--out", tmp_path / "r"),
                          contains="holds no episodes or EvalResults")


def test_report_names_a_directory_given_as_bench_file(tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, "report", "--bench", tmp_path, "--out", tmp_path / "r"),
                          contains="is a directory")


def test_report_names_a_file_given_as_run_dir(tmp_path, capsys):
    f = tmp_path / "results.jsonl"
    f.write_text(_result_line("a"))
    assert_one_line_error(*run_cli(capsys, "report", f), contains="is a file, not a directory")


def test_report_of_an_empty_folder_says_what_to_give(tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, "report", tmp_path), contains="nothing to report")
    assert not (tmp_path / "report.html").exists()
