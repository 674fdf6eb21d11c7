"""Static HTML report: summary tables side by side per label (model / checkpoint), plots, training.

``write_report(out_dir, bench_runs=..., training_run=...)`` writes ``out_dir/report.html`` (plots
embedded as base64, so the single file opens anywhere, no server), the same plots as PNG files
beside it, and ``summary.json``. ``bench_runs`` maps a label to its samples: EvalResults (or
their dicts, as ``eval-dir`` writes) or episode dicts (as the episode runner writes: one sample
per episode, its best attempt; the per-turn curves come from the episodes' turns).
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.report import plots
from multiminddev.report.files import write_atomic
from multiminddev.report.metrics import (
    NOT_MEASURED,
    NoCandidate,
    bootstrap_ci,
    episode_best_result,
    fast_p,
    geometric_mean,
    per_turn_curves,
    summarize_results,
)


@dataclass(kw_only=True)
class LabelData:
    """One label's samples, normalised: one EvalResult per sample (NoCandidate: none written)."""

    results: list[EvalResult | NoCandidate] = field(default_factory=list)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    format_failures: int = 0
    tiers: dict[str, int] = field(default_factory=dict)


def normalise_samples(samples: Sequence[EvalResult | Mapping[str, Any]]) -> LabelData:
    """Sort samples into EvalResults and episodes; an episode contributes its best attempt."""
    data = LabelData()
    for s in samples:
        if isinstance(s, EvalResult):
            data.results.append(s)
        elif isinstance(s, Mapping) and "turns" in s:
            ep = dict(s)
            data.episodes.append(ep)
            name, tier = _problem_name_tier(ep)
            if name is not None and tier is not None:
                data.tiers[name] = tier
            best = episode_best_result(ep)
            if best is None:  # every reply lacked a candidate: a failed sample, not a missing one
                data.format_failures += 1
                data.results.append(NoCandidate(problem=name or ep.get("episode_id", "?")))
            else:
                data.results.append(best)
        elif isinstance(s, Mapping) and "status" in s:
            data.results.append(EvalResult.from_dict(dict(s)))
        else:
            raise ValueError(f"cannot read a report sample of type {type(s).__name__}: "
                             "pass EvalResults, EvalResult dicts or episode dicts")
    return data


def _problem_name_tier(ep: Mapping[str, Any]) -> tuple[str | None, int | None]:
    prob = ep.get("problem")
    if isinstance(prob, Mapping):
        tier = prob.get("tier")
        return prob.get("name"), int(tier) if tier is not None else None
    return (prob if isinstance(prob, str) else None), None


def summarize_label(data: LabelData, *, tiers: Mapping[str, int] | None = None) -> dict[str, Any]:
    """summarize_results plus episode figures and bootstrap 95% intervals."""
    all_tiers = {**data.tiers, **(tiers or {})}
    summary = summarize_results(data.results, tiers=all_tiers or None)
    summary["format_failures"] = data.format_failures
    pairs = [(r.correct, r.speedup) if isinstance(r, EvalResult) else (False, 0.0)
             for r in data.results]
    summary["ci95"] = {
        "correct_rate": _ci(bootstrap_ci(pairs, lambda v: sum(c for c, _ in v) / len(v))),
        "fast_1": _ci(bootstrap_ci(pairs, lambda v: fast_p([c for c, _ in v], [s for _, s in v], 1.0))),
        "geomean_speedup_vs_eager": _ci(bootstrap_ci(pairs, lambda v: geometric_mean(s for c, s in v if c))),
    }
    if summary["correct_rate"] is None:  # not measured (no GPU): no interval either
        summary["ci95"].update(correct_rate=None, fast_1=None)
    if data.episodes:
        summary["episodes"] = len(data.episodes)
        summary["per_turn"] = per_turn_curves(data.episodes)
        rewards = [r for r in (episode_reward(ep) for ep in data.episodes) if r is not None]
        summary["reward_mean"] = _mean_or_none(rewards)
        summary["ci95"]["reward_mean"] = _ci(bootstrap_ci(rewards, _mean_or_nan))
    return summary


def episode_reward(episode: Mapping[str, Any]) -> float | None:
    """An episode's reward as the trainer scores it: the best reward of its agent turns (the
    rewards the episode runner recorded with its RewardConfig); None when none was recorded."""
    rewards = [t.get("reward") for t in episode.get("turns") or []
               if str(t.get("role", "")).lower() != "tester"]
    rewards = [float(r) for r in rewards if isinstance(r, (int, float)) and math.isfinite(r)]
    return max(rewards) if rewards else None


