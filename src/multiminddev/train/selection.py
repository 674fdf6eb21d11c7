"""Early stopping on selection problems: which GRPO step's agents a run keeps.

The agents are evaluated on a fixed sample of problems that neither SFT nor GRPO trained on
(``select@K``: after SFT, K = 0, and after every ``select_every`` GRPO steps), at the held-out
evaluation's decoding; the run keeps the step with the best mean reward there, a later step
replacing the chosen one only when it beats it by more than ``min_gain``. SFT's agents (step 0)
may win. Held-out problems may not be in the sample: agents chosen on them would make the
held-out figures biased. The trainer's own ``best_model_episode_N`` is not used for this: it
ranks steps by an evaluation at the rollouts' sampling settings and never ranks SFT's agents.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from multiminddev.train import checkpoints as ck

BEST_DIR = "select_best"  # the adapters of the best select@K so far (K > 0)
RECORD_FILE = "select.json"  # the select@ rewards and the chosen step


class SelectionError(ValueError):
    """A selection sample that cannot be used; the message says which problems to choose."""


def selection_marks(num_steps: int, every: int) -> list[int]:
    """The GRPO steps after which the agents are evaluated: every ``every`` steps and the last."""
    return sorted({*range(every, num_steps, every), num_steps}) if num_steps > 0 else []


def chosen_step(rewards: Mapping[int, float], min_gain: float = 0.0) -> int | None:
    """The step whose agents are kept: going through the steps in order, a later one replaces
    the step chosen so far only when its reward is higher by more than ``min_gain`` (a tie goes
    to the step nearer SFT). None: no evaluation."""
    chosen = None
    for step in sorted(rewards):
        if chosen is None or rewards[step] > rewards[chosen] + min_gain:
            chosen = step
    return chosen


def fixed_sample(problems: Iterable[Any], count: int) -> list[Any]:
    """``count`` distinct problems (all, if fewer), sorted by name, drawn with a fixed RNG and
    not the run's seed, so every seed of a run evaluates the same problems."""
    distinct = list({p.name: p for p in problems}.values())
    chosen = random.Random(0).sample(distinct, min(count, len(distinct)))
    return sorted(chosen, key=lambda p: p.name)


def selection_sample(problems: Sequence[Any], count: int, *, also: Sequence[Any] = (),
                     also_count: int = 0, trained: Iterable[Any] = (),
                     heldout: Iterable[Any] = ()) -> list[Any]:
    """The select@ problems: ``count`` of ``problems`` joined to ``also_count`` of ``also``,
    both without the ``trained`` ones (agents chosen on problems they were trained on are
    chosen for fitting them). A held-out problem in the sample is a ``SelectionError``."""
    seen = {p.name for p in trained}

    def unseen(source: Sequence[Any], what: str) -> list[Any]:
        left = [p for p in source if p.name not in seen]
        if source and not left:
            raise SelectionError(f"{what}: every problem of it is trained on (SFT or GRPO); "
                                 "choose sizes neither saw, e.g. :resized2from12")
        return left

    chosen = fixed_sample(unseen(problems, "select_problems"), count)
    if also:
        names = {p.name for p in chosen}
        chosen = sorted([*chosen, *(p for p in fixed_sample(unseen(also, "select_also"),
                                                            also_count)
                                    if p.name not in names)], key=lambda p: p.name)
    shared = sorted({p.name for p in chosen} & {p.name for p in heldout})
    if shared:
        raise SelectionError(f"select_problems: {', '.join(shared)} are held out; choose "
                             "problems no evaluation reports, e.g. "
                             "builtin:tier0,tier1:train:resized2from12")
    return chosen


def save_if_best(rewards: Mapping[int, float], step: int, num_steps: int, policy: Any,
                 roles: Any, output_dir: Path, min_gain: float) -> bool:
    """After step ``step``'s select@ evaluation: saves ``roles``' adapters to
    ``output_dir/select_best`` when the step is the chosen one so far. Step 0 is saved too (the
    agents GRPO started from: SFT's, or checkpoints given to the run); the last step is not (the
    trainer ends holding its agents)."""
    if not 0 <= step < num_steps or chosen_step(rewards, min_gain) != step:
        return False
    best = Path(output_dir) / BEST_DIR
    # step.txt goes first and comes back last: a save cut halfway leaves no step to trust
    (best / "step.txt").unlink(missing_ok=True)
    ck.save_agents(policy, roles, best)
    (best / "step.txt").write_text(f"{step}\n")
    return True


def load_chosen(policy: Any, step: int, num_steps: int, output_dir: Path, roles: Any) -> None:
    """Puts the adapters of GRPO step ``step`` back into ``policy`` for ``roles`` (the last
    step's are the ones it holds)."""
    if step == num_steps:
        return
    best = Path(output_dir) / BEST_DIR
    saved = (best / "step.txt").read_text().strip() if (best / "step.txt").is_file() else None
    if saved != str(step):
        raise RuntimeError(f"{best} holds step {saved}'s agents, not step {step}'s: the run was "
                           "cut between a select@ evaluation and its save; rerun GRPO")
    policy.load_adapters({role.value: str(best / role.value) for role in roles})
