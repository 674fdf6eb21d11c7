"""Multi-turn episodes: state (turns, best kernel, JSONL) and the concurrent runner."""

from multiminddev.episode.infra import (
    InfraFailure,
    check_episodes,
    episode_infra_message,
    infra_failure,
)
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
    "InfraFailure",
    "Turn",
    "arun_episodes",
    "build_prompt",
    "check_episodes",
    "episode_from_dict",
    "episode_infra_message",
    "episode_to_dict",
    "improves",
    "infra_failure",
    "read_episodes_jsonl",
    "record_turn",
    "result_score",
    "run_episodes",
    "termination",
    "write_episodes_jsonl",
]
