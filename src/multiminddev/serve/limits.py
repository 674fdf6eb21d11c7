"""The server's request limits in one place: the API checks every request against them, the
web page reads them from ``GET /health`` (``limits``) to bound its inputs, and every value out
of range is answered 400 with an OpenAI error object naming the field (``param``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MAX_N = 16  # choices (n x prompts) per completion request


class LimitError(ValueError):
    """A request value outside the server's limits; ``param`` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_job_turns: int
    max_tokens: int  # max_tokens of a completion and max_new_tokens of a job's turn
    max_module_bytes: int
    max_n: int = MAX_N

    def check_job(self, turns: int, max_new_tokens: int) -> None:
        check_range("turns", turns, self.max_job_turns)
        check_range("max_new_tokens", max_new_tokens, self.max_tokens)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_range(param: str, value: int, limit: int) -> None:
    """``value`` in ``1..limit``, else a LimitError saying the range."""
    if not 1 <= value <= limit:
        raise LimitError(param, f"{param} {value} is outside this server's range 1..{limit}")
