"""``multiminddev ab status|promote|add-arm|weights``: the A/B rollout of agent checkpoints.

Works on a server's state folder (``--state-dir``, the SQLite file ``ab.sqlite`` in it, which a
running server shares: changes apply to its next request) or on a running server over HTTP
(``--url``).

    multiminddev ab add-arm base --state-dir state --weight 1
    multiminddev ab add-arm run7 checkpoints/step-400 --state-dir state --weight 0.2
    multiminddev ab status --state-dir state
    multiminddev ab promote run7 --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from multiminddev.commands._io import InputError, dir_problem
from multiminddev.serve.ab import AB_DB_NAME, ABStore
from multiminddev.serve.auth import API_KEY_ENV

TOKEN_ENV = API_KEY_ENV


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("ab", help="A/B rollout: arm status, add arms, promote",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    where = argparse.ArgumentParser(add_help=False)
    target = where.add_mutually_exclusive_group(required=True)
    target.add_argument("--state-dir", type=Path, default=None,
                        help="the server's state folder (holds ab.sqlite)")
    target.add_argument("--url", default=None,
                        help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--token", default=None,
                       help=f"the server's API key (serve --api-key) for --url "
                            f"(default: ${TOKEN_ENV})")
    sub = parser.add_subparsers(dest="ab_command", metavar="ACTION")

    status = sub.add_parser("status", parents=[where],
                            help="per-arm figures with 95%% intervals and the verdict")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=run_status)

    promote = sub.add_parser("promote", parents=[where], help="move all traffic to one arm")
    promote.add_argument("arm", help="the arm to promote")
    promote.set_defaults(handler=run_promote)

    add = sub.add_parser("add-arm", parents=[where], help="add an arm (an agent checkpoint)")
    add.add_argument("name", help="the arm's name (letters, digits, '-', '_', '.')")
    add.add_argument("path", nargs="?", type=Path, default=None,
                     help="checkpoint folder with generator/ and optimizer/ adapters "
                          "(omit for the base model without adapters)")
    add.add_argument("--weight", type=float, default=1.0,
                     help="traffic weight (default 1; shares are weight / sum of weights)")
    add.set_defaults(handler=run_add_arm)

    weights = sub.add_parser("weights", parents=[where], help="set arms' traffic weights")
    weights.add_argument("pairs", nargs="+", metavar="ARM=WEIGHT", help="e.g. base=0.8 run7=0.2")
    weights.set_defaults(handler=run_weights)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


# --------------------------------------------------------------------------------- actions


def run_status(args: argparse.Namespace) -> int:
    summary = _remote(args, "GET", "/v1/ab/status") if args.url else _local(args, "summary")
    print(json.dumps(summary, indent=2) if args.json else format_status(summary))
    return 0


def run_promote(args: argparse.Namespace) -> int:
    if args.url:
        _remote(args, "POST", "/v1/ab/promote", {"arm": args.arm})
    else:
        _local(args, "promote", args.arm)
    print(f"promoted {args.arm}: it now gets all traffic and is the control arm")
    return 0


def run_add_arm(args: argparse.Namespace) -> int:
    if args.url:
        body: dict[str, Any] = {"name": args.name, "weight": args.weight}
        if args.path is not None:
            body["path"] = str(args.path.resolve())
        arm = _remote(args, "POST", "/v1/ab/arms", body)
    else:
        adapters = {}
        if args.path is not None:
            if problem := dir_problem(args.path, "checkpoint folder"):
                raise InputError(problem)
            # serve.ab_routes builds FastAPI routes: the serve extra loads only when used.
            from multiminddev.serve.ab_routes import checkpoint_adapters

            adapters = _checked(checkpoint_adapters, args.path)
        created = _local(args, "add_arm", args.name, adapters, weight=args.weight)
        arm = {"name": created.name, "adapters": created.adapters, "weight": created.weight}
    what = ", ".join(f"{r}={p}" for r, p in arm["adapters"].items()) or "base model"
    print(f"added arm {arm['name']} (weight {arm['weight']:g}): {what}")
    return 0


def run_weights(args: argparse.Namespace) -> int:
    weights = parse_weights(args.pairs)
    if args.url:
        _remote(args, "POST", "/v1/ab/weights", {"weights": weights})
    else:
        _local(args, "set_weights", weights)
    print("weights set: " + ", ".join(f"{k}={v:g}" for k, v in weights.items()))
    return 0


def parse_weights(pairs: list[str]) -> dict[str, float]:
    weights = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            weights[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise InputError(f"{pair!r}: give ARM=WEIGHT, e.g. base=0.8")
    return weights


# ------------------------------------------------------------------------------- backends


def _checked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a store call; its KeyError/ValueError (unknown arm, bad weight) becomes a one-line
    InputError."""
    try:
        return fn(*args, **kwargs)
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _local(args: argparse.Namespace, method: str, *call_args: Any, **kwargs: Any) -> Any:
    state = args.state_dir
    if state.exists() and not state.is_dir():
        raise InputError(f"{state} is a file; give the server's state folder")
    # Only add-arm creates the file: a typo in --state-dir must not leave an empty one behind.
    if method != "add_arm" and not (state / AB_DB_NAME).is_file():
        raise InputError(f"{state / AB_DB_NAME} does not exist: no A/B arms yet (add one "
                         f"with `multiminddev ab add-arm NAME [PATH] --state-dir {state}`)")
    with ABStore.in_state_dir(state) as store:
        return _checked(getattr(store, method), *call_args, **kwargs)


