"""KernelBench-format problems.

A problem is the *source* of a Python module defining ``class Model(nn.Module)``,
``get_inputs()`` and ``get_init_inputs()`` (any KernelBench level1-3 file loads unchanged),
plus metadata. Metadata comes from, in order: explicit arguments, an optional module-level
literal ``MULTIMINDDEV = {...}`` (read with ``ast.literal_eval``, never executed), and
defaults inferred from the file name and folder (``level2/17_Conv2d_...py`` -> tier 2).

Loading a problem never imports it: the source is executed only inside evaluation workers.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from multiminddev import pyast

DEFAULT_TOLERANCES = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
METADATA_VARIABLE = "MULTIMINDDEV"


class ProblemError(ValueError):
    """A problem source is malformed; the message says what is missing and how to fix it."""


@dataclass(kw_only=True, frozen=True)
class Problem:
    name: str
    source: str
    tier: int = 0
    family: str = ""
    dtype: str = "float32"
    atol: float | None = None  # None -> DEFAULT_TOLERANCES[dtype]
    rtol: float | None = None
    bytes_moved: int | None = None  # for the roofline (bytes read + written by an ideal kernel)
    flops: int | None = None
    split: str = ""  # "train" | "heldout" | "" (unsplit)
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict, hash=False)  # hash on the rest

    def __post_init__(self) -> None:
        if self.dtype not in DEFAULT_TOLERANCES:
            raise ProblemError(
                f"problem {self.name!r}: dtype {self.dtype!r} is not one of "
                f"{sorted(DEFAULT_TOLERANCES)}; set MULTIMINDDEV['dtype'] accordingly"
            )
        if self.tier < 0:
            raise ProblemError(f"problem {self.name!r}: tier must be >= 0, got {self.tier}")

    @property
    def tolerances(self) -> tuple[float, float]:
        default = DEFAULT_TOLERANCES[self.dtype]
        return (
            self.atol if self.atol is not None else default,
            self.rtol if self.rtol is not None else default,
        )

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        return cls(**data)


def validate_problem_source(source: str, name: str = "<problem>") -> dict[str, Any]:
    """Check the KernelBench structure without running it; return the metadata literal if any."""
    try:
        tree = pyast.parse(source)
    except SyntaxError as exc:
        raise ProblemError(f"problem {name!r} is not valid Python: line {exc.lineno}: {exc.msg}")
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [x for x in ("Model",) if x not in classes]
    missing += [f for f in ("get_inputs", "get_init_inputs") if f not in functions]
    if missing:
        raise ProblemError(
            f"problem {name!r} lacks {', '.join(missing)}: a KernelBench problem defines "
            "class Model(nn.Module), get_inputs() and get_init_inputs()"
        )
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == METADATA_VARIABLE for t in node.targets
        ):
            try:
                meta = ast.literal_eval(node.value)
            except ValueError:
                raise ProblemError(
                    f"problem {name!r}: {METADATA_VARIABLE} must be a literal dict "
                    "(numbers, strings), not computed"
                )
            if not isinstance(meta, dict):
                raise ProblemError(f"problem {name!r}: {METADATA_VARIABLE} must be a dict")
            return meta
    return {}


_LEVEL_RE = re.compile(r"level(\d+)", re.IGNORECASE)
_KB_NAME_RE = re.compile(r"^(\d+)_")


def load_problem_source(source: str, name: str = "problem", **overrides: Any) -> Problem:
    meta = validate_problem_source(source, name)
    fields = {**meta, **{k: v for k, v in overrides.items() if v is not None}}
    fields.setdefault("name", name)
    known = set(Problem.__dataclass_fields__) - {"source", "extra"}
    extra = {k: v for k, v in fields.items() if k not in known}
    kwargs = {k: v for k, v in fields.items() if k in known}
    return Problem(source=source, extra=extra, **kwargs)


def load_problem(path: str | Path, **overrides: Any) -> Problem:
    """Load a problem file; KernelBench's level folder gives the tier when no metadata does."""
    path = Path(path)
    if not path.is_file():
        raise ProblemError(f"problem file {str(path)!r} does not exist")
    source = path.read_text()
    meta = validate_problem_source(source, path.name)
    inferred: dict[str, Any] = {"name": path.stem}
    level = _LEVEL_RE.search(str(path.parent))
    if level and "tier" not in meta:
        inferred["tier"] = int(level.group(1))
    return load_problem_source(source, **{**inferred, **meta, **overrides})
