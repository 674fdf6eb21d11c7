"""Reward functions against hand-computed cases, one kind or rule per test."""

from __future__ import annotations

import pytest

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
from multiminddev.rewards.functions import (
    RewardConfig,
    RewardKind,
    compute_reward,
    uses_coalesced_access,
    uses_warp_shuffle,
)

COALESCED_SHFL = r"""
extern "C" __global__ void rowsum(const float* __restrict__ x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(y, v);
}"""

STRIDED = r"""
extern "C" __global__ void copy(const float* x, float* y, int stride) {
    int t = threadIdx.x;
    y[t * stride] = x[t * stride];
}"""


def ok_result(speedup=3.0, regs=32, smem=0, frac=None, spills=0) -> EvalResult:
    kernel = KernelResources(
        name="k", registers=regs, shared_mem_bytes=smem, spill_store_bytes=spills
    )
    return EvalResult(
        status=EvalStatus.OK,
        problem="p",
        compile=CompileResult(status=StageStatus.OK, kernels=[kernel]),
        verify=VerifyResult(status=StageStatus.OK, trials_run=5, trials_passed=5),
        benchmark=BenchmarkResult(
            status=StageStatus.OK,
            candidate=TimingStats(median_ms=1.0 / speedup, runs=10),
            eager=TimingStats(median_ms=1.0, runs=10),
            speedup_vs_eager=speedup,
            fraction_of_peak=frac,
        ),
    )


def failed_result(status: EvalStatus, *, compiled: bool, timeout_stage: bool = False) -> EvalResult:
    compile_status = StageStatus.OK if compiled else StageStatus.FAILED
    verify_status = StageStatus.TIMEOUT if timeout_stage else StageStatus.SKIPPED
    return EvalResult(
        status=status,
        problem="p",
        compile=CompileResult(status=compile_status),
        verify=VerifyResult(status=verify_status),
        reject_reason=RejectReason.TORCH_COMPUTE if status is EvalStatus.REJECTED else None,
    )


GATED = RewardConfig(kind=RewardKind.GATED_SHAPED)


def test_gated_ok_with_bonuses_is_hand_computed_value():
    # 0.5*1 + 0.4*min(3/2, 2) + 0.05 shuffle + 0.05 coalesced = 0.5 + 0.6 + 0.1
    r = compute_reward(ok_result(speedup=3.0), GATED, COALESCED_SHFL)
    assert r.total == pytest.approx(1.2)
    assert r.components["warp_shuffle"] == pytest.approx(0.05)
    assert r.components["coalesced"] == pytest.approx(0.05)


def test_gated_penalises_register_pressure_and_smem_overuse():
    # 0.5 + 0.4*(1/2) - 0.05 - 0.05
    r = compute_reward(ok_result(speedup=1.0, regs=200, smem=64 * 1024), GATED)
    assert r.total == pytest.approx(0.6)
    assert r.components["reg_pressure"] == pytest.approx(-0.05)
    assert r.components["smem_over"] == pytest.approx(-0.05)


def test_gated_counts_spills_as_register_pressure():
    r = compute_reward(ok_result(speedup=1.0, regs=40, spills=16), GATED)
    assert r.components["reg_pressure"] == pytest.approx(-0.05)


def test_gated_caps_normalised_speedup():
    # speedup 100 / target 2 = 50, capped at 2 -> 0.5 + 0.8
    assert compute_reward(ok_result(speedup=100.0), GATED).total == pytest.approx(1.3)


def test_gated_compile_only_credit_on_cpu_machine():
    r = compute_reward(failed_result(EvalStatus.NO_GPU, compiled=True), GATED)
    assert r.total == pytest.approx(0.1)
    assert r.components == {"compile_credit": pytest.approx(0.1)}


def test_gated_incorrect_gets_only_compile_credit():
    res = failed_result(EvalStatus.INCORRECT, compiled=True)
    res.verify = VerifyResult(status=StageStatus.FAILED, trials_run=5, trials_passed=3)
    assert compute_reward(res, GATED).total == pytest.approx(0.1)


def test_gated_partial_trials_open_the_gate_when_asked():
    res = failed_result(EvalStatus.INCORRECT, compiled=True)
    res.verify = VerifyResult(status=StageStatus.FAILED, trials_run=4, trials_passed=3)
    cfg = RewardConfig(require_all_trials=False)
    # 0.5 * 3/4, no speedup (incorrect results have speedup 0)
    assert compute_reward(res, cfg).total == pytest.approx(0.375)


