"""What GRPO's advantages rewarded, from a learning run's rollout files.

    python3 benchmarks/analyze_rollouts.py DIR [--seeds 0 1 2] [--sft-problems SPEC]

DIR is bench_learning's --output-dir; each seed<k>/episodes.jsonl holds that seed's GRPO
rollouts with their advantages. Two tables:
- per kernel template (the first ``__global__`` function's name in the Generator's reply): how
  many Generator turns used it and the sum of their advantages. A template with a large positive
  sum is being made more likely *on every prompt*, to the extent the model does not tell the
  prompts apart. Example: the row-reduction template gained +5 to +8 per seed, and after GRPO
  the held-out elu and leaky_relu got it;
- with --sft-problems: correctness and groups with mixed outcomes on prompts SFT trained on
  versus new ones.
Then, from the held-out files seed<k>/episodes_<stage>.jsonl (``--stages``; the select@ stages
too), Generator kernels whose precision is not the problem's (float for float16, __half for
float32), those written on another family's template, and what the Optimizer's turn did to
the Generator's kernel (fixed, broke, faster, slower...). Example: after SFT the Optimizer made
19-21 of ~24 correct kernels per seed faster (0.61x of eager to 0.97x, typically) and fixed none
of the failing ones; GRPO on the Optimizer kept that on two seeds and broke it on the third.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_rows import rows_by_problem, turn_status  # a sibling script, not a package

_KERNEL_RE = re.compile(r"__global__\s+void\s+(\w+)")


def kernel_template(source: str | None) -> str:
    """The first kernel's name, "no_reply" without a candidate, "no_kernel" without one."""
    if not source:
        return "no_reply"
    m = _KERNEL_RE.search(source)
    return m.group(1) if m else "no_kernel"


_SIGNATURE_RE = re.compile(r"__global__\s+void\s+\w+\s*\(([^)]*)\)")
_HALF_RE = re.compile(r"\b(?:__half2?|half|__nv_bfloat16|__half2float|__float2half)\b")


def kernel_precision(source: str | None) -> str:
    """"half" when the first kernel's parameters include a 16-bit float pointer, "float" when
    they hold float pointers and no 16-bit ones, "" otherwise (no kernel, integer-only)."""
    match = _SIGNATURE_RE.search(source or "")
    if not match:
        return ""
    if _HALF_RE.search(match.group(1)):
        return "half"
    return "float" if re.search(r"\bfloat\b", match.group(1)) else ""


