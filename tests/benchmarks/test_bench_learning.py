"""The learning benchmark: its rows and their aggregation (learning_rows.py), and the driver over
``multiminddev train`` (bench_learning.py) on real episode files."""

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("learning_rows")


def _row(compiled, correct, speedup, reward):
    return {"problem": "p", "tier": 0, "compiled": compiled, "correct": correct,
            "speedup": speedup, "reward": reward}


def _seed(bench, seed, stages):
    rows = {stage: [_row(*r) for r in rs] for stage, rs in stages.items()}
    return {"seed": seed, "rows": rows,
            "metrics": {s: bench.stage_metrics(r, False) for s, r in rows.items()}}


def test_stage_metrics_count_episodes(bench):
    rows = [_row(True, True, 2.0, 1.0), _row(True, False, 0.0, 0.0),
            _row(False, False, 0.0, -0.1), _row(True, True, 0.5, 0.3)]
    m = bench.stage_metrics(rows, compile_only=False)
    assert m == {"compile_rate": 0.75, "correct_rate": 0.5, "reward_mean": pytest.approx(0.3),
                 "fast_1": 0.25, "infra_errors": 0.0, "repeat_episodes": 0.0}
    rows[2]["infra_error"] = True  # a failed evaluation of ours still counts as a failure
    assert bench.stage_metrics(rows, compile_only=False)["infra_errors"] == 1.0
    assert bench.stage_metrics(rows, compile_only=False)["compile_rate"] == 0.75
    assert bench.stage_metrics(rows, compile_only=True)["fast_1"] == 0.0


def test_longer_episodes_also_report_what_two_turns_reached(bench):
    def row(compiled_turn, correct_turn, turns):
        return {**_row(compiled_turn > 0, correct_turn > 0, 1.0, 0.0),
                "compiled_turn": compiled_turn, "correct_turn": correct_turn, "turns": turns}

    rows = [row(1, 1, 3), row(1, 3, 4), row(2, 0, 3), row(3, 0, 3)]
    assert bench.rate_within_turns(rows, "correct_rate", 2) == 0.25
    assert bench.rate_within_turns(rows, "compile_rate", 2) == 0.75
    seeds = [{"rows": {"sft": rows}, "metrics": {"sft": bench.stage_metrics(rows, False)}}] * 2
    summary = bench.stage_summary(seeds, "sft", compile_only=False)
    assert summary["sft/correct_rate"]["mean"] == 0.5
    assert summary["sft/correct_rate_within_2_turns"]["mean"] == 0.25
    two_turn = [{**r, "turns": 2} for r in rows]  # nothing to add when no episode ran longer
    seeds = [{"rows": {"sft": two_turn}, "metrics": {"sft": bench.stage_metrics(two_turn, False)}}]
    assert "sft/correct_rate_within_2_turns" not in bench.stage_summary(seeds, "sft", False)


def test_seeds_without_a_base_stage_borrow_it(bench):
    base = [(False, False, 0.0, -0.1), (True, False, 0.0, 0.0)]
    later = {"sft": [(True, True, 1.5, 0.5)] * 2, "grpo": [(True, True, 2.0, 0.8)] * 2}
    seeds = [_seed(bench, 0, {"base": base, **later}), _seed(bench, 1, later)]
    assert bench.share_base_stage(seeds, False) == 0
    assert seeds[1]["rows"]["base"] == seeds[0]["rows"]["base"]
    assert seeds[1]["metrics"]["base"]["compile_rate"] == 0.5
    assert seeds[1]["base_from_seed"] == 0 and "base_from_seed" not in seeds[0]


def test_sharing_needs_one_seed_with_a_base_stage(bench):
    later = {"sft": [(True, True, 1.5, 0.5)], "grpo": [(True, True, 2.0, 0.8)]}
    with pytest.raises(ValueError, match="without --skip-base"):
        bench.share_base_stage([_seed(bench, 0, later), _seed(bench, 1, later)], False)


