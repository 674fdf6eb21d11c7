import asyncio
import threading

import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import (
    FinishReason,
    GenerationBackend,
    HFGenerationBackend,
    LogprobSource,
    SamplingParams,
    encode_chat,
    token_logprobs,
)
from tests.policy.helpers import tiny_policy

G = AgentRole.GENERATOR


@pytest.fixture(scope="module")
def policy():
    return tiny_policy()


def _prompts(policy):
    tok = policy.tokenizer
    return [encode_chat(tok, [{"role": "user", "content": "hi"}]),
            encode_chat(tok, [{"role": "user", "content": "write a relu kernel in CUDA please"}])]


def _rescore(policy, role, prompt, tokens):
    ids = torch.tensor([prompt + tokens], device=policy.device)
    with torch.no_grad(), policy.use(role) as model:
        return token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].cpu()


def test_sampling_params_validate():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("",))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_hf_backend_satisfies_the_protocol(policy):
    assert isinstance(HFGenerationBackend(policy), GenerationBackend)


def test_returns_n_samples_per_prompt_grouped_by_prompt(policy):
    backend = HFGenerationBackend(policy, max_batch_size=3)
    outs = backend.generate_sync(_prompts(policy), SamplingParams(max_new_tokens=6, n=2, seed=0), G)
    assert [o.prompt_index for o in outs] == [0, 0, 1, 1]
    for o in outs:
        assert 1 <= len(o.token_ids) <= 6 and len(o.logprobs) == len(o.token_ids)
        assert o.text == policy.tokenizer.decode(o.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("source", list(LogprobSource))
def test_returned_logprobs_match_rescoring_at_temperature_one(policy, source):
    backend = HFGenerationBackend(policy, max_batch_size=4, logprob_source=source)
    prompts = _prompts(policy)
    outs = backend.generate_sync(prompts, SamplingParams(max_new_tokens=12, n=2, seed=1), G)
    for o in outs:
        want = _rescore(policy, G, prompts[o.prompt_index], o.token_ids)
        assert torch.allclose(torch.tensor(o.logprobs), want, atol=1e-4)


def test_logprobs_are_those_of_the_temperature_scaled_distribution(policy):
    backend = HFGenerationBackend(policy)
    prompt = _prompts(policy)[1]
    out = backend.generate_sync([prompt], SamplingParams(max_new_tokens=8, temperature=0.5, seed=2), G)[0]
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad(), policy.use(G) as model:
        want = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.5)[0, len(prompt):]
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)


def test_generation_uses_the_roles_adapter(policy):
    backend = HFGenerationBackend(policy)
    prompt = _prompts(policy)[0]
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0)
    gen = backend.generate_sync([prompt], sampling, AgentRole.GENERATOR)[0]
    opt = backend.generate_sync([prompt], sampling, AgentRole.OPTIMIZER)[0]
    assert gen.token_ids != opt.token_ids


def test_stop_strings_end_the_text(policy):
    backend = HFGenerationBackend(policy)
    outs = backend.generate_sync(_prompts(policy), SamplingParams(max_new_tokens=40, stop=("e",), seed=3), G)
    for o in outs:
        if o.finish_reason is FinishReason.STOP:
            assert "e" in o.text
            assert "e" not in policy.tokenizer.decode(o.token_ids[:-1], skip_special_tokens=True)
        else:
            assert "e" not in o.text
    assert any(o.finish_reason is FinishReason.STOP for o in outs)


def test_length_limit_is_reported(policy):
    backend = HFGenerationBackend(policy)
    out = backend.generate_sync(_prompts(policy)[:1], SamplingParams(max_new_tokens=3, seed=4), G)[0]
    stops = backend.stop_token_ids
    assert policy.tokenizer.eos_token_id in stops
    if out.finish_reason is FinishReason.LENGTH:
        assert len(out.token_ids) == 3 and not set(out.token_ids) & set(stops)
    else:
        assert out.finish_reason is FinishReason.EOS and out.token_ids[-1] in stops


