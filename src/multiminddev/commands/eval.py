"""``multiminddev eval`` and ``multiminddev eval-dir``: evaluate candidates against problems.

Exit codes: 0 whenever candidates were evaluated (whatever their status, no_gpu included);
2 for usage errors (a missing file or directory, a problem that does not load).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from multiminddev.report.metrics import geometric_mean


def register(subparsers: Any) -> None:
    one = subparsers.add_parser("eval", help="evaluate one candidate against one problem")
    one.add_argument("problem", type=Path, help="KernelBench-format problem file")
    one.add_argument("candidate", type=Path, help="candidate module defining ModelNew")
    _common_options(one)
    one.add_argument("--json", action="store_true", help="print the EvalResult as JSON")
    one.set_defaults(handler=run_eval)

    many = subparsers.add_parser("eval-dir", help="evaluate a folder of candidates (KernelBench layout)")
    many.add_argument("problems_dir", type=Path)
    many.add_argument("candidates_dir", type=Path)
    many.add_argument("--out", type=Path, default=None,
                      help="write EvalResults as JSONL here, each as soon as it is known")
    many.add_argument("--resume", action="store_true",
                      help="keep the results already in --out and evaluate only the other candidates")
    many.add_argument("--workers", type=int, default=None, help="evaluation slots (default: one per GPU)")
    _common_options(many)
    many.set_defaults(handler=run_eval_dir)


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-benchmark", action="store_true", help="skip timing")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials (default 5)")
    parser.add_argument("--no-compile-baseline", action="store_true",
                        help="skip the torch.compile baseline")
    parser.add_argument("--arch", default=None, help="compile target without a GPU (default sm_90)")


def _config(args: argparse.Namespace, workers: int | None = 1) -> Any:
    from multiminddev.env import EvalConfig

    return EvalConfig(num_workers=workers, num_trials=args.trials, benchmark=not args.no_benchmark,
                      compile_baseline=not args.no_compile_baseline, arch=args.arch)


def run_eval(args: argparse.Namespace) -> int:
    from multiminddev.env import Evaluator
    from multiminddev.tasks.problem import ProblemError, load_problem

    for path in (args.problem, args.candidate):
        if not path.is_file():
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
    try:
        problem = load_problem(args.problem)
        config = _config(args)
    except (ProblemError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(problem, args.candidate.read_text())
    if args.json:
        print(result.to_json(indent=2))
    else:
        print_result(result, args.candidate.name)
    return 0


def print_result(result: Any, label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{label} on {result.problem}", show_header=True)
    table.add_column("stage")
    table.add_column("status")
    table.add_column("details", overflow="fold")
    c, v, b = result.compile, result.verify, result.benchmark
    table.add_row("static", result.static.status.value,
                  "; ".join(f"{f.rule}: {f.message}" for f in result.static.findings[:3]))
    kernels = ", ".join(f"{k.name} ({k.registers} regs, {k.shared_mem_bytes} B smem)"
                        for k in c.kernels[:4])
    table.add_row("compile", c.status.value,
                  f"{c.backend} {c.arch} {c.seconds:.3f} s{' cached' if c.cached else ''} {kernels}"
                  + (f" | {c.error.strip()[:200]}" if c.error else ""))
    table.add_row("verify", v.status.value,
                  f"{v.trials_passed}/{v.trials_run} trials, max abs err {v.max_abs_error:.3g}"
                  + (f" | {v.error[:300]}" if v.error else ""))
    bench = ""
    if b.status.value == "ok":
        bench = (f"{b.candidate.median_ms:.4g} ms (IQR {b.candidate.iqr_ms:.2g}); eager "
                 f"{b.eager.median_ms:.4g} ms -> {b.speedup_vs_eager:.2f}x")
        if b.speedup_vs_compile is not None:
            bench += f"; vs torch.compile {b.speedup_vs_compile:.2f}x"
        if b.fraction_of_peak is not None:
            bench += f"; {b.achieved_gbps:.0f} GB/s = {b.fraction_of_peak:.0%} of peak"
    table.add_row("benchmark", b.status.value, bench or b.error[:200])
    console = Console()
    console.print(table)
    console.print(f"[bold]{result.status.value}[/bold]: {result.message}  "
                  f"({result.seconds:.2f} s on {result.device or 'unknown device'})")


# ---------------------------------------------------------------- eval-dir

_LEADING_NUMBER = re.compile(r"^(\d+)_")


def match_candidates(problem_files: list[Path], candidate_files: list[Path]) -> list[tuple[Path, Path]]:
    """Pair each candidate with a problem: same stem, else the same leading number (``17_...``)."""
    by_stem = {p.stem: p for p in problem_files}
    by_number: dict[str, Path] = {}
    for p in problem_files:
        if m := _LEADING_NUMBER.match(p.name):
            by_number.setdefault(m.group(1), p)
    pairs = []
    for cand in candidate_files:
        problem = by_stem.get(cand.stem)
        if problem is None and (m := _LEADING_NUMBER.match(cand.name)):
            problem = by_number.get(m.group(1))
        if problem is not None:
            pairs.append((problem, cand))
    return pairs


def summarize(results: list[Any]) -> dict[str, Any]:
    """Counts per status, compile rate, correctness rate, geometric-mean speedup of correct ones."""
    n = len(results)
    counts = Counter(r.status.value for r in results)
    speedups = [r.benchmark.speedup_vs_eager for r in results
                if r.correct and r.benchmark.speedup_vs_eager > 0]
    geo = geometric_mean(speedups) if speedups else None
    return {
        "candidates": n,
        "status_counts": dict(sorted(counts.items())),
        "compile_rate": sum(r.compiled for r in results) / n if n else 0.0,
        "correct_rate": sum(r.correct for r in results) / n if n else 0.0,
        "geomean_speedup_vs_eager": geo,
        "timed": len(speedups),
    }


def run_eval_dir(args: argparse.Namespace) -> int:
    from multiminddev.tasks.problem import ProblemError, load_problem

    if args.resume and not args.out:
        print("error: --resume needs --out (the JSONL to resume)", file=sys.stderr)
        return 2
    for path in (args.problems_dir, args.candidates_dir):
        if not path.is_dir():
            print(f"error: {path} is not a directory", file=sys.stderr)
            return 2
    pairs = match_candidates(sorted(args.problems_dir.glob("*.py")),
                             sorted(args.candidates_dir.glob("*.py")))
    if not pairs:
        print("error: no candidate file matches a problem file by name or leading number",
              file=sys.stderr)
        return 2
    try:
        problems = {p: load_problem(p) for p in {p for p, _ in pairs}}
    except ProblemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = read_results(args.out) if args.resume else {}
    todo = [(p, c) for p, c in pairs if c.name not in done]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # Rewritten with the kept results only, so a line torn by a crash cannot glue onto
        # the next one appended.
        args.out.write_text("".join(json.dumps({"candidate_file": name, **r.to_dict()}) + "\n"
                                    for name, r in done.items()))
    if done:
        print(f"resuming: {len(pairs) - len(todo)} of {len(pairs)} candidates already in {args.out}")
    fresh = _evaluate_with_progress(todo, problems, _config(args, workers=args.workers), args.out)
    results = [done.get(c.name) or fresh[c.name] for _, c in pairs]
    _print_summary(pairs, results, summarize(results))
    return 0


def read_results(path: Path | None) -> dict[str, Any]:
    """candidate file name -> EvalResult from an eval-dir JSONL (torn last lines skipped)."""
    from multiminddev.env import EvalResult

    out: dict[str, Any] = {}
    if path is None or not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            out[row["candidate_file"]] = EvalResult.from_dict(row)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a line cut by a crash: that candidate is evaluated again
    return out


def _evaluate_with_progress(todo: list[tuple[Path, Path]], problems: dict[Path, Any], config: Any,
                            out: Path | None) -> dict[str, Any]:
    """Evaluate concurrently; append each result to ``out`` as it completes (a crash or a
    time limit loses only the candidates still running)."""
    import concurrent.futures as cf

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from multiminddev.env import Evaluator

    results: dict[str, Any] = {}
    if not todo:
        return results
    with Evaluator(config) as evaluator, Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task("evaluating", total=len(todo))
        futures = {evaluator.submit(problems[p], c.read_text()): c for p, c in todo}
        for future in cf.as_completed(futures):
            cand, result = futures[future], future.result()
            results[cand.name] = result
            if out is not None:
                with out.open("a") as fh:
                    fh.write(json.dumps({"candidate_file": cand.name, **result.to_dict()}) + "\n")
            progress.advance(task)
    return results


def _print_summary(pairs: list[tuple[Path, Path]], results: list[Any], summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="evaluation results")
    for col in ("candidate", "problem", "status", "speedup", "message"):
        table.add_column(col, overflow="fold")
    for (_, cand), r in zip(pairs, results, strict=True):
        speed = f"{r.speedup:.2f}x" if r.correct and r.speedup else ""
        table.add_row(cand.name, r.problem, r.status.value, speed, r.message[:120])
    console = Console()
    console.print(table)
    geo = summary["geomean_speedup_vs_eager"]
    console.print(
        f"{summary['candidates']} candidates: " +
        ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items()) +
        f" | compiled {summary['compile_rate']:.0%}, correct {summary['correct_rate']:.0%}" +
        (f", geometric-mean speedup {geo:.2f}x over {summary['timed']} timed" if geo else ""))
