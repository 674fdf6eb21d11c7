"""Learning benchmark: base model vs SFT vs SFT+GRPO on held-out tier-0/1 problems.

For each seed: load the base model, evaluate it on the held-out problems (one episode per
problem), SFT the Generator and the Optimizer, evaluate, run GRPO, evaluate. Per stage it reports
the episode-level compile rate, correctness rate, mean reward and fast_1 (correct and faster than
eager PyTorch), as mean +- std over seeds and a bootstrap 95% interval over the pooled episodes,
and the per-seed GRPO - SFT gain with its spread. Results go to ``<out>/results.json``,
``<out>/results.md`` and plots ``<out>/learning.png`` and ``<out>/seed<k>/training.png``.

    python benchmarks/bench_learning.py --short            # ~8 min on one H100 (3 seeds)
    python benchmarks/bench_learning.py --seeds 0 1 2 --sft-steps 200 --rl-steps 40
    python benchmarks/bench_learning.py --sft-problems \
        builtin:tier0,tier1:train:allshapes+builtin:breadth   # more SFT data, same GRPO and eval
    python benchmarks/bench_learning.py --train-eval-problems same   # also on GRPO's own problems

``--train-eval-problems`` adds two evaluations of the same greedy kind on a fixed sample of
GRPO's training distribution (stages ``train_sft`` and ``train_grpo``, reported in a table of
their own and never in the targets): whether GRPO improves the problems it trains on tells a
generalisation limit apart from a policy that does not improve at all.

``--select-problems SPEC`` stops GRPO early: the agents after SFT (``select@0``) and every
``--select-every`` steps are evaluated on a fixed sample of problems that are not held out, and
the ``grpo`` stage is the best of them (SFT's own agents included), so a seed whose policy
drifts away from its held-out families reports the step before the drift.

Without a GPU kernels are only compiled (compile-only rewards); the numbers then say nothing
about correctness or speed, and the output says so. The issue's targets (SFT: compile >= 80%,
correct >= 60%; GRPO: reward and fast_1 above SFT by more than the spread) are checked and
printed, never assumed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = ("base", "sft", "grpo")  # held-out stages: the targets, plots and main table
# The same agents as "sft" and "grpo", evaluated on a fixed sample of GRPO's training problems
# (--train-eval-problems); reported apart, since these problems are not held out.
TRAIN_STAGES = ("train_sft", "train_grpo")
TRAIN_GAIN_METRICS = ("reward_mean", "correct_rate", "fast_1")
BASE_DIR = "base"  # where --base-only keeps its partial.json
METRICS = ("compile_rate", "correct_rate", "reward_mean", "fast_1")
INFRA_EXIT_CODE = 3  # a stage mostly failed on the evaluator's side (--max-infra-share)
SCRIPT = Path(__file__).resolve()


@dataclass(kw_only=True)
class BenchArgs:
    model: str
    seeds: list[int]
    train_problems: str
    heldout_problems: str
    sft_problems: str  # SFT data only; GRPO's curriculum is train_problems
    eval_problems: int
    sft_steps: int
    sft_batch_size: int
    sft_grad_accum: int
    sft_max_seq_length: int
    rl_steps: int
    problems_per_step: int
    group_size: int
    max_turns: int
    eval_max_turns: int | None  # held-out episodes' turns; None: max_turns
    max_new_tokens: int
    eval_temperature: float
    eval_workers: int
    output_dir: Path
    generator_variants: list[str]
    max_batch_size: int = 64
    # episodes per problem in every evaluation stage, sampled at eval_temperature (> 0): the
    # mean reward of the sampling policy, which is what GRPO optimises, where greedy decoding
    # measures one reply per problem
    eval_samples: int = 1
    generator_max_new_tokens: int = 0  # 0: --max-new-tokens
    rl_learning_rate: float = 2e-5
    kl_reference: str = "base"
    rl_temperature: float = 1.0  # GRPO's rollout sampling temperature
    # roles GRPO does not train that decode greedily in its rollouts (EpisodeConfig.
    # temperature_by_role): with the Generator greedy, a group's episodes hand the Optimizer
    # the same kernel, so the group's reward differences are the Optimizer's own
    rl_greedy_roles: list[str] = dataclasses.field(default_factory=list)
    # GRPO's curriculum: the tier it starts on (None: the first) and the share of each batch
    # drawn from earlier tiers; start on tier 1 with 0.5 to train both tiers from the first step
    curriculum_start_tier: int | None = None
    review_fraction: float = 0.2  # CurriculumConfig's default
    # CurriculumConfig.family_sampling / family_floor: within a tier, draw families by p(1-p) of
    # their recent pass rate ("signal") rather than every problem alike ("uniform")
    family_sampling: str = "uniform"
    family_floor: float = 0.02
    # a JSON file of each family's (correct, total) episodes from an earlier run
    # (analyze_rollouts.py --family-counts-out) that the family windows start from
    family_warm_start: Path | None = None
    mini_batch_size: int = 8  # GRPOConfig's: turns per optimizer step
    grad_accum: int = 1  # GRPOConfig's: micro-batches per optimizer step (memory, not maths)
    sft_anchor: float = 0.0  # GRPOConfig.sft_coef: SFT's loss on the SFT data in each GRPO step
    # the anchor's problems (None: the SFT problems); e.g. sizes SFT never showed, where its
    # loss is not already ~0 and drift on new sizes shows (docs/training.md, SFT anchor)
    sft_anchor_problems: str | None = None
    # any other GRPOConfig field, as given by --grpo-option KEY=VALUE (e.g. DAPO's clip_high=0.28
    # and filter_zero_variance=true, Dr.GRPO's normalize_std=false)
    grpo_options: list[str] = dataclasses.field(default_factory=list)
    # the agents GRPO updates (SFT always trains both); "optimizer" alone keeps the Generator at
    # its SFT checkpoint, so greedy held-out first turns stay SFT's
    grpo_roles: list[str] = dataclasses.field(default_factory=lambda: ["generator", "optimizer"])
    grpo_eval_every: int = 0  # also evaluate held-out after every K GRPO steps ("grpo@K")
    compiled_decoding: bool = False
    # held-out evaluations' decoding (None: as --compiled-decoding). Eager decoding keeps a
    # frozen agent's greedy replies identical from one evaluation to the next; compiled decoding
    # changed 2-3 of 39 of them, a floor under every per-seed delta (docs/training.md).
    eval_compiled_decoding: bool | None = None
    # held-out evaluations' arithmetic: "float32" decodes from a float32 copy of the merged
    # weights (Policy.sampling_model); eager bf16 decoding still changed a frozen Generator's
    # greedy replies on 2-4 of 39 problems between evaluations (docs/training.md)
    eval_dtype: str = "same"
    skip_base: bool = False
    base_only: bool = False
    aggregate_only: bool = False
    aggregate_partial: bool = False
    sft_only: bool = False  # stop after SFT's held-out evaluation (an SFT-data comparison)
    sft_learning_rate: float = 2e-4  # SFTConfig's default
    lora_rank: int = 16  # PolicyConfig's default; alpha is twice the rank, as there
    sft_full_finetune: bool = False  # one full model per agent instead of LoRA adapters
    optimizer_repair: list[str] | None = None  # repair-pair kinds for the Optimizer's SFT data
    optimizer_repair_reply: str = "naive"  # the repair pairs' reply: the naive or fast kernel
    optimizer_repair_per_family: int = 0  # at most this many pairs per family and defect (0: all)
    sft_strip_comments: bool = False  # the Optimizer's SFT replies without whole-line comments
    # every prompt (SFT data, GRPO, evaluations) ends with the line naming the pointer type of
    # the problem's dtype (agents.prompts.element_type_line)
    element_type_line: bool = False
    # SFT replies (both agents') start their CUDA source with the problem's operation, copied
    # from its forward (tasks.sft_data.with_operation_line)
    sft_operation_line: bool = False
    repeat_penalty: float = 0.0  # GRPO's RewardConfig.repeat_penalty (held-out rewards omit it)
    # problems of GRPO's training distribution that SFT and GRPO are also evaluated on (stages
    # "train_sft", "train_grpo"); "": no such evaluation. parse_args resolves "same".
    train_eval_problems: str = ""
    train_eval_count: int = 12  # how many of them, one fixed sample for every seed
    # early stopping on problems that are neither held out nor trained on: the select@K
    # evaluations after SFT (K=0) and every select_every GRPO steps; the final "grpo" agents are
    # those of the best K (a Generator can drift onto another family's template on held-out
    # problems while its training reward rises; docs/training.md, "Early stopping")
    select_problems: str = ""
    select_count: int = 16
    # a second sample joined to the first, e.g. GRPO's own families at sizes nobody trained on
    # beside the first's families it may drift on
    select_also: str = ""
    select_also_count: int = 6
    select_every: int = 4
    # a later select@K replaces the step chosen so far only when its mean select@ reward is
    # higher by more than this: a step has beaten SFT's agents by 0.0002 with every Generator
    # reply unchanged, timing noise that costs a held-out evaluation and the seed its time; one
    # problem solved more is worth 0.03-0.07
    select_min_gain: float = 0.01
    # seconds from the seed's start by which its GRPO must leave time for the evaluations after
    # it (0: no limit): GRPO stops early, at the last step whose select@ and final held-out
    # evaluations still fit, rather than a driver's time limit cutting the seed mid-evaluation
    time_budget: float = 0.0
    # a stage (an evaluation, or a GRPO step's rollout) in which more than this share of the
    # episodes ended in an infrastructure error stops the run with an error naming the causes
    # instead of reporting figures of a broken evaluator (GRPOConfig.max_infra_share; 1: never)
    max_infra_share: float = 0.5


def parse_args(argv: list[str] | None = None) -> BenchArgs:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--train-problems", default="builtin:tier0,tier1:train")
    p.add_argument("--heldout-problems", default="builtin:tier0,tier1:heldout")
    p.add_argument("--sft-problems", default=None,
                   help="problems whose reference solutions make the SFT data (default: "
                        "--train-problems); GRPO still draws from --train-problems. E.g. "
                        "builtin:tier0,tier1:train:allshapes+builtin:breadth")
    p.add_argument("--eval-problems", type=int, default=39, help="held-out problems per evaluation")
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--sft-batch-size", type=int, default=8,
                   help="SFT examples per micro-batch (SFTConfig.batch_size)")
    p.add_argument("--sft-grad-accum", type=int, default=1,
                   help="SFT micro-batches per optimizer step (SFTConfig.grad_accum): "
                        "--sft-batch-size 4 --sft-grad-accum 2 takes steps of 8 examples with "
                        "half the memory (SFT's full-vocabulary logits, about 3 GiB per copy at "
                        "8 x 2048 tokens, filled an 80 GiB card with three seeds)")
    p.add_argument("--sft-max-seq-length", type=int, default=2048,
                   help="SFT's example length (SFTConfig.max_seq_length); longer examples lose "
                        "their reply's end. 25 of RESIZED_MIX's 246 Optimizer examples with "
                        "--sft-strip-comments are longer than 2048, up to 2091")
    p.add_argument("--sft-learning-rate", type=float, default=2e-4,
                   help="SFT's learning rate (SFTConfig.learning_rate; for --sft-full-finetune "
                        "something like 2e-5)")
    p.add_argument("--lora-rank", type=int, default=16,
                   help="the agents' LoRA rank (PolicyConfig.lora_rank), alpha twice the rank")
    p.add_argument("--sft-full-finetune", action="store_true",
                   help="fine-tune one full copy of the model per agent (separate models) "
                        "instead of LoRA adapters; GRPO then trains those copies")
    from multiminddev.train.repair_data import KINDS as REPAIR_KINDS

    p.add_argument("--sft-strip-comments", action="store_true",
                   help="train the Optimizer on fast solutions without their whole-line comments "
                        "(tasks.sft_data.strip_comment_lines): its held-out rewrites went astray "
                        "in comment prose (docs/training.md)")
    p.add_argument("--element-type-line", action="store_true",
                   help="end every prompt of both agents (SFT data, GRPO rollouts, evaluations) "
                        "with a line naming the pointer type of the problem's dtype (`float*`, "
                        "`__half*`; agents.prompts.element_type_line): the Generator wrote float "
                        "kernels for float16 problems and __half ones for float32 problems "
                        "(docs/training.md). SFT agents kept from a run without it "
                        "do not fit these prompts, and the run refuses them")
    p.add_argument("--sft-operation-line", action="store_true",
                   help="SFT replies of both agents start their CUDA source with a comment "
                        "restating the problem's operation, copied from its forward "
                        "(`// computes: torch.cumsum(x, dim=1)`; tasks.sft_data."
                        "with_operation_line), so the Generator's template choice follows the "
                        "operation: GRPO moved it onto the element-wise template on other "
                        "families at the one token that chooses it (docs/training.md)")
    p.add_argument("--optimizer-repair", nargs="*", default=None, metavar="KIND",
                   choices=REPAIR_KINDS,
                   help="add repair pairs to the Optimizer's SFT data: a broken kernel, the "
                        "Tester's real report on it, and the correct kernel; KINDs from "
                        "multiminddev.train.repair_data.KINDS (misspelt_math, "
                        "undeclared_variable, float16_kernel, float32_kernel, wrong_operation; "
                        "the last two need a GPU to be reported), none given: all")
    p.add_argument("--optimizer-repair-reply", choices=["naive", "fast"], default="naive",
                   help="the repair pairs' reply: the problem's naive kernel, or its fast one "
                        "where the corpus has one (comment-free with --sft-strip-comments)")
    p.add_argument("--optimizer-repair-per-family", type=int, default=0, metavar="N",
                   help="at most N repair pairs per family and defect (0: one per problem); "
                        "each pair costs an evaluation on the GPU before SFT")
    p.add_argument("--repeat-penalty", type=float, default=0.0,
                   help="GRPO's reward loses this for a turn that resubmits a kernel of an "
                        "earlier turn unchanged (RewardConfig.repeat_penalty); held-out rewards "
                        "are scored without it, so runs stay comparable")
    p.add_argument("--rl-steps", type=int, default=20)
    p.add_argument("--kl-reference", choices=["base", "start"], default="base",
                   help="GRPO's KL reference: the pre-trained base or the SFT agents")
    p.add_argument("--rl-learning-rate", type=float, default=2e-5,
                   help="GRPO's learning rate for the adapters (GRPOConfig.learning_rate)")
    p.add_argument("--rl-temperature", type=float, default=1.0,
                   help="GRPO's rollout sampling temperature (GRPOConfig.temperature); the "
                        "held-out evaluations stay greedy (--eval-temperature)")
    p.add_argument("--curriculum-start-tier", type=int, default=None, metavar="TIER",
                   help="the GRPO curriculum's first tier (CurriculumConfig.start_tier); earlier "
                        "tiers are then drawn as review. Default: the lowest tier. With 8 steps "
                        "the default curriculum never left tier 0")
    p.add_argument("--mini-batch-size", type=int, default=8,
                   help="agent turns per GRPO optimizer step (GRPOConfig.mini_batch_size); with "
                        "Adam every step moves each weight by about the learning rate, so fewer, "
                        "larger steps move the policy less on noisy gradients")
    p.add_argument("--sft-anchor", type=float, default=0.0, metavar="COEF",
                   help="GRPOConfig.sft_coef: each GRPO optimizer step also takes SFT's loss on "
                        "4 of the agent's SFT examples (the SFT data, without repair pairs), "
                        "times COEF; 0: off")
    p.add_argument("--grpo-option", dest="grpo_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="set a GRPOConfig field this script has no flag for, e.g. clip_high=0.28, "
                        "filter_zero_variance=true, normalize_std=false, kl_coef=0.05, "
                        "ppo_epochs=2, advantage=leave_one_out (repeatable)")
    p.add_argument("--sft-anchor-problems", default=None, metavar="SPEC",
                   help="problems whose reference solutions make the SFT anchor's examples "
                        "(default: --sft-problems). SFT's loss on its own data stayed at "
                        "0.002-0.008 through GRPO (docs/training.md): sizes it never showed, "
                        "e.g. builtin:tier0,tier1:train:resized4from12, may show the drift")
    p.add_argument("--grpo-roles", nargs="+", choices=["generator", "optimizer"],
                   default=["generator", "optimizer"],
                   help="the agents GRPO updates (SFT trains both). With optimizer alone the "
                        "Generator stays at its SFT checkpoint: GRPO after SFT lost held-out "
                        "problems through the Generator's first turn (docs/training.md)")
    p.add_argument("--rl-greedy-roles", nargs="+", choices=["generator", "optimizer"],
                   default=[], metavar="ROLE",
                   help="agents GRPO does not train (not in --grpo-roles) that decode greedily "
                        "in its rollouts. With --grpo-roles optimizer --rl-greedy-roles "
                        "generator, every episode of a group hands the Optimizer the same "
                        "first kernel")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per optimizer step (GRPOConfig.grad_accum), for memory")
    p.add_argument("--review-fraction", type=float, default=0.2,
                   help="share of each GRPO batch drawn from tiers before the current one "
                        "(CurriculumConfig.review_fraction)")
    p.add_argument("--family-sampling", choices=["uniform", "signal"], default="uniform",
                   help="how GRPO draws a tier's problems: every problem alike (uniform), or a "
                        "family first, weighted by p(1-p) of its recent pass rate p (signal): "
                        "solved families give tied groups, which made 28%% of the rollouts in a "
                        "12-step run (CurriculumConfig.family_sampling)")
    p.add_argument("--family-floor", type=float, default=0.02,
                   help="least weight of a family under --family-sampling signal (p(1-p) is at "
                        "most 0.25), so solved families still come up and keep their KL term")
    p.add_argument("--family-warm-start", type=Path, default=None, metavar="FILE",
                   help="with --family-sampling signal: start each family's window from an "
                        "earlier run's counts (analyze_rollouts.py --family-counts-out), so the "
                        "weights hold from the first draw; from empty windows every family "
                        "starts at 0.25 and in 12 steps hardly moved")
    p.add_argument("--grpo-eval-every", type=int, default=0, metavar="K",
                   help="also evaluate the held-out set after every K GRPO steps (stages "
                        "'grpo@K' in partial.json), so a run cut before its end still compares "
                        "GRPO with SFT (--aggregate-partial); 0: only after the last step")
    p.add_argument("--aggregate-partial", action="store_true",
                   help="run nothing; aggregate the stages every seed has in its partial.json "
                        "(a run cut before its end), intermediate GRPO stages included")
    p.add_argument("--sft-only", action="store_true",
                   help="stop each seed after SFT and its held-out evaluation, then aggregate "
                        "what every seed reached (as --aggregate-partial): compares SFT data "
                        "mixes at a third of the time; a later run without it goes on to GRPO "
                        "from the saved SFT adapters")
    p.add_argument("--compiled-decoding", choices=["off", "on"], default="off",
                   help="decode with a static KV cache and a compiled step "
                        "(PolicyConfig.compiled_decoding; CUDA only)")
    p.add_argument("--eval-compiled-decoding", choices=["same", "off", "on"], default="same",
                   help="held-out evaluations' decoding; 'same': as --compiled-decoding, 'off': "
                        "eager, so an agent GRPO does not train answers every evaluation alike")
    p.add_argument("--eval-dtype", choices=["same", "float32"], default="same",
                   help="held-out evaluations' arithmetic; 'float32': decode from a float32 copy "
                        "of the merged weights, so near-ties do not flip greedy replies from one "
                        "evaluation to the next (needs merged sampling, the default for LoRA)")
    p.add_argument("--problems-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--eval-max-turns", type=int, default=None,
                   help="turns of the held-out episodes (default: --max-turns); each row "
                        "records the turn that first compiled and first passed, so fewer "
                        "turns' rates can be read from the same episodes")
    p.add_argument("--max-new-tokens", type=int, default=768)
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--eval-samples", type=int, default=1, metavar="K",
                   help="episodes per problem in every evaluation stage (held-out, train_*, "
                        "select@), sampled at --eval-temperature, which must then be > 0: "
                        "a stage's rates are then the sampling policy's expected ones, the "
                        "quantity GRPO raises, rather than those of one greedy reply per "
                        "problem. Each evaluation takes up to K times as many kernel "
                        "evaluations (identical kernels of a problem are evaluated once)")
    p.add_argument("--eval-workers", type=int, default=2)
    p.add_argument("--output-dir", type=Path, default=Path("runs/bench_learning"))
    p.add_argument("--generator-variants", nargs="+", choices=["naive", "fast"], default=["naive"],
                   help="which corpus solutions the Generator learns; naive only by default: "
                        "'correct first', one target per prompt and half the reply length "
                        "(the fast variants are the Optimizer's targets)")
    p.add_argument("--max-batch-size", type=int, default=64,
                   help="sequences decoded together; decoding a small model costs about the "
                        "same per step at any batch size, so whole stages go in one batch")
    p.add_argument("--generator-max-new-tokens", type=int, default=0,
                   help="the Generator's own cap (its first kernel is short; a batch decodes "
                        "until its longest reply ends); 0: --max-new-tokens")
    p.add_argument("--base-only", action="store_true",
                   help="evaluate the base model only (into <out>/base/), for seeds "
                        "run in parallel with --skip-base")
    p.add_argument("--skip-base", action="store_true",
                   help="do not evaluate the base model in this process; with greedy evaluation "
                        "the base stage is seed-independent and is borrowed from a seed that "
                        "measured it (seeds run in parallel processes)")
    p.add_argument("--short", action="store_true",
                   help="the lead's short version: ~8 min on one H100")
    p.add_argument("--aggregate-only", action="store_true",
                   help="run nothing; aggregate the seeds already finished in --output-dir "
                        "(e.g. seeds run on separate machines)")
    p.add_argument("--train-eval-problems", default="", metavar="SPEC",
                   help="also evaluate the SFT and the GRPO agents (stages train_sft, train_grpo) "
                        "on a fixed sample of these problems, e.g. 'same': --train-problems, "
                        "GRPO's own; reported in a table of their own, not held out. Whether GRPO "
                        "improves its training problems tells a generalisation limit from no "
                        "improvement at all. Default: off")
    p.add_argument("--train-eval-count", type=int, default=None, metavar="N",
                   help="problems in that sample, drawn once with a fixed RNG so every seed and "
                        "both stages see the same ones (default 12; 1 with --cpu-smoke)")
    p.add_argument("--select-problems", default="", metavar="SPEC",
                   help="choose GRPO's final agents by their greedy reward on a fixed sample of "
                        "these problems (stages select@K), measured after SFT (K=0) and every "
                        "--select-every GRPO steps: early stopping. They must not be held out; "
                        "the sample leaves out problems SFT or GRPO trains on, so sizes no "
                        "training saw suit, e.g. builtin:tier0,tier1:train:resized2from12. "
                        "Default: off (the last step's agents)")
    p.add_argument("--select-count", type=int, default=16, metavar="N",
                   help="problems in that sample (fixed RNG, as --train-eval-count's)")
    p.add_argument("--select-also", default="", metavar="SPEC",
                   help="a second fixed sample joined to --select-problems' (duplicates once), "
                        "drawn the same way from SPEC's problems (like the first, only those "
                        "that neither SFT nor GRPO trains on), so that early stopping sees two kinds of problems in set "
                        "proportions: e.g. GRPO's own families at sizes nobody trained on (where "
                        "its learning shows) beside the others (where drift shows)")
    p.add_argument("--select-also-count", type=int, default=6, metavar="N",
                   help="problems in that second sample")
    p.add_argument("--select-every", type=int, default=4, metavar="K",
                   help="GRPO steps between select@K evaluations (and after the last)")
    p.add_argument("--select-min-gain", type=float, default=0.01, metavar="R",
                   help="a later select@K is chosen over the step chosen so far only when its "
                        "mean select@ reward is higher by more than R (default 0.01: more than "
                        "timing noise, less than one problem solved more); 0: any gain")
    p.add_argument("--time-budget", type=float, default=0.0, metavar="SECONDS",
                   help="the seed's time from its start: GRPO stops early at the last step whose "
                        "select@ and held-out evaluations still fit (estimated from the SFT and "
                        "select@0 evaluations and the measured GRPO steps, with 15%% margin), so "
                        "a seed cut by a driver's limit still measures its grpo stage. Set it "
                        "somewhat below that limit (process start and model load come first). "
                        "Default 0: none")
    p.add_argument("--max-infra-share", type=float, default=0.5, metavar="SHARE",
                   help="a stage (held-out, select@ or train_* evaluation, GRPO rollout) in which "
                        "more than this share of the episodes ended in an infrastructure error "
                        "(the evaluation failed on our side) stops the run with exit code "
                        f"{INFRA_EXIT_CODE} and the evaluator's messages, its figures unrecorded "
                        "(default 0.5; 1: never)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="a minutes-long CPU smoke test of the script itself (meaningless numbers)")
    a = p.parse_args(argv)
    if a.short:
        a.sft_steps, a.rl_steps, a.eval_problems = 40, 4, 12
        a.problems_per_step, a.group_size, a.max_new_tokens = 4, 4, 512
    if a.cpu_smoke:
        a.seeds, a.sft_steps, a.sft_batch_size = a.seeds[:2], 1, 1
        a.rl_steps = 2 if a.grpo_eval_every else 1  # with a pause, so the smoke test covers it
        a.eval_problems, a.problems_per_step, a.group_size = 1, 1, 2
        a.max_turns, a.max_new_tokens = 1, 16
        a.train_problems, a.heldout_problems = "builtin:tier0:train", "builtin:tier0:heldout"
    if a.sft_problems is None:  # resolved here, so results.json records the spec used
        a.sft_problems = a.train_problems
    if a.train_eval_problems == "same":  # after --cpu-smoke, which changes --train-problems
        a.train_eval_problems = a.train_problems
    if a.train_eval_count is None:
        a.train_eval_count = 1 if a.cpu_smoke else 12
    if a.train_eval_count < 1:
        raise SystemExit(f"--train-eval-count {a.train_eval_count}: the sample needs at least "
                         "one problem; leave --train-eval-problems out to skip it")
    a.compiled_decoding = a.compiled_decoding == "on"
    a.eval_compiled_decoding = {"same": None, "on": True, "off": False}[a.eval_compiled_decoding]
    grpo_overrides(a.grpo_options)  # a bad option stops the run here, before any model loads
    if set(a.rl_greedy_roles) & set(a.grpo_roles):
        raise SystemExit(f"--rl-greedy-roles {' '.join(a.rl_greedy_roles)}: GRPO trains "
                         f"{' '.join(a.grpo_roles)} on sampled turns (--rl-temperature); "
                         "only an agent it does not train can decode greedily")
    if a.eval_dtype != "same" and a.sft_full_finetune:
        raise SystemExit("--eval-dtype needs LoRA adapters (it decodes from a cast copy of the "
                         "merged weights); with --sft-full-finetune use --eval-dtype same")
    if a.eval_samples < 1:
        raise SystemExit(f"--eval-samples {a.eval_samples}: use 1 (one episode per problem) "
                         "or more")
    if a.eval_samples > 1 and a.eval_temperature <= 0:
        raise SystemExit(f"--eval-samples {a.eval_samples} samples each problem that many "
                         "times, and greedy decoding repeats one reply: give --eval-temperature "
                         "> 0 too, e.g. 1.0 (GRPO's rollout temperature)")
    if a.sft_operation_line and a.optimizer_repair is not None:
        raise SystemExit("--sft-operation-line does not reach --optimizer-repair's pairs yet: "
                         "use one of them")
    if a.optimizer_repair_per_family < 0:
        raise SystemExit(f"--optimizer-repair-per-family {a.optimizer_repair_per_family}: "
                         "use N >= 1, or 0 for a pair per problem")
    if min(a.sft_batch_size, a.sft_grad_accum, a.sft_max_seq_length) < 1:
        raise SystemExit(f"--sft-batch-size {a.sft_batch_size} / --sft-grad-accum "
                         f"{a.sft_grad_accum} / --sft-max-seq-length {a.sft_max_seq_length}: "
                         "each needs to be at least 1")
    if a.sft_anchor_problems and not a.sft_anchor:
        raise SystemExit("--sft-anchor-problems needs --sft-anchor COEF > 0 (the anchor is off)")
    if not 0 <= a.max_infra_share <= 1:
        raise SystemExit(f"--max-infra-share {a.max_infra_share}: a share of episodes, from 0 "
                         "to 1 (1: never stop)")
    if a.select_min_gain < 0 or a.time_budget < 0:
        raise SystemExit(f"--select-min-gain {a.select_min_gain} / --time-budget "
                         f"{a.time_budget}: each needs to be 0 or more")
    if a.family_warm_start is not None:
        if a.family_sampling != "signal":
            raise SystemExit("--family-warm-start starts the windows --family-sampling signal "
                             "weighs families by: give --family-sampling signal too")
        read_family_counts(a.family_warm_start)  # a bad file stops the run before any model loads
    if a.select_also and not a.select_problems:
        raise SystemExit("--select-also adds to --select-problems' sample: give both")
    if a.select_problems:
        if a.select_count < 1 or a.select_every < 1 or (a.select_also and a.select_also_count < 1):
            raise SystemExit(f"--select-count {a.select_count} / --select-every "
                             f"{a.select_every} / --select-also-count {a.select_also_count}: "
                             "each needs to be at least 1")
        if a.sft_full_finetune:
            raise SystemExit("--select-problems reloads LoRA adapters of the chosen step; with "
                             "--sft-full-finetune leave it off")
    return BenchArgs(**{k: v for k, v in vars(a).items() if k not in ("short", "cpu_smoke")})


# GRPOConfig fields that have their own flags here (or are set per seed): --grpo-option refuses
# them, so no run has two values for one setting.
_GRPO_FIELDS_WITH_FLAGS = {
    "num_steps": "--rl-steps", "problems_per_step": "--problems-per-step",
    "group_size": "--group-size", "max_turns": "--max-turns", "max_new_tokens": "--max-new-tokens",
    "learning_rate": "--rl-learning-rate", "kl_reference": "--kl-reference",
    "temperature": "--rl-temperature", "mini_batch_size": "--mini-batch-size",
    "grad_accum": "--grad-accum", "sft_coef": "--sft-anchor", "eval_every": "--grpo-eval-every",
    "seed": "--seeds", "reward": "--repeat-penalty", "credit": None, "train_roles": "--grpo-roles",
    "max_infra_share": "--max-infra-share"}


def grpo_overrides(options: list[str]) -> dict[str, Any]:
    """--grpo-option KEY=VALUE strings -> GRPOConfig keyword arguments, each value converted to
    the type of the field's default (true/false for flags, "none" for an optional number).
    ``credit.FIELD=VALUE`` sets a field of GRPOConfig.credit (a CreditConfig). GRPOConfig and
    CreditConfig themselves then check the values' ranges."""
    from multiminddev.rewards.credit import CreditConfig
    from multiminddev.train.grpo import GRPOConfig

    defaults = {f.name: getattr(GRPOConfig(), f.name) for f in dataclasses.fields(GRPOConfig)}
    credit_defaults = {f.name: getattr(CreditConfig(), f.name)
                       for f in dataclasses.fields(CreditConfig)}
    out: dict[str, Any] = {}
    credit: dict[str, Any] = {}
    for option in options:
        key, sep, text = option.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise SystemExit(f"--grpo-option {option!r}: write KEY=VALUE, e.g. clip_high=0.28")
        if key.startswith("credit."):
            name = key.removeprefix("credit.")
            if name not in credit_defaults:
                raise SystemExit(f"--grpo-option {key}: CreditConfig has no such field; "
                                 "settable: " + ", ".join(f"credit.{k}" for k in credit_defaults))
            credit[name] = _option_value(key, text, credit_defaults[name])
            continue
        if key in _GRPO_FIELDS_WITH_FLAGS:
            flag = _GRPO_FIELDS_WITH_FLAGS[key]
            raise SystemExit(f"--grpo-option {key}: " + (f"use {flag}" if flag else
                             "not settable from this script"))
        if key not in defaults or key == "credit":
            settable = sorted(set(defaults) - set(_GRPO_FIELDS_WITH_FLAGS) - {"credit"})
            raise SystemExit(f"--grpo-option {key}: GRPOConfig has no such field; settable: "
                             + ", ".join(settable) + ", credit.FIELD")
        out[key] = _option_value(key, text, defaults[key])
    try:
        if credit:
            out["credit"] = CreditConfig(**credit)
        GRPOConfig(**out)
    except ValueError as exc:
        raise SystemExit(f"--grpo-option: {exc}") from None
    return out