def test_seeded_sampling_is_reproducible_and_async_works(policy):
    backend = HFGenerationBackend(policy)
    sampling = SamplingParams(max_new_tokens=8, seed=5)
    prompts = _prompts(policy)
    a = asyncio.run(backend.generate(prompts, sampling, G))
    b = backend.generate_sync(prompts, sampling, G)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert backend.tokens_generated == 2 * sum(len(o.token_ids) for o in a)


@pytest.mark.gpu
def test_embedded_model_generates_on_the_gpu_in_bfloat16():
    from multiminddev.policy import PolicyConfig, load_policy
    from tests.policy.helpers import require_default_model

    require_default_model()
    policy = load_policy(PolicyConfig(model="default"))
    assert policy.device.type == "cuda"
    assert next(policy.peft_model.parameters()).dtype == torch.bfloat16
    backend = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER)
    prompt = encode_chat(policy.tokenizer, [{"role": "user", "content": "Write a CUDA relu kernel."}])
    outs = backend.generate_sync([prompt] * 4, SamplingParams(max_new_tokens=64, seed=0), G)
    for o in outs:
        assert o.token_ids and len(o.logprobs) == len(o.token_ids)
        want = _rescore(policy, G, prompt, o.token_ids)
        # bf16: KV-cache sampling and a full forward differ slightly; the mean must agree
        assert abs(float(torch.tensor(o.logprobs).mean() - want.mean())) < 0.05


def test_decode_buckets_pad_rows_to_a_power_of_two_and_width_to_the_bucket():
    from multiminddev.policy.generation import PROMPT_WIDTH_BUCKET, decode_buckets

    assert decode_buckets(1, 1) == (1, PROMPT_WIDTH_BUCKET)
    assert decode_buckets(3, PROMPT_WIDTH_BUCKET) == (4, PROMPT_WIDTH_BUCKET)
    assert decode_buckets(16, PROMPT_WIDTH_BUCKET + 1) == (16, 2 * PROMPT_WIDTH_BUCKET)
    assert decode_buckets(39, 900) == (64, 1024)


def test_compiled_decoding_splits_batches_above_the_row_cap(monkeypatch):
    from multiminddev.policy import generation

    monkeypatch.setattr(generation, "COMPILED_DECODING_MAX_ROWS", 2)
    policy = tiny_policy(compiled_decoding=True, fast_decoding=False)
    backend = HFGenerationBackend(policy, max_batch_size=64)
    shapes = []
    real = backend._generate_batch
    monkeypatch.setattr(backend, "_generate_batch",
                        lambda model, chunk, *a: shapes.append(len(chunk)) or real(model, chunk, *a))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    got = backend.generate_sync(_three_prompts(policy), greedy, G)
    assert shapes == [2, 1] and [o.prompt_index for o in got] == [0, 1, 2]
    want = HFGenerationBackend(tiny_policy(), max_batch_size=64).generate_sync(
        _three_prompts(policy), greedy, G)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def _three_prompts(policy):
    tok = policy.tokenizer
    return _prompts(policy) + [encode_chat(tok, [{"role": "user", "content": "a b c d e f g"}])]


@pytest.mark.parametrize("source", list(LogprobSource))
def test_compiled_decoding_padding_leaves_greedy_outputs_unchanged(source):
    # On the CPU the static cache runs without compiling: this checks the padded batch (3 -> 4
    # rows, prompts widened to the bucket) gives each prompt what plain decoding gives it.
    eager, padded = tiny_policy(), tiny_policy(compiled_decoding=True, fast_decoding=False)
    prompts = _three_prompts(eager)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    want = HFGenerationBackend(eager, logprob_source=source).generate_sync(prompts, greedy, G)
    backend = HFGenerationBackend(padded, logprob_source=source)
    assert backend.compiled_decoding
    got = backend.generate_sync(prompts, greedy, G)
    assert [o.prompt_index for o in got] == [0, 1, 2]
    for a, b in zip(want, got):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_compiled_generates_all_run_in_one_thread_whoever_calls(monkeypatch):
    import threading

    from multiminddev.policy.generation import DECODE_THREAD_NAME

    backend = HFGenerationBackend(tiny_policy(compiled_decoding=True, fast_decoding=False))
    threads = []
    real = backend._generate_batch
    monkeypatch.setattr(backend, "_generate_batch", lambda *a: threads.append(
        threading.current_thread().name) or real(*a))
    prompts = _three_prompts(backend.policy)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=3)
    first = backend.generate_sync(prompts, greedy, G)  # from the main thread
    other = []
    caller = threading.Thread(target=lambda: other.append(backend.generate_sync(prompts, greedy, G)))
    caller.start()
    caller.join()
    both = asyncio.run(backend.generate(prompts, greedy, G))  # from an event-loop worker thread
    assert len(set(threads)) == 1 and threads[0].startswith(DECODE_THREAD_NAME)
    assert [o.token_ids for o in first] == [o.token_ids for o in other[0]] == [
        o.token_ids for o in both]


