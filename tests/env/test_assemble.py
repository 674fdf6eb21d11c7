"""assemble_result: worker reports (real JobOutcome data) -> status, message, precedence."""

from __future__ import annotations

import torch

from multiminddev.env.assemble import assemble_result
from multiminddev.env.candidate import pack_tensor
from multiminddev.env.config import EvalConfig
from multiminddev.env.pool import JobOutcome
from multiminddev.env.results import EvalStatus, RejectReason, StageStatus, StaticCheckResult
from tests.env._fixtures import problem_named

CFG = EvalConfig(benchmark=False)
STATIC = StaticCheckResult(status=StageStatus.OK)
COMPILED = {"result": {"status": "ok", "backend": "nvrtc", "arch": "sm_90", "kernels": [{"name": "k"}]}}


def _outputs(values):
    return {"outputs": [[pack_tensor(torch.tensor(v, dtype=torch.float32))] for v in values]}


def _assemble(outcome):
    return assemble_result(problem_named("1_relu"), "src", STATIC, outcome, CFG)


# ---------------------------------------------------------------- decisions made in the parent

PARENT_CFG = EvalConfig()  # benchmark and defenses on
RELU_BYTES = problem_named("1_relu").bytes_moved  # 128 MiB: 0.0447 ms at 3000 GB/s


def _timed(median_ms, *, peak_gbps=3000.0, coverage=0.95, late=()):
    stats = {"median_ms": median_ms, "runs": 10}
    out = JobOutcome(messages={
        "reference": _outputs([[1.0, 2.0]]), "compile": COMPILED, "outputs": _outputs([[1.0, 2.0]]),
        "baseline": {"eager": {"median_ms": 0.1, "runs": 10}, "compiled": None,
                     "peak_gbps": peak_gbps, "gpu_name": "H100", "torch_version": "2.11"},
        "guards": {"coverage": coverage, "notes": []}, "benchmark": {"candidate": stats},
        "done": {}}, late_trusted=list(late))
    return assemble_result(problem_named("1_relu"), "src", STATIC, out, PARENT_CFG)


def test_a_plausible_time_with_own_kernels_is_ok():
    result = _timed(0.06)
    assert result.status is EvalStatus.OK, result.message
    assert result.benchmark.custom_kernel_time_fraction == 0.95


def test_faster_than_the_roofline_is_rejected_by_the_parent():
    result = _timed(0.01)
    assert result.status is EvalStatus.REJECTED
    assert result.reject_reason is RejectReason.IMPOSSIBLE_SPEED
    assert result.message.startswith("rejected: runtime check impossible_speed: median 0.0100 ms")
    assert result.benchmark.status is StageStatus.FAILED


def test_the_roofline_uses_the_peak_of_the_trusted_baseline_message():
    assert _timed(0.01, peak_gbps=1e9).status is EvalStatus.OK  # a huge peak: no floor to break
    assert _timed(0.01, peak_gbps=None).status is EvalStatus.OK  # no peak known: no decision


def test_low_reported_coverage_is_rejected_by_the_parent():
    result = _timed(0.06, coverage=0.2)
    assert result.status is EvalStatus.REJECTED
    assert result.reject_reason is RejectReason.LOW_KERNEL_COVERAGE
    assert "runtime check kernel_time_coverage: the candidate's own kernels account for 20%" \
        in result.message


def test_coverage_threshold_is_the_parents_config():
    lenient = EvalConfig(min_kernel_coverage=0.1)
    out = _timed(0.06, coverage=0.2)
    assert out.status is EvalStatus.REJECTED
    stats = {"median_ms": 0.06, "runs": 10}
    outcome = JobOutcome(messages={
        "reference": _outputs([[1.0]]), "compile": COMPILED, "outputs": _outputs([[1.0]]),
        "guards": {"coverage": 0.2}, "benchmark": {"candidate": stats}, "done": {}})
    assert assemble_result(problem_named("1_relu"), "src", STATIC, outcome,
                           lenient).status is EvalStatus.OK


