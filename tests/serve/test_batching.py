"""serve.batching.Batcher: which waiting requests share a generate call."""

from __future__ import annotations

import asyncio
import threading

from multiminddev.policy.generation import FinishReason, GenerationOutput, SamplingParams
from multiminddev.serve.batching import Batcher


class RecordingRegistry:
    """The registry's ``generate`` as the batcher calls it: records each call's prompts and
    answers every prompt with its own first token, after ``seconds`` of decoding."""

    def __init__(self, seconds: float = 0.05):
        self.calls: list[list[list[int]]] = []
        self.seconds = seconds
        self._lock = threading.Lock()

    def generate(self, prompts, sampling, model):
        import time

        with self._lock:
            self.calls.append(prompts)
        time.sleep(self.seconds)
        return [GenerationOutput(prompt_index=i, token_ids=[p[0]], logprobs=[0.0], text=str(p[0]),
                                 finish_reason=FinishReason.LENGTH)
                for i, p in enumerate(prompts) for _ in range(sampling.n)]


async def _burst(batcher: Batcher, gap_s: float, count: int = 4) -> list[list[int]]:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=1)
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(batcher.generate([[i]], sampling, "base")))
        await asyncio.sleep(gap_s)
    outputs = await asyncio.gather(*tasks)
    await batcher.close()
    return [[o.token_ids[0] for o in out] for out in outputs]


def test_a_burst_that_finds_the_model_idle_shares_one_call():
    registry = RecordingRegistry()
    replies = asyncio.run(_burst(Batcher(registry, 16, batch_wait_s=0.2), gap_s=0.01))
    assert replies == [[0], [1], [2], [3]]  # each request gets its own output
    assert registry.calls == [[[0], [1], [2], [3]]]


def test_without_a_wait_the_first_request_of_a_burst_decodes_alone():
    registry = RecordingRegistry()
    replies = asyncio.run(_burst(Batcher(registry, 16, batch_wait_s=0.0), gap_s=0.01))
    assert replies == [[0], [1], [2], [3]]
    assert registry.calls[0] == [[0]] and len(registry.calls) >= 2


def test_a_batch_never_exceeds_the_largest_size():
    registry = RecordingRegistry()
    asyncio.run(_burst(Batcher(registry, 3, batch_wait_s=0.2), gap_s=0.0, count=7))
    assert [len(c) for c in registry.calls] == [3, 3, 1]
