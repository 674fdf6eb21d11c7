"""EvalResult's JSON form: results of every status come back equal, enums by field."""

import json

from multiminddev.env.results import (
    EvalResult,
    EvalStatus,
    Finding,
    RejectReason,
    StageStatus,
    StaticCheckResult,
    TrialMismatch,
    VerifyResult,
)


def _round_trip(result: EvalResult) -> EvalResult:
    return EvalResult.from_dict(json.loads(result.to_json()))


def test_incorrect_result_with_a_mismatch_reason_round_trips():
    # TrialMismatch.reason is a plain string; it was once parsed as a RejectReason, so every
    # incorrect result in an episode file failed to load
    result = EvalResult(status=EvalStatus.INCORRECT, problem="elu_4096x4096", verify=VerifyResult(
        status=StageStatus.FAILED, trials_run=3, mismatches=[
            TrialMismatch(trial=0, output_index=0, reason="allclose", max_abs_error=0.5)]))
    back = _round_trip(result)
    assert back == result
    assert back.verify.mismatches[0].reason == "allclose"


def test_rejected_result_keeps_its_reasons_as_enums():
    result = EvalResult(status=EvalStatus.REJECTED, problem="p", reject_reason=RejectReason.SYNTAX,
                        static=StaticCheckResult(status=StageStatus.FAILED, findings=[
                            Finding(rule="r", reason=RejectReason.SYNTAX, message="m")]))
    back = _round_trip(result)
    assert back == result
    assert back.reject_reason is RejectReason.SYNTAX
    assert back.static.findings[0].reason is RejectReason.SYNTAX