def test_a_coverage_that_is_not_a_fraction_is_not_used():
    for junk in ("1.0", True, 7.0, float("nan"), None):
        result = _timed(0.06, coverage=junk)
        assert result.status is EvalStatus.OK and result.benchmark.custom_kernel_time_fraction is None


def test_wrong_outputs_read_as_incorrect_before_low_coverage():
    stats = {"median_ms": 0.06, "runs": 10}
    out = JobOutcome(messages={
        "reference": _outputs([[1.0]]), "compile": COMPILED, "outputs": _outputs([[5.0]]),
        "guards": {"coverage": 0.0}, "benchmark": {"candidate": stats}, "done": {}})
    assert assemble_result(problem_named("1_relu"), "src", STATIC, out,
                           PARENT_CFG).status is EvalStatus.INCORRECT


def test_parent_decisions_are_off_without_defenses():
    stats = {"median_ms": 0.001, "runs": 10}
    out = JobOutcome(messages={
        "reference": _outputs([[1.0]]), "compile": COMPILED, "outputs": _outputs([[1.0]]),
        "baseline": {"eager": {"median_ms": 0.1}, "peak_gbps": 3000.0},
        "guards": {"coverage": 0.0}, "benchmark": {"candidate": stats}, "done": {}})
    result = assemble_result(problem_named("1_relu"), "src", STATIC, out,
                             EvalConfig(defenses=False))
    assert result.status is EvalStatus.OK


def test_a_trusted_message_sent_after_the_candidate_loaded_is_a_forgery():
    result = _timed(0.06, late=["baseline"])
    assert result.status is EvalStatus.REJECTED
    assert result.reject_reason is RejectReason.MONKEY_PATCH and "baseline" in result.message


def test_a_frame_outside_the_protocol_rejects_only_after_the_candidate_loaded():
    after = assemble_result(problem_named("1_relu"), "src", STATIC, JobOutcome(
        messages={"compile": COMPILED}, refused_message="run: undecodable frame",
        refused_after_load=True), PARENT_CFG)
    assert after.status is EvalStatus.REJECTED
    assert after.reject_reason is RejectReason.SANDBOX_VIOLATION and "own frame" in after.message
    before = assemble_result(problem_named("1_relu"), "src", STATIC, JobOutcome(
        refused_message="setup: undecodable frame"), PARENT_CFG)
    assert before.status is EvalStatus.INFRA_ERROR and before.reject_reason is None


def test_matching_outputs_are_ok():
    out = JobOutcome(messages={"reference": _outputs([[1.0, 2.0]] * 5), "compile": COMPILED,
                               "outputs": _outputs([[1.0, 2.0]] * 5), "done": {}})
    result = _assemble(out)
    assert result.status is EvalStatus.OK and result.message.startswith("correct on 5/5")


def test_wrong_outputs_are_incorrect_with_a_summary():
    out = JobOutcome(messages={"reference": _outputs([[1.0, 2.0]]), "compile": COMPILED,
                               "outputs": _outputs([[1.0, 3.0]]), "done": {}})
    result = _assemble(out)
    assert result.status is EvalStatus.INCORRECT and "index [1]" in result.message


def test_per_trial_guard_rejection_beats_incorrect():
    fail = {"kind": "rejected", "stage": "run", "reason": "torch_compute", "message": "aten.relu"}
    out = JobOutcome(messages={"reference": _outputs([[1.0]]), "compile": COMPILED,
                               "outputs": _outputs([[5.0]])}, failure=fail)
    result = _assemble(out)
    assert result.status is EvalStatus.REJECTED
    assert result.reject_reason is RejectReason.TORCH_COMPUTE