def test_compile_error_earns_zero():
    assert compute_reward(failed_result(EvalStatus.COMPILE_ERROR, compiled=False), GATED).total == 0.0


def test_timeout_after_compile_pays_penalty():
    res = failed_result(EvalStatus.TIMEOUT, compiled=True, timeout_stage=True)
    r = compute_reward(res, GATED)
    assert r.components == {"compile_credit": pytest.approx(0.1), "timeout": pytest.approx(-0.1)}
    assert r.total == pytest.approx(0.0)


def test_runtime_error_penalty_is_explicit():
    res = failed_result(EvalStatus.RUNTIME_ERROR, compiled=True)
    r = compute_reward(res, RewardConfig(runtime_error_penalty=0.2))
    assert r.total == pytest.approx(0.1 - 0.2)


@pytest.mark.parametrize("kind", list(RewardKind))
def test_rejected_gets_negative_penalty_for_every_kind(kind):
    res = failed_result(EvalStatus.REJECTED, compiled=True)
    r = compute_reward(res, RewardConfig(kind=kind, rejected_reward=-0.7))
    assert r.total == pytest.approx(-0.7)
    assert r.components == {"rejected": pytest.approx(-0.7)}


@pytest.mark.parametrize("kind", list(RewardKind))
def test_format_failure_value_for_every_kind(kind):
    r = compute_reward(None, RewardConfig(kind=kind, format_failure_reward=-0.25))
    assert r.total == pytest.approx(-0.25)


def test_infra_error_is_neutral_and_flagged():
    res = failed_result(EvalStatus.INFRA_ERROR, compiled=False)
    r = compute_reward(res, GATED)
    assert r.total == 0.0 and "infra_error" in r.components


def test_weighted_hand_computed_value():
    # 0.4*min(3/2, 2) + 0.3*1 + 0.2*(0.5 * min(1, 128/64)) + 0.1*1 = 0.6 + 0.3 + 0.1 + 0.1
    r = compute_reward(ok_result(speedup=3.0, regs=64, frac=0.5), RewardConfig(kind=RewardKind.WEIGHTED))
    assert r.total == pytest.approx(1.1)


def test_weighted_uses_intended_weights_not_seed_precedence_bug():
    # Written inline as `1.0 if ok else 0.0 * 0.3`, a correct kernel's term would be 1.0.
    r = compute_reward(ok_result(speedup=2.0), RewardConfig(kind=RewardKind.WEIGHTED))
    assert r.components["correct"] == pytest.approx(0.3)
    assert r.components["compiles"] == pytest.approx(0.1)


def test_weighted_register_efficiency_scales_with_registers():
    # regs 256 -> 128/256 = 0.5; unknown fraction_of_peak -> memory efficiency 1
    r = compute_reward(ok_result(speedup=2.0, regs=256), RewardConfig(kind=RewardKind.WEIGHTED))
    assert r.components["efficiency"] == pytest.approx(0.2 * 0.5)


def test_weighted_incorrect_compiled_gets_compile_term_only():
    res = failed_result(EvalStatus.INCORRECT, compiled=True)
    assert compute_reward(res, RewardConfig(kind=RewardKind.WEIGHTED)).total == pytest.approx(0.1)


def test_roofline_uses_fraction_of_peak_when_correct():
    # 0.3 + 0.6*0.8 + 0.1
    r = compute_reward(ok_result(frac=0.8), RewardConfig(kind=RewardKind.ROOFLINE))
    assert r.total == pytest.approx(0.88)


def test_roofline_falls_back_to_speedup_without_bytes_moved():
    # speedup 3 -> norm 1.5, scaled by cap 2 -> 0.75; 0.3 + 0.6*0.75 + 0.1
    r = compute_reward(ok_result(speedup=3.0, frac=None), RewardConfig(kind=RewardKind.ROOFLINE))
    assert r.total == pytest.approx(0.85)
    assert "roofline_speedup_fallback" in r.components


def test_kevin_is_correct_plus_speedup():
    r = compute_reward(ok_result(speedup=1.5), RewardConfig(kind=RewardKind.KEVIN))
    assert r.total == pytest.approx(0.3 + 1.5)


def test_kevin_caps_raw_speedup():
    r = compute_reward(ok_result(speedup=50.0), RewardConfig(kind=RewardKind.KEVIN, max_raw_speedup=10))
    assert r.total == pytest.approx(10.3)


def test_kevin_incorrect_gets_compile_credit_only():
    res = failed_result(EvalStatus.INCORRECT, compiled=True)
    assert compute_reward(res, RewardConfig(kind=RewardKind.KEVIN)).total == pytest.approx(0.1)


