"""The rollout analysis's pure parts, on episodes in episode.write_episodes_jsonl's fields."""

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def analyze():
    return load_script("analyze_rollouts")


def _episode(problem, group, kernel, status, advantage):
    source = None if kernel is None else f'extern "C" __global__ void {kernel}(float* x) {{}}'
    return {"problem": {"name": problem}, "group": group,
            "turns": [{"candidate_source": source, "reward_breakdown": {"advantage": advantage},
                       "eval_result": None if status is None else {"status": status}}]}


def test_template_credit_sums_generator_advantages_per_kernel(analyze):
    episodes = [_episode("elu", 0, "unary_naive", "ok", 0.5),
                _episode("elu", 0, "row_reduce_naive", "incorrect", -0.5),
                _episode("sum_dim", 1, "row_reduce_naive", "ok", 1.0),
                _episode("sum_dim", 1, None, None, -1.0)]
    assert analyze.template_credit(episodes) == {
        "row_reduce_naive": (2, 0.5), "unary_naive": (1, 0.5), "no_reply": (1, -1.0)}
    assert analyze.kernel_template("int main() {}") == "no_kernel"


def test_seen_versus_new_splits_prompts_by_sft_data(analyze):
    episodes = [_episode("elu_a", 0, "k", "ok", 0), _episode("elu_a", 0, "k", "incorrect", 0),
                _episode("elu_b", 1, "k", "ok", 0), _episode("elu_b", 1, "k", "ok", 0)]
    out = analyze.seen_versus_new(episodes, {"elu_a"})
    assert out["sft_prompts"] == {"episodes": 2, "correct": 0.5, "groups": 1, "mixed_groups": 1.0}
    assert out["new_prompts"] == {"episodes": 2, "correct": 1.0, "groups": 1, "mixed_groups": 0.0}


def _turns(*outcomes):
    """(status, speedup) per turn, as episodes_<stage>.jsonl holds them."""
    return {"problem": {"name": "p"}, "turns": [
        {"eval_result": {"status": st, "benchmark": {"speedup_vs_eager": sp}}}
        for st, sp in outcomes]}


def test_optimizer_effect_counts_what_the_second_turn_did(analyze):
    episodes = [_turns(("incorrect", 0.0), ("ok", 0.9)), _turns(("ok", 0.9), ("compile_error", 0.0)),
                _turns(("ok", 0.61), ("ok", 0.97)), _turns(("ok", 0.97), ("ok", 0.6)),
                _turns(("ok", 0.96), ("ok", 0.97)), _turns(("incorrect", 0.0), ("incorrect", 0.0)),
                _turns(("ok", 0.5))]
    assert analyze.optimizer_effect(episodes) == {
        "fixed": 1, "broke": 1, "faster": 1, "slower": 1, "kept": 1, "still_failing": 1}


def test_optimizer_status_by_step_splits_at_the_cumulative_episode_counts(analyze):
    episodes = [_turns(("ok", 0.5), ("ok", 0.9)), _turns(("ok", 0.5), ("compile_error", 0.0)),
                _turns(("incorrect", 0.0)), _turns(("ok", 0.5), ("compile_error", 0.0))]
    steps = analyze.optimizer_status_by_step(episodes, [2, 4])
    assert steps[0] == {"ok": 1, "compile_error": 1}
    assert steps[1] == {"none": 1, "compile_error": 1}


def test_optimizer_speed_by_step_counts_faster_rewrites_and_those_that_beat_pytorch(analyze):
    episodes = [_turns(("ok", 0.13), ("ok", 3.2)), _turns(("ok", 0.13), ("incorrect", 0.0)),
                _turns(("ok", 0.5), ("ok", 0.9)), _turns(("incorrect", 0.0)),
                _turns(("ok", 0.99), ("ok", 1.01))]
    assert analyze.optimizer_speed_by_step(episodes, [2, 4, 5]) == [
        (1, 1, 2), (1, 0, 1), (0, 1, 1)]  # 0.99 -> 1.01 is within optimizer_effect's margin


def _held(name, prompt, source, status="ok", speedup=1.0):
    return {"problem": {"name": name}, "turns": [
        {"prompt_ids": prompt, "candidate_source": source,
         "eval_result": {"status": status, "benchmark": {"speedup_vs_eager": speedup}}}]}


def test_changed_first_replies_compares_kernels_for_the_same_prompt(analyze):
    before = [_held("a", [1], "k1"), _held("b", [1], "k2"), _held("c", [1], "k3")]
    after = [_held("a", [1], "k1"), _held("b", [1], "k2 changed"), _held("c", [2], "k4")]
    assert analyze.changed_first_replies(before, after) == ["b"]  # c's prompt differs