def _episode(problem, *turns):
    """The fields of episode.write_episodes_jsonl's records that the outcome table reads."""
    return json.dumps({"problem": {"name": problem}, "turns": [
        {"eval_result": {"status": t}, "parse_failure": None} if t != "syntax_error"
        else {"eval_result": None, "parse_failure": "syntax_error"} for t in turns]})


def test_outcome_table_lists_each_problems_turns_per_stage_and_seed(bench, tmp_path):
    for seed, (sft, grpo) in {0: ("ok", "incorrect"), 1: ("incorrect", "ok")}.items():
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        (d / "episodes_sft.jsonl").write_text(_episode("relu_4096", sft, "ok") + "\n"
                                              + _episode("abs_4096", "syntax_error") + "\n")
        (d / "episodes_grpo.jsonl").write_text(_episode("relu_4096", grpo) + "\n")
        (d / "episodes_grpo@4.jsonl").write_text(_episode("relu_4096", "compile_error") + "\n")
        (d / "episodes.jsonl").write_text(_episode("train_problem", "ok") + "\n")  # GRPO rollouts
    lines = bench.outcome_table(tmp_path, [0, 1]).splitlines()
    assert lines[1].split("\t") == ["problem", "sft/s0", "sft/s1", "grpo@4/s0", "grpo@4/s1",
                                    "grpo/s0", "grpo/s1"]
    assert lines[2].split("\t") == ["relu_4096", "ok>ok", "incorrect>ok", "compile_error",
                                    "compile_error", "incorrect", "ok"]
    assert lines[3].split("\t") == ["abs_4096", "syntax_error", "syntax_error", "-", "-", "-", "-"]
    assert len(lines) == 4  # training rollouts (episodes.jsonl) are no held-out stage


# ------------------------------------------------ GRPO's training distribution (train_* stages)

def _real_row(bench, problem, status, speedup=0.0, reward=0.0):
    """A row as ``episode_row`` makes it, from a one-turn episode of ``status``."""
    from types import SimpleNamespace

    from tests.benchmarks.helpers import eval_result

    turn = SimpleNamespace(eval_result=eval_result(status, speedup, problem), repeat_of=None)
    episode = SimpleNamespace(problem=SimpleNamespace(name=problem, tier=0), turns=[turn])
    return bench.episode_row(episode, reward)


def test_outcome_table_puts_the_train_stages_after_the_held_out_ones(bench, tmp_path):
    d = tmp_path / "seed0"
    d.mkdir()
    (d / "episodes_sft.jsonl").write_text(_episode("relu_4096", "ok") + "\n")
    (d / "episodes_grpo.jsonl").write_text(_episode("relu_4096", "incorrect") + "\n")
    (d / "episodes_train_grpo.jsonl").write_text(_episode("abs_1024", "ok") + "\n")
    (d / "episodes_train_sft.jsonl").write_text(_episode("abs_1024", "compile_error") + "\n")
    lines = bench.outcome_table(tmp_path, [0]).splitlines()
    assert lines[1].split("\t") == ["problem", "sft/s0", "grpo/s0", "train_sft/s0",
                                    "train_grpo/s0"]
    assert lines[2].split("\t") == ["relu_4096", "ok", "incorrect", "-", "-"]
    assert lines[3].split("\t") == ["abs_1024", "-", "-", "compile_error", "ok"]


def test_outcome_table_puts_the_select_stages_last_in_step_order(bench, tmp_path):
    d = tmp_path / "seed0"
    d.mkdir()
    for stage in ("select@12", "select@4", "select@0", "train_sft", "sft"):
        (d / f"episodes_{stage}.jsonl").write_text(_episode("relu_4096", "ok") + "\n")
    header = bench.outcome_table(tmp_path, [0]).splitlines()[1].split("\t")
    assert header == ["problem", "sft/s0", "train_sft/s0", "select@0/s0", "select@4/s0",
                      "select@12/s0"]


