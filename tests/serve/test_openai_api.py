"""The OpenAI-compatible routes, through the ``openai`` client library and raw HTTP, against a
real server with the embedded model on the CPU."""

from __future__ import annotations

import asyncio

import httpx
import pytest

PROMPT = "def relu(x):"
CHAT = [{"role": "user", "content": "Write one word."}]


def test_models_lists_the_base_and_each_adapter(client):
    assert [m.id for m in client.models.list().data] == ["base", "generator"]


def test_completion_reports_text_finish_reason_and_usage(client):
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=5, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage.completion_tokens <= 5 and reply.usage.prompt_tokens > 0
    assert choice.text


def test_token_ids_from_logprobs_decode_to_the_text(client, server):
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=6, temperature=0,
                                      logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    logprobs = reply.choices[0].logprobs
    ids = [int(t.removeprefix("token_id:")) for t in logprobs.tokens]
    tokenizer = server.app.state.registry.tokenizer
    assert tokenizer.decode(ids, skip_special_tokens=True) == reply.choices[0].text
    assert len(logprobs.token_logprobs) == len(ids)
    assert all(lp <= 0 for lp in logprobs.token_logprobs)


def test_a_prompt_of_token_ids_answers_as_its_text(client, server):
    ids = server.app.state.registry.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    as_text = client.completions.create(model="base", prompt=PROMPT, max_tokens=6, temperature=0)
    as_ids = client.completions.create(model="base", prompt=ids, max_tokens=6, temperature=0)
    assert as_ids.choices[0].text == as_text.choices[0].text


def test_the_model_field_selects_the_adapter(client):
    def greedy_logprobs(model):
        reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                               temperature=0, logprobs=True)
        return [t.logprob for t in reply.choices[0].logprobs.content]

    assert greedy_logprobs("generator") != pytest.approx(greedy_logprobs("base"), abs=1e-3)


def test_streamed_chat_equals_the_whole_reply(client):
    whole = client.chat.completions.create(model="base", messages=CHAT, max_tokens=8,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model="base", messages=CHAT, max_tokens=8,
                                                 temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_streamed_completion_ends_with_done(server):
    body = {"model": "base", "prompt": PROMPT, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_adapters_load_and_unload_live(client, server, adapter_dir):
    url = server.url
    loaded = httpx.post(f"{url}/v1/load_lora_adapter",
                        json={"lora_name": "fresh", "lora_path": str(adapter_dir)}, timeout=120)
    assert loaded.status_code == 200
    assert "fresh" in [m.id for m in client.models.list().data]
    client.completions.create(model="fresh", prompt=PROMPT, max_tokens=2)
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "fresh"}, timeout=60)
    assert gone.status_code == 200
    after = httpx.post(f"{url}/v1/completions", json={"model": "fresh", "prompt": PROMPT},
                       timeout=60)
    assert after.status_code == 404


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", {"prompt": PROMPT}, 400),  # no model
    ("/v1/completions", {"model": "base", "prompt": PROMPT, "max_tokens": -1}, 400),
    ("/v1/completions", {"model": "base", "prompt": PROMPT, "max_tokens": 10**6}, 400),
    ("/v1/completions", {"model": "nope", "prompt": PROMPT}, 404),
    ("/v1/completions", {"model": "base", "prompt": [], "max_tokens": 2}, 400),
    ("/v1/completions", {"model": "base", "prompt": [10**9], "max_tokens": 2}, 400),
    ("/v1/chat/completions", {"model": "base", "messages": CHAT, "stream": True,
                              "logprobs": True}, 400),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/dir"}, 403),
    ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, 404),
])
def test_bad_requests_get_a_4xx_with_a_one_line_message(server, path, body, status):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}
    reply = httpx.post(server.url + path, timeout=60, **kwargs)
    assert reply.status_code == status
    message = reply.json()["error"]["message"]
    assert message and "\n" not in message


def test_concurrent_requests_share_a_batch_and_get_their_own_replies(server):
    body = {"model": "base", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    alone = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    batcher = server.app.state.batcher
    before = batcher.batches

    async def send_four():
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json=body)
                                          for _ in range(4)))

    replies = asyncio.run(send_four())
    assert [r.json()["choices"][0]["text"] for r in replies] == [alone["choices"][0]["text"]] * 4
    assert batcher.batches - before < 4


def test_fifty_concurrent_requests_with_malformed_ones_are_all_answered(server):
    good = {"model": "base", "prompt": PROMPT, "max_tokens": 1}
    bad = [b"{", {"model": "base"}, {"model": "base", "prompt": PROMPT, "n": 999},
           {"model": "nope", "prompt": PROMPT}, {"model": "base", "prompt": PROMPT, "top_p": 0}]
    bodies = [bad[i % len(bad)] if i % 3 == 0 else good for i in range(50)]

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            async def one(body):
                if isinstance(body, bytes):
                    return await http.post("/v1/completions", content=body,
                                           headers={"content-type": "application/json"})
                return await http.post("/v1/completions", json=body)
            return await asyncio.gather(*(one(b) for b in bodies))

    replies = asyncio.run(send_all())
    codes = [r.status_code for r in replies]
    assert all(c == 200 for c, b in zip(codes, bodies) if b is good)
    assert all(400 <= c < 500 for c, b in zip(codes, bodies) if b is not good)
    assert httpx.get(f"{server.url}/health", timeout=30).json()["ready"] is True