def test_reward_delta_split_separates_changed_generator_replies(analyze):
    before = [_held("a", [1], "k1"), _held("b", [1], "k2"), _held("c", [1], "k3")]
    after = [_held("a", [1], "k1"), _held("b", [1], "k2 changed"), _held("c", [1], "k3")]
    split = analyze.reward_delta_split(before, after, {"a": 0.5, "b": 0.7, "c": 0.1},
                                       {"a": 0.6, "b": 0.1, "c": 0.1})
    assert split["generator_changed"] == pytest.approx(-0.6 / 3)
    assert split["rest"] == pytest.approx(0.1 / 3)
    assert split["total"] == pytest.approx(-0.5 / 3)


def test_timing_agreement_pairs_only_the_same_correct_kernel(analyze):
    before = [_held("a", [1], "k1", speedup=0.5), _held("b", [1], "k2", speedup=1.0),
              _held("c", [1], "k3", speedup=1.0)]
    after = [_held("a", [1], "k1", speedup=0.4), _held("b", [1], "k2 new", speedup=2.0),
             _held("c", [1], "k3", status="incorrect", speedup=0.0)]
    assert analyze.timing_agreement(before, after) == [0.8]


def _rollout(name, group, status, credited, advantage):
    return {"problem": {"name": name}, "group": group, "turns": [
        {"eval_result": {"status": status},
         "reward_breakdown": {"credited": credited, "advantage": advantage}}]}


def test_tied_groups_finds_all_correct_groups_with_noise_sized_differences(analyze):
    episodes = [_rollout("a", 0, "ok", 0.670, 0.85), _rollout("a", 0, "ok", 0.669, -1.04),
                _rollout("b", 0, "ok", 0.7, 0.9), _rollout("b", 0, "ok", 0.4, -0.9),
                _rollout("c", 0, "ok", 0.6, 0.5), _rollout("c", 0, "incorrect", 0.6, -0.5)]
    assert analyze.tied_groups(episodes) == {"groups": 3.0, "tied": 1.0, "max_abs_advantage": 1.04}


def test_broken_rewrites_report_the_first_line_the_reference_lacks(analyze):
    def episode(name, statuses, reply):
        return {"problem": {"name": name},
                "turns": [{"eval_result": {"status": s}, "text": reply} for s in statuses]}

    reference = "import torch\n#define FULL_MASK 0xffffffffu\n// One warp per row.\nx = 1\n"
    episodes = [
        episode("cumsum", ["ok", "syntax_error"],
                "```python\nimport torch\n#define FULL_MASK 0xffffffffu\n// One warp per row: 32-wide chunks\n"),
        episode("cumsum", ["ok", "incorrect"], "import torch\nx = 2\n"),
        episode("cumsum", ["ok", "ok"], "// kept correct: not a broken rewrite\n"),
        episode("cumsum", ["incorrect", "incorrect"], "// still failing: not one either\n"),
        episode("other", ["ok", "incorrect"], "# no reference: the first line\n"),
        episode("cumsum", ["ok", "incorrect"], "import torch\nx = 1\n"),
    ]
    broken = analyze.broken_rewrites(episodes, {"cumsum": reference})
    assert broken == [("cumsum", "// One warp per row: 32-wide chunks"), ("cumsum", "x = 2"),
                      ("other", "# no reference: the first line"), ("cumsum", "")]
    assert [analyze.is_comment_line(line) for _, line in broken] == [True, False, True, False]
    assert not analyze.is_comment_line("#define FULL_MASK 1") and not analyze.is_comment_line(
        "  #pragma unroll")


def test_trained_family_split_sums_the_reward_change_per_side(analyze):
    family_of = {"matvec_1x2": "matvec", "matvec_3x4": "matvec", "relu_5x6": "relu",
                 "abs_7x8": "abs"}
    before = {"matvec_1x2": 0.1, "matvec_3x4": 0.5, "relu_5x6": 0.8, "abs_7x8": 0.6}
    after = {"matvec_1x2": 0.9, "matvec_3x4": 0.5, "relu_5x6": 0.2, "abs_7x8": 0.6,
             "extra_1x1": 1.0}  # measured only once: left out
    split = analyze.trained_family_split(before, after, family_of, {"matvec"})
    assert split["trained"][0] == 2 and split["trained"][1] == pytest.approx(0.8)
    assert split["other"][0] == 2 and split["other"][1] == pytest.approx(-0.6)
    assert split["practice"] == (0, 0.0)


def test_trained_family_split_keeps_untrained_practice_families_apart(analyze):
    family_of = {"cos_1x2": "cos", "erf_1x2": "erf", "relu_5x6": "relu"}
    before = {"cos_1x2": 0.1, "erf_1x2": -0.1, "relu_5x6": 0.8}
    after = {"cos_1x2": 0.7, "erf_1x2": 0.6, "relu_5x6": 0.7}
    split = analyze.trained_family_split(before, after, family_of, {"cos"}, {"erf"})
    assert split["trained"] == (1, pytest.approx(0.6))
    assert split["practice"] == (1, pytest.approx(0.7))
    assert split["other"] == (1, pytest.approx(-0.1))


