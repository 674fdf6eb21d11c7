"""The built-in problem corpus: operation families in four tiers, with reference solutions.

    problems = builtin_problems(tiers=[0, 1], split="train", seed=0)
    source = reference_solution(problems[0], variant="fast")   # a ModelNew candidate, or None

Tier 0: elementwise ops and activations. Tier 1: reductions, scans, transposes, mat-vec,
gathers. Tier 2: softmax, norms, matmul variants, pooling, convolution. Tier 3: fused patterns
(linear + activation, scaled softmax, residual + norm, bias + GELU, SwiGLU, attention).
Every family has a naive reference solution; most have a faster one. docs/corpus.md lists them.

Apart from the corpus, ``breadth_problems()`` gives the SFT-only "breadth" families
(``breadth.py``): more elementwise operations for SFT, never split or evaluated; and
``practice_problems()`` the GRPO-only practice families (``breadth.py`` too), which SFT never
sees.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from multiminddev.tasks.builtin.breadth import breadth_families, practice_families
from multiminddev.tasks.builtin.conv import tier2_conv_families, tier3_conv_families
from multiminddev.tasks.builtin.elementwise import fused_elementwise_families, tier0_families
from multiminddev.tasks.builtin.linalg import (
    matmul_families,
    tier1_linalg_families,
    tier3_matmul_families,
)
from multiminddev.tasks.builtin.rows import (
    tier1_row_families,
    tier2_row_families,
    tier3_row_families,
)
from multiminddev.tasks.builtin.resize import resized_shapes
from multiminddev.tasks.builtin.spec import ORIGIN, Family, Shape, Variant
from multiminddev.tasks.problem import Problem, load_problem_source


def _all_families() -> tuple[Family, ...]:
    families = [
        *tier0_families(),
        *tier1_row_families(),
        *tier1_linalg_families(),
        *tier2_row_families(),
        *matmul_families(),
        *tier2_conv_families(),
        *tier3_matmul_families(),
        *tier3_row_families(),
        *fused_elementwise_families(),
        *tier3_conv_families(),
    ]
    names = [f.name for f in families]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RuntimeError(f"duplicate built-in family names: {duplicates}")
    return tuple(sorted(families, key=lambda f: (f.tier, f.name)))


FAMILIES: tuple[Family, ...] = _all_families()
FAMILY_BY_NAME = MappingProxyType({f.name: f for f in FAMILIES})


def get_family(name: str) -> Family:
    try:
        return FAMILY_BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"no built-in family {name!r}; `multiminddev problems list` shows them"
        ) from None


def make_problem(family: Family, s: Shape, split: str = "") -> Problem:
    """Render one (family, shape) point into a Problem, metadata read back from its source."""
    source = family.render_problem(s)
    problem = load_problem_source(source, name=family.problem_name(s))
    return dataclasses.replace(problem, split=split)


def builtin_problems(
    *,
    tiers: Iterable[int] | None = None,
    families: Iterable[str] | None = None,
    split: str | None = None,
    seed: int = 0,
    shapes_per_family: int | None = 2,
    small: bool = False,
    resized: int = 0,
    resized_from: int = 0,
) -> list[Problem]:
    """Problems of the built-in corpus, deterministic for a given seed.

    ``split`` ("train" | "heldout" | None for both) filters by the seed's split; then at most
    ``shapes_per_family`` shapes per family are kept (None: all). ``small=True`` gives one tiny
    problem per family (for CPU tests), labelled with its family's split.
    ``resized=N`` (with ``split="train"`` only) adds, per training family and dtype, N shapes
    that are not in the corpus (``resize.resized_shapes``), after the family's own;
    ``resized_from=K`` takes them after the first K of that sequence, so they share no size with
    ``resized=K``.
    """
    from multiminddev.tasks.splits import Split, SplitConfig, assign_splits, heldout_families

    wanted_split = Split(split) if split is not None else None
    if shapes_per_family is not None and shapes_per_family < 1:
        raise ValueError(f"shapes_per_family must be >= 1 or None, got {shapes_per_family}")
    if resized and (wanted_split is not Split.TRAIN or small):
        raise ValueError("resized shapes are training data: use them with split='train' and "
                         "full-size shapes (not small)")
    selected = _select(tiers, families)
    config = SplitConfig(seed=seed)
    assignment = assign_splits(FAMILIES, config)
    held = heldout_families(FAMILIES, config)
    problems: list[Problem] = []
    for family in selected:
        if small:
            points = [(family.small, Split.HELDOUT if family.name in held else Split.TRAIN)]
        else:
            points = list(zip(family.shapes, assignment[family.name], strict=True))
        points = [(s, sp) for s, sp in points if wanted_split is None or sp is wanted_split]
        if shapes_per_family is not None:
            points = points[:shapes_per_family]
        problems.extend(make_problem(family, s, sp.value) for s, sp in points)
        if resized and family.name not in held:
            bases = [s for s, sp in zip(family.shapes, assignment[family.name], strict=True)
                     if sp is Split.TRAIN]
            problems.extend(make_problem(family, s, Split.TRAIN.value)
                            for s in resized_shapes(family, bases, resized, seed=seed,
                                                    start=resized_from))
    return problems


def _select(tiers: Iterable[int] | None, names: Iterable[str] | None) -> list[Family]:
    tier_set = set(tiers) if tiers is not None else None
    name_list = list(names) if names is not None else None
    if name_list is not None:
        for name in name_list:
            get_family(name)  # unknown names fail loudly
    return [
        f for f in FAMILIES
        if (tier_set is None or f.tier in tier_set) and (name_list is None or f.name in name_list)
    ]


@functools.cache
def breadth_by_name() -> Mapping[str, Family]:
    """The SFT-only breadth families by name (built once, on first use)."""
    return MappingProxyType({f.name: f for f in breadth_families()})


def breadth_problems(*, small: bool = False, shapes_per_family: int | None = None,
                     families: Iterable[str] | None = None) -> list[Problem]:
    """Every shape (or the first ``shapes_per_family``) of every SFT-only breadth family, or of
    those named in ``families`` (``small=True``: one tiny problem each).

    Their ``split`` is "" (they are in no split) and ``extra["breadth"]`` is True."""
    return _breadth_like(breadth_by_name(), "breadth", small=small,
                         shapes_per_family=shapes_per_family, families=families)


@functools.cache
def practice_by_name() -> Mapping[str, Family]:
    """The GRPO-only practice families by name (built once, on first use)."""
    return MappingProxyType({f.name: f for f in practice_families()})


def _breadth_like(table: Mapping[str, Family], what: str, *, small: bool,
                  shapes_per_family: int | None, families: Iterable[str] | None) -> list[Problem]:
    chosen = list(table.values())
    if families is not None:
        names = list(families)
        if unknown := [n for n in names if n not in table]:
            raise KeyError(f"no {what} family {', '.join(map(repr, unknown))}; "
                           f"{what} families: {', '.join(table)}")
        chosen = [table[n] for n in names]
    if small:
        return [make_problem(f, f.small) for f in chosen]
    return [make_problem(f, s) for f in chosen for s in f.shapes[:shapes_per_family]]


def practice_problems(*, small: bool = False, shapes_per_family: int | None = None,
                      families: Iterable[str] | None = None) -> list[Problem]:
    """Every shape (or the first ``shapes_per_family``) of every GRPO-only practice family, or
    of those named in ``families`` (``small=True``: one tiny problem each). Their ``split`` is
    "" and their metadata has no marker (``Family.practice`` says why)."""
    return _breadth_like(practice_by_name(), "practice", small=small,
                         shapes_per_family=shapes_per_family, families=families)


def reference_solution(problem: Problem, variant: Variant | str = Variant.NAIVE) -> str | None:
    """A reference candidate (ModelNew source) for a built-in problem (corpus or breadth); None
    when the problem is not built-in or its family has no such variant."""
    if problem.extra.get("origin") != ORIGIN:
        return None
    # A breadth problem is looked up among the breadth families only (a practice problem among
    # the practice ones), a corpus problem among the corpus's: the name sets are disjoint, and
    # none answers for another.
    # Practice problems carry no marker: a name neither table has is looked up there.
    if problem.extra.get("breadth"):
        family = breadth_by_name().get(problem.family)
    else:
        family = FAMILY_BY_NAME.get(problem.family) or practice_by_name().get(problem.family)
    if family is None:
        return None
    return family.render_solution(Variant(variant), problem.dtype)


__all__ = [
    "FAMILIES",
    "FAMILY_BY_NAME",
    "Family",
    "Shape",
    "Variant",
    "breadth_by_name",
    "breadth_families",
    "breadth_problems",
    "builtin_problems",
    "get_family",
    "make_problem",
    "practice_by_name",
    "practice_families",
    "practice_problems",
    "reference_solution",
]
