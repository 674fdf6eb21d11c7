"""The learning benchmark's pure parts: per-stage metrics, base sharing, aggregation."""

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_learning")


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


def test_episodes_with_a_resubmitted_kernel_are_counted_per_seed(bench):
    rows = [{**_row(True, True, 1.0, 0.5), "repeats": n} for n in (0, 2, 1)]
    assert bench.stage_metrics(rows, compile_only=False)["repeat_episodes"] == 2.0
    seeds = [{"seed": s, "rows": {stage: rows for stage in bench.STAGES},
              "metrics": {stage: bench.stage_metrics(rows, False) for stage in bench.STAGES}}
             for s in (0, 1)]
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["sft/repeat_episodes"] == [2, 2]
    old = [{k: v for k, v in r.items() if k != "repeats"} for r in rows]  # older records
    seeds = [{**s, "rows": {stage: old for stage in bench.STAGES}} for s in seeds]
    assert "sft/repeat_episodes" not in bench.aggregate(seeds, compile_only=False)


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


def test_seeds_borrow_a_base_only_run(bench):
    later = {"sft": [(True, True, 1.5, 0.5)], "grpo": [(True, True, 2.0, 0.8)]}
    rows = [_row(False, False, 0.0, -0.1)]
    base = {"seed": 7, "rows": {"base": rows}, "seconds": {"eval_base": 1.0}}  # partial.json
    seeds = [_seed(bench, 0, later), _seed(bench, 1, later)]
    assert bench.share_base_stage(seeds, False, base) == 7
    assert all(s["rows"]["base"] == rows and s["base_from_seed"] == 7 for s in seeds)
    summary = bench.aggregate([_seed(bench, 0, later), _seed(bench, 1, later)], False, base)
    assert summary["base/reward_mean"]["mean"] == pytest.approx(-0.1)


def test_sharing_needs_one_seed_with_a_base_stage(bench):
    later = {"sft": [(True, True, 1.5, 0.5)], "grpo": [(True, True, 2.0, 0.8)]}
    with pytest.raises(ValueError, match="without --skip-base"):
        bench.share_base_stage([_seed(bench, 0, later), _seed(bench, 1, later)], False)


def test_gain_exceeds_spread_only_when_it_does(bench):
    base = [(False, False, 0.0, -0.1)]
    clear = [_seed(bench, s, {"base": base, "sft": [(True, False, 0.0, 0.0)],
                              "grpo": [(True, True, 2.0, r)]}) for s, r in enumerate((0.9, 1.0, 1.1))]
    summary = bench.aggregate(clear, compile_only=False)
    assert summary["gain/reward_mean"]["mean"] == pytest.approx(1.0)
    assert summary["gain/reward_mean"]["exceeds_spread"]
    noisy = [_seed(bench, s, {"base": base, "sft": [(True, False, 0.0, 0.0)],
                              "grpo": [(True, True, 2.0, r)]}) for s, r in enumerate((-1.0, 0.1, 1.0))]
    assert not bench.aggregate(noisy, compile_only=False)["gain/reward_mean"]["exceeds_spread"]


def test_a_seed_reuses_the_base_only_runs_rows_but_not_its_own(bench, tmp_path):
    import json

    rows = [_row(False, False, 0.0, -0.1)]
    (tmp_path / bench.BASE_DIR).mkdir()
    (tmp_path / bench.BASE_DIR / "partial.json").write_text(json.dumps(
        {"seed": 0, "rows": {"base": rows}, "seconds": {"eval_base": 12.5}}))
    assert bench.base_rows_from_other_seeds(tmp_path, 0) == (0, rows, 12.5)
    (tmp_path / bench.BASE_DIR / "partial.json").unlink()
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "partial.json").write_text(json.dumps(
        {"seed": 0, "rows": {"base": rows}, "seconds": {"eval_base": 3.0}}))
    assert bench.base_rows_from_other_seeds(tmp_path, 0) is None
    assert bench.base_rows_from_other_seeds(tmp_path, 1) == (0, rows, 3.0)


def test_infrastructure_errors_are_counted_per_seed_when_recorded(bench):
    base = [(False, False, 0.0, -0.1)]
    seeds = [_seed(bench, s, {"base": base, "sft": [(True, False, 0.0, 0.0)] * 2,
                              "grpo": [(True, True, 2.0, 0.5)] * 2}) for s in (0, 1)]
    assert "grpo/infra_errors" not in bench.aggregate(seeds, compile_only=False)  # old records
    for seed in seeds:
        for stage_rows in seed["rows"].values():
            for row in stage_rows:
                row["infra_error"] = False
    seeds[1]["rows"]["grpo"][0]["infra_error"] = True
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["grpo/infra_errors"] == [0, 1] and summary["sft/infra_errors"] == [0, 0]


def test_sft_problems_default_to_the_training_problems(bench):
    args = bench.parse_args([])
    assert args.sft_problems == args.train_problems == "builtin:tier0,tier1:train"
    spec = "builtin:tier0,tier1:train:allshapes+builtin:breadth"
    args = bench.parse_args(["--sft-problems", spec])
    assert (args.sft_problems, args.train_problems) == (spec, "builtin:tier0,tier1:train")
    smoke = bench.parse_args(["--cpu-smoke"])  # follows the smoke test's smaller train set
    assert smoke.sft_problems == smoke.train_problems == "builtin:tier0:train"


def test_the_sft_recipe_records_steps_rate_and_method(bench):
    lora = bench.sft_recipe(bench.parse_args(["--sft-steps", "500", "--lora-rank", "64"]))
    assert lora == {"steps": 500, "batch_size": 8, "learning_rate": 2e-4, "method": "lora r64"}
    full = bench.sft_recipe(bench.parse_args(["--sft-full-finetune", "--sft-learning-rate", "2e-5"]))
    assert (full["method"], full["learning_rate"]) == ("full", 2e-5)
    halves = bench.sft_recipe(bench.parse_args(["--sft-batch-size", "4", "--sft-grad-accum", "2"]))
    assert (halves["batch_size"], halves["grad_accum"]) == (4, 2)
    with pytest.raises(SystemExit, match="--sft-grad-accum 0"):
        bench.parse_args(["--sft-grad-accum", "0"])
    assert "max_seq_length" not in halves  # the default, as older records have it
    longer = bench.sft_recipe(bench.parse_args(["--sft-max-seq-length", "2304"]))
    assert longer["max_seq_length"] == 2304


def test_the_note_names_sft_data_only_where_it_differs(bench):
    train = "builtin:tier0,tier1:train"
    spec = "builtin:tier0,tier1:train:allshapes+builtin:breadth"
    assert bench.sft_note([{"sft_problems": train}, {}], train) == ""  # {}: an older record
    assert bench.sft_note([{"sft_problems": spec}] * 2, train) == f"SFT data {spec}"
    assert bench.sft_note([{"sft_problems": spec}, {}], train) == f"SFT data {train} | {spec}"


