"""Problem loaders: KernelBench, the SakanaAI AI CUDA Engineer archive, plain JSONL, CLI specs.

Sources and their real schemas:

- KernelBench (`ScalingIntelligence/KernelBench`): a local checkout has
  ``KernelBench/level1..level4/<id>_<Name>.py`` (each file a problem module); the hub dataset
  has splits ``level_1``..``level_4`` with columns ``code``, ``level``, ``name``,
  ``problem_id``. A local parquet/arrow dump of the hub dataset loads too.
- SakanaAI/AI-CUDA-Engineer-Archive: splits ``level_1``..``level_3`` with columns
  ``Op_Name, Level_ID, Task_ID, Kernel_Name, CUDA_Runtime, PyTorch_Native_Runtime,
  PyTorch_Compile_Runtime, CUDA_Speedup_Native, CUDA_Speedup_Compile, CUDA_Code,
  PyTorch_Code_Module, PyTorch_Code_Functional, Correct, Max_Diff, Error, NCU_Profile,
  Torch_Profile, Clang_Tidy, __index_level_0__``. ``PyTorch_Code_Module`` becomes the
  problem; ``CUDA_Code`` (a .cu file with a ``PYBIND11_MODULE`` exposing ``forward``) becomes a
  ``load_inline`` candidate built by :func:`sakana_candidate_source`.
- JSONL (ours): one object per line with ``name``, ``source`` and optional ``tier``,
  ``family``, ``dtype``, ``atol``, ``rtol``, ``bytes_moved``, ``flops``, ``split``,
  ``description``, ``extra`` and ``solution`` (a candidate source, kept in
  ``problem.extra["solution"]``).

Tabular sources go through the ``datasets`` library, imported lazily so ``multiminddev.tasks``
stays light. Nothing here executes problem or candidate code.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multiminddev import pyast
from multiminddev.tasks.problem import Problem, ProblemError, load_problem, load_problem_source

if TYPE_CHECKING:
    from multiminddev.env.results import EvalResult

log = logging.getLogger(__name__)

KERNELBENCH_HUB = "ScalingIntelligence/KernelBench"
SAKANA_HUB = "SakanaAI/AI-CUDA-Engineer-Archive"
KERNELBENCH_COLUMNS = ("code", "level", "name", "problem_id")
SAKANA_REQUIRED_COLUMNS = (
    "Op_Name",
    "Level_ID",
    "Task_ID",
    "Kernel_Name",
    "CUDA_Code",
    "PyTorch_Code_Module",
    "Correct",
)
SAKANA_OPTIONAL_COLUMNS = (
    "PyTorch_Code_Functional",
    "CUDA_Runtime",
    "PyTorch_Native_Runtime",
    "PyTorch_Compile_Runtime",
    "CUDA_Speedup_Native",
    "CUDA_Speedup_Compile",
    "Max_Diff",
    "Error",
    "__index_level_0__",
)
SOLUTION_KEY = "solution"  # problem.extra key holding a JSONL row's candidate source

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_LEVEL_RE = re.compile(r"level_?(\d+)", re.IGNORECASE)
_LEVEL_DIR_RE = re.compile(r"^level(\d+)$")
_KB_ID_RE = re.compile(r"^(\d+)_")
_LOCAL_SUFFIXES = frozenset({".parquet", ".arrow", ".jsonl", ".json", ".py", ".csv"})


# --------------------------------------------------------------------------- shared helpers


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is installed in dev/CI
        raise ProblemError(
            "loading tabular datasets needs the `datasets` package: "
            "pip install 'multiminddev[train]' (or pip install datasets)"
        ) from exc
    return datasets


def _level_filter(levels: int | Iterable[int] | None) -> set[int] | None:
    if levels is None:
        return None
    chosen = {int(levels)} if isinstance(levels, int) else {int(x) for x in levels}
    if not chosen:
        raise ProblemError("levels is empty: pass None for all levels or e.g. levels=[1, 2]")
    return chosen


def _split_level(split: str) -> int | None:
    match = _SPLIT_LEVEL_RE.search(split)
    return int(match.group(1)) if match else None


def _data_files(root: Path, suffix: str) -> dict[str, list[str]]:
    """Group ``*.parquet`` / ``*.arrow`` files under root by the level in their name."""
    files = [root] if root.is_file() else sorted(root.rglob(f"*{suffix}"))
    grouped: dict[str, list[str]] = {}
    for path in files:
        level = _split_level(path.name)
        grouped.setdefault(f"level_{level}" if level is not None else "train", []).append(str(path))
    return grouped


def _looks_like_hub_id(source: str) -> bool:
    """``owner/name`` that is not a missing local file (``data/x.parquet``) or folder."""
    if not _HUB_ID_RE.match(source):
        return False
    owner = Path(source).parts[0]
    return Path(source).suffix not in _LOCAL_SUFFIXES and not Path(owner).exists()


def _open_tabular(source: str | Path, levels: set[int] | None, what: str) -> dict[str, Any]:
    """Open a hub id, a parquet/arrow dump or a ``save_to_disk`` folder as {split: Dataset}."""
    datasets = _datasets()
    path = Path(source)
    if path.exists():
        if path.is_dir() and (
            (path / "dataset_dict.json").exists() or (path / "state.json").exists()
        ):
            loaded = datasets.load_from_disk(str(path))
            splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        else:
            splits = _open_files(datasets, path, what)
    elif _looks_like_hub_id(str(source)):
        splits = _open_hub(datasets, str(source), levels, what)
    else:
        example = SAKANA_HUB if what.startswith("Sakana") else KERNELBENCH_HUB
        raise ProblemError(
            f"{what} source {str(source)!r} does not exist: pass a local folder or file "
            f"(a checkout, a parquet/arrow dump) or a hub dataset id such as {example!r}"
        )
    if levels is not None:  # drop whole splits whose name says they are another level
        splits = {
            name: ds
            for name, ds in splits.items()
            if _split_level(name) is None or _split_level(name) in levels
        }
    return splits


def _open_files(datasets: Any, path: Path, what: str) -> dict[str, Any]:
    for suffix, builder in ((".parquet", "parquet"), (".arrow", "arrow")):
        files = _data_files(path, suffix) if (path.is_dir() or path.suffix == suffix) else {}
        if files:
            loaded = datasets.load_dataset(builder, data_files=files)
            return dict(loaded)
    raise ProblemError(
        f"{what} source {str(path)!r} holds no .parquet or .arrow files and is not a "
        "`save_to_disk` folder: point at the dataset dump (e.g. its data/ folder)"
    )


def _open_hub(datasets: Any, repo: str, levels: set[int] | None, what: str) -> dict[str, Any]:
    try:
        if levels is None:
            return dict(datasets.load_dataset(repo))
        return {
            f"level_{n}": datasets.load_dataset(repo, split=f"level_{n}") for n in sorted(levels)
        }
    except Exception as exc:  # network, auth, unknown split: all mean "get a local copy"
        raise ProblemError(
            f"could not load {what} {repo!r} from the hub ({type(exc).__name__}: {exc}); "
            "on a machine without hub access, download it elsewhere "
            "(datasets.load_dataset(...).save_to_disk(DIR) or the parquet files) and pass DIR"
        ) from exc


def _check_columns(ds: Any, required: Iterable[str], source: Any, split: str, what: str) -> None:
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ProblemError(
            f"{what} source {str(source)!r} split {split!r} lacks column(s) {missing} "
            f"(it has {list(ds.column_names)}); expected the {what} schema with columns "
            f"{list(required)}"
        )


def _finish(problems: list[Problem], skipped: list[str], source: Any, what: str) -> list[Problem]:
    if skipped:
        log.warning(
            "%s: skipped %d malformed problem(s): %s", what, len(skipped), "; ".join(skipped[:5])
        )
    if not problems and skipped:
        raise ProblemError(
            f"{what} source {str(source)!r}: every problem was malformed: {skipped[0]}"
        )
    return problems


# --------------------------------------------------------------------------- KernelBench


def _kernelbench_level_dirs(root: Path) -> dict[int, Path]:
    for base in (root / "KernelBench", root):
        if base.is_dir():
            found = {
                int(m.group(1)): p
                for p in sorted(base.iterdir())
                if p.is_dir() and (m := _LEVEL_DIR_RE.match(p.name))
            }
            if found:
                return found
    return {}


def _kb_sort_key(path: Path) -> tuple[int, str]:
    match = _KB_ID_RE.match(path.name)
    return (int(match.group(1)) if match else 1 << 30, path.name)


def _load_kernelbench_checkout(
    level_dirs: dict[int, Path], levels: set[int] | None
) -> list[Problem]:
    problems: list[Problem] = []
    skipped: list[str] = []
    for level, folder in sorted(level_dirs.items()):
        if levels is not None and level not in levels:
            continue
        for file in sorted(folder.glob("*.py"), key=_kb_sort_key):
            match = _KB_ID_RE.match(file.name)
            extra = {"source": "kernelbench", "level": level}
            if match:
                extra["problem_id"] = int(match.group(1))
            try:
                problem = load_problem(file, tier=level)
            except ProblemError as exc:
                skipped.append(str(exc))
                continue
            problems.append(_with_extra(problem, extra))
    return _finish(problems, skipped, next(iter(level_dirs.values()), ""), "KernelBench")


def _with_extra(problem: Problem, extra: dict[str, Any]) -> Problem:
    data = problem.to_dict()
    data["extra"] = {**extra, **data["extra"]}
    return Problem.from_dict(data)


def load_kernelbench(
    source: str | Path = KERNELBENCH_HUB, *, levels: int | Iterable[int] | None = None
) -> list[Problem]:
    """KernelBench problems (tier = level) from a checkout, a hub id or a parquet/arrow dump."""
    chosen = _level_filter(levels)
    path = Path(source)
    if path.is_dir() and (level_dirs := _kernelbench_level_dirs(path)):
        return _load_kernelbench_checkout(level_dirs, chosen)
    splits = _open_tabular(source, chosen, "KernelBench")
    problems: list[Problem] = []
    skipped: list[str] = []
    for split, ds in splits.items():
        _check_columns(ds, KERNELBENCH_COLUMNS, source, split, "KernelBench")
        for row in ds.select_columns(list(KERNELBENCH_COLUMNS)):
            level = int(row["level"])
            if chosen is not None and level not in chosen:
                continue
            extra = {"source": "kernelbench", "level": level, "problem_id": int(row["problem_id"])}
            try:
                problem = load_problem_source(row["code"], name=str(row["name"]), tier=level)
            except ProblemError as exc:
                skipped.append(str(exc))
                continue
            problems.append(_with_extra(problem, extra))
    problems.sort(key=lambda p: (p.tier, p.extra.get("problem_id", 0), p.name))
    return _finish(problems, skipped, source, "KernelBench")


# --------------------------------------------------------------------------- Sakana archive


@dataclass(kw_only=True, frozen=True)
class SakanaRecord:
    """One kernel of the AI CUDA Engineer archive, with the archive's own flags and timings.

    Runtimes and speedups are the archive's figures (its GPU, its harness), kept as reported;
    ``reverify`` measures them again with our evaluator. ``candidate_source`` is ``None`` when
    the row cannot be wrapped (``candidate_error`` says why).
    """

    problem: Problem
    candidate_source: str | None
    candidate_error: str = ""
    op_name: str
    level: int
    task_id: int
    kernel_name: str
    correct: bool
    max_diff: float | None = None
    error: str = ""
    cuda_runtime: float | None = None
    torch_native_runtime: float | None = None
    torch_compile_runtime: float | None = None
    speedup_native: float | None = None
    speedup_compile: float | None = None
    cuda_code: str = ""
    index: int | None = None  # the archive's __index_level_0__


def _pybind_function(cuda_code: str) -> str | None:
    names = re.findall(r"\.def\(\s*\"(\w+)\"", cuda_code)
    if not names:
        return None
    return "forward" if "forward" in names else names[0]


def _python_string_literal(text: str) -> str:
    """A readable raw triple-quoted literal when one round-trips exactly, else repr()."""
    if "'''" not in text and not text.endswith("\\"):
        literal = "r'''" + text + "'''"
        try:
            if ast.literal_eval(literal) == text:
                return literal
        except (SyntaxError, ValueError):
            pass
    return repr(text)


class _FunctionalToCandidate(ast.NodeTransformer):
    """Rewrite Sakana's functional ``Model`` into ``ModelNew`` calling the compiled extension.

    The functional reference is ``class Model`` whose ``forward(self, x, ..., fn=module_fn)``
    returns ``fn(x, self.weight, ..., some_global)``: exactly the argument list of the CUDA
    extension's pybind ``forward``. So ``ModelNew`` keeps ``__init__`` unchanged (same
    parameters created in the same order, hence the same seeded weights as the module
    reference), drops the ``fn`` parameter and calls ``_ext.<function>(...)`` instead.
    """

    def __init__(self, function: str) -> None:
        self.function = function
        self.fn_param: str | None = None
        self.rewritten_calls = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        if node.name != "Model":
            return node
        node.name = "ModelNew"
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "forward":
                self._drop_fn_param(item)
        return self.generic_visit(node)

    def _drop_fn_param(self, func: ast.FunctionDef) -> None:
        args = func.args
        positional = args.posonlyargs + args.args
        first_default = len(positional) - len(args.defaults)
        for i, arg in enumerate(positional):
            default = args.defaults[i - first_default] if i >= first_default else None
            if arg.arg == "fn" or (isinstance(default, ast.Name) and default.id == "module_fn"):
                self.fn_param = arg.arg
                args.args.remove(arg)
                if default is not None:
                    args.defaults.remove(default)
                return

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if self.fn_param and isinstance(func, ast.Name) and func.id == self.fn_param:
            node.func = ast.Attribute(
                value=ast.Name("_ext", ast.Load()), attr=self.function, ctx=ast.Load()
            )
            self.rewritten_calls += 1
        # super(Model, self) would name a class the candidate does not define
        if isinstance(func, ast.Name) and func.id == "super" and node.args:
            node.args = []
        return node


_DROPPED_TOP_LEVEL = frozenset({"module_fn", "get_inputs", "get_init_inputs"})


def sakana_candidate_source(cuda_code: str, functional_code: str, *, name: str) -> str:
    """Wrap an archive ``CUDA_Code`` into a ``load_inline`` candidate module (``ModelNew``).

    Best effort, documented: the extension is built with ``load_inline(cpp_sources="",
    cuda_sources=CUDA_Code, functions=None)`` (the .cu file carries its own
    ``PYBIND11_MODULE``); ``ModelNew`` is the functional ``Model`` with ``fn(...)`` replaced by
    the extension's function. Module-level constants of the functional code are kept because
    its ``forward`` often passes globals (``stride``, ``eps``) to ``fn``; ``module_fn`` and
    the input generators are dropped. Raises ``ProblemError`` when the shape is not that one.
    """
    function = _pybind_function(cuda_code)
    if function is None:
        raise ProblemError(f"{name}: CUDA_Code has no PYBIND11_MODULE m.def(...) to call")
    try:
        tree = pyast.parse(functional_code)
    except SyntaxError as exc:
        raise ProblemError(
            f"{name}: PyTorch_Code_Functional is not valid Python: {exc.msg}"
        ) from exc
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.FunctionDef) and node.name in _DROPPED_TOP_LEVEL)
    ]
    rewriter = _FunctionalToCandidate(function)
    tree = rewriter.visit(tree)
    if rewriter.fn_param is None or rewriter.rewritten_calls == 0:
        raise ProblemError(
            f"{name}: PyTorch_Code_Functional has no Model.forward(..., fn=module_fn) "
            "calling fn(...)"
        )
    ext_name = "sakana_" + re.sub(r"\W", "_", name)[:40] + "_" + _short_hash(cuda_code)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    build = (
        "from torch.utils.cpp_extension import load_inline\n\n"
        f"CUDA_SOURCE = {_python_string_literal(cuda_code)}\n\n"
        f"_ext = load_inline(name={ext_name!r}, cpp_sources='', cuda_sources=CUDA_SOURCE,\n"
        "                   functions=None, extra_cuda_cflags=['-O3'], verbose=False)\n\n"
    )
    return (
        f"# {name}: CUDA kernel from the SakanaAI AI CUDA Engineer archive, "
        "built with load_inline.\n" + _unparse(imports) + build + _unparse(body)
    )


def _unparse(nodes: list[ast.stmt]) -> str:
    if not nodes:
        return ""
    module = ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[]))
    return ast.unparse(module) + "\n\n"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _optional_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN -> None


def _sakana_rows(ds: Any, correct_only: bool) -> Iterator[dict[str, Any]]:
    columns = list(SAKANA_REQUIRED_COLUMNS) + [
        c for c in SAKANA_OPTIONAL_COLUMNS if c in ds.column_names
    ]
    ds = ds.select_columns(columns)  # skip the large profile columns
    if correct_only:
        ds = ds.filter(
            lambda flags: [bool(f) for f in flags], input_columns=["Correct"], batched=True
        )
    yield from ds


def _sakana_record(row: dict[str, Any], problems: dict[tuple, Problem]) -> SakanaRecord:
    level, task_id = int(row["Level_ID"]), int(row["Task_ID"])
    op_name, module_code = str(row["Op_Name"]), row["PyTorch_Code_Module"]
    key = (level, task_id, _short_hash(module_code))
    if key not in problems:
        problem = load_problem_source(module_code, name=op_name, tier=level)
        problems[key] = _with_extra(
            problem, {"source": "sakana", "level": level, "task_id": task_id}
        )
    kernel_name = str(row["Kernel_Name"])
    candidate, why = None, ""
    functional = row.get("PyTorch_Code_Functional")
    if not functional:
        why = "the row has no PyTorch_Code_Functional to map the extension's arguments"
    else:
        try:
            candidate = sakana_candidate_source(
                row["CUDA_Code"], functional, name=f"L{level}_T{task_id}_{kernel_name}"
            )
        except ProblemError as exc:
            why = str(exc)
    index = row.get("__index_level_0__")
    return SakanaRecord(
        problem=problems[key],
        candidate_source=candidate,
        candidate_error=why,
        op_name=op_name,
        level=level,
        task_id=task_id,
        kernel_name=kernel_name,
        correct=bool(row["Correct"]),
        max_diff=_optional_float(row.get("Max_Diff")),
        error=str(row.get("Error") or ""),
        cuda_runtime=_optional_float(row.get("CUDA_Runtime")),
        torch_native_runtime=_optional_float(row.get("PyTorch_Native_Runtime")),
        torch_compile_runtime=_optional_float(row.get("PyTorch_Compile_Runtime")),
        speedup_native=_optional_float(row.get("CUDA_Speedup_Native")),
        speedup_compile=_optional_float(row.get("CUDA_Speedup_Compile")),
        cuda_code=row["CUDA_Code"],
        index=int(index) if index is not None else None,
    )


def load_sakana_archive(
    source: str | Path = SAKANA_HUB,
    *,
    levels: int | Iterable[int] | None = None,
    correct_only: bool = True,
    limit: int | None = None,
) -> list[SakanaRecord]:
    """Records of the AI CUDA Engineer archive (hub id or local parquet/arrow dump)."""
    if limit is not None and limit < 1:
        raise ProblemError(f"limit must be >= 1 or None, got {limit}")
    chosen = _level_filter(levels)
    records: list[SakanaRecord] = []
    problems: dict[tuple, Problem] = {}
    skipped: list[str] = []
    for split, ds in _open_tabular(source, chosen, "Sakana archive").items():
        _check_columns(ds, SAKANA_REQUIRED_COLUMNS, source, split, "Sakana archive")
        for row in _sakana_rows(ds, correct_only):
            if chosen is not None and int(row["Level_ID"]) not in chosen:
                continue
            try:
                records.append(_sakana_record(row, problems))
            except ProblemError as exc:
                skipped.append(str(exc))
            if limit is not None and len(records) >= limit:
                break
        if limit is not None and len(records) >= limit:
            break
    if skipped:
        log.warning(
            "Sakana archive: skipped %d row(s) with a malformed problem: %s",
            len(skipped),
            skipped[0],
        )
    return records


def sakana_problems(records: Iterable[SakanaRecord]) -> list[Problem]:
    """The distinct problems of some records, in first-seen order."""
    seen: dict[tuple[str, str], Problem] = {}
    for record in records:
        seen.setdefault((record.problem.name, record.problem.source_hash), record.problem)
    return list(seen.values())


def reverify(
    records: Iterable[SakanaRecord], evaluator: Any
) -> list[tuple[SakanaRecord, EvalResult]]:
    """Evaluate the records' candidates with our evaluator (``Evaluator.evaluate_many``).

    Records without a candidate are left out (their ``candidate_error`` says why).
    """
    usable = [r for r in records if r.candidate_source is not None]
    results = evaluator.evaluate_many([(r.problem, r.candidate_source) for r in usable])
    return list(zip(usable, results, strict=True))


# --------------------------------------------------------------------------- JSONL

_JSONL_FIELDS = frozenset(Problem.__dataclass_fields__) - {"source", "extra"}


def _jsonl_problem(data: Any, where: str) -> Problem:
    if not isinstance(data, dict):
        raise ProblemError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in ("name", "source") if not data.get(k)]
    if missing:
        raise ProblemError(
            f"{where}: lacks {missing}; each line needs at least "
            '{"name": ..., "source": <problem module code>}'
        )
    data = dict(data)
    source = data.pop("source")
    extra = dict(data.pop("extra", None) or {})
    solution = data.pop(SOLUTION_KEY, None)
    if solution is not None:
        extra[SOLUTION_KEY] = str(solution)
    known = {k: v for k, v in data.items() if k in _JSONL_FIELDS}
    extra.update({k: v for k, v in data.items() if k not in _JSONL_FIELDS})
    problem = load_problem_source(source, **known)
    return _with_extra(problem, extra) if extra else problem


def load_jsonl(path: str | Path) -> list[Problem]:
    """Problems from our JSONL format (see the module docstring); blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise ProblemError(f"JSONL file {str(path)!r} does not exist")
    problems = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProblemError(f"{where}: not valid JSON ({exc.msg}); one object per line") from exc
        try:
            problems.append(_jsonl_problem(data, where))
        except ProblemError as exc:
            raise ProblemError(f"{where}: {exc}") from exc
    return problems


