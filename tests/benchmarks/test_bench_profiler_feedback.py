"""bench_profiler_feedback: the comparison of the two variants, on episodes in the real schema."""

from __future__ import annotations

import pytest

from tests.benchmarks.helpers import eval_result, load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_profiler_feedback")


def _episode(problem_name, statuses_and_speedups, profiled=()):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.episode.state import Episode, Turn, episode_to_dict
    from multiminddev.tasks.loaders import load_problems

    problem = next(p for p in load_problems("builtin:tier0") if p.name == problem_name)
    turns = [Turn(index=i, role=AgentRole.GENERATOR if i == 0 else AgentRole.OPTIMIZER,
                  eval_result=eval_result(status, speed, problem=problem_name),
                  profile={"status": "ok", "kernels": []} if i in profiled else None)
             for i, (status, speed) in enumerate(statuses_and_speedups)]
    return episode_to_dict(Episode(problem=problem, turns=turns))


def _name():
    from multiminddev.tasks.loaders import load_problems

    return load_problems("builtin:tier0")[0].name


def test_an_episode_counts_its_best_correct_speedup_and_profiled_turns(bench):
    from multiminddev.env.results import EvalStatus

    row = bench.episode_figures(_episode(_name(), [(EvalStatus.OK, 0.8), (EvalStatus.OK, 1.6),
                                                   (EvalStatus.INCORRECT, 0.0)], profiled=(0, 1)))
    assert (row["correct"], row["speedup"], row["profiled_turns"]) == (True, 1.6, 2)


def test_the_comparison_names_the_problems_whose_speedup_moved(bench):
    plain = [{"problem": "a", "compiled": True, "correct": True, "speedup": 1.0,
              "profiled_turns": 0},
             {"problem": "b", "compiled": True, "correct": True, "speedup": 2.0,
              "profiled_turns": 0}]
    profiled = [{**plain[0], "speedup": 1.5, "profiled_turns": 2}, {**plain[1], "speedup": 2.01}]
    result = bench.compare(plain, profiled)
    assert result["changed_problems"] == [{"problem": "a", "plain": 1.0, "profiler": 1.5}]
    assert result["profiler"]["fast_1"] == 1.0 and result["profiler"]["profiled_turns"] == 2
