"""Evaluation-environment benchmark: run on the GPU machine, results go to docs/BENCHMARKS.md.

    PYTHONPATH=src python benchmarks/bench_eval.py --out $OUT [--quick]

Measures, side by side in one run (each measurement in its own try/except; a failure is
recorded with its error and the rest still runs):
  nvrtc_compile     NVRTC compile time per honest fixture kernel (no cache), median
  load_inline       torch load_inline build time for 2-3 of the same kernels (clean build dir)
  full_eval         full evaluation (compile + 5 trials + timing) of a ~64 MB problem, median
  throughput        pool throughput: candidates per minute per GPU (evaluate_many)
  do_bench          our timing vs triton.testing.do_bench on the same kernels (ratio)
  harness_vs_do_bench  the evaluator's figure (fresh inputs per call, checked calls) vs do_bench
  repeat_variance   one kernel timed repeatedly: (max - min) / median of the medians
  restart           worker replacement: time from a fault to the next ready worker / result
  defenses          evaluation time with defenses on vs off (overhead fraction)
Writes bench_eval.json and bench_eval.md under --out (default: $OUT, else ./bench-out).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

INLINE_TEMPLATE = '''
#include <torch/extension.h>
__global__ void k_{name}(const float* __restrict__ x, float* __restrict__ y, long n) {{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = {expr};
}}
torch::Tensor {name}(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    long n = x.numel();
    k_{name}<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
'''
NVRTC_TEMPLATE = '''
extern "C" __global__ void k_{name}(const float* __restrict__ x, float* __restrict__ y, long n) {{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = {expr};
}}
'''
PAIRED_KERNELS = {"relu": "fmaxf(x[i], 0.0f)", "square": "x[i] * x[i]", "neg_abs": "-fabsf(x[i])"}


def load_candidate_source(path: Path) -> tuple[str, str]:
    text = path.read_text()
    doc = text.split('"""', 2)[1]
    problem = re.search(r"problem:\s*(\S+)", doc).group(1)
    return problem, text


def honest_fixtures() -> list[Path]:
    return sorted(p for p in (FIXTURES / "honest").glob("*.py")
                  if not p.name.startswith("sec_") and "load_inline" not in p.name)


def cuda_sources(path: Path) -> list[str]:
    return re.findall(r'compile_kernels\(r"""(.*?)"""\)', path.read_text(), re.S)


# ---------------------------------------------------------------- measurements


def bench_nvrtc_compile(quick: bool) -> dict[str, Any]:
    from multiminddev.cuda.compiler import CompileOptions, compile_cuda

    per = {}
    reps = 3 if quick else 7
    for path in honest_fixtures():
        for src in cuda_sources(path):
            times = []
            for _ in range(reps):
                module = compile_cuda(src, CompileOptions(use_cache=False))
                times.append(module.result.seconds)
            per[path.stem] = statistics.median(times)
    for name, expr in PAIRED_KERNELS.items():
        src = NVRTC_TEMPLATE.format(name=name, expr=expr)
        per[f"paired_{name}"] = statistics.median(
            compile_cuda(src, CompileOptions(use_cache=False)).result.seconds for _ in range(reps))
    return {"per_candidate_s": per, "median_s": statistics.median(per.values())}


def bench_load_inline(quick: bool, nvrtc: dict[str, Any] | None) -> dict[str, Any]:
    from torch.utils.cpp_extension import load_inline

    names = list(PAIRED_KERNELS)[: 1 if quick else 3]
    per = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="bench-inline-") as build_dir:
            start = time.perf_counter()
            load_inline(name=f"bench_{name}_{os.getpid()}", cpp_sources=f"torch::Tensor {name}(torch::Tensor x);",
                        cuda_sources=INLINE_TEMPLATE.format(name=name, expr=PAIRED_KERNELS[name]),
                        functions=[name], build_directory=build_dir, verbose=False)
            per[name] = time.perf_counter() - start
    out: dict[str, Any] = {"per_kernel_s": per, "median_s": statistics.median(per.values())}
    if nvrtc:
        paired = [nvrtc["per_candidate_s"][f"paired_{n}"] for n in names]
        out["nvrtc_same_kernels_median_s"] = statistics.median(paired)
        out["speedup_nvrtc_vs_load_inline"] = out["median_s"] / out["nvrtc_same_kernels_median_s"]
    return out


TENSOR_TRANSFER = "pipe"  # --tensor-transfer: how outputs reach the evaluator (EvalConfig)


