"""Operation families and how they render problems and reference solutions.

A ``Family`` is one operation (relu, softmax, batched matmul, ...) with a parameter space of
shapes. It renders KernelBench-format problem source (``class Model``, ``get_inputs``,
``get_init_inputs``, module-level size constants, and the ``MULTIMINDDEV`` metadata literal)
and reference candidates (``class ModelNew`` launching NVRTC-compiled kernels).

``ModelNew`` reuses the family's ``__init__`` text verbatim, so it creates the same modules and
parameters in the same order as ``Model``; the evaluator seeds both constructions alike, so
their weights match. Its ``forward`` only allocates, queries shapes and launches kernels.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

ORIGIN = "multiminddev.builtin"  # MULTIMINDDEV["origin"] of every built-in problem
DTYPE_BYTES = MappingProxyType({"float32": 4, "float16": 2})
DTYPE_TORCH = MappingProxyType({"float32": "", "float16": ", dtype=torch.float16"})
DTYPE_CUDA = MappingProxyType({"float32": "float", "float16": "__half"})


class Variant(str, enum.Enum):
    """Which reference solution: a straightforward kernel, or an optimised one."""

    NAIVE = "naive"
    FAST = "fast"


@dataclass(frozen=True)
class Shape:
    """One point of a family's parameter space: named sizes and a dtype."""

    sizes: tuple[tuple[str, float], ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")

    def __getitem__(self, key: str) -> Any:
        for name, value in self.sizes:
            if name == key:
                return value
        raise KeyError(f"shape has no size {key!r}; it has {[n for n, _ in self.sizes]}")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def tag(self) -> str:
        """Short name suffix: ``4096x4096`` or ``4096x4096_fp16``."""
        dims = "x".join(str(v) for _, v in self.sizes)
        return dims + ("_fp16" if self.dtype == "float16" else "")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.sizes)


def shape(dtype: str = "float32", **sizes: float) -> Shape:
    return Shape(tuple(sizes.items()), dtype)


@dataclass(frozen=True, kw_only=True)
class Solution:
    """A reference candidate's parts: CUDA source and the body of ``forward``."""

    cuda: str
    forward: str  # indented body lines of ModelNew.forward (8 spaces)


SolutionFn = Callable[[str], Solution]  # dtype -> solution


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str
    tier: int
    description: str
    shapes: tuple[Shape, ...]  # full-size parameter space, >= 2 points
    small: Shape  # tiny shapes for CPU tests
    inputs: tuple[str, ...]  # get_inputs() expressions; "{dt}" -> ", dtype=torch.float16" or ""
    forward: str  # Model.forward body
    output_shape: Callable[[Shape], tuple[int, ...]]
    bytes_moved: Callable[[Shape], int]
    flops: Callable[[Shape], int]
    forward_args: str = "x"
    init_args: tuple[tuple[str, str], ...] = ()  # (parameter, get_init_inputs expression)
    init_body: str = ""  # __init__ lines after super().__init__() (8 spaces)
    imports: str = ""  # extra problem imports
    naive: SolutionFn
    fast: SolutionFn | None = None
    atol: float | None = None
    rtol: float | None = None
    fast_min_speedup: float = 1.0  # the GPU test asserts fast beats naive by at least this
    tags: tuple[str, ...] = field(default_factory=tuple)
    # An SFT-only "breadth" family (tasks/builtin/breadth.py): not in FAMILIES, never split or
    # evaluated. Its problems say so in their metadata, so a saved or exported problem cannot
    # be mistaken for a corpus problem (nor its solution looked up in the wrong table).
    breadth: bool = False
    # A GRPO-only "practice" family (breadth.py's second list): an operation neither the
    # corpus nor SFT's breadth families have, so GRPO can practise translating a ``forward`` it
    # was never shown into CUDA, the step the held-out families need. Unlike breadth, its
    # problems carry no marker: their prompts read exactly as a corpus problem's (a marker
    # would be a token GRPO's updates could key on, and held-out prompts lack it); the family
    # name, disjoint from the corpus's and breadth's, tells them apart.
    practice: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.tier <= 3:
            raise ValueError(f"family {self.name!r}: tier must be 0-3, got {self.tier}")
        if len(self.shapes) < 2:
            raise ValueError(f"family {self.name!r}: give >= 2 shapes so one can be held out")
        names = [s.tag for s in self.shapes]
        if len(set(names)) != len(names):
            raise ValueError(f"family {self.name!r}: duplicate shapes {names}")

    @property
    def variants(self) -> tuple[Variant, ...]:
        return (Variant.NAIVE, Variant.FAST) if self.fast is not None else (Variant.NAIVE,)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.dtype for s in self.shapes))

    def problem_name(self, s: Shape) -> str:
        return f"{self.name}_{s.tag}"

    def metadata(self, s: Shape) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.problem_name(s),
            "tier": self.tier,
            "family": self.name,
            "dtype": s.dtype,
            "bytes_moved": int(self.bytes_moved(s)),
            "flops": int(self.flops(s)),
            "description": self.description,
            "params": s.as_dict(),
            "origin": ORIGIN,  # not "source": load_problem passes metadata as keywords
        }
        if self.atol is not None:
            meta["atol"] = self.atol
        if self.rtol is not None:
            meta["rtol"] = self.rtol
        if self.breadth:  # only then: corpus problem sources (and their hashes) stay as they were
            meta["breadth"] = True
        return meta

    def render_problem(self, s: Shape) -> str:
        return render_problem(self, s)

    def render_solution(self, variant: Variant | str, dtype: str = "float32") -> str | None:
        variant = Variant(variant)
        fn = self.naive if variant is Variant.NAIVE else self.fast
        if fn is None:
            return None
        return render_solution(self, fn(dtype))