# --------------------------------------------------------------------------- early stopping

def test_the_chosen_step_has_the_best_select_reward_and_ties_go_to_the_earlier(bench):
    def rows(rewards_by_step):
        return {f"select@{k}": [_row(True, True, 1.0, r) for r in rs]
                for k, rs in rewards_by_step.items()}

    cases = [({0: [0.5, 0.1], 4: [0.9, 0.1], 8: [0.2, 0.2]}, 4),
             ({0: [0.6], 4: [0.6], 8: [0.1]}, 0),  # a tie keeps the step nearer SFT
             ({0: [0.0], 12: [0.3], 4: [0.2]}, 12)]
    for by_step, expected in cases:
        # the reference: the mean of each step's rewards, the highest, the earliest of those
        means = {k: sum(v) / len(v) for k, v in by_step.items()}
        reference = min(k for k, m in means.items() if m == max(means.values()))
        assert bench.chosen_step({**rows(by_step), "sft": [_row(1, 1, 9.0, 9.0)]}) == expected
        assert expected == reference
        assert bench.select_rewards(rows(by_step)) == pytest.approx(means)
    assert bench.chosen_step({"sft": [_row(True, True, 1.0, 0.5)]}) is None


def _select_rows(rewards_by_step):
    return {f"select@{k}": [_row(True, True, 1.0, r)] for k, r in rewards_by_step.items()}


def test_a_later_step_is_chosen_only_when_it_gains_more_than_the_margin(bench):
    def reference(means, min_gain):  # straight from the rule: walk the steps, replace on a gain
        chosen = None
        for k in sorted(means):
            if chosen is None or means[k] - means[chosen] > min_gain:
                chosen = k
        return chosen

    # recorded select@ rewards: seed 0 unchanged but for timing noise,
    # seed 1 falling, seed 2 one problem better at step 6
    seed0 = {0: 0.70102, 6: 0.70114, 12: 0.70126}
    seed1 = {0: 0.73787, 6: 0.67030, 12: 0.62832}
    seed2 = {0: 0.63378, 6: 0.70161, 12: 0.59780}
    assert bench.chosen_step(_select_rows(seed0)) == 12  # any gain: noise chose the last step
    assert bench.chosen_step(_select_rows(seed0), 0.01) == 0
    assert bench.chosen_step(_select_rows(seed1), 0.01) == 0
    assert bench.chosen_step(_select_rows(seed2), 0.01) == 6
    # the margin is against the step chosen so far: gains below it add up to a choice
    creeping = {0: 0.500, 4: 0.506, 8: 0.512, 12: 0.518}
    assert bench.chosen_step(_select_rows(creeping), 0.01) == 8
    for by_step in (seed0, seed1, seed2, creeping, {0: 0.4, 4: 0.4, 8: 0.39}):
        for min_gain in (0.0, 0.005, 0.01, 0.05):
            assert (bench.chosen_step(_select_rows(by_step), min_gain)
                    == reference(by_step, min_gain))


def test_the_interval_resamples_a_problems_samples_together(bench):
    def rows(k):  # 8 problems, half of them correct; each problem's k samples alike
        return [{**_row(True, i % 2 == 0, 1.0, 1.0 if i % 2 == 0 else 0.0), "problem": f"p{i}"}
                for i in range(8) for _ in range(k)]

    def interval(k):
        seed = {"rows": {"sft": rows(k)}, "metrics": {"sft": bench.stage_metrics(rows(k), False)}}
        return bench.stage_summary([seed], "sft", compile_only=False)["sft/reward_mean"]["ci95"]

    assert bench.rows_by_problem(rows(2))["p3"] == rows(2)[6:8]
    # identical samples add no information: the interval stays that of one episode per
    # problem, where resampling single episodes would have narrowed it
    assert interval(4) == interval(1)
    assert interval(1)[1] - interval(1)[0] > 0.4