def dtype_mismatches(episodes: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Generator replies whose kernel does not match the problem's dtype: (mismatched, of the
    problems of that dtype with a kernel). A float16 problem's kernel mismatches when it takes
    float pointers (a runtime error: GRPO without the element-type line lost fp16 problems so);
    a float32 problem's when it uses 16-bit floats anywhere, which the static checks reject
    (one seed lost six float32 problems so)."""
    counts = {"float16 with float kernels": [0, 0], "float32 with 16-bit floats": [0, 0]}
    for episode in episodes:
        turns = episode.get("turns") or []
        source = (turns[0].get("candidate_source") if turns else None) or ""
        dtype = episode["problem"].get("dtype")
        if not _SIGNATURE_RE.search(source) or dtype not in ("float16", "float32"):
            continue
        if dtype == "float16":
            key, wrong = "float16 with float kernels", kernel_precision(source) == "float"
        else:
            key, wrong = "float32 with 16-bit floats", bool(_HALF_RE.search(source))
        counts[key][0] += wrong
        counts[key][1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def template_drift(episodes: list[dict[str, Any]],
                   family_templates: dict[str, str]) -> tuple[list[tuple[str, str]], int]:
    """Generator kernels written on another family's template: ((problem, template) for each,
    the number of Generator kernels of known families). A template is the first kernel's name;
    ``family_templates`` maps each family to its naive reference's (``reference_templates``),
    and a kernel counts when its template is some other family's. Example: at GRPO step 12 the
    Generator wrote the element-wise ``unary_naive`` kernel for ``matvec_2168x4923`` on every seed, after ``unary_naive`` had collected about half of the
    rollouts and the largest positive advantages."""
    known = set(family_templates.values())
    drifted, total = [], 0
    for e in episodes:
        turns = e.get("turns") or []
        family = e["problem"].get("family", "")
        if not turns or family not in family_templates or not turns[0].get("candidate_source"):
            continue
        total += 1
        template = kernel_template(turns[0]["candidate_source"])
        if template in known and template != family_templates[family]:
            drifted.append((e["problem"]["name"], template))
    return drifted, total


@functools.cache
def reference_templates() -> dict[str, str]:
    """family -> the first kernel's name in its naive reference solution (the built-in corpus,
    and the breadth and practice families, so that rollouts on practice families count too)."""
    from multiminddev.tasks.builtin import reference_solution
    from multiminddev.tasks.loaders import load_problems

    out: dict[str, str] = {}
    for p in load_problems("builtin:allshapes+builtin:breadth:shapes1+builtin:practice:shapes1"):
        if p.family not in out and (source := reference_solution(p, variant="naive")):
            out[p.family] = kernel_template(source)
    return out


def template_credit(episodes: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """template -> (Generator turns that used it, sum of their advantages)."""
    count: collections.Counter[str] = collections.Counter()
    credit: dict[str, float] = collections.defaultdict(float)
    for e in episodes:
        turn = e["turns"][0]
        breakdown = turn.get("reward_breakdown") or {}
        if "advantage" not in breakdown:
            continue
        name = kernel_template(turn.get("candidate_source"))
        count[name] += 1
        credit[name] += breakdown["advantage"]
    return {k: (count[k], credit[k]) for k in sorted(count, key=lambda k: -count[k])}


def template_credit_by_tier(episodes: list[dict[str, Any]], family_templates: dict[str, str],
                            ) -> dict[tuple[int, str], tuple[int, float]]:
    """(problem tier, kind of Generator kernel) -> (turns, sum of their advantages). The kind is
    "own template" (its family's naive reference's kernel name), "another family's",
    "a name of its own" or "no kernel". Example: on tier-1 problems the
    own templates got positive sums and the others negative on every seed, while the Generator
    still moved tier-1 problems onto the element-wise template."""
    known = set(family_templates.values())
    count: collections.Counter[tuple[int, str]] = collections.Counter()
    credit: dict[tuple[int, str], float] = collections.defaultdict(float)
    for e in episodes:
        turn = (e.get("turns") or [{}])[0]
        breakdown = turn.get("reward_breakdown") or {}
        family = e["problem"].get("family", "")
        if "advantage" not in breakdown or family not in family_templates:
            continue
        template = kernel_template(turn.get("candidate_source"))
        if template == family_templates[family]:
            kind = "own template"
        elif template in known:
            kind = "another family's"
        elif template in ("no_reply", "no_kernel"):
            kind = "no kernel"
        else:
            kind = "a name of its own"
        key = (int(e["problem"].get("tier", 0)), kind)
        count[key] += 1
        credit[key] += breakdown["advantage"]
    return {k: (count[k], credit[k]) for k in sorted(count)}


def family_signal(episodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """family -> Generator turns, their pass rate, GRPO groups and the groups whose turns differ
    in correctness (mixed: the only ones with a pass/fail signal), sorted by pass rate. What
    ``--family-sampling signal`` weighs: in one uniform run, families at pass rate 0.92-1.00
    took 28% of the episodes and 10 of their 61 groups were mixed."""
    turns: dict[str, list[bool]] = collections.defaultdict(list)
    groups: dict[tuple[str, str, Any], list[bool]] = collections.defaultdict(list)
    for e in episodes:
        family = e["problem"].get("family") or e["problem"]["name"]
        ok = turn_status((e.get("turns") or [{}])[0]) == "ok"
        turns[family].append(ok)
        groups[(family, e["problem"]["name"], e.get("group"))].append(ok)
    out = {}
    for family, oks in turns.items():
        gs = [v for (f, *_), v in groups.items() if f == family]
        out[family] = {"episodes": len(oks), "pass_rate": sum(oks) / len(oks),
                       "groups": len(gs), "mixed": sum(len(set(v)) > 1 for v in gs)}
    return dict(sorted(out.items(), key=lambda kv: (kv[1]["pass_rate"], kv[0])))


def family_counts(episodes: list[dict[str, Any]]) -> dict[str, list[int]]:
    """family -> [episodes with a correct turn, episodes]: what GRPO's curriculum records of
    each episode (its best turn), pooled; the file ``--family-counts-out`` writes, which
    the ``family_warm_start`` setting starts the family windows from."""
    counts: dict[str, list[int]] = {}
    for e in episodes:
        family = e["problem"].get("family") or e["problem"]["name"]
        row = counts.setdefault(family, [0, 0])
        row[0] += any(turn_status(t) == "ok" for t in e.get("turns") or [])
        row[1] += 1
    return dict(sorted(counts.items()))


def seen_versus_new(episodes: list[dict[str, Any]], sft_names: set[str]) -> dict[str, dict[str, float]]:
    """For prompts in / not in SFT's problems: episodes, share correct (any turn), groups, and
    share of groups whose Generator turns differ in correctness (where GRPO has a signal)."""
    out: dict[str, dict[str, float]] = {}
    groups: dict[tuple[str, str, Any], list[bool]] = collections.defaultdict(list)
    correct: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    for e in episodes:
        kind = "sft_prompts" if e["problem"]["name"] in sft_names else "new_prompts"
        statuses = [(t.get("eval_result") or {}).get("status") for t in e["turns"]]
        total[kind] += 1
        correct[kind] += "ok" in statuses
        groups[(kind, e["problem"]["name"], e.get("group"))].append(statuses[0] == "ok")
    for kind in total:
        gs = [v for (k, *_), v in groups.items() if k == kind]
        out[kind] = {"episodes": total[kind], "correct": correct[kind] / total[kind],
                     "groups": len(gs), "mixed_groups": sum(len(set(v)) > 1 for v in gs) / len(gs)}
    return out


def optimizer_effect(episodes: list[dict[str, Any]], margin: float = 0.05) -> dict[str, int]:
    """What the first Optimizer turn did to the Generator's kernel, over episodes: ``fixed`` (a
    failing kernel made correct), ``broke`` (a correct one made failing), ``faster`` / ``slower``
    (both correct, speedup changed by more than ``margin``, relative), ``kept`` (both correct,
    within the margin) and ``still_failing``."""
    out = dict.fromkeys(("fixed", "broke", "faster", "slower", "kept", "still_failing"), 0)
    for e in episodes:
        if len(e["turns"]) < 2:
            continue
        first, second = ((t.get("eval_result") or {}) for t in e["turns"][:2])
        ok1, ok2 = first.get("status") == "ok", second.get("status") == "ok"
        if not ok1:
            out["fixed" if ok2 else "still_failing"] += 1
        elif not ok2:
            out["broke"] += 1
        else:
            before, after = (r["benchmark"]["speedup_vs_eager"] for r in (first, second))
            out["faster" if after > before * (1 + margin) else
                "slower" if after < before * (1 - margin) else "kept"] += 1
    return out


_PREPROCESSOR_RE = re.compile(
    r"#\s*(define|include|pragma|if|ifdef|ifndef|elif|else|endif|undef|error|line)\b")


def is_comment_line(line: str) -> bool:
    """A whole-line comment: ``//`` (CUDA) or ``#`` (Python), not a preprocessor directive."""
    text = line.strip()
    return text.startswith("//") or (text.startswith("#") and not _PREPROCESSOR_RE.match(text))


