"""Train / held-out splits of the built-in corpus, by family and by shape, fixed by a seed.

Two kinds of held-out problems:
- held-out *families*: in every tier, ``round(heldout_fraction * n)`` families (at least one)
  are held out whole, so evaluation covers operations the model never trained on;
- held-out *shapes*: each training family keeps one of its shapes back, so evaluation also
  covers new sizes of familiar operations.

Choices rank sha256(f"{seed}:{name}") hashes, so they do not depend on the order families are
listed in, are stable across Python versions, and adding one family moves at most that tier's
count. ``split_manifest(seed)`` records the whole assignment (``problems export`` writes it).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiminddev.tasks.builtin.spec import Family

DEFAULT_HELDOUT_FRACTION = 0.2


class Split(str, enum.Enum):
    TRAIN = "train"
    HELDOUT = "heldout"


@dataclass(kw_only=True, frozen=True)
class SplitConfig:
    seed: int = 0
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION  # of each tier's families
    hold_out_shapes: bool = True  # keep one shape of every training family back

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(
                f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}; "
                "use 0 to train on every family"
            )


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def heldout_families(families: Sequence[Family], config: SplitConfig) -> frozenset[str]:
    """Names of the families held out whole: the lowest-ranked per tier."""
    chosen: set[str] = set()
    for tier in sorted({f.tier for f in families}):
        names = sorted((f.name for f in families if f.tier == tier),
                       key=lambda n: _rank(config.seed, n))
        if config.heldout_fraction <= 0 or len(names) < 2:
            continue
        count = max(1, round(config.heldout_fraction * len(names)))
        chosen.update(names[: min(count, len(names) - 1)])
    return frozenset(chosen)


def heldout_shape_index(family: Family, config: SplitConfig) -> int | None:
    """Index into ``family.shapes`` of the shape a training family keeps back (None: none)."""
    if not config.hold_out_shapes or len(family.shapes) < 2:
        return None
    tags = [s.tag for s in family.shapes]
    return min(range(len(tags)), key=lambda i: _rank(config.seed, f"{family.name}/{tags[i]}"))


def assign_splits(families: Sequence[Family], config: SplitConfig) -> dict[str, list[Split]]:
    """Family name -> the split of each of its shapes (same order as ``family.shapes``)."""
    held = heldout_families(families, config)
    out: dict[str, list[Split]] = {}
    for family in families:
        if family.name in held:
            out[family.name] = [Split.HELDOUT] * len(family.shapes)
            continue
        index = heldout_shape_index(family, config)
        out[family.name] = [
            Split.HELDOUT if i == index else Split.TRAIN for i in range(len(family.shapes))
        ]
    return out


def split_manifest(seed: int = 0, families: Sequence[Family] | None = None,
                   heldout_fraction: float = DEFAULT_HELDOUT_FRACTION) -> dict[str, Any]:
    """The full assignment as plain JSON-able data: families, shapes and problem names."""
    if families is None:
        from multiminddev.tasks.builtin import FAMILIES

        families = FAMILIES
    config = SplitConfig(seed=seed, heldout_fraction=heldout_fraction)
    assignment = assign_splits(families, config)
    held = sorted(heldout_families(families, config))
    problems = {
        family.problem_name(s): split.value
        for family in families
        for s, split in zip(family.shapes, assignment[family.name], strict=True)
    }
    return {
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "heldout_families": held,
        "heldout_families_by_tier": {
            str(t): sorted(f.name for f in families if f.tier == t and f.name in held)
            for t in sorted({f.tier for f in families})
        },
        "heldout_shapes": {
            family.name: family.shapes[i].tag
            for family in families
            if family.name not in held and (i := heldout_shape_index(family, config)) is not None
        },
        "problems": problems,
        "counts": {
            "train": sum(1 for v in problems.values() if v == Split.TRAIN.value),
            "heldout": sum(1 for v in problems.values() if v == Split.HELDOUT.value),
        },
    }
