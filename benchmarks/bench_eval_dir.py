"""`eval-dir` throughput over the exported fast solutions, cold and warm: run on a GPU machine.

    PYTHONPATH=src python3 benchmarks/bench_eval_dir.py --out $OUT [--tier 0 1]
        [--baseline-workers 0 3] [--workers 1] [--bench-budget 1 0.25] [--tensor-transfer memfd]
        [--runs cold warm] [--limit N] [--work DIR]

Exports the built-in corpus with its solutions (one shape per family), gathers the fast
solutions into one folder and runs `multiminddev eval-dir` over them as a user would (a fresh
process each time), once per (baseline workers, slots) setting and run:

  cold  a fresh cache directory (MULTIMINDDEV_CACHE): every baseline is measured on first sight
  warm  the same cache directory again: every baseline comes from the authenticated disk cache

A cold run starts from an empty cache folder (one per setting, removed first); a warm run reuses
it, so with --work DIR a warm run can be a separate command after the cold one (the export,
--tier and --limit are those of the first command on DIR).

For each run it reports candidates per minute over the whole command (interpreter and worker
start-up included) and over the steady part (first result to last), the status counts, and
where an evaluation's seconds went: the mean and total of every ``EvalResult.timings`` key
(``parent.wait.baseline``: waiting for a prefetched baseline; ``parent.wait.slot`` /
``parent.wait.worker`` / ``parent.wait.gate``: for a slot, a started worker, the GPU's timing
gate; ``stage.*``: the worker's stages as the parent saw them; ``worker.*``: their sub-steps;
``baseline.measured_in_job``: figures the candidate's own worker had to measure).
Writes bench_eval_dir.json and bench_eval_dir.md under --out (default: $OUT, else ./bench-out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "multiminddev.cli"]


def _env(cache: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if cache is not None:
        env["MULTIMINDDEV_CACHE"] = str(cache)
    return env


def export_fast_solutions(work: Path, tiers: list[int] | None) -> tuple[Path, Path]:
    """(problems folder with level folders, one flat folder of the fast solutions)."""
    corpus = work / "corpus"
    command = [*CLI, "problems", "export", str(corpus), "--with-solutions",
               "--shapes-per-family", "1"]
    for tier in tiers or ():
        command += ["--tier", str(tier)]
    subprocess.run(command, check=True, env=_env(), capture_output=True, text=True)
    candidates = work / "candidates"
    candidates.mkdir()
    for path in sorted((corpus / "solutions" / "fast").glob("level*/*.py")):
        shutil.copy(path, candidates / path.name)  # file names are unique across tiers
    return corpus, candidates


def _watch_lines(path: Path, arrivals: list[float], stop: threading.Event) -> None:
    """Record when each JSONL line appears (eval-dir appends each result as it is known)."""
    seen = 0
    while not stop.is_set():
        try:
            count = path.read_text().count("\n") if path.exists() else 0
        except OSError:
            count = seen
        arrivals.extend([time.perf_counter()] * (count - seen))
        seen = max(seen, count)
        stop.wait(0.05)


def run_eval_dir(corpus: Path, candidates: Path, out: Path, cache: Path, *,
                 baseline_workers: int | None, workers: int | None, timeout_s: float,
                 bench_budget: float | None = None,
                 tensor_transfer: str | None = None) -> dict[str, Any]:
    command = [*CLI, "eval-dir", str(corpus), str(candidates), "--out", str(out)]
    if baseline_workers is not None:
        command += ["--baseline-workers", str(baseline_workers)]
    if workers is not None:
        command += ["--workers", str(workers)]
    if bench_budget is not None:
        command += ["--bench-budget", str(bench_budget)]
    if tensor_transfer is not None:
        command += ["--tensor-transfer", tensor_transfer]
    arrivals: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_lines, args=(out, arrivals, stop), daemon=True)
    start = time.perf_counter()
    watcher.start()
    try:
        proc = subprocess.run(command, env=_env(cache), capture_output=True, text=True,
                              check=False, timeout=timeout_s)
        returncode, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        # a run cut off by --timeout still reports the candidates it finished
        returncode = "timeout"
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
    wall = time.perf_counter() - start
    stop.set()
    watcher.join()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] \
        if out.exists() else []
    return {"command": " ".join(command), "returncode": returncode,
            "stderr_tail": stderr[-2000:], "wall_s": round(wall, 2),
            **throughput(len(rows), wall, [t - start for t in arrivals]), **split(rows)}


def throughput(n: int, wall_s: float, arrivals_s: list[float]) -> dict[str, Any]:
    """Candidates per minute over the whole command and over first-to-last result (pure)."""
    steady = None
    if len(arrivals_s) > 1 and arrivals_s[-1] > arrivals_s[0]:
        steady = 60.0 * (len(arrivals_s) - 1) / (arrivals_s[-1] - arrivals_s[0])
    return {"candidates": n,
            "candidates_per_min": round(60.0 * n / wall_s, 2) if wall_s > 0 else None,
            "steady_candidates_per_min": round(steady, 2) if steady else None,
            "first_result_s": round(arrivals_s[0], 2) if arrivals_s else None}


def split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Status counts and, per timings key, its mean and total over the candidates (pure)."""
    statuses = Counter(row.get("status", "?") for row in rows)
    keys = sorted({k for row in rows for k in (row.get("timings") or {})})
    per_key = {}
    for key in keys:
        values = [float(row["timings"][key]) for row in rows if key in (row.get("timings") or {})]
        per_key[key] = {"mean_s": round(statistics.fmean(values), 4),
                        "total_s": round(sum(values), 2), "n": len(values)}
    seconds = [float(row.get("seconds", 0.0)) for row in rows]
    return {"status_counts": dict(sorted(statuses.items())),
            "mean_evaluation_s": round(statistics.fmean(seconds), 3) if seconds else None,
            "timings": per_key}


