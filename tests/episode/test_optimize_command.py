"""The ``multiminddev optimize`` command (commands/optimize.py)."""

import json

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.cli import build_parser, main
from multiminddev.commands.optimize import describe
from multiminddev.env.results import CompileResult, EvalResult, EvalStatus, StageStatus
from multiminddev.episode import Episode, EpisodeStatus, Turn
from tests.episode.helpers import RELU_KERNEL, RELU_PROBLEM, relu_problem
from tests.policy.helpers import require_default_model


def test_optimize_is_registered_with_its_options():
    args = build_parser().parse_args(["optimize", "p.py", "--turns", "3", "--json"])
    assert args.turns == 3 and args.json and args.model == "default" and callable(args.handler)


def test_describe_marks_compile_only_kernels_unverified():
    result = EvalResult(status=EvalStatus.NO_GPU, problem="relu",
                        compile=CompileResult(status=StageStatus.OK))
    turn = Turn(index=0, role=AgentRole.GENERATOR, candidate_source=RELU_KERNEL,
                eval_result=result, improved=True)
    episode = Episode(problem=relu_problem(), turns=[turn], status=EpisodeStatus.MAX_TURNS,
                      best_turn=0, best_source=RELU_KERNEL, best_result=result, compile_only=True)
    text = describe(episode)
    assert "compile-only: not verified" in text and "class ModelNew" in text


def test_describe_without_any_kernel():
    episode = Episode(problem=relu_problem(), status=EpisodeStatus.FORMAT_FAILURES)
    assert "no kernel compiled" in describe(episode)


def test_missing_problem_file_is_an_error(tmp_path, capsys):
    assert main(["optimize", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_optimize_runs_the_embedded_model_end_to_end(tmp_path, capsys):
    """The issue's CPU criterion: an episode with the embedded model, compile-only results."""
    require_default_model()
    problem = tmp_path / "relu.py"
    problem.write_text(RELU_PROBLEM)
    out = tmp_path / "episodes.jsonl"
    code = main(["optimize", str(problem), "--turns", "2", "--max-new-tokens", "24",
                 "--seed", "0", "--json", "--save", str(out)])
    data = json.loads(capsys.readouterr().out)
    assert code in (0, 1, 69) and data["problem"]["name"] == "relu"  # 69: compile-only
    assert 1 <= len(data["turns"]) <= 2 and data["status"] != "running"
    assert all(t["response_ids"] and len(t["logprobs"]) == len(t["response_ids"])
               for t in data["turns"])
    assert out.exists() and json.loads(out.read_text().splitlines()[0])["episode_id"]
