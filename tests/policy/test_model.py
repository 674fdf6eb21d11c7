import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.policy import (
    PolicyConfig,
    PolicyError,
    build_policy,
    build_separate_policy,
    default_model_path,
    load_base_model,
)
from tests.policy.helpers import gguf_tokenizer, require_default_model, tiny_base_model, tiny_policy

G, O = AgentRole.GENERATOR, AgentRole.OPTIMIZER


def _ids():
    return torch.tensor([[1, 9690, 198, 2683, 359, 5356, 2, 198]])


def _logits(model):
    with torch.no_grad():
        return model(input_ids=_ids()).logits


def test_default_model_path_finds_the_embedded_gguf():
    require_default_model()
    path = default_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_gguf_tokenizer_loads_with_chat_template():
    tok = gguf_tokenizer()
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert tok.decode(tok("__global__ void k()", add_special_tokens=False)["input_ids"]) == (
        "__global__ void k()")


def test_real_gguf_model_loads_and_predicts_text():
    require_default_model()
    model = load_base_model(PolicyConfig(model="default", device="cpu"))
    tok = gguf_tokenizer()
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 30
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        next_id = model(input_ids=ids).logits[0, -1].argmax().item()
    assert tok.decode([next_id]).strip() == "Paris"


def test_config_rejects_tester_and_unknown_adapter_roles(tmp_path):
    with pytest.raises(ValueError, match="Tester"):
        PolicyConfig(agents=(AgentRole.TESTER,))
    with pytest.raises(ValueError, match="not in agents"):
        PolicyConfig(agents=(G,), adapter_paths={"optimizer": str(tmp_path)})
    with pytest.raises(ValueError, match="does not exist"):
        PolicyConfig(adapter_paths={"generator": str(tmp_path / "missing")})


def test_qlora_needs_adapters_a_gpu_and_bitsandbytes():
    import importlib.util

    import torch

    from multiminddev.policy.model import four_bit_kwargs

    with pytest.raises(ValueError, match="cannot be fine-tuned in full"):
        PolicyConfig(load_in_4bit=True, separate_models=True)
    with pytest.raises(PolicyError, match="needs a CUDA GPU"):
        four_bit_kwargs("cpu", torch.float32)
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(PolicyError, match="pip install bitsandbytes"):
            four_bit_kwargs("cuda", torch.bfloat16)
    else:
        kwargs = four_bit_kwargs("cuda", torch.bfloat16)
        assert kwargs["quantization_config"].load_in_4bit and kwargs["device_map"] == {"": "cuda"}


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    from multiminddev.policy.model import resolve_model_source

    with pytest.raises(PolicyError, match="does not exist"):
        resolve_model_source(str(tmp_path / "nope.gguf"))


def test_roles_have_different_adapters():
    policy = tiny_policy()
    with policy.use(G) as m:
        gen = _logits(m)
    with policy.use(O) as m:
        opt = _logits(m)
    assert not torch.allclose(gen, opt)


def test_updating_one_adapter_leaves_the_other_unchanged():
    policy = tiny_policy()
    with policy.use(O) as m:
        before = _logits(m)
    optimizer = torch.optim.SGD(policy.trainable_parameters(G), lr=1.0)
    with policy.use(G) as m:
        m.train()
        _logits_grad = m(input_ids=_ids()).logits
        _logits_grad.logsumexp(-1).sum().backward()
    optimizer.step()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters(G))
    with policy.use(O) as m:
        m.eval()
        after = _logits(m)
    assert torch.equal(before, after)


def test_reference_equals_the_frozen_base():
    policy = tiny_policy(seed=3)
    base = tiny_base_model(seed=3)
    with policy.reference() as ref:
        assert torch.allclose(_logits(ref), _logits(base), atol=1e-6)


def test_trainable_parameters_are_the_roles_lora_matrices_only():
    policy = tiny_policy()
    gen = {id(p) for p in policy.trainable_parameters(G)}
    opt = {id(p) for p in policy.trainable_parameters(O)}
    assert gen and opt and not gen & opt
    names = [n for n, p in policy.peft_model.named_parameters() if id(p) in gen]
    assert all("lora_" in n and ".generator." in n for n in names)
    base = [p for n, p in policy.peft_model.named_parameters() if "lora_" not in n]
    assert not any(p.requires_grad for p in base)


def test_save_writes_role_folders_and_load_restores_weights(tmp_path):
    trained = tiny_policy(seed=0)
    trained.save(tmp_path)
    assert (tmp_path / "generator" / "adapter_config.json").exists()
    assert (tmp_path / "optimizer" / "adapter_model.safetensors").exists()
    fresh = tiny_policy(seed=0)
    with torch.no_grad():
        for p in fresh.trainable_parameters(G) + fresh.trainable_parameters(O):
            p.zero_()
    assert sorted(fresh.load_adapters(tmp_path)) == [G, O]
    for role in (G, O):
        with trained.use(role) as a:
            want = _logits(a)
        with fresh.use(role) as b:
            assert torch.allclose(_logits(b), want, atol=1e-6)