def test_sft_data_of_the_sft_spec_holds_breadth_and_fp16_problems(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.loaders import load_problems

    problems = load_problems("builtin:tier0,tier1:train:allshapes+builtin:breadth")
    data = bench.sft_data(AgentRole.GENERATOR, problems, 0, ["naive"])
    assert len(data["messages"]) == len(problems)  # one naive solution for each
    # a datasets.Dataset names each row's problem; the fallback column dict does not
    if "problem" in getattr(data, "column_names", ()):
        assert {"neg_4096x4096", "relu_4095x8191_fp16"} <= set(data["problem"])


def test_sft_strip_comments_strips_the_optimizers_replies_only(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.loaders import load_problems

    args = bench.parse_args(["--sft-strip-comments"])
    assert args.sft_strip_comments and bench.sft_recipe(args)["optimizer_strip_comments"]
    assert "optimizer_strip_comments" not in bench.sft_recipe(bench.parse_args([]))
    problems = [p for p in load_problems("builtin:tier1:train") if p.family == "cumsum"][:1]

    def replies(role, strip):
        data = bench.sft_data(role, problems, 0, ["naive"], strip_comments=strip)
        return [m[-1]["content"] for m in data["messages"]]

    (plain,), (stripped,) = (replies(AgentRole.OPTIMIZER, s) for s in (False, True))
    assert "// One warp per row" in plain and "// One warp per row" not in stripped
    assert "__shfl_up_sync" in stripped  # the kernel itself stays
    assert replies(AgentRole.GENERATOR, True) == replies(AgentRole.GENERATOR, False)


def test_optimizer_repair_adds_counted_repair_pairs_to_the_optimizers_data_only(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.tasks.loaders import load_problems

    args = bench.parse_args(["--optimizer-repair"])
    recipe = bench.sft_recipe(args)
    assert recipe["optimizer_repair"] == {}  # filled in when the pairs are built
    assert recipe["optimizer_repair_kinds"] == "all"
    assert "optimizer_repair" not in bench.sft_recipe(bench.parse_args([]))
    some = bench.parse_args(["--optimizer-repair", "misspelt_math", "wrong_operation"])
    assert bench.sft_recipe(some)["optimizer_repair_kinds"] == ["misspelt_math", "wrong_operation"]
    assert recipe["optimizer_repair_reply"] == "naive"
    fast = bench.parse_args(["--optimizer-repair", "wrong_operation", "--optimizer-repair-reply",
                             "fast", "--optimizer-repair-per-family", "2"])
    assert bench.sft_recipe(fast)["optimizer_repair_reply"] == "fast"
    assert bench.sft_recipe(fast)["optimizer_repair_per_family"] == 2
    with pytest.raises(SystemExit, match="per-family"):
        bench.parse_args(["--optimizer-repair", "--optimizer-repair-per-family", "-1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--optimizer-repair", "typo_kind"])
    problems = [p for p in load_problems("builtin:tier0,tier1:train") if p.family == "relu"]
    plain = bench.sft_data(AgentRole.OPTIMIZER, problems, 0, ["naive"])
    plain_stripped = bench.sft_data(AgentRole.OPTIMIZER, problems, 0, ["naive"],
                                    strip_comments=True)
    with Evaluator(EvalConfig(num_workers=1, compile_baseline=False)) as evaluator:
        data = bench.sft_data(AgentRole.OPTIMIZER, problems, 0, ["naive"],
                              repair_evaluator=evaluator, repair_counts=recipe)
        generator = bench.sft_data(AgentRole.GENERATOR, problems, 0, ["naive"],
                                   repair_evaluator=evaluator, repair_counts=recipe)
    added = sum(recipe["optimizer_repair"].values())
    assert added >= 2 and len(data["messages"]) == len(plain["messages"]) + added
    assert len(generator["messages"]) == len(problems)  # the Generator's data is untouched
    if "variant" in getattr(data, "column_names", ()):
        assert sum(v.startswith("repair:") for v in data["variant"]) == added
    with Evaluator(EvalConfig(num_workers=1, compile_baseline=False)) as evaluator:
        fast_data = bench.sft_data(AgentRole.OPTIMIZER, problems, 0, ["naive"],
                                   repair_evaluator=evaluator, repair_kinds=["misspelt_math"],
                                   repair_reply="fast", strip_comments=True,
                                   repair_per_family=1)
    # the repair replies are the Optimizer's naive -> fast targets, not the naive kernel
    assert len(fast_data["messages"]) == len(plain["messages"]) + 1  # one relu pair
    replies = {m[-1]["content"] for m in fast_data["messages"]}
    assert replies == {m[-1]["content"] for m in plain_stripped["messages"]}


def test_grpo_marks_pause_every_k_steps_and_end_at_the_last(bench):
    assert bench.grpo_marks(12, 4) == [4, 8, 12]
    assert bench.grpo_marks(10, 4) == [4, 8, 10]
    assert bench.grpo_marks(3, 0) == [3]
    assert bench.grpo_marks(3, 5) == [3]


def test_a_cut_run_aggregates_the_stages_every_seed_reached(bench, tmp_path):
    import json

    base = [(False, False, 0.0, -0.1)]
    sft = [(True, False, 0.0, 0.0), (True, True, 1.0, 0.5)]
    grpo4 = {0: [(True, True, 1.0, 0.5), (True, True, 1.0, 0.5)],  # seed 0 gained 0.25
             1: [(True, True, 1.0, 0.5), (True, False, 0.0, 0.2)]}  # seed 1 gained 0.10
    for seed in (0, 1):
        stages = {"sft": sft, "grpo@4": grpo4[seed]}
        if seed == 0:
            stages["grpo@8"] = grpo4[seed]  # only seed 0 got further: not aggregated
        rows = {st: [_row(*r) for r in rs] for st, rs in stages.items()}
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "partial.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "partial.json").write_text(json.dumps(
        {"seed": 0, "rows": {"base": [_row(*r) for r in base]}}))
    args = bench.parse_args(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                             "--aggregate-partial"])
    assert bench.main(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                       "--aggregate-partial"]) == 0
    summary = json.loads((tmp_path / "results_partial.json").read_text())["summary"]
    assert summary["stages"] == ["base", "sft", "grpo@4"] and args.aggregate_partial
    gain = summary["gain/grpo@4/reward_mean"]
    assert gain["per_seed"] == pytest.approx([0.25, 0.10]) and gain["mean"] == pytest.approx(0.175)
    assert "grpo@4" in (tmp_path / "results_partial.md").read_text()
    assert bench.main(["--output-dir", str(tmp_path), "--seeds", "0", "2",
                       "--aggregate-partial"]) == 2  # seed 2 has no record


def test_sft_only_aggregates_the_sft_stage_and_names_its_data(bench, tmp_path):
    """--sft-only stops each seed after SFT's evaluation; what it aggregates says which SFT
    data each seed's partial.json records (two mixes run in two output folders)."""
    import json

    sft = {0: [(True, True, 1.0, 0.5), (True, False, 0.0, 0.1)],
           1: [(True, True, 1.0, 0.5), (True, True, 1.0, 0.5)]}
    mix = "builtin:tier0:train+builtin:tier1:train*2"
    for seed in (0, 1):
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "partial.json").write_text(json.dumps(
            {"seed": seed, "sft_problems": mix,
             "rows": {"sft": [_row(*r) for r in sft[seed]]}}))
    args = bench.parse_args(["--output-dir", str(tmp_path), "--seeds", "0", "1", "--sft-only"])
    assert args.sft_only and not args.aggregate_partial
    assert bench.write_partial_results(args) == 0
    summary = json.loads((tmp_path / "results_partial.json").read_text())["summary"]
    assert summary["stages"] == ["sft"]
    assert summary["sft/correct_rate"]["per_seed"] == pytest.approx([0.5, 1.0])
    assert f"SFT data {mix}" in (tmp_path / "results_partial.md").read_text()


def test_grpo_curriculum_starts_on_the_default_first_tier(bench):
    from multiminddev.tasks.loaders import load_problems

    train = load_problems("builtin:tier0,tier1:train")
    curriculum = bench.grpo_curriculum(bench.parse_args([]), train)
    assert curriculum.current_tier == 0
    assert {p.tier for p in curriculum.sample(40, 0)} == {0}  # tier 0 has nothing to review


def test_grpo_curriculum_can_train_both_tiers_from_the_first_step(bench):
    from multiminddev.tasks.loaders import load_problems

    train = load_problems("builtin:tier0,tier1:train")
    args = bench.parse_args(["--curriculum-start-tier", "1", "--review-fraction", "0.5"])
    curriculum = bench.grpo_curriculum(args, train)
    tiers = [p.tier for p in curriculum.sample(200, 0)]
    assert curriculum.current_tier == 1
    assert 0.35 < tiers.count(0) / len(tiers) < 0.65  # half review of tier 0


def test_grpo_curriculum_can_draw_families_by_their_signal(bench):
    from multiminddev.tasks.loaders import load_problems

    train = load_problems("builtin:tier0,tier1:train:resized8from4")
    assert bench.grpo_curriculum(bench.parse_args([]), train).config.family_sampling.value \
        == "uniform"
    args = bench.parse_args(["--curriculum-start-tier", "1", "--review-fraction", "0.5",
                             "--family-sampling", "signal", "--family-floor", "0.05"])
    curriculum = bench.grpo_curriculum(args, train)
    for problem in train:  # every add problem solved, every matvec problem half solved
        if problem.family in ("add", "matvec"):
            for ok in (True, problem.family == "add"):
                curriculum.record(problem, {"compiled": True, "correct": ok})
    weights = curriculum.family_weights(0)
    assert weights["add"] == pytest.approx(0.05) and weights["relu"] == pytest.approx(0.25)
    assert curriculum.family_weights(1)["matvec"] == pytest.approx(0.25)
    drawn = [p.family for p in curriculum.sample(400, 0) if p.tier == 0]
    assert drawn.count("add") < drawn.count("relu") / 2  # 0.05 against 0.25


