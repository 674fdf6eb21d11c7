"""Generator SFT examples from the SakanaAI AI CUDA Engineer archive (``--sft-data sakana:PATH``).

What an example is: the Generator's own prompt for the record's problem (its
``PyTorch_Code_Module``, rendered by ``agents.prompts.generator_messages``) -> a reply that is
one ```python block holding the record's kernel wrapped as a ``load_inline`` ``ModelNew``
module (``loaders.sakana_candidate_source``), the same reply format as the corpus's targets
(``sft_data.assistant_reply``). These examples join the corpus's reference solutions; they
never replace them.

Which records (``select_sakana_records``, a pure function):

- ``Correct`` is true (the archive's own check);
- ``CUDA_Speedup_Native`` is recorded and above ``min_speedup`` (default 0: a measured,
  positive speedup; the archive times only kernels that ran);
- the kernel could be wrapped as a candidate and the reply parses back to it unchanged with
  ``agents.parsing.parse_candidate``;
- per task (``Level_ID``, ``Task_ID``), identical kernels (same ``CUDA_Code`` up to
  whitespace) count once, and at most ``max_per_task`` are kept, the fastest first: the
  archive holds dozens of correct attempts for some tasks and one for others, and a cap keeps
  the former from swamping the SFT data (2 matches the corpus's naive + fast per problem).

Every record left out is counted under its reason (``SakanaSkip``) and logged, so a run says
how much of the archive it used. The Optimizer's SFT data is not changed by this option
(archive pairs for it, slower -> faster kernel, are ``sft_data.sakana_optimizer_examples``).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.prompts import generator_messages
from multiminddev.agents.roles import AgentRole
from multiminddev.tasks.loaders import SakanaRecord, load_sakana_archive
from multiminddev.train.sft_data import GeneratorPrompt, SFTExample, assistant_reply

log = logging.getLogger(__name__)

SAKANA_SFT_PREFIX = "sakana:"
DEFAULT_MAX_PER_TASK = 2


class SakanaSkip(str, enum.Enum):
    """Why an archive record did not become an SFT example."""

    INCORRECT = "not correct in the archive"
    NO_SPEEDUP = "no positive speedup recorded"
    NO_CANDIDATE = "kernel could not be wrapped as a candidate"
    UNPARSABLE = "reply does not parse back as a ModelNew candidate"
    DUPLICATE = "same kernel as one kept for its task"
    OVER_CAP = "over the per-task cap"


def sakana_sft_path(spec: str) -> Path:
    """The archive path of an ``--sft-data`` spec ``sakana:PATH``; raises ``ValueError`` saying
    the fix when the spec has another form or PATH does not exist."""
    if not spec.startswith(SAKANA_SFT_PREFIX) or not spec[len(SAKANA_SFT_PREFIX):].strip():
        raise ValueError(f"--sft-data {spec!r}: give sakana:PATH, PATH the AI CUDA Engineer "
                         "archive's parquet/arrow files or their folder")
    path = Path(spec[len(SAKANA_SFT_PREFIX):].strip())
    if not path.exists():
        raise ValueError(f"--sft-data {spec!r}: {path} does not exist; give the folder or file "
                         "of the archive's parquet dump (level_1.parquet ... level_3.parquet)")
    return path


@dataclass(kw_only=True, frozen=True)
class SakanaSFTData:
    """The examples and, per reason, how many records were left out."""

    examples: tuple[SFTExample, ...]
    skipped: Mapping[SakanaSkip, int] = field(default_factory=dict)
    tasks: int = 0  # distinct tasks with at least one example

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "skipped", MappingProxyType(dict(self.skipped)))

    def summary(self) -> str:
        """One line: what was kept and what was skipped, by reason."""
        kept = f"{len(self.examples)} Generator example(s) from {self.tasks} task(s)"
        if not self.skipped:
            return f"Sakana archive: {kept}"
        why = ", ".join(f"{n} {reason.value}" for reason, n in self.skipped.items())
        return f"Sakana archive: {kept}; skipped {sum(self.skipped.values())} record(s): {why}"


def _kernel_key(cuda_code: str) -> str:
    return re.sub(r"\s+", " ", cuda_code).strip()


def _reason_against(record: SakanaRecord, min_speedup: float) -> SakanaSkip | None:
    if not record.correct:
        return SakanaSkip.INCORRECT
    if record.speedup_native is None or record.speedup_native <= min_speedup:
        return SakanaSkip.NO_SPEEDUP
    if record.candidate_source is None:
        return SakanaSkip.NO_CANDIDATE
    return None


def _parses_back(candidate: str) -> bool:
    parsed = parse_candidate(assistant_reply(candidate))
    return parsed.source is not None and parsed.source.strip() == candidate.strip()


def select_sakana_records(
    records: Iterable[SakanaRecord], *, max_per_task: int = DEFAULT_MAX_PER_TASK,
    min_speedup: float = 0.0,
) -> tuple[list[SakanaRecord], dict[SakanaSkip, int]]:
    """The records that become examples (by task, fastest first, ties by kernel name) and the
    count of the others per reason (in ``SakanaSkip`` order)."""
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
    skipped: dict[SakanaSkip, int] = {}
    by_task: dict[tuple[int, int], list[SakanaRecord]] = {}
    for record in records:
        reason = _reason_against(record, min_speedup)
        if reason is None and not _parses_back(record.candidate_source or ""):
            reason = SakanaSkip.UNPARSABLE
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        by_task.setdefault((record.level, record.task_id), []).append(record)
    kept: list[SakanaRecord] = []
    for key in sorted(by_task):
        ranked = sorted(by_task[key], key=lambda r: (-(r.speedup_native or 0.0), r.kernel_name))
        seen: set[str] = set()
        taken = 0
        for record in ranked:
            kernel = _kernel_key(record.cuda_code or record.candidate_source or "")
            reason = (SakanaSkip.DUPLICATE if kernel in seen
                      else SakanaSkip.OVER_CAP if taken >= max_per_task else None)
            if reason is not None:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            seen.add(kernel)
            kept.append(record)
            taken += 1
    return kept, {r: skipped[r] for r in SakanaSkip if r in skipped}


def sakana_sft_data(
    records: Iterable[SakanaRecord], *, max_per_task: int = DEFAULT_MAX_PER_TASK,
    min_speedup: float = 0.0, prompt: GeneratorPrompt | None = None,
) -> SakanaSFTData:
    """Generator examples (origin ``sakana``, variant the archive's kernel name) from the
    records ``select_sakana_records`` keeps."""
    if prompt is None:
        prompt = generator_messages
    kept, skipped = select_sakana_records(records, max_per_task=max_per_task,
                                          min_speedup=min_speedup)
    examples = [
        SFTExample(role=AgentRole.GENERATOR, problem=r.problem.name, origin="sakana",
                   variant=r.kernel_name,
                   messages=[dict(m) for m in prompt(r.problem)]
                   + [{"role": "assistant", "content": assistant_reply(r.candidate_source or "")}])
        for r in kept
    ]
    data = SakanaSFTData(examples=tuple(examples), skipped=skipped,
                         tasks=len({(r.level, r.task_id) for r in kept}))
    log.info("%s", data.summary())
    return data


def load_sakana_sft_data(spec: str, *, max_per_task: int = DEFAULT_MAX_PER_TASK,
                         min_speedup: float = 0.0) -> SakanaSFTData:
    """``sakana_sft_data`` of the archive an ``--sft-data`` spec names. Only its correct rows
    are read (the loader filters on ``Correct`` before wrapping kernels), so incorrect rows
    are not counted here. Raises ``ValueError`` (``ProblemError``) on a bad spec, a wrong
    schema, or an archive that gives no example."""
    path = sakana_sft_path(spec)
    data = sakana_sft_data(load_sakana_archive(path, correct_only=True),
                           max_per_task=max_per_task, min_speedup=min_speedup)
    if not data.examples:
        raise ValueError(f"--sft-data {spec!r} gives no SFT example: {data.summary()}")
    return data
