"""``multiminddev bench`` (run episodes per model/checkpoint, summarise, report) and
``multiminddev report`` (a report from existing training runs, bench outputs or eval-dir JSONL).

bench output layout (``--out DIR``)::

    DIR/run_record.json          the settings the episodes were run with (--resume checks them)
    DIR/<label>/episodes.jsonl   every episode, one line each, appended (fsync'd) as it ends:
                                 the conversation, EvalResults, rewards, its sample index
    DIR/<label>/summary.json     compile rate, correctness, hack rate, fast_p, geomeans, pass@k,
                                 per-turn curves, bootstrap intervals
    DIR/report.html              all labels side by side, plots embedded (PNG files beside it)
    DIR/summary.json             the same summaries together

Each episode counts as one sample, scored by its best attempt (see ``report.metrics``); pass@k
uses the ``--samples`` episodes per problem. On a machine without a GPU every kernel is compiled
but not run (status ``no_gpu``): the report says so and shows no speed figures.

Episodes of all problems run at once (``--concurrency`` bounds them; ``train.episode_stream``):
the model decodes batches that span problems while other problems' kernels are evaluated. A
killed run loses only the episodes in flight: ``--resume`` reads the episodes on disk, skips the
finished (problem, sample) pairs and runs the rest; the summaries and the report are made at
the end from the whole files, so a resumed run reports what an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multiminddev.agents.shipped import shipped_agents
from multiminddev.commands._io import ExitCode, InputError, dir_problem, fail, file_problem, warn
from multiminddev.commands._progress import ProgressBackend, ProgressEvaluator
from multiminddev.distributed.cluster import RayUnavailableError, add_ray_argument
from multiminddev.distributed.ray_eval import make_evaluator
from multiminddev.env import EvalConfig
from multiminddev.episode.runner import EpisodeConfig
from multiminddev.policy import (
    HFGenerationBackend,
    PolicyConfig,
    SamplingParams,
    adapter_paths_in,
    load_policy,
)
from multiminddev.policy.model import PolicyError, resolve_model_source
from multiminddev.report.files import describe_bad_lines, read_jsonl_rows, write_atomic
from multiminddev.report.html import normalise_samples, summarize_label, write_report
from multiminddev.rewards import RewardConfig
from multiminddev.tasks.loaders import load_problems
from multiminddev.tasks.problem import ProblemError
from multiminddev.train.episode_log import (
    RUN_RECORD_FILE,
    EpisodeLog,
    LoggedEpisodes,
    check_run_record,
    describe_dropped,
    episode_key,
    episode_record,
    read_episode_log,
)
from multiminddev.train.episode_stream import BatchingBackend, ProgressLine, stream_episodes
from multiminddev.train.seeds import compare_table, run_figures


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmark models/checkpoints on problems: episodes, summary, HTML report")
    bench.add_argument("--model", action="append", default=[], metavar="M",
                       help="model: 'default' (embedded SmolLM2), hub id, local dir or .gguf "
                            "(repeat to compare several)")
    bench.add_argument("--adapters", action="append", default=[], type=Path, metavar="DIR",
                       help="checkpoint dir with generator/ and optimizer/ adapters, on the first "
                            "--model (repeat to compare checkpoints); default without --model: "
                            "the agents the package ships, if any; 'none': the model alone")
    bench.add_argument("--problems", default="builtin:heldout",
                       help="builtin:heldout | builtin:tier1 | kernelbench:PATH | jsonl:PATH | ...")
    bench.add_argument("--samples", type=int, default=1, help="episodes per problem (pass@k)")
    bench.add_argument("--turns", type=int, default=3, help="agent turns per episode")
    bench.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    bench.add_argument("--out", type=Path, default=Path("bench_out"),
                       help="output folder: episodes, summaries, report.html (default bench_out)")
    bench.add_argument("--max-new-tokens", type=int, default=1024,
                       help="tokens per agent reply (default 1024)")
    bench.add_argument("--temperature", type=float, default=0.7,
                       help="sampling temperature (default 0.7)")
    bench.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling p (default 0.95)")
    bench.add_argument("--seed", type=int, default=0, help="sampling and evaluation seed (default 0)")
    bench.add_argument("--workers", type=int, default=None, help="evaluation slots (default: two per GPU, one without a GPU)")
    bench.add_argument("--no-benchmark", action="store_true", help="skip timing (correctness only)")
    bench.add_argument("--no-compile-baseline", action="store_true", help="skip the torch.compile baseline")
    bench.add_argument("--profile-feedback", action="store_true",
                       help="the Tester's report on a verified kernel adds its Nsight Compute "
                            "figures (needs ncu and a GPU; seconds per kernel)")
    bench.add_argument("--concurrency", type=int, default=64, metavar="N",
                       help="episodes in flight at once, across problems (default 64)")
    bench.add_argument("--batch-size", type=int, default=32, metavar="N",
                       help="replies decoded together, across problems (default 32; compiled "
                            "decoding decodes at most 16 at once)")
    bench.add_argument("--resume", action="store_true",
                       help="continue the run in --out: keep its finished episodes, run the "
                            "rest (the settings must be the same)")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_ray_argument(bench)
    bench.add_argument("--compare", nargs="+", type=Path, default=None, metavar="RUN_DIR",
                       help="run nothing: print train runs' held-out figures side by side (a "
                            "train --seeds folder's seeds.json, mean +- std over seeds, or a "
                            "single run's eval_results.json)")
    bench.set_defaults(handler=run_bench)

    report = subparsers.add_parser(
        "report", help="HTML report from a training run and/or bench / eval-dir JSONL outputs")
    report.add_argument("run_dir", type=Path, nargs="?", default=None,
                        help="training run folder (metrics.jsonl / TensorBoard) or a bench --out folder")
    report.add_argument("--bench", action="append", default=[], type=Path, metavar="JSONL",
                        help="episodes JSONL (bench) or EvalResult JSONL (eval-dir); repeatable")
    report.add_argument("--label", action="append", default=[],
                        help="label per --bench file, in order (default: derived from the path)")
    report.add_argument("--problems", default=None, metavar="SPEC",
                        help="problem spec to read tiers from (for eval-dir results, which lack them)")
    report.add_argument("--out", type=Path, default=None,
                        help="output folder for report.html, summary.json and plots (default: "
                             "RUN_DIR, else ./report)")
    report.add_argument("--title", default="MultiMindDev report", help="the report's title")
    report.set_defaults(handler=run_report)


# --------------------------------------------------------------------------- bench


def run_bench(args: argparse.Namespace) -> int:
    if args.compare is not None:
        return run_compare(args.compare)

    try:
        if min(args.samples, args.turns, args.concurrency, args.batch_size) < 1:
            raise ValueError("--samples, --turns, --concurrency and --batch-size must be >= 1")
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is a file; give a folder")

        adapters = [a for a in args.adapters if str(a).lower() != "none"]
        for folder in adapters:
            if (problem := dir_problem(folder, "checkpoint folder")) is not None:
                raise ValueError(f"--adapters {problem}")
        shipped = (shipped_agents() if not args.adapters and not args.model else None)
        runs = policy_runs(args.model, adapters, shipped)
        for cfg in runs.values():  # every model is checked before the first one loads
            resolve_model_source(cfg.model)
        problems = _load_problems(args.problems, args.limit)
        # agents trained on prompts with the element-type line get it at inference too
        episode_cfg = _episode_config(args, element_type=shipped is not None
                                      and shipped.element_type_line)
        eval_cfg = _eval_config(args)
        resumed = check_run_record(args.out / RUN_RECORD_FILE,
                                   run_record(args, runs, problems, episode_cfg),
                                   resume=args.resume)
    except PolicyError as exc:  # a model not to be had, as optimize and train say it
        return fail(" ".join(str(exc).split()), ExitCode.UNAVAILABLE)
    except (ProblemError, ValueError, RuntimeError) as exc:  # ResumeMismatch too
        return fail(" ".join(str(exc).split()))
    if args.resume and not resumed:
        warn(f"--resume: {args.out} holds no bench run record; starting afresh")
    print(f"bench: {len(problems)} problems x {args.samples} samples x {len(runs)} runs "
          f"({', '.join(runs)}), up to {args.turns} turns each", file=sys.stderr)
    try:
        episodes = bench_policies(runs, problems, episode_config=episode_cfg, eval_config=eval_cfg,
                                  group_size=args.samples, out_dir=args.out,
                                  progress=not args.quiet, ray_address=args.ray,
                                  concurrency=args.concurrency, batch_size=args.batch_size,
                                  resume=resumed)
    except (PolicyError, RayUnavailableError) as exc:  # a model or cluster not to be had
        return fail(" ".join(str(exc).split()), ExitCode.UNAVAILABLE)

    path = write_report(args.out, bench_runs=episodes, title=f"bench: {args.problems}")
    summary = json.loads((args.out / "summary.json").read_text())["labels"]
    print_summary(summary)
    print(f"report: {path}")
    return 0


def run_compare(run_dirs: Sequence[Path]) -> int:
    """``bench --compare``: each run's figures (``seeds.run_figures``), one table on stdout."""
    runs: dict[str, Any] = {}
    for run_dir in run_dirs:
        if (problem := dir_problem(run_dir, "train run folder")) is not None:
            return fail(f"--compare {problem}")
        try:
            table = run_figures(run_dir)
        except ValueError as exc:
            return fail(f"--compare {' '.join(str(exc).split())}")
        runs[_unique(runs, run_dir.resolve().name or str(run_dir))] = table
    print(compare_table(runs))
    return 0


