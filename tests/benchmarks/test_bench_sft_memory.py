"""benchmarks/bench_sft_memory.py: what it measures on, and its refusal without a GPU (the
measurement itself runs on a GPU: benchmarks/run_gpu_suite.sh, part bench-sft-memory)."""

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_sft_memory")


def test_longest_examples_are_sfts_own_longest_tokenized_examples(bench):
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.sft import IGNORE_INDEX, collate_examples
    from tests.policy.helpers import gguf_tokenizer

    tokenizer = gguf_tokenizer()
    problems = load_problems("builtin:relu+builtin:cumsum")
    from multiminddev.train.sft import tokenize_chat
    from multiminddev.train.sft_data import sft_examples

    every = [tokenize_chat(tokenizer, e.messages, 2048)
             for e in sft_examples(AgentRole.OPTIMIZER, problems, strip_comments=True)]
    longest = bench.longest_examples(tokenizer, AgentRole.OPTIMIZER, problems, 3, 2048)
    lengths = [len(e["input_ids"]) for e in longest]
    assert len(longest) == 3 and lengths == sorted(lengths, reverse=True)
    assert lengths[-1] >= max(len(e["input_ids"]) for e in every if e not in longest)
    # the two collations it compares: same labels where logits are kept, fewer positions cut
    full = collate_examples(tokenizer.eos_token_id)(longest)
    cut = collate_examples(tokenizer.eos_token_id, logits_from_labels=True)(longest)
    keep = cut["logits_to_keep"]
    assert 0 < keep < full["input_ids"].shape[1]
    assert (cut["labels"] == full["labels"][:, -keep:]).all()
    assert (full["labels"][:, :-keep] == IGNORE_INDEX).all()


def test_without_a_gpu_it_says_where_to_run(bench, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmark would run")
    assert bench.main(["--batch", "4"]) == 2
    assert "run it on a machine with a CUDA GPU" in capsys.readouterr().err
