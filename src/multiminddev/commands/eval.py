"""``multiminddev eval`` and ``multiminddev eval-dir``: evaluate candidates against problems.

Exit codes (``commands._io.ExitCode``): 0 when every candidate is ``ok``; 1 when one was
rejected, incorrect, did not compile or failed to run; 69 when none failed but some could not be
run for want of a GPU (``no_gpu``: compile-only) or the Ray cluster is not reachable; 2 for bad
input (a missing file or folder, a problem that does not load, a bad option value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.commands._io import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    ExitCode,
    InputError,
    dir_problem,
    fail,
    read_text,
    warn,
)
from multiminddev.distributed.cluster import RayUnavailableError, add_ray_argument
from multiminddev.distributed.ray_eval import make_evaluator
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.env.config import TENSOR_TRANSFERS
from multiminddev.env.results import (
    EvalResult,
    EvalStatus,
    Finding,
    RejectReason,
    StageStatus,
    StaticCheckResult,
)
from multiminddev.report.files import read_jsonl_rows, write_atomic
from multiminddev.report.metrics import NOT_MEASURED, geometric_mean
from multiminddev.tasks.problem import ProblemError, load_problem


def register(subparsers: Any) -> None:
    one = subparsers.add_parser("eval", help="evaluate one candidate against one problem")
    one.add_argument("problem", type=Path, help="KernelBench-format problem file")
    one.add_argument("candidate", type=Path, help="candidate module defining ModelNew")
    _common_options(one)
    one.add_argument("--json", action="store_true", help="print the EvalResult as JSON")
    one.set_defaults(handler=run_eval)

    many = subparsers.add_parser(
        "eval-dir", help="evaluate a folder of candidates (KernelBench layout)",
        description="Pair each candidate with a problem by file name: the problem's own name "
                    "(17_Name.py), its leading number (17_anything.py), or KernelBench's "
                    "generation layout level_L_problem_N_sample_S_kernel.py. Candidates that "
                    "match no problem are listed on stderr and in the summary.")
    many.add_argument("problems_dir", type=Path,
                      help="folder of problem files N_Name.py (e.g. KernelBench/level1), or a "
                           "KernelBench checkout with level1/.. level4/ folders")
    many.add_argument("candidates_dir", type=Path, help="folder of candidate .py files")
    many.add_argument("--out", type=Path, default=None,
                      help="write EvalResults as JSONL here, each as soon as it is known")
    many.add_argument("--resume", action="store_true",
                      help="keep the results already in --out and evaluate only the other candidates")
    many.add_argument("--workers", type=POSITIVE_INT, default=None, help="evaluation slots (default: two per GPU, one without a GPU)")
    many.add_argument("--baseline-workers", type=NON_NEGATIVE_INT, default=None,
                      help="trusted processes measuring baselines ahead of the candidates "
                           "(default: half the CPU cores, 2 to 8; 0: each evaluation measures its own)")
    _common_options(many)
    add_ray_argument(many)
    many.set_defaults(handler=run_eval_dir)


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-benchmark", action="store_true", help="skip timing")
    parser.add_argument("--trials", type=POSITIVE_INT, default=5, help="correctness trials (default 5)")
    parser.add_argument("--no-compile-baseline", action="store_true",
                        help="skip the torch.compile baseline")
    parser.add_argument("--arch", type=compile_arch, default=None,
                        help="compile target without a GPU (default sm_90; one NVRTC supports)")
    parser.add_argument("--bench-budget", type=float, default=None, metavar="SECONDS",
                        help="seconds of timed calls per timed function: the candidate and each "
                             "baseline measured on first sight (default: EvalConfig's "
                             f"{EvalConfig.bench_budget_s}; at least "
                             f"{EvalConfig.min_timed_runs} calls are timed whatever the budget)")
    parser.add_argument("--tensor-transfer", choices=TENSOR_TRANSFERS, default=None,
                        help="how outputs reach the evaluator: 'memfd', a sealed memory file "
                             "(the default on Linux), or 'pipe' (bytes through the worker's "
                             "pipe; docs/evaluator.md)")


def _config(args: argparse.Namespace, workers: int | None = 1) -> Any:
    given = {"bench_budget_s": args.bench_budget, "tensor_transfer": args.tensor_transfer}
    return EvalConfig(num_workers=workers, num_trials=args.trials, benchmark=not args.no_benchmark,
                      compile_baseline=not args.no_compile_baseline, arch=args.arch,
                      **{k: v for k, v in given.items() if v is not None})


def run_eval(args: argparse.Namespace) -> int:
    try:
        read_text(args.problem, "problem file")
        candidate = read_text(args.candidate, "candidate file")
        problem = load_problem(args.problem)
        config = _config(args)
    except (ProblemError, ValueError) as exc:  # InputError is a ValueError
        return fail(" ".join(str(exc).split()))
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(problem, candidate)
    if args.json:
        print(result.to_json(indent=2))
    else:
        print_result(result, args.candidate.name)
    return result_exit_code([result])


def result_exit_code(results: Sequence[Any]) -> ExitCode:
    """OK when every result is ok; EVALUATION_FAILED when one failed (rejected, incorrect,
    compile or runtime error, timeout; a candidate file that is not UTF-8 too); UNAVAILABLE when
    none failed but one could not be run here (no GPU: compile-only; an infrastructure error)."""
    statuses = {r.status for r in results}
    if statuses <= {EvalStatus.OK}:
        return ExitCode.OK
    if statuses - {EvalStatus.OK, EvalStatus.NO_GPU, EvalStatus.INFRA_ERROR}:
        return ExitCode.EVALUATION_FAILED
    return ExitCode.UNAVAILABLE


def compile_arch(text: str) -> str:
    """An argparse ``type`` for ``--arch``: ``sm_NN`` (or ``sm_NNa``) that this machine's NVRTC
    compiles for, else a one-line usage error listing the ones it does."""
    match = re.fullmatch(r"sm_(\d+)[a-z]?", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a GPU architecture such as sm_90")
    supported = nvrtc_archs()
    if supported and int(match.group(1)) not in supported:
        raise argparse.ArgumentTypeError(
            f"{text}: NVRTC here compiles for " + ", ".join(f"sm_{a}" for a in supported))
    return text


def nvrtc_archs() -> list[int]:
    """The architectures this machine's NVRTC compiles for (``[75, 80, ...]``); empty where the
    CUDA bindings are missing (the compile stage then says why)."""
    try:
        from cuda.bindings import nvrtc

        status, archs = nvrtc.nvrtcGetSupportedArchs()
    except (ImportError, RuntimeError, OSError):
        return []
    return [int(a) for a in archs] if int(status) == 0 else []


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
# KernelBench's generation scripts name a sample level_{level}_problem_{id}_sample_{n}_kernel.py.
_KB_GENERATION = re.compile(r"^level_?(\d+)_problem_(\d+)_sample_(\d+)(?:_kernel)?\.py$")
_LEVEL_DIR = re.compile(r"^level_?(\d+)$")
NAMING_HINT = ("name candidates after their problem (17_Name.py), by its number (17_try.py), or "
               "as KernelBench does (level_1_problem_17_sample_0_kernel.py)")


@dataclass(kw_only=True)
class CandidateMatch:
    """Candidates paired with problems, and those that match none (reported, never dropped)."""

    pairs: list[tuple[Path, Path]] = field(default_factory=list)
    unmatched: list[Path] = field(default_factory=list)


def problem_files(problems_dir: Path) -> list[Path]:
    """The problem files under ``problems_dir``: its own ``*.py``, else those of its level
    folders (a KernelBench checkout: ``levelN/`` or ``KernelBench/levelN/``)."""
    own = sorted(problems_dir.glob("*.py"))
    if own:
        return own
    for base in (problems_dir / "KernelBench", problems_dir):
        levels = sorted(d for d in base.glob("level*") if d.is_dir() and _LEVEL_DIR.match(d.name))
        if levels:
            return [f for d in levels for f in sorted(d.glob("*.py"))]
    return []


def _level_of(problem: Path) -> int | None:
    m = _LEVEL_DIR.match(problem.parent.name)
    return int(m.group(1)) if m else None


def pair_candidates(problem_files: list[Path], candidate_files: list[Path]) -> CandidateMatch:
    """Pair each candidate with a problem: same stem; else KernelBench's generation name
    ``level_L_problem_N_sample_S_kernel.py`` (problem number N, and level L where the problem's
    folder names one); else the same leading number (``17_...``)."""
    by_stem = {p.stem: p for p in problem_files}
    by_number: dict[str, Path] = {}
    by_level_number: dict[tuple[int, int], Path] = {}
    for p in problem_files:
        if m := _LEADING_NUMBER.match(p.name):
            by_number.setdefault(m.group(1), p)
            if (level := _level_of(p)) is not None:
                by_level_number.setdefault((level, int(m.group(1))), p)
    match = CandidateMatch()
    for cand in candidate_files:
        problem = by_stem.get(cand.stem)
        if problem is None and (kb := _KB_GENERATION.match(cand.name)):
            level, number = int(kb.group(1)), int(kb.group(2))
            problem = by_level_number.get((level, number))
            if problem is None and not by_level_number:  # problems without a level folder
                problem = by_number.get(str(number))
        elif problem is None and (m := _LEADING_NUMBER.match(cand.name)):
            problem = by_number.get(m.group(1))
        if problem is not None:
            match.pairs.append((problem, cand))
        else:
            match.unmatched.append(cand)
    return match


def match_candidates(problem_files: list[Path], candidate_files: list[Path]) -> list[tuple[Path, Path]]:
    """The (problem, candidate) pairs of :func:`pair_candidates`."""
    return pair_candidates(problem_files, candidate_files).pairs


BAD_INPUT_LABEL = "bad_input"  # status_counts' key for candidate files that are not UTF-8


def summarize(results: list[Any], unmatched: Sequence[str] = ()) -> dict[str, Any]:
    """Counts per status (candidate files that are not UTF-8 under ``bad_input``, not among the
    rejected hacks), compile rate, correctness rate, geometric-mean speedup of correct ones,
    and the candidate files that matched no problem (not evaluated). A rate nothing measured is
    None: the correctness rate where a candidate could not run (no GPU), every rate of an empty
    list."""
    n = len(results)
    counts = Counter(_count_label(r) for r in results)
    speedups = [r.benchmark.speedup_vs_eager for r in results
                if r.correct and r.benchmark.speedup_vs_eager > 0]
    geo = geometric_mean(speedups) if speedups else None
    measured = n and not counts.get(EvalStatus.NO_GPU.value)
    return {
        "candidates": n,
        "status_counts": dict(sorted(counts.items())),
        "compile_rate": sum(r.compiled for r in results) / n if n else None,
        "correct_rate": sum(r.correct for r in results) / n if measured else None,
        "geomean_speedup_vs_eager": geo,
        "timed": len(speedups),
        "unmatched_candidates": list(unmatched),
    }


def _count_label(result: Any) -> str:
    if result.status is EvalStatus.REJECTED and result.reject_reason is RejectReason.ENCODING:
        return BAD_INPUT_LABEL
    return result.status.value


def _rate(value: float | None) -> str:
    return NOT_MEASURED if value is None else f"{value:.0%}"


def run_eval_dir(args: argparse.Namespace) -> int:
    if args.resume and not args.out:
        return fail("--resume needs --out (the JSONL to resume)")
    for path in (args.problems_dir, args.candidates_dir):
        if (problem := dir_problem(path)) is not None:
            return fail(problem)
    if args.out is not None and args.out.is_dir():
        return fail(f"--out {args.out} is a directory; give a JSONL file")
    try:
        config = _config(args, workers=args.workers)
        if args.baseline_workers is not None:
            config = dataclasses.replace(config, baseline_workers=args.baseline_workers)
    except ValueError as exc:
        return fail(" ".join(str(exc).split()))
    match = pair_candidates(problem_files(args.problems_dir), sorted(args.candidates_dir.glob("*.py")))
    unmatched = [c.name for c in match.unmatched]
    if unmatched:
        warn(f"{len(unmatched)} candidate file(s) match no problem in {args.problems_dir} and are "
             f"not evaluated: {_names(unmatched)} ({NAMING_HINT})")
    pairs = match.pairs
    if not pairs:
        return fail(f"no candidate file in {args.candidates_dir} matches a problem file in "
                    f"{args.problems_dir}; {NAMING_HINT}")
    try:
        problems = {}
        for p in sorted({p for p, _ in pairs}):
            read_text(p, "problem file")
            problems[p] = load_problem(p)
    except (ProblemError, ValueError) as exc:  # InputError is a ValueError
        return fail(" ".join(str(exc).split()))
    done = read_results(args.out) if args.resume else {}
    todo = [(p, c) for p, c in pairs if c.name not in done]
    try:
        evaluator = _evaluator(config, args.ray) if todo else None
    except RayUnavailableError as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE)
    except ValueError as exc:
        return fail(str(exc))
    if args.out:
        # Rewritten with the kept results only (atomically), so a line torn by a crash cannot
        # glue onto the next one appended.
        write_atomic(args.out, "".join(_jsonl_line(name, r) for name, r in done.items()))
    if done:
        print(f"resuming: {len(pairs) - len(todo)} of {len(pairs)} candidates already in {args.out}")
    fresh = _evaluate_with_progress(todo, problems, evaluator, args.out)
    results = [done.get(c.name) or fresh[c.name] for _, c in pairs]
    _print_summary(pairs, results, summarize(results, unmatched))
    return result_exit_code(results)


def _names(names: Sequence[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _jsonl_line(candidate_file: str, result: Any) -> str:
    return json.dumps({"candidate_file": candidate_file, **result.to_dict()}) + "\n"


def unreadable_result(problem: Any, candidate: Path, message: str) -> Any:
    """The result of a candidate file that is not UTF-8 text: bad input (reason ``encoding``,
    counted apart from the hacks), refused without reaching the evaluator."""
    finding = Finding(rule="encoding", reason=RejectReason.ENCODING, message=message)
    return EvalResult(status=EvalStatus.REJECTED, problem=problem.name,
                      reject_reason=RejectReason.ENCODING, message=message,
                      static=StaticCheckResult(status=StageStatus.FAILED, findings=[finding]))


def read_results(path: Path | None) -> dict[str, Any]:
    """candidate file name -> EvalResult from an eval-dir JSONL (torn last lines skipped)."""
    out: dict[str, Any] = {}
    if path is None or not path.is_file():
        return out
    for row in read_jsonl_rows(path).rows:  # a line cut by a crash is skipped there
        try:
            out[row["candidate_file"]] = EvalResult.from_dict(row)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # not an eval-dir result: that candidate is evaluated again
    return out


def _evaluator(config: Any, ray_address: str | None) -> Any:
    """The local Evaluator, or the Ray evaluation service with ``--ray``."""
    return make_evaluator(config, ray_address)


def _evaluate_with_progress(todo: list[tuple[Path, Path]], problems: dict[Path, Any],
                            evaluator: Any, out: Path | None) -> dict[str, Any]:
    """Evaluate concurrently with ``evaluator`` (closed here); append each result to ``out`` as
    it completes (a crash or a time limit loses only the candidates still running)."""
    import concurrent.futures as cf

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    results: dict[str, Any] = {}
    if not todo:
        if evaluator is not None:
            evaluator.close()
        return results

    def record(cand: Path, result: Any) -> None:
        results[cand.name] = result
        if out is not None:
            with out.open("a", encoding="utf-8") as fh:
                fh.write(_jsonl_line(cand.name, result))

    sources: dict[Path, str] = {}
    for p, c in todo:
        try:
            sources[c] = read_text(c, "candidate file")
        except InputError as exc:  # one unreadable file is that candidate's result, not a crash
            record(c, unreadable_result(problems[p], c, str(exc)))
    todo = [(p, c) for p, c in todo if c in sources]
    if not todo:
        evaluator.close()
        return results
    with evaluator, Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task("evaluating", total=len(todo))
        # Every problem's baselines, measured ahead in the order its candidates come.
        evaluator.prefetch_baselines([problems[p] for p, _ in todo])
        futures = {evaluator.submit(problems[p], sources[c]): c for p, c in todo}
        for future in cf.as_completed(futures):
            record(futures[future], future.result())
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
        f" | compiled {_rate(summary['compile_rate'])}, correct {_rate(summary['correct_rate'])}" +
        (f", geometric-mean speedup {geo:.2f}x over {summary['timed']} timed" if geo else ""))
    if summary["unmatched_candidates"]:
        names = summary["unmatched_candidates"]
        console.print(f"not evaluated: {len(names)} candidate file(s) matched no problem: "
                      f"{_names(names)}")