def test_late_stale_output_finding_on_wrong_outputs_reads_as_incorrect():
    fail = {"kind": "rejected", "stage": "guards", "reason": "stale_output", "message": "same"}
    out = JobOutcome(messages={"reference": _outputs([[1.0]]), "compile": COMPILED,
                               "outputs": _outputs([[5.0]])}, failure=fail)
    assert _assemble(out).status is EvalStatus.INCORRECT


def test_death_names_the_signal_and_marks_the_stage():
    out = JobOutcome(messages={"reference": _outputs([[1.0]]), "compile": COMPILED},
                     died_in_stage="run", exitcode=-11, worker_restarted=True)
    result = _assemble(out)
    assert result.status is EvalStatus.RUNTIME_ERROR and "SIGSEGV" in result.message
    assert result.verify.status is StageStatus.FAILED and result.worker_restarted


def test_timeout_in_reference_setup_is_infrastructure():
    result = _assemble(JobOutcome(messages={}, timed_out_stage="setup", infra_error=""))
    assert result.status is EvalStatus.INFRA_ERROR and "setup_timeout_s" in result.message


def test_timeout_message_points_at_the_candidate_line():
    stack = ('Thread 0x1 (most recent call first):\n'
             '  File "/tmp/mmd-worker-x/mmd_candidate_ab_1.py", line 17 in forward\n'
             '  File "/work/src/multiminddev/env/stages.py", line 80 in _correctness_trials\n')
    out = JobOutcome(messages={"reference": _outputs([[1.0]]), "compile": COMPILED},
                     timed_out_stage="run", hang_stack=stack)
    result = _assemble(out)
    assert result.status is EvalStatus.TIMEOUT and "candidate line 17 (forward)" in result.message


def test_timings_join_parent_stages_worker_steps_and_verify():
    out = JobOutcome(messages={"reference": _outputs([[1.0, 2.0]]), "compile": COMPILED,
                               "outputs": _outputs([[1.0, 2.0]]), "done": {},
                               "timings": {"run.forward": 0.25, "run.poison": 0.5,
                                           "bogus": "not a number", 7: 1.0}},
                     stages_seconds={"run": 1.5, "compile": 0.03})
    result = _assemble(out)
    assert result.timings["stage.run"] == 1.5 and result.timings["stage.compile"] == 0.03
    assert result.timings["worker.run.forward"] == 0.25
    assert result.timings["worker.run.poison"] == 0.5
    assert "worker.bogus" not in result.timings and len(
        [k for k in result.timings if k.startswith("worker.")]) == 2
    assert result.timings["parent.verify"] >= 0.0
    assert type(result).from_dict(result.to_dict()).timings == result.timings


BENCH_CFG = EvalConfig(benchmark=True)
BASELINE = {"eager": {"median_ms": 2.0, "runs": 10}, "compiled": None, "peak_gbps": None}


def _timed_outcome(expected, returned, runs=50):
    messages = {"reference": _outputs([[1.0, 2.0]] * 2), "compile": COMPILED,
                "outputs": _outputs([[1.0, 2.0]] * 2), "baseline": BASELINE,
                "benchmark": {"candidate": {"median_ms": 1.0, "runs": runs}},
                "timed_reference": _outputs(expected), "done": {}}
    if returned is not None:
        messages["timed_outputs"] = _outputs(returned)
    return JobOutcome(messages=messages)


def _assemble_timed(outcome):
    return assemble_result(problem_named("1_relu"), "src", STATIC, outcome, BENCH_CFG)


def test_correct_checked_timed_calls_are_ok_and_counted():
    result = _assemble_timed(_timed_outcome([[3.0], [4.0]], [[3.0], [4.0]]))
    assert result.status is EvalStatus.OK
    assert (result.verify.timed_checks_run, result.verify.timed_checks_passed) == (2, 2)


