"""``multiminddev sft|rl|train`` stop before any phase on a bad model, checkpoint or folder:
one line on stderr, exit 2, no run folder created."""

from __future__ import annotations

from multiminddev.commands._io import ExitCode
from tests.commands.helpers import assert_one_line_error, run_cli


def test_mistyped_generator_checkpoint_is_a_missing_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "rl", "--generator-checkpoint",
                                "runs/x/sft_checkpoints/generatr", "--output-dir", out)
    assert_one_line_error(code, stdout, err, contains="no such checkpoint folder",
                          exit_code=ExitCode.UNAVAILABLE)
    assert "--generator-checkpoint" in err and not out.exists()


def test_checkpoint_folder_without_adapters_says_where_it_looked(tmp_path, capsys):
    junk = tmp_path / "junk"
    junk.mkdir()
    code, out, err = run_cli(capsys, "rl", "--optimizer-checkpoint", junk,
                             "--output-dir", tmp_path / "out")
    assert_one_line_error(code, out, err, contains="no adapter_config.json in it",
                          exit_code=ExitCode.UNAVAILABLE)


def test_missing_model_folder_fails_before_the_run_starts(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "--model", tmp_path / "nope", "--output-dir",
                             tmp_path / "out")
    assert_one_line_error(code, out, err, contains="does not exist", exit_code=ExitCode.UNAVAILABLE)
    assert not (tmp_path / "out").exists()


def test_resume_of_a_missing_run_folder_is_an_error_not_a_fresh_run(tmp_path, capsys):
    code, out, err = run_cli(capsys, "rl", "--resume", tmp_path / "nope")
    assert_one_line_error(code, out, err, contains="no such run folder")
    assert not (tmp_path / "nope").exists()


def test_a_file_as_output_dir_is_named(tmp_path, capsys):
    f = tmp_path / "f.txt"
    f.write_text("")
    assert_one_line_error(*run_cli(capsys, "sft", "--output-dir", f), contains="is a file")


def test_conflicting_flags_are_one_line_on_stderr(tmp_path, capsys):
    code, out, err = run_cli(capsys, "rl", "--num-steps", "2", "--num-episodes", "8",
                             "--output-dir", tmp_path / "out")
    assert_one_line_error(code, out, err, contains="not both")


def test_sft_data_with_a_missing_archive_is_one_line_before_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "sft", "--sft-data", f"sakana:{tmp_path / 'nope'}",
                                "--output-dir", out)
    assert_one_line_error(code, stdout, err, contains="does not exist")
    assert "--sft-data" in err and not out.exists()


def test_sft_data_of_another_form_names_the_valid_one(tmp_path, capsys):
    archive = tmp_path / "level_2.parquet"
    archive.write_text("")
    code, stdout, err = run_cli(capsys, "train", "--sft-data", archive,
                                "--output-dir", tmp_path / "out")
    assert_one_line_error(code, stdout, err, contains="give sakana:PATH")
