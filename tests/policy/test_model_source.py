"""Model and checkpoint paths are checked before transformers is asked: each bad one is a
PolicyError that says what to do, and an uncached hub id offline fails at once."""

from __future__ import annotations

import time

import pytest

from multiminddev.policy.model import PolicyError, _reachable, check_checkpoint, check_model_source


def test_missing_local_path(tmp_path):
    with pytest.raises(PolicyError, match="does not exist"):
        check_model_source(str(tmp_path / "models" / "mine"))


def test_folder_without_config_or_gguf(tmp_path):
    (tmp_path / "readme.txt").write_text("")
    with pytest.raises(PolicyError, match="is not a model folder"):
        check_model_source(str(tmp_path))


def test_folder_with_only_a_gguf_names_the_file_to_pass(tmp_path):
    (tmp_path / "m.Q4.gguf").write_bytes(b"")
    with pytest.raises(PolicyError, match="m.Q4.gguf"):
        check_model_source(str(tmp_path))


def test_adapter_folder_is_not_a_base_model(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(PolicyError, match="holds adapters"):
        check_model_source(str(tmp_path))


def test_model_folder_with_config_passes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    check_model_source(str(tmp_path))


def test_a_file_that_is_not_a_model(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"")
    with pytest.raises(PolicyError, match="is a file but not a model"):
        check_model_source(str(f))


def test_uncached_hub_id_while_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(PolicyError, match="HF_HUB_OFFLINE is set"):
        check_model_source("no-such-org/no-such-model")
    assert time.perf_counter() - start < 5


def test_an_unresolvable_host_is_unreachable_within_the_timeout():
    start = time.perf_counter()
    assert _reachable("hub.invalid", 443, timeout=2.0) is False
    assert time.perf_counter() - start < 3


def test_mistyped_checkpoint_path_is_a_missing_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(PolicyError, match="no such checkpoint folder"):
        check_checkpoint("runs/typo", "generator")


def test_checkpoint_run_folder_with_sft_adapters_passes(tmp_path):
    sub = tmp_path / "sft_checkpoints" / "optimizer"
    sub.mkdir(parents=True)
    (sub / "adapter_config.json").write_text("{}")
    check_checkpoint(str(tmp_path), "optimizer")
