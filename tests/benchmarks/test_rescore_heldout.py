"""Re-scoring held-out episodes with quiet re-measurements, on episode files in the real schema
(write_episodes_jsonl) and measurement files as the script writes them."""

import json

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalStatus
from multiminddev.episode import Episode, Turn, write_episodes_jsonl
from tests.benchmarks.helpers import eval_result as _result
from tests.benchmarks.helpers import load_script
from tests.episode.helpers import relu_problem

KERNEL_A = "// kernel A: correct"
KERNEL_B = "// kernel B: correct, slower"
KERNEL_BAD = "// kernel C: wrong"


@pytest.fixture(scope="module")
def rescore():
    return load_script("rescore_heldout")


def _episode(turns):
    """turns: (source, status, speedup) per turn, Generator first."""
    return Episode(problem=relu_problem(), episode_id="relu-0-0", turns=[
        Turn(index=i, role=AgentRole.GENERATOR if i == 0 else AgentRole.OPTIMIZER,
             candidate_source=src, eval_result=_result(status, speed))
        for i, (src, status, speed) in enumerate(turns)])


def _write_run(root, stages):
    """stages: {(seed, stage): [episode turns, ...]} -> bench_learning's layout under root."""
    for (seed, stage), episodes in stages.items():
        write_episodes_jsonl([_episode(t) for t in episodes],
                             root / f"seed{seed}" / f"episodes_{stage}.jsonl")
    (root / "note.txt").write_text("test run\n")


def _write_measurements(path, entries):
    with path.open("w") as f:
        for source, status, speed in entries:
            f.write(json.dumps({"problem": "relu", "source": source,
                                "result": _result(status, speed).to_dict()}) + "\n")
        f.write('{"problem": "relu", "sour')  # a line torn by a kill is skipped


def test_same_kernel_scores_the_same_in_every_stage_after_rescoring(rescore, tmp_path):
    # the same kernel timed differently in SFT's and GRPO's evaluations (another moment on a
    # shared GPU)
    ok, bad = EvalStatus.OK, EvalStatus.INCORRECT
    _write_run(tmp_path, {
        (0, "sft"): [[(KERNEL_A, ok, 0.96), (KERNEL_BAD, bad, 0.0)]],
        (0, "grpo"): [[(KERNEL_A, ok, 0.61), (KERNEL_BAD, bad, 0.0)]],
        (1, "sft"): [[(KERNEL_B, ok, 0.80), (KERNEL_A, ok, 0.90)]],
        (1, "grpo"): [[(KERNEL_B, ok, 0.50), (KERNEL_A, ok, 0.95)]]})
    recorded = rescore.rescore(tmp_path, [0, 1], {})
    assert recorded["turns_not_remeasured"] == 6
    assert recorded["summary"]["gain/grpo/reward_mean"]["per_seed"][0] < -0.05

    _write_measurements(tmp_path / rescore.MEASUREMENTS, [
        (KERNEL_A, ok, 0.95), (KERNEL_A, ok, 0.97), (KERNEL_A, EvalStatus.INFRA_ERROR, 0.0),
        (KERNEL_B, ok, 0.70)])
    measured = rescore.read_measurements(tmp_path / rescore.MEASUREMENTS)
    assert sorted(len(v) for v in measured.values()) == [1, 3]
    result = rescore.rescore(tmp_path, [0, 1], measured)
    gains = result["summary"]["gain/grpo/reward_mean"]["per_seed"]
    assert gains == [0.0, 0.0]
    assert result["turns_not_remeasured"] == 0 and result["turns_no_longer_correct"] == 0
    # kernel A takes its lower-middle re-measurement (0.95; the infra error says nothing)
    sft = result["per_seed"][0]["sft"][0]
    assert sft["speedup"] == pytest.approx(0.95) and sft["correct"]
    assert result["speed_spread"]["kernels"] == 0  # the infra error keeps A out of the spread