def _machine() -> dict[str, str]:
    info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    for name, command in (("gpu", ["nvidia-smi", "-L"]),
                          ("commit", ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])):
        try:
            info[name] = subprocess.run(command, capture_output=True, text=True, check=False,
                                        timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info[name] = "unknown"
    return info


SPLIT_KEYS = ("parent.wait.baseline", "parent.wait.slot", "parent.wait.worker",
              "parent.wait.gate", "parent.static", "stage.setup", "stage.baseline",
              "stage.compile", "stage.run", "stage.guards", "stage.benchmark", "stage.teardown",
              "parent.verify",
              "baseline.measured_in_job")


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    title = (f"# eval-dir throughput ({machine.get('gpu', '?')}, {machine['date']}, "
             f"commit {machine.get('commit', '?')})")
    columns = ["baseline workers", "slots", "bench budget (s)", "run", "candidates", "per min (all)",
               "per min (steady)", "statuses", *SPLIT_KEYS]
    lines = [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for run in report["runs"]:
        means = [f"{run['timings'][k]['mean_s']:.2f}" if k in run["timings"] else "-"
                 for k in SPLIT_KEYS]
        lines.append(f"| {run['baseline_workers'] or 'default'} | {run['workers'] or 'default'} "
                     f"| {run.get('bench_budget') or 'default'} | {run['run']} "
                     f"| {run['candidates']} | {run['candidates_per_min']} "
                     f"| {run['steady_candidates_per_min']} | {run['status_counts']} | "
                     + " | ".join(means) + " |")
    lines += ["", "Split columns: mean seconds per candidate (`EvalResult.timings`)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument("--tier", type=int, nargs="*", default=None,
                        help="corpus tiers to export (default: all)")
    parser.add_argument("--baseline-workers", type=int, nargs="+", default=[None],
                        help="settings to compare (default: eval-dir's; 0: each evaluation "
                             "measures its own)")
    parser.add_argument("--workers", type=int, nargs="+", default=[None],
                        help="evaluation slots (default: eval-dir's, one per GPU)")
    parser.add_argument("--bench-budget", type=float, nargs="+", default=[None],
                        help="seconds of timed calls per timed function (eval-dir's "
                             "--bench-budget; default: eval-dir's)")
    parser.add_argument("--tensor-transfer", choices=("pipe", "memfd"), default=None,
                        help="eval-dir's --tensor-transfer (default: eval-dir's)")
    parser.add_argument("--runs", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per eval-dir run, seconds")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the export and the caches here (reused if present), so a "
                             "warm run can follow a cold one in another command; default: a "
                             "temporary folder removed at the end")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": _machine(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="mmd-bench-eval-dir-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus, candidates = work / "corpus", work / "candidates"
        if not candidates.is_dir():
            corpus, candidates = export_fast_solutions(work, args.tier)
            if args.limit is not None:
                for path in sorted(candidates.glob("*.py"))[args.limit:]:
                    path.unlink()
        report["candidate_files"] = sorted(p.name for p in candidates.glob("*.py"))
        settings = [(b, w, budget) for b in args.baseline_workers for w in args.workers
                    for budget in args.bench_budget]
        for baseline_workers, workers, budget in settings:
            name = f"b{baseline_workers}-w{workers}" + (f"-t{budget:g}" if budget else "")
            cache = work / f"cache-{name}"
            for run in args.runs:
                if run == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                    cache.with_name(cache.name + ".key").unlink(missing_ok=True)
                out = work / f"results-{name}-{run}.jsonl"
                out.unlink(missing_ok=True)
                result = run_eval_dir(corpus, candidates, out, cache,
                                      baseline_workers=baseline_workers, workers=workers,
                                      timeout_s=args.timeout, bench_budget=budget,
                                      tensor_transfer=args.tensor_transfer)
                result.update(run=run, baseline_workers=baseline_workers, workers=workers,
                              bench_budget=budget, tensor_transfer=args.tensor_transfer,
                              baseline_cache=str(cache / "baselines"))
                report["runs"].append(result)
                print(f"[bench] {name} {run}: {result['candidates']} candidates, "
                      f"{result['candidates_per_min']}/min "
                      f"(steady {result['steady_candidates_per_min']}/min), "
                      f"{result['status_counts']}", flush=True)
                if out.exists():
                    shutil.copy(out, args.out / out.name)
    (args.out / "bench_eval_dir.json").write_text(json.dumps(report, indent=2))
    (args.out / "bench_eval_dir.md").write_text(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