def _evaluator(**overrides: Any) -> Any:
    from multiminddev.env import EvalConfig, Evaluator

    return Evaluator(EvalConfig(num_workers=1, tensor_transfer=TENSOR_TRANSFER, **overrides))


def bench_full_eval(quick: bool) -> dict[str, Any]:
    from multiminddev.tasks.problem import load_problem

    problem = load_problem(FIXTURES / "problems" / "1_relu.py")
    src = (FIXTURES / "honest" / "relu_vec4.py").read_text()
    n = 3 if quick else 8
    with _evaluator() as ev:
        ev.warm_up()
        first = ev.evaluate(problem, src)  # pays the torch.compile baseline once (then cached)
        results = [ev.evaluate(problem, src) for _ in range(n)]
    secs = [r.seconds for r in results]
    last = results[-1]
    return {"stage_seconds_last": {"compile": last.compile.seconds, "run+verify": last.verify.seconds,
                                   "baseline+benchmark": last.benchmark.seconds},
            "timings_median": median_timings(results),
            "problem": "1_relu (64 MiB in, 64 MiB out)", "first_eval_s": first.seconds,
            "first_status": first.status.value, "statuses": [r.status.value for r in results],
            "median_s": statistics.median(secs), "all_s": secs,
            "median_kernel_ms": statistics.median(r.benchmark.candidate.median_ms for r in results),
            "fraction_of_peak": results[-1].benchmark.fraction_of_peak}


def median_timings(results: list[Any]) -> dict[str, float]:
    """Per-key median of EvalResult.timings (where an evaluation's seconds went)."""
    keys = sorted({k for r in results for k in r.timings})
    return {k: round(statistics.median(r.timings.get(k, 0.0) for r in results), 4) for k in keys}


def _workload(count: int) -> list[tuple[Any, str]]:
    from multiminddev.tasks.problem import load_problem

    pairs = []
    for path in honest_fixtures():
        problem, src = load_candidate_source(path)
        pairs.append((load_problem(FIXTURES / "problems" / f"{problem}.py"), src))
    return [pairs[i % len(pairs)] for i in range(count)]


def bench_throughput(quick: bool) -> dict[str, Any]:
    import torch

    gpus = max(1, torch.cuda.device_count())
    work = _workload(10 if quick else 30)
    with _pool_evaluator() as ev:
        ev.warm_up()
        ev.evaluate_many(work[:len(honest_fixtures())])  # fill the baseline cache first
        start = time.perf_counter()
        results = ev.evaluate_many(work)
        wall = time.perf_counter() - start
    per_min = len(work) / wall * 60
    return {"candidates": len(work), "eval_wall_s": wall, "gpus": gpus,
            "candidates_per_min_per_gpu": per_min / gpus,
            "statuses": _counts(r.status.value for r in results)}


def _pool_evaluator() -> Any:
    from multiminddev.env import EvalConfig, Evaluator

    return Evaluator(EvalConfig(num_workers=None, tensor_transfer=TENSOR_TRANSFER))