def _option_value(key: str, text: str, default: Any) -> Any:
    """``text`` as the type of ``default``; a mapping as ``name:number,name:number``."""
    try:
        if isinstance(default, dict):
            pairs = [item.partition(":") for item in text.split(",") if item.strip()]
            if not pairs or any(not sep for _, sep, _ in pairs):
                raise ValueError("write NAME:NUMBER[,NAME:NUMBER], e.g. generator:2e-5")
            return {name.strip(): float(number) for name, _, number in pairs}
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError("expected true or false")
            return text.lower() in ("true", "1", "yes")
        if default is None or isinstance(default, float):
            return None if text.lower() == "none" else float(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, enum.Enum):
            choices = [m.value for m in type(default)]
            if text not in choices:
                raise ValueError(f"choose one of {', '.join(choices)}")
        return text
    except ValueError as exc:
        raise SystemExit(f"--grpo-option {key}={text}: {exc}") from None


# --------------------------------------------------------------------------- one seed

def episode_row(episode: Any, reward: float) -> dict[str, Any]:
    """Episode-level outcome: any turn compiled / correct; best correct speedup; best reward."""
    from multiminddev.env.results import EvalStatus

    results = [t.eval_result for t in episode.turns if t.eval_result is not None]
    speeds = [r.speedup for r in results if r.correct]

    def first_turn(passed: Any) -> int:  # 1-based; 0: no turn did
        return next((i for i, t in enumerate(episode.turns, 1)
                     if t.eval_result is not None and passed(t.eval_result)), 0)

    return {"problem": episode.problem.name, "tier": episode.problem.tier,
            "compiled": any(r.compiled for r in results), "correct": bool(speeds),
            "speedup": max(speeds) if speeds else 0.0, "reward": reward,
            "turns": len(episode.turns), "compiled_turn": first_turn(lambda r: r.compiled),
            "correct_turn": first_turn(lambda r: r.correct),
            # Optimizer turns that resubmitted a kernel of an earlier turn unchanged
            "repeats": sum(getattr(t, "repeat_of", None) is not None for t in episode.turns),
            # the evaluation failed on our side (after its retries): counted as a failure here,
            # and reported, so a crowded GPU cannot pass for a worse policy unnoticed
            "infra_error": any(r.status is EvalStatus.INFRA_ERROR for r in results),
            # what the evaluator said, so a stage that mostly failed on our side names the cause
            "infra_message": next((r.message for r in results
                                   if r.status is EvalStatus.INFRA_ERROR), "")}