SHIPPED_LABEL = "shipped"


def policy_runs(models: Sequence[str], adapters: Sequence[Path],
                shipped: Any = None) -> dict[str, Any]:
    """{label: PolicyConfig}: one per --model, then one per --adapters dir on the first model.
    With neither, the ``shipped`` agents (``agents.shipped.ShippedAgents``) on their model where
    the package ships them, else the default model alone."""
    runs: dict[str, Any] = {}
    if not models and not adapters and shipped is not None:
        return {SHIPPED_LABEL: PolicyConfig(model=shipped.model,
                                            adapter_paths=shipped.adapter_paths())}
    base = models[0] if models else "default"
    for m in models or ([] if adapters else ["default"]):
        runs[_unique(runs, _label(m))] = PolicyConfig(model=m)
    for a in adapters:
        try:
            paths = adapter_paths_in(a)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        # A role without an adapter in the checkpoint gets a fresh (identity) one: the base model.
        runs[_unique(runs, _label(str(a)))] = PolicyConfig(model=base, adapter_paths=paths)
    return runs


def bench_policies(
    runs: Mapping[str, Any],
    problems: Sequence[Any],
    *,
    episode_config: Any,
    eval_config: Any,
    group_size: int,
    out_dir: Path,
    progress: bool = False,
    ray_address: str | None = None,
    concurrency: int = 64,
    batch_size: int = 32,
    resume: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Run episodes for each policy config, one model in memory at a time; each episode is
    appended to ``out_dir/<label>/episodes.jsonl`` as it ends (``train.episode_log``).

    Returns {label: episode dicts}, problem by problem and sample by sample, read back from the
    files. One evaluator serves every run (its baselines are cached). ``resume``: the episodes
    already in the files are kept and not run again (a label with all of them loads no model).
    ``progress``: lines on stderr per generation batch, per evaluated candidate and per episode
    (done/total, rate, ETA). ``ray_address``: evaluate on that Ray cluster. ``batch_size``:
    replies decoded together (``HFGenerationBackend.max_batch_size``).
    """
    out: dict[str, list[dict[str, Any]]] = {}
    with make_evaluator(eval_config, ray_address) as evaluator:
        for label, policy_cfg in runs.items():
            path = Path(out_dir) / _slug(label) / "episodes.jsonl"
            logged = read_episode_log(path) if resume else LoggedEpisodes()
            if logged.dropped_lines:
                warn(describe_dropped(path, logged))
            finished = logged.finished()
            total = len(problems) * group_size
            done = sum((p.name, s) in finished for p in problems for s in range(group_size))
            if resume:
                print(f"[{label}] resuming: {done} of {total} episodes on disk", file=sys.stderr)
            episode_log = EpisodeLog(path, fresh=not resume)
            if done < total:
                _run_label(label, policy_cfg, problems, evaluator, episode_log,
                           episode_config=episode_config, group_size=group_size,
                           concurrency=concurrency, batch_size=batch_size, skip=finished,
                           progress=ProgressLine(total, label=label, done=done)
                           if progress else None)
            out[label] = _ordered(read_episode_log(path).rows, problems, group_size)
    for label, eps in out.items():
        summary = summarize_label(normalise_samples(eps))
        write_atomic(Path(out_dir) / _slug(label) / "summary.json", json.dumps(summary, indent=2))
    return out


def _run_label(label: str, policy_cfg: Any, problems: Sequence[Any], evaluator: Any,
               episode_log: EpisodeLog, *, episode_config: Any, group_size: int,
               concurrency: int, batch_size: int, skip: set[tuple[str, int]],
               progress: ProgressLine | None) -> None:
    """The missing episodes of one run, each appended to ``episode_log`` as it ends."""
    # the baselines are measured while the model loads, and before any decoding
    _prefetch_baselines(evaluator, problems, wait=False)
    print(f"[{label}] loading {policy_cfg.model}", file=sys.stderr)
    policy = load_policy(policy_cfg)
    _prefetch_baselines(evaluator, problems, wait=True)
    hf = HFGenerationBackend(policy, max_batch_size=batch_size)
    backend: Any = hf
    judge: Any = evaluator
    if progress is not None:
        backend = ProgressBackend(hf, label=label)
        judge = ProgressEvaluator(evaluator, label=label)

    def record(episode: Any, sample: int) -> None:
        episode_log.append(episode_record(episode, sample))
        if progress is not None:
            progress(episode, sample)

    start = time.perf_counter()
    stream_episodes(problems, BatchingBackend(backend, max_rows=hf.max_batch_size), judge,
                    episode_config, samples=group_size, concurrency=concurrency, skip=skip,
                    on_episode=record)
    print(f"[{label}] {episode_log.appended} episodes in {time.perf_counter() - start:.0f} s",
          file=sys.stderr)
    del policy, hf, backend
    _free_memory()


def _prefetch_baselines(evaluator: Any, problems: Sequence[Any], *, wait: bool) -> None:
    """Have the evaluator measure the problems' baselines (``Evaluator.prefetch_baselines``;
    a Ray evaluator measures them with the first candidates); ``wait``: until they are done,
    so that no baseline is timed while the model decodes on the same GPU."""
    prefetch = getattr(evaluator, "prefetch_baselines", None)
    if prefetch is None:
        return
    scheduled = prefetch(list(problems), wait=wait)
    if scheduled and not wait:
        print(f"bench: measuring the baselines of {scheduled} problems while the model loads",
              file=sys.stderr)


def _ordered(rows: Sequence[dict[str, Any]], problems: Sequence[Any],
             group_size: int) -> list[dict[str, Any]]:
    """The logged episodes of ``problems`` x ``group_size`` samples, problem by problem (the
    order of an uninterrupted run's report), each pair once (the last line wins)."""
    by_key = {episode_key(row): row for row in rows}
    return [by_key[(p.name, s)] for p in problems for s in range(group_size)
            if (p.name, s) in by_key]


def run_record(args: argparse.Namespace, runs: Mapping[str, Any], problems: Sequence[Any],
               episode_config: Any) -> dict[str, Any]:
    """The settings that decide a bench run's episodes (``--resume`` must match them)."""
    sampling = episode_config.sampling
    return {
        "runs": {label: {"model": str(cfg.model),
                         "adapters": {str(k): str(v) for k, v in
                                      sorted((cfg.adapter_paths or {}).items())}}
                 for label, cfg in runs.items()},
        "problems": [p.name for p in problems],
        "samples": args.samples,
        "turns": episode_config.max_turns,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_new_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        "element_type": episode_config.element_type,
        "profile_feedback": episode_config.profiler_feedback,
        "benchmark": not args.no_benchmark,
        "compile_baseline": not args.no_compile_baseline,
    }


def _load_problems(spec: str, limit: int | None) -> list[Any]:
    problems = load_problems(spec)
    if limit is not None:
        if limit < 1:
            raise ValueError("--limit must be >= 1")
        problems = problems[:limit]
    return problems


def _episode_config(args: argparse.Namespace, element_type: bool = False) -> Any:
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
    return EpisodeConfig(max_turns=args.turns, sampling=sampling, reward=RewardConfig(),
                         element_type=element_type,
                         profiler_feedback=args.profile_feedback)


def _eval_config(args: argparse.Namespace) -> Any:
    return EvalConfig(num_workers=args.workers, benchmark=not args.no_benchmark,
                      compile_baseline=not args.no_compile_baseline)


def _free_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _label(text: str) -> str:
    path = Path(text)
    parts = [p for p in path.parts if p not in ("/", ".", "..")]
    return "/".join(parts[-2:]) if len(parts) > 1 and path.exists() else (parts[-1] if parts else text)


def _unique(existing: Mapping[str, Any], label: str) -> str:
    out, i = label, 2
    while out in existing:
        out, i = f"{label}#{i}", i + 1
    return out


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def print_summary(summaries: Mapping[str, Mapping[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def x(v: Any) -> str:
        return "-" if v is None else f"{v:.3g}x"

    table = Table(title="bench summary (per episode, best attempt)")
    table.add_column("metric")
    for label in summaries:
        table.add_column(label, justify="right")
    rows = [
        ("episodes", lambda s: str(s.get("episodes", s["n"]))),
        ("mean episode reward", lambda s: "-" if s.get("reward_mean") is None else f"{s['reward_mean']:.3f}"),
        ("compile rate", lambda s: pct(s["compile_rate"])),
        ("correct", lambda s: pct(s["correct_rate"])),
        ("fast_1", lambda s: pct(s["fast_p"].get("1"))),
        ("fast_2", lambda s: pct(s["fast_p"].get("2"))),
        ("geomean vs eager", lambda s: x(s["geomean_speedup_vs_eager"])),
        ("geomean vs torch.compile", lambda s: x(s["geomean_speedup_vs_compile"])),
        ("rejected (hacks)", lambda s: pct(s["rejected_rate"])),
        ("no GPU (compile only)", lambda s: pct(s["no_gpu_rate"])),
        ("no candidate (format)", lambda s: pct(s.get("format_failure_rate"))),
        ("measured on", lambda s: ", ".join(s["devices"]) or "-"),
    ]
    for name, get in rows:
        table.add_row(name, *(get(s) for s in summaries.values()))
    Console().print(table)


# --------------------------------------------------------------------------- report


def run_report(args: argparse.Namespace) -> int:
    if args.label and len(args.label) != len(args.bench):
        return fail("give one --label per --bench file (or none)")
    bench_files = list(zip(args.label or [None] * len(args.bench), args.bench))
    training_run = None
    if args.run_dir is not None:
        if (problem := dir_problem(args.run_dir, "training run or bench --out folder")) is not None:
            return fail(problem)
        bench_files += [(None, p) for p in sorted(args.run_dir.glob("*/episodes.jsonl"))]
        final_eval = args.run_dir / "eval_episodes.jsonl"  # the train pipeline's held-out eval
        if final_eval.is_file():
            bench_files.append((f"{args.run_dir.resolve().name} (held-out eval)", final_eval))
        if _has_training_metrics(args.run_dir):
            training_run = args.run_dir
    out = args.out or args.run_dir or Path("report")
    if out.exists() and not out.is_dir():
        return fail(f"--out {out} is a file; give a folder for report.html and its plots")
    try:
        runs = read_bench_files(bench_files)
    except InputError as exc:
        return fail(str(exc))
    if not runs and training_run is None:
        return fail("nothing to report: give a training run folder (metrics.jsonl or TensorBoard "
                    "events), a bench --out folder, or --bench JSONL files")
    try:
        tiers = {p.name: p.tier for p in _load_problems(args.problems, None)} if args.problems else None
    except ValueError as exc:  # ProblemError is a ValueError
        return fail(" ".join(str(exc).split()))
    path = write_report(out, bench_runs=runs, training_run=training_run, tiers=tiers,
                        title=args.title)
    if runs:
        print_summary(json.loads((out / "summary.json").read_text())["labels"])
    print(f"report: {path}")
    return 0


def read_bench_files(files: Sequence[tuple[str | None, Path]]) -> dict[str, list[dict[str, Any]]]:
    """{label: rows} from (label or None, JSONL path) pairs. Lines that are not JSON objects are
    skipped with a warning on stderr that counts them; a file with none at all is an InputError
    (it is not a bench or eval-dir output)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for label, path in files:
        if (problem := file_problem(path, "JSONL file")) is not None:
            raise InputError(problem)
        read = read_jsonl_rows(path)
        rows, foreign = [], 0
        for row in read.rows:
            if _is_report_sample(row):
                rows.append(row)
            else:
                foreign += 1
        if not rows:
            raise InputError(f"{path} holds no episodes or EvalResults: give an episodes JSONL "
                             "(bench --out DIR/<label>/episodes.jsonl) or an EvalResult JSONL "
                             "(eval-dir --out)")
        if read.bad_lines:
            warn(describe_bad_lines(path, read.bad_lines))
        if foreign:
            warn(f"{path}: skipped {foreign} JSON object(s) that are neither an episode nor an "
                 "EvalResult")
        runs[_unique(runs, label or _file_label(path))] = rows
    return runs


def _is_report_sample(row: dict[str, Any]) -> bool:
    try:
        normalise_samples([row])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _has_training_metrics(run_dir: Path) -> bool:
    return any(run_dir.rglob("metrics.jsonl")) or any(run_dir.rglob("events.out.tfevents.*"))


def _file_label(path: Path) -> str:
    # bench writes <label>/episodes.jsonl: the folder names the run; otherwise the file stem.
    return path.parent.name if path.stem == "episodes" else path.stem