def _counts(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _import_fixture(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner(stem: str) -> tuple[Callable[[], Any], str]:
    """A zero-argument closure running an honest fixture's ModelNew on its problem's inputs."""
    import torch

    path = FIXTURES / "honest" / f"{stem}.py"
    problem_stem, _ = load_candidate_source(path)
    prob = _import_fixture(FIXTURES / "problems" / f"{problem_stem}.py")
    cand = _import_fixture(path)
    torch.manual_seed(0)
    model = cand.ModelNew(*prob.get_init_inputs()).cuda()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in prob.get_inputs()]
    return (lambda: model(*inputs)), problem_stem


def bench_do_bench(quick: bool) -> dict[str, Any]:
    import torch
    import triton.testing

    from multiminddev.env.benchmark import TimingPlan, l2_flush_buffer, time_cuda

    flush = l2_flush_buffer(0)
    plan = TimingPlan(min_runs=20, max_runs=500, budget_s=2.0)
    out = {}
    for stem in (["relu_vec4"] if quick else ["relu_vec4", "softmax_warp", "matmul_tiled", "sum_dim_shared"]):
        fn, _ = _runner(stem)
        with torch.no_grad():
            ours = time_cuda(fn, plan, flush).median_ms
            theirs = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        out[stem] = {"ours_ms": ours, "do_bench_ms": theirs, "ratio": ours / theirs}
    out["max_abs_deviation"] = max(abs(v["ratio"] - 1) for v in out.values() if isinstance(v, dict))
    return out


def bench_harness_vs_do_bench(quick: bool) -> dict[str, Any]:
    """The evaluator's figure for an honest kernel (fresh inputs per timed call, hidden checked
    calls, L2 flush, in a sandboxed worker) against triton's do_bench on fixed inputs here."""
    import torch
    import triton.testing

    from multiminddev.tasks.problem import load_problem

    out: dict[str, Any] = {}
    stems = ["relu_vec4"] if quick else ["relu_vec4", "softmax_warp", "matmul_tiled",
                                          "sum_dim_shared", "scale_add_fp16_half2"]
    with _evaluator(compile_baseline=False) as ev:
        ev.warm_up()
        for stem in stems:
            fn, problem_stem = _runner(stem)
            problem = load_problem(FIXTURES / "problems" / f"{problem_stem}.py")
            result = ev.evaluate(problem, (FIXTURES / "honest" / f"{stem}.py").read_text())
            with torch.no_grad():
                theirs = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
            ours = result.benchmark.candidate.median_ms if result.benchmark.candidate else float("nan")
            out[stem] = {"status": result.status.value, "harness_ms": ours, "do_bench_ms": theirs,
                         "ratio": ours / theirs, "timed_checks": result.verify.timed_checks_run,
                         "runs": result.benchmark.candidate.runs if result.benchmark.candidate else 0}
    ratios = [v["ratio"] for v in out.values() if isinstance(v, dict)]
    out["max_abs_deviation"] = max(abs(r - 1) for r in ratios)
    return out


def bench_repeat_variance(quick: bool) -> dict[str, Any]:
    import torch

    from multiminddev.env.benchmark import TimingPlan, l2_flush_buffer, time_cuda

    flush = l2_flush_buffer(0)
    plan = TimingPlan(min_runs=20, max_runs=500, budget_s=1.0)
    out = {}
    for stem in (["relu_basic"] if quick else ["relu_basic", "softmax_block", "matmul_tiled"]):
        fn, _ = _runner(stem)
        with torch.no_grad():
            medians = [time_cuda(fn, plan, flush).median_ms for _ in range(5 if quick else 10)]
        out[stem] = {"medians_ms": medians,
                     "relative_range": (max(medians) - min(medians)) / statistics.median(medians)}
    return out


def bench_restart(quick: bool) -> dict[str, Any]:
    from multiminddev.tasks.problem import load_problem

    problem = load_problem(FIXTURES / "problems" / "1_relu.py")
    bad = (FIXTURES / "wrong" / "relu_illegal_address.py").read_text()
    good = (FIXTURES / "honest" / "relu_basic.py").read_text()
    with _evaluator(spare_workers=0) as ev:
        ev.warm_up()
        ev.evaluate(problem, good)
        faulted = ev.evaluate(problem, bad)
        start = time.perf_counter()
        after = ev.evaluate(problem, good)
        next_result_s = time.perf_counter() - start
        slot = ev.pool.slots[0]
        cold, steps = [], []
        for _ in range(2 if quick else 4):
            t0 = time.perf_counter()
            worker = ev.pool.start_worker(slot.device_index)
            ok = worker.wait_ready(120)
            cold.append(time.perf_counter() - t0 if ok else float("nan"))
            steps.append({**(worker.info or {}).get("startup", {}),
                          "pinned_copies": (worker.info or {}).get("pinned_copies")})
            worker.stop()
    return {"fault_status": faulted.status.value, "worker_restarted": faulted.worker_restarted,
            "next_status": after.status.value, "next_eval_after_fault_s": next_result_s,
            "cold_worker_ready_s": cold, "cold_worker_ready_median_s": statistics.median(cold),
            "cold_worker_startup_steps_s": steps}


def bench_defenses(quick: bool) -> dict[str, Any]:
    """Evaluation time with every defence on (runtime guards, sandbox, OS isolation, precision
    check, registry snapshots) against all of them off, on the same honest workload. The
    torch.compile baseline is off in both: it is a baseline, not a defence, and its cache would
    favour whichever configuration runs second. Fresh inputs per timed call and the checked
    calls stay on in both: they are how timing works."""
    work = _workload(6 if quick else 12)
    out = {}
    for defenses in (False, True):
        with _evaluator(defenses=defenses, sandbox=defenses, precision_check=defenses,
                        isolation="auto" if defenses else "none",
                        compile_baseline=False) as ev:
            ev.warm_up()
            ev.evaluate_many(work[:2])
            results = ev.evaluate_many(work)
        out["on" if defenses else "off"] = {
            "mean_eval_s": statistics.fmean(r.seconds for r in results),
            "timings_median": median_timings(results),
            "statuses": _counts(r.status.value for r in results)}
    out["overhead_fraction"] = out["on"]["mean_eval_s"] / out["off"]["mean_eval_s"] - 1
    return out


# ---------------------------------------------------------------- driver


def machine() -> dict[str, Any]:
    import torch

    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "tensor_transfer": TENSOR_TRANSFER}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpus"] = torch.cuda.device_count()
    try:
        import cuda.core

        info["cuda_core"] = cuda.core.__version__
    except ImportError:
        pass
    return info