def evaluate_stage(trainer: Any, problems: list[Any], save: Path | None = None,
                   max_batch_size: int = 64, compiled_decoding: bool | None = None,
                   dtype: str = "same", samples: int = 1) -> list[dict[str, Any]]:
    """One row per episode: ``samples`` episodes per problem (a group, as GRPO's), decoded as
    ``trainer.episode_config`` says."""
    import torch

    from multiminddev.episode import write_episodes_jsonl
    from multiminddev.policy import HFGenerationBackend, LogprobSource
    from multiminddev.train.grpo import LocalRollouts

    # Evaluation trains nothing: the sampler's own log-probs spare the recomputation pass.
    training_rollouts = trainer.rollouts
    backend = HFGenerationBackend(trainer.policy, max_batch_size=max_batch_size,
                                  logprob_source=LogprobSource.SAMPLER,
                                  compiled_decoding=compiled_decoding,
                                  sampling_dtype=None if dtype == "same" else getattr(torch, dtype))
    trainer.rollouts = LocalRollouts(backend, trainer.evaluator)
    try:
        episodes = trainer.run_episodes(problems, samples)
    finally:
        trainer.rollouts = training_rollouts
    if save is not None:  # the full conversations, kernels and EvalResults, for inspection
        write_episodes_jsonl(episodes, save)
    return stage_rows(episodes, trainer.cfg)


def stage_rows(episodes: list[Any], cfg: Any) -> list[dict[str, Any]]:
    """One row per held-out episode (``episode_row``), scored with ``cfg``'s reward (a
    GRPOConfig) less the repeat penalty, so runs with and without it compare."""
    from multiminddev.train.grpo import score_episodes

    scoring = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, repeat_penalty=0.0))
    rows = []
    for episode in episodes:
        _, stats = score_episodes([episode], scoring)
        rows.append(episode_row(episode, stats["reward_mean"]))
    return rows


def heldout_eval_config(workers: int | None) -> Any:
    """The evaluator settings of held-out evaluations (and of their re-measurement)."""
    from multiminddev.env.config import EvalConfig

    return EvalConfig(num_workers=workers, num_trials=3, compile_baseline=False,
                      bench_budget_s=0.5)


def stage_infra_failure(stage: str, rows: list[dict[str, Any]], max_share: float) -> str | None:
    """The error of a stage whose episodes (``episode_row`` rows) mostly ended in an
    infrastructure error, more than ``max_share`` of them, naming the evaluator's messages;
    None when the stage's figures stand. Rows from before messages were kept say only that."""
    from multiminddev.episode.infra import infra_failure

    messages = [(r.get("infra_message") or "infrastructure error (message not recorded)")
                if r.get("infra_error") else None for r in rows]
    return infra_failure(messages, what=f"stage {stage}", max_share=max_share)


def is_mid_grpo_stage(stage: str, rl_steps: int) -> bool:
    """Whether ``stage`` measured the agents of a GRPO step before the last (select@K with
    0 < K < ``rl_steps``, or grpo@K): agents a resumed GRPO no longer holds."""
    step = stage.removeprefix(SELECT) if stage.startswith(SELECT) else (
        stage.removeprefix("grpo@") if stage.startswith("grpo@") else None)
    return step is not None and step.isdigit() and 0 < int(step) < rl_steps


def infra_failed_stages(per_seed: list[dict[str, Any]], max_share: float) -> list[str]:
    """``stage_infra_failure``'s errors of every seed's recorded stages (finished seeds read
    back for aggregation): such a stage must not enter a table."""
    return [f"seed {result.get('seed')}: {failure}" for result in per_seed
            for stage, rows in result.get("rows", {}).items()
            if (failure := stage_infra_failure(stage, rows, max_share)) is not None]


def code_files() -> list[Path]:
    """The files every new evaluation worker reads from disk: this script (multiprocessing's
    forkserver runs the main script again in each process it starts) and the package's
    modules (those the worker imports after the fork)."""
    import multiminddev

    return [SCRIPT, *sorted(Path(multiminddev.__file__).parent.rglob("*.py"))]