def _op_episode(name, family, status, source):
    return {"problem": {"name": name, "family": family},
            "turns": [{"candidate_source": source,
                       "eval_result": None if status is None else {"status": status}}]}


def test_unseen_family_ops_report_the_failing_op_lines_of_families_sft_never_showed(analyze):
    body = ("__device__ __forceinline__ float op(float v, float p0, float p1) "
            "{ return fminf(fmaxf(v,  p0), p1); }\n"
            'extern "C" __global__ void unary_naive(const float* x) {}')
    episodes = [
        _op_episode("abs_1x2", "abs", "incorrect", body),
        _op_episode("abs_3x4", "abs", "ok", body),  # passed: not reported
        _op_episode("relu_1x2", "relu", "incorrect", body),  # SFT showed relu
        _op_episode("scale_1x2", "scale", "compile_error",
                    'extern "C" __global__ void scale_naive(float* y) {}'),
        _op_episode("softplus_1x2", "softplus", None, ""),
    ]
    assert analyze.unseen_family_ops(episodes, {"relu"}) == [
        ("abs_1x2", "incorrect", "fminf(fmaxf(v, p0), p1)"),
        ("scale_1x2", "compile_error", "scale_naive"),
        ("softplus_1x2", "no kernel", "no_reply"),
    ]


def _dtype_episode(dtype, params, body=""):
    source = None if params is None else f'extern "C" __global__ void k({params}) {{ {body} }}'
    return {"problem": {"name": "p", "dtype": dtype}, "turns": [{"candidate_source": source}]}


def test_dtype_mismatches_count_kernels_of_the_other_precision(analyze):
    assert analyze.kernel_precision('extern "C" __global__ void k(const __half* x, __half* y, long n)') == "half"
    assert analyze.kernel_precision("__global__ void k(const float* __restrict__ x, long n)") == "float"
    assert analyze.kernel_precision("__global__ void k(const long* i, long n)") == ""
    assert analyze.kernel_precision("no kernel here") == ""
    episodes = [_dtype_episode("float16", "const float* x, float* y"),
                _dtype_episode("float16", "const __half* x, __half* y"),
                _dtype_episode("float32", "const __half* a, __half* y"),
                # a recorded leaky_relu: float pointers, 16-bit conversions inside
                _dtype_episode("float32", "const float* x, float* y", "y[0] = __half2float(x[0]);"),
                _dtype_episode("float32", "const float* x, float* y"),
                _dtype_episode("float32", None)]  # no reply: not counted
    assert analyze.dtype_mismatches(episodes) == {"float16 with float kernels": (1, 2),
                                                  "float32 with 16-bit floats": (2, 3)}


def test_a_stage_of_several_samples_per_problem_gives_each_problem_its_mean_reward(analyze):
    rows = [{"problem": "relu", "reward": 1.0}, {"problem": "abs", "reward": -0.1},
            {"problem": "relu", "reward": 0.0}, {"problem": "relu", "reward": 0.5}]
    assert analyze.mean_reward_by_problem(rows) == {"relu": pytest.approx(0.5), "abs": -0.1}


def test_template_drift_counts_kernels_on_another_familys_template(analyze):
    templates = analyze.reference_templates()  # from the built-in corpus's naive solutions
    assert templates["relu"] == templates["gelu_tanh"] == "unary_naive"
    assert templates["matvec"] == "matvec_naive"

    def episode(name, family, kernel):
        source = None if kernel is None else f'__global__ void {kernel}(const float* x) {{}}'
        return {"problem": {"name": name, "family": family},
                "turns": [{"candidate_source": source}]}

    episodes = [episode("matvec_2168x4923", "matvec", "unary_naive"),  # a recorded drift
                episode("matvec_1x1", "matvec", "matvec_naive"),
                episode("relu_1x1", "relu", "unary_naive"),  # its own family's template
                episode("relu_2x2", "relu", "my_relu"),  # a name of its own: not another's
                episode("relu_3x3", "relu", None),  # no kernel: not counted
                episode("x_1", "not_a_builtin_family", "unary_naive")]  # unknown family
    assert analyze.template_drift(episodes, templates) == ([("matvec_2168x4923", "unary_naive")], 4)


def test_compared_stages_uses_the_stages_a_seed_reached(analyze):
    requested = ["select@0", "select@6", "select@12"]
    assert analyze.compared_stages(requested, {"select@0": [], "select@6": [], "select@12": []}) \
        == ("select@0", "select@12")
    assert analyze.compared_stages(requested, {"select@0": [], "select@6": []}) \
        == ("select@0", "select@6")
    assert analyze.compared_stages(requested, {"select@6": []}) is None