def _mean_or_nan(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _mean_or_none(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ci(bounds: tuple[float, float]) -> list[float] | None:
    return list(bounds) if all(math.isfinite(b) for b in bounds) else None


def write_report(
    out_dir: Path,
    *,
    bench_runs: Mapping[str, Sequence[EvalResult | Mapping[str, Any]]] | None = None,
    training_run: Path | None = None,
    tiers: Mapping[str, int] | None = None,
    title: str = "MultiMindDev report",
) -> Path:
    """Write report.html, PNG plots and summary.json into ``out_dir``; return the HTML path."""
    out_dir = Path(out_dir)  # created by the first file written: a bad input leaves no folder
    labels = {k: normalise_samples(v) for k, v in (bench_runs or {}).items()}
    # Tiers known from any label's episodes apply to every label (eval-dir results carry none).
    known = {name: t for d in labels.values() for name, t in d.tiers.items()}
    summaries = {k: summarize_label(d, tiers={**known, **(tiers or {})}) for k, d in labels.items()}
    records = plots.load_training_metrics(training_run) if training_run is not None else []
    evals = plots.load_eval_metrics(training_run) if training_run is not None else []
    images = _make_plots(out_dir, labels, summaries, records)
    if evals:
        images["Held-out evaluation during training"] = plots.plot_eval_curves(
            evals, out_dir / "training_eval.png")
    write_atomic(out_dir / "summary.json", json.dumps(
        {"labels": summaries, "training_run": str(training_run) if training_run else None,
         "training_steps": len(records), "training_evals": evals}, indent=2))
    page = _page(title, summaries, records, images, training_run)
    return write_atomic(out_dir / "report.html", page)


def _make_plots(out_dir: Path, labels: Mapping[str, LabelData], summaries: Mapping[str, Any],
                records: Sequence[Mapping[str, Any]]) -> dict[str, Path]:
    images: dict[str, Path] = {}
    if labels:
        speedups = {k: [r.speedup for r in d.results if isinstance(r, EvalResult) and r.correct]
                    for k, d in labels.items()}
        images["Speedup distribution"] = plots.plot_speedup_distribution(speedups, out_dir / "speedups.png")
    per_tier = {k: s["per_tier"] for k, s in summaries.items() if s.get("per_tier")}
    if per_tier:
        images["Per-tier results"] = plots.plot_per_tier(per_tier, out_dir / "per_tier.png")
    curves = {k: s["per_turn"] for k, s in summaries.items() if s.get("per_turn")}
    if curves:
        images["Improvement per turn"] = plots.plot_turn_curves(curves, out_dir / "per_turn.png")
    if records:
        images["Training curves"] = plots.plot_training_curves(records, out_dir / "training.png")
    return images


# --- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.warn { background: #fff4d6; border: 1px solid #e0b000; padding: 0.6em 1em; }
.note { color: #666; font-size: 0.9em; }
img { max-width: 100%; border: 1px solid #eee; }
"""

_SUMMARY_NOTE = (
    "<p class='note'>Rates and fast_p are over samples (KernelBench definition: correct and "
    "faster than p times eager). Geometric means over correct samples. [..] = bootstrap 95% "
    "interval. Episodes count once, by their best attempt.</p>"
)

_SUMMARY_ROWS = (
    ("samples", lambda s: s["n"]),
    ("problems", lambda s: s["problems"]),
    ("episodes", lambda s: s.get("episodes")),
    ("mean episode reward", lambda s: _num_ci(s.get("reward_mean"), s["ci95"].get("reward_mean"))),
    ("compile rate", lambda s: _pct(s["compile_rate"])),
    ("correct (fast_0)", lambda s: _measured(s, _pct_ci(s["correct_rate"],
                                                        s["ci95"]["correct_rate"]))),
    ("fast_1", lambda s: _measured(s, _pct_ci(s["fast_p"].get("1"), s["ci95"]["fast_1"]))),
    ("fast_1.2", lambda s: _measured(s, _pct(s["fast_p"].get("1.2")))),
    ("fast_2", lambda s: _measured(s, _pct(s["fast_p"].get("2")))),
    ("geomean speedup vs eager", lambda s: _x_ci(s["geomean_speedup_vs_eager"],
                                                  s["ci95"]["geomean_speedup_vs_eager"])),
    ("geomean speedup vs torch.compile", lambda s: _x(s["geomean_speedup_vs_compile"])),
    ("rejected (hack) rate", lambda s: _pct(s["rejected_rate"])),
    ("bad input (not UTF-8)", lambda s: _pct(s.get("bad_input_rate"))),
    ("no GPU (compile only)", lambda s: _pct(s["no_gpu_rate"])),
    ("no candidate (format failure)", lambda s: _pct(s.get("format_failure_rate"))),
    ("measured on", lambda s: ", ".join(s["devices"]) or "-"),
)


def _page(title: str, summaries: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
          images: Mapping[str, Path], training_run: Path | None) -> str:
    """A training run reads in the order it ran: its settings, its curves and last step, then
    the held-out results; bench and eval-dir reports start at the summary."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>",
             f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>"]
    parts += _warnings(summaries, records)
    training_images = {k: v for k, v in images.items() if k in TRAINING_IMAGES}
    if training_run is not None:
        parts += _run_config_table(training_run) + _sft_section(training_run)
    parts += [_image(name, path) for name, path in training_images.items()]
    if records:
        parts += _training_table(records, training_run)
    if training_run is not None:
        parts += _heldout_section(training_run)
    if summaries:
        parts += ["<h2>Summary</h2>", _summary_table(summaries), _SUMMARY_NOTE]
        parts += _pass_at_k_table(summaries) + _tier_table(summaries) + _turn_table(summaries)
        parts += _reasons_table(summaries)
    parts += [_image(name, path) for name, path in images.items() if name not in training_images]
    parts.append("</body></html>")
    return "\n".join(parts)


TRAINING_IMAGES = ("Training curves", "Held-out evaluation during training")
RUN_CONFIG_FILE = "run_config.json"  # what the train pipeline records of its settings


def _image(name: str, path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f"<h2>{_e(name)}</h2><img alt='{_e(name)}' src='data:image/png;base64,{data}'>"


def _run_config_table(training_run: Path) -> list[str]:
    """The run's settings (``run_config.json``), the set ones only; nothing if absent or bad."""
    path = Path(training_run) / RUN_CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    if not isinstance(config, dict):
        return []
    rows = [[k, json.dumps(v) if isinstance(v, (list, dict)) else v]
            for k, v in config.items() if v not in (None, False, [], {}, "")]
    return ["<h2>Run configuration</h2>", _table(["setting", "value"], rows)]


SFT_RESULTS_FILE = "sft_results.json"  # the train pipeline's SFT results per agent
# the train pipeline's held-out evaluations: of the SFT agents (eval_after_sft), of the final ones
HELDOUT_FILES = (("SFT agents", "sft_eval_results.json"), ("final agents", "eval_results.json"))


def _read_json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _sft_section(training_run: Path) -> list[str]:
    """Each agent's SFT: examples, steps, the loss on the first examples before and after, time;
    nothing where the run recorded no SFT."""
    results = _read_json_object(Path(training_run) / SFT_RESULTS_FILE)
    if not results:
        return []
    rows = [[role, r.get("status", "-"), r.get("examples", "-"), r.get("steps", "-"),
             f"{_fmt(r.get('loss_before'))} -> {_fmt(r.get('loss_after'))}",
             _fmt(r.get("seconds"))]
            for role, r in results.items() if isinstance(r, dict)]
    return ["<h2>SFT</h2>", _table(["agent", "status", "examples", "steps", "loss (first examples)",
                                    "seconds"], rows)]


def _heldout_section(training_run: Path) -> list[str]:
    """The run's held-out evaluations, SFT agents first: compile and correct rates over
    evaluated turns, mean episode reward, fast_1; nothing where there was none."""
    rows = []
    for name, file in HELDOUT_FILES:
        e = _read_json_object(Path(training_run) / file)
        if e is None:
            continue
        rows.append([name, e.get("problems", "-"), _pct(e.get("compile_rate")),
                     _pct(e.get("pass_rate")), _fmt(e.get("reward_mean")),
                     "-" if e.get("compile_only") else _pct(e.get("fast_1")),
                     e.get("measured_on", "-")])
    if not rows:
        return []
    return ["<h2>Held-out evaluation</h2>",
            _table(["agents", "problems", "compile rate", "correct", "mean reward", "fast_1",
                    "measured on"], rows),
            ("<p class='note'>Rates over evaluated turns; fast_1 is not measured without a GPU "
             "(compile-only).</p>")]


def _warnings(summaries: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for label, s in summaries.items():
        if s["n"] and s["status_counts"].get(EvalStatus.NO_GPU.value, 0) == s["n"]:
            out.append(f"<p class='warn'>{_e(label)}: every candidate was evaluated without a GPU "
                       "(compile only): no correctness or speed was measured.</p>")
        if s["n"] and s.get("format_failures") == s["n"]:
            out.append(f"<p class='warn'>{_e(label)}: no reply held a candidate kernel (every "
                       "sample is a format failure), so nothing was compiled or run: the zero "
                       "rates below say the model's replies could not be parsed, not that its "
                       "kernels failed. A candidate is a code block that defines class ModelNew; "
                       "each turn's parse_failure in the episodes says why it had none.</p>")
    if any(r.get("compile_only") for r in records):
        out.append("<p class='warn'>Training used compile-only rewards (no GPU).</p>")
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary_table(summaries: Mapping[str, Any]) -> str:
    rows = [[name, *(get(s) for s in summaries.values())] for name, get in _SUMMARY_ROWS]
    return _table(["metric", *summaries], rows)


def _pass_at_k_table(summaries: Mapping[str, Any]) -> list[str]:
    ks = sorted({k for s in summaries.values() for k in s["pass_at_k"]}, key=int)
    if not ks:
        return []
    rows = [[f"pass@{k}", *(_pct(s["pass_at_k"].get(k)) for s in summaries.values())] for k in ks]
    return ["<h2>pass@k</h2>", _table(["metric", *summaries], rows),
            "<p class='note'>Unbiased estimator (Chen et al. 2021), mean over problems.</p>"]


def _tier_table(summaries: Mapping[str, Any]) -> list[str]:
    tiers = sorted({t for s in summaries.values() for t in s.get("per_tier", {})}, key=int)
    if not tiers:
        return []
    rows = []
    for t in tiers:
        cells = []
        for s in summaries.values():
            ts = s.get("per_tier", {}).get(t)
            cells.append("-" if ts is None else
                         f"{_measured(ts, _pct(ts['correct_rate']))} correct, fast_1 "
                         f"{_measured(ts, _pct(ts['fast_p'].get('1')))}, n={ts['n']}")
        rows.append([f"tier {t}", *cells])
    return ["<h2>Per tier</h2>", _table(["tier", *summaries], rows)]


def _turn_table(summaries: Mapping[str, Any]) -> list[str]:
    curves = {k: s["per_turn"] for k, s in summaries.items() if s.get("per_turn")}
    horizon = max((len(c["attempt"]) for c in curves.values()), default=0)
    if not horizon:
        return []
    rows = []
    for k in range(horizon):
        cells = []
        for c in curves.values():
            if k >= len(c["attempt"]):
                cells.append("-")
                continue
            cells.append(f"{_pct(c['frac_correct'][k])} correct, fast_1 {_pct(c['fast_1'][k])}, "
                         f"geomean {_x(c['geomean_best_speedup'][k])} "
                         f"({c['attempts_made'][k]} episodes made it)")
        rows.append([f"after attempt {k + 1}", *cells])
    note = ("<p class='note'>Best so far per episode (an episode that stopped early keeps its "
            "state).</p>")
    return ["<h2>Improvement per turn</h2>", _table(["", *curves], rows), note]


def _reasons_table(summaries: Mapping[str, Any]) -> list[str]:
    reasons = sorted({r for s in summaries.values() for r in s["reject_reasons"]})
    statuses = sorted({r for s in summaries.values() for r in s["status_counts"]})
    rows = [[f"status: {st}", *(s["status_counts"].get(st, 0) for s in summaries.values())]
            for st in statuses]
    rows += [[f"rejected: {r}", *(s["reject_reasons"].get(r, 0) for s in summaries.values())]
             for r in reasons]
    return ["<h2>Outcomes</h2>", _table(["outcome", *summaries], rows)] if rows else []


def _training_table(records: Sequence[Mapping[str, Any]], training_run: Path | None) -> list[str]:
    last = records[-1]
    keys = [k for k in ("step", "episodes", "reward_mean", "reward_std", "compile_rate", "pass_rate",
                        "hack_rate", "repeat_rate", "geomean_speedup", "fast_1", "kl", "entropy",
                        "clip_fraction", "tokens_per_s", "evals_per_s") if k in last]
    rows = [[k, last[k]] for k in keys]
    head = (f"<h2>Training run: last step</h2><p class='note'>{_e(str(training_run))}, "
            f"{len(records)} logged steps.</p>")
    return [head, _table(["metric", "value"], rows)]


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _measured(summary: Mapping[str, Any], text: str) -> str:
    """``text``, or NOT_MEASURED where correctness was not measured (no GPU): a rate of None
    there means "unknown", not "none"."""
    return NOT_MEASURED if summary.get("correct_rate") is None and summary.get("no_gpu_rate") \
        else text


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _pct_ci(v: float | None, ci: Sequence[float] | None) -> str:
    return _pct(v) + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci and v is not None else "")


def _num_ci(v: float | None, ci: Sequence[float] | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}x"


def _x_ci(v: float | None, ci: Sequence[float] | None) -> str:
    return _x(v) + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci and v is not None else "")