def problem_solution(problem: Problem) -> str | None:
    """The candidate source a JSONL row carried (``solution``), if any."""
    value = problem.extra.get(SOLUTION_KEY)
    return value if isinstance(value, str) else None


def save_jsonl(
    problems: Iterable[Problem], path: str | Path, *, solutions: dict[str, str] | None = None
) -> Path:
    """Write problems in the JSONL format; ``solutions`` maps problem name -> candidate source."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for problem in problems:
            row = problem.to_dict()
            extra = dict(row.pop("extra"))
            solution = (solutions or {}).get(problem.name) or extra.pop(SOLUTION_KEY, None)
            extra.pop(SOLUTION_KEY, None)
            row = {k: v for k, v in row.items() if v not in (None, "")}
            if extra:
                row["extra"] = extra
            if solution:
                row[SOLUTION_KEY] = solution
            out.write(json.dumps(row) + "\n")
    return path


# --------------------------------------------------------------------------- CLI specs

_SPEC_HELP = (
    "builtin, builtin:tier1, builtin:train, builtin:heldout, builtin:small, builtin:FAMILY "
    "(parts combine: builtin:tier0,tier1:train; add :allshapes for every shape of each family "
    "instead of the first 2 of the split, or :shapesN for the first N; with :train, :resizedN "
    "adds N new sizes per training family and dtype, none of them a corpus shape, and "
    ":resizedNfromK the N after the first K, none of them a size :resizedK gives), "
    "fp16 or fp32 keeps the problems of that dtype (builtin:tier0:train:resized8:fp16), "
    "builtin:breadth (the SFT-only breadth families, all shapes; builtin:breadth:small, "
    "builtin:breadth:shapes1, builtin:breadth:FAMILY:...), "
    "builtin:practice (the GRPO-only practice families; the same parts as breadth), "
    "kernelbench[:PATH_OR_HUB_ID], sakana[:PATH_OR_HUB_ID], jsonl:PATH, "
    "or a path to a .py problem, "
    "a .jsonl file, a KernelBench checkout, a folder of problem files or a parquet dump; "
    "join specs with '+' to load several (builtin:tier0,tier1:train:allshapes+builtin:breadth); "
    "a part ending in *N is repeated N times, to weigh it in SFT data or a curriculum "
    "(builtin:tier0:train+builtin:tier1:train*2)"
)
_WEIGHT_RE = re.compile(r"^(.*?)\s*\*\s*(\d+)$")
_TIER_RE = re.compile(r"^(?:tier|t)(\d+)$", re.IGNORECASE)
_SPLITS = ("train", "heldout")
_SHAPES_RE = re.compile(r"^shapes(\d+)$", re.IGNORECASE)
_RESIZED_RE = re.compile(r"^resized(\d+)(?:from(\d+))?$", re.IGNORECASE)
_DTYPES = {"fp16": "float16", "float16": "float16", "fp32": "float32", "float32": "float32"}


def _builtin(parts: list[str]) -> list[Problem]:
    # the corpus is heavy-ish: imported lazily
    from multiminddev.tasks.builtin import breadth_problems, builtin_problems, practice_problems

    kwargs: dict[str, Any] = {}
    tiers: list[int] = []
    families: list[str] = []
    breadth = practice = False
    dtype = None
    for part in (p.strip() for p in parts if p.strip()):
        if part.lower() in _DTYPES:
            # e.g. GRPO review problems of one dtype only: a float32-only mix taught the
            # Generator to write float kernels for float16 problems (docs/training.md)
            dtype = _DTYPES[part.lower()]
        elif m := _TIER_RE.match(part):
            tiers.append(int(m.group(1)))
        elif part.lower() in _SPLITS:
            kwargs["split"] = part.lower()
        elif part.lower() == "small":  # one tiny problem per family, for CPU runs
            kwargs["small"] = True
        elif part.lower() == "allshapes" or _SHAPES_RE.match(part):
            # every shape (allshapes) or the first N (shapesN), not builtin_problems' first 2
            if "shapes_per_family" in kwargs:
                raise ProblemError(f"spec {':'.join(parts)!r}: give one of allshapes / shapesN")
            m = _SHAPES_RE.match(part)
            kwargs["shapes_per_family"] = int(m.group(1)) if m else None
            if kwargs["shapes_per_family"] == 0:
                raise ProblemError("shapes0 selects nothing: use shapes1 or more")
        elif part.lower() == "breadth":  # the SFT-only families (tasks/builtin/breadth.py)
            breadth = True
        elif part.lower() == "practice":  # the GRPO-only families (tasks/builtin/breadth.py)
            practice = True
        elif m := _RESIZED_RE.match(part):  # new sizes of training families (builtin/resize.py)
            kwargs["resized"] = int(m.group(1))
            if m.group(2):  # resized8from4: 8 sizes after the 4 that resized4 gives
                kwargs["resized_from"] = int(m.group(2))
        else:
            families.append(part)
    if tiers:
        kwargs["tiers"] = tiers
    if families:
        kwargs["families"] = families
    spec = "builtin" + (":" + ":".join(parts) if parts else "")
    if breadth and practice:
        raise ProblemError(f"spec {spec!r}: give builtin:breadth and builtin:practice as two "
                           "specs joined with '+'")
    if breadth or practice:
        # Breadth and practice families are in no split and no tier selection: only `small`,
        # the shape count and family names apply.
        which = "breadth" if breadth else "practice"
        other = sorted(set(kwargs) - {"small", "shapes_per_family", "families"})
        other += ["dtype"] if dtype else []
        if other:
            raise ProblemError(
                f"spec {spec!r}: builtin:{which} takes no {', '.join(other)} part (it is every "
                f"shape of the {which} families, or of those named; builtin:{which}:small for "
                "tiny ones); join it to a corpus spec with '+' instead"
            )
        load = breadth_problems if breadth else practice_problems
        try:
            return load(small=bool(kwargs.get("small")),
                        shapes_per_family=kwargs.get("shapes_per_family"),
                        families=kwargs.get("families"))
        except KeyError as exc:
            raise ProblemError(f"spec {spec!r}: {exc.args[0]}") from None
    if kwargs.get("resized") and kwargs.get("split") != "train":
        raise ProblemError(f"spec {spec!r}: resizedN makes training data; add :train "
                           "(builtin:tier0,tier1:train:resized3)")
    try:
        problems = builtin_problems(**kwargs)
    except KeyError as exc:  # an unknown family name
        raise ProblemError(f"spec {spec!r}: {exc.args[0]}; valid specs: {_SPEC_HELP}") from None
    if dtype is not None:
        problems = [p for p in problems if p.dtype == dtype]
    if not problems:
        raise ProblemError(f"spec {spec!r} selects no problem; valid specs: {_SPEC_HELP}")
    return problems


def _load_folder(path: Path) -> list[Problem]:
    if _kernelbench_level_dirs(path):
        return load_kernelbench(path)
    jsonl = sorted(path.glob("*.jsonl"))
    py = sorted(path.glob("*.py"), key=_kb_sort_key)
    if jsonl or py:
        problems = [p for file in jsonl for p in load_jsonl(file)]
        return problems + [load_problem(file) for file in py]
    if (
        any(path.rglob("*.parquet"))
        or any(path.rglob("*.arrow"))
        or (path / "dataset_dict.json").exists()
    ):
        return _load_tabular_any(path)
    raise ProblemError(f"folder {str(path)!r} holds no problems; valid specs: {_SPEC_HELP}")


def _load_tabular_any(path: Path) -> list[Problem]:
    """A parquet/arrow dump of either hub dataset, told apart by its columns."""
    splits = _open_tabular(path, None, "dataset")
    columns = set().union(*(ds.column_names for ds in splits.values())) if splits else set()
    if set(KERNELBENCH_COLUMNS) <= columns:
        return load_kernelbench(path)
    if set(SAKANA_REQUIRED_COLUMNS) <= columns:
        return sakana_problems(load_sakana_archive(path))
    raise ProblemError(
        f"{str(path)!r} has columns {sorted(columns)}: neither the KernelBench schema "
        f"{list(KERNELBENCH_COLUMNS)} nor the Sakana archive's {list(SAKANA_REQUIRED_COLUMNS)}"
    )


def _load_path(path: Path) -> list[Problem]:
    if path.is_dir():
        return _load_folder(path)
    if path.suffix == ".jsonl":
        return load_jsonl(path)
    if path.suffix == ".py":
        return [load_problem(path)]
    if path.suffix in (".parquet", ".arrow"):
        return _load_tabular_any(path)
    raise ProblemError(f"don't know how to load {str(path)!r}; valid specs: {_SPEC_HELP}")


def _is_path(text: str) -> bool:
    """Whether ``text`` names an existing file or folder; a spec longer than a file name may be
    (a long family list) is simply not one, where ``Path.exists`` raises ENAMETOOLONG."""
    try:
        return Path(text).exists()
    except OSError:
        return False


def load_problems(spec: str) -> list[Problem]:
    """Resolve a CLI problem spec (see ``_SPEC_HELP``) to problems.

    ``A+B`` loads each spec and concatenates them in order (a path that exists is taken
    whole, '+' and all); a problem name that two parts both give is an error, since a
    combined list with one problem twice would weigh it double without anyone asking.
    Weighing is asked for explicitly: a part ``A*N`` is repeated N times (an SFT mix that
    keeps tier 1's share while other problems join it: ``builtin:tier1:train*2+...``)."""
    spec = spec.strip()
    if not spec:
        raise ProblemError(f"empty problem spec; valid specs: {_SPEC_HELP}")
    if _is_path(spec):
        return _load_one(spec)
    if "+" in spec or _WEIGHT_RE.match(spec):
        return _load_joined(spec)
    return _load_one(spec)


def _split_weight(part: str) -> tuple[str, int]:
    """``'builtin:tier1*2'`` -> (``'builtin:tier1'``, 2); no ``*N``: weight 1."""
    m = _WEIGHT_RE.match(part)
    if m is None or _is_path(part):
        return part, 1
    weight = int(m.group(2))
    if weight < 1:
        raise ProblemError(f"spec part {part!r}: the weight after '*' must be >= 1")
    if not m.group(1).strip():
        raise ProblemError(f"spec part {part!r} has a weight but no spec before '*'")
    return m.group(1).strip(), weight


def _load_joined(spec: str) -> list[Problem]:
    problems: list[Problem] = []
    first_from: dict[str, str] = {}
    for part in spec.split("+"):
        if not part.strip():
            raise ProblemError(f"spec {spec!r} has an empty part between '+'; valid specs: "
                               f"{_SPEC_HELP}")
        part_spec, weight = _split_weight(part.strip())
        loaded = _load_one(part_spec)
        for problem in loaded:
            if problem.name in first_from:
                raise ProblemError(
                    f"spec {spec!r}: problem {problem.name!r} comes from both "
                    f"{first_from[problem.name]!r} and {part.strip()!r}; join specs that do "
                    "not overlap (weigh a part with *N instead)"
                )
            first_from[problem.name] = part.strip()
        problems.extend(loaded * weight)
    return problems


def _load_one(spec: str) -> list[Problem]:
    kind, _, rest = spec.partition(":")
    kind_l = kind.lower()
    if kind_l == "builtin":
        return _builtin(re.split(r"[:,]", rest) if rest else [])
    if kind_l == "kernelbench":
        return load_kernelbench(rest or KERNELBENCH_HUB)
    if kind_l == "sakana":
        return sakana_problems(load_sakana_archive(rest or SAKANA_HUB))
    if kind_l == "jsonl":
        if not rest:
            raise ProblemError("spec 'jsonl:' needs a path: jsonl:problems.jsonl")
        return load_jsonl(rest)
    if _is_path(spec):
        return _load_path(Path(spec))
    raise ProblemError(
        f"problem spec {spec!r} is neither a known kind nor an existing path; "
        f"valid specs: {_SPEC_HELP}"
    )