def test_a_warm_start_gives_the_families_their_earlier_runs_weights(bench, tmp_path):
    from multiminddev.tasks.curriculum import family_weights, spread_outcomes
    from multiminddev.tasks.loaders import load_problems

    train = load_problems("builtin:tier0,tier1:train:resized8from4")
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps({"families": {"add": [64, 64], "gelu_tanh": [44, 96]}}))
    args = bench.parse_args(["--family-sampling", "signal", "--family-warm-start", str(counts)])
    weights = bench.grpo_curriculum(args, train).family_weights(0)
    window = 32  # CurriculumConfig.family_window
    assert weights["add"] == pytest.approx(
        family_weights({"add": [True] * window}, ["add"], 0.5, 0.02)["add"]) == 0.02
    assert weights["gelu_tanh"] == pytest.approx(family_weights(
        {"g": spread_outcomes(44, 96, window)}, ["g"], 0.5, 0.02)["g"])
    assert weights["relu"] == pytest.approx(0.25)  # no counts: an empty window
    cold = bench.grpo_curriculum(bench.parse_args(["--family-sampling", "signal"]), train)
    assert cold.family_weights(0)["add"] == pytest.approx(0.25)


@pytest.mark.parametrize("content, message", [
    (None, "FileNotFoundError"),
    ("not json", "JSONDecodeError"),
    ('{"add": [1, 2]}', "KeyError"),
    ('{"families": {"add": [3, 2]}}', "0 <= correct <= episodes"),
    ('{"families": {"add": 5}}', "TypeError"),
])
def test_a_bad_warm_start_file_stops_before_any_model_loads(bench, tmp_path, content, message):
    path = tmp_path / "counts.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit, match=message):
        bench.parse_args(["--family-sampling", "signal", "--family-warm-start", str(path)])
    path.write_text('{"families": {"add": [1, 2]}}')
    with pytest.raises(SystemExit, match="give --family-sampling signal too"):
        bench.parse_args(["--family-warm-start", str(path)])


def test_eval_decoding_follows_compiled_decoding_unless_set(bench):
    assert bench.parse_args([]).eval_compiled_decoding is None
    args = bench.parse_args(["--compiled-decoding", "on", "--eval-compiled-decoding", "off"])
    assert args.compiled_decoding is True and args.eval_compiled_decoding is False
    assert bench.parse_args(["--eval-compiled-decoding", "on"]).eval_compiled_decoding is True
    assert bench.parse_args([]).eval_dtype == "same"
    assert bench.parse_args(["--eval-dtype", "float32"]).eval_dtype == "float32"
    with pytest.raises(SystemExit, match="needs LoRA adapters"):
        bench.parse_args(["--eval-dtype", "float32", "--sft-full-finetune"])


def test_grpo_batch_options_reach_the_grpo_config(bench):
    args = bench.parse_args(["--mini-batch-size", "24", "--grad-accum", "3"])
    assert (args.mini_batch_size, args.grad_accum) == (24, 3)
    defaults = bench.parse_args([])
    from multiminddev.train.grpo import GRPOConfig

    assert (defaults.mini_batch_size, defaults.grad_accum) == (
        GRPOConfig.mini_batch_size, GRPOConfig.grad_accum)


