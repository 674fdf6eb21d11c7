"""benchmarks/bench_model_sizes.py: the shapes are Qwen2.5-Coder's, the tiny mode runs the whole
path (real model, real backward, real figures) on a CPU, and what cannot run is reported, not
raised. The real sizes run on a GPU (the gpu test, and the command in docs/training.md)."""

import json
import math
import random

import pytest
import torch

from tests.benchmarks.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_model_sizes")


@pytest.fixture(scope="module")
def tiny_run(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("sizes")
    assert bench.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    return out


# The parameter counts the Qwen2.5 model cards give (0.49B, 1.54B, 7.61B), to the parameter.
PUBLISHED_PARAMS = {"0.5B": 494_032_768, "1.5B": 1_543_714_304, "7B": 7_615_616_512}


def test_shapes_have_the_published_parameter_counts(bench):
    assert set(bench.SHAPES) == set(PUBLISHED_PARAMS)
    for name, shape in bench.SHAPES.items():
        assert bench.architecture_params(shape) == PUBLISHED_PARAMS[name], name


def test_tiny_run_writes_a_table_with_finite_figures(bench, tiny_run):
    record = json.loads((tiny_run / "model_sizes.json").read_text())
    rows = {r["precision"]: r for r in record["results"]}
    bf16 = rows["bf16"]
    assert bf16["status"] == "ok" and bf16["device"] == "cpu"
    assert bf16["params"] > bf16["adapter_params"] > 0
    assert set(bf16["phases"]) == {"decode_b1", "decode_b4", "sft_step", "grpo_step"}
    for name, phase in bf16["phases"].items():
        assert phase["status"] == "ok", (name, phase)
        assert math.isfinite(phase["seconds"]) and phase["seconds"] > 0, name
    for rows_decoded in (1, 4):
        phase = bf16["phases"][f"decode_b{rows_decoded}"]
        assert math.isfinite(phase["tokens_per_s"]) and phase["tokens_per_s"] > 0
        # up to 8 new tokens per row (a row ends early only at EOS, odds ~1/1024 a token)
        assert 0 < int(phase["note"].removesuffix(" tokens")) <= 8 * rows_decoded
    for step in ("sft_step", "grpo_step"):
        loss = float(bf16["phases"][step]["note"].removeprefix("loss "))
        assert math.isfinite(loss)
    # a random model's SFT loss is about log(vocab)
    assert abs(float(bf16["phases"]["sft_step"]["note"].removeprefix("loss ")) - math.log(1024)) < 1
    # 4-bit needs CUDA: said so in the row, not raised
    assert rows["nf4"]["status"] == "unavailable" and "CUDA" in rows["nf4"]["note"]
    table = (tiny_run / "model_sizes.md").read_text().splitlines()
    assert table[0].startswith("| size | base | params | decode tok/s b1 | decode tok/s b4 |")
    assert len(table) == 4 and table[2].startswith("| tiny | bf16 | 0.14M |")


def _tiny_policy(bench):
    base = bench.build_base(bench.TINY, bench.Precision.BF16, "cpu", None)
    return bench.build_policy(base, bench.random_tokenizer(bench.TINY.vocab_size),
                              bench.PolicyConfig(device="cpu"))


def _adapter_weights(policy, role):
    marker = f".{role.value}."
    return {k: p.detach().clone() for k, p in policy.peft_model.named_parameters() if marker in k}


@pytest.mark.parametrize("step_fn", ["sft_step_fn", "grpo_step_fn"])
def test_a_step_trains_the_generator_adapter_alone(bench, step_fn):
    torch.manual_seed(0)
    policy = _tiny_policy(bench)
    before = {r: _adapter_weights(policy, r) for r in policy.roles}
    cfg = bench.TINY_WORKLOAD
    loss = getattr(bench, step_fn)(policy, cfg, random.Random(0), "cpu")()
    assert math.isfinite(loss)
    after = {r: _adapter_weights(policy, r) for r in policy.roles}
    generator, optimizer = bench.AgentRole.GENERATOR, bench.AgentRole.OPTIMIZER
    assert any(not torch.equal(before[generator][k], after[generator][k]) for k in after[generator])
    assert all(torch.equal(before[optimizer][k], after[optimizer][k]) for k in after[optimizer])


def test_out_of_memory_is_reported_as_does_not_fit(bench):
    def too_big():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    measured = bench.guarded(too_big, "cpu")
    assert measured.status is bench.Status.DOES_NOT_FIT
    assert measured.note.startswith("CUDA out of memory")
    assert bench.guarded(lambda: bench.Measurement(status=bench.Status.OK, seconds=1.0),
                         "cpu").status is bench.Status.OK


def test_does_not_fit_shows_in_the_table(bench):
    cfg = bench.BenchConfig()
    result = bench.SizeResult(size="7B", precision=bench.Precision.BF16, device="H200",
                              status=bench.Status.OK, params=7_615_616_512, phases={
                                  "decode_b1": bench.Measurement(status=bench.Status.OK,
                                                                 tokens_per_s=30.0, peak_gib=15.0),
                                  "sft_step": bench.Measurement(status=bench.Status.DOES_NOT_FIT,
                                                                peak_gib=139.0,
                                                                note="CUDA out of memory")})
    row = bench.markdown_table([result], cfg).splitlines()[2]
    # the peak is that of the phases that fit, not the failed one's
    assert row == ("| 7B | bf16 | 7.62B | 30.0 | - | does not fit | - | 15.0 "
                   "| sft_step: CUDA out of memory |")


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "3B"], "unknown sizes ['3B']"),
    (["--precisions", "int8"], "precisions ['int8']"),
    (["--seq-len", "2"], "seq_len must be >= 4"),
])
def test_bad_flags_are_one_line_errors(bench, tmp_path, capsys, argv, message):
    assert bench.main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.gpu
def test_half_b_on_a_gpu_measures_every_phase_with_its_memory(bench, tmp_path):
    """0.5B in bf16 on the GPU with a short workload: every phase fits and reports a peak
    above the resting policy."""
    argv = ["--sizes", "0.5B", "--precisions", "bf16", "--new-tokens", "16", "--seq-len", "256",
            "--repeats", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    (row,) = json.loads((tmp_path / "model_sizes.json").read_text())["results"]
    assert row["status"] == "ok" and row["params"] == PUBLISHED_PARAMS["0.5B"]
    assert row["model_gib"] > 0.9  # 0.49B bf16 weights plus the merged-sampling copy
    for name, phase in row["phases"].items():
        assert phase["status"] == "ok", (name, phase)
        assert phase["peak_gib"] >= row["model_gib"], name
