"""Our problems in verl's parquet layout (needs pandas and pyarrow, not verl).

One row per problem, with the columns verl's ``RLHFDataset`` and agent-loop rollout read:
``data_source``, ``prompt`` (the Generator's chat messages, what verl filters by length and
hands the loop as ``raw_prompt``), ``ability``, ``reward_model`` (``style: rule``; the ground
truth is the problem's name: the reward comes from the evaluator, not from a reference
answer), ``extra_info`` (``index``, ``split``, and the whole problem as JSON, which
``KernelAgentLoop`` rebuilds it from) and ``agent_name`` (the registered loop).

    python -m multiminddev.integrations.verl_data --problems builtin:tier0,tier1:train \
        --out data/kernels/train.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multiminddev.agents.prompts import generator_messages
from multiminddev.core.problem import Problem

AGENT_NAME = "multiminddev_kernel"  # KernelAgentLoop's registered name
DATA_SOURCE = "multiminddev/kernels"
ABILITY = "cuda_kernel"


def verl_row(problem: Problem, index: int, *, agent_name: str = AGENT_NAME,
             element_type: bool = False) -> dict[str, Any]:
    """One dataset row for ``problem``."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": generator_messages(problem, element_type=element_type),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": problem.name},
        "extra_info": {"index": index, "split": problem.split or "",
                       "problem": json.dumps(problem.to_dict())},
        "agent_name": agent_name,
    }


def problem_from_extra_info(extra_info: dict[str, Any]) -> Problem:
    """The problem a row's ``extra_info`` carries (the inverse of :func:`verl_row`)."""
    if not extra_info or "problem" not in extra_info:
        raise ValueError("the row's extra_info has no 'problem': build the dataset with "
                         "multiminddev.integrations.verl_data (write_verl_dataset)")
    return Problem.from_dict(json.loads(extra_info["problem"]))


def write_verl_dataset(problems: Sequence[Problem], path: str | Path, *,
                       agent_name: str = AGENT_NAME, element_type: bool = False) -> Path:
    """Write ``problems`` as a verl parquet file (written whole to a temporary name, then
    renamed, so a failure leaves nothing half-written). Returns the path."""
    import pandas as pd

    if not problems:
        raise ValueError("write_verl_dataset: no problems to write")
    rows = [verl_row(p, i, agent_name=agent_name, element_type=element_type)
            for i, p in enumerate(problems)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write problems as a verl parquet dataset.")
    parser.add_argument("--problems", required=True, help="problem spec (as `problems`)")
    parser.add_argument("--out", required=True, help="the .parquet file to write")
    parser.add_argument("--agent-name", default=AGENT_NAME)
    parser.add_argument("--element-type", action="store_true",
                        help="end prompts with the element-type line")
    args = parser.parse_args(argv)
    from multiminddev.tasks.loaders import load_problems

    try:
        problems = load_problems(args.problems)
        path = write_verl_dataset(problems, args.out, agent_name=args.agent_name,
                                  element_type=args.element_type)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(problems)} problems -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