def test_components_sum_to_total():
    r = compute_reward(ok_result(speedup=1.7, regs=300, smem=50_000), GATED, STRIDED)
    assert sum(r.components.values()) == pytest.approx(r.total)


def test_weight_override_changes_term():
    cfg = RewardConfig(kind=RewardKind.KEVIN, weights={"correct": 1.0})
    assert compute_reward(ok_result(speedup=1.0), cfg).total == pytest.approx(2.0)


def test_config_rejects_unknown_weight_with_fix():
    with pytest.raises(ValueError, match="terms are"):
        RewardConfig(kind=RewardKind.KEVIN, weights={"efficiency": 1.0})


def test_config_rejects_positive_hack_reward():
    with pytest.raises(ValueError, match="reward hack"):
        RewardConfig(rejected_reward=0.5)


def test_config_accepts_kind_by_name():
    assert RewardConfig(kind="kevin").kind is RewardKind.KEVIN


def test_config_round_trips_through_dict():
    cfg = RewardConfig(kind=RewardKind.WEIGHTED, weights={"speedup": 0.5}, compile_credit=0.2)
    assert RewardConfig.from_dict(cfg.to_dict()) == cfg


def test_warp_shuffle_detection():
    assert uses_warp_shuffle(COALESCED_SHFL)
    assert not uses_warp_shuffle(STRIDED)


def test_coalesced_detection_on_thread_indexed_access():
    assert uses_coalesced_access(COALESCED_SHFL)


def test_strided_access_is_not_coalesced():
    assert not uses_coalesced_access(STRIDED)


def test_access_without_thread_index_is_not_coalesced():
    assert not uses_coalesced_access("__global__ void k(float* y) { y[blockIdx.x] = 1.f; }")


def test_compound_assignment_is_not_a_lane_definition():
    src = "__global__ void k(float* y, int s) { int i = 0; i += threadIdx.x * s; y[i] = 0; }"
    assert not uses_coalesced_access(src)


def test_one_thread_per_row_pointer_offset_is_not_coalesced():
    src = r"""
    __global__ void row_sum(const float* x, float* y, int rows, int cols) {
        int r = blockIdx.x * blockDim.x + threadIdx.x;
        const float* row = x + (long)r * cols;
        float acc = 0.f;
        for (int c = 0; c < cols; ++c) acc += row[c];
        y[r] = acc;
    }"""
    assert not uses_coalesced_access(src)


def test_warp_lane_modulo_indexing_is_coalesced():
    src = r"""
    __global__ void k(const float* x, float* y, int rows, int cols) {
        int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
        int lane = threadIdx.x % 32;
        const float* row = x + (long)warp * cols;
        for (int c = lane; c < cols; c += 32) y[c] = row[c];
    }"""
    assert uses_coalesced_access(src)


def test_cooperative_groups_and_warp_reduce_count_as_shuffles():
    assert uses_warp_shuffle("v = tile.shfl_down(v, 16);")
    assert uses_warp_shuffle("int s = __reduce_add_sync(0xffffffff, v);")
    assert not uses_warp_shuffle("// no __shfl here, only a word: shuffle(")


def test_commented_out_shuffle_earns_nothing():
    assert not uses_warp_shuffle("// TODO: v += __shfl_down_sync(0xffffffff, v, 16);\n/* __shfl_xor_sync( */")


@pytest.mark.parametrize("kind", list(RewardKind))
def test_a_repeated_kernel_loses_exactly_the_repeat_penalty(kind):
    plain = RewardConfig(kind=kind)
    penalised = RewardConfig(kind=kind, repeat_penalty=0.2)
    for result in (ok_result(speedup=1.5), failed_result(EvalStatus.INCORRECT, compiled=True),
                   failed_result(EvalStatus.COMPILE_ERROR, compiled=False), None):
        base = compute_reward(result, plain, COALESCED_SHFL)
        assert compute_reward(result, plain, COALESCED_SHFL, repeated=True) == base  # off
        assert compute_reward(result, penalised, COALESCED_SHFL) == base  # not a repeat
        again = compute_reward(result, penalised, COALESCED_SHFL, repeated=True)
        assert again.total == pytest.approx(base.total - 0.2)
        assert again.components == {**base.components, "repeat": -0.2}


def test_repeat_penalty_is_a_magnitude():
    with pytest.raises(ValueError, match="repeat_penalty"):
        RewardConfig(repeat_penalty=-0.1)
