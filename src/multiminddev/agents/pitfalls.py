"""Static analysis of a candidate's CUDA source: pitfall hints and strategy tags.

These are heuristics over text (comments stripped), meant as hints for the next turn, not
proofs: each pure function ``check_*(cuda_source) -> list[PitfallHint]`` looks for one
classic performance or correctness mistake. ``detect_strategies`` tags what a kernel tries
(shared memory, vectorized loads, warp shuffles, ...) so the Optimizer can be told which
approaches already failed.
"""

from __future__ import annotations

import ast
import enum
import re
from dataclasses import dataclass

from multiminddev import pyast


class PitfallKind(str, enum.Enum):
    UNCOALESCED = "uncoalesced_access"
    BANK_CONFLICT = "shared_bank_conflict"
    DIVERGENT_BRANCH = "divergent_branch"
    MISSING_BOUNDS_CHECK = "missing_bounds_check"
    MISSING_SYNCTHREADS = "missing_syncthreads"


@dataclass(frozen=True)
class PitfallHint:
    kind: PitfallKind
    message: str
    line: int | None = None  # 1-based line in the CUDA source

    def render(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message}"


class Strategy(str, enum.Enum):
    SHARED_MEMORY = "shared_memory"
    TILING = "tiling"
    VECTORIZED = "vectorized"
    WARP_SHUFFLE = "warp_shuffle"
    UNROLLING = "unrolling"
    GRID_STRIDE = "grid_stride"
    FAST_MATH = "fast_math"
    ATOMICS = "atomics"
    TENSOR_CORES = "tensor_cores"
    READ_ONLY_CACHE = "read_only_cache"
    HALF_PRECISION = "half_precision"


# --------------------------------------------------------------------------- source helpers

_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def strip_comments(cuda: str) -> str:
    """Comments replaced by spaces/newlines so line numbers are unchanged."""
    return _COMMENT_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), cuda)


def extract_cuda_sources(candidate_source: str | None) -> list[str]:
    """CUDA strings in a candidate module (string constants containing ``__global__``)."""
    if not candidate_source:
        return []
    try:
        tree = pyast.parse(candidate_source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [m.group(2) for m in re.finditer(r"('''|\"\"\")(.*?)\1", candidate_source, re.DOTALL)
                if "__global__" in m.group(2)]
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and "__global__" in node.value
    ]


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


_ASSIGN_RE = re.compile(r"\b(?:const\s+)?(?:unsigned\s+)?(?:int|long|long long|size_t|int64_t|"
                        r"unsigned|uint32_t|auto)\s+(\w+)\s*=\s*([^;]+);")


def _derived_from(code: str, seed_pattern: str, *, skip_divided: bool = False) -> set[str]:
    """Variables assigned (transitively) from expressions matching ``seed_pattern``.

    With ``skip_divided``, ``row = idx / n`` does not propagate: it varies slowly across
    neighbouring threads, so ``row * n + col`` is still coalesced.
    """
    names: set[str] = set()
    assigns = _ASSIGN_RE.findall(code)
    for _ in range(3):  # a few rounds of propagation: idx = tid; j = idx + 1 ...
        for name, expr in assigns:
            patterns = [seed_pattern] + [rf"\b{n}\b" for n in names]
            for pattern in patterns:
                hit = re.search(pattern + (r"(?!\s*(?:/|>>))" if skip_divided else ""), expr)
                if hit and not (skip_divided and re.search(r"\)\s*(?:/|>>)", expr)):
                    names.add(name)
                    break
    return names


def _thread_x_patterns(code: str) -> list[str]:
    """Regexes for threadIdx.x and the variables that vary with it one-to-one."""
    names = _derived_from(code, r"threadIdx\.x\b", skip_divided=True)
    return [r"threadIdx\.x\b"] + [rf"\b{n}\b" for n in sorted(names)]


def _index_expressions(code: str) -> list[tuple[str, str, int]]:
    """(array, index expression, position) for each ``name[expr]`` (innermost brackets)."""
    return [(m.group(1), m.group(2), m.start()) for m in re.finditer(r"(\w+)\s*\[([^\[\]]+)\]", code)]


def _shared_arrays(code: str) -> dict[str, list[int]]:
    """Shared array name -> declared dimensions (empty for extern / unknown sizes)."""
    arrays: dict[str, list[int]] = {}
    for m in re.finditer(r"__shared__\s+[\w:<> ]+?\s+(\w+)\s*((?:\[[^\]]*\])+)", code):
        dims = [d.strip() for d in re.findall(r"\[([^\]]*)\]", m.group(2))]
        arrays[m.group(1)] = [int(d) if d.isdigit() else -1 for d in dims]
    return arrays


# --------------------------------------------------------------------------- checks


