"""A replay backend: serves fixed replies through the GenerationBackend protocol, so runner
tests can drive known candidates (compile errors, hacks, valid kernels) through the real
evaluator. Logprobs are 0: these replies were not sampled from a model."""

from __future__ import annotations

from collections.abc import Callable

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import FinishReason, GenerationOutput, SamplingParams
from multiminddev.tasks.problem import load_problem_source

RELU_PROBLEM = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
'''

RELU_KERNEL = '''import torch
import torch.nn as nn
from multiminddev.cuda import compile_kernels

kernels = compile_kernels(r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
""")

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        kernels.relu(grid=((n + 255) // 256,), block=(256,), args=(x, y, n))
        return y
'''
BROKEN_KERNEL = RELU_KERNEL.replace("fmaxf(x[i], 0.0f);", "fmaxf(x[i], 0.0f)")
HACK_KERNEL = RELU_KERNEL.replace("        return y\n", "        return torch.relu(x)\n")


def relu_problem(name: str = "relu"):
    return load_problem_source(RELU_PROBLEM, name=name)


def fenced(source: str) -> str:
    return f"Here is the kernel:\n```python\n{source}```\n"


class ReplayBackend:
    """``reply(role, call_index, prompt_index) -> text`` decides each reply."""

    def __init__(self, tokenizer, reply: Callable[[AgentRole, int, int], str]):
        self.tokenizer = tokenizer
        self.reply = reply
        self.calls: list[tuple[AgentRole, int]] = []  # (role, number of prompts) per call
        self.samplings: list[SamplingParams] = []  # the sampling parameters of each call

    async def generate(self, prompts, sampling: SamplingParams, role: AgentRole):
        call = len(self.calls)
        self.calls.append((role, len(prompts)))
        self.samplings.append(sampling)
        outs = []
        for i, _ in enumerate(prompts):
            text = self.reply(role, call, i)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            outs.append(GenerationOutput(token_ids=ids, logprobs=[0.0] * len(ids), text=text,
                                         finish_reason=FinishReason.EOS, prompt_index=i))
        return outs