def broken_rewrites(episodes: list[dict[str, Any]],
                    references: dict[str, str]) -> list[tuple[str, str]]:
    """For each first Optimizer turn that broke a correct Generator kernel: (problem, the first
    line of its reply that the problem's fast reference solution lacks, "" if it has them all;
    a problem without one gives the reply's first line). Example: 12 of 20 such
    lines were comments, where a 135M model continues prose and never returns to code."""
    out = []
    for e in episodes:
        if len(e["turns"]) < 2:
            continue
        first, second = e["turns"][:2]
        if ((first.get("eval_result") or {}).get("status") != "ok"
                or (second.get("eval_result") or {}).get("status") == "ok"):
            continue
        name = e["problem"]["name"]
        known = {line.strip() for line in references.get(name, "").splitlines()}
        new = (line.strip() for line in (second.get("text") or "").splitlines()
               if line.strip() and not line.startswith("```") and line.strip() not in known)
        out.append((name, next(new, "")))
    return out


def _steps(episodes: list[dict[str, Any]], step_ends: list[int]) -> list[list[dict[str, Any]]]:
    """The episodes of each GRPO step (``step_ends``: cumulative episode counts)."""
    return [episodes[start:end] for start, end in zip([0, *step_ends], step_ends)]


def optimizer_status_by_step(episodes: list[dict[str, Any]],
                             step_ends: list[int]) -> list[collections.Counter[str]]:
    """Per GRPO step (``step_ends``: cumulative episode counts, metrics.jsonl's ``episodes``),
    the statuses of the Optimizer's first turn ("none": the episode ended before it). A step
    where compile errors jump on every problem is a collapse."""
    return [collections.Counter(turn_status(e["turns"][1]) if len(e["turns"]) > 1 else "none"
                                for e in step) for step in _steps(episodes, step_ends)]


