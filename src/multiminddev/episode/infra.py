"""Episodes whose evaluation failed on our side (``EvalStatus.INFRA_ERROR``).

One such episode says nothing about the agents and is left out (of GRPO's update, of the
reward statistics). When most of a stage's episodes end so, the stage measured the evaluation
environment instead of the agents: its figures must not be reported or trained on, so the
stage stops with ``InfraFailure``, whose message counts the episodes and names the causes the
evaluator gave.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from multiminddev.env.results import EvalStatus

# A stage fails when more than this share of its episodes ended in an infrastructure error. A
# few are expected (a crowded GPU, a worker replaced after a candidate's fault; the evaluator
# retries each once); most of a stage means the evaluator itself no longer works.
INFRA_SHARE_LIMIT = 0.5
CAUSES_SHOWN = 3  # distinct evaluator messages quoted in the error
MESSAGE_CHARS = 300  # of each quoted message


class InfraFailure(RuntimeError):
    """Too many of a stage's episodes ended in an infrastructure error."""


def check_share_limit(max_share: float, name: str = "max_infra_share") -> None:
    """Raises ValueError unless ``max_share`` is a share of episodes, in [0, 1]."""
    if not 0.0 <= max_share <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (the share of a stage's episodes with an "
                         f"infrastructure error above which the stage fails; 1: never), got "
                         f"{max_share}")


def episode_infra_message(episode: Any) -> str | None:
    """The evaluator's message for the episode's first turn whose evaluation failed on our side
    (empty message: a placeholder); None when no turn's did."""
    for turn in episode.turns:
        result = getattr(turn, "eval_result", None)
        if result is not None and result.status is EvalStatus.INFRA_ERROR:
            return result.message or "infrastructure error (no message)"
    return None


# Causes the evaluator's message names, and what to do about each.
_HINTS = (
    (("worker exited during startup", "worker failed to start", "did not start within"),
     ("the evaluation workers could not start. Each new worker (one per candidate) is forked "
      "from multiprocessing's forkserver and re-reads the main script and the package's "
      "modules from disk: a run whose files were replaced or changed while it ran (a detached "
      "run in a working tree that a later command rewrote) fails so from then on; run from a "
      "copy of the tree. Otherwise the worker's stderr says why it exited")),
    (("the evaluator is closed",),
     "the evaluator was closed before the stage ran; keep it open until the last evaluation"),
    (("out of memory", "outofmemory"),
     ("the GPU was out of memory: other processes (a trainer's cache, other runs) held it; "
      "free GPU memory or run fewer processes on the card")),
    (("the reference problem",),
     ("the trusted reference code failed in the worker (setup or baseline), so no candidate "
      "could be judged")),
)


def infra_hint(messages: Sequence[str]) -> str:
    """What the messages' most common known cause means ('' when none is known)."""
    for message, _ in Counter(messages).most_common():
        lowered = message.lower()
        for needles, hint in _HINTS:
            if any(n in lowered for n in needles):
                return hint
    return ""


def infra_failure(messages: Sequence[str | None], *, what: str,
                  max_share: float = INFRA_SHARE_LIMIT) -> str | None:
    """The error of a stage whose episodes' infrastructure errors (one entry per episode: its
    ``episode_infra_message``, None when it had none) are more than ``max_share`` of them; None
    when the stage is usable. ``what`` names the stage in the message."""
    check_share_limit(max_share)
    failed = [m for m in messages if m is not None]
    if not messages or len(failed) <= max_share * len(messages):
        return None
    causes = "; ".join(f"{n} x {m[:MESSAGE_CHARS]!r}"
                       for m, n in Counter(failed).most_common(CAUSES_SHOWN))
    hint = infra_hint(failed)
    return (f"{what}: {len(failed)} of {len(messages)} episodes ended in an infrastructure error "
            f"(the evaluation failed on our side, not the candidate's), more than "
            f"{max_share:.0%}, so its figures would measure the evaluation environment, not the "
            f"agents. The evaluator said: {causes}."
            + (f" Likely cause: {hint}." if hint else "")
            + " Fix the cause and run the stage again.")


def check_episodes(episodes: Sequence[Any], *, what: str,
                   max_share: float = INFRA_SHARE_LIMIT) -> None:
    """Raises ``InfraFailure`` when more than ``max_share`` of ``episodes`` ended in an
    infrastructure error (``infra_failure``)."""
    failure = infra_failure([episode_infra_message(e) for e in episodes], what=what,
                            max_share=max_share)
    if failure is not None:
        raise InfraFailure(failure)
