"""Entry point of a ``load_inline`` build process (``inline_build_process.child_main``):
``python -m multiminddev.env.inline_build_child <private dir>`` with the job on stdin."""

from __future__ import annotations

from typing import Any

from multiminddev.env import inline_build
from multiminddev.env.inline_build_process import child_main


def build_job(args: dict[str, Any]) -> dict[str, Any]:
    return inline_build.build_extension(args["spec"], args["cache_root"], args["arch"])


if __name__ == "__main__":
    child_main(build_job)