def test_a_backend_can_decode_eagerly_for_a_compiled_policy_and_the_reverse(monkeypatch):
    from multiminddev.policy import generation

    # held-out evaluations decode eagerly while rollouts stay compiled: the static-cache path
    # must then never be taken
    def no_static_cache(device):
        raise AssertionError("eager decoding asked for the static cache")

    compiled_policy = tiny_policy(compiled_decoding=True, fast_decoding=False)
    prompts = _three_prompts(compiled_policy)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    want = HFGenerationBackend(tiny_policy()).generate_sync(prompts, greedy, G)
    with monkeypatch.context() as m:
        m.setattr(generation, "_static_cache_kwargs", no_static_cache)
        eager = HFGenerationBackend(compiled_policy, compiled_decoding=False)
        assert not eager.compiled_decoding
        got = eager.generate_sync(prompts, greedy, G)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert HFGenerationBackend(tiny_policy(), compiled_decoding=True).compiled_decoding
    assert HFGenerationBackend(compiled_policy).compiled_decoding  # None: the policy's setting


@pytest.mark.parametrize("fast", [False, True])
def test_a_backend_can_sample_in_another_dtype(fast):
    policy = tiny_policy()
    prompts = _three_prompts(policy)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    want = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER).generate_sync(
        prompts, greedy, G)
    backend = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER,
                                  sampling_dtype=torch.float64, fast_decoding=fast)
    got = backend.generate_sync(prompts, greedy, G)
    if fast:  # decoded by the fast decoder over float64 copies of the weights
        assert backend._engine.decoder.dtype == torch.float64
        assert [o.extra.get("decoder") for o in got] == ["fast"] * 3
    else:  # decoded by the float64 copy of the merged model
        assert torch.float64 in policy._cast_samplers
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(want, got):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_a_failing_compiled_generate_falls_back_to_eager_decoding(monkeypatch, caplog):
    from multiminddev.policy import generation

    # transformers refuses an unknown cache implementation: the same path as a compile error
    monkeypatch.setattr(generation, "_static_cache_kwargs",
                        lambda device: {"cache_implementation": "no-such-cache"})
    policy = tiny_policy(compiled_decoding=True, fast_decoding=False)
    prompts = _three_prompts(policy)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    backend = HFGenerationBackend(policy)
    with caplog.at_level("WARNING"):
        got = backend.generate_sync(prompts, greedy, G)
    assert not backend.compiled_decoding
    assert "compiled decoding failed" in caplog.text
    assert any(r.exc_info for r in caplog.records)  # with its traceback, to find the cause
    want = HFGenerationBackend(tiny_policy()).generate_sync(prompts, greedy, G)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