def _family_episode(name, family, tier, group, kernel, status, advantage):
    episode = _episode(name, group, kernel, status, advantage)
    episode["problem"].update(family=family, tier=tier)
    return episode


def test_template_credit_by_tier_splits_own_templates_from_the_rest(analyze):
    templates = {"relu": "unary_naive", "matvec": "matvec_naive"}
    episodes = [_family_episode("matvec_1", "matvec", 1, 0, "matvec_naive", "ok", 0.6),
                _family_episode("matvec_1", "matvec", 1, 0, "unary_naive", "incorrect", -0.2),
                _family_episode("matvec_1", "matvec", 1, 0, "mv", "incorrect", -0.3),
                _family_episode("matvec_1", "matvec", 1, 0, None, None, -0.1),
                _family_episode("relu_1", "relu", 0, 1, "unary_naive", "ok", 0.0),
                _family_episode("abs_1", "abs", 0, 2, "unary_naive", "ok", 0.5)]  # unknown family
    assert analyze.template_credit_by_tier(episodes, templates) == {
        (0, "own template"): (1, 0.0), (1, "a name of its own"): (1, -0.3),
        (1, "another family's"): (1, -0.2), (1, "no kernel"): (1, -0.1),
        (1, "own template"): (1, 0.6)}


def test_family_signal_counts_pass_rates_and_mixed_groups(analyze):
    episodes = [_family_episode("relu_1", "relu", 0, 0, "k", "ok", 0.0),
                _family_episode("relu_1", "relu", 0, 0, "k", "ok", 0.0),
                _family_episode("relu_2", "relu", 0, 1, "k", "ok", 0.0),
                _family_episode("relu_2", "relu", 0, 1, "k", "incorrect", 0.0),
                _family_episode("cumsum_1", "cumsum", 1, 2, "k", "incorrect", 0.0),
                _family_episode("cumsum_1", "cumsum", 1, 2, None, None, 0.0)]
    signal = analyze.family_signal(episodes)
    assert list(signal) == ["cumsum", "relu"]  # by pass rate
    assert signal["relu"] == {"episodes": 4, "pass_rate": 0.75, "groups": 2, "mixed": 1}
    assert signal["cumsum"] == {"episodes": 2, "pass_rate": 0.0, "groups": 1, "mixed": 0}


def test_family_counts_pool_each_familys_correct_episodes_and_feed_the_warm_start(analyze,
                                                                                  tmp_path):
    """The counts file analyze_rollouts writes is the one the family_warm_start setting reads,
    and an episode counts as correct when any of its turns is (the curriculum's rule)."""
    episodes = [_family_episode("relu_1", "relu", 0, 0, "k", "ok", 0.0),
                _family_episode("relu_2", "relu", 0, 1, "k", "incorrect", 0.0),
                _family_episode("cumsum_1", "cumsum", 1, 2, None, None, 0.0)]
    second_turn_fix = _family_episode("cumsum_1", "cumsum", 1, 2, "k", "incorrect", 0.0)
    second_turn_fix["turns"].append({"eval_result": {"status": "ok"}})
    episodes.append(second_turn_fix)
    counts = analyze.family_counts(episodes)
    assert counts == {"cumsum": [1, 2], "relu": [1, 2]}
    seed = tmp_path / "seed0"
    seed.mkdir()
    (seed / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    out = tmp_path / "counts.json"
    assert analyze.main([str(tmp_path), "--seeds", "0", "--stages", "--family-counts-out",
                         str(out)]) in (0, None)
    from multiminddev.tasks.curriculum import load_family_counts

    assert load_family_counts(out) == {"cumsum": (1, 2), "relu": (1, 2)}


def test_reference_templates_cover_the_practice_and_breadth_families(analyze):
    templates = analyze.reference_templates()
    assert templates["relu"] == templates["cos"] == templates["sin"] == "unary_naive"
    assert templates["copysign"] == templates["add"] == "binary_naive"
    assert templates["transpose"] == "transpose_naive"


def test_pass_by_step_splits_each_step_into_the_given_families_and_the_rest(analyze):
    def episode(family, status):
        return {"problem": {"name": f"{family}_1x1", "family": family},
                "turns": [{"eval_result": {"status": status}}]}

    episodes = [episode("cos", "ok"), episode("cos", "incorrect"), episode("cumsum", "ok"),
                episode("cos", "ok"), episode("erf", "ok"), episode("cumsum", "compile_error")]
    assert analyze.pass_by_step(episodes, [3, 6], {"cos", "erf"}) == [(1, 2, 1, 1), (2, 2, 0, 1)]
