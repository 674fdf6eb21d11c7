"""Re-measure a learning run's correct held-out kernels on a quiet GPU, so stages compare fairly.

    python3 benchmarks/rescore_heldout.py DIR [--seeds 0 1 2] [--repeats 2] [--workers 1]
    python3 benchmarks/rescore_heldout.py DIR --write-slim SLIM_DIR   # a small copy to move

DIR is bench_learning's --output-dir. Why: bench_learning runs its seeds at once on one GPU, so
each stage's held-out evaluation times its kernels at another moment, while the other seeds
train or decode. Most timings hold up: in one learning run, of 210 turns whose kernel SFT's
and GRPO's evaluations both got correct with the same source, 6 differed by more than 5% (all
slow reduction kernels, e.g. cumsum 0.127x then 0.101x of eager, row_l2_norm 0.014x then 0.007x).
Re-timing every stage's kernels in one process makes the comparison paired: the same kernel
scores the same in every stage, and only what the policy changed remains.

What it does: every distinct (problem, kernel source) that some stage's held-out episode got
correct is evaluated again, ``--repeats`` times, in one process, in a shuffled order (no stage is
timed systematically earlier or later), one candidate at a time by default. Each such turn then
takes the median-speedup re-measurement, so the same kernel scores the same in every stage;
failing turns keep their recorded result (compiling and checking do not depend on the GPU's
load). Stages are scored as bench_learning scores them and compared with SFT per seed.
Measurements are appended to ``DIR/rescore_measurements.jsonl`` as they arrive: a run cut short
resumes, and aggregates whatever it has (a kernel never re-measured keeps its recorded result,
and the report counts those). Outputs ``DIR/rescored.json`` and ``DIR/rescored.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_rows  # a sibling script, not a package

MEASUREMENTS = "rescore_measurements.jsonl"
Key = tuple[str, str]  # (problem name, kernel source)


def stage_files(output_dir: Path, seeds: Iterable[int]) -> dict[tuple[int, str], Path]:
    """(seed, stage) -> that seed's episodes_<stage>.jsonl, for every held-out stage found.
    The train_* stages (bench_learning's --train-eval-problems) are training problems: not
    re-measured here."""
    found = {}
    for seed in seeds:
        for path in sorted((output_dir / f"seed{seed}").glob("episodes_*.jsonl")):
            stage = path.stem.removeprefix("episodes_")
            if not stage.startswith("train_"):
                found[(seed, stage)] = path
    return found


# What a rescoring needs of an episode is its problem and each turn's kernel and result; the
# tokens, log-probs and chat messages are most of a file's size.
SLIM_DROPPED = ("prompt_ids", "response_ids", "logprobs", "messages", "text")


def write_slim_copy(output_dir: Path, seeds: Iterable[int], dest: Path) -> int:
    """Copy the held-out episode files (and note.txt) to ``dest`` without what rescoring does
    not read: small enough to copy to a GPU machine. Returns the number of files written."""
    files = stage_files(output_dir, seeds)
    for (seed, _), path in files.items():
        lines = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            episode = json.loads(line)
            for turn in episode.get("turns", []):
                for key in SLIM_DROPPED:
                    turn.pop(key, None)
            lines.append(json.dumps(episode))
        target = dest / f"seed{seed}" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + "\n")
    note = output_dir / "note.txt"
    if note.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "note.txt").write_text(note.read_text())
    return len(files)


def correct_kernels(episodes: Iterable[Any]) -> dict[Key, Any]:
    """Every distinct (problem name, source) a turn got correct -> its problem."""
    out: dict[Key, Any] = {}
    for episode in episodes:
        for turn in episode.turns:
            if turn.eval_result is not None and turn.eval_result.correct and turn.candidate_source:
                out.setdefault((episode.problem.name, turn.candidate_source), episode.problem)
    return out


def usable(results: list[Any]) -> list[Any]:
    """Re-measurements that say something about the kernel: not our infrastructure's failures."""
    from multiminddev.env.results import EvalStatus

    return [r for r in results if r.status is not EvalStatus.INFRA_ERROR]


def median_result(results: list[Any]) -> Any:
    """The re-measurement to score with: a failed one if any failed (a kernel that fails once
    is not reliably correct), else the one with the median speedup (the lower middle one)."""
    failed = [r for r in results if not r.correct]
    if failed:
        return failed[0]
    return sorted(results, key=lambda r: r.speedup)[(len(results) - 1) // 2]


def rescore_episode(episode: Any, measured: dict[Key, list[Any]]) -> tuple[Any, int]:
    """The episode with each correct turn's result replaced by its re-measurement (the episode
    itself is changed). Returns it and how many correct turns had none to take."""
    missing = 0
    for turn in episode.turns:
        if turn.eval_result is None or not turn.eval_result.correct:
            continue
        results = usable(measured.get((episode.problem.name, turn.candidate_source or ""), []))
        if results:
            turn.eval_result = median_result(results)
        else:
            missing += 1
    return episode, missing


def measurement_order(keys: list[Key], repeats: int, seed: int) -> list[Key]:
    """Each key ``repeats`` times: round by round, each round shuffled."""
    rng = random.Random(seed)
    order = []
    for _ in range(repeats):
        round_keys = list(keys)
        rng.shuffle(round_keys)
        order += round_keys
    return order


def read_measurements(path: Path) -> dict[Key, list[Any]]:
    from multiminddev.env.results import EvalResult

    out: dict[Key, list[Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a kill
                continue
            out.setdefault((rec["problem"], rec["source"]), []).append(
                EvalResult.from_dict(rec["result"]))
    return out


def measure(todo: list[Key], problems: dict[Key, Any], path: Path,
            evaluate: Callable[[Any, str], Any], progress: Callable[[int, int], None]) -> None:
    """Evaluate each key of ``todo`` in order, appending each result to ``path`` at once."""
    with path.open("a", encoding="utf-8") as f:
        for done, key in enumerate(todo, 1):
            result = evaluate(problems[key], key[1])
            f.write(json.dumps({"problem": key[0], "source": key[1],
                                "result": result.to_dict()}) + "\n")
            f.flush()
            progress(done, len(todo))


def speed_spread(measured: dict[Key, list[Any]]) -> dict[str, Any]:
    """How far repeated quiet measurements of one kernel differ: max/min speedup per kernel."""
    ratios = [max(r.speedup for r in rs) / min(r.speedup for r in rs)
              for rs in measured.values()
              if len(rs) > 1 and all(r.correct and r.speedup > 0 for r in rs)]
    if not ratios:
        return {"kernels": 0}
    return {"kernels": len(ratios), "median_max_over_min": statistics.median(ratios),
            "worst_max_over_min": max(ratios)}


def rescore(output_dir: Path, seeds: list[int], measured: dict[Key, list[Any]]) -> dict[str, Any]:
    """Rescored rows per seed and stage, bench_learning's summary of them against SFT."""
    from multiminddev.episode.state import read_episodes_jsonl
    from multiminddev.train.grpo import GRPOConfig

    cfg = GRPOConfig()  # bench_learning's held-out scoring: the default reward, no repeat penalty
    per_seed: dict[int, dict[str, Any]] = {s: {"seed": s, "rows": {}} for s in seeds}
    missing, changed = 0, 0
    for (seed, stage), path in stage_files(output_dir, seeds).items():
        episodes = read_episodes_jsonl(path)
        before = [t.eval_result.correct for e in episodes for t in e.turns if t.eval_result]
        rescored = []
        for episode in episodes:
            episode, n = rescore_episode(episode, measured)
            rescored.append(episode)
            missing += n
        after = [t.eval_result.correct for e in rescored for t in e.turns if t.eval_result]
        changed += sum(b != a for b, a in zip(before, after))
        per_seed[seed]["rows"][stage] = learning_rows.stage_rows(rescored, cfg)
    seeds_with_sft = [per_seed[s] for s in seeds if "sft" in per_seed[s]["rows"]]
    summary = learning_rows.aggregate_partial(seeds_with_sft, compile_only=False)
    return {"summary": summary, "per_seed": {s: per_seed[s]["rows"] for s in seeds},
            "turns_not_remeasured": missing, "turns_no_longer_correct": changed,
            "speed_spread": speed_spread(measured)}


def markdown(result: dict[str, Any], note: str) -> str:
    summary = result["summary"]
    metrics = learning_rows.METRICS
    lines = [f"Re-measured: {note}", "", "| stage | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    for stage in summary["stages"]:
        lines.append(f"| {stage} | " + " | ".join(
            f"{summary[f'{stage}/{m}']['mean']:.3f} ± {summary[f'{stage}/{m}']['std']:.3f}"
            for m in metrics) + " |")
    lines += ["", "mean ± std over seeds; correct kernels re-timed in one process (counts below)", ""]
    for key, g in summary.items():
        if key.startswith("gain/"):
            lines.append(f"- {key.removeprefix('gain/')} minus SFT: {g['mean']:+.3f} (std "
                         f"{g['std']:.3f}); per seed {[round(x, 3) for x in g['per_seed']]}")
    spread = result["speed_spread"]
    lines += [("- correct turns with no re-measurement (kept as recorded): "
               f"{result['turns_not_remeasured']}"),
              ("- turns correct when recorded, failing when re-measured: "
               f"{result['turns_no_longer_correct']}")]
    if spread.get("kernels"):
        lines.append(f"- repeated quiet measurements of one kernel, max/min speedup: median "
                     f"{spread['median_max_over_min']:.3f}, worst "
                     f"{spread['worst_max_over_min']:.3f} over {spread['kernels']} kernels")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output_dir", type=Path, help="bench_learning's --output-dir")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=2, help="measurements per kernel (median kept)")
    p.add_argument("--workers", type=int, default=1,
                   help="evaluation slots; 1 keeps candidates from timing each other")
    p.add_argument("--order-seed", type=int, default=0)
    p.add_argument("--aggregate-only", action="store_true",
                   help="no GPU: score with the measurements already in the file")
    p.add_argument("--write-slim", type=Path, metavar="DEST",
                   help="only copy the episode files, without tokens and messages, to DEST "
                        "(to copy them to a GPU machine), then stop")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.workers < 1:
        p.error("--repeats and --workers must be >= 1")
    from multiminddev.episode.state import read_episodes_jsonl

    if args.write_slim is not None:
        n = write_slim_copy(args.output_dir, args.seeds, args.write_slim)
        print(f"{n} episode files copied to {args.write_slim}")
        return 0 if n else 2
    files = stage_files(args.output_dir, args.seeds)
    if not files:
        print(f"no seed<k>/episodes_<stage>.jsonl under {args.output_dir} for seeds {args.seeds}",
              file=sys.stderr)
        return 2
    problems: dict[Key, Any] = {}
    for path in files.values():
        for key, problem in correct_kernels(read_episodes_jsonl(path)).items():
            problems.setdefault(key, problem)
    path = args.output_dir / MEASUREMENTS
    measured = read_measurements(path)
    todo = measurement_order(sorted(problems), args.repeats, args.order_seed)
    seen: dict[Key, int] = {k: len(v) for k, v in measured.items()}
    remaining = []
    for key in todo:  # what an earlier, cut-short run measured counts toward the repeats
        if seen.get(key, 0) > 0:
            seen[key] -= 1
        else:
            remaining.append(key)
    print(f"{len(problems)} distinct correct kernels over {len(files)} stage files; "
          f"{len(remaining)} measurements to take", flush=True)
    if remaining and not args.aggregate_only:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA GPU: re-measuring needs one (use --aggregate-only to score what "
                  f"{path.name} holds)", file=sys.stderr)
            return 3
        from multiminddev.env import Evaluator

        start = time.perf_counter()

        def progress(done: int, total: int) -> None:
            if done % 10 == 0 or done == total:
                print(f"  {done}/{total} measured, {time.perf_counter() - start:.0f} s", flush=True)

        with Evaluator(learning_rows.heldout_eval_config(args.workers)) as evaluator:
            measure(remaining, problems, path, evaluator.evaluate, progress)
        measured = read_measurements(path)
    result = rescore(args.output_dir, args.seeds, measured)
    note_path = args.output_dir / "note.txt"
    note = (note_path.read_text().strip() if note_path.is_file() else str(args.output_dir))
    note += f"; seeds {args.seeds}; up to {args.repeats} measurements per kernel, {args.workers} slot(s)"
    (args.output_dir / "rescored.json").write_text(json.dumps({"note": note, **result}, indent=2))
    text = markdown(result, note)
    (args.output_dir / "rescored.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