def check_uncoalesced(cuda: str) -> list[PitfallHint]:
    """``a[tid * stride ...]`` on global memory: neighbouring threads touch far-apart addresses."""
    code = strip_comments(cuda)
    shared = set(_shared_arrays(code))
    patterns = _thread_x_patterns(code)
    hints = []
    for array, expr, pos in _index_expressions(code):
        if array in shared:
            continue
        for p in patterns:
            m = re.search(rf"{p}\s*\*\s*([\w.]+)", expr) or re.search(
                rf"([\w.]+)\s*\*\s*{p}", expr)
            if m and m.group(1) != "1":
                hints.append(PitfallHint(
                    PitfallKind.UNCOALESCED,
                    f"`{array}[{expr.strip()}]`: the thread index is multiplied by a stride, so "
                    "neighbouring threads access far-apart addresses (uncoalesced). Map "
                    "threadIdx.x to the contiguous (last) dimension.",
                    _line_of(code, pos),
                ))
                break
    return _dedupe(hints)


def check_bank_conflicts(cuda: str) -> list[PitfallHint]:
    """Shared arrays indexed with a thread-index stride that is a multiple of 2 words, or a
    ``[tx][...]`` column walk over a 32-wide tile (classic transpose conflict)."""
    code = strip_comments(cuda)
    shared = _shared_arrays(code)
    tx = _thread_x_patterns(code)
    hints = []
    for m in re.finditer(r"(\w+)\s*\[([^\[\]]+)\]\s*\[", code):
        name, first = m.group(1), m.group(2)
        dims = shared.get(name)
        if dims and len(dims) >= 2 and dims[-1] > 0 and dims[-1] % 32 == 0:
            if any(re.fullmatch(rf"\s*{v}\s*", first) for v in tx):
                hints.append(PitfallHint(
                    PitfallKind.BANK_CONFLICT,
                    f"`{name}[{first.strip()}][...]` walks a column of a {dims[-1]}-wide shared "
                    "tile: all threads of a warp hit the same bank. Pad the row "
                    f"(`[{dims[0] if dims[0] > 0 else 'N'}][{dims[-1]} + 1]`).",
                    _line_of(code, m.start()),
                ))
    for array, expr, pos in _index_expressions(code):
        if array not in shared:
            continue
        for var in tx:
            stride = re.search(rf"{var}\s*\*\s*(\d+)\b|\b(\d+)\s*\*\s*{var}", expr)
            if stride:
                k = int(stride.group(1) or stride.group(2))
                way = _gcd(k, 32)
                if k > 1 and way > 1:
                    hints.append(PitfallHint(
                        PitfallKind.BANK_CONFLICT,
                        f"`{array}[{expr.strip()}]`: stride {k} over 32 shared-memory banks "
                        f"gives {way}-way bank conflicts; use an odd stride or pad.",
                        _line_of(code, pos),
                    ))
                    break
    return _dedupe(hints)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def check_divergent_branches(cuda: str) -> list[PitfallHint]:
    """``if (tid % k ...)`` with a thread-index operand: threads of one warp take both paths."""
    code = strip_comments(cuda)
    tx = _thread_x_patterns(code)
    hints = []
    for m in re.finditer(r"\bif\s*\(([^;{]*?)\)\s*[{\w]", code):
        cond = m.group(1)
        if re.search(r"%\s*(?:32|warpSize)\s*==\s*0", cond):
            continue  # "lane 0 of each warp writes": one thread acts, nothing to fix
        if any(re.search(rf"{v}\s*%", cond) for v in tx):
            hints.append(PitfallHint(
                PitfallKind.DIVERGENT_BRANCH,
                f"`if ({cond.strip()})` splits threads of the same warp by `%`: the warp runs "
                "both paths. Use contiguous thread ranges (e.g. `tid < s` in reductions).",
                _line_of(code, m.start()),
            ))
    return _dedupe(hints)


def check_bounds(cuda: str) -> list[PitfallHint]:
    """A global index (built from blockIdx and threadIdx) used to index memory, when neither
    it nor a variable it is computed from is ever compared with a size."""
    code = strip_comments(cuda)
    # A global thread index mixes blockIdx and threadIdx; a bare blockIdx.x (one block per
    # row) is sized by the grid and needs no check.
    global_vars = _derived_from(code, r"^(?=.*blockIdx)(?=.*threadIdx)")
    parents = _parents(code)
    indexed = sorted({var for _, expr, _ in _index_expressions(code) for var in global_vars
                      if re.search(rf"\b{var}\b", expr)})
    for var in indexed:
        family = _ancestors(var, parents) | {var}
        if not any(_compared(v, code) for v in family):
            m = re.search(rf"\b{var}\b", code)
            return [PitfallHint(
                PitfallKind.MISSING_BOUNDS_CHECK,
                f"index `{var}` is never compared with the size: the last block reads/writes "
                f"out of bounds unless n is a multiple of the block size. Add `if ({var} < n)`.",
                _line_of(code, m.start()) if m else None,
            )]
    return []