def test_a_kernel_failing_its_re_measurement_counts_as_failing(rescore, tmp_path):
    ok = EvalStatus.OK
    _write_run(tmp_path, {(0, "sft"): [[(KERNEL_A, ok, 0.9)]],
                          (0, "grpo"): [[(KERNEL_A, ok, 0.9)]]})
    _write_measurements(tmp_path / rescore.MEASUREMENTS,
                        [(KERNEL_A, ok, 0.9), (KERNEL_A, EvalStatus.INCORRECT, 0.0)])
    result = rescore.rescore(tmp_path, [0], rescore.read_measurements(
        tmp_path / rescore.MEASUREMENTS))
    assert result["turns_no_longer_correct"] == 2
    assert result["per_seed"][0]["grpo"][0]["correct"] is False


def test_measurement_order_repeats_each_kernel_round_by_round(rescore):
    keys = [("p", str(i)) for i in range(5)]
    order = rescore.measurement_order(keys, 2, seed=0)
    assert sorted(order[:5]) == keys and sorted(order[5:]) == keys
    assert order == rescore.measurement_order(keys, 2, seed=0)


def test_speed_spread_is_max_over_min_per_kernel(rescore):
    ok = EvalStatus.OK
    measured = {("p", "a"): [_result(ok, 1.0), _result(ok, 1.2)],
                ("p", "b"): [_result(ok, 0.5), _result(ok, 0.5)], ("p", "c"): [_result(ok, 2.0)]}
    spread = rescore.speed_spread(measured)
    assert spread["kernels"] == 2 and spread["worst_max_over_min"] == pytest.approx(1.2)


def test_aggregate_only_writes_reports_and_a_cpu_run_refuses_to_measure(rescore, tmp_path):
    torch = pytest.importorskip("torch")
    _write_run(tmp_path, {(0, "sft"): [[(KERNEL_A, EvalStatus.OK, 0.9)]],
                          (0, "grpo"): [[(KERNEL_A, EvalStatus.OK, 0.8)]]})
    assert rescore.main([str(tmp_path), "--seeds", "0", "--aggregate-only"]) == 0
    report = (tmp_path / "rescored.md").read_text()
    assert "grpo/reward_mean minus SFT" in report and "no re-measurement (kept as recorded): 2" in report
    assert json.loads((tmp_path / "rescored.json").read_text())["turns_not_remeasured"] == 2
    if not torch.cuda.is_available():
        assert rescore.main([str(tmp_path), "--seeds", "0"]) == 3
    assert rescore.main([str(tmp_path / "missing"), "--seeds", "0"]) == 2


def test_slim_copy_scores_like_the_full_files(rescore, tmp_path):
    ok = EvalStatus.OK
    run, slim = tmp_path / "run", tmp_path / "slim"
    _write_run(run, {(0, "sft"): [[(KERNEL_A, ok, 0.9), (KERNEL_B, ok, 0.95)]],
                     (0, "grpo"): [[(KERNEL_A, ok, 0.8)]]})
    for path in run.glob("seed0/*.jsonl"):  # a real file carries the tokens and the reply
        data = json.loads(path.read_text())
        data["turns"][0].update(prompt_ids=[1] * 500, response_ids=[2] * 300, text="x" * 900)
        path.write_text(json.dumps(data) + "\n")
    assert rescore.main([str(run), "--seeds", "0", "--write-slim", str(slim)]) == 0
    assert (slim / "note.txt").read_text() == "test run\n"
    full, small = run / "seed0/episodes_sft.jsonl", slim / "seed0/episodes_sft.jsonl"
    assert small.stat().st_size < full.stat().st_size - 2000  # 800 token ids, 900 chars
    assert "prompt_ids" not in json.loads(small.read_text())["turns"][0]
    assert rescore.rescore(slim, [0], {})["per_seed"] == rescore.rescore(run, [0], {})["per_seed"]


def test_training_problem_stages_are_not_rescored(rescore, tmp_path):
    for stage in ("sft", "grpo", "train_sft", "train_grpo", "grpo@4"):
        (tmp_path / "seed0").mkdir(exist_ok=True)
        (tmp_path / "seed0" / f"episodes_{stage}.jsonl").write_text("")
    assert sorted(stage for _, stage in rescore.stage_files(tmp_path, [0])) == ["grpo", "grpo@4", "sft"]
