"""Named training recipes: ``multiminddev train --recipe NAME`` (``--list-recipes`` lists them).

A recipe fixes some ``TrainSettings`` fields and leaves the rest at their defaults; a config
file, ``--set`` and explicit flags override it, in that order (docs/training.md, "Recipes and
config files"). Every setting a recipe uses is a ``TrainSettings`` field, so it is reachable
from a config file and ``--set`` too; a recipe is checked by building the settings it gives.

A recipe's ``not_in_product`` lists what its measured run also did that is not a product setting
yet (the GRPO recipes: ``benchmarks/bench_learning.py``'s SFT operation line, comment stripping,
element-type line, early stopping on selection problems, evaluation dtype, GRPO options), so
that a run of the recipe is not mistaken for that run.
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

# The SFT data and GRPO setting of the learning benchmark (docs/training.md), as far as they
# are product settings. Both GRPO recipes share them, so they differ only in what GRPO trains.
_LEARNING_BENCHMARK = {
    "sft_problems": "builtin:tier0:train:allshapes:resized4+builtin:tier1:train:resized4*2"
                    "+builtin:breadth:shapes1",
    "sft_steps": 300,
    "train_problems": "builtin:tier1:train:resized8from4:cumsum:transpose:matvec:argmax_dim",
    "heldout_problems": "builtin:tier0,tier1:heldout",
    "num_steps": 12,
    "batch_size": 3,
    "group_size": 8,
    "max_turns": 2,
    "max_new_tokens": 800,
    "learning_rate": 5e-5,
    "kl_reference": "start",
    "compiled_decoding": True,
}

# What benchmarks/bench_learning.py's measured run set that TrainSettings has no field for
# yet (the product's value in brackets).
_BENCHMARK_ONLY = (
    "SFT: the operation line in both agents' replies (--sft-operation-line) [none]",
    "SFT: comment-free Optimizer targets (--sft-strip-comments) [comments kept]",
    "prompts: the element-type line (--element-type-line) [none]",
    ("SFT: maximum sequence length 2176 [the preset's 2048]; batches of 4 with 2 accumulation "
    "steps [the preset's batches of 8: the same examples per step]"),
    ("GRPO: temperature 0.8 [1.0], kl_coef 0.1 [0.02], normalize_std false [true], mini-batches "
    "of 24 with 3 accumulation steps [the preset's 16, none]"),
    ("GRPO: no held-out evaluation during training [the preset's every 10 (CPU) or 20 (GPU) "
    "steps]"),
    "a Generator token cap of 512 [max_new_tokens applies to both agents: 800]",
    ("early stopping on selection problems: unseen shapes every 4 steps, the best step's agents "
    "kept (--select-problems) [the last step's agents]"),
    ("evaluation: eager decoding from a float32 copy of the weights (--eval-dtype float32, "
    "--eval-compiled-decoding off) with 2 workers [the run's own dtype and decoding]"),
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
            lines.append("    not yet in the product (the measured run also had):")
            lines += [f"      - {note}" for note in recipe.not_in_product]
    return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value)
    return str(getattr(value, "value", value))