def test_sft_anchor_examples_are_the_sft_data_tokenized_per_role(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.loaders import load_problems
    from tests.policy.helpers import gguf_tokenizer

    problems = load_problems("builtin:relu")
    tokenizer = gguf_tokenizer()
    anchor = bench.sft_anchor_examples(tokenizer, [AgentRole.GENERATOR, AgentRole.OPTIMIZER],
                                       problems, 0, ["naive"])
    for role in (AgentRole.GENERATOR, AgentRole.OPTIMIZER):
        data = bench.sft_data(role, problems, 0, ["naive"])
        assert len(anchor[role]) == len(data["messages"]) > 0
        assert all(any(label != -100 for label in e["labels"]) for e in anchor[role])
    args = bench.parse_args(["--sft-anchor", "0.5"])
    assert args.sft_anchor == 0.5 and bench.parse_args([]).sft_anchor == 0.0
    # tokenized at SFT's length: a shorter one cuts every example there
    short = bench.sft_anchor_examples(tokenizer, [AgentRole.GENERATOR], problems, 0, ["naive"],
                                      max_len=300)
    assert max(len(e["input_ids"]) for e in anchor[AgentRole.GENERATOR]) > 300
    assert {len(e["input_ids"]) for e in short[AgentRole.GENERATOR]} == {300}


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


def test_grpo_options_set_config_fields_with_their_types(bench):
    from multiminddev.train.grpo import GRPOConfig

    overrides = bench.grpo_overrides(["clip_high=0.28", "filter_zero_variance=true",
                                      "normalize_std=False", "ppo_epochs=2", "dual_clip=none",
                                      "advantage=leave_one_out"])
    assert overrides == {"clip_high": 0.28, "filter_zero_variance": True, "normalize_std": False,
                         "ppo_epochs": 2, "dual_clip": None, "advantage": "leave_one_out"}
    cfg = GRPOConfig(**overrides)
    assert cfg.filter_zero_variance and not cfg.normalize_std and cfg.advantage.value == "leave_one_out"
    args = bench.parse_args(["--grpo-option", "kl_coef=0.05", "--grpo-option", "clip_high=0.28"])
    assert args.grpo_options == ["kl_coef=0.05", "clip_high=0.28"]
    assert bench.parse_args([]).grpo_options == []


@pytest.mark.parametrize(("option", "message"), [
    ("clip_high", "write KEY=VALUE"),
    ("learning_rate=1e-5", "use --rl-learning-rate"),
    ("no_such_field=1", "no such field"),
    ("kl_coef=lots", "could not convert"),
    ("filter_zero_variance=maybe", "expected true or false"),
    ("advantage=bogus", "choose one of group, turn_level, leave_one_out"),
    ("clip_low=2", "clip_low"),  # GRPOConfig's own range check
])
def test_bad_grpo_options_stop_before_anything_runs(bench, option, message):
    with pytest.raises(SystemExit, match=message):
        bench.parse_args(["--grpo-option", option])


def test_sft_anchor_problems_need_the_anchor_on(bench):
    args = bench.parse_args(["--sft-anchor", "1.0", "--sft-anchor-problems",
                             "builtin:tier0:train:resized1from4"])
    assert args.sft_anchor == 1.0 and args.sft_anchor_problems == "builtin:tier0:train:resized1from4"
    assert bench.parse_args([]).sft_anchor_problems is None
    with pytest.raises(SystemExit, match="needs --sft-anchor"):
        bench.parse_args(["--sft-anchor-problems", "builtin:tier0:train"])



def test_grpo_roles_default_to_both_agents_and_refuse_the_tester(bench):
    assert bench.parse_args([]).grpo_roles == ["generator", "optimizer"]
    assert bench.parse_args(["--grpo-roles", "optimizer"]).grpo_roles == ["optimizer"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--grpo-roles", "tester"])
    with pytest.raises(SystemExit, match="use --grpo-roles"):
        bench.parse_args(["--grpo-option", "train_roles=optimizer"])


def test_only_an_agent_grpo_does_not_train_may_decode_greedily_in_rollouts(bench):
    assert bench.parse_args([]).rl_greedy_roles == []
    args = bench.parse_args(["--grpo-roles", "optimizer", "--rl-greedy-roles", "generator"])
    assert args.rl_greedy_roles == ["generator"]
    with pytest.raises(SystemExit, match="only an agent it does not train"):
        bench.parse_args(["--rl-greedy-roles", "generator"])  # both agents trained
    with pytest.raises(SystemExit, match="only an agent it does not train"):
        bench.parse_args(["--grpo-roles", "generator", "--rl-greedy-roles", "generator"])


def test_grpo_option_sets_one_agents_learning_rate(bench):
    got = bench.grpo_overrides(["role_learning_rates=generator:2e-5, optimizer:1e-4"])
    assert got == {"role_learning_rates": {"generator": 2e-5, "optimizer": 1e-4}}
    with pytest.raises(SystemExit, match="write NAME:NUMBER"):
        bench.grpo_overrides(["role_learning_rates=generator"])
    with pytest.raises(SystemExit, match="not a trained agent"):
        bench.grpo_overrides(["role_learning_rates=tester:1e-5"])


def test_grpo_options_set_credit_fields(bench):
    from multiminddev.rewards.credit import CreditConfig

    got = bench.grpo_overrides(["credit.improvement=true", "credit.immediate_weight=0.5",
                                "kl_coef=0.1"])
    assert got["kl_coef"] == 0.1
    assert got["credit"] == CreditConfig(improvement=True, immediate_weight=0.5)
    with pytest.raises(SystemExit, match="CreditConfig has no such field"):
        bench.grpo_overrides(["credit.no_such=1"])
    with pytest.raises(SystemExit, match="immediate_weight"):
        bench.grpo_overrides(["credit.immediate_weight=2"])  # CreditConfig checks the range


# ------------------------------------------------ GRPO's training distribution (train_* stages)

def _real_row(bench, problem, status, speedup=0.0, reward=0.0):
    """A row as ``episode_row`` makes it, from a one-turn episode of ``status``."""
    from types import SimpleNamespace

    from tests.benchmarks.helpers import eval_result

    turn = SimpleNamespace(eval_result=eval_result(status, speedup, problem), repeat_of=None)
    episode = SimpleNamespace(problem=SimpleNamespace(name=problem, tier=0), turns=[turn])
    return bench.episode_row(episode, reward)


def _train_eval_seed(bench, seed, train_sft, train_grpo, spec="builtin:tier0,tier1:train"):
    """A seed result with held-out stages and, unless None, the train_* stages; each of those a
    list of (status, speedup, reward) on problems t0, t1, ..."""
    from multiminddev.env.results import EvalStatus

    held_out = [_real_row(bench, "h0", EvalStatus.OK, 1.5, 0.6),
                _real_row(bench, "h1", EvalStatus.COMPILE_ERROR, 0.0, -0.1)]
    rows = {stage: held_out for stage in bench.STAGES}
    for stage, outcomes in (("train_sft", train_sft), ("train_grpo", train_grpo)):
        if outcomes is not None:
            rows[stage] = [_real_row(bench, f"t{i}", *o) for i, o in enumerate(outcomes)]
    return {"seed": seed, "rows": rows, "train_eval_problems": spec,
            "metrics": {st: bench.stage_metrics(r, False) for st, r in rows.items()
                        if st in bench.STAGES}}  # older results: no train_* metrics


def test_train_eval_problems_are_off_by_default_and_same_means_grpos(bench):
    args = bench.parse_args([])
    assert (args.train_eval_problems, args.train_eval_count) == ("", 12)
    assert bench.parse_args(["--train-eval-problems", "same"]).train_eval_problems == (
        "builtin:tier0,tier1:train")
    args = bench.parse_args(["--train-problems", "builtin:tier1:train",
                             "--train-eval-problems", "same", "--train-eval-count", "5"])
    assert (args.train_eval_problems, args.train_eval_count) == ("builtin:tier1:train", 5)
    spec = "builtin:tier0,tier1:train:allshapes"
    assert bench.parse_args(["--train-eval-problems", spec]).train_eval_problems == spec
    smoke = bench.parse_args(["--cpu-smoke", "--train-eval-problems", "same"])
    assert (smoke.train_eval_problems, smoke.train_eval_count) == ("builtin:tier0:train", 1)
    assert bench.parse_args(["--cpu-smoke", "--train-eval-count", "2"]).train_eval_count == 2
    with pytest.raises(SystemExit, match="at least one problem"):
        bench.parse_args(["--train-eval-problems", "same", "--train-eval-count", "0"])


def test_the_train_eval_sample_is_the_same_whatever_the_seed(bench):
    import random

    from multiminddev.tasks.loaders import load_problems

    train = load_problems("builtin:tier0,tier1:train")
    random.seed(0)
    first = [p.name for p in bench.train_eval_subset(train, 12)]
    random.seed(1)  # another seed's process: the global RNG does not choose the sample
    assert [p.name for p in bench.train_eval_subset(train, 12)] == first
    assert first == sorted(set(first)) and len(first) == 12
    assert set(first) <= {p.name for p in train}
    assert {p.tier for p in bench.train_eval_subset(train, 12)} == {0, 1}  # not the first 12
    # a weighted spec lists each problem twice; the sample holds it once
    tier0 = load_problems("builtin:tier0:train")
    everything = bench.train_eval_subset(load_problems("builtin:tier0:train*2"), 1000)
    assert [p.name for p in everything] == sorted(p.name for p in tier0)


def test_aggregate_reports_the_training_distribution_apart_from_held_out(bench, tmp_path):
    from multiminddev.env.results import EvalStatus

    ok, wrong = EvalStatus.OK, EvalStatus.INCORRECT
    # seed 0: GRPO makes t1 correct (+0.5 reward); seed 1: GRPO makes t1 correct and fast
    seeds = [_train_eval_seed(bench, 0, [(ok, 2.0, 0.8), (wrong, 0.0, 0.0)],
                              [(ok, 2.0, 0.8), (ok, 0.5, 0.5)]),
             _train_eval_seed(bench, 1, [(ok, 2.0, 0.8), (wrong, 0.0, 0.0)],
                              [(ok, 2.0, 0.8), (ok, 1.5, 0.7)])]
    plain = bench.aggregate([_train_eval_seed(bench, s, None, None) for s in (0, 1)], False)
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["train_eval"] == {"problems_spec": "builtin:tier0,tier1:train",
                                     "problems": ["t0", "t1"],
                                     "stages": ["train_sft", "train_grpo"], "missing": {}}
    assert summary["train_sft/correct_rate"]["per_seed"] == [0.5, 0.5]
    assert summary["train_grpo/fast_1"]["per_seed"] == [0.5, 1.0]
    assert summary["train_gain/correct_rate"]["per_seed"] == [0.5, 0.5]
    assert summary["train_gain/reward_mean"]["per_seed"] == pytest.approx([0.25, 0.35])
    assert summary["train_gain/fast_1"]["per_seed"] == [0.0, 0.5]
    assert summary["train_grpo/infra_errors"] == [0, 0]
    # the held-out summary and the targets do not move
    assert {k: v for k, v in summary.items() if not k.startswith("train")} == plain
    assert bench.targets(summary) == bench.targets(plain)

    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    text = (tmp_path / "results.md").read_text()
    held_out, _, train_part = text.partition(
        "## GRPO's training distribution (2 problems from builtin:tier0,tier1:train), "
        "not held out")
    assert train_part and "Targets:" in held_out  # the targets stay with the held-out table
    assert "train_" not in held_out
    # compile_rate, then correct_rate: t1 compiled but was wrong until GRPO
    assert "| train_sft | 1.000 ± 0.000 [1.000, 1.000] | 0.500 ± 0.000" in train_part
    assert "| train_grpo | 1.000 ± 0.000 [1.000, 1.000] | 1.000 ± 0.000" in train_part
    assert "- train_grpo - train_sft correct_rate: +0.500 (std over seeds 0.000)" in train_part
    assert "- train_grpo - train_sft fast_1: +0.250" in train_part


def test_without_train_stages_the_report_has_no_such_section(bench, tmp_path):
    seeds = [_train_eval_seed(bench, s, None, None) for s in (0, 1)]
    summary = bench.aggregate(seeds, compile_only=False)
    assert not any(k.startswith("train") for k in summary)
    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    assert "training distribution" not in (tmp_path / "results.md").read_text()


def test_a_train_stage_that_some_seeds_lack_is_not_aggregated(bench):
    from multiminddev.env.results import EvalStatus

    seeds = [_train_eval_seed(bench, 0, [(EvalStatus.OK, 2.0, 0.8)], [(EvalStatus.OK, 2.0, 0.8)]),
             _train_eval_seed(bench, 1, [(EvalStatus.OK, 2.0, 0.8)], None)]  # cut before it
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["train_eval"]["stages"] == ["train_sft"]
    assert summary["train_eval"]["missing"] == {"train_grpo": [1]}
    assert "train_grpo/reward_mean" not in summary and "train_gain/reward_mean" not in summary
    lines = bench.train_distribution_lines(summary)
    assert "- train_grpo: not measured by seeds [1], so not aggregated" in lines
    assert not any(line.startswith("| train_grpo") for line in lines)


def test_a_cut_or_sft_only_run_reports_the_train_stages_it_reached(bench, tmp_path):
    from multiminddev.env.results import EvalStatus

    for seed in (0, 1):
        rows = {"sft": [_real_row(bench, "h0", EvalStatus.OK, 1.5, 0.6)],
                "train_sft": [_real_row(bench, "t0", EvalStatus.INCORRECT, 0.0, 0.1 * seed)]}
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "partial.json").write_text(json.dumps(
            {"seed": seed, "rows": rows, "train_eval_problems": "builtin:tier0:train"}))
    assert bench.main(["--output-dir", str(tmp_path), "--seeds", "0", "1",
                       "--aggregate-partial"]) == 0
    summary = json.loads((tmp_path / "results_partial.json").read_text())["summary"]
    assert summary["stages"] == ["sft"]  # the train_* stages are not held-out stages
    assert summary["train_sft/reward_mean"]["per_seed"] == pytest.approx([0.0, 0.1])
    text = (tmp_path / "results_partial.md").read_text()
    assert "## GRPO's training distribution (1 problems from builtin:tier0:train)" in text
    assert "| train_sft |" in text and "train_grpo - train_sft" not in text


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


def test_a_finished_seed_runs_again_only_for_missing_train_stages_it_can_measure(bench, tmp_path):
    finished = {"rows": {"base": [], "sft": [], "grpo": []}}
    assert not bench.lacks_train_stages(tmp_path, 0, finished, sft_only=False)  # no SFT agents
    for role in ("generator", "optimizer"):
        (tmp_path / "seed0" / "sft_checkpoints" / role).mkdir(parents=True)
    assert bench.lacks_train_stages(tmp_path, 0, finished, sft_only=False)
    with_sft = {"rows": {**finished["rows"], "train_sft": []}}
    assert bench.lacks_train_stages(tmp_path, 0, with_sft, sft_only=False)
    assert not bench.lacks_train_stages(tmp_path, 0, with_sft, sft_only=True)
    both = {"rows": {**with_sft["rows"], "train_grpo": []}}
    assert not bench.lacks_train_stages(tmp_path, 0, both, sft_only=False)


def test_train_grpo_of_an_earlier_grpo_needs_its_last_step_checkpoint(bench, tmp_path):
    class Trainer:  # GRPOTrainer.resume's effect: the checkpoint's step
        def __init__(self, checkpoint_step):
            self.step, self.checkpoint_step, self.resumed = 0, checkpoint_step, []

        def resume(self, path):
            self.resumed.append(path)
            self.step = self.checkpoint_step

    trainer = Trainer(4)
    assert not bench.restore_final_grpo(trainer, tmp_path, 4) and trainer.resumed == []
    (tmp_path / "rl_checkpoints" / "latest").mkdir(parents=True)
    assert bench.restore_final_grpo(trainer, tmp_path, 4) and trainer.resumed == [tmp_path]
    assert not bench.restore_final_grpo(Trainer(2), tmp_path, 4)  # a checkpoint before the end


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


def test_a_step_within_the_margin_is_not_kept(bench, tmp_path):
    rows = _select_rows({0: 0.70102, 6: 0.70114})
    # policy and roles are never reached: the step is not chosen, so nothing is saved
    assert not bench.keep_if_best(rows, 6, 12, None, (), tmp_path, 0.01)
    assert not (tmp_path / bench.SELECT_BEST_DIR).exists()


def test_the_aggregate_chooses_with_each_seeds_recorded_margin(bench, tmp_path):
    stages = {"base": [(False, False, 0.0, -0.1)], "sft": [(True, True, 1.0, 0.5)],
              "grpo": [(True, True, 1.0, 0.5)], "select@0": [(True, True, 1.0, 0.7010)],
              "select@6": [(True, True, 1.0, 0.7012)]}
    seeds = [_seed(bench, s, stages) for s in (0, 1)]
    seeds[1]["select_min_gain"] = 0.01  # seed 0 was recorded before the margin existed
    assert bench.aggregate(seeds, compile_only=False)["select"]["chosen_step"] == [6, 0]


def test_the_select_margin_and_the_time_budget_are_checked_before_any_model_loads(bench):
    args = bench.parse_args([])
    assert (args.select_min_gain, args.time_budget) == (0.01, 0.0)
    assert bench.parse_args(["--time-budget", "1600"]).time_budget == 1600.0
    for bad in (["--select-min-gain", "-0.1"], ["--time-budget", "-5"]):
        with pytest.raises(SystemExit, match="each needs to be 0 or more"):
            bench.parse_args(bad)


# --------------------------------------------------------------------------- time budget

def test_fits_adds_the_steps_the_evaluations_and_the_margin(bench):
    work = bench.RemainingWork(step=40.0, select=100.0, final=200.0)
    for left, steps, margin in [(400.0, 1, 1.15), (391.0, 1, 1.15), (345.0, 0, 1.15),
                                (340.0, 1, 1.0), (339.9, 1, 1.0), (1000.0, 5, 1.3)]:
        need = margin * (steps * 40.0 + 100.0 + 200.0)
        assert bench.fits(left, work, steps, margin) is (need <= left)


class _Seed:
    """The GRPO phase's clock and stages: a step, an evaluation and a select@ evaluation each
    take their seconds off a simulated clock, and every call is recorded."""

    def __init__(self, budget, step_s=40.0, select_s=100.0, final_s=200.0):
        self.now, self.budget, self.step = 0.0, budget, 0
        self.step_s, self.select_s, self.final_s = step_s, select_s, final_s
        self.calls, self.selected = [], set()

    def train_until(self, until):
        self.calls.append(("train", until))
        self.now += (until - self.step) * self.step_s
        self.step = until

    def evaluate_mark(self, mark):
        self.calls.append(("mark", mark))
        self.evaluate_select(mark)

    def evaluate_select(self, mark):
        if mark not in self.selected:
            self.selected.add(mark)
            self.calls.append(("select", mark))
            self.now += self.select_s


def _phase(bench, seed, marks, budgeted=True, select=True):
    """The phase as run_seed drives it; the step's time is known once a step has run."""
    return bench.grpo_phase(lambda: seed.step, seed.train_until, marks, seed.evaluate_mark,
                            seed.evaluate_select if select else None,
                            (lambda: seed.budget - seed.now) if budgeted else None,
                            lambda: bench.RemainingWork(
                                step=seed.step_s if seed.step else 0.0,
                                select=seed.select_s if select else 0.0, final=seed.final_s))


def test_without_a_budget_grpo_trains_to_each_mark_in_one_call(bench):
    seed = _Seed(budget=0.0)
    assert _phase(bench, seed, [6, 12], budgeted=False) is None
    assert seed.calls == [("train", 6), ("mark", 6), ("select", 6),
                          ("train", 12), ("mark", 12), ("select", 12)]


def test_a_budget_that_holds_every_step_changes_only_the_step_size(bench):
    seed = _Seed(budget=12 * 40 + 2 * 100 + 200 * 1.15 + 100)
    assert _phase(bench, seed, [6, 12]) is None
    assert [c for c in seed.calls if c[0] == "train"] == [("train", k) for k in range(1, 13)]
    assert sorted(seed.selected) == [6, 12]


def test_a_short_budget_stops_grpo_where_its_evaluations_still_fit(bench):
    """Run I's shape: the final evaluation must still fit after GRPO stops, and the step it
    stopped at is evaluated on the select@ problems, so early stopping can choose it."""
    budget = 800.0  # every step and both select@ evaluations would take 680 s, the final 200
    seed = _Seed(budget)
    stopped = _phase(bench, seed, [6, 12])
    assert stopped == 8
    assert ("mark", 6) in seed.calls and ("mark", 12) not in seed.calls
    assert seed.calls[-1] == ("select", stopped)
    assert seed.now + seed.final_s <= budget  # the held-out evaluation after GRPO fits
    # one more step would not have left room for its select@ and the final evaluation
    assert 1.15 * (seed.step_s + seed.select_s + seed.final_s) > budget - (seed.now - seed.select_s)


def test_a_stop_at_an_evaluated_mark_evaluates_nothing_twice(bench):
    seed = _Seed(budget=6 * 40 + 100 + 1.15 * (40 + 100 + 200) - 1)
    assert _phase(bench, seed, [6, 12]) == 6
    assert [c for c in seed.calls if c[0] == "select"] == [("select", 6)]


def test_without_early_stopping_a_stopped_grpo_evaluates_no_select_stage(bench):
    seed = _Seed(budget=500.0)
    stopped = _phase(bench, seed, [12], select=False)
    assert stopped is not None and stopped < 12
    assert not seed.selected and seed.now + seed.final_s <= 500.0


def test_no_time_even_for_one_step_keeps_sfts_agents(bench):
    seed = _Seed(budget=250.0)  # less than the final evaluation with its margin
    assert _phase(bench, seed, [6, 12]) == 0
    assert seed.calls == []


def test_the_aggregate_reports_seeds_stopped_by_the_budget(bench, tmp_path):
    stages = {"base": [(False, False, 0.0, -0.1)], "sft": [(True, True, 1.0, 0.5)],
              "grpo": [(True, True, 1.0, 0.5)]}
    seeds = [_seed(bench, s, stages) for s in (0, 1)]
    seeds[1]["grpo_budget_stop"] = 9
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["grpo_budget_stop"] == [None, 9]
    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    assert "--time-budget at step, per seed [None, 9]" in (tmp_path / "results.md").read_text()
    assert "grpo_budget_stop" not in bench.aggregate(seeds[:1], compile_only=False)


def test_select_problems_are_a_fixed_sample_that_refuses_held_out_problems(bench):
    from multiminddev.tasks.loaders import load_problems

    heldout = load_problems("builtin:tier0:heldout")
    assert bench.select_problems("", 4, heldout) == []
    spec = "builtin:tier0,tier1:train:resized2from12"
    first, again = (bench.select_problems(spec, 5, heldout) for _ in range(2))
    assert len(first) == 5 and [p.name for p in first] == [p.name for p in again]
    assert not {p.name for p in first} & {p.name for p in heldout}
    with pytest.raises(SystemExit, match="are held out"):
        bench.select_problems("builtin:tier0:heldout", 3, heldout)


def test_select_also_joins_a_second_fixed_sample_once(bench):
    from multiminddev.tasks.loaders import load_problems

    heldout = load_problems("builtin:tier0,tier1:heldout")
    spec = "builtin:tier0,tier1:train:resized2from12"
    families = "builtin:tier1:train:resized2from12:cumsum:transpose:matvec:argmax_dim"
    first = bench.select_problems(spec, 12, heldout)
    joined = bench.select_problems(spec, 12, heldout, families, 6)
    also = bench.select_problems(families, 6, heldout)
    names = [p.name for p in joined]
    # the first sample is the one a run without --select-also draws, so their select@ agree
    assert {p.name for p in first} <= set(names)
    assert set(names) == {p.name for p in first} | {p.name for p in also}
    assert len(names) == len(set(names)) == 12 + 6 - len({p.name for p in first}
                                                          & {p.name for p in also})
    assert names == sorted(names)
    assert names == [p.name for p in bench.select_problems(spec, 12, heldout, families, 6)]
    with pytest.raises(SystemExit, match="are held out"):
        bench.select_problems(spec, 12, heldout, "builtin:tier1:heldout", 2)
    # problems SFT or GRPO trained on are left out of both samples
    trained = load_problems("builtin:tier1:train:resized8from4:cumsum:transpose:matvec:argmax_dim")
    assert {p.name for p in first} & {p.name for p in trained}  # transpose_4095x3001
    unseen = bench.select_problems(spec, 12, heldout, families, 8, trained)
    assert len(unseen) == 20 and not {p.name for p in unseen} & {p.name for p in trained}
    alone = bench.select_problems(spec, 18, heldout, trained=trained)
    assert len(alone) == 18 and not {p.name for p in alone} & {p.name for p in trained}
    with pytest.raises(SystemExit, match="--select-also .* every problem of it is trained on"):
        bench.select_problems(spec, 12, heldout, families, 2, load_problems(families))
    with pytest.raises(SystemExit, match="--select-problems .* every problem of it is trained on"):
        bench.select_problems(families, 2, heldout, trained=load_problems(families))


def test_a_stage_measured_on_other_problems_is_not_reused(bench):
    from multiminddev.tasks.loaders import load_problems

    problems = load_problems("builtin:tier0:train")[:3]
    rows = [{"problem": p.name} for p in reversed(problems)]
    assert bench.measured_on(rows, problems)
    assert not bench.measured_on(rows[:2], problems)
    assert not bench.measured_on(rows, problems[:2])
    # SFT's agents are saved and can be measured again; a GRPO step's are gone
    assert all(bench.stage_agents_at_hand(s) for s in ("base", "sft", "train_sft", "select@0"))
    assert not any(bench.stage_agents_at_hand(s)
                   for s in ("select@6", "grpo", "train_grpo", "grpo@4"))


def test_a_resumed_seed_stops_when_its_grpo_stages_were_measured_on_other_problems(bench,
                                                                                   tmp_path):
    from multiminddev.tasks.loaders import load_problems

    heldout, train_eval, select = (load_problems("builtin:tier0:train")[i:i + 2]
                                   for i in (0, 2, 4))

    def rows(stages):
        return {st: [{"problem": p.name} for p in ps] for st, ps in stages.items()}

    same = {"sft": heldout, "grpo": heldout, "train_grpo": train_eval, "select@0": select,
            "select@6": select}
    bench.check_gone_stages_problems(rows(same), heldout, train_eval, select, tmp_path)
    # SFT's stages on other problems are measured again, not refused
    bench.check_gone_stages_problems(rows({**same, "select@0": heldout, "sft": select}),
                                     heldout, train_eval, select, tmp_path)
    # a rerun without the train_* or select@ sample leaves those rows alone
    bench.check_gone_stages_problems(rows({**same, "select@6": heldout, "train_grpo": select}),
                                     heldout, [], [], tmp_path)
    for stage, other in (("select@6", heldout), ("grpo", select), ("train_grpo", heldout)):
        with pytest.raises(SystemExit, match=f"stage {stage} was measured on other problems"):
            bench.check_gone_stages_problems(rows({**same, stage: other}), heldout,
                                             train_eval, select, tmp_path)


def test_select_options_are_checked_before_any_model_loads(bench):
    args = bench.parse_args(["--select-problems", "builtin:tier0:train:resized2from12"])
    assert (args.select_count, args.select_every) == (16, 4)
    assert bench.parse_args([]).select_problems == ""
    for bad in (["--select-count", "0"], ["--select-every", "0"], ["--sft-full-finetune"],
                ["--select-also", "builtin:tier1:train", "--select-also-count", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--select-problems", "builtin:tier0:train", *bad])
    with pytest.raises(SystemExit, match="give both"):
        bench.parse_args(["--select-also", "builtin:tier1:train"])


def test_one_seed_has_no_spread_and_results_say_so(bench, tmp_path):
    stages = {"base": [(False, False, 0.0, -0.1)], "sft": [(True, True, 1.0, 0.5)],
              "grpo": [(True, True, 1.2, 0.6)]}
    summary = bench.aggregate([_seed(bench, 0, stages)], compile_only=False)
    assert summary["gain/reward_mean"]["exceeds_spread"] is False  # one seed meets no target
    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    text = (tmp_path / "results.md").read_text()
    assert "- GRPO - SFT reward_mean: +0.100 (one seed: no spread" in text
    assert "std over seeds inf" not in text


def test_the_aggregate_names_the_chosen_steps(bench, tmp_path):
    stages = {"base": [(False, False, 0.0, -0.1)], "sft": [(True, True, 1.0, 0.5)],
              "grpo": [(True, True, 1.2, 0.6)]}
    seeds = [_seed(bench, s, {**stages, "select@0": [(True, True, 1.0, 0.4)],
                              "select@4": [(True, True, 1.0, 0.4 + 0.1 * (s - 1))]})
             for s in (0, 1, 2)]
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["select"]["chosen_step"] == [0, 0, 4]
    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    assert "per seed [0, 0, 4]" in (tmp_path / "results.md").read_text()
    assert "select" not in bench.aggregate([_seed(bench, 0, stages)], compile_only=False)


def test_sft_agents_kept_by_early_stopping_reuse_sfts_evaluation(bench, tmp_path):
    """Step 0 chosen: grpo and train_grpo take SFT's rows and episodes, measured stages stay."""
    rows = {"sft": [_row(True, True, 1.5, 0.7)], "train_sft": [_row(True, False, 0.0, 0.1)]}
    (tmp_path / "episodes_sft.jsonl").write_text('{"problem": {"name": "p"}}\n')
    assert bench.reuse_sft_evaluation(rows, tmp_path) == ["grpo", "train_grpo"]
    assert rows["grpo"] == rows["sft"] and rows["train_grpo"] == rows["train_sft"]
    assert rows["grpo"] is not rows["sft"]  # a copy: a later edit of one leaves the other
    assert (tmp_path / "episodes_grpo.jsonl").read_text() == '{"problem": {"name": "p"}}\n'
    assert not (tmp_path / "episodes_train_grpo.jsonl").exists()  # there was none to copy
    rows["grpo"] = [_row(False, False, 0.0, -0.1)]  # measured before a resume: kept
    assert bench.reuse_sft_evaluation(rows, tmp_path) == []
    assert rows["grpo"][0]["reward"] == -0.1


def test_the_aggregate_names_the_seeds_that_reused_sfts_evaluation(bench, tmp_path):
    stages = {"base": [(False, False, 0.0, -0.1)], "sft": [(True, True, 1.0, 0.5)],
              "grpo": [(True, True, 1.0, 0.5)], "select@0": [(True, True, 1.0, 0.4)]}
    seeds = [_seed(bench, s, stages) for s in (0, 1)]
    seeds[1]["select"] = {"reused_sft_evaluation": ["grpo"]}
    summary = bench.aggregate(seeds, compile_only=False)
    assert summary["select"]["reused_sft_evaluation"] == [[], ["grpo"]]
    bench.write_markdown(summary, bench.targets(summary), tmp_path / "results.md", "cpu")
    assert "Seeds [1] kept SFT's agents" in (tmp_path / "results.md").read_text()


def test_the_chosen_steps_adapters_go_back_into_the_policy(bench, tmp_path):
    """A tiny real LoRA policy: keep_if_best saves a new best step's adapters (not a worse
    step's, not the last step's), and the chosen step's (or SFT's, step 0) are the ones loaded;
    a select_best folder of another step is refused."""
    import torch

    from multiminddev.agents.roles import AgentRole
    from multiminddev.train import checkpoints as ck
    from tests.policy.helpers import tiny_policy

    policy = tiny_policy()
    roles = (AgentRole.GENERATOR,)

    def generator_lora():
        return {n: p.detach().clone() for n, p in policy.peft_model.named_parameters()
                if ".generator." in n and "lora_" in n}

    def perturb():
        with torch.no_grad():
            for n, p in policy.peft_model.named_parameters():
                if ".generator." in n and "lora_" in n:
                    p.add_(0.25)

    ck.save_agents(policy, roles, tmp_path / "sft_checkpoints")
    at_sft = generator_lora()
    assert at_sft  # the comparisons below are over real LoRA weights
    perturb()
    rows = {"select@0": [_row(True, True, 1.0, 0.2)], "select@4": [_row(True, True, 1.0, 0.5)]}
    assert bench.keep_if_best(rows, 4, 12, policy, roles, tmp_path)
    at_step_4 = generator_lora()
    perturb()
    rows["select@8"] = [_row(True, True, 1.0, 0.4)]  # worse than step 4: not saved
    assert not bench.keep_if_best(rows, 8, 12, policy, roles, tmp_path)
    rows["select@12"] = [_row(True, True, 1.0, 0.9)]  # the last step: the trainer holds it
    assert not bench.keep_if_best(rows, 12, 12, policy, roles, tmp_path)
    assert (tmp_path / bench.SELECT_BEST_DIR / "step.txt").read_text() == "4\n"
    bench.load_chosen_agents(policy, 4, tmp_path / "sft_checkpoints", tmp_path, roles)
    assert all(torch.equal(generator_lora()[n], w) for n, w in at_step_4.items())
    bench.load_chosen_agents(policy, 0, tmp_path / "sft_checkpoints", tmp_path, roles)
    assert all(torch.equal(generator_lora()[n], w) for n, w in at_sft.items())
    with pytest.raises(RuntimeError, match="holds step 4's agents, not step 8's"):
        bench.load_chosen_agents(policy, 8, tmp_path / "sft_checkpoints", tmp_path, roles)


def test_rows_of_other_evaluation_settings_are_measured_again(bench, capsys):
    args = bench.parse_args([])
    here = bench.eval_settings(args, "NVIDIA H100 80GB HBM3")
    partial = {"rows": {"sft": [_row(True, True, 1.2, 0.7)]},
               "seconds": {"sft": 250.0, "eval_sft": 170.0}, "sft_recipe": {"steps": 150}}
    assert bench.drop_rows_of_other_settings(partial, here, "seed0") is partial  # no record
    same = {**partial, "eval_settings": dict(here)}
    assert bench.drop_rows_of_other_settings(same, here, "seed0") is same
    elsewhere = {**partial, "eval_settings": {**here, "device": "NVIDIA H200"}}
    kept = bench.drop_rows_of_other_settings(elsewhere, here, "seed0")
    assert kept["rows"] == {} and kept["seconds"] == {"sft": 250.0}  # SFT's own time stays
    assert kept["sft_recipe"] == {"steps": 150}
    assert "device 'NVIDIA H200' -> 'NVIDIA H100 80GB HBM3'" in capsys.readouterr().out
    two_turns = bench.eval_settings(bench.parse_args(["--eval-max-turns", "3"]), "cpu")
    assert two_turns["turns"] == 3 and bench.eval_settings(args, "cpu")["turns"] == args.max_turns


def test_saved_sft_agents_of_another_recipe_stop_the_run(bench, tmp_path):
    args = bench.parse_args(["--sft-steps", "300"])
    recipe = bench.sft_recipe(args)
    record = {"sft_recipe": recipe, "sft_problems": args.sft_problems}
    bench.check_sft_matches(record, recipe, args.sft_problems, tmp_path)  # the same: no error
    bench.check_sft_matches({}, recipe, args.sft_problems, tmp_path)  # no record: no error
    other = bench.sft_recipe(bench.parse_args(["--sft-steps", "300", "--sft-batch-size", "4",
                                               "--sft-grad-accum", "2"]))
    with pytest.raises(SystemExit, match="another --output-dir"):
        bench.check_sft_matches(record, other, args.sft_problems, tmp_path)
    with pytest.raises(SystemExit, match="builtin:tier0:train"):
        bench.check_sft_matches(record, recipe, "builtin:tier0:train", tmp_path)


def test_eval_samples_need_a_sampling_temperature(bench):
    assert bench.parse_args([]).eval_samples == 1
    args = bench.parse_args(["--eval-samples", "4", "--eval-temperature", "1.0"])
    assert (args.eval_samples, args.eval_temperature) == (4, 1.0)
    with pytest.raises(SystemExit, match="give --eval-temperature > 0"):
        bench.parse_args(["--eval-samples", "4"])  # greedy would repeat one reply 4 times
    with pytest.raises(SystemExit, match="--eval-samples 0"):
        bench.parse_args(["--eval-samples", "0", "--eval-temperature", "1.0"])


def test_sampled_evaluations_are_other_settings_and_the_note_says_how_they_decoded(bench):
    greedy = bench.parse_args([])
    sampled = bench.parse_args(["--eval-samples", "4", "--eval-temperature", "1.0"])
    # records written before the option (one greedy episode per problem) still match
    assert "samples" not in bench.eval_settings(greedy, "cpu")
    assert bench.eval_settings(sampled, "cpu")["samples"] == 4
    assert bench.eval_settings(sampled, "cpu") != bench.eval_settings(greedy, "cpu")
    assert bench.eval_decoding_note(greedy) == ""
    assert bench.eval_decoding_note(sampled) == ("; evaluations sampled at temperature 1, "
                                                 "4 episodes per problem")
    one = bench.parse_args(["--eval-temperature", "0.7"])
    assert bench.eval_decoding_note(one).endswith("0.7, 1 episode per problem")


def test_a_stage_of_k_samples_is_measured_on_k_episodes_of_each_problem(bench):
    from multiminddev.tasks.loaders import load_problems

    problems = load_problems("builtin:tier0:train")[:2]
    rows = [{"problem": p.name} for p in problems for _ in range(3)]
    assert bench.measured_on(rows, problems, samples=3)
    assert not bench.measured_on(rows, problems)  # one per problem was asked for
    assert not bench.measured_on(rows[:-1], problems, samples=3)  # a problem lacks one
    bench.check_gone_stages_problems({"grpo": rows}, problems, [], [], None, samples=3)
    with pytest.raises(SystemExit, match="stage grpo was measured on other problems"):
        bench.check_gone_stages_problems({"grpo": rows}, problems, [], [], None)


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


def test_the_element_type_line_reaches_every_sft_prompt_the_recipe_and_the_settings(bench):
    from multiminddev.agents.prompts import element_type_line
    from multiminddev.agents.roles import AgentRole
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.tasks.loaders import load_problems

    args = bench.parse_args(["--element-type-line"])
    assert args.element_type_line and bench.sft_recipe(args)["element_type_line"]
    assert bench.eval_settings(args, "cpu")["element_type_line"]
    # off, records from before the option compare equal (kept SFT agents, kept rows)
    assert "element_type_line" not in bench.sft_recipe(bench.parse_args([]))
    assert "element_type_line" not in bench.eval_settings(bench.parse_args([]), "cpu")
    relu = [p for p in load_problems("builtin:allshapes") if p.family == "relu"]
    problems = [next(p for p in relu if p.dtype == d) for d in ("float32", "float16")]

    def users(data):
        return [next(m["content"] for m in ms if m["role"] == "user") for ms in data["messages"]]

    for role in (AgentRole.GENERATOR, AgentRole.OPTIMIZER):
        for problem in problems:  # one problem at a time: the data is shuffled
            (plain,) = users(bench.sft_data(role, [problem], 0, ["naive"]))
            (lined,) = users(bench.sft_data(role, [problem], 0, ["naive"], element_type=True))
            assert "Element type" not in plain
            assert lined == f"{plain}\n{element_type_line(problem)}\n"
    with Evaluator(EvalConfig(num_workers=1, compile_baseline=False)) as evaluator:
        repaired = bench.sft_data(AgentRole.OPTIMIZER, problems[:1], 0, ["naive"],
                                  repair_evaluator=evaluator, repair_kinds=["misspelt_math"],
                                  element_type=True)
    line = element_type_line(problems[0])
    assert len(repaired["messages"]) == 2  # the naive -> fast pair and one repair pair
    assert all(u.endswith(f"\n{line}\n") for u in users(repaired))


def test_the_operation_line_reaches_both_roles_sft_replies_and_the_recipe(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.loaders import load_problems

    args = bench.parse_args(["--sft-operation-line"])
    assert args.sft_operation_line and bench.sft_recipe(args)["operation_line"]
    assert "operation_line" not in bench.sft_recipe(bench.parse_args([]))
    with pytest.raises(SystemExit, match="optimizer-repair"):
        bench.parse_args(["--sft-operation-line", "--optimizer-repair", "misspelt_math"])
    (problem,) = load_problems("builtin:relu:shapes1")
    for role in (AgentRole.GENERATOR, AgentRole.OPTIMIZER):
        (plain,) = bench.sft_data(role, [problem], 0, ["naive"])["messages"]
        (lined,) = bench.sft_data(role, [problem], 0, ["naive"], operation_line=True)["messages"]
        assert "// computes: torch.relu(x)\n" in lined[-1]["content"]
        assert "// computes:" not in plain[-1]["content"]


def test_a_sampled_evaluation_runs_k_episodes_of_each_problem(bench, tmp_path):
    """A tiny Llama and the compile-only evaluator: evaluate_stage through the real runner."""
    import collections

    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import HFGenerationBackend, SamplingParams
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.loaders import load_problems
    from tests.policy.helpers import tiny_policy

    problems = load_problems("builtin:tier0:train")[:2]
    policy = tiny_policy()
    with Evaluator(EvalConfig(num_workers=1)) as evaluator:
        trainer = GRPOTrainer(
            GRPOConfig(num_steps=1, problems_per_step=2, group_size=2, max_turns=1,
                       max_new_tokens=8, eval_every=0),
            policy=policy, backend=HFGenerationBackend(policy), evaluator=evaluator,
            curriculum=Curriculum.from_problems(problems),
            episode_config=EpisodeConfig(max_turns=1, element_type=True, sampling=SamplingParams(
                temperature=1.0, max_new_tokens=8)),
            output_dir=tmp_path, compile_only=True)
        rows = bench.evaluate_stage(trainer, problems, tmp_path / "episodes_sft.jsonl",
                                    samples=3)
    assert collections.Counter(r["problem"] for r in rows) == {p.name: 3 for p in problems}
    assert bench.measured_on(rows, problems, samples=3)
    saved = [json.loads(line) for line in (tmp_path / "episodes_sft.jsonl").read_text().splitlines()]
    assert len(saved) == 6
    # the episode config's prompts reached the agent: here with the element-type line
    assert all(e["turns"][0]["messages"][-1]["content"].endswith(
        "Floating-point tensors are `float*` in kernels (no `__half`).\n") for e in saved)


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


def test_aggregating_a_seed_with_a_failed_stage_exits_with_the_infra_code(bench, tmp_path,
                                                                            capsys):
    """A seed recorded before failed stages stopped the run (every grpo episode an
    infrastructure error) is never aggregated into a table."""
    infra = {**_row(False, False, 0.0, 0.0), "infra_error": True,
             "infra_message": "worker exited during startup (exit code 1)"}
    good = _row(True, True, 1.0, 0.5)
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "seed_result.json").write_text(json.dumps(
        {"seed": 0, "rows": {"sft": [good] * 2, "grpo": [infra] * 2}}))
    code = bench.main(["--output-dir", str(tmp_path), "--seeds", "0", "--aggregate-only"])
    assert code == bench.INFRA_EXIT_CODE
    error = capsys.readouterr().err
    assert "seed 0: stage grpo: 2 of 2 episodes" in error and "stage sft" not in error
    assert not (tmp_path / "results.json").exists()


def test_the_infra_share_is_checked_and_has_one_flag(bench):
    with pytest.raises(SystemExit, match="--max-infra-share 1.5"):
        bench.parse_args(["--max-infra-share", "1.5"])
    with pytest.raises(SystemExit, match="use --max-infra-share"):
        bench.parse_args(["--grpo-option", "max_infra_share=1"])


def test_a_changed_code_file_is_named(bench, tmp_path):
    path = tmp_path / "worker.py"
    path.write_text("x = 1\n")
    before = bench.code_fingerprint([path])
    assert bench.code_change_note(before) == ""
    path.write_text("x = 22\n")
    assert str(path) in bench.code_change_note(before)


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


def test_a_base_stage_of_a_failing_evaluator_is_not_shared(bench, tmp_path):
    infra = {**_row(False, False, 0.0, -0.1), "infra_error": True, "infra_message": "closed"}
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "partial.json").write_text(json.dumps(
        {"seed": 0, "rows": {"base": [infra, infra]}, "seconds": {"eval_base": 1.0}}))
    assert bench.base_rows_from_other_seeds(tmp_path, 1) is None


def test_mid_grpo_stages_are_those_of_steps_before_the_last(bench):
    assert [bench.is_mid_grpo_stage(s, 12) for s in
            ("select@4", "grpo@8", "select@0", "select@12", "grpo", "sft")] == [
        True, True, False, False, False, False]
