"""sft_keep: SFT adapters and records packed into chunks and put back, byte for byte."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def keep():
    return load_script("sft_keep")


def _seed_with_sft(tmp_path, seed):
    """A seed folder as bench_learning leaves it: real LoRA adapters of a tiny policy, a
    partial.json with SFT and GRPO stages, and a trainer folder that is not kept."""
    from multiminddev.agents.roles import AgentRole
    from multiminddev.train import checkpoints as ck
    from tests.policy.helpers import tiny_policy

    seed_dir = tmp_path / "learning" / f"seed{seed}"
    ck.save_agents(tiny_policy(seed), (AgentRole.GENERATOR, AgentRole.OPTIMIZER),
                   seed_dir / "sft_checkpoints")
    (seed_dir / "sft_checkpoints" / "generator" / "trainer").mkdir(parents=True, exist_ok=True)
    (seed_dir / "sft_checkpoints" / "generator" / "trainer" / "optimizer.pt").write_bytes(b"x")
    row = {"problem": "relu_4096", "compiled": True, "correct": True, "speedup": 1.1, "reward": 0.7}
    (seed_dir / "partial.json").write_text(json.dumps({
        "seed": seed, "sft_problems": "builtin:tier0:train", "sft_recipe": {"steps": 300},
        "sft_losses": {"generator": {"after": 0.01}}, "eval_settings": {"device": "H100"},
        "base_from_seed": 0,
        "rows": {"base": [row], "sft": [row], "train_sft": [row], "select@0": [row],
                 "select@4": [row], "grpo": [row]},
        "seconds": {"sft": 250.0, "eval_sft": 170.0, "eval_select@0": 80.0, "grpo": 400.0,
                    "eval_grpo": 170.0, "eval_base": 200.0}}))
    return seed_dir


def test_pack_and_restore_give_back_the_adapters_and_the_sft_record(keep, tmp_path):
    seeds = [_seed_with_sft(tmp_path, s) for s in (0, 1)]
    chunks = keep.pack(tmp_path / "learning", tmp_path / "keep", [0, 1], chunk_bytes=64 * 1024)
    assert len(chunks) > 2 and [c.name for c in chunks][:2] == ["sft.tar.part_aa", "sft.tar.part_ab"]
    assert all(c.stat().st_size <= 64 * 1024 for c in chunks)
    assert keep.restore(tmp_path / "keep", tmp_path / "fresh") == ["seed0", "seed1"]
    for seed_dir in seeds:
        back = tmp_path / "fresh" / seed_dir.name
        for role in keep.ROLES:
            for name in keep.ADAPTER_FILES:
                path = f"sft_checkpoints/{role}/{name}"
                assert (back / path).read_bytes() == (seed_dir / path).read_bytes()
        assert not (back / "sft_checkpoints" / "generator" / "trainer").exists()
        record = json.loads((back / "partial.json").read_text())
        assert sorted(record["rows"]) == ["select@0", "sft", "train_sft"]  # no GRPO, no base
        assert record["seconds"] == {"sft": 250.0, "eval_sft": 170.0, "eval_select@0": 80.0}
        assert record["sft_recipe"] == {"steps": 300} and record["eval_settings"] == {"device": "H100"}
        assert "base_from_seed" not in record  # the base is borrowed again where it is restored


def test_restored_adapters_load_into_a_policy(keep, tmp_path):
    import torch

    from tests.policy.helpers import tiny_policy

    _seed_with_sft(tmp_path, 0)
    keep.pack(tmp_path / "learning", tmp_path / "keep", [0])
    keep.restore(tmp_path / "keep", tmp_path / "fresh")
    saved, other = tiny_policy(0), tiny_policy(5)
    other.load_adapters({r: str(tmp_path / "fresh" / "seed0" / "sft_checkpoints" / r)
                         for r in keep.ROLES})
    lora = {n: p for n, p in saved.peft_model.named_parameters() if "lora_" in n}
    loaded = dict(other.peft_model.named_parameters())
    assert lora and all(torch.equal(loaded[n], p) for n, p in lora.items())


def test_restore_refuses_a_torn_chunk_set_and_an_occupied_folder(keep, tmp_path):
    _seed_with_sft(tmp_path, 0)
    chunks = keep.pack(tmp_path / "learning", tmp_path / "keep", [0], chunk_bytes=64 * 1024)
    with pytest.raises(keep.KeepError, match="already holds a run"):
        keep.restore(tmp_path / "keep", tmp_path / "learning")
    last = chunks[-1].read_bytes()
    chunks[-1].unlink()
    with pytest.raises(keep.KeepError, match="one is missing or cut"):
        keep.restore(tmp_path / "keep", tmp_path / "torn")
    assert not (tmp_path / "torn" / "seed0").exists()
    chunks[-1].write_bytes(last)
    chunks[0].write_bytes(chunks[0].read_bytes()[:-1])  # with the last chunk back: one cut
    with pytest.raises(keep.KeepError, match="one is missing or cut"):
        keep.restore(tmp_path / "keep", tmp_path / "torn")
    with pytest.raises(keep.KeepError, match="no sft.tar.part_"):
        keep.restore(tmp_path / "nothing", tmp_path / "torn")


def test_pack_refuses_a_seed_without_finished_sft(keep, tmp_path):
    seed_dir = _seed_with_sft(tmp_path, 0)
    (seed_dir / "sft_checkpoints" / "optimizer" / "adapter_model.safetensors").unlink()
    assert keep.main(["pack", str(tmp_path / "learning"), str(tmp_path / "keep"),
                      "--seeds", "0"]) == 2
