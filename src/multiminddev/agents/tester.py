"""The Tester: a rule-based agent that turns an ``EvalResult`` into feedback for the next turn.

``tester_feedback(result, source)`` writes, within ``max_chars``: what happened (status and
message), the detail that matters for that status (first compile errors with the offending
source line, the first mismatch with expected vs actual values, timings against eager and
``torch.compile``, the rule a rejected candidate broke), per-kernel registers / shared memory /
spills with an occupancy estimate, and pitfall hints from static analysis of the CUDA source
(``agents/pitfalls.py``). It never trains and never raises.

``deep_profile(problem, source)`` optionally runs Nsight Compute and compute-sanitizer on the
candidate in a subprocess when they are on PATH (GPU machines); elsewhere it says it skipped.
"""

from __future__ import annotations

import ast
import enum
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev import pyast
from multiminddev.agents.pitfalls import extract_cuda_sources, find_pitfalls
from multiminddev.env import profile as ncu
from multiminddev.env.results import EvalResult, EvalStatus, KernelResources, StageStatus

# --------------------------------------------------------------------------- occupancy


@dataclass(frozen=True, kw_only=True)
class SMLimits:
    """Per-SM limits; the defaults are sm_90 (H100/H200)."""

    registers: int = 65536
    shared_mem_bytes: int = 228 * 1024
    max_shared_per_block: int = 227 * 1024
    reserved_shared_per_block: int = 1024  # the runtime keeps 1 KB per block on sm_80+
    shared_alloc_unit: int = 128
    max_threads: int = 2048
    max_blocks: int = 32
    warp_size: int = 32
    register_alloc_unit: int = 256  # registers are allocated per warp in units of 256
    max_registers_per_thread: int = 255
    max_threads_per_block: int = 1024


SM90 = SMLimits()


class OccupancyLimiter(str, enum.Enum):
    THREADS = "threads"  # warps per SM
    BLOCKS = "blocks"  # blocks per SM
    REGISTERS = "registers"
    SHARED_MEMORY = "shared_memory"
    INVALID = "invalid"  # the block cannot launch at all (too many threads/registers/smem)


