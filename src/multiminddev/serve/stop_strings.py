"""Stop strings as OpenAI and vLLM apply them: the text a client gets ends before the first
stop string, which is left out (the tokens and log-probs still hold every sampled token).

Streaming holds back the end of the text that could still grow into a stop string, so no
chunk ever carries part of one.
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``(text before the earliest stop string, whether one was found)``."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if not found:
        return text, False
    return text[:min(found)], True


def safe_length(text: str, stops: Sequence[str]) -> int:
    """How much of ``text`` (which holds no whole stop string) can be sent: all but its
    longest suffix that is a proper prefix of a stop string."""
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return len(text) - held
