"""OpenAI semantics of the parameters docs/serving.md lists, checked through the ``openai``
client against a real server with the embedded model on the CPU."""

from __future__ import annotations

import httpx
import pytest

PROMPT = "1, 2, 3,"
CHAT = [{"role": "user", "content": "Count from 1 to 10."}]


def _stop_inside(text: str) -> str:
    """A stop string that occurs in the middle of ``text`` (its 4th non-blank character)."""
    visible = [c for c in text if not c.isspace()]
    assert len(visible) >= 6, f"the model wrote too little to test stop strings: {text!r}"
    return visible[3]


def test_a_completion_ends_before_its_stop_string(client):
    whole = client.completions.create(model="base", prompt=PROMPT, max_tokens=12,
                                      temperature=0).choices[0].text
    stop = _stop_inside(whole)
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=12,
                                      temperature=0, stop=[stop]).choices[0]
    assert reply.text == whole[:whole.index(stop)]
    assert reply.finish_reason == "stop"


def test_a_chat_reply_ends_before_its_stop_string(client):
    whole = client.chat.completions.create(model="base", messages=CHAT, max_tokens=12,
                                           temperature=0).choices[0].message.content
    stop = _stop_inside(whole)
    reply = client.chat.completions.create(model="base", messages=CHAT, max_tokens=12,
                                           temperature=0, stop=stop).choices[0]
    assert reply.message.content == whole[:whole.index(stop)]
    assert reply.finish_reason == "stop"


def test_a_stream_never_sends_its_stop_string(client):
    whole = client.completions.create(model="base", prompt=PROMPT, max_tokens=12,
                                      temperature=0).choices[0].text
    stop = _stop_inside(whole)
    chunks = list(client.completions.create(model="base", prompt=PROMPT, max_tokens=12,
                                            temperature=0, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole[:whole.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_bounds_the_completion_tokens(client):
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"


def test_n_gives_n_choices_indexed_in_order(client):
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=3, n=3,
                                      temperature=1.0, seed=1)
    assert [c.index for c in reply.choices] == [0, 1, 2]


def test_a_seed_repeats_a_sample(client):
    def sample():
        return client.completions.create(model="base", prompt=PROMPT, max_tokens=8,
                                         temperature=1.0, seed=7).choices[0].text
    assert sample() == sample()


def test_logprobs_cover_every_token(client):
    reply = client.completions.create(model="base", prompt=PROMPT, max_tokens=4, temperature=0,
                                      logprobs=1)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == reply.usage.completion_tokens


def test_errors_raise_the_clients_own_exceptions(client):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=1)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="base", prompt=PROMPT, max_tokens=-1)
    assert bad.value.body["param"] == "max_tokens"


def test_error_objects_have_openais_four_fields(server):
    reply = httpx.post(f"{server.url}/v1/completions", json={"model": "base", "prompt": PROMPT,
                                                             "n": 999}, timeout=60)
    assert reply.status_code == 400
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