def optimizer_speed_by_step(episodes: list[dict[str, Any]],
                            step_ends: list[int]) -> list[tuple[int, int, int]]:
    """Per GRPO step: (first Optimizer turns faster than the Generator's correct kernel, as
    ``optimizer_effect`` counts them; first Optimizer turns correct at >= 1x eager PyTorch; first
    Optimizer turns). Run M trains the Optimizer alone on the families whose fast kernels beat
    PyTorch: whether the middle count climbs is whether it learned to write them."""
    out = []
    for step in _steps(episodes, step_ends):
        second = [(e["turns"][1].get("eval_result") or {}) for e in step if len(e["turns"]) > 1]
        fast = sum(r.get("status") == "ok" and r["benchmark"]["speedup_vs_eager"] >= 1.0
                   for r in second)
        out.append((optimizer_effect(step)["faster"], fast, len(second)))
    return out


def pass_by_step(episodes: list[dict[str, Any]], step_ends: list[int],
                 families: set[str]) -> list[tuple[int, int, int, int]]:
    """Per GRPO step: (Generator kernels correct, turns) on ``families``' problems, then the same
    on the rest. Run K trains on practice families: whether their pass rate climbs over the
    steps is whether GRPO learned to translate operations SFT never showed."""
    out = []
    for step in _steps(episodes, step_ends):
        row = [0, 0, 0, 0]
        for e in step:
            at = 0 if e["problem"].get("family") in families else 2
            row[at] += turn_status((e.get("turns") or [{}])[0]) == "ok"
            row[at + 1] += 1
        out.append((row[0], row[1], row[2], row[3]))
    return out


def tied_groups(episodes: list[dict[str, Any]], tie: float = 0.01) -> dict[str, float]:
    """Generator groups (problem, group) whose turns were all correct with credited rewards
    within ``tie`` of each other, and the largest |advantage| they got: with std scaling, timing
    differences of a thousandth become advantages of about 1."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = collections.defaultdict(list)
    for e in episodes:
        groups[(e["problem"]["name"], e.get("group"))].append(e["turns"][0])
    tied = [ts for ts in groups.values()
            if len(ts) > 1 and all(turn_status(t) == "ok" for t in ts)
            and max(r := [(t.get("reward_breakdown") or {}).get("credited", 0.0) for t in ts])
            - min(r) < tie]
    advs = [abs((t.get("reward_breakdown") or {}).get("advantage", 0.0)) for ts in tied for t in ts]
    return {"groups": float(len(groups)), "tied": float(len(tied)),
            "max_abs_advantage": max(advs, default=0.0)}


def _by_problem(episodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["problem"]["name"]: e for e in episodes}


def changed_first_replies(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
    """Held-out problems whose Generator reply differs between two evaluations of the same
    prompts. With the Generator not trained in between, any difference is decoding arithmetic."""
    a, b = _by_problem(before), _by_problem(after)
    return sorted(k for k in a.keys() & b.keys()
                  if a[k]["turns"] and b[k]["turns"]
                  and a[k]["turns"][0].get("prompt_ids") == b[k]["turns"][0].get("prompt_ids")
                  and a[k]["turns"][0].get("candidate_source") != b[k]["turns"][0].get("candidate_source"))


def reward_delta_split(before: list[dict[str, Any]], after: list[dict[str, Any]],
                       rewards_before: dict[str, float], rewards_after: dict[str, float]
                       ) -> dict[str, float]:
    """The mean held-out reward change between two evaluations, split into the problems whose
    Generator reply changed and the rest. With the Generator frozen (``--grpo-roles
    optimizer``) the first part is decoding arithmetic, the second the Optimizer's training."""
    changed = set(changed_first_replies(before, after))
    names = sorted(rewards_before.keys() & rewards_after.keys())
    n = max(len(names), 1)
    split = {"generator_changed": 0.0, "rest": 0.0}
    for name in names:
        part = "generator_changed" if name in changed else "rest"
        split[part] += (rewards_after[name] - rewards_before[name]) / n
    split["total"] = split["generator_changed"] + split["rest"]
    return split