def test_build_policy_loads_adapter_paths(tmp_path):
    tiny_policy(seed=0).save(tmp_path)
    cfg = PolicyConfig(lora_rank=4, lora_alpha=8,
                       adapter_paths={"generator": str(tmp_path / "generator")})
    loaded = build_policy(tiny_base_model(0), gguf_tokenizer(), cfg)
    with tiny_policy(seed=0).use(G) as a:
        want = _logits(a)
    with loaded.use(G) as b:
        assert torch.allclose(_logits(b), want, atol=1e-6)


def test_separate_models_give_each_role_its_own_parameters():
    models = {G: tiny_base_model(1), O: tiny_base_model(2)}
    policy = build_separate_policy(models, tiny_base_model(0), gguf_tokenizer(),
                                   PolicyConfig(separate_models=True))
    with policy.use(G) as g, policy.use(O) as o:
        assert g is not o
    assert {id(p) for p in policy.trainable_parameters(G)}.isdisjoint(
        {id(p) for p in policy.trainable_parameters(O)})
    with policy.reference() as ref:
        assert not any(p.requires_grad for p in ref.parameters())


def test_nested_use_restores_the_outer_role():
    policy = tiny_policy()
    with policy.use(G) as m:
        outer = _logits(m)
        with policy.use(O) as inner:
            assert not torch.allclose(_logits(inner), outer)
        assert torch.allclose(_logits(m), outer)


def test_default_model_path_honours_the_environment_override(tmp_path, monkeypatch):
    from multiminddev.policy.model import default_model_path

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("MULTIMINDDEV_DEFAULT_GGUF", str(gguf))
    assert default_model_path() == gguf
    monkeypatch.setenv("MULTIMINDDEV_DEFAULT_GGUF", str(tmp_path / "missing.gguf"))
    assert default_model_path() is None


def _logits_for(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_merged_sampling_model_computes_what_the_adapter_model_computes():
    policy = tiny_policy()
    assert policy.sampler is not None  # on by default for small float bases
    ids = torch.tensor([gguf_tokenizer().encode("Write a kernel for relu")])
    for role in (G, O):
        merged = _logits_for(policy.sampling_model(role), ids)
        with policy.use(role) as model:
            wrapped = _logits_for(model, ids)
        assert torch.allclose(merged, wrapped, atol=1e-5)
    # A training step changes the adapter: the next sampling call sees the new weights.
    with torch.no_grad():
        for p in policy.trainable_parameters(G):
            p.add_(0.05 * torch.randn_like(p))
    with policy.use(G) as model:
        updated = _logits_for(model, ids)
    assert not torch.allclose(updated, _logits_for(policy.sampler, ids))  # before re-merging
    assert torch.allclose(_logits_for(policy.sampling_model(G), ids), updated, atol=1e-5)


def test_sampling_in_another_dtype_uses_a_cast_copy_of_the_merged_weights():
    policy = tiny_policy()  # float32 on the CPU: float64 stands in for "another dtype"
    ids = torch.tensor([gguf_tokenizer().encode("Write a kernel for relu")])
    for role in (G, O):
        cast = policy.sampling_model(role, torch.float64)
        assert cast is not policy.sampler and next(cast.parameters()).dtype == torch.float64
        with policy.use(role) as model:
            wrapped = _logits_for(model, ids)
        assert torch.allclose(_logits_for(cast, ids).float(), wrapped, atol=1e-5)
    assert policy.sampling_model(G, torch.float64) is cast  # one copy, kept
    assert next(policy.sampler.parameters()).dtype == torch.float32  # the sampler is untouched
    assert policy.sampling_model(G, torch.float32) is policy.sampler  # its own dtype: no copy
    with torch.no_grad():  # a training step: the copy is merged again, like the sampler
        for p in policy.trainable_parameters(G):
            p.add_(0.05 * torch.randn_like(p))
    with policy.use(G) as model:
        updated = _logits_for(model, ids)
    assert torch.allclose(_logits_for(policy.sampling_model(G, torch.float64), ids).float(),
                          updated, atol=1e-5)


def test_sampling_in_another_dtype_without_merged_sampling_says_what_to_do():
    from multiminddev.policy.model import PolicyError

    policy = tiny_policy(merged_sampling=False)
    assert policy.sampling_model(G, torch.float32) is policy.model_for(G)  # its own dtype
    with pytest.raises(PolicyError, match="needs merged sampling"):
        policy.sampling_model(G, torch.float64)


def test_merged_sampling_leaves_the_base_and_reference_alone():
    policy = tiny_policy()
    ids = torch.tensor([gguf_tokenizer().encode("def forward(self, x):")])
    with policy.reference() as ref:
        before = _logits_for(ref, ids)
    policy.sampling_model(G)
    policy.sampling_model(O)
    with policy.reference() as ref:
        assert torch.equal(_logits_for(ref, ids), before)


def test_merged_sampling_off_samples_from_the_adapter_model():
    policy = tiny_policy(merged_sampling=False)
    assert policy.sampler is None
    assert policy.sampling_model(G) is policy.model_for(G)