def _parents(code: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, expr in _ASSIGN_RE.findall(code):
        out.setdefault(name, set()).update(re.findall(r"\b[A-Za-z_]\w*\b", expr))
    return out


def _ancestors(var: str, parents: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [var]
    while stack:
        for p in parents.get(stack.pop(), ()):
            if p not in seen and p in parents:
                seen.add(p)
                stack.append(p)
    return seen


def _compared(var: str, code: str) -> bool:
    return bool(re.search(rf"\b{var}\b\s*(?:<=?|>=?)(?![<>])|(?<![<>])(?:<=?|>=?)\s*\b{var}\b", code))


def check_syncthreads(cuda: str) -> list[PitfallHint]:
    """``__shared__`` memory written and read by different threads needs a barrier."""
    code = strip_comments(cuda)
    m = re.search(r"__shared__", code)
    if not m:
        return []
    if re.search(r"__syncthreads\s*\(|\.sync\s*\(|cg::sync\s*\(|__syncthreads_\w+\s*\(|"
                 r"__barrier_sync|bar\.sync", code):
        return []
    return [PitfallHint(
        PitfallKind.MISSING_SYNCTHREADS,
        "shared memory is used but there is no __syncthreads(): threads may read a slot "
        "before another thread has written it. Put __syncthreads() between the writes and "
        "the reads (and before reusing the buffer).",
        _line_of(code, m.start()),
    )]


PITFALL_CHECKS = (
    check_bounds,
    check_syncthreads,
    check_uncoalesced,
    check_bank_conflicts,
    check_divergent_branches,
)


def split_functions(cuda: str) -> list[tuple[int, str]]:
    """(line offset, text) per __global__/__device__ function, so one kernel's bounds check
    does not excuse another's."""
    starts = [m.start() for m in re.finditer(
        r'(?:extern\s+"C"\s+)?(?:__global__|__device__)(?!\s+(?:float|int|double)?\s*\w+\s*\[)',
        cuda)]
    if not starts:
        return [(0, cuda)]
    starts[0] = 0  # includes and #defines before the first function belong to it
    bounds = starts + [len(cuda)]
    return [(cuda.count("\n", 0, a), cuda[a:b]) for a, b in zip(bounds, bounds[1:])]


def find_pitfalls(cuda: str) -> list[PitfallHint]:
    """All hints for one CUDA source (per function), correctness-relevant first."""
    hints: list[PitfallHint] = []
    chunks = split_functions(strip_comments(cuda))
    for check in PITFALL_CHECKS:
        for offset, chunk in chunks:
            try:
                found = check(chunk)
            except (re.error, RecursionError, ValueError):  # heuristics never break feedback
                continue
            hints.extend(PitfallHint(h.kind, h.message, h.line + offset if h.line else None)
                         for h in found)
    return _dedupe(hints)


def _dedupe(hints: list[PitfallHint]) -> list[PitfallHint]:
    seen, out = set(), []
    for h in hints:
        key = (h.kind, h.line)
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


# --------------------------------------------------------------------------- strategies

_STRATEGY_PATTERNS: dict[Strategy, str] = {
    Strategy.SHARED_MEMORY: r"__shared__",
    Strategy.TILING: r"\bTILE\w*|\btile\w*\s*\[|BLOCK_(?:M|N|K|SIZE)\b",
    Strategy.VECTORIZED: r"\b(?:float|int|half|double)[24]\b|__half2|\bbfloat162\b",
    Strategy.WARP_SHUFFLE: r"__shfl\w*\s*\(|__reduce_\w+_sync",
    Strategy.UNROLLING: r"#\s*pragma\s+unroll",
    Strategy.GRID_STRIDE: r"(?:\+=|=\s*\w+\s*\+)\s*(?:blockDim\.x\s*\*\s*gridDim\.x|"
                          r"gridDim\.x\s*\*\s*blockDim\.x)",
    Strategy.FAST_MATH: r"__(?:expf|logf|sinf|cosf|powf|fdividef|fmaf?_rn|frcp_rn)\s*\(|\brsqrtf\s*\(",
    Strategy.ATOMICS: r"\batomic\w+\s*\(",
    Strategy.TENSOR_CORES: r"\bwmma::|\bmma\.sync|\bmma::",
    Strategy.READ_ONLY_CACHE: r"__ldg\s*\(",
    Strategy.HALF_PRECISION: r"\b__half\b|\b__nv_bfloat16\b|__float2half",
}


def detect_strategies(cuda: str) -> list[Strategy]:
    """The optimisation techniques a CUDA source uses, in enum order."""
    code = strip_comments(cuda)
    return [s for s, pattern in _STRATEGY_PATTERNS.items() if re.search(pattern, code)]


def candidate_strategies(candidate_source: str | None) -> list[Strategy]:
    found: set[Strategy] = set()
    for cuda in extract_cuda_sources(candidate_source):
        found.update(detect_strategies(cuda))
    return [s for s in Strategy if s in found]