@dataclass(frozen=True, kw_only=True)
class Occupancy:
    blocks_per_sm: int
    active_warps: int
    max_warps: int
    limiter: OccupancyLimiter

    @property
    def fraction(self) -> float:
        return self.active_warps / self.max_warps if self.max_warps else 0.0


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def estimate_occupancy(
    *,
    registers_per_thread: int,
    shared_mem_per_block: int,
    threads_per_block: int,
    limits: SMLimits = SM90,
) -> Occupancy:
    """Theoretical occupancy, as the CUDA occupancy calculator computes it."""
    max_warps = limits.max_threads // limits.warp_size
    warps = -(-max(threads_per_block, 1) // limits.warp_size)
    regs_per_warp = _round_up(max(registers_per_thread, 0) * limits.warp_size,
                              limits.register_alloc_unit)
    smem = _round_up(max(shared_mem_per_block, 0), limits.shared_alloc_unit)
    if (threads_per_block > limits.max_threads_per_block
            or registers_per_thread > limits.max_registers_per_thread
            or regs_per_warp * warps > limits.registers
            or smem > limits.max_shared_per_block):
        return Occupancy(blocks_per_sm=0, active_warps=0, max_warps=max_warps,
                         limiter=OccupancyLimiter.INVALID)
    candidates = {
        OccupancyLimiter.THREADS: max_warps // warps,
        OccupancyLimiter.BLOCKS: limits.max_blocks,
        OccupancyLimiter.REGISTERS: (limits.registers // regs_per_warp) // warps
        if regs_per_warp else limits.max_blocks,
        OccupancyLimiter.SHARED_MEMORY: limits.shared_mem_bytes
        // (smem + limits.reserved_shared_per_block),
    }
    limiter = min(candidates, key=lambda k: candidates[k])  # first minimum in this order
    blocks = candidates[limiter]
    return Occupancy(blocks_per_sm=blocks, active_warps=blocks * warps, max_warps=max_warps,
                     limiter=limiter)


# --------------------------------------------------------------------------- launch shapes


def threads_per_block_in(source: str | None) -> int | None:
    """Threads per block of the first ``block=(...)`` launch with literal (or module-constant)
    sizes, or None when it cannot be read statically."""
    if not source:
        return None
    try:
        tree = pyast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    constants = {
        t.id: n.value.value
        for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value.value, int)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "block":
                dims = kw.value.elts if isinstance(kw.value, (ast.Tuple, ast.List)) else [kw.value]
                values = [_int_value(d, constants) for d in dims]
                if values and all(v is not None for v in values):
                    return math.prod(values)  # type: ignore[arg-type]
    return None


def _int_value(node: ast.AST, constants: dict[str, int]) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


# --------------------------------------------------------------------------- feedback sections


def _header(result: EvalResult) -> str:
    line = f"Status: {result.status.value}."
    if result.message:
        line += f" {result.message.strip()}"
    return line


def _source_lines(cuda_sources: list[str], line: int | None) -> list[str]:
    """The offending line and the one before it (errors like a missing ';' point one past)."""
    if not line or not cuda_sources:
        return []
    lines = cuda_sources[0].splitlines()
    if not 0 < line <= len(lines):
        return []
    first = max(line - 1, 1)
    return [f"{n:>4} | {lines[n - 1].rstrip()[:150]}" for n in range(first, line + 1)
            if lines[n - 1].strip()]


def _compile_section(result: EvalResult, cuda: list[str], max_errors: int = 3) -> str:
    c = result.compile
    errors = c.errors
    if not errors:
        text = (c.error or c.log or result.message).strip()
        return "Compile failed:\n" + _tail_lines(text, 6) if text else ""
    out = [f"Compile errors ({c.backend}, {len(errors)} total; first {min(len(errors), max_errors)}):"]
    for d in errors[:max_errors]:
        where = f"line {d.line}" if d.line else "?"
        out.append(f"- {where}: {d.message.strip()[:200]}")
        out += [f"    {code}" for code in _source_lines(cuda, d.line)]
    return "\n".join(out)


def _tail_lines(text: str, n: int) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return "\n".join(x[:200] for x in lines[-n:])


def _mismatch_section(result: EvalResult) -> str:
    v = result.verify
    out = [f"Wrong output: {v.trials_passed}/{v.trials_run} trials passed "
           f"(atol={v.atol:g}, rtol={v.rtol:g}); max abs error {v.max_abs_error:.4g}, "
           f"max rel error {v.max_rel_error:.4g}."]
    if v.mismatches:
        m = v.mismatches[0]
        out.append(f"First failure: trial {m.trial}, output {m.output_index}: {m.reason}"
                   + (f" ({m.message.strip()[:200]})" if m.message else ""))
        if m.mismatched_fraction:
            out.append(f"{m.mismatched_fraction:.1%} of elements differ.")
        if m.first_bad_indices:
            pairs = []
            for idx, exp, act in zip(m.first_bad_indices[:4], m.expected_values, m.actual_values):
                pairs.append(f"{tuple(idx)}: expected {exp:.6g}, got {act:.6g}")
            out.append("At " + "; ".join(pairs) if pairs else
                       f"First bad indices: {m.first_bad_indices[:4]}")
        out.append(_mismatch_hint(m.reason, m.mismatched_fraction))
    elif v.error:
        out.append(_tail_lines(v.error, 4))
    return "\n".join(x for x in out if x)


def _mismatch_hint(reason: str, fraction: float) -> str:
    if reason == "shape":
        return "Hint: the output shape is wrong; allocate it exactly like Model's output."
    if reason == "dtype":
        return "Hint: return the same dtype as Model."
    if reason == "nan_inf":
        return "Hint: NaN/Inf appear: uninitialised output, out-of-bounds reads or division by 0."
    if 0 < fraction < 0.05:
        return "Hint: few elements differ: check edge handling (last block, tails, boundaries)."
    return ""


def _runtime_section(result: EvalResult) -> str:
    text = result.verify.error or result.benchmark.error or ""
    if not text.strip():
        return ""
    return "Error:\n" + _tail_lines(text, 4)


def _timeout_section(result: EvalResult) -> str:
    return ("It ran past the time limit: look for an infinite loop (a loop variable that never "
            "reaches its bound), a grid far larger than the data, or a deadlock at "
            "__syncthreads() inside a branch not all threads take.")


def _rejected_section(result: EvalResult) -> str:
    reason = result.reject_reason.value if result.reject_reason else "unspecified"
    out = [f"Rejected (rule broken: {reason}). The kernel must do the work itself; no torch "
           "compute, reference Model use, fallbacks, threads or streams in forward."]
    for f in result.static.findings[:3]:
        if f.message.strip() and f.message.strip() in result.message:
            continue  # already in the header line
        where = f"line {f.line}: " if f.line else ""
        out.append(f"- {where}{f.rule}: {f.message.strip()[:200]}")
    return "\n".join(out)


def _timing_section(result: EvalResult) -> str:
    b = result.benchmark
    if b.status is not StageStatus.OK:
        return "Correct, but timing failed: " + (b.error.strip()[:200] or "no detail")
    out = [f"Correct. Time {b.candidate.median_ms:.4g} ms vs eager PyTorch "
           f"{b.eager.median_ms:.4g} ms: {b.speedup_vs_eager:.2f}x"]
    if b.compiled is not None and b.speedup_vs_compile is not None:
        out.append(f"vs torch.compile {b.compiled.median_ms:.4g} ms: {b.speedup_vs_compile:.2f}x")
    if b.fraction_of_peak is not None and math.isfinite(b.fraction_of_peak):
        out.append(f"memory bandwidth {b.fraction_of_peak:.0%} of peak")
    text = "; ".join(out) + "."
    if b.speedup_vs_eager < 1.0:
        text += " Slower than PyTorch: optimise memory access first."
    return text


def _resources_section(kernels: list[KernelResources], threads: int | None) -> str:
    if not kernels:
        return ""
    assumed = threads is None
    tpb = threads or 256
    out = [f"Kernel resources (occupancy at {tpb} threads/block"
           f"{', assumed' if assumed else ''}, sm_90):"]
    for k in kernels[:4]:
        occ = estimate_occupancy(registers_per_thread=k.registers,
                                 shared_mem_per_block=k.shared_mem_bytes, threads_per_block=tpb)
        spill = (f", SPILLS {k.spill_store_bytes}B store/{k.spill_load_bytes}B load"
                 if k.spill_store_bytes or k.spill_load_bytes else "")
        out.append(f"- {k.name}: {k.registers} regs, {k.shared_mem_bytes} B smem{spill}; "
                   f"occupancy {occ.fraction:.0%} (limited by {occ.limiter.value})")
    return "\n".join(out)


def _pitfalls_section(cuda: list[str], max_hints: int = 4) -> str:
    hints = [h for src in cuda for h in find_pitfalls(src)][:max_hints]
    if not hints:
        return ""
    return "Possible issues in the CUDA source:\n" + "\n".join(f"- {h.render()}" for h in hints)


def _status_section(result: EvalResult, cuda: list[str]) -> str:
    s = result.status
    if s is EvalStatus.COMPILE_ERROR:
        return _compile_section(result, cuda)
    if s is EvalStatus.INCORRECT:
        return _mismatch_section(result)
    if s is EvalStatus.RUNTIME_ERROR:
        return _runtime_section(result)
    if s is EvalStatus.TIMEOUT:
        return _timeout_section(result)
    if s is EvalStatus.REJECTED:
        return _rejected_section(result)
    if s is EvalStatus.OK:
        return _timing_section(result)
    if s is EvalStatus.NO_GPU:
        if "no GPU" in result.message:
            return ""
        return ("Compile-only: it compiled, but there is no GPU here, so correctness and speed "
                "were not measured.") if result.compiled else ""
    if s is EvalStatus.INFRA_ERROR:
        return "The evaluation infrastructure failed (not the kernel's fault)."
    return ""


def tester_feedback(result: EvalResult, source: str | None, *, max_chars: int = 1500,
                    profile: Any = None) -> str:
    """Feedback text for the next turn, most important first, at most ``max_chars``.
    ``profile``: the kernel's Nsight Compute figures (``env.profile.KernelProfile``), reported
    after the status when they were measured."""
    try:
        cuda = extract_cuda_sources(source)
        kernels = result.compile.kernels if result.compiled else []
        sections = [
            _header(result),
            _status_section(result, cuda),
            profiler_feedback(profile) if profile is not None else "",
            _resources_section(kernels, threads_per_block_in(source)),
            _pitfalls_section(cuda),
        ]
    except Exception as exc:  # noqa: BLE001 - feedback must never break an episode
        sections = [_header(result), f"(feedback analysis failed: {exc!r})"[:200]]
    return fit_sections([s for s in sections if s], max_chars)


def format_failure_feedback(failure: str, detail: str, *, max_chars: int = 1500) -> str:
    """Feedback for a reply that held no usable candidate (nothing was evaluated)."""
    text = (f"Status: format failure ({failure}). {detail.strip()}\n"
            "Reply with exactly one ```python code block containing the complete module: "
            "imports, `kernels = compile_kernels(r'''...''')` and `class ModelNew(nn.Module)`.")
    return text[:max_chars]


def fit_sections(sections: list[str], max_chars: int) -> str:
    """Join sections in priority order; the first is cut if needed, later ones are dropped."""
    out = ""
    for i, section in enumerate(sections):
        candidate = section if not out else f"{out}\n{section}"
        if len(candidate) <= max_chars:
            out = candidate
        elif i == 0 or len(out) < max_chars // 3:
            out = candidate[: max(max_chars - 12, 0)] + " …(trimmed)"
            break
        else:
            break
    return out


# --------------------------------------------------------------------------- profiler figures

# Thresholds of the one-line reading of the figures: a kernel that moves memory at over 60% of
# peak is bound by memory, and below 40% with most time stalled on memory it waits on latency.
MEMORY_BOUND_PCT = 60.0
LOW_THROUGHPUT_PCT = 40.0
LOW_OCCUPANCY_PCT = 50.0
WARP_SIZE = 32


def profiler_feedback(profile: Any, *, top_stalls: int = 3) -> str:
    """The Tester's report of a kernel's Nsight Compute figures (``env.profile.KernelProfile``):
    for its longest kernel launch, achieved occupancy, memory throughput as % of peak, warp
    execution efficiency and the top stall reasons, then one line reading them. Empty when the
    profile has no figures (not measured, or it failed)."""
    if profile is None or profile.status is not ncu.ProfileStatus.OK or not profile.kernels:
        return ""
    main = max(profile.kernels, key=lambda k: k.metrics.get(ncu.DURATION, 0.0))
    m = main.metrics
    many = (f", the longest of {len(profile.kernels)} launches" if len(profile.kernels) > 1
            else "")
    took = f", {m[ncu.DURATION] / 1e3:.1f} us" if ncu.DURATION in m else ""
    lines = [f"Profiler (Nsight Compute, kernel {main.kernel}{many}{took}):"]
    if ncu.OCCUPANCY in m:
        lines.append(f"- achieved occupancy: {m[ncu.OCCUPANCY]:.1f}% of the SM's warp slots")
    memory = [v for v in (m.get(ncu.MEMORY_THROUGHPUT), m.get(ncu.DRAM_THROUGHPUT))
              if v is not None]
    if memory:
        dram = f" (DRAM {m[ncu.DRAM_THROUGHPUT]:.1f}%)" if ncu.DRAM_THROUGHPUT in m else ""
        lines.append(f"- memory throughput: {max(memory):.1f}% of peak{dram}")
    if ncu.THREADS_PER_WARP_INSTRUCTION in m:
        threads = m[ncu.THREADS_PER_WARP_INSTRUCTION]
        lines.append(f"- warp execution efficiency: {100 * threads / WARP_SIZE:.0f}% "
                     f"({threads:.1f} of {WARP_SIZE} threads active per instruction)")
    stalls = stall_reasons(m)
    if stalls:
        shown = ", ".join(f"{reason} {cycles:.1f}" for reason, cycles in stalls[:top_stalls])
        lines.append(f"- top stall reasons (cycles per issued instruction): {shown}")
    reading = _profile_reading(max(memory) if memory else None, m.get(ncu.OCCUPANCY),
                               stalls[0][0] if stalls else None)
    if reading:
        lines.append(reading)
    return "\n".join(lines)


def stall_reasons(metrics: Any) -> list[tuple[str, float]]:
    """(reason, stall cycles per issued instruction), largest first; "selected" (the cycle a
    warp issues) is no stall and is left out."""
    found = [(name[len(ncu.STALL_PREFIX):-len(ncu.STALL_SUFFIX)], value)
             for name, value in metrics.items()
             if name.startswith(ncu.STALL_PREFIX) and name.endswith(ncu.STALL_SUFFIX)]
    return sorted([(r, v) for r, v in found if r != "selected" and v > 0],
                  key=lambda rv: (-rv[1], rv[0]))


def _profile_reading(memory: float | None, occupancy: float | None, top: str | None) -> str:
    if memory is not None and memory >= MEMORY_BOUND_PCT:
        return ("Reading: memory-bound; fewer bytes moved (fusion, wider loads, reuse through "
                "shared memory) is what can make it faster.")
    if memory is not None and memory < LOW_THROUGHPUT_PCT and top == "long_scoreboard":
        return ("Reading: far from peak bandwidth and waiting on global memory loads; more "
                "loads in flight per thread (vector loads, more independent work) would help.")
    if occupancy is not None and occupancy < LOW_OCCUPANCY_PCT:
        return ("Reading: low occupancy; check registers and shared memory per block, and the "
                "block and grid sizes.")
    return ""


# --------------------------------------------------------------------------- deep profile

_HARNESS = r'''
import sys, torch
from multiminddev.tasks.problem import load_problem
ns_p, ns_c = {}, {}
problem = load_problem(sys.argv[1])
exec(compile(problem.source, "problem.py", "exec"), ns_p)
exec(compile(open(sys.argv[2]).read(), "candidate.py", "exec"), ns_c)
torch.manual_seed(0)
inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ns_p["get_inputs"]()]
model = ns_c["ModelNew"](*ns_p["get_init_inputs"]()).cuda()
with torch.no_grad():
    model(*inputs)
torch.cuda.synchronize()
'''

_NCU_METRICS = ("sm__warps_active.avg.pct_of_peak_sustained_active,"
                "dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum")


def deep_profile(problem: Any, source: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
    """Achieved occupancy / DRAM throughput (ncu) and memcheck / racecheck findings
    (compute-sanitizer) for one forward pass, each in its own subprocess.

    Returns {"ncu": {...} | {"skipped": why}, "sanitizer": {...} | {"skipped": why}}. The
    candidate runs outside the evaluator's sandbox here: use it on trusted or already-evaluated
    candidates only.
    """
    with tempfile.TemporaryDirectory(prefix="mmd-profile-") as tmp:
        d = Path(tmp)
        (d / "problem.py").write_text(problem.source)
        (d / "candidate.py").write_text(source)
        (d / "harness.py").write_text(_HARNESS)
        cmd = [sys.executable, str(d / "harness.py"), str(d / "problem.py"), str(d / "candidate.py")]
        return {
            "ncu": _run_ncu(cmd, timeout_s),
            "sanitizer": {tool: _run_sanitizer(cmd, tool, timeout_s)
                          for tool in ("memcheck", "racecheck")},
        }


def _run_tool(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    except OSError as exc:
        return f"could not run: {exc}"


def _run_ncu(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    ncu = shutil.which("ncu")
    if ncu is None:
        return {"skipped": "ncu (Nsight Compute) is not on PATH"}
    proc = _run_tool([ncu, "--csv", "--metrics", _NCU_METRICS, *cmd], timeout_s)
    if isinstance(proc, str):
        return {"error": proc}
    return {"returncode": proc.returncode, "metrics": parse_ncu_csv(proc.stdout),
            "stderr": proc.stderr[-500:]}


def parse_ncu_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv`` output (kernel name, metric name, value)."""
    import csv

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    return [{"kernel": r.get("Kernel Name", ""), "metric": r.get("Metric Name", ""),
             "unit": r.get("Metric Unit", ""), "value": r.get("Metric Value", "")} for r in rows]


SANITIZER_FINDINGS_EXIT = 3  # compute-sanitizer --error-exitcode: it found an error


def _run_sanitizer(cmd: list[str], tool: str, timeout_s: float) -> dict[str, Any]:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        return {"skipped": "compute-sanitizer is not on PATH"}
    proc = _run_tool([sanitizer, "--tool", tool, "--error-exitcode",
                      str(SANITIZER_FINDINGS_EXIT), *cmd], timeout_s)
    if isinstance(proc, str):
        return {"error": proc}
    if proc.returncode not in (0, SANITIZER_FINDINGS_EXIT):
        # The harness itself failed (an exception, no GPU memory, a crash the tool did not
        # attribute): that is no finding about the kernel, so say so instead of "not clean".
        return {"error": f"compute-sanitizer --tool {tool} exited {proc.returncode} without a "
                         f"finding: the harness failed (see stderr)",
                "returncode": proc.returncode, "stderr": proc.stderr[-1500:],
                "stdout": proc.stdout[-1500:]}
    findings = parse_sanitizer_findings(proc.stdout)
    # "Program hit CUDA_ERROR_... on CUDA API call to ..." is a host API call that returned an
    # error the program may well handle (libraries probe the driver this way); the kernel's own
    # memory or race errors are every other finding, and only they make it unclean.
    api_errors = [f for f in findings if f.startswith("Program hit")]
    kernel_findings = [f for f in findings if not f.startswith("Program hit")]
    # Exit 3 with no finding we can read is not called clean: the raw output travels instead.
    clean = proc.returncode == 0 or (bool(api_errors) and not kernel_findings)
    report: dict[str, Any] = {"returncode": proc.returncode, "clean": clean,
                              "findings": kernel_findings[:20], "api_errors": api_errors[:20]}
    if proc.returncode != 0:
        report["output"] = proc.stdout[-3000:]
    return report


def parse_sanitizer_findings(stdout: str) -> list[str]:
    """The headline of each error compute-sanitizer reported, e.g. "Invalid __global__ write of
    size 4 bytes" or "Program hit CUDA_ERROR_INVALID_VALUE (error 1) ... cuMemFree_v2.".

    Its report lines start with "========= "; a headline has one space after the marker, its
    details (thread, address, host frames) more, and the banner and summary are no findings.
    """
    findings = []
    for line in stdout.splitlines():
        if not line.startswith("========= ") or line.startswith("=========  "):
            continue
        text = line[len("========= "):].strip()
        if text and not text.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY",
                                          "LEAK SUMMARY")):
            findings.append(text)
    return findings
