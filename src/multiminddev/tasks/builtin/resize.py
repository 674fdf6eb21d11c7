"""Resized training shapes: more sizes of a training family, none of them a corpus shape.

Why: after SFT on the training split, the embedded 135M model got a training family wrong at
its held-out *size* in 8-9 of 39 held-out problems on every seed (``argmax_dim``, ``cumsum``,
``max_dim``, ``matvec``, ``embedding``, ``transpose`` and the float16 ``add`` / ``relu``). Its
reply named the right family in its docstring and then wrote the kernel of a sibling family
that had trained at that size (``sum_dim`` at 4096x4096), or the float32 kernel for float16
tensors. A reference solution does not depend on the sizes, so a
prompt should not either: SFT (or GRPO) on the same families at other sizes teaches the model
to read the operation and the dtype, not the numbers.

What keeps the held-out set clean: only training families are resized (a held-out family never
is), and a resized shape is never one of the family's corpus shapes (its held-out one
included). A resized shape keeps its base shape's dtype. Each large size (>= 64) is drawn
log-uniformly from [1024, 16384], whatever the family, and may be made odd, so tails are
exercised; small, batch-like sizes are scaled by a factor in [0.5, 2]. If the draw holds more
elements than the family's largest corpus shape, its large sizes shrink together until it does
not, so memory and run time stay as the corpus's tests bound them.

Why a range that ignores the family's own sizes: the first version scaled each training size
by 0.5-2x, so a family trained only on tall shapes (``argmax_dim`` at 16384x1024 and
1024x16383) got only more tall shapes, and the held-out square one (4096x4096) still looked
like its siblings' training shapes. SFT with it fixed one held-out size of a training family in
one of two seeds; with this range, 64% of the held-out problems instead of 56% (docs/training.md,
"SFT data: resized training shapes").
Deterministic: each shape comes from its own ``random.Random`` seeded with a sha256 of the
split seed, the family, the dtype and the shape's index.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from multiminddev.tasks.builtin.spec import Family, Shape

_FACTORS = (0.5, 0.625, 0.75, 1.25, 1.5, 2.0)  # for small, batch-like sizes
_LARGE_FROM = 64  # sizes from here up are drawn from _LARGE_RANGE and may get a +-1 offset
_LARGE_RANGE = (1024, 16384)
_TRIES = 64  # per shape: draws that collide with a corpus shape or exceed the cap are redrawn


def _rng(seed: int, family: str, dtype: str, index: int) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{family}:{dtype}:resized:{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _elements(s: Shape) -> int:
    return math.prod(int(v) for _, v in s.sizes)


def _draw(base: Shape, rng: random.Random, cap: int) -> Shape:
    lo, hi = (math.log(v) for v in _LARGE_RANGE)
    large = [int(v) >= _LARGE_FROM for _, v in base.sizes]
    sizes = [round(math.exp(rng.uniform(lo, hi))) if is_large
             else max(1, round(int(v) * rng.choice(_FACTORS)))
             for (_, v), is_large in zip(base.sizes, large, strict=True)]
    total = math.prod(sizes)
    if total > cap and any(large):  # shrink the large sizes together to fit the cap
        shrink = (cap / total) ** (1.0 / sum(large))
        sizes = [max(_LARGE_FROM, math.floor(v * shrink)) if is_large else v
                 for v, is_large in zip(sizes, large, strict=True)]
    sizes = [v + rng.choice((-1, 1)) if is_large and rng.random() < 0.5 else v
             for v, is_large in zip(sizes, large, strict=True)]
    return Shape(tuple((name, v) for (name, _), v in zip(base.sizes, sizes, strict=True)),
                 base.dtype)


def resized_shapes(family: Family, bases: Sequence[Shape], count: int, *, seed: int = 0,
                   start: int = 0) -> list[Shape]:
    """``count`` new shapes per dtype of ``bases`` (the family's training shapes).

    Every returned shape differs from each of ``family.shapes`` and from every other one, and
    holds at most as many elements as the family's largest corpus shape. ``start=K`` skips the
    first K of each dtype's sequence: the shapes ``start + count`` would give after those K,
    so none of them is one of the first K (GRPO on sizes SFT's ``resized K`` never showed)."""
    if count < 0 or start < 0:
        raise ValueError(f"count and start must be >= 0, got {count} and {start}")
    cap = max(_elements(s) for s in family.shapes)
    taken = {s.tag for s in family.shapes}
    out: list[Shape] = []
    for dtype in dict.fromkeys(b.dtype for b in bases):
        of_dtype = [b for b in bases if b.dtype == dtype]
        for index in range(start + count):
            rng = _rng(seed, family.name, dtype, index)
            for _ in range(_TRIES):
                s = _draw(of_dtype[index % len(of_dtype)], rng, cap)
                if s.tag not in taken and _elements(s) <= cap:
                    break
            else:  # only a family with tiny sizes could exhaust its draws: say which
                raise RuntimeError(
                    f"family {family.name!r}: no new {dtype} shape in {_TRIES} draws for resized "
                    f"shape {index}; ask for fewer resized shapes"
                )
            taken.add(s.tag)
            if index >= start:
                out.append(s)
    return out