def _remote(args: argparse.Namespace, method: str, path: str,
            body: dict[str, Any] | None = None) -> Any:
    url = args.url.rstrip("/") + path
    headers = {"Accept": "application/json"}
    token = args.token or os.environ.get(TOKEN_ENV)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        try:  # {"error": {"message"}} (the server's shape) or {"detail"} (FastAPI's)
            body = json.loads(detail)
            detail = (body.get("error") or {}).get("message") or body.get("detail") or detail
        except (ValueError, AttributeError):
            pass
        raise InputError(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"cannot reach {url} ({reason}); is `multiminddev serve` running "
                         "there?") from None


# ------------------------------------------------------------------------------- rendering


def format_status(summary: dict[str, Any]) -> str:
    """The status as a table: one row per arm, rates and means with their 95% intervals."""
    head = ("arm", "traffic", "n", "compiled", "correct", "speedup", "reward", "verdict")
    rows = [head]
    for arm in summary["arms"]:
        test = arm["test"]
        verdict = test["verdict"]
        if test.get("interval"):
            lo, hi = test["interval"]
            verdict += f" (diff {_pct(test['difference'])}, {_pct(lo)}..{_pct(hi)})"
        correct = (f"{_ci(arm['correct_rate'], arm['correct_ci'], _pct)} of {arm['n_known']}"
                   if arm["n_known"] else "not measured")
        rows.append((
            arm["name"] + (" *" if arm["control"] else ""),
            f"{_pct(arm['share'])} (w={arm['weight']:g})",
            str(arm["n"]),
            _ci(arm["compiled_rate"], arm["compiled_ci"], _pct),
            correct,
            _ci(arm["speedup_geomean"], arm["speedup_ci"], lambda x: f"{x:.2f}x"),
            _ci(arm["reward_mean"], arm["reward_ci"], lambda x: f"{x:.3f}"),
            verdict,
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"* control arm ({summary['control'] or 'none'}); verdict: mixture SPRT on the "
                 f"correct rate vs the control, alpha={summary['alpha']}, always valid; "
                 f"{summary['outcomes']} outcome(s)")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(value: float | None, ci: list[float] | None, fmt: Any) -> str:
    if value is None:
        return "-"
    return f"{fmt(value)} [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else fmt(value)
