"""``multiminddev optimize`` and ``bench``: bad models fail in one line before anything loads
or is written; progress goes to stderr."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest

from multiminddev.cli import main
from multiminddev.commands._io import ExitCode
from multiminddev.commands._progress import ProgressBackend, ProgressEvaluator
from tests.commands.helpers import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "kb"
    assert main(["problems", "export", str(out), "--family", "relu", "--shapes-per-family", "1"]) == 0
    return next(out.rglob("level*/*.py"))


def test_optimize_with_a_missing_model_folder(problem, tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, "optimize", problem, "--model", tmp_path / "nope"),
                          contains="does not exist", exit_code=ExitCode.UNAVAILABLE)


def test_optimize_with_a_junk_model_folder(problem, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    assert_one_line_error(*run_cli(capsys, "optimize", problem, "--model", tmp_path),
                          contains="is not a model folder", exit_code=ExitCode.UNAVAILABLE)


def test_optimize_with_an_uncached_hub_id_offline_fails_fast(problem, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_line_error(*run_cli(capsys, "optimize", problem, "--model", "no-org/no-model"),
                          contains="HF_HUB_OFFLINE is set", exit_code=ExitCode.UNAVAILABLE)


def test_optimize_names_a_directory_given_as_problem(tmp_path, capsys):
    assert_one_line_error(*run_cli(capsys, "optimize", tmp_path), contains="is a directory")


@pytest.mark.parametrize("option,value", [
    ("--turns", "0"), ("--turns", "-1"), ("--turns", "two"), ("--max-new-tokens", "0"),
    ("--temperature", "-0.5"), ("--top-p", "0"), ("--top-p", "1.5"), ("--patience", "-1"),
    ("--target-speedup", "nan"),
])
def test_optimize_refuses_a_bad_setting_before_the_model_loads(problem, option, value, capsys,
                                                               monkeypatch):
    """argparse's one-line usage error and exit 2; the model is never loaded (the loader
    raises here if it is reached)."""
    from multiminddev.commands import optimize

    def no_loading(config):
        raise AssertionError("the model was loaded for a bad argument")

    monkeypatch.setattr(optimize, "load_policy", no_loading)
    with pytest.raises(SystemExit) as exit_info:
        main(["optimize", str(problem), option, value])
    err = capsys.readouterr().err
    assert exit_info.value.code == ExitCode.BAD_INPUT
    assert err.strip().splitlines()[-1].startswith(f"multiminddev optimize: error: argument {option}")
    assert "Traceback" not in err


def test_bench_checks_every_model_before_writing(tmp_path, capsys):
    out = tmp_path / "bench"
    code, stdout, err = run_cli(capsys, "bench", "--model", "default", "--model",
                                tmp_path / "nope", "--out", out)
    assert_one_line_error(code, stdout, err, contains="does not exist",
                          exit_code=ExitCode.UNAVAILABLE)
    assert not out.exists()


class _Backend:
    tokenizer = "tok"

    async def generate(self, prompts, sampling, role):
        return [f"reply to {p}" for p in prompts]


class _Evaluator:
    async def aevaluate(self, problem, candidate):
        return SimpleNamespace(status=SimpleNamespace(value="no_gpu"), message="compiled")


def test_progress_backend_reports_each_batch_and_passes_replies_through():
    stream = io.StringIO()
    backend = ProgressBackend(_Backend(), label="m", stream=stream)
    replies = asyncio.run(backend.generate([[1], [2]], None, SimpleNamespace(value="generator")))
    assert replies == ["reply to [1]", "reply to [2]"] and backend.tokenizer == "tok"
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[m] generator: writing 2 replies ..." and lines[1].startswith("[m] generator: done")


def test_progress_evaluator_reports_each_status():
    stream = io.StringIO()
    judge = ProgressEvaluator(_Evaluator(), stream=stream)
    result = asyncio.run(judge.aevaluate(SimpleNamespace(name="relu"), "src"))
    assert result.status.value == "no_gpu"
    assert stream.getvalue() == "evaluated #1 relu: no_gpu (compiled)\n"


@pytest.mark.parametrize("verified,compiled,compile_only,code", [
    (True, True, False, ExitCode.OK),
    (False, True, True, ExitCode.UNAVAILABLE),  # compiles; no GPU here to verify it
    (False, True, False, ExitCode.EVALUATION_FAILED),  # ran on a GPU, not correct
    (False, False, True, ExitCode.EVALUATION_FAILED),
])
def test_the_exit_code_of_an_episode(verified, compiled, compile_only, code):
    from multiminddev.commands.optimize import episode_exit_code

    episode = SimpleNamespace(verified=verified, compile_only=compile_only,
                              best_result=SimpleNamespace(compiled=compiled))
    assert episode_exit_code(episode) == code