def code_fingerprint(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """Path -> (modification time in ns, size); (-1, -1) for a file that is not there."""
    out = {}
    for path in paths:
        try:
            st = path.stat()
            out[str(path)] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[str(path)] = (-1, -1)
    return out


def code_change_note(before: dict[str, tuple[int, int]]) -> str:
    """A sentence naming the files of ``before`` (a ``code_fingerprint``) that changed or went
    away since; '' when none did."""
    now = code_fingerprint([Path(p) for p in before])
    changed = sorted(p for p in before if now[p] != before[p])
    if not changed:
        return ""
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return (f" {len(changed)} of the run's code files changed or went away on disk after it "
            f"started ({shown}); each new evaluation worker reads them again, so a run whose "
            "tree is rewritten under it loses its evaluator: run from a copy of the tree "
            "(benchmarks/gpu_session.sh learning-start runs from /root/run_tree).")


def stage_metrics(rows: list[dict[str, Any]], compile_only: bool) -> dict[str, float]:
    n = max(len(rows), 1)
    return {"compile_rate": sum(r["compiled"] for r in rows) / n,
            "correct_rate": sum(r["correct"] for r in rows) / n,
            "reward_mean": sum(r["reward"] for r in rows) / n,
            "fast_1": 0.0 if compile_only else sum(r["correct"] and r["speedup"] > 1.0
                                                   for r in rows) / n,
            "infra_errors": float(sum(r.get("infra_error", False) for r in rows)),
            # episodes whose Optimizer resubmitted an earlier kernel (rows from before: none)
            "repeat_episodes": float(sum(r.get("repeats", 0) > 0 for r in rows))}


def grpo_curriculum(args: BenchArgs, train: list[Any]) -> Any:
    """GRPO's problem sampler over ``train``, started where the arguments say."""
    from multiminddev.tasks.curriculum import Curriculum, CurriculumConfig

    curriculum = Curriculum.from_problems(train, CurriculumConfig(
        start_tier=args.curriculum_start_tier, review_fraction=args.review_fraction,
        family_sampling=args.family_sampling, family_floor=args.family_floor))
    if args.family_warm_start is not None:
        curriculum.warm_family_windows(read_family_counts(args.family_warm_start))
    return curriculum


def read_family_counts(path: Path) -> dict[str, tuple[int, int]]:
    """``curriculum.load_family_counts``, its error a usage error of --family-warm-start."""
    from multiminddev.tasks.curriculum import load_family_counts

    try:
        return load_family_counts(path)
    except ValueError as e:
        raise SystemExit(f"--family-warm-start: {e}") from None


def select_problems(spec: str, count: int, heldout: list[Any], also: str = "",
                    also_count: int = 0, trained: list[Any] = ()) -> list[Any]:
    """The early-stopping sample (--select-problems; [] when off): a fixed one, as the train_*
    sample is, joined to a second one drawn from ``also`` (--select-also). Both are drawn from
    problems that are not ``trained`` (SFT's and GRPO's): agents chosen on problems they were
    trained on are chosen for fitting them. Without that rule, 7 of an 18-problem
    sample of ``:resized2from12`` were trained on (a family's fixed shapes, which SFT's
    ``:allshapes`` holds), and early stopping picked steps whose gains on GRPO's families came
    with losses on the others. Choosing agents
    on held-out problems would make the held-out figures biased, so a held-out problem in the
    sample is an error."""
    from multiminddev.tasks.loaders import load_problems

    if not spec:
        return []
    seen = {t.name for t in trained}

    def unseen(source: str, option: str) -> list[Any]:
        problems = [p for p in load_problems(source) if p.name not in seen]
        if not problems:
            raise SystemExit(f"{option} {source}: every problem of it is trained on (SFT or "
                             "GRPO); choose sizes neither saw, e.g. :resized2from12")
        return problems

    chosen = train_eval_subset(unseen(spec, "--select-problems"), count)
    if also:
        names = {p.name for p in chosen}
        chosen = sorted([*chosen, *(p for p in train_eval_subset(unseen(also, "--select-also"),
                                                                 also_count)
                                    if p.name not in names)], key=lambda p: p.name)
        spec = f"{spec} and {also}"
    shared = sorted({p.name for p in chosen} & {p.name for p in heldout})
    if shared:
        raise SystemExit(f"--select-problems {spec}: {', '.join(shared)} are held out; choose "
                         "problems no evaluation reports, e.g. builtin:tier0,tier1:train:resized2from12")
    print(f"problems: {len(chosen)} of {spec} chosen for the select@ evaluations (early "
          "stopping): " + ", ".join(p.name for p in chosen), flush=True)
    return chosen


def train_eval_subset(problems: list[Any], count: int) -> list[Any]:
    """``count`` distinct problems of ``problems`` (all, if fewer), sorted by name. The sample
    is drawn with a fixed RNG, not the run's seed, so every seed, every process of a run split
    over processes, and both train_* stages evaluate the same problems. A weighted spec
    (``A*2``) lists a problem twice: it is one problem here."""
    distinct = list({p.name: p for p in problems}.values())
    chosen = random.Random(0).sample(distinct, min(count, len(distinct)))
    return sorted(chosen, key=lambda p: p.name)


def restore_final_grpo(trainer: Any, output_dir: Path, rl_steps: int) -> bool:
    """Loads GRPO's final agents from the seed's last checkpoint (GRPOTrainer saves one at the
    last step), for a seed whose GRPO finished in an earlier run that did not evaluate
    train_grpo: the trainer holds SFT's agents until then. False, with the reason printed,
    where no checkpoint of the last step is left; a GRPO run again would be another run."""
    if not (output_dir / "rl_checkpoints" / "latest").is_dir():
        print(f"{output_dir.name}: train_grpo skipped: GRPO finished earlier and "
              f"{output_dir / 'rl_checkpoints' / 'latest'} is gone", flush=True)
        return False
    trainer.resume(output_dir)
    if trainer.step != rl_steps:
        print(f"{output_dir.name}: train_grpo skipped: the last GRPO checkpoint is of step "
              f"{trainer.step}, not of the last step {rl_steps}", flush=True)
        return False
    print(f"{output_dir.name}: GRPO's final agents loaded from step {trainer.step} for "
          "train_grpo", flush=True)
    return True


def run_seed(args: BenchArgs, seed: int, train: list[Any], heldout: list[Any], evaluator: Any,
             compile_only: bool, sft: list[Any] | None = None,
             train_eval: list[Any] | None = None,
             select: list[Any] | None = None) -> dict[str, Any]:
    """``sft``: the problems of the SFT data (None: ``train``, GRPO's problems). ``train_eval``:
    problems of GRPO's training distribution that the SFT and GRPO agents are also evaluated on
    (stages train_sft, train_grpo; None or empty: not). ``select``: problems whose select@K
    evaluations choose the GRPO step whose agents are the "grpo" stage (None or empty: the
    last step's)."""
    import torch

    from multiminddev.agents.roles import AgentRole
    from multiminddev.episode import EpisodeConfig
    from multiminddev.episode.infra import InfraFailure
    from multiminddev.policy import HFGenerationBackend, PolicyConfig, SamplingParams, load_policy
    from multiminddev.report.plots import plot_training_curves
    from multiminddev.rewards import RewardConfig
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer
    from multiminddev.train.metrics import read_metrics
    from multiminddev.train.sft import SFTConfig, run_sft

    out = args.output_dir / (BASE_DIR if args.base_only else f"seed{seed}")
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    torch.manual_seed(seed)
    cfg = GRPOConfig(num_steps=args.rl_steps, problems_per_step=args.problems_per_step,
                     group_size=args.group_size, max_turns=args.max_turns,
                     max_new_tokens=args.max_new_tokens, learning_rate=args.rl_learning_rate,
                     kl_reference=args.kl_reference, temperature=args.rl_temperature,
                     reward=RewardConfig(repeat_penalty=args.repeat_penalty),
                     mini_batch_size=args.mini_batch_size, grad_accum=args.grad_accum,
                     sft_coef=args.sft_anchor,
                     eval_every=0, seed=seed, train_roles=tuple(args.grpo_roles),
                     max_infra_share=args.max_infra_share,
                     **grpo_overrides(args.grpo_options))
    sft_dir = out / "sft_checkpoints"
    # A finished SFT is found by what save_role wrote: an adapter, or a full model's config.
    saved_file = "config.json" if args.sft_full_finetune else "adapter_config.json"
    # SFT trains both agents; GRPO trains --grpo-roles (cfg.train_roles) and only samples the rest
    sft_roles = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)
    sft_done = all((sft_dir / role.value / saved_file).is_file() for role in sft_roles)
    policy = load_policy(PolicyConfig(
        model=args.model, compiled_decoding=args.compiled_decoding, lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank, separate_models=args.sft_full_finetune,
        # separate models load their fine-tuned weights at start; adapters load below
        adapter_paths=({role.value: str(sft_dir / role.value) for role in sft_roles}
                       if sft_done and args.sft_full_finetune else {})))
    caps = ({"generator": args.generator_max_new_tokens} if args.generator_max_new_tokens
            else {})
    train_episodes = EpisodeConfig(max_turns=args.max_turns, max_new_tokens_by_role=caps,
                                   sampling=SamplingParams(temperature=cfg.temperature,
                                                           max_new_tokens=args.max_new_tokens),
                                   temperature_by_role=dict.fromkeys(args.rl_greedy_roles, 0.0),
                                   element_type=args.element_type_line)
    eval_episodes = EpisodeConfig(max_turns=args.eval_max_turns or args.max_turns,
                                  max_new_tokens_by_role=caps,
                                  sampling=SamplingParams(temperature=args.eval_temperature,
                                                          max_new_tokens=args.max_new_tokens),
                                  element_type=args.element_type_line)
    if args.sft_anchor > 0:
        from multiminddev.tasks.loaders import load_problems

        anchor_problems = (load_problems(args.sft_anchor_problems) if args.sft_anchor_problems
                           else train if sft is None else sft)
        anchor = sft_anchor_examples(policy.tokenizer, cfg.train_roles, anchor_problems, seed,
                                     args.generator_variants, args.sft_strip_comments,
                                     args.sft_max_seq_length, args.element_type_line,
                                     args.sft_operation_line)
    else:
        anchor = None
    trainer = GRPOTrainer(cfg, policy=policy, sft_anchor=anchor,
                          backend=HFGenerationBackend(policy, max_batch_size=args.max_batch_size),
                          evaluator=evaluator,
                          curriculum=grpo_curriculum(args, train),
                          episode_config=eval_episodes, output_dir=out,
                          compile_only=compile_only)
    # Stage-level resume: a seed cut short (a time limit, a crash) continues from
    # the stages it finished: evaluations from partial.json, SFT from its saved adapters, GRPO
    # from rl_checkpoints/latest.
    partial = _read_json(out / "partial.json") or {}
    recipe = sft_recipe(args)
    if "optimizer_repair" in recipe:  # counted when SFT ran; a resumed seed keeps the count
        recipe["optimizer_repair"] = partial.get("sft_recipe", {}).get("optimizer_repair", {})
    if sft_done:
        check_sft_matches(partial, recipe, args.sft_problems, sft_dir)
    settings = eval_settings(args, torch.cuda.get_device_name(0) if not compile_only else "cpu")
    kept = drop_rows_of_other_settings(partial, settings, out.name)
    if kept is not partial and (out / "rl_checkpoints").is_dir():
        # select@K and grpo@K would be measured again with the last step's agents
        raise SystemExit(f"{out}: GRPO ran here under other evaluation settings, and its earlier "
                         "steps' agents are gone; use another --output-dir")
    partial = kept
    rows: dict[str, Any] = dict(partial.get("rows", {}))
    for stage in [s for s in rows if stage_infra_failure(s, rows[s], args.max_infra_share)]:
        # recorded before such stages stopped the run: their figures are the evaluator's
        if is_mid_grpo_stage(stage, args.rl_steps) and (out / "rl_checkpoints").is_dir():
            raise SystemExit(f"{out}: the recorded {stage} evaluation mostly failed on the "
                             "evaluator's side, and the agents of its GRPO step are gone (GRPO "
                             "went on); use another --output-dir")
        print(f"seed {seed}: the recorded {stage} evaluation mostly failed on the evaluator's "
              "side; it is measured again", flush=True)
        del rows[stage]
    check_gone_stages_problems(rows, heldout, train_eval or [], select or [], out,
                               args.eval_samples)
    seconds: dict[str, float] = dict(partial.get("seconds", {}))
    sft_losses: dict[str, Any] = dict(partial.get("sft_losses", {}))
    shared_base = {k: partial[k] for k in ("base_from_seed",) if k in partial}
    # how this seed chose and stopped GRPO: early stopping's margin, and the step a time budget
    # stopped it at (kept from a run cut after that)
    run_info: dict[str, Any] = {"select_min_gain": args.select_min_gain,
                                **{k: partial[k] for k in ("grpo_budget_stop",) if k in partial}}
    # a rerun without the option keeps the spec of the train_* rows measured before
    spec = args.train_eval_problems or partial.get("train_eval_problems")
    train_eval_spec = {"train_eval_problems": spec} if spec else {}

    def save_partial() -> None:
        (out / "partial.json").write_text(json.dumps(
            {"seed": seed, "sft_problems": args.sft_problems, "sft_recipe": recipe,
             "sft_losses": sft_losses, "rows": rows, "seconds": seconds, **shared_base,
             **train_eval_spec, **run_info, "eval_settings": settings}, default=str))

    def evaluate(stage: str, problems: list[Any] | None = None) -> None:
        """``problems``: None for the held-out ones."""
        wanted = heldout if problems is None else problems
        if stage in rows and not measured_on(rows[stage], wanted, args.eval_samples):
            # e.g. kept SFT's select@0 and a run whose --select-problems draw another sample;
            # a GRPO stage on other problems stopped the seed earlier (check_gone_stages_problems)
            print(f"seed {seed}: {stage} was measured on other problems; evaluating it again",
                  flush=True)
            del rows[stage]
        if stage in rows:
            print(f"seed {seed}: {stage} evaluation already measured, reusing it", flush=True)
            return
        t0 = time.perf_counter()
        measured = evaluate_stage(trainer, heldout if problems is None else problems,
                                  out / f"episodes_{stage}.jsonl",
                                  args.max_batch_size, args.eval_compiled_decoding,
                                  args.eval_dtype, args.eval_samples)
        failure = stage_infra_failure(stage, measured, args.max_infra_share)
        if failure is not None:  # not recorded: a rerun measures the stage again
            raise InfraFailure(f"seed {seed}: {failure} Its episodes: "
                               f"{out / f'episodes_{stage}.jsonl'}")
        rows[stage] = measured
        seconds[f"eval_{stage}"] = time.perf_counter() - t0
        save_partial()

    out.mkdir(parents=True, exist_ok=True)
    if "base" not in rows and args.eval_temperature == 0:
        shared = base_rows_from_other_seeds(args.output_dir, seed, args.max_infra_share)
        if shared is not None:
            # Greedy decoding of the untouched base model does not depend on the seed: the
            # base stage is the same measurement for every seed, so it is run once.
            print(f"seed {seed}: base evaluation shared with seed {shared[0]} (greedy)", flush=True)
            rows["base"], seconds["eval_base"] = shared[1], shared[2]
            shared_base["base_from_seed"] = shared[0]
    if not args.skip_base:
        evaluate("base")
    if args.base_only:  # its partial.json is the record the seeds borrow
        print("base: " + ", ".join(f"{k} {v:.3f}" for k, v in
                                   stage_metrics(rows["base"], compile_only).items()), flush=True)
        return {"seed": seed, "rows": rows, "seconds": seconds}
    if sft_done:
        print(f"seed {seed}: SFT finished earlier, loading {sft_dir}", flush=True)
        if not args.sft_full_finetune:
            policy.load_adapters({role.value: str(sft_dir / role.value)
                                  for role in sft_roles})
    else:
        t = time.perf_counter()
        for role in sft_roles:
            done = run_sft(role, policy.config,
                           sft_data(role, train if sft is None else sft, seed,
                                    args.generator_variants,
                                    repair_evaluator=(evaluator if args.optimizer_repair
                                                      is not None else None),
                                    repair_kinds=args.optimizer_repair, repair_counts=recipe,
                                    repair_reply=args.optimizer_repair_reply,
                                    repair_per_family=args.optimizer_repair_per_family,
                                    strip_comments=args.sft_strip_comments,
                                    element_type=args.element_type_line,
                                    operation_line=args.sft_operation_line),
                           SFTConfig(output_dir=out, max_steps=args.sft_steps,
                                     batch_size=args.sft_batch_size,
                                     grad_accum=args.sft_grad_accum,
                                     max_seq_length=args.sft_max_seq_length,
                                     learning_rate=args.sft_learning_rate,
                                     full_finetune=args.sft_full_finetune,
                                     loss_eval_examples=1 if args.sft_steps < 5 else 8,
                                     seed=seed, report_to=()), policy=policy)
            # how far SFT fitted its data: the first examples' loss before and after, and
            # the mean training loss (memorising the families is one suspect for held-out misses)
            sft_losses[role.value] = {"examples": done.num_examples, "before": done.loss_before,
                                      "after": done.loss_after, "train": done.train_loss,
                                      "truncated": done.truncated}
            print(f"seed {seed}: SFT {role.value}: {done.num_examples} examples, loss "
                  f"{done.loss_before:.3f} -> {done.loss_after:.3f} (train mean "
                  f"{done.train_loss:.3f})", flush=True)
        seconds["sft"] = time.perf_counter() - t
        save_partial()  # SFT's time survives a cut during the evaluation that follows
    evaluate("sft")
    if train_eval:  # SFT's agents are loaded here, resumed or not
        evaluate("train_sft", train_eval)
    if select and not args.sft_only:
        evaluate(f"{SELECT}0", select)
    if args.sft_only:  # no seed_result.json: a later full run goes on from here to GRPO
        return {"seed": seed, "sft_problems": args.sft_problems, "sft_recipe": recipe,
                "sft_losses": sft_losses, "rows": rows, "seconds": seconds, **shared_base,
                **train_eval_spec}
    grpo_trained_here = "grpo" not in rows
    if grpo_trained_here:
        if (out / "rl_checkpoints" / "latest").is_dir():
            trainer.resume(out)
            print(f"seed {seed}: GRPO resumed at step {trainer.step}", flush=True)
        heldout_marks = grpo_marks(args.rl_steps, args.grpo_eval_every)
        select_marks = grpo_marks(args.rl_steps, args.select_every) if select else []
        step_seconds: list[float] = []

        def train_until(until: int) -> None:
            t, before = time.perf_counter(), trainer.step
            trainer.episode_config = train_episodes
            trainer.train(until=until)
            trainer.episode_config = eval_episodes
            took = time.perf_counter() - t
            seconds["grpo"] = seconds.get("grpo", 0.0) + took
            if trainer.step > before:
                step_seconds.append(took / (trainer.step - before))
            save_partial()

        def evaluate_select(mark: int) -> None:
            if f"{SELECT}{mark}" not in rows:
                evaluate(f"{SELECT}{mark}", select)
                keep_if_best(rows, mark, args.rl_steps, policy, cfg.train_roles, out,
                             args.select_min_gain)

        def evaluate_mark(mark: int) -> None:
            if mark < args.rl_steps and mark in heldout_marks:
                evaluate(f"grpo@{mark}")  # kept if the run is cut before its last step
            if mark in select_marks:
                evaluate_select(mark)

        def remaining_work() -> RemainingWork:
            selects = [v for k, v in seconds.items() if k.startswith(f"eval_{SELECT}")]
            return RemainingWork(
                step=statistics.mean(step_seconds) if step_seconds else 0.0,
                select=max(selects, default=0.0) if select else 0.0,
                final=seconds.get("eval_sft", 0.0)
                + (seconds.get("eval_train_sft", 0.0) if train_eval else 0.0))

        stopped = grpo_phase(lambda: trainer.step, train_until,
                             sorted({*heldout_marks, *select_marks}), evaluate_mark,
                             evaluate_select if select else None,
                             (lambda: deadline - time.monotonic()) if deadline else None,
                             remaining_work)
        if stopped is not None:
            run_info["grpo_budget_stop"] = stopped
            print(f"seed {seed}: --time-budget {args.time_budget:.0f} s stopped GRPO at step "
                  f"{stopped} of {args.rl_steps}, leaving {deadline - time.monotonic():.0f} s "
                  "for the evaluations after it", flush=True)
            save_partial()
        trainer.finish()
    chosen = chosen_step(rows, args.select_min_gain) if select else None
    chosen_loaded = chosen is not None and chosen < args.rl_steps
    if chosen_loaded:
        load_chosen_agents(policy, chosen, sft_dir, out, cfg.train_roles)
        print(f"seed {seed}: GRPO's agents chosen at step {chosen} of {args.rl_steps} by their "
              f"select@ reward {select_rewards(rows)}", flush=True)
    reused = reuse_sft_evaluation(rows, out) if chosen == 0 else []
    if reused:
        print(f"seed {seed}: GRPO's agents are SFT's: stages {', '.join(reused)} take SFT's "
              "evaluation", flush=True)
        save_partial()
    evaluate("grpo")
    if train_eval and (grpo_trained_here or "train_grpo" in rows or chosen_loaded
                       or restore_final_grpo(trainer, out, args.rl_steps)):
        evaluate("train_grpo", train_eval)
    plot_training_curves(read_metrics(out / "metrics.jsonl"), out / "training.png")
    metrics = {s: stage_metrics(rows[s], compile_only)
               for s in (*STAGES, *TRAIN_STAGES) if s in rows}
    print(f"seed {seed}: " + "; ".join(f"{s} " + ", ".join(f"{k} {v:.3f}" for k, v in m.items())
                                       for s, m in metrics.items()), flush=True)
    evaluated = [s for s in STAGES if f"eval_{s}" in seconds]
    # Seeds may be run on separate machines and aggregated later: each records its SFT data.
    result = {"seed": seed, "sft_problems": args.sft_problems, "sft_recipe": recipe,
              "sft_losses": sft_losses, "metrics": metrics, "rows": rows,
              "seconds": seconds, **shared_base, **train_eval_spec, **run_info,
              **({"select": {"problems": args.select_problems,
                             **({"also": args.select_also} if args.select_also else {}),
                             "rewards": select_rewards(rows),
                             "chosen_step": chosen, "reused_sft_evaluation": reused}}
                 if chosen is not None else {}),
              "episodes_per_min_eval": 60 * len(heldout) * len(evaluated)
              / max(1e-9, sum(seconds[f"eval_{s}"] for s in evaluated))}
    (out / "seed_result.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def measured_on(stage_rows: list[dict[str, Any]], problems: list[Any], samples: int = 1) -> bool:
    """Whether a stage's rows are ``samples`` per problem of ``problems`` (names, any order)."""
    return (collections.Counter(r["problem"] for r in stage_rows)
            == collections.Counter({p.name: samples for p in problems}))


def check_gone_stages_problems(rows: dict[str, Any], heldout: list[Any], train_eval: list[Any],
                               select: list[Any], out: Path, samples: int = 1) -> None:
    """Stops a resumed seed whose GRPO stages were measured on other problems than this run
    draws (another --select-problems sample, another corpus): their agents are gone, so they
    cannot be measured again, and comparing them with new ones would choose among
    incomparable figures. Stages of the base model and SFT are measured again instead."""
    for stage, stage_rows in rows.items():
        problems = (select if stage.startswith(SELECT) else
                    train_eval if stage in TRAIN_STAGES else heldout)
        # a rerun without --train-eval-problems or --select-problems keeps those rows as they are
        if problems and not stage_agents_at_hand(stage) and not measured_on(stage_rows, problems,
                                                                              samples):
            raise SystemExit(f"{out}: stage {stage} was measured on other problems than this "
                             "run's, and the agents it measured are gone; use another "
                             "--output-dir")


def stage_agents_at_hand(stage: str) -> bool:
    """Whether a stage's agents can still be evaluated when it is reached again: the base
    model's and SFT's can (SFT's are saved); an intermediate GRPO step's are gone."""
    return stage in ("base", "sft", "train_sft", f"{SELECT}0")


def eval_settings(args: BenchArgs, device: str) -> dict[str, Any]:
    """What an evaluation stage's rows depend on besides the agents and the problems: rows
    measured under other settings (another GPU's timings, other turns or decoding) are not
    reused when a seed resumes, e.g. from SFT checkpoints kept by an earlier run."""
    return {"device": device, "heldout_problems": args.heldout_problems,
            "eval_problems": args.eval_problems,
            "turns": args.eval_max_turns or args.max_turns,
            "temperature": args.eval_temperature, "dtype": args.eval_dtype,
            "compiled_decoding": args.eval_compiled_decoding,
            "max_new_tokens": args.max_new_tokens,
            "generator_max_new_tokens": args.generator_max_new_tokens,
            # only when sampled several times, so that earlier records' settings still match
            **({"samples": args.eval_samples} if args.eval_samples > 1 else {}),
            # other prompts (the same rule)
            **({"element_type_line": True} if args.element_type_line else {})}


def drop_rows_of_other_settings(partial: dict[str, Any], settings: dict[str, Any],
                                name: str) -> dict[str, Any]:
    """``partial`` without its measured rows and their times when they were measured under other
    evaluation settings than ``settings``. A record without settings (written before they were
    kept) is taken as it is."""
    kept = partial.get("eval_settings")
    if kept is None or kept == settings or not partial.get("rows"):
        return partial
    changed = sorted(k for k in {*kept, *settings} if kept.get(k) != settings.get(k))
    print(f"{name}: stages {sorted(partial['rows'])} were measured with other evaluation "
          f"settings ({', '.join(f'{k} {kept.get(k)!r} -> {settings.get(k)!r}' for k in changed)}): "
          "they are evaluated again", flush=True)
    seconds = {k: v for k, v in partial.get("seconds", {}).items() if not k.startswith("eval_")}
    return {**partial, "rows": {}, "seconds": seconds}


def check_sft_matches(partial: dict[str, Any], recipe: dict[str, Any], sft_problems: str,
                      sft_dir: Path) -> None:
    """Stops the run when the saved SFT agents were trained another way than this run asks for:
    GRPO and the sft stage would otherwise be of another SFT than the one reported."""
    kept_recipe, kept_problems = partial.get("sft_recipe"), partial.get("sft_problems")
    if kept_recipe is None and kept_problems is None:
        return  # no record of how they were trained (an older or a hand-made folder)
    if kept_recipe != recipe or kept_problems != sft_problems:
        raise SystemExit(f"{sft_dir} holds SFT agents of recipe {kept_recipe} on "
                         f"{kept_problems}; this run asks for {recipe} on {sft_problems}. Use "
                         "another --output-dir, or the SFT flags those agents were trained with")


def sft_recipe(args: BenchArgs) -> dict[str, Any]:
    """How SFT trained, beside its data spec, so seeds of different recipes are told apart."""
    return {"steps": args.sft_steps, "batch_size": args.sft_batch_size,
            # the examples per optimizer step are batch_size x grad_accum; 1 is left out, so
            # that records from before the option compare equal
            **({"grad_accum": args.sft_grad_accum} if args.sft_grad_accum != 1 else {}),
            **({"max_seq_length": args.sft_max_seq_length}
               if args.sft_max_seq_length != 2048 else {}),
            "learning_rate": args.sft_learning_rate,
            "method": "full" if args.sft_full_finetune else f"lora r{args.lora_rank}",
            **({"optimizer_strip_comments": True} if args.sft_strip_comments else {}),
            **({"element_type_line": True} if args.element_type_line else {}),
            **({"operation_line": True} if args.sft_operation_line else {}),
            **({"optimizer_repair": {}, "optimizer_repair_kinds": args.optimizer_repair or "all",
                "optimizer_repair_reply": args.optimizer_repair_reply,
                "optimizer_repair_per_family": args.optimizer_repair_per_family}
               if args.optimizer_repair is not None else {})}


# what --time-budget's estimates must fit with: measured select@ evaluations took 94-121 s,
# held-out ones 208-223 s, one GRPO step 41-43 s (three seeds sharing one H100)
BUDGET_MARGIN = 1.15


@dataclass(frozen=True, kw_only=True)
class RemainingWork:
    """Seconds a seed's GRPO phase is estimated to need, from the stages it measured."""
    step: float  # one GRPO step (0 until one is measured)
    select: float  # one select@ evaluation (0 without early stopping)
    final: float  # the held-out evaluations after GRPO: grpo, and train_grpo if asked for


def fits(left: float, work: RemainingWork, steps: int = 1, margin: float = BUDGET_MARGIN) -> bool:
    """Whether ``steps`` more GRPO steps, one select@ evaluation and the final evaluations fit
    in ``left`` seconds, all times ``margin``."""
    return margin * (steps * work.step + work.select + work.final) <= left


def grpo_phase(step: Callable[[], int], train_until: Callable[[int], None], marks: list[int],
               evaluate_mark: Callable[[int], None],
               evaluate_select: Callable[[int], None] | None,
               left: Callable[[], float] | None,
               work: Callable[[], RemainingWork]) -> int | None:
    """Trains GRPO to each of ``marks`` in turn (``train_until``) and evaluates there
    (``evaluate_mark``). With a time budget (``left``: seconds to the seed's deadline) it trains
    one step at a time and stops before a step after which a select@ evaluation and the final
    ones would no longer fit; the step it stopped at gets its select@ evaluation
    (``evaluate_select``) if that still fits, so early stopping can choose it. Returns that step,
    or None when every mark was reached."""
    for mark in marks:
        while step() < mark:
            if left is not None and not fits(left(), work()):
                stopped = step()
                if evaluate_select is not None and stopped > 0 and fits(left(), work(), steps=0):
                    evaluate_select(stopped)
                return stopped
            train_until(mark if left is None else step() + 1)
        evaluate_mark(mark)
    return None


def grpo_marks(rl_steps: int, every: int) -> list[int]:
    """The GRPO steps after which the held-out set is evaluated: every ``every`` steps and the
    last (``every`` <= 0: the last only)."""
    marks = list(range(every, rl_steps, every)) if every > 0 else []
    return [*marks, rl_steps]


# Early stopping is chosen here rather than by GRPOTrainer's best_model_episode_N: the trainer
# ranks steps by an evaluation at the rollouts' sampling settings and never ranks SFT's agents,
# while the benchmark's choice has to use the held-out stages' greedy float32 evaluation and
# may keep SFT's agents (step 0).
SELECT = "select@"  # stage prefix of the early-stopping evaluations (select@0 is SFT's agents)
SELECT_BEST_DIR = "select_best"  # a seed's adapters of the best select@K so far (K > 0)


def select_rewards(rows: dict[str, list[dict[str, Any]]]) -> dict[int, float]:
    """GRPO step -> mean reward of its select@step evaluation."""
    return {int(stage.removeprefix(SELECT)): sum(r["reward"] for r in rs) / max(len(rs), 1)
            for stage, rs in rows.items() if stage.startswith(SELECT)}


def chosen_step(rows: dict[str, list[dict[str, Any]]], min_gain: float = 0.0) -> int | None:
    """The GRPO step whose agents score best on the select@ problems: going through the steps in
    order, a later one replaces the step chosen so far only when its mean reward is higher by
    more than ``min_gain`` (0: the best, a tie going to the step nearer SFT). None: no select@
    evaluation."""
    rewards = select_rewards(rows)
    chosen = None
    for step in sorted(rewards):
        if chosen is None or rewards[step] > rewards[chosen] + min_gain:
            chosen = step
    return chosen


def reuse_sft_evaluation(rows: dict[str, list[dict[str, Any]]], seed_dir: Path) -> list[str]:
    """When early stopping keeps SFT's agents (step 0), the grpo and train_grpo stages are SFT's
    agents on the same prompts, so SFT's rows (and episodes) stand for them rather than a second
    GPU evaluation of about 4 minutes. Greedily decoded, it would give the same kernels and
    differ only by timing noise; sampled (--eval-samples), only by sampling noise, which would
    enter the GRPO - SFT gain of agents GRPO did not change. Returns the stages filled so."""
    import shutil

    reused = []
    for stage, source in (("grpo", "sft"), ("train_grpo", "train_sft")):
        if stage in rows or source not in rows:
            continue
        rows[stage] = [dict(r) for r in rows[source]]
        episodes = seed_dir / f"episodes_{source}.jsonl"
        if episodes.is_file():
            shutil.copyfile(episodes, seed_dir / f"episodes_{stage}.jsonl")
        reused.append(stage)
    return reused


def keep_if_best(rows: dict[str, list[dict[str, Any]]], mark: int, rl_steps: int, policy: Any,
                 roles: Any, seed_dir: Path, min_gain: float = 0.0) -> bool:
    """After GRPO step ``mark``'s select@ evaluation: saves ``roles``' adapters to
    ``seed_dir/select_best`` when the step is the best so far. Step 0 (SFT's adapters are saved
    already) and the last step (the trainer ends holding its agents) are not saved."""
    from multiminddev.train import checkpoints as ck

    if not 0 < mark < rl_steps or chosen_step(rows, min_gain) != mark:
        return False
    best = seed_dir / SELECT_BEST_DIR
    # step.txt goes first and comes back last: a save cut halfway leaves no step to trust
    (best / "step.txt").unlink(missing_ok=True)
    ck.save_agents(policy, roles, best)
    (best / "step.txt").write_text(f"{mark}\n")
    return True


def load_chosen_agents(policy: Any, step: int, sft_dir: Path, seed_dir: Path,
                       roles: Any) -> None:
    """Puts the adapters of GRPO step ``step`` (0: SFT's) back into ``policy`` for ``roles``."""
    if step == 0:
        policy.load_adapters({role.value: str(sft_dir / role.value) for role in roles})
        return
    best = seed_dir / SELECT_BEST_DIR
    saved = (best / "step.txt").read_text().strip() if (best / "step.txt").is_file() else None
    if saved != str(step):
        raise RuntimeError(f"{best} holds step {saved}'s agents, not step {step}'s: the run was "
                           "cut between select@ evaluation and save; rerun the seed's GRPO")
    policy.load_adapters({role.value: str(best / role.value) for role in roles})


def sft_anchor_examples(tokenizer: Any, roles: Any, problems: list[Any], seed: int,
                        generator_variants: list[str], strip_comments: bool = False,
                        max_len: int | None = None, element_type: bool = False,
                        operation_line: bool = False) -> dict[Any, list[dict[str, list[int]]]]:
    """Per role, the SFT data tokenized as SFT tokenizes it (``max_len``: SFT's
    max_seq_length, None: SFTConfig's): GRPO's SFT anchor."""
    from multiminddev.train.sft import SFTConfig, tokenize_chat

    max_len = max_len or SFTConfig.max_seq_length
    return {role: [tokenize_chat(tokenizer, m, max_len)
                   for m in sft_data(role, problems, seed, generator_variants,
                                     strip_comments=strip_comments,
                                     element_type=element_type,
                                     operation_line=operation_line)["messages"]]
            for role in roles}


def sft_data(role: Any, train: list[Any], seed: int, generator_variants: list[str],
             repair_evaluator: Any = None, repair_kinds: list[str] | None = None,
             repair_counts: dict[str, Any] | None = None, strip_comments: bool = False,
             repair_reply: str = "naive", repair_per_family: int = 0,
             element_type: bool = False, operation_line: bool = False) -> Any:
    """The role's SFT pairs; without `datasets` (a GPU image may lack it) the same pairs as a
    column dict, since run_sft reads only the ``messages`` column. With ``repair_evaluator`` the
    Optimizer's data gains repair pairs (``repair_kinds``; None: all), their counts per defect
    written to
    ``repair_counts["optimizer_repair"]``. ``element_type``: the prompts end with the
    element-type line (--element-type-line), as the episodes' do. ``operation_line``: the
    replies (and the Optimizer's input kernels) start their CUDA source with the problem's
    operation (--sft-operation-line)."""
    import functools
    import random

    from multiminddev.agents.prompts import generator_messages, optimizer_messages
    from multiminddev.agents.roles import AgentRole
    from multiminddev.train import repair_data
    from multiminddev.train.sft_data import build_sft_dataset, sft_examples

    kwargs: dict[str, Any] = ({"variants": tuple(generator_variants)}
                              if role is AgentRole.GENERATOR
                              else {"strip_comments": True} if strip_comments else {})
    if operation_line:
        kwargs["operation_line"] = True
    prompt = functools.partial(
        generator_messages if role is AgentRole.GENERATOR else optimizer_messages,
        element_type=element_type)
    kwargs["prompt"] = prompt
    if role is AgentRole.OPTIMIZER and repair_evaluator is not None:
        extra = repair_data.optimizer_repair_examples(train, repair_evaluator.evaluate,
                                                      prompt=prompt,
                                                      kinds=repair_kinds or repair_data.KINDS,
                                                      reply=repair_reply,
                                                      strip_comments=strip_comments,
                                                      per_family=repair_per_family)
        print(f"optimizer repair pairs: {repair_data.repair_kinds(extra)}", flush=True)
        if repair_counts is not None:
            repair_counts["optimizer_repair"] = repair_data.repair_kinds(extra)
        kwargs["extra_examples"] = extra
    try:
        return build_sft_dataset(role, train, seed=seed, **kwargs)
    except ImportError as exc:
        print(f"note: {exc}; using a plain column dict", flush=True)
        extra = kwargs.pop("extra_examples", [])
        examples = sft_examples(role, train, **kwargs) + list(extra)
        random.Random(seed).shuffle(examples)
        return {"messages": [e.messages for e in examples]}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def base_rows_from_other_seeds(output_dir: Path, seed: int, max_infra_share: float = 0.5
                               ) -> tuple[int, Any, float] | None:
    """(seed, base rows, seconds) from another seed's or a --base-only run's results in
    ``output_dir``, if any; a base stage that failed on the evaluator's side
    (``stage_infra_failure``) is none."""
    for path in sorted(output_dir.glob("*/partial.json")):
        data = _read_json(path) or {}
        other = data.get("seed")
        if (other is not None and path.parent.name != f"seed{seed}"
                and "base" in data.get("rows", {})
                # a base stage of a failing evaluator is no measurement to share
                and stage_infra_failure("base", data["rows"]["base"], max_infra_share) is None):
            return other, data["rows"]["base"], float(data.get("seconds", {}).get("eval_base", 0.0))
    return None


def lacks_train_stages(output_dir: Path, seed: int, result: dict[str, Any],
                       sft_only: bool) -> bool:
    """Whether a finished seed lacks a train_* stage that --train-eval-problems asks for and can
    still measure it. It then runs again: its finished stages come from partial.json, SFT's
    agents from sft_checkpoints/ and GRPO's from its last checkpoint, so only the missing
    evaluations run. Without SFT's saved agents it is left as it is: SFT would train again, and
    a new SFT's agents are not the ones the seed's other stages measured."""
    wanted = ("train_sft",) if sft_only else TRAIN_STAGES
    missing = [st for st in wanted if st not in result["rows"]]
    if not missing:
        return False
    sft_dir = output_dir / f"seed{seed}" / "sft_checkpoints"
    if not all((sft_dir / role).is_dir() for role in ("generator", "optimizer")):
        print(f"seed {seed}: finished earlier without {', '.join(missing)}, and {sft_dir} is "
              "gone: those stages are not measured", flush=True)
        return False
    print(f"seed {seed}: finished earlier without {', '.join(missing)}; running it again for "
          "those evaluations only", flush=True)
    return True


def finished_seed(output_dir: Path, seed: int) -> dict[str, Any] | None:
    """A seed's saved result (resume: a finished seed is not run again; a missing or torn file
    means the seed runs again)."""
    return _read_json(output_dir / f"seed{seed}" / "seed_result.json")


# --------------------------------------------------------------------------- aggregate

def share_base_stage(per_seed: list[dict[str, Any]], compile_only: bool,
                     base_run: dict[str, Any] | None = None) -> int:
    """Seeds run with --skip-base borrow the base rows of a seed that measured them, or of a
    --base-only run (``base_run``, its partial.json): greedy decoding of the untouched base does
    not depend on the seed. Returns the lender's seed."""
    lenders = [s for s in per_seed if "base" in s["rows"]]
    if base_run is not None and "base" in base_run.get("rows", {}):
        lenders.append(base_run)
    if not lenders:
        raise ValueError("no seed evaluated the base model: run one seed without --skip-base")
    lender = lenders[0]
    for s in per_seed:
        if "base" not in s["rows"]:
            s["rows"]["base"] = lender["rows"]["base"]
            s["metrics"]["base"] = stage_metrics(lender["rows"]["base"], compile_only)
            s["base_from_seed"] = lender["seed"]
    return lender["seed"]


def stage_summary(per_seed: list[dict[str, Any]], stage: str,
                  compile_only: bool) -> dict[str, Any]:
    """``{stage}/{metric}``: mean and std over seeds, bootstrap CI over pooled episodes (those
    of one problem and seed resampled together: --eval-samples' episodes are not independent)."""
    from multiminddev.report.metrics import bootstrap_ci
    from multiminddev.train.seeds import mean_and_std

    pooled = [r for s in per_seed for r in s["rows"][stage]]
    clusters = [rows for s in per_seed for rows in rows_by_problem(s["rows"][stage]).values()]
    out: dict[str, Any] = {}
    for metric in METRICS:
        values = [s["metrics"][stage][metric] for s in per_seed]
        ci = bootstrap_ci(clusters, lambda cs, m=metric: stage_metrics(
            [r for c in cs for r in c], compile_only)[m])
        mean, std = mean_and_std(values)
        out[f"{stage}/{metric}"] = {"mean": mean, "std": std, "ci95": list(ci),
                                    "per_seed": values}
    # Episodes longer than two turns also say what two turns reached (the protocol of earlier runs)
    if pooled and all("correct_turn" in r for r in pooled) and max(r["turns"] for r in pooled) > 2:
        for metric in ("compile_rate", "correct_rate"):
            values = [rate_within_turns(s["rows"][stage], metric, 2) for s in per_seed]
            mean, std = mean_and_std(values)
            out[f"{stage}/{metric}_within_2_turns"] = {"mean": mean, "std": std,
                                                       "per_seed": values}
    return out


def rows_by_problem(stage_rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A stage's rows grouped by problem, in the order the problems first appear."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in stage_rows:
        grouped.setdefault(row["problem"], []).append(row)
    return grouped


def rate_within_turns(rows: list[dict[str, Any]], metric: str, turns: int) -> float:
    """The share of episodes whose first compiled (or correct) turn came within ``turns``."""
    key = {"compile_rate": "compiled_turn", "correct_rate": "correct_turn"}[metric]
    return sum(0 < r[key] <= turns for r in rows) / max(len(rows), 1)


def gain_summary(per_seed: list[dict[str, Any]], stage: str, metric: str,
                 baseline: str = "sft") -> dict[str, Any]:
    """``stage`` minus ``baseline`` (SFT) per seed; it counts only if its mean exceeds its
    spread."""
    from multiminddev.train.seeds import mean_and_std

    gains = [s["metrics"][stage][metric] - s["metrics"][baseline][metric] for s in per_seed]
    mean, spread = mean_and_std(gains)
    if len(gains) < 2:  # one seed measures no spread, and a gain must exceed its spread
        spread = math.inf
    return {"mean": mean, "std": spread, "per_seed": gains, "exceeds_spread": mean > spread}


def spread_text(gain: dict[str, Any]) -> str:
    """A gain's spread as results.md says it; one seed has none (gain_summary counts it as
    infinite, so that no single seed meets a target)."""
    if math.isinf(gain["std"]):
        return "one seed: no spread, so it cannot exceed it"
    return f"std over seeds {gain['std']:.3f}"


def aggregate(per_seed: list[dict[str, Any]], compile_only: bool,
              base_run: dict[str, Any] | None = None) -> dict[str, Any]:
    share_base_stage(per_seed, compile_only, base_run)
    out: dict[str, Any] = {}
    for stage in STAGES:
        out.update(stage_summary(per_seed, stage, compile_only))
    for stage in STAGES:
        out.update(episode_counts(per_seed, stage))
    for metric in ("reward_mean", "fast_1"):
        out[f"gain/{metric}"] = gain_summary(per_seed, "grpo", metric)
    out.update(train_distribution_summary(per_seed, compile_only))
    if any(chosen_step(s["rows"]) is not None for s in per_seed):
        # a seed recorded before --select-min-gain chose by the best reward alone
        out["select"] = {"chosen_step": [chosen_step(s["rows"], s.get("select_min_gain", 0.0))
                                         for s in per_seed],
                         "rewards": [select_rewards(s["rows"]) for s in per_seed],
                         "seeds": [s.get("seed") for s in per_seed],
                         "reused_sft_evaluation": [s.get("select", {}).get(
                             "reused_sft_evaluation", []) for s in per_seed]}
    if any("grpo_budget_stop" in s for s in per_seed):
        out["grpo_budget_stop"] = [s.get("grpo_budget_stop") for s in per_seed]
    return out


def episode_counts(per_seed: list[dict[str, Any]], stage: str) -> dict[str, list[int]]:
    """Per seed, the stage's episodes whose evaluation failed on our side (counted as failures)
    and those whose Optimizer resubmitted a kernel, where every row records it (older records
    do not)."""
    rows = [r for s in per_seed for r in s["rows"][stage]]
    out: dict[str, list[int]] = {}
    if all("infra_error" in r for r in rows):
        out[f"{stage}/infra_errors"] = [sum(r["infra_error"] for r in s["rows"][stage])
                                        for s in per_seed]
    if rows and all("repeats" in r for r in rows):
        out[f"{stage}/repeat_episodes"] = [sum(r["repeats"] > 0 for r in s["rows"][stage])
                                           for s in per_seed]
    return out


def train_distribution_summary(per_seed: list[dict[str, Any]],
                               compile_only: bool) -> dict[str, Any]:
    """The train_* stages (--train-eval-problems) every seed measured, summarised as
    ``stage_summary`` does, and ``train_gain/{metric}``: train_grpo minus train_sft per seed, as
    ``gain_summary``. ``train_eval`` names the problems, their spec, and the seeds that lack a
    stage (a stage some seeds lack is not aggregated: its mean would be over other seeds). Empty
    where no seed measured a train_* stage (runs without the option, older records)."""
    measured = [st for st in TRAIN_STAGES if any(st in s["rows"] for s in per_seed)]
    if not measured:
        return {}
    stages = [st for st in measured if all(st in s["rows"] for s in per_seed)]
    specs = {s.get("train_eval_problems") or "an unrecorded spec" for s in per_seed
             if any(st in s["rows"] for st in measured)}
    out: dict[str, Any] = {"train_eval": {
        "problems_spec": " | ".join(sorted(specs)),
        "problems": sorted({r["problem"] for s in per_seed for st in measured
                            for r in s["rows"].get(st, [])}),
        "stages": stages,
        "missing": {st: [s.get("seed") for s in per_seed if st not in s["rows"]]
                    for st in measured if st not in stages}}}
    for stage in stages:
        for s in per_seed:  # older seed results carry rows of these stages but no metrics
            s.setdefault("metrics", {})[stage] = stage_metrics(s["rows"][stage], compile_only)
        out.update(stage_summary(per_seed, stage, compile_only))
        out.update(episode_counts(per_seed, stage))
    if set(TRAIN_STAGES) <= set(stages):
        for metric in TRAIN_GAIN_METRICS:
            out[f"train_gain/{metric}"] = gain_summary(per_seed, "train_grpo", metric,
                                                       baseline="train_sft")
    return out


def intermediate_stages(per_seed: list[dict[str, Any]]) -> list[str]:
    """GRPO stages every seed has ("grpo@4", ..., then "grpo"), in step order."""
    common = set.intersection(*(set(s["rows"]) for s in per_seed)) if per_seed else set()
    marks = sorted((int(st.split("@")[1]), st) for st in common if st.startswith("grpo@"))
    return [st for _, st in marks] + (["grpo"] if "grpo" in common else [])


def aggregate_partial(per_seed: list[dict[str, Any]], compile_only: bool,
                      base_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Like ``aggregate`` over the stages every seed reached (a run cut short): each GRPO
    stage, intermediate ones included, against SFT."""
    for s in per_seed:
        s.setdefault("metrics", {}).update(
            {st: stage_metrics(rows, compile_only) for st, rows in s["rows"].items()})
    if any("base" in s["rows"] for s in per_seed) or base_run is not None:
        share_base_stage(per_seed, compile_only, base_run)
    stages = [st for st in ("base", "sft") if all(st in s["rows"] for s in per_seed)]
    stages += intermediate_stages(per_seed)
    out: dict[str, Any] = {"stages": stages}
    for stage in stages:
        out.update(stage_summary(per_seed, stage, compile_only))
        if stage.startswith("grpo") and "sft" in stages:
            for metric in ("reward_mean", "fast_1", "correct_rate"):
                out[f"gain/{stage}/{metric}"] = gain_summary(per_seed, stage, metric)
    out.update(train_distribution_summary(per_seed, compile_only))
    return out


def sft_note(per_seed: list[dict[str, Any]], train_problems: str) -> str:
    """Names the SFT data where a seed's was not GRPO's problems ("" where all were). A record
    without the key predates --sft-problems: its SFT data was its training problems."""
    specs = sorted({s.get("sft_problems") or train_problems for s in per_seed})
    return "" if specs == [train_problems] else "SFT data " + " | ".join(specs)


def targets(summary: dict[str, Any]) -> dict[str, bool]:
    return {
        "sft_compile_rate>=0.8": summary["sft/compile_rate"]["mean"] >= 0.8,
        "sft_correct_rate>=0.6": summary["sft/correct_rate"]["mean"] >= 0.6,
        "grpo_reward_gain>spread": summary["gain/reward_mean"]["exceeds_spread"],
        "grpo_fast_1_gain>spread": summary["gain/fast_1"]["exceeds_spread"],
    }


def plot_learning(summary: dict[str, Any], path: Path, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.4))
    for ax, metric in zip(axes, METRICS):
        means = [summary[f"{s}/{metric}"]["mean"] for s in STAGES]
        errs = [summary[f"{s}/{metric}"]["std"] for s in STAGES]
        ax.bar(STAGES, means, yerr=errs, capsize=4, color=["#999", "#4a90d9", "#e07b39"])
        ax.set_title(metric)
    fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def within_two_turns_lines(summary: dict[str, Any],
                           stages: tuple[str, ...] | None = None) -> list[str]:
    """The rates two turns reached, where the episodes ran longer; of ``stages`` (None: the
    held-out ones, every stage but the train_* ones, which have a section of their own)."""
    def shown(stage: str) -> bool:
        return stage not in TRAIN_STAGES if stages is None else stage in stages

    return [f"- {key.replace('/', ' ')}: {e['mean']:.3f} ± {e['std']:.3f}; per seed "
            f"{[round(x, 3) for x in e['per_seed']]}"
            for key, e in summary.items()
            if key.endswith("_within_2_turns") and shown(key.split("/")[0])]


def summary_cell(entry: dict[str, Any]) -> str:
    """One stage-metric of a summary as results.md's tables show it."""
    return (f"{entry['mean']:.3f} ± {entry['std']:.3f} "
            f"[{entry['ci95'][0]:.3f}, {entry['ci95'][1]:.3f}]")


def episode_count_lines(summary: dict[str, Any], stages: tuple[str, ...] | list[str]) -> list[str]:
    """The per-seed infrastructure-error and resubmission counts of ``stages``."""
    lines = ["- Episodes with an infrastructure error (counted as failures above), per seed: "
             + "; ".join(f"{stage} {summary.get(f'{stage}/infra_errors', 'not recorded')}"
                         for stage in stages)]
    if any(f"{stage}/repeat_episodes" in summary for stage in stages):
        lines.append("- Episodes whose Optimizer resubmitted an earlier kernel unchanged, per seed: "
                     + "; ".join(f"{stage} {summary.get(f'{stage}/repeat_episodes', 'not recorded')}"
                                 for stage in stages))
    return lines


def train_distribution_lines(summary: dict[str, Any]) -> list[str]:
    """The section on the train_* stages (--train-eval-problems) of results.md and
    results_partial.md; none where no seed measured them."""
    info = summary.get("train_eval")
    if info is None:
        return []
    title = (f"## GRPO's training distribution ({len(info['problems'])} problems from "
             f"{info['problems_spec']}), not held out")
    lines = ["", title, ""]
    if info["stages"]:
        lines += ["| stage | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
        lines += [f"| {stage} | " + " | ".join(summary_cell(summary[f"{stage}/{m}"])
                                              for m in METRICS) + " |"
                  for stage in info["stages"]]
        lines += ["", ("The same seeds' SFT and GRPO agents, evaluated as on the held-out "
                       "problems; mean ± std over seeds [bootstrap 95% CI over pooled episodes]"),
                  ""]
    for m in TRAIN_GAIN_METRICS:
        if (g := summary.get(f"train_gain/{m}")) is not None:
            lines.append(f"- train_grpo - train_sft {m}: {g['mean']:+.3f} ({spread_text(g)}); "
                         f"per seed {[round(x, 3) for x in g['per_seed']]}")
    lines += within_two_turns_lines(summary, TRAIN_STAGES)
    if info["stages"]:
        lines += episode_count_lines(summary, info["stages"])
    lines += [f"- {stage}: not measured by seeds {seeds}, so not aggregated"
              for stage, seeds in info["missing"].items()]
    return lines


def write_markdown(summary: dict[str, Any], checks: dict[str, bool], path: Path, note: str) -> None:
    lines = [f"Measured on: {note}", "", "| stage | " + " | ".join(METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]
    for stage in STAGES:
        lines.append(f"| {stage} | " + " | ".join(summary_cell(summary[f"{stage}/{m}"])
                                                  for m in METRICS) + " |")
    lines += ["", "mean ± std over seeds [bootstrap 95% CI over pooled episodes]", ""]
    for m in ("reward_mean", "fast_1"):
        g = summary[f"gain/{m}"]
        lines.append(f"- GRPO - SFT {m}: {g['mean']:+.3f} ({spread_text(g)}); "
                     f"per seed {[round(x, 3) for x in g['per_seed']]}")
    lines += within_two_turns_lines(summary)
    lines += episode_count_lines(summary, STAGES)
    if (chosen := summary.get("select")) is not None:
        lines.append(f"- GRPO's agents: those of the step with the best select@ reward (early "
                     f"stopping; 0 is SFT's), per seed {chosen['chosen_step']}; select@ rewards "
                     f"per seed {[{k: round(v, 3) for k, v in r.items()} for r in chosen['rewards']]}")
        reusing = [seed for seed, stages in zip(chosen["seeds"], chosen["reused_sft_evaluation"])
                   if stages]
        if reusing:
            lines.append(f"- Seeds {reusing} kept SFT's agents: their grpo and train_grpo rows are "
                         "SFT's evaluation, not a second one (the same agents)")
    if (stops := summary.get("grpo_budget_stop")) is not None:
        lines.append(f"- GRPO stopped early by --time-budget at step, per seed {stops} (None: "
                     "it ran every step)")
    lines += ["", "Targets: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in checks.items())]
    lines += train_distribution_lines(summary)  # after the targets: they are held-out only
    path.write_text("\n".join(lines) + "\n")


def turn_status(turn: dict[str, Any]) -> str:
    """One turn's outcome: the evaluator's status, or why nothing was evaluated."""
    if turn.get("eval_result"):
        return turn["eval_result"]["status"]
    return turn.get("parse_failure") or "not_evaluated"


def outcome_table(output_dir: Path, seeds: list[int]) -> str:
    """Per problem, the status of each turn (generator>optimizer...) per stage and seed, from
    the seeds' episodes_<stage>.jsonl: which problems a stage won or lost. Held-out problems,
    and GRPO's training problems in the train_* stages' columns (after the held-out ones)."""
    def stage_key(stage: str) -> tuple[int, int, str]:
        if stage.startswith("grpo@"):
            return (2, int(stage.removeprefix("grpo@")), "")
        if stage.startswith(SELECT):  # select@4 before select@12
            return (5 + len(TRAIN_STAGES), int(stage.removeprefix(SELECT)), "")
        order = {"base": 0, "sft": 1, "grpo": 3, **{st: 4 + i for i, st in enumerate(TRAIN_STAGES)}}
        return (order.get(stage, 4 + len(TRAIN_STAGES)), 0, stage)

    found = {p.stem.removeprefix("episodes_") for s in seeds
             for p in (output_dir / f"seed{s}").glob("episodes_*.jsonl")}
    columns = [(stage, s) for stage in sorted(found, key=stage_key) for s in seeds]
    cells: dict[str, dict[tuple[str, int], str]] = {}
    for stage, s in columns:
        path = output_dir / f"seed{s}" / f"episodes_{stage}.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            episode = json.loads(line)
            # --eval-samples' episodes of one problem share a cell, separated by " | "
            cell = cells.setdefault(episode["problem"]["name"], {})
            statuses = ">".join(turn_status(t) for t in episode["turns"])
            cell[(stage, s)] = (f"{cell[(stage, s)]} | {statuses}" if (stage, s) in cell
                                else statuses)
    lines = [("# problem (held-out; in train_* columns one of GRPO's training problems), then "
              "per stage and seed the status of each turn (generator>optimizer...), from "
              "episodes_<stage>.jsonl"),
             "\t".join(["problem", *(f"{stage}/s{s}" for stage, s in columns)])]
    for problem, row in cells.items():
        lines.append("\t".join([problem, *(row.get(c, "-") for c in columns)]))
    return "\n".join(lines) + "\n"


def eval_decoding_note(args: BenchArgs) -> str:
    """How the evaluations decoded, for results.md's first line; "" for one greedy episode per
    problem, the default."""
    if args.eval_temperature <= 0:
        return ""
    return (f"; evaluations sampled at temperature {args.eval_temperature:g}, "
            f"{args.eval_samples} episode{'s' * (args.eval_samples > 1)} per problem")


def write_outcomes(output_dir: Path, seeds: list[int]) -> None:
    (output_dir / "outcomes.tsv").write_text(outcome_table(output_dir, seeds))


def write_partial_results(args: BenchArgs) -> int:
    """--aggregate-partial: results_partial.{json,md} from the seeds' partial.json files."""
    per_seed = []
    for seed in args.seeds:
        partial = _read_json(args.output_dir / f"seed{seed}" / "partial.json")
        if partial is None:
            print(f"seed {seed}: no partial.json in {args.output_dir / f'seed{seed}'}",
                  file=sys.stderr)
            return 2
        per_seed.append({"seed": seed, "rows": partial.get("rows", {}),
                         "sft_problems": partial.get("sft_problems"),
                         "train_eval_problems": partial.get("train_eval_problems")})
    note_path = args.output_dir / "note.txt"
    note = note_path.read_text().strip() if note_path.is_file() else ""
    specs = sorted({s["sft_problems"] for s in per_seed if s["sft_problems"]})
    if specs:  # older partial.json files do not record it
        note += "; SFT data " + " | ".join(specs)
    compile_only = "COMPILE-ONLY" in note
    base_run = _read_json(args.output_dir / BASE_DIR / "partial.json")
    summary = aggregate_partial(per_seed, compile_only, base_run)
    (args.output_dir / "results_partial.json").write_text(json.dumps(
        {"note": note, "seeds": args.seeds, "summary": summary}, indent=2))
    lines = [f"Measured on: {note}; seeds {args.seeds}; stages every seed reached", "",
             "| stage | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for stage in summary["stages"]:
        lines.append(f"| {stage} | " + " | ".join(
            f"{summary[f'{stage}/{m}']['mean']:.3f} ± {summary[f'{stage}/{m}']['std']:.3f}"
            for m in METRICS) + " |")
    lines += ["", "mean ± std over seeds", "", *within_two_turns_lines(summary)]
    for key, g in summary.items():
        if key.startswith("gain/"):
            lines.append(f"- {key.removeprefix('gain/')} minus SFT: {g['mean']:+.3f} (std "
                         f"{g['std']:.3f}); per seed {[round(x, 3) for x in g['per_seed']]}")
    lines += train_distribution_lines(summary)
    (args.output_dir / "results_partial.md").write_text("\n".join(lines) + "\n")
    write_outcomes(args.output_dir, args.seeds)
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    import torch

    from multiminddev.env import Evaluator
    from multiminddev.episode.infra import InfraFailure
    from multiminddev.tasks.loaders import load_problems

    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    done = {s: r for s in args.seeds if (r := finished_seed(args.output_dir, s)) is not None}
    if args.base_only:
        done = {}  # one evaluation of the base; nothing else is run
    if args.aggregate_partial:
        return write_partial_results(args)
    if args.aggregate_only:
        missing = [s for s in args.seeds if s not in done]
        if missing or not done:
            print(f"seeds {missing or args.seeds} have no seed_result.json in {args.output_dir}",
                  file=sys.stderr)
            return 2
        note_path = args.output_dir / "note.txt"
        note = note_path.read_text().strip() if note_path.is_file() else ""
        compile_only = "COMPILE-ONLY" in note
        per_seed, start = [done[s] for s in args.seeds], time.perf_counter()
    else:
        compile_only = not torch.cuda.is_available()
        device = torch.cuda.get_device_name(0) if not compile_only else "cpu"
        # Seeds may run in parallel processes sharing the output directory: the note names the
        # device and model; the seeds are added when results are aggregated.
        note = f"{device}; model {args.model}" + eval_decoding_note(args) + (
            "; COMPILE-ONLY REWARDS (no GPU): correctness and speed were not measured"
            if compile_only else "")
        print(f"{note}; seeds {args.seeds}", flush=True)
        (args.output_dir / "note.txt").write_text(note + "\n")
        train = load_problems(args.train_problems)
        sft = train if args.sft_problems == args.train_problems else load_problems(
            args.sft_problems)
        heldout = load_problems(args.heldout_problems)[: args.eval_problems]
        print(f"problems: {len(sft)} for SFT ({args.sft_problems}), {len(train)} for GRPO "
              f"({args.train_problems}), {len(heldout)} held-out", flush=True)
        train_eval = []
        if args.train_eval_problems:
            train_eval = train_eval_subset(
                train if args.train_eval_problems == args.train_problems
                else load_problems(args.train_eval_problems), args.train_eval_count)
            print(f"problems: {len(train_eval)} of {args.train_eval_problems} chosen for the "
                  "train_sft and train_grpo evaluations (GRPO's training distribution): "
                  + ", ".join(p.name for p in train_eval), flush=True)
            done = {s: r for s, r in done.items()
                    if not lacks_train_stages(args.output_dir, s, r, args.sft_only)}
        # a seed recorded with a stage the evaluator failed runs again; run_seed measures it again
        done = {s: r for s, r in done.items()
                if not infra_failed_stages([r], args.max_infra_share)}
        select = select_problems(args.select_problems, args.select_count, heldout,
                                 args.select_also, args.select_also_count, [*train, *sft])
        start = time.perf_counter()
        code_at_start = code_fingerprint(code_files())
        try:
            with Evaluator(heldout_eval_config(args.eval_workers)) as evaluator:
                per_seed = []
                for s in args.seeds:
                    if s in done:
                        print(f"seed {s}: finished earlier, reusing {args.output_dir}/seed{s}",
                              flush=True)
                        per_seed.append(done[s])
                    else:
                        per_seed.append(run_seed(args, s, train, heldout, evaluator,
                                                 compile_only, sft=sft, train_eval=train_eval,
                                                 select=select))
                    if args.base_only:
                        return 0
        except InfraFailure as exc:  # a stage of the evaluator's failures is no result
            print(f"error: {exc}{code_change_note(code_at_start)}", file=sys.stderr, flush=True)
            return INFRA_EXIT_CODE
        if args.sft_only:
            return write_partial_results(args)
    failed = infra_failed_stages(per_seed, args.max_infra_share)
    if failed:
        print("error: " + "\n".join(failed) + "\nRun those seeds again without --aggregate-only: "
              "their failed stages are measured again.", file=sys.stderr, flush=True)
        return INFRA_EXIT_CODE
    base_run = _read_json(args.output_dir / BASE_DIR / "partial.json")
    if not any("base" in s["rows"] for s in per_seed) and not (base_run or {}).get("rows"):
        print(f"seeds {args.seeds} finished without a base stage (--skip-base); aggregate with "
              f"the seed that measured it: --aggregate-only --seeds ...", flush=True)
        return 0
    summary = aggregate(per_seed, compile_only, base_run)
    lender = {s.get("base_from_seed") for s in per_seed} - {None}
    note = "; ".join(x for x in (note, f"seeds {args.seeds}",
                                 sft_note(per_seed, args.train_problems)) if x) + (
        f"; base stage measured once, by seed {lender.pop()} (greedy decoding)" if lender else "")
    checks = targets(summary)
    result = {"note": note, "args": {k: str(v) for k, v in vars(args).items()},
              "summary": summary, "targets": checks, "seconds": time.perf_counter() - start,
              "per_seed": per_seed}
    (args.output_dir / "results.json").write_text(json.dumps(result, indent=2, default=str))
    write_markdown(summary, checks, args.output_dir / "results.md", note)
    plot_learning(summary, args.output_dir / "learning.png", note)
    write_outcomes(args.output_dir, args.seeds)
    print((args.output_dir / "results.md").read_text())
    print(f"total {result['seconds'] / 60:.1f} min; results in {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
