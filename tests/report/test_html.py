"""The HTML report from real-schema results: parses, embeds valid PNGs, shows every label."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser

import pytest
from PIL import Image

from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    KernelResources,
    RejectReason,
    StageStatus,
    TimingStats,
    VerifyResult,
)
from multiminddev.report.html import normalise_samples, write_report


def real_result(problem: str, status: EvalStatus, speedup: float = 0.0) -> EvalResult:
    ok = status is EvalStatus.OK
    return EvalResult(
        status=status,
        problem=problem,
        candidate_hash="ab12",
        compile=CompileResult(status=StageStatus.OK, arch="sm_90", seconds=0.05,
                              kernels=[KernelResources(name="relu", registers=16)]),
        verify=VerifyResult(status=StageStatus.OK if ok else StageStatus.FAILED, trials_run=5,
                            trials_passed=5 if ok else 2, atol=1e-5, rtol=1e-5),
        benchmark=BenchmarkResult(
            status=StageStatus.OK if ok else StageStatus.SKIPPED,
            candidate=TimingStats(median_ms=0.1 / max(speedup, 1e-9), runs=50),
            eager=TimingStats(median_ms=0.1, runs=50),
            speedup_vs_eager=speedup if ok else 0.0,
            speedup_vs_compile=speedup / 1.3 if ok else None,
            gpu_name="NVIDIA H100 80GB HBM3",
        ),
        reject_reason=RejectReason.TRY_EXCEPT_FALLBACK if status is EvalStatus.REJECTED else None,
        device="NVIDIA H100 80GB HBM3",
    )


def episode(name: str, tier: int, results: list[EvalResult | None]) -> dict:
    turns = []
    for i, r in enumerate(results):
        role = "generator" if i == 0 else "optimizer"
        turns.append({"role": role, "text": "```python\n...\n```",
                      "eval_result": r.to_dict() if r else None})
        turns.append({"role": "tester", "text": "feedback", "eval_result": None})
    return {"problem": {"name": name, "tier": tier}, "turns": turns, "status": "done"}


BASE = [real_result("relu", EvalStatus.OK, 1.4), real_result("relu", EvalStatus.INCORRECT),
        real_result("softmax", EvalStatus.OK, 0.7), real_result("softmax", EvalStatus.REJECTED)]
TUNED = [episode("relu", 0, [real_result("relu", EvalStatus.INCORRECT), real_result("relu", EvalStatus.OK, 2.1)]),
         episode("softmax", 1, [real_result("softmax", EvalStatus.OK, 0.9), real_result("softmax", EvalStatus.OK, 1.3)]),
         episode("gelu", 1, [None])]


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    from multiminddev.train.metrics import STEP_KEYS, MetricsConfig, MetricsLogger

    run = tmp_path_factory.mktemp("train") / "run"
    logger = MetricsLogger(MetricsConfig(output_dir=run, tensorboard=False))
    for step in range(5):
        record = {k: 0.0 for k in STEP_KEYS}
        record.update(step=step, episodes=8 * (step + 1), reward_mean=0.1 * step, reward_std=0.05,
                      compile_rate=0.5 + 0.1 * step, pass_rate=0.1 * step, kl=0.01 * step,
                      tokens_per_s=900.0, evals_per_s=3.0, compile_only=False)
        logger.log_step(record)
    logger.close()
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory, training_run):
    path = write_report(tmp_path_factory.mktemp("report") / "out", bench_runs={"base": BASE, "grpo-step-100": TUNED},
                        training_run=training_run)
    parser = _Collector()
    parser.feed(path.read_text())
    return path, parser


def test_report_html_parses_with_tables_and_images(report):
    _, parser = report
    names = [t for t, _ in parser.tags]
    assert names.count("table") >= 3
    assert names.count("img") == 4  # speedups, per tier, per turn, training


def test_embedded_images_are_valid_pngs(report):
    _, parser = report
    for tag, attrs in parser.tags:
        if tag == "img":
            data = base64.b64decode(attrs["src"].split(",", 1)[1])
            img = Image.open(io.BytesIO(data))
            img.verify()
            assert img.format == "PNG"


def test_png_files_written_beside_report(report):
    path, _ = report
    for name in ("speedups.png", "per_tier.png", "per_turn.png", "training.png"):
        with Image.open(path.parent / name) as img:
            assert img.format == "PNG" and img.size[0] > 100


def test_labels_side_by_side_in_summary(report):
    _, parser = report
    headers = [d.strip() for d in parser.text]
    assert "base" in headers and "grpo-step-100" in headers


def test_summary_json_has_episode_best_results(report):
    path, _ = report
    summary = json.loads((path.parent / "summary.json").read_text())
    tuned = summary["labels"]["grpo-step-100"]
    assert tuned["episodes"] == 3 and tuned["format_failures"] == 1
    # 3 episodes: 2 correct, 1 without any candidate (a failed sample, not a dropped one)
    assert tuned["correct_rate"] == pytest.approx(2 / 3)
    assert tuned["format_failure_rate"] == pytest.approx(1 / 3)
    assert tuned["per_tier"]["1"]["n"] == 2  # softmax and gelu (no candidate)
    assert tuned["per_turn"]["frac_correct"] == pytest.approx([1 / 3, 2 / 3])
    assert summary["training_steps"] == 5


def test_compile_only_run_is_flagged(tmp_path):
    res = real_result("relu", EvalStatus.NO_GPU)
    path = write_report(tmp_path, bench_runs={"cpu": [res]})
    assert "without a GPU" in path.read_text()


def test_eval_result_dicts_are_accepted():
    data = normalise_samples([BASE[0].to_dict()])
    assert data.results[0].speedup == pytest.approx(1.4)


def test_unknown_sample_type_raises():
    with pytest.raises(ValueError, match="EvalResult"):
        normalise_samples([42])


@pytest.mark.gpu
def test_report_from_real_gpu_evaluations(tmp_path):
    """The report shows measured numbers (speedups, device) from honest fixture kernels."""
    from pathlib import Path

    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.rewards import RewardConfig, compute_reward
    from multiminddev.tasks.problem import load_problem

    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    pairs = [("1_relu", "relu_basic"), ("3_softmax", "softmax_warp"), ("2_sum_dim", "sum_dim_shared")]
    with Evaluator(EvalConfig(num_workers=1)) as ev:
        results = ev.evaluate_many([(load_problem(fixtures / "problems" / f"{p}.py"),
                                     (fixtures / "honest" / f"{c}.py").read_text()) for p, c in pairs])
    assert all(r.status is EvalStatus.OK for r in results), [r.message for r in results]
    # the gated reward's gate opens on a measured, correct kernel
    assert all(compute_reward(r, RewardConfig()).components.get("pass_rate") == 0.5 for r in results)
    path = write_report(tmp_path, bench_runs={"honest fixtures": results})
    summary = json.loads((tmp_path / "summary.json").read_text())["labels"]["honest fixtures"]
    assert summary["correct_rate"] == 1.0
    assert summary["geomean_speedup_vs_eager"] > 0
    assert summary["devices"] and "cpu" not in summary["devices"][0].lower()
    assert summary["devices"][0] in path.read_text()


def test_mean_episode_reward_is_best_agent_turn_reward():
    from multiminddev.report.html import summarize_label

    eps = [{"problem": {"name": "p", "tier": 0},
            "turns": [{"role": "generator", "reward": 0.1, "eval_result": None},
                      {"role": "optimizer", "reward": 0.7, "eval_result": None}]},
           {"problem": {"name": "p", "tier": 0},
            "turns": [{"role": "generator", "reward": -0.1, "eval_result": None}]}]
    summary = summarize_label(normalise_samples(eps))
    assert summary["reward_mean"] == pytest.approx((0.7 - 0.1) / 2)
    assert summary["ci95"]["reward_mean"] == pytest.approx([-0.1, 0.7])


def test_tiers_from_episodes_apply_to_eval_result_labels(report):
    path, _ = report
    base = json.loads((path.parent / "summary.json").read_text())["labels"]["base"]
    assert base["per_tier"]["0"]["n"] == 2  # relu (tier 0 in the other label's episodes)


def test_a_compile_only_run_says_not_measured_instead_of_zero(tmp_path):
    """Without a GPU nothing ran: correctness is unknown, so the page says "not measured" and
    summary.json holds null, never a 0% that reads as "every kernel wrong"."""
    from multiminddev.report.metrics import NOT_MEASURED

    results = [real_result("relu", EvalStatus.NO_GPU), real_result("gelu", EvalStatus.NO_GPU)]
    path = write_report(tmp_path, bench_runs={"cpu": results}, tiers={"relu": 0, "gelu": 0})
    page = path.read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())["labels"]["cpu"]
    assert summary["correct_rate"] is None and summary["fast_p"]["1"] is None
    assert summary["ci95"]["correct_rate"] is None and summary["pass_at_k"] == {}
    for row in ("correct (fast_0)", "fast_1", "fast_2"):
        assert f"<td>{row}</td><td>{NOT_MEASURED}</td>" in page, row