def test_outcome_table_puts_a_problems_samples_in_one_cell(bench, tmp_path):
    d = tmp_path / "seed0"
    d.mkdir()
    (d / "episodes_sft.jsonl").write_text("\n".join(
        [_episode("relu_4096", "ok"), _episode("relu_4096", "incorrect", "ok"),
         _episode("abs_4096", "syntax_error")]) + "\n")
    lines = bench.outcome_table(tmp_path, [0]).splitlines()
    assert lines[2].split("\t") == ["relu_4096", "ok | incorrect>ok"]
    assert lines[3].split("\t") == ["abs_4096", "syntax_error"]


# --------------------------------------------------------------------------- infra errors

def _closed_evaluator_rows(bench, n):
    """Rows of ``n`` real episodes whose relu kernel reached a closed evaluator."""
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig, run_episodes
    from multiminddev.train.grpo import GRPOConfig
    from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced, relu_problem
    from tests.policy.helpers import gguf_tokenizer

    evaluator = Evaluator(EvalConfig(num_workers=1))
    evaluator.close()
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: fenced(RELU_KERNEL))
    episodes = run_episodes([relu_problem(f"relu_{i}") for i in range(n)], backend, evaluator,
                            EpisodeConfig(max_turns=1), group_size=1)
    return bench.stage_rows(episodes, GRPOConfig())


def test_rows_keep_the_evaluators_message_of_an_infra_error(bench):
    rows = _closed_evaluator_rows(bench, 1)
    assert rows[0]["infra_error"] and rows[0]["infra_message"] == "the evaluator is closed"


def test_a_stage_mostly_of_infra_errors_is_an_error_naming_the_cause(bench):
    rows = _closed_evaluator_rows(bench, 3)
    failure = bench.stage_infra_failure("grpo", rows, 0.5)
    assert failure.startswith("stage grpo: 3 of 3 episodes ended in an infrastructure error")
    assert "3 x 'the evaluator is closed'" in failure


def test_a_stage_with_few_infra_errors_stands(bench):
    rows = [_row(True, True, 1.0, 0.5) for _ in range(3)]
    rows[0]["infra_error"], rows[0]["infra_message"] = True, "the GPU ran out of memory"
    assert bench.stage_infra_failure("grpo", rows, 0.5) is None


def test_rows_recorded_without_messages_still_fail_the_stage(bench):
    rows = [{**_row(False, False, 0.0, 0.0), "infra_error": True} for _ in range(2)]
    assert "message not recorded" in bench.stage_infra_failure("sft", rows, 0.5)


DRIVER = '''import os, sys
from multiminddev.env import EvalConfig, Evaluator
from tests.episode.helpers import RELU_KERNEL, relu_problem

ME = __file__
if __name__ == "__main__":
    with Evaluator(EvalConfig(num_workers=1, spare_workers=0, num_trials=1,
                              infra_retry_delay_s=0.01)) as evaluator:
        first = evaluator.evaluate(relu_problem(), RELU_KERNEL)
        os.rename(ME, ME + ".gone")  # the tree rewritten under the running script
        # the worker started ahead of the rename serves the next job; the one after starts later
        second = [evaluator.evaluate(relu_problem(), RELU_KERNEL) for _ in range(3)][-1]
    print("RESULT", first.status.value, second.status.value, second.message)
'''


def test_workers_started_after_the_script_is_gone(tmp_path):
    """multiprocessing's forkserver would run the main script again in every worker it starts,
    and with the script gone (a run whose tree a later command rewrote) no worker would start.
    The evaluator's pool starts workers without the script, so a script that is gone keeps
    evaluating."""
    import os
    import subprocess
    import sys

    from tests.benchmarks.helpers import BENCHMARKS

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    root = str(BENCHMARKS.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.join(root, "src"), root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path, check=False)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    first, second = line.split()[1:3]
    assert first != "infra_error"
    assert second == first, line




# --------------------------------------------------------------------------- the driver

@pytest.fixture(scope="module")
def driver():
    return load_script("bench_learning")


