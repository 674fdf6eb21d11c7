import torch

from multiminddev.policy import token_logprobs
from tests.policy.helpers import tiny_base_model


def _reference(model, ids, temperature=1.0):
    """Straightforward loop: one forward per sequence, log_softmax, gather token by token."""
    out = torch.zeros(ids.shape)
    with torch.no_grad():
        for b in range(ids.shape[0]):
            logits = model(input_ids=ids[b : b + 1]).logits[0].float() / temperature
            logp = torch.log_softmax(logits, dim=-1)
            for t in range(1, ids.shape[1]):
                out[b, t] = logp[t - 1, ids[b, t]]
    return out


def test_token_logprobs_matches_a_reference_loop():
    model = tiny_base_model()
    ids = torch.randint(3, 1000, (3, 9))
    with torch.no_grad():
        got = token_logprobs(model, ids, torch.ones_like(ids), chunk_rows=2)
    assert got.shape == ids.shape and got.dtype == torch.float32
    assert torch.allclose(got, _reference(model, ids), atol=1e-5)


def test_temperature_scales_the_logits():
    model = tiny_base_model()
    ids = torch.randint(3, 1000, (2, 7))
    with torch.no_grad():
        got = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.5)
    assert torch.allclose(got, _reference(model, ids, temperature=0.5), atol=1e-5)


def test_left_padding_does_not_change_a_sequences_logprobs():
    model = tiny_base_model()
    seq = torch.randint(3, 1000, (1, 6))
    padded = torch.cat([torch.full((1, 3), 2), seq], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        alone = token_logprobs(model, seq, torch.ones_like(seq))
        both = token_logprobs(model, padded, mask)
    assert torch.allclose(both[0, 3:], alone[0], atol=1e-5)
    assert torch.all(both[0, :3] == 0)


def test_gradients_flow_through_token_logprobs():
    model = tiny_base_model()
    ids = torch.randint(3, 1000, (1, 5))
    token_logprobs(model, ids, torch.ones_like(ids)).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
