"""Multi-turn episodes: state (turns, best kernel, JSONL) and the concurrent runner."""

from multiminddev.episode.runner import (
    EpisodeConfig,
    arun_episodes,
    build_prompt,
    improves,
    record_turn,
    result_score,
    run_episodes,
    termination,
)
from multiminddev.episode.state import (
    Episode,
    EpisodeStatus,
    FailedAttempt,
    Turn,
    episode_from_dict,
    episode_to_dict,
    read_episodes_jsonl,
    write_episodes_jsonl,
)

__all__ = [
    "Episode",
    "EpisodeConfig",
    "EpisodeStatus",
    "FailedAttempt",
    "Turn",
    "arun_episodes",
    "build_prompt",
    "episode_from_dict",
    "episode_to_dict",
    "improves",
    "read_episodes_jsonl",
    "record_turn",
    "result_score",
    "run_episodes",
    "termination",
    "write_episodes_jsonl",
]