def test_the_driver_trains_the_recipe_through_the_product(driver, tmp_path):
    args = driver.parse_args(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                              "--set", "learning_rate=2e-5"])
    command = driver.train_command(args)
    assert command[1:4] == ["-m", "multiminddev.cli", "train"]
    text = " ".join(command)
    assert "--recipe optimizer-grpo-greedy-generator --seeds 0 1" in text
    assert "--set eval_after_sft=true" in text and text.endswith("--set learning_rate=2e-5")


def test_the_drivers_command_is_one_train_accepts(driver, tmp_path):
    from multiminddev.cli import build_parser
    from multiminddev.commands.train import _settings

    args = driver.parse_args(["--output-dir", str(tmp_path), "--seeds", "3",
                              "--set", "num_steps=4"])
    settings = _settings(build_parser().parse_args(driver.train_command(args)[3:]))
    assert settings.eval_after_sft and settings.num_steps == 4 and settings.select_every == 4


def _seed_run(seed_dir, sft_speedups, final_speedups):
    """A seed's run folder as the product leaves it: both held-out evaluations' episodes."""
    from multiminddev.agents.roles import AgentRole
    from multiminddev.env.results import EvalStatus
    from multiminddev.episode.state import Episode, Turn, write_episodes_jsonl
    from multiminddev.tasks.loaders import load_problems
    from tests.benchmarks.helpers import eval_result

    problems = load_problems("builtin:tier0:heldout")[:2]
    seed_dir.mkdir(parents=True)
    for name, speedups in (("sft_eval_episodes.jsonl", sft_speedups),
                           ("eval_episodes.jsonl", final_speedups)):
        episodes = [Episode(problem=p, turns=[Turn(index=0, role=AgentRole.GENERATOR,
                                                   eval_result=eval_result(
                                                       EvalStatus.OK if s else EvalStatus.INCORRECT,
                                                       s, problem=p.name))])
                    for p, s in zip(problems, speedups)]
        write_episodes_jsonl(episodes, seed_dir / name)
    (seed_dir / "run_config.json").write_text(json.dumps({"sft_problems": "builtin:tier0:train"}))
    (seed_dir / "eval_results.json").write_text(json.dumps({"compile_only": False,
                                                            "measured_on": "H100"}))
    (seed_dir / "select.json").write_text(json.dumps({"rewards": {"0": 0.5, "4": 0.6},
                                                      "chosen_step": 4}))


def test_the_aggregate_gives_grpo_minus_sft_per_seed_per_episode(driver, tmp_path):
    _seed_run(tmp_path / "seed0", [1.2, 0.0], [1.2, 1.5])
    _seed_run(tmp_path / "seed1", [0.9, 0.0], [0.9, 0.0])
    args = driver.parse_args(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                              "--aggregate-only"])
    assert driver.main(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                        "--aggregate-only"]) == 0
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["sft/correct_rate"]["per_seed"] == [0.5, 0.5]
    assert summary["gain/grpo/correct_rate"]["per_seed"] == [0.5, 0.0]
    assert summary["gain/grpo/fast_1"]["per_seed"] == [0.5, 0.0]
    text = (tmp_path / "results.md").read_text()
    assert "| grpo |" in text and "seed 0: 4" in text
    assert (tmp_path / "seed1" / "episodes_grpo.jsonl").is_file()  # for the analysis scripts
    assert "grpo/s0" in (tmp_path / "outcomes.tsv").read_text()
    assert args.recipe == "optimizer-grpo-greedy-generator"


def test_a_seed_without_its_evaluation_is_named_and_left_out(driver, tmp_path, capsys):
    _seed_run(tmp_path / "seed0", [1.2, 0.0], [1.2, 1.5])
    (tmp_path / "seed1").mkdir()
    assert driver.main(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                        "--aggregate-only"]) == 1
    assert "seed 1 left out" in capsys.readouterr().err
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["stages"] == [
        "sft", "grpo"]