def trained_family_split(rewards_before: dict[str, float], rewards_after: dict[str, float],
                         family_of: dict[str, str], trained: set[str],
                         practice: set[str] = frozenset()) -> dict[str, tuple[int, float]]:
    """The summed reward change between two evaluations, split into the problems of families
    GRPO trained on, those of ``practice`` families it did not train on, and the rest:
    (problems, sum) each. GRPO's own families have gained on every seed while the others lost
    about as much. An early-stopping sample may hold practice families GRPO never
    drew: their change is what translating a new ``forward`` gained."""
    split = {"trained": (0, 0.0), "practice": (0, 0.0), "other": (0, 0.0)}
    for name in sorted(rewards_before.keys() & rewards_after.keys()):
        family = family_of.get(name)
        part = "trained" if family in trained else "practice" if family in practice else "other"
        n, total = split[part]
        split[part] = (n + 1, total + rewards_after[name] - rewards_before[name])
    return split


_OP_RE = re.compile(r"\bop\s*\([^)]*\)\s*\{\s*return\s+([^;]*);")


def unseen_family_ops(episodes: list[dict[str, Any]], seen_families: set[str]
                      ) -> list[tuple[str, str, str]]:
    """(problem, outcome, the ``op()`` expression or the first kernel's name) of each episode
    whose family SFT never showed and whose Generator kernel failed. Example: for
    ``abs``, ``scale`` and ``softplus`` the Generator kept the element-wise template and wrote
    ``hardtanh``'s body, ``fminf(fmaxf(v, p0), p1)``, or ``absf(v)``."""
    out = []
    for e in episodes:
        turns = e.get("turns") or []
        if not turns or e["problem"].get("family") in seen_families:
            continue
        result = turns[0].get("eval_result") or {}
        status = result.get("status") or "no kernel"
        if status == "ok":
            continue
        source = turns[0].get("candidate_source") or ""
        m = _OP_RE.search(source)
        out.append((e["problem"]["name"], status,
                    " ".join(m.group(1).split()) if m else kernel_template(source)))
    return sorted(out)