def _init_signature(family: Family) -> str:
    return ", ".join(["self", *(name for name, _ in family.init_args)])


def _init_block(family: Family) -> str:
    body = "        super().__init__()\n"
    if family.init_body.strip():
        body += family.init_body.rstrip() + "\n"
    return f"    def __init__({_init_signature(family)}):\n{body}"


def render_problem(family: Family, s: Shape) -> str:
    consts = "\n".join(f"{name} = {value!r}" for name, value in s.sizes)
    dt = DTYPE_TORCH[s.dtype]
    inputs = ", ".join(expr.replace("{dt}", dt) for expr in family.inputs)
    init_values = ", ".join(expr for _, expr in family.init_args)
    imports = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
    imports += family.imports
    return (
        f'"""{family.description} (multiminddev built-in, tier {family.tier})."""\n\n'
        f"{imports}\n{consts}\n\n"
        f"MULTIMINDDEV = {family.metadata(s)!r}\n\n\n"
        "class Model(nn.Module):\n"
        f'    """{family.description}"""\n\n'
        f"{_init_block(family)}\n"
        f"    def forward(self, {family.forward_args}):\n"
        f"{family.forward.rstrip()}\n\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\n"
        f"def get_init_inputs():\n    return [{init_values}]\n"
    )


def render_solution(family: Family, solution: Solution) -> str:
    return (
        f'"""Reference solution for the {family.name} family (multiminddev built-in)."""\n\n'
        "import torch\nimport torch.nn as nn\n\n"
        "from multiminddev.cuda import compile_kernels\n\n"
        f"CUDA_SRC = r'''\n{solution.cuda.strip()}\n'''\n\n"
        "kernels = compile_kernels(CUDA_SRC)\n\n\n"
        "class ModelNew(nn.Module):\n"
        f"{_init_block(family)}\n"
        f"    def forward(self, {family.forward_args}):\n"
        f"{solution.forward.rstrip()}\n"
    )


def cuda_prelude(dtype: str) -> str:
    """Load/store macros so one elementwise template serves float and half."""
    if dtype == "float16":
        return (
            "#include <cuda_fp16.h>\n"
            "#define LD(v) __half2float(v)\n#define ST(v) __float2half(v)\n"
        )
    return "#define LD(v) (v)\n#define ST(v) (v)\n"


def fill(template: str, **values: Any) -> str:
    """Replace ``@KEY@`` markers (CUDA is full of braces, so no str.format)."""
    out = template
    for key, value in values.items():
        out = out.replace(f"@{key}@", str(value))
    leftover = re.findall(r"@[A-Z][A-Z0-9_]*@", out)
    if leftover:
        raise ValueError(f"template markers left unfilled: {leftover}")
    return out
