import copy

from multiminddev.policy.chat import encode_chat, end_of_turn_ids
from tests.policy.helpers import gguf_tokenizer


def test_end_of_turn_is_the_token_the_template_writes_after_a_reply():
    tokenizer = gguf_tokenizer()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_ids(tokenizer) == (im_end,)  # SmolLM2: EOS is <|im_end|> itself


def test_end_of_turn_keeps_eos_and_adds_the_templates_token_when_they_differ():
    tokenizer = copy.deepcopy(gguf_tokenizer())
    tokenizer.eos_token = "<|im_start|>"
    assert end_of_turn_ids(tokenizer) == (tokenizer.convert_tokens_to_ids("<|im_start|>"),
                                          tokenizer.convert_tokens_to_ids("<|im_end|>"))


def test_without_a_chat_template_only_eos_ends_a_turn():
    tokenizer = copy.deepcopy(gguf_tokenizer())
    tokenizer.chat_template = None
    assert end_of_turn_ids(tokenizer) == (tokenizer.eos_token_id,)
    ids = encode_chat(tokenizer, [{"role": "user", "content": "hi"}])
    assert tokenizer.decode(ids).endswith("ASSISTANT:\n")