def test_a_wrong_checked_timed_call_makes_the_candidate_incorrect():
    # Right on every correctness trial, wrong on a timed call: the signature of a cache or of
    # skipping work while timed.
    result = _assemble_timed(_timed_outcome([[3.0], [4.0]], [[3.0], [3.0]]))
    assert result.status is EvalStatus.INCORRECT
    assert "timed call" in result.message and "timed check 1" in result.message


def test_missing_checked_timed_calls_make_the_candidate_incorrect():
    result = _assemble_timed(_timed_outcome([[3.0], [4.0]], None))
    assert result.status is EvalStatus.INCORRECT and "2 checked timed calls" in result.message


def test_fewer_timed_calls_than_checks_need_only_that_many_back():
    result = _assemble_timed(_timed_outcome([[3.0], [4.0]], [[3.0]], runs=1))
    assert result.status is EvalStatus.OK and result.verify.timed_checks_run == 1


def _layout(stride):
    return {"shape": [4, 4], "stride": list(stride), "dense": stride != [0, 1]}


def test_an_expanded_output_is_incorrect_even_when_its_values_match():
    values = [[1.0] * 16]
    out = JobOutcome(messages={
        "reference": _outputs(values), "compile": COMPILED, "outputs": _outputs(values),
        "reference_layouts": {"layouts": [_layout([4, 1])]},
        "output_layouts": {"layouts": [[_layout([0, 1])]]}, "done": {}})
    result = _assemble(out)
    assert result.status is EvalStatus.INCORRECT and "stride 0" in result.message


def test_reduced_precision_within_tolerance_is_incorrect_against_the_float64_truth():
    truth = torch.linspace(-1, 1, 4096, dtype=torch.float64) / 3
    eager = truth.float()
    reduced = truth.half().float()  # within atol/rtol 1e-2, ~1000x eager's own error
    out = JobOutcome(messages={
        "reference": {"outputs": [[pack_tensor(eager)]]}, "compile": COMPILED,
        "outputs": {"outputs": [[pack_tensor(reduced)]]},
        "ground_truth": {"outputs": [[pack_tensor(truth)]]}, "done": {}})
    result = _assemble(out)
    assert result.status is EvalStatus.INCORRECT and "precision" in result.message


def test_reported_gpu_time_beyond_the_stage_wall_clock_is_tampering():
    from multiminddev.env.assemble import check_timing_within_wall_clock
    from multiminddev.env.results import TimingStats

    stats = TimingStats(median_ms=10.0, mean_ms=10.0, runs=300)  # 3 s of timed calls
    assert check_timing_within_wall_clock(stats, 3.5) == []
    (finding,) = check_timing_within_wall_clock(stats, 1.0)
    assert finding.reason is RejectReason.MONKEY_PATCH
    assert check_timing_within_wall_clock(stats, None) == []  # the stage time is unknown


# ------------------------------------ every rule on every verified output (trials, checked calls)


def _tf32(x):
    bits = x.contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def _draw(seed, n=4096):
    """A float64 truth and eager's float32 output of it: well within atol/rtol = 1e-3."""
    truth = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return truth, truth.float()


def _packed(tensors):
    return {"outputs": [[pack_tensor(t)] for t in tensors]}


def _dense(n=4096):
    return {"shape": [n], "stride": [1], "dense": True}


def _rules_outcome(trial_outputs, checked_outputs, *, checked_layouts=None, runs=50,
                   timed_layouts=None):
    """Five trials and two checked calls of a float32 problem (eager = the float32 rounding of
    a float64 truth), trial 0's truth sent; the candidate's outputs as given."""
    trials = [_draw(seed) for seed in range(5)]
    checks = [_draw(seed) for seed in (10, 11)]
    layouts = [[_dense()] for _ in checks] if checked_layouts is None else checked_layouts
    return JobOutcome(messages={
        "reference": _packed([eager for _, eager in trials]), "compile": COMPILED,
        "ground_truth": _packed([trials[0][0]]),
        "reference_layouts": {"layouts": [_dense()]},
        "outputs": _packed(trial_outputs(trials)),
        "output_layouts": {"layouts": [[_dense()] for _ in trials]},
        "baseline": BASELINE,
        "benchmark": {"candidate": {"median_ms": 1.0, "runs": runs},
                      "checked_layouts": layouts,
                      "timed_layouts": [[_dense()]] if timed_layouts is None else timed_layouts},
        "timed_reference": _packed([eager for _, eager in checks]),
        "timed_outputs": _packed(checked_outputs(checks)), "done": {}})


