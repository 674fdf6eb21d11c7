"""``multiminddev problems list|show|export``: browse and export the built-in corpus.

``export DIR`` writes a KernelBench layout that ``multiminddev eval-dir`` reads:

    DIR/level0/1_abs_4096x4096.py ...              problems, numbered per tier
    DIR/solutions/naive/level0/1_abs_4096x4096.py  reference candidates (--with-solutions),
    DIR/solutions/fast/level0/...                  same file names as their problems
    DIR/splits.json                                the seed's split manifest
    DIR/index.json                                 one entry per problem (file, split, family...)

    multiminddev eval-dir DIR/level0 DIR/solutions/naive/level0
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from multiminddev.commands._io import fail
from multiminddev.tasks.builtin import (
    FAMILIES,
    FAMILY_BY_NAME,
    builtin_problems,
    reference_solution,
)
from multiminddev.tasks.splits import split_manifest


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("problems", help="list, show or export the built-in problems")
    sub = parser.add_subparsers(dest="problems_command", metavar="ACTION")

    listing = sub.add_parser("list", help="list built-in problems")
    _selection_options(listing)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=run_list)

    show = sub.add_parser("show", help="print a problem's source (or a reference solution)")
    show.add_argument("name", help="problem name (e.g. relu_4096x4096) or a family name")
    show.add_argument("--solution", choices=["naive", "fast"], default=None,
                      help="print this reference solution instead of the problem")
    show.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    show.set_defaults(handler=run_show)

    export = sub.add_parser("export", help="write a KernelBench-layout folder")
    export.add_argument("out_dir", type=Path,
                        help="folder to write; must be new or empty unless --force")
    _selection_options(export)
    export.add_argument("--with-solutions", action="store_true",
                        help="also write the naive and fast reference solutions")
    export.add_argument("--force", action="store_true",
                        help="replace an earlier export in OUT_DIR (a folder with index.json): "
                             "its old files are removed first")
    export.set_defaults(handler=run_export)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tier", type=int, action="append", default=None,
                        help="only this tier (0-3); repeat for several")
    parser.add_argument("--family", action="append", default=None,
                        help="only this family; repeat for several")
    parser.add_argument("--split", choices=["train", "heldout"], default=None,
                        help="only the training or the held-out problems (default: both)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    parser.add_argument("--shapes-per-family", type=int, default=None,
                        help="at most this many shapes per family (default: all)")


def _select(args: argparse.Namespace) -> list[Any]:
    """The selected problems; a selection that matches none is a ValueError saying so (an
    empty table or export would look like success)."""
    problems = builtin_problems(tiers=args.tier, families=args.family, split=args.split,
                                seed=args.seed, shapes_per_family=args.shapes_per_family)
    if not problems:
        tiers = sorted({f.tier for f in FAMILIES})
        raise ValueError(f"no built-in problem matches this selection (tiers "
                         f"{tiers[0]}-{tiers[-1]}; `multiminddev problems list` shows them all)")
    return problems


def _summary(problem: Any) -> dict[str, Any]:
    family = FAMILY_BY_NAME[problem.family]
    return {
        "name": problem.name,
        "tier": problem.tier,
        "family": problem.family,
        "dtype": problem.dtype,
        "split": problem.split,
        "params": problem.extra.get("params", {}),
        "bytes_moved": problem.bytes_moved,
        "flops": problem.flops,
        "solutions": [v.value for v in family.variants],
        "description": problem.description,
    }


def run_list(args: argparse.Namespace) -> int:
    try:
        problems = _select(args)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    rows = [_summary(p) for p in problems]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} built-in problems (seed {args.seed})")
    for column in ("tier", "name", "family", "dtype", "split", "MB moved", "GFLOP", "solutions"):
        table.add_column(column)
    for r in rows:
        table.add_row(str(r["tier"]), r["name"], r["family"], r["dtype"], r["split"],
                      f"{(r['bytes_moved'] or 0) / 1e6:.1f}", f"{(r['flops'] or 0) / 1e9:.2f}",
                      ",".join(r["solutions"]))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0


def _find(name: str, seed: int) -> Any | None:
    if name in FAMILY_BY_NAME:  # a family name: its first shape
        return builtin_problems(families=[name], seed=seed, shapes_per_family=1)[0]
    family = next((f for f in FAMILY_BY_NAME.values() if name.startswith(f.name + "_")
                   and any(f.problem_name(s) == name for s in f.shapes)), None)
    if family is None:
        return None
    problems = builtin_problems(families=[family.name], seed=seed, shapes_per_family=None)
    return next(p for p in problems if p.name == name)


def run_show(args: argparse.Namespace) -> int:
    problem = _find(args.name, args.seed)
    if problem is None:
        print(f"error: no built-in problem or family named {args.name!r}; "
              "`multiminddev problems list` shows them", file=sys.stderr)
        return 2
    if args.solution is None:
        print(problem.source, end="")
        return 0
    source = reference_solution(problem, args.solution)
    if source is None:
        print(f"error: family {problem.family!r} has no {args.solution} solution "
              "(every family has a naive one)", file=sys.stderr)
        return 2
    print(source, end="")
    return 0


def export_problems(problems: list[Any], out_dir: Path, *, seed: int,
                    with_solutions: bool) -> list[dict[str, Any]]:
    """Write problems (and optionally solutions) in KernelBench layout; return the index."""
    index: list[dict[str, Any]] = []
    counters: dict[int, int] = {}
    for problem in sorted(problems, key=lambda p: (p.tier, p.family, p.name)):
        counters[problem.tier] = counters.get(problem.tier, 0) + 1
        rel = Path(f"level{problem.tier}") / f"{counters[problem.tier]}_{problem.name}.py"
        _write(out_dir / rel, problem.source)
        entry = {**_summary(problem), "file": str(rel), "solution_files": {}}
        if with_solutions:
            for variant in FAMILY_BY_NAME[problem.family].variants:
                source = reference_solution(problem, variant)
                if source is not None:
                    sol_rel = Path("solutions") / variant.value / rel
                    _write(out_dir / sol_rel, source)
                    entry["solution_files"][variant.value] = str(sol_rel)
        index.append(entry)
    _write(out_dir / "splits.json", json.dumps(split_manifest(seed), indent=2) + "\n")
    _write(out_dir / "index.json", json.dumps(index, indent=2) + "\n")
    return index


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def export_refusal(out_dir: Path, *, force: bool) -> str | None:
    """Why ``out_dir`` cannot receive an export, or None. A non-empty folder would mix old and
    new files, so it needs --force, and --force replaces only an earlier export (it has
    index.json): it never deletes a folder of other files."""
    if out_dir.exists() and not out_dir.is_dir():
        return f"{out_dir} is a file; give a folder to export into"
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return None
    if not force:
        return (f"{out_dir} is not empty: give a new or empty folder, or --force to replace an "
                "earlier export there")
    if not (out_dir / "index.json").is_file():
        return (f"{out_dir} is not empty and holds no index.json, so it is not an earlier export; "
                "--force replaces only those: give a new or empty folder")
    return None


def export_atomically(problems: list[Any], out_dir: Path, *, seed: int,
                      with_solutions: bool) -> list[dict[str, Any]]:
    """Export into a temporary folder beside ``out_dir``, then move its entries in: a failure
    while writing leaves ``out_dir`` as it was, and a replaced earlier export (``--force``)
    leaves none of its files behind."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new.", dir=out_dir.parent))
    try:
        index = export_problems(problems, staging, seed=seed, with_solutions=with_solutions)
        if not out_dir.exists():
            staging.rename(out_dir)
            return index
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
        for entry in list(out_dir.iterdir()):
            entry.rename(old / entry.name)
        for entry in list(staging.iterdir()):
            entry.rename(out_dir / entry.name)
        shutil.rmtree(old)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return index


def run_export(args: argparse.Namespace) -> int:
    try:
        problems = _select(args)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if (refusal := export_refusal(args.out_dir, force=args.force)) is not None:
        return fail(refusal)
    index = export_atomically(problems, args.out_dir, seed=args.seed,
                              with_solutions=args.with_solutions)
    solutions = sum(len(e["solution_files"]) for e in index)
    level = Path(index[0]["file"]).parent if index else Path("level0")
    hint = (f"; evaluate with `multiminddev eval-dir {args.out_dir / level} "
            f"{args.out_dir / 'solutions' / 'naive' / level}`" if solutions else "")
    print(f"wrote {len(index)} problems" + (f" and {solutions} solutions" if solutions else "")
          + f" to {args.out_dir} (splits.json, index.json{hint})")
    return 0
