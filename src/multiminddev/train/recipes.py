"""Named training recipes: ``multiminddev train --recipe NAME`` (``--list-recipes`` lists them).

A recipe fixes some ``TrainSettings`` fields and leaves the rest at their defaults; a config
file, ``--set`` and explicit flags override it, in that order (docs/training.md, "Recipes and
config files"). Every setting a recipe uses is a ``TrainSettings`` field, so it is reachable
from a config file and ``--set`` too; a recipe is checked by building the settings it gives.

A recipe's ``not_in_product`` lists where a run of it still differs from the measured run behind
it (docs/BENCHMARKS.md), so that the two are not mistaken for each other.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multiminddev.train.config_files import ConfigError, settings_values, unknown_key_message
from multiminddev.train.pipeline import TrainSettings

_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A name, a one-line description and the ``TrainSettings`` fields the recipe fixes.

    ``not_in_product`` lists what the measured run behind the recipe also did that is not a
    product setting yet, so a run of the recipe differs from it there.
    """

    name: str
    description: str
    settings: Mapping[str, Any]
    not_in_product: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"recipe name {self.name!r}: lower-case words joined by '-'")
        if not self.description or "\n" in self.description:
            raise ValueError(f"recipe {self.name}: give a one-line description")
        try:  # every key a TrainSettings field, every value of its type
            values = settings_values(TrainSettings, self.settings, where=f"recipe {self.name}")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        TrainSettings(**values)  # the combination is valid: __post_init__'s checks
        object.__setattr__(self, "settings", types.MappingProxyType(values))
        object.__setattr__(self, "not_in_product", tuple(self.not_in_product))

    def settings_for(self) -> dict[str, Any]:
        """The recipe's settings as ``TrainSettings`` keyword arguments (a fresh dict)."""
        return dict(self.settings)


QUICKSTART = Recipe(
    name="quickstart",
    description="the README's few-minute run: SFT of both agents, 2 GRPO steps, a held-out "
                "evaluation (the quickstart preset)",
    settings={"preset": "quickstart"},
)

# The learning benchmark's settings (docs/BENCHMARKS.md, "Learning"): SFT data, SFT, GRPO,
# early stopping and the held-out evaluation. Both GRPO recipes share them, so they differ only
# in what GRPO trains.
_LEARNING_BENCHMARK = {
    # SFT: resized training shapes, the operation line, comment-free Optimizer targets, the
    # element-type line; batches of 4 with 2 accumulation steps, sequences up to 2176 tokens
    "sft_problems": "builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2"
                    "+builtin:breadth:shapes1",
    "sft_steps": 300,
    "sft_batch_size": 4,
    "sft_grad_accum": 2,
    "sft_max_seq_length": 2176,
    "sft_operation_line": True,
    "sft_strip_comments": True,
    "element_type_line": True,
    # GRPO: 12 steps of 3 problems x 8 episodes from tier 1, no review of tier 0
    "train_problems": "builtin:tier1:train:resized8from4:cumsum:transpose:matvec:argmax_dim",
    "heldout_problems": "builtin:tier0,tier1:heldout",
    "curriculum_start_tier": 1,
    "review_fraction": 0.0,
    "num_steps": 12,
    "batch_size": 3,
    "group_size": 8,
    "max_turns": 2,
    "max_new_tokens": 800,
    "generator_max_new_tokens": 512,
    "learning_rate": 5e-5,
    "kl_reference": "start",
    "kl_coef": 0.1,
    "normalize_std": False,
    "rl_temperature": 0.8,
    "mini_batch_size": 24,
    "grad_accum": 3,
    "rl_eval_every": 0,
    "compiled_decoding": True,
    "generation_batch_size": 64,
    # early stopping on unseen shapes every 4 steps
    "select_problems": "builtin:tier1:train:resized2from12:cumsum:transpose:matvec:argmax_dim",
    "select_count": 8,
    "select_also": "builtin:tier0,tier1:train:resized2from12",
    "select_also_count": 10,
    "select_every": 4,
    # evaluation: greedy, eager decoding from a float32 copy, 2 workers, brief timing; the SFT
    # agents are evaluated too, for the GRPO - SFT gain
    "eval_after_sft": True,
    "eval_temperature": 0.0,
    "eval_dtype": "float32",
    "eval_compiled_decoding": False,
    "eval_workers": 2,
    "eval_quick_timing": True,
}

# What the measured run did that the product does differently (the product's value in brackets).
_BENCHMARK_ONLY = (
    "a time budget that stopped GRPO at step 8-11 of 12 on the four seeds [all 12 steps]",
    ("correct and compile rates per episode (any turn) [per evaluated turn]: compare runs of "
     "one kind"),
)

OPTIMIZER_GRPO_GREEDY_GENERATOR = Recipe(
    name="optimizer-grpo-greedy-generator",
    description="SFT of both agents, then GRPO on the Optimizer alone with a greedy Generator "
                "(the recipe that raised held-out reward over SFT)",
    settings={**_LEARNING_BENCHMARK, "rl_roles": ("optimizer",),
              "rl_greedy_roles": ("generator",)},
    not_in_product=_BENCHMARK_ONLY,
)

TWO_AGENT_GRPO = Recipe(
    name="two-agent-grpo",
    description="SFT of both agents, then GRPO on both (it lowered held-out reward at this "
                "size; docs/training.md)",
    settings=dict(_LEARNING_BENCHMARK),
    not_in_product=_BENCHMARK_ONLY,
)

RECIPES: Mapping[str, Recipe] = types.MappingProxyType(
    {r.name: r for r in (QUICKSTART, OPTIMIZER_GRPO_GREEDY_GENERATOR, TWO_AGENT_GRPO)})


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a ``ConfigError`` naming the nearest one otherwise."""
    if name not in RECIPES:
        raise ConfigError(unknown_key_message(name, RECIPES, "--recipe", what="recipe"))
    return RECIPES[name]


def recipe_table() -> str:
    """The recipes, one per line, with what each fixes (``train --list-recipes``)."""
    lines = []
    for recipe in RECIPES.values():
        lines.append(f"{recipe.name}: {recipe.description}")
        for key, value in recipe.settings.items():
            lines.append(f"    {key} = {_show(value)}")
        if recipe.not_in_product:
            lines.append("    differs from the measured run in:")
            lines += [f"      - {note}" for note in recipe.not_in_product]
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value)
    return str(getattr(value, "value", value))
