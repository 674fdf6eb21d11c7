"""ground_truth_outputs, output_layout / is_dense and the precision settings of EvalConfig."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from multiminddev.env.config import EvalConfig
from multiminddev.env.precision import ground_truth_outputs, is_dense, output_layout


def _linear():
    torch.manual_seed(0)
    return nn.Linear(64, 32).eval()


def test_ground_truth_is_the_float64_computation():
    model, x = _linear(), torch.randn(8, 64)
    truth = ground_truth_outputs(model, [x])
    expected = x.double() @ model.weight.double().t() + model.bias.double()
    assert truth.available and truth.outputs[0].dtype == torch.float64
    torch.testing.assert_close(truth.outputs[0], expected, rtol=1e-15, atol=1e-15)


def test_ground_truth_leaves_the_model_and_inputs_unchanged():
    model, x = _linear(), torch.randn(8, 64)
    weight, ptr, x_before = model.weight.detach().clone(), model.weight.data_ptr(), x.clone()
    ground_truth_outputs(model, [x])
    assert model.weight.dtype == torch.float32 and model.weight.data_ptr() == ptr
    assert torch.equal(model.weight, weight)
    assert x.dtype == torch.float32 and torch.equal(x, x_before)


class _Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)

    def forward(self, index, x):
        return self.table(index) * x, index.argmax()


def test_integer_inputs_pass_unchanged_and_integer_outputs_stay_integer():
    torch.manual_seed(0)
    index, x = torch.tensor([1, 7, 3]), torch.randn(3, 4)
    truth = ground_truth_outputs(_Embed(), [index, x])
    assert truth.available
    assert truth.outputs[0].dtype == torch.float64 and truth.outputs[1].dtype == torch.int64


class _Noisy(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


def test_ground_truth_leaves_the_rng_state_unchanged():
    state = torch.get_rng_state()
    ground_truth_outputs(_Noisy(), [torch.zeros(4)])
    assert torch.equal(torch.get_rng_state(), state)


class _Factory(nn.Module):
    def forward(self, x):
        return x + torch.ones(x.shape[-1])


def test_tensors_made_inside_forward_are_float64_and_the_default_dtype_is_restored():
    truth = ground_truth_outputs(_Factory(), [torch.randn(2, 3)])
    assert truth.available and truth.outputs[0].dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


class _PlainAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.tensor(1 / 3)

    def forward(self, x):
        return x * self.scale


def test_floating_plain_attributes_are_widened_in_the_copy_only():
    model = _PlainAttribute()
    truth = ground_truth_outputs(model, [torch.ones(2)])
    assert truth.available and truth.outputs[0].dtype == torch.float64
    assert float(truth.outputs[0][0]) == float(torch.tensor(1 / 3))  # float32's 1/3, widened
    assert model.scale.dtype == torch.float32


class _Casts(nn.Module):
    def forward(self, x):
        return x.float() * 2


class _FixedOutput(nn.Module):
    def forward(self, x):
        return (x * 2).to(torch.float16)


@pytest.mark.parametrize("model", [_Casts(), _FixedOutput()], ids=["float()", "to(float16)"])
def test_a_model_that_fixes_a_dtype_has_no_ground_truth(model):
    truth = ground_truth_outputs(model, [torch.randn(4)])
    assert not truth.available and "fixes" in truth.reason


class _Float32Only(nn.Module):
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("expected float32")
        return x


def test_a_model_that_fails_in_float64_has_no_ground_truth_and_restores_the_default_dtype():
    truth = ground_truth_outputs(_Float32Only(), [torch.randn(4)])
    assert not truth.available and "does not run in float64" in truth.reason
    assert "expected float32" in truth.reason
    assert torch.get_default_dtype() == torch.float32


class _Locked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def forward(self, x):
        return x


def test_a_model_that_cannot_be_copied_has_no_ground_truth():
    truth = ground_truth_outputs(_Locked(), [torch.randn(4)])
    assert not truth.available and "deep-copied" in truth.reason


@pytest.mark.parametrize(("tensor", "dense"), [
    (torch.zeros(4, 5), True),
    (torch.zeros(5, 4).t(), True),
    (torch.zeros(2, 3, 4).permute(2, 0, 1), True),
    (torch.zeros(4, 1).expand(4, 5), False),
    (torch.zeros(4, 10)[:, ::2], False),
    (torch.zeros(4, 10)[:, :5], False),
    (torch.zeros(4, 10)[:2], True),  # a dense view of a larger buffer
    (torch.zeros(0, 3).expand(0, 3), True),
    (torch.zeros(3, 1, 4), True),
    (torch.zeros(10).as_strided((3, 4), (2, 1)), False),  # overlapping rows
])
def test_is_dense(tensor, dense):
    assert is_dense(tuple(tensor.shape), tensor.stride()) is dense


def test_size_one_dims_may_have_any_stride():
    assert is_dense((3, 1, 4), (4, 999, 1))


def test_output_layout_of_a_non_tensor_is_none():
    assert output_layout(3.0) is None


@pytest.mark.parametrize("field", ["precision_error_multiple", "precision_half_error_multiple",
                                   "precision_max_error_factor"])
def test_precision_multiples_below_one_are_refused(field):
    with pytest.raises(ValueError, match="precision_check=False"):
        EvalConfig(**{field: 0.5})


def test_precision_floor_must_be_positive():
    with pytest.raises(ValueError, match="precision_floor_ulps"):
        EvalConfig(precision_floor_ulps=0)


# ---------------------------------------------------------------------------------------------
# On the GPU: the ground truth in the worker's setting, judged by verify_precision
# ---------------------------------------------------------------------------------------------


class _MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


def _cuda_matmul_case():
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 4096, device="cuda", generator=gen)
    b = torch.randn(4096, 512, device="cuda", generator=gen)
    truth = ground_truth_outputs(_MatMul(), [a, b])
    assert truth.available
    return a, b, truth.outputs[0], (a @ b).cpu()


def _budget():
    from multiminddev.env.verify import PrecisionBudget

    return PrecisionBudget.from_config(EvalConfig())


@pytest.mark.gpu
def test_cuda_ground_truth_comes_back_on_the_cpu_and_keeps_the_cuda_rng_state():
    state = torch.cuda.get_rng_state()
    _, _, truth, _ = _cuda_matmul_case()
    assert truth.device.type == "cpu" and truth.dtype == torch.float64
    assert torch.equal(torch.cuda.get_rng_state(), state)


@pytest.mark.gpu
def test_cublas_tf32_matmul_is_rejected_against_the_cuda_ground_truth():
    from multiminddev.env.verify import verify_precision

    a, b, truth, eager = _cuda_matmul_case()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        cand = (a @ b).cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    [m] = verify_precision([truth], [eager], [cand], budget=_budget(), rtol=1e-4)
    assert m.reason == "precision"


@pytest.mark.gpu
def test_cublas_split_k_float32_matmul_is_accepted_against_the_cuda_ground_truth():
    from multiminddev.env.verify import verify_precision

    a, b, truth, eager = _cuda_matmul_case()
    cand = sum(a[:, k:k + 512] @ b[k:k + 512] for k in range(0, 4096, 512)).cpu()
    assert verify_precision([truth], [eager], [cand], budget=_budget(), rtol=1e-4) == []