def run_all(quick: bool, only: list[str] | None) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("nvrtc_compile", lambda: bench_nvrtc_compile(quick)),
        ("load_inline", lambda: bench_load_inline(quick, results.get("nvrtc_compile"))),
        ("full_eval", lambda: bench_full_eval(quick)),
        ("throughput", lambda: bench_throughput(quick)),
        ("do_bench", lambda: bench_do_bench(quick)),
        ("harness_vs_do_bench", lambda: bench_harness_vs_do_bench(quick)),
        ("repeat_variance", lambda: bench_repeat_variance(quick)),
        ("restart", lambda: bench_restart(quick)),
        ("defenses", lambda: bench_defenses(quick)),
    ]
    for name, step in steps:
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            results[name] = step()
        except Exception as exc:  # noqa: BLE001 - record and carry on with the next measurement
            results[name] = {"error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["wall_s"] = round(time.perf_counter() - start, 2)
        print(f"[bench] {name}: {json.dumps(results[name], default=str)[:400]}", flush=True)
    return results


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"Measured {m.get('date_utc')} on {m.get('gpu', 'no GPU')} (x{m.get('gpus', 0)}), "
             f"torch {m.get('torch')}, cuda.core {m.get('cuda_core', '?')}, tensor transfer "
             f"{m.get('tensor_transfer', 'pipe')}{' (quick mode)' if results.get('quick') else ''}.", "",
             "| measurement | result | target |", "|---|---|---|"]

    def row(name: str, fmt: Callable[[dict[str, Any]], str], target: str) -> None:
        data = results.get(name)
        if data is None:
            return
        text = f"error: {data['error']}" if "error" in data else _safe(fmt, data)
        lines.append(f"| {name} | {text} | {target} |")

    row("nvrtc_compile", lambda d: f"median {d['median_s']:.3f} s per candidate", "<= 0.15 s")
    row("load_inline", lambda d: f"median {d['median_s']:.1f} s; NVRTC "
        f"{d.get('speedup_nvrtc_vs_load_inline', float('nan')):.0f}x faster", ">= 300x")
    row("full_eval", lambda d: f"median {d['median_s']:.2f} s (first, with torch.compile baseline: "
        f"{d['first_eval_s']:.1f} s)", "<= 2 s")
    row("throughput", lambda d: f"{d['candidates_per_min_per_gpu']:.1f} candidates/min/GPU",
        ">= 30")
    row("do_bench", lambda d: f"max deviation {d['max_abs_deviation']:.1%}", "<= 5%")
    row("harness_vs_do_bench", lambda d: f"max deviation {d['max_abs_deviation']:.1%}", "<= 5%")
    row("repeat_variance", lambda d: "; ".join(f"{k}: {v['relative_range']:.1%}" for k, v in d.items()
                                               if isinstance(v, dict)), "<= 2% (>= 20 us)")
    row("restart", lambda d: f"cold worker ready {d['cold_worker_ready_median_s']:.1f} s; next eval "
        f"after fault {d['next_eval_after_fault_s']:.1f} s", "<= 10 s")
    row("defenses", lambda d: f"overhead {d['overhead_fraction']:.0%} ({d['off']['mean_eval_s']:.2f} s "
        f"-> {d['on']['mean_eval_s']:.2f} s)", "<= 25%")
    return "\n".join(lines) + "\n"


def _safe(fmt: Callable[[dict[str, Any]], str], data: dict[str, Any]) -> str:
    try:
        return fmt(data)
    except Exception as exc:  # noqa: BLE001
        return f"(could not format: {exc})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, one load_inline build")
    parser.add_argument("--only", nargs="*", help="run only these measurements")
    parser.add_argument("--tensor-transfer", choices=("pipe", "memfd"), default="pipe",
                        help="how evaluation workers hand output tensors to the evaluator")
    args = parser.parse_args(argv)
    global TENSOR_TRANSFER
    TENSOR_TRANSFER = args.tensor_transfer
    results = run_all(args.quick, args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_eval.json").write_text(json.dumps(results, indent=2, default=str))
    (args.out / "bench_eval.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
