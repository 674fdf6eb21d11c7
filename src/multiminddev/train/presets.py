"""Named run sizes for ``multiminddev train --preset ...`` (and ``--quick-test``).

A preset fixes how much work a run does; the pipeline fills in the rest. ``QUICKSTART`` is the
README's main command: the embedded SmolLM2-135M model on the built-in tier-0/1 curriculum,
sized to finish in <= 20 min on a 2-core CPU machine (compile-only rewards) and <= 10 min on one
H100 (real rewards). ``QUICK_TEST`` is a smoke test of every phase in a few minutes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Preset(str, enum.Enum):
    QUICKSTART = "quickstart"
    QUICK_TEST = "quick-test"
    FULL = "full"


@dataclass(frozen=True, kw_only=True)
class RunSize:
    """How much work each phase does."""

    train_problems: str  # problem spec (tasks.loaders.load_problems)
    heldout_problems: str
    sft_max_steps: int
    sft_batch_size: int
    sft_loss_examples: int  # examples scored before/after SFT
    sft_max_seq_length: int
    rl_steps: int
    problems_per_step: int
    group_size: int
    max_turns: int
    max_new_tokens: int
    mini_batch_size: int
    eval_every: int
    eval_problems: int
    final_eval_problems: int
    eval_workers: int | None = None  # None: the evaluator's default slots (env.pool.default_slot_count)
    learning_rate: float = 2e-5
    sft_learning_rate: float = 2e-4
    # The Generator learns the corpus's naive solutions only: one target per prompt ("correct
    # first"; the fast variants are the Optimizer's targets) and replies of 310-440 tokens
    # instead of up to 750. On the GPU this took SmolLM2-135M to 94% compiling / 56% correct
    # held-out kernels (docs/training.md, "Generator targets"), where both variants at 40
    # steps gave 1 compiling kernel in 8.
    generator_variants: tuple[str, ...] = ("naive",)
    generator_max_new_tokens: int | None = None  # None: max_new_tokens
    # PolicyConfig.compiled_decoding: a static KV cache and a compiled decoding step (GPU only).
    compiled_decoding: bool = False


# CPU sizes, measured on the 2-core machine with nothing else running: SmolLM2-135M in float32
# generates ~13 tokens/s (batch of 2), an SFT step takes ~6 s (Generator example, ~800 tokens) to
# ~8 s (Optimizer, ~1800), a GRPO update ~30 s; prompts are ~800-1000 tokens. The CPU quickstart
# keeps each phase to a few sequences (a kernel is ~360 tokens, so 384 new tokens can just hold
# one). Other processes on the 2 cores slow every phase several-fold. Optimizer replies (a fast
# kernel) run to 750 tokens on tiers 0-1 and 2490 over all tiers (Generator, naive: 440 and
# 1297), so the sizes give each agent room for its longest taught reply: a reply cut short has
# no closing fence and cannot parse (tests/train/test_pipeline.py checks this). The GPU
# quickstart's size follows the learning benchmark's recipe (150 SFT steps, 2 GRPO steps). With
# eager decoding (60-80 ms per step at any batch) it did not finish within 575 s on an H100;
# with compiled decoding it took 320 s there, a GRPO rollout of 8 episodes 15 s once compiled
# (docs/training.md, "Compiled decoding").
_TIER01 = ("builtin:tier0,tier1:train", "builtin:tier0,tier1:heldout")
_SIZES: dict[tuple[Preset, bool], RunSize] = {
    (Preset.QUICKSTART, False): RunSize(
        train_problems=_TIER01[0], heldout_problems=_TIER01[1],
        sft_max_steps=6, sft_batch_size=1, sft_loss_examples=1, sft_max_seq_length=2048,
        rl_steps=2, problems_per_step=1, group_size=2, max_turns=2, max_new_tokens=384,
        mini_batch_size=4, eval_every=0, eval_problems=0, final_eval_problems=2),
    (Preset.QUICKSTART, True): RunSize(
        train_problems=_TIER01[0], heldout_problems=_TIER01[1],
        sft_max_steps=150, sft_batch_size=8, sft_loss_examples=16, sft_max_seq_length=2048,
        rl_steps=2, problems_per_step=2, group_size=4, max_turns=2, max_new_tokens=800,
        generator_max_new_tokens=512, mini_batch_size=8, eval_every=0, eval_problems=0,
        final_eval_problems=8, eval_workers=4, compiled_decoding=True),
    (Preset.QUICK_TEST, False): RunSize(
        train_problems="builtin:tier0:train", heldout_problems="builtin:tier0:heldout",
        sft_max_steps=1, sft_batch_size=1, sft_loss_examples=1, sft_max_seq_length=2048,
        rl_steps=1, problems_per_step=1, group_size=2, max_turns=2, max_new_tokens=32,
        mini_batch_size=4, eval_every=0, eval_problems=0, final_eval_problems=1),
    (Preset.QUICK_TEST, True): RunSize(
        train_problems="builtin:tier0:train", heldout_problems="builtin:tier0:heldout",
        sft_max_steps=5, sft_batch_size=4, sft_loss_examples=4, sft_max_seq_length=2048,
        rl_steps=2, problems_per_step=2, group_size=2, max_turns=2, max_new_tokens=128,
        mini_batch_size=4, eval_every=0, eval_problems=0, final_eval_problems=2, eval_workers=2),
    (Preset.FULL, False): RunSize(
        train_problems="builtin:train", heldout_problems="builtin:heldout",
        sft_max_steps=200, sft_batch_size=4, sft_loss_examples=16, sft_max_seq_length=2048,
        rl_steps=50, problems_per_step=4, group_size=4, max_turns=3, max_new_tokens=2560,
        generator_max_new_tokens=1344, mini_batch_size=8, eval_every=10, eval_problems=8,
        final_eval_problems=16),
    (Preset.FULL, True): RunSize(
        train_problems="builtin:train", heldout_problems="builtin:heldout",
        sft_max_steps=500, sft_batch_size=8, sft_loss_examples=32, sft_max_seq_length=2048,
        rl_steps=200, problems_per_step=8, group_size=8, max_turns=3, max_new_tokens=2560,
        generator_max_new_tokens=1344, mini_batch_size=16, eval_every=20, eval_problems=32, final_eval_problems=64,
        eval_workers=2),
}


def run_size(preset: Preset, *, gpu: bool) -> RunSize:
    return _SIZES[(Preset(preset), gpu)]
