"""Packages import downward only, and no two packages import each other.

DESIGN.md style rule 12. The graph is read from the AST of every module and holds every
import: module level, inside functions and under ``if TYPE_CHECKING`` alike, because a
function-local import is as much a dependency as a module-level one (it only hides it).
Imports inside one package are not checked here: a package is one unit of layering.

``python tests/test_layers.py`` prints every upward import and package cycle, known or not.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "multiminddev"

# Rank of each top-level package or module of multiminddev. A module may import its own
# package, a package of lower rank, or one of equal rank (the cycle test keeps equal ranks
# from importing each other both ways). A new package must be given a rank here.
LAYERS: dict[str, int] = {
    # The floor: shared types and helpers that every layer may use and that import nothing
    # above them (the package root holds only the version).
    PACKAGE: 0,
    "core": 0,
    "pyast": 0,
    "cache_layout": 0,
    "cuda": 1,
    "env": 2,
    "tasks": 3,
    "agents": 4,
    "policy": 4,
    # Rule 12 lists rewards after episode, but rewards are pure functions of an evaluation
    # result (and of roles for credit); the episode runner scores each turn as it is
    # evaluated, so rewards sit under episode.
    "rewards": 5,
    "episode": 6,
    "rl": 7,
    # report holds metrics (fast_p, pass@k, bootstrap intervals) and renderers over plain
    # result records; it needs only env's result types, and train writes a report at the end
    # of a run, so it sits right under train.
    "report": 8,
    "train": 9,
    # distributed runs the evaluator and the trainer on Ray actors: above both, below commands.
    "distributed": 10,
    "integrations": 10,
    # serve runs episodes (train's policy and env) behind HTTP; only commands sit above it.
    "serve": 10,
    # commands are the bodies of the cli's subcommands; they drive train, report and env,
    # and cli.py only parses arguments and dispatches to them.
    "commands": 11,
    "cli": 12,
    "__main__": 13,  # ``python -m multiminddev``: runs cli
}

# Upward imports that remain, as (importing module, imported module), each with its reason.
# This set only shrinks: a pair that no longer occurs fails the test until it is removed.
KNOWN_UPWARD_IMPORTS: dict[tuple[str, str], str] = {
}


@dataclass(frozen=True, kw_only=True)
class Import:
    importer: str  # dotted module name of the importing module
    line: int
    imported: str  # dotted module name, resolved to a submodule where one is named

    def describe(self) -> str:
        return (f"{self.importer} (line {self.line}) imports {self.imported} "
                f"[{package_of(self.importer)} rank {LAYERS.get(package_of(self.importer))}"
                f" -> {package_of(self.imported)} rank {LAYERS.get(package_of(self.imported))}]")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The top-level package or module of ``multiminddev.x.y`` (``x``); the root is itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_module(dotted: str) -> bool:
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _from_target(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, importer: str, *, is_package: bool = False) -> list[Import]:
    """Every import of a ``multiminddev`` module in ``source``, wherever it sits."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_target(node, importer, is_package)
            # ``from multiminddev.train import metrics`` depends on the submodule itself
            targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                       for a in node.names]
        else:
            continue
        found += [Import(importer=importer, line=node.lineno, imported=t)
                  for t in dict.fromkeys(targets) if t == PACKAGE or t.startswith(PACKAGE + ".")]
    return found


def all_imports() -> list[Import]:
    found = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        found += imports_of(path.read_text(encoding="utf-8"), module_name(path),
                            is_package=path.name == "__init__.py")
    return found


def between_packages(imports: list[Import]) -> list[Import]:
    return [i for i in imports if package_of(i.importer) != package_of(i.imported)]


def upward(imports: list[Import]) -> list[Import]:
    return [i for i in between_packages(imports)
            if LAYERS[package_of(i.importer)] < LAYERS[package_of(i.imported)]]


def package_cycles(imports: list[Import]) -> list[list[str]]:
    """The strongly connected groups of two or more packages (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for i in between_packages(imports):
        graph.setdefault(package_of(i.importer), set()).add(package_of(i.imported))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _unknown(imports: list[Import]) -> list[Import]:
    return [i for i in imports if (i.importer, i.imported) not in KNOWN_UPWARD_IMPORTS]


def test_function_local_and_relative_imports_are_seen():
    source = ("from . import results\n"
              "def f():\n"
              "    from multiminddev.train.metrics import x\n"
              "    import multiminddev.rl.losses\n")
    found = imports_of(source, "multiminddev.env.worker")
    assert [(i.line, i.imported) for i in found] == [
        (1, "multiminddev.env.results"), (3, "multiminddev.train.metrics"),
        (4, "multiminddev.rl.losses")]


def test_every_package_has_a_layer():
    packages = {package_of(module_name(p)) for p in (SRC / PACKAGE).rglob("*.py")}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"give these packages a rank in LAYERS (tests/test_layers.py): {missing}"


def test_no_upward_imports():
    bad = _unknown(upward(all_imports()))
    assert not bad, ("packages import downward only (DESIGN.md rule 12); move the shared type "
                     "down to core/ or the caller up:\n" + "\n".join(i.describe() for i in bad))


def test_known_upward_imports_still_occur():
    occurring = {(i.importer, i.imported) for i in upward(all_imports())}
    gone = sorted(set(KNOWN_UPWARD_IMPORTS) - occurring)
    assert not gone, f"no longer upward imports; remove them from KNOWN_UPWARD_IMPORTS: {gone}"


def test_no_cycles_between_packages():
    imports = _unknown(all_imports())  # a known upward import is listed, not yet a cycle here
    cycles = package_cycles(imports)
    lines = [i.describe() for group in cycles for i in between_packages(imports)
             if package_of(i.importer) in group and package_of(i.imported) in group]
    assert not cycles, f"packages import each other: {cycles}\n" + "\n".join(lines)


if __name__ == "__main__":
    everything = all_imports()
    up = upward(everything)
    print(f"{len(up)} upward import statements, {len({(i.importer, i.imported) for i in up})} "
          f"(importer, imported) pairs, {len(_unknown(up))} not known:")
    print("\n".join(("  known  " if (i.importer, i.imported) in KNOWN_UPWARD_IMPORTS
                     else "  NEW    ") + i.describe() for i in up))
    print(f"package cycles, all imports: {package_cycles(everything)}")
    print(f"package cycles, known upward imports left out: {package_cycles(_unknown(everything))}")
    sys.exit(0)