def timing_agreement(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[float]:
    """after/before speedup of every turn whose kernel is the same source, correct in both
    evaluations of the same problem: how far the timings of unchanged kernels moved."""
    a, b = _by_problem(before), _by_problem(after)
    ratios = []
    for name in a.keys() & b.keys():
        for t1, t2 in zip(a[name]["turns"], b[name]["turns"]):
            r1, r2 = t1.get("eval_result") or {}, t2.get("eval_result") or {}
            if (t1.get("candidate_source") and t1.get("candidate_source") == t2.get("candidate_source")
                    and r1.get("status") == r2.get("status") == "ok"):
                ratios.append(r2["benchmark"]["speedup_vs_eager"] / r1["benchmark"]["speedup_vs_eager"])
    return ratios


@functools.cache
def fast_references() -> dict[str, str]:
    """The built-in corpus's fast solution of each of its problems that has one, by name."""
    from multiminddev.tasks.builtin import reference_solution
    from multiminddev.tasks.loaders import load_problems

    return {p.name: source for p in load_problems("builtin:allshapes")
            if (source := reference_solution(p, variant="fast")) is not None}


def print_family_splits(seed_dir: Path, seed: int, trained: set[str],
                        practice_families: set[str]) -> None:
    """grpo - sft on the held-out problems and select@K - select@0 on the early-stopping ones,
    each split into GRPO's training families, practice families it did not train on, and the
    rest."""
    practice = practice_families - trained
    partial = seed_dir / "partial.json"
    rows = json.loads(partial.read_text()).get("rows", {}) if partial.is_file() else {}
    family_of = {e["problem"]["name"]: e["problem"].get("family", "")
                 for path in seed_dir.glob("episodes_*.jsonl") for e in _read_jsonl(path)}
    selects = sorted((k for k in rows if k.startswith("select@") and k != "select@0"),
                     key=lambda k: int(k.split("@")[1]))
    pairs = [("sft", "grpo"), *(("select@0", k) for k in selects)]
    for before, after in pairs:
        if before in rows and after in rows:
            split = trained_family_split(*(mean_reward_by_problem(rows[stage])
                                           for stage in (before, after)), family_of, trained,
                                         practice)
            (nt, t), (np_, pr), (no, o) = split["trained"], split["practice"], split["other"]
            untrained = f", {pr:+.2f} on {np_} of practice families it did not train on" \
                if np_ else ""
            print(f"seed {seed} reward, {after} - {before}, summed: {t:+.2f} on {nt} problems of "
                  f"GRPO's training families{untrained}, {o:+.2f} on the {no} others")


def mean_reward_by_problem(stage_rows: list[dict[str, Any]]) -> dict[str, float]:
    """A stage's mean reward per problem: bench_learning --eval-samples K records K rows per
    problem, one otherwise."""
    return {name: statistics.fmean(r["reward"] for r in rows)
            for name, rows in rows_by_problem(stage_rows).items()}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compared_stages(requested: list[str], present: dict) -> tuple[str, str] | None:
    """The first and last of the requested stages a seed has episodes for, or None if under two.

    A seed cut by its time limit lacks its last stages (e.g. it ended before select@12);
    it is compared over the stages it reached rather than skipped or crashing the report.
    """
    reached = [stage for stage in requested if stage in present]
    return (reached[0], reached[-1]) if len(reached) >= 2 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output_dir", type=Path)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sft-problems", help="the run's SFT problem spec, to split prompts")
    p.add_argument("--grpo-problems", help="the run's GRPO problem spec (--train-problems), to "
                   "split reward changes into its families and the rest")
    p.add_argument("--stages", nargs="*", default=["sft", "grpo"],
                   help="held-out stages (episodes_<stage>.jsonl) whose Optimizer turns to count")
    p.add_argument("--family-counts-out", type=Path, metavar="FILE",
                   help="also write each family's correct and total GRPO episodes, pooled over "
                        "the seeds, as JSON for the family_warm_start setting")
    args = p.parse_args(argv)
    from multiminddev.tasks.builtin import practice_by_name

    practice = set(practice_by_name())
    pooled: list[dict[str, Any]] = []
    sft_names: set[str] | None = None
    sft_families: set[str] | None = None
    if args.sft_problems:
        from multiminddev.tasks.loaders import load_problems

        sft_loaded = load_problems(args.sft_problems)
        sft_names = {q.name for q in sft_loaded}
        sft_families = {q.family for q in sft_loaded}
    trained: set[str] | None = None
    if args.grpo_problems:
        from multiminddev.tasks.loaders import load_problems

        trained = {q.family for q in load_problems(args.grpo_problems)}
    for seed in args.seeds:
        path = args.output_dir / f"seed{seed}" / "episodes.jsonl"
        if not path.is_file():
            print(f"seed {seed}: no {path}", file=sys.stderr)
            continue
        episodes = _read_jsonl(path)
        pooled += episodes
        print(f"seed {seed}: {len(episodes)} GRPO episodes")
        print("  template: Generator turns, sum of advantages")
        for name, (n, adv) in template_credit(episodes).items():
            print(f"    {name}: {n}, {adv:+.2f}")
        if sft_names is not None:
            for kind, row in seen_versus_new(episodes, sft_names).items():
                print(f"  {kind}: {row['episodes']} episodes, {row['correct']:.0%} correct, "
                      f"{row['mixed_groups']:.0%} of {row['groups']} groups mixed")
        print("  (tier, Generator kernel): turns, sum of advantages")
        for (tier, kind), (n, adv) in template_credit_by_tier(episodes,
                                                              reference_templates()).items():
            print(f"    tier {tier}, {kind}: {n}, {adv:+.2f}")
        print("  family: Generator turns, pass rate, mixed groups of all")
        print("    " + "; ".join(f"{f} {r['episodes']} {r['pass_rate']:.2f} {r['mixed']}/{r['groups']}"
                                 for f, r in family_signal(episodes).items()))
        tied = tied_groups(episodes)
        print(f"  Generator groups all correct with rewards within 0.01: {tied['tied']:.0f} of "
              f"{tied['groups']:.0f}, largest |advantage| among them {tied['max_abs_advantage']:.2f}")
        metrics = path.parent / "metrics.jsonl"
        if metrics.is_file():
            ends = [r["episodes"] for r in _read_jsonl(metrics) if "episodes" in r and "step" in r]
            if practice & {e["problem"].get("family") for e in episodes}:
                print("  Generator correct per GRPO step, practice families ; the rest: " + " | ".join(
                    f"{pc}/{pn} ; {rc}/{rn}" for pc, pn, rc, rn in pass_by_step(episodes, ends,
                                                                                practice)))
            print("  Optimizer turn per GRPO step: " + " | ".join(
                f"{c['ok']} ok, {c['compile_error']} compile errors of {sum(c.values())}"
                for c in optimizer_status_by_step(episodes, ends)))
            print("  Optimizer turns per GRPO step, faster than the Generator's / at >= 1x eager"
                  " / all: " + " | ".join(f"{f} / {e} / {n}" for f, e, n in
                                          optimizer_speed_by_step(episodes, ends)))
    if args.family_counts_out:
        args.family_counts_out.write_text(json.dumps(
            {"source": f"{args.output_dir} seeds {args.seeds}, GRPO episodes",
             "families": family_counts(pooled)}, indent=1) + "\n")
        print(f"family counts of {len(pooled)} episodes: {args.family_counts_out}")
    all_ratios: list[float] = []
    for seed in args.seeds:
        held = {}
        for stage in args.stages:
            path = args.output_dir / f"seed{seed}" / f"episodes_{stage}.jsonl"
            if path.is_file():
                held[stage] = _read_jsonl(path)
                mismatched = "; ".join(f"{k}: {n} of {total}"
                                       for k, (n, total) in dtype_mismatches(held[stage]).items())
                print(f"seed {seed} held-out {stage}: Generator kernels of the wrong precision: "
                      f"{mismatched}")
                drifted, total = template_drift(held[stage], reference_templates())
                print(f"seed {seed} held-out {stage}: Generator kernels on another family's "
                      f"template: {len(drifted)} of {total}"
                      + "".join(f"; {name}: {t}" for name, t in drifted[:6]))
                if sft_families is not None and (ops := unseen_family_ops(held[stage],
                                                                         sft_families)):
                    print(f"seed {seed} held-out {stage}: failing Generator kernels of families "
                          "SFT never showed, op(): " + "; ".join(
                              f"{n} ({st}): {op}" for n, st, op in ops))
                counts = ", ".join(f"{k} {v}" for k, v in optimizer_effect(held[stage]).items())
                print(f"seed {seed} held-out {stage}: Optimizer turn vs Generator's kernel: {counts}")
                broken = broken_rewrites(held[stage], fast_references())
                if broken:
                    comments = [(n, line) for n, line in broken if is_comment_line(line)]
                    print(f"seed {seed} held-out {stage}: of {len(broken)} broken rewrites, "
                          f"{len(comments)} went astray first on a comment line: "
                          + "; ".join(f"{n}: {line[:60]!r}" for n, line in comments[:4]))
        ends = compared_stages(args.stages, held)
        if ends is not None:
            first_stage, last_stage = ends
            first, last = held[first_stage], held[last_stage]
            print(f"seed {seed} held-out: Generator replies that differ, {first_stage} vs "
                  f"{last_stage}, same prompts: {changed_first_replies(first, last)}")
            all_ratios += timing_agreement(first, last)
            partial = args.output_dir / f"seed{seed}" / "partial.json"
            rows = json.loads(partial.read_text()).get("rows", {}) if partial.is_file() else {}
            if first_stage in rows and last_stage in rows:
                split = reward_delta_split(
                    first, last, *(mean_reward_by_problem(rows[stage])
                                   for stage in (first_stage, last_stage)))
                print(f"seed {seed} held-out reward, {last_stage} - {first_stage}: "
                      f"{split['total']:+.4f} = {split['generator_changed']:+.4f} on problems "
                      f"whose Generator reply changed + {split['rest']:+.4f} on the rest")
        if trained is not None:
            print_family_splits(args.output_dir / f"seed{seed}", seed, trained, practice)
    if all_ratios:
        far = sum(abs(r - 1) > 0.05 for r in all_ratios)
        print(f"same correct kernel in each seed's first and last stage: {len(all_ratios)} "
              f"turns, speedup ratio median {statistics.median(all_ratios):.3f}, "
              f"{far} more than 5% apart (min {min(all_ratios):.3f}, max {max(all_ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