@pytest.mark.gpu
def test_compiled_decoding_on_the_gpu_matches_eager_decoding():
    from multiminddev.policy import PolicyConfig, load_policy
    from tests.policy.helpers import require_default_model

    require_default_model()
    policy = load_policy(PolicyConfig(model="default"))
    prompts = [encode_chat(policy.tokenizer, [{"role": "user", "content": text}])
               for text in ("Write a CUDA relu kernel.", "Write a CUDA add kernel for two tensors.",
                            "Explain what a warp is.")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    want = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER).generate_sync(
        prompts, greedy, G)
    policy.config.compiled_decoding = True
    backend = HFGenerationBackend(policy, logprob_source=LogprobSource.SAMPLER)
    got = backend.generate_sync(prompts, greedy, G)
    assert backend.compiled_decoding, "the compiled path fell back to eager decoding"
    for a, b in zip(want, got):
        # bf16 kernels of a compiled graph round differently: greedy paths may part late, and
        # bf16 logits of magnitude 16-32 are 0.125 apart, so single log-probs move by ~0.15
        # (seen on an H100); their mean over the shared prefix must agree
        assert a.token_ids[:8] == b.token_ids[:8]
        want_lp, got_lp = torch.tensor(a.logprobs[:8]), torch.tensor(b.logprobs[:8])
        assert torch.allclose(want_lp, got_lp, atol=0.3)
        assert abs(float(want_lp.mean() - got_lp.mean())) < 0.05


def test_generation_stops_at_the_chat_templates_end_of_turn_even_when_eos_names_another_token():
    # One transformers version read SmolLM2's GGUF EOS as <|im_start|>: the model wrote
    # <|im_end|> and generation ran on to the length limit. A model that always writes
    # <|im_end|> must stop after one token whatever the tokenizer calls EOS.
    import copy

    from multiminddev.policy import PolicyConfig, build_policy
    from tests.policy.helpers import gguf_tokenizer, tiny_base_model

    tokenizer = copy.deepcopy(gguf_tokenizer())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|im_start|>"
    assert tokenizer.eos_token_id != im_end
    base = tiny_base_model(3)
    head = torch.nn.Linear(base.lm_head.in_features, base.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(base.lm_head.weight)
        head.bias.zero_()
        head.bias[im_end] = 1e4
    base.lm_head = head
    policy = build_policy(base, tokenizer, PolicyConfig(model="default", lora_rank=4, lora_alpha=8))
    backend = HFGenerationBackend(policy)
    assert im_end in backend.stop_token_ids
    out = backend.generate_sync(_prompts(policy)[:1], SamplingParams(max_new_tokens=8, seed=0), G)[0]
    assert out.token_ids == [im_end] and out.finish_reason is FinishReason.EOS
    assert out.text == "" and len(out.logprobs) == 1


def test_release_compiled_decoding_resets_graphs_in_the_decoding_thread_and_ends_it(monkeypatch):
    # CUDA graph trees are per thread, so the reset must run in the decoding thread itself
    from multiminddev.policy import release_compiled_decoding
    from multiminddev.policy.generation import DECODE_THREAD_NAME, _decode_executor

    release_compiled_decoding()  # whatever an earlier test left
    assert release_compiled_decoding() is False  # nothing to free
    reset_threads = []
    monkeypatch.setattr(torch._dynamo, "reset",
                        lambda: reset_threads.append(threading.current_thread().name))
    executor = _decode_executor()
    worker = executor.submit(threading.current_thread).result()
    assert release_compiled_decoding() is True
    assert len(reset_threads) == 1 and reset_threads[0].startswith(DECODE_THREAD_NAME)
    assert not worker.is_alive()
    with pytest.raises(RuntimeError):  # shut down: no more work goes to it
        executor.submit(int)
    fresh = _decode_executor()  # a later compiled generate gets a new thread
    assert fresh is not executor and fresh.submit(int, "7").result() == 7
    assert release_compiled_decoding() is True


def test_release_compiled_decoding_does_not_wait_forever_on_a_stuck_decoding_thread(monkeypatch,
                                                                                      caplog):
    from multiminddev.policy import generation

    generation.release_compiled_decoding()
    monkeypatch.setattr(generation, "RELEASE_TIMEOUT_S", 0.2)
    unblock = threading.Event()
    generation._decode_executor().submit(unblock.wait, 30)  # a generate that does not end
    try:
        with caplog.at_level("WARNING", logger=generation.__name__):
            assert generation.release_compiled_decoding() is True
        assert "could not reset" in caplog.text
    finally:
        unblock.set()
