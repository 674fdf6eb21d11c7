"""Ray evaluation service throughput: candidates per minute with 1 vs N GPUs of one host.

    PYTHONPATH=src python benchmarks/bench_ray_eval.py --gpus 1 2 --out $OUT/bench_ray_eval.json

Evaluates the reference solutions written by ``multiminddev problems export --with-solutions``
(``--variant fast``, ``--shapes-per-family 1`` by default; exported into a temporary folder
unless ``--export-dir`` names one that exists) on a local Ray cluster limited to each GPU count
in turn. Every GPU count starts from an empty cache (its own ``cache_dir``), so the first pass
includes first-sight baselines (peak bandwidth, eager and torch.compile timings); a second pass
over the same candidates on the same evaluator (``--passes 2``) measures throughput once the
cluster's baseline store holds them. ``--local`` adds the in-process ``Evaluator`` on one GPU
for reference. Writes one JSON with, per run: start-up seconds, then per pass the wall seconds,
candidates per minute, statuses and retried submissions; and the speedup of each GPU count over
the first one given.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2],
                        help="GPU counts to run, in order (default: 1 2); 0: two compile-only "
                             "CPU actors, a smoke test for a machine without a GPU")
    parser.add_argument("--export-dir", type=Path, default=None,
                        help="a `problems export --with-solutions` folder (default: export now)")
    parser.add_argument("--variant", default="fast", choices=["fast", "naive"])
    parser.add_argument("--shapes-per-family", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="only the first N candidates")
    parser.add_argument("--passes", type=int, default=2,
                        help="passes over the candidates per run: the first meets every "
                             "baseline for the first time (default 2)")
    parser.add_argument("--local", action="store_true",
                        help="also run the in-process Evaluator on one GPU")
    parser.add_argument("--no-compile-baseline", action="store_true")
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("OUT", "bench-out")) / "bench_ray_eval.json")
    args = parser.parse_args(argv)
    if any(n < 0 for n in args.gpus) or args.passes < 1:
        parser.error("--gpus counts must be >= 0 and --passes >= 1")
    return args


def export(out_dir: Path, shapes_per_family: int) -> None:
    """``multiminddev problems export OUT --with-solutions`` (the CLI itself)."""
    cmd = [sys.executable, "-c", "from multiminddev.cli import main; raise SystemExit(main())",
           "problems", "export", str(out_dir), "--with-solutions", "--force",
           "--shapes-per-family", str(shapes_per_family)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def load_pairs(export_dir: Path, variant: str, limit: int | None) -> list[tuple[Any, str]]:
    """(problem, solution source) for every exported problem with a ``variant`` solution."""
    from multiminddev.tasks.problem import load_problem

    pairs = []
    for entry in json.loads((export_dir / "index.json").read_text()):
        solution = entry.get("solution_files", {}).get(variant)
        if solution:
            pairs.append((load_problem(export_dir / entry["file"]),
                          (export_dir / solution).read_text()))
    return pairs[:limit] if limit else pairs


def run_passes(evaluator: Any, pairs: list[tuple[Any, str]], passes: int) -> list[dict[str, Any]]:
    out = []
    for index in range(passes):
        start = time.perf_counter()
        results = [f.result() for f in [evaluator.submit(p, c) for p, c in pairs]]
        seconds = time.perf_counter() - start
        out.append({
            "pass": index + 1, "candidates": len(results), "seconds": round(seconds, 2),
            "candidates_per_min": round(len(results) / seconds * 60, 2),
            "statuses": dict(collections.Counter(r.status.value for r in results)),
            "retried": sum(r.attempts > 1 for r in results),
            "devices": sorted({r.device for r in results}),
        })
        print(f"  pass {index + 1}: {out[-1]['candidates_per_min']} candidates/min "
              f"({out[-1]['statuses']})", file=sys.stderr)
    return out


@contextlib.contextmanager
def fresh_compile_caches() -> Iterator[None]:
    """torch.compile's own caches start empty for each run (set before its processes start), so
    a later run does not reuse the kernels an earlier one compiled for the same baselines."""
    dirs = {name: tempfile.mkdtemp(prefix=f"mmd-bench-{name.lower()}-", dir="/tmp")
            for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ.update(dirs)
    try:
        yield
    finally:
        for path in dirs.values():
            shutil.rmtree(path, ignore_errors=True)


def run_ray(pairs: list[tuple[Any, str]], gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    from multiminddev.distributed import LocalClusterConfig, RayEvalConfig, RayEvaluator
    from multiminddev.env import EvalConfig

    with fresh_compile_caches(), tempfile.TemporaryDirectory(prefix="mmd-ray-bench-") as cache:
        config = EvalConfig(cache_dir=cache, compile_baseline=not args.no_compile_baseline)
        ray_config = RayEvalConfig(local=LocalClusterConfig(num_gpus=gpus,
                                                            num_cpus=os.cpu_count() or 4))
        start = time.perf_counter()
        with RayEvaluator(config, ray_config) as evaluator:
            evaluator.warm_up()
            startup = time.perf_counter() - start
            actors = evaluator.actors()
            print(f"ray, {gpus} GPU(s): {len(actors)} actors ready in {startup:.1f} s",
                  file=sys.stderr)
            passes = run_passes(evaluator, pairs, args.passes)
    return {"mode": "ray", "gpus": gpus, "actors": len(actors), "startup_s": round(startup, 2),
            "passes": passes}


def run_local(pairs: list[tuple[Any, str]], args: argparse.Namespace) -> dict[str, Any]:
    from multiminddev.env import EvalConfig, Evaluator

    with fresh_compile_caches(), tempfile.TemporaryDirectory(prefix="mmd-local-bench-") as cache:
        config = EvalConfig(cache_dir=cache, num_workers=1,
                            compile_baseline=not args.no_compile_baseline)
        start = time.perf_counter()
        with Evaluator(config) as evaluator:
            evaluator.warm_up()
            startup = time.perf_counter() - start
            print(f"local Evaluator, 1 GPU: ready in {startup:.1f} s", file=sys.stderr)
            passes = run_passes(evaluator, pairs, args.passes)
    return {"mode": "local", "gpus": 1, "startup_s": round(startup, 2), "passes": passes}


def add_speedups(runs: list[dict[str, Any]]) -> None:
    """Each run's candidates per minute over the first Ray run's, pass by pass."""
    first = next((r for r in runs if r["mode"] == "ray"), None)
    for run in runs if first is not None else []:
        run["speedup_vs_first_ray_run"] = [
            round(p["candidates_per_min"] / f["candidates_per_min"], 3)
            for p, f in zip(run["passes"], first["passes"], strict=True)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory(prefix="mmd-export-") as tmp:
        export_dir = args.export_dir
        if export_dir is None or not (export_dir / "index.json").is_file():
            export_dir = export_dir or Path(tmp) / "export"
            export(export_dir, args.shapes_per_family)
        pairs = load_pairs(export_dir, args.variant, args.limit)
    if not pairs:
        print(f"no {args.variant} solutions in the export", file=sys.stderr)
        return 2
    visible = torch.cuda.device_count()
    if max(args.gpus) > visible:
        print(f"--gpus asks for {max(args.gpus)} GPUs; this machine shows {visible}",
              file=sys.stderr)
        return 2
    print(f"{len(pairs)} {args.variant} solutions, {args.passes} pass(es) per run",
          file=sys.stderr)
    report = {
        "benchmark": "bench_ray_eval", "date": datetime.datetime.now(datetime.UTC).isoformat(),
        "gpu": torch.cuda.get_device_name(0) if visible else "", "torch": torch.__version__,
        "variant": args.variant, "shapes_per_family": args.shapes_per_family,
        "candidates": len(pairs), "runs": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Written after every run, so a run cut short by a time limit keeps the ones before it.
    todo = [("local", 1)] if args.local else []
    for mode, gpus in todo + [("ray", n) for n in args.gpus]:
        report["runs"].append(run_local(pairs, args) if mode == "local"
                              else run_ray(pairs, gpus, args))
        add_speedups(report["runs"])
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({r["mode"] + str(r["gpus"]): r.get("speedup_vs_first_ray_run")
                      for r in report["runs"]}))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