def _assemble_rules(outcome):
    """Judged as the 1024 x 1024 float32 matmul (atol = rtol = 1e-3: TF32 passes them)."""
    return assemble_result(problem_named("4_matmul"), "src", STATIC, outcome, BENCH_CFG)


def _exact(draws):
    return [eager for _, eager in draws]


def test_exact_trials_and_checked_calls_are_ok_with_the_escape_probability_reported():
    from multiminddev.env.timed_checks import escape_probability

    result = _assemble_rules(_rules_outcome(_exact, _exact))
    assert result.status is EvalStatus.OK, result.message
    assert result.verify.timed_check_escape == escape_probability(50, 2, 0.25)


def test_tf32_after_an_exact_first_trial_is_incorrect():
    def exact_then_tf32(draws):
        return [eager if i == 0 else _tf32(eager) for i, (_, eager) in enumerate(draws)]

    result = _assemble_rules(_rules_outcome(exact_then_tf32, _exact))
    assert result.status is EvalStatus.INCORRECT
    assert "trial 1" in result.message and "reduced precision" in result.message


def test_tf32_on_a_checked_timed_call_is_incorrect():
    def tf32(draws):
        return [_tf32(eager) for _, eager in draws]

    result = _assemble_rules(_rules_outcome(_exact, tf32))
    assert result.status is EvalStatus.INCORRECT
    assert "timed check 0" in result.message and "reduced precision" in result.message


def test_a_stride_0_checked_timed_call_is_incorrect_though_its_values_match():
    expanded = {"shape": [4096], "stride": [0], "dense": False}
    result = _assemble_rules(_rules_outcome(_exact, _exact,
                                            checked_layouts=[[_dense()], [expanded]]))
    assert result.status is EvalStatus.INCORRECT
    assert "timed check 1" in result.message and "stride 0" in result.message


def test_a_gapped_output_on_an_unchecked_timed_call_is_incorrect():
    """Layouts are metadata: the density rule covers every timed call, checked or not (an
    every-other-column view from some call on)."""
    gapped = {"shape": [64, 64], "stride": [128, 2], "dense": False}
    result = _assemble_rules(_rules_outcome(_exact, _exact,
                                            timed_layouts=[[_dense()], [gapped]]))
    assert result.status is EvalStatus.INCORRECT
    assert "timed call" in result.message and "dense" in result.message


def test_timed_calls_without_their_layouts_are_incorrect():
    result = _assemble_rules(_rules_outcome(_exact, _exact, timed_layouts=[]))
    assert result.status is EvalStatus.INCORRECT and "no layout of theirs" in result.message


def test_checked_timed_calls_without_their_layouts_are_incorrect():
    result = _assemble_rules(_rules_outcome(_exact, _exact, checked_layouts=[]))
    assert result.status is EvalStatus.INCORRECT and "layouts of 0 came back" in result.message


def test_a_few_ulps_off_on_later_trials_and_checked_calls_stay_ok():
    def few_ulps(draws):  # an honest kernel summing in another order: 2 ulps here and there
        return [(eager.view(torch.int32) + torch.randint(-2, 3, eager.shape, dtype=torch.int32,
                 generator=torch.Generator().manual_seed(7))).view(torch.float32)
                for _, eager in draws]

    result = _assemble_rules(_rules_outcome(few_ulps, few_ulps))
    assert result.status is EvalStatus.OK, result.message
