"""Checks of a family's reference solutions on the CPU, shared by the corpus's tests
(test_builtin.py) and the SFT-only breadth families' (test_breadth.py).

- ``check_compiles_and_launches``: the solution module is imported as the evaluation worker
  does, so its CUDA is compiled with NVRTC for sm_90 (no GPU needed); every kernel launch in
  ``forward`` must name a compiled kernel with the right number of arguments, without spills.
- ``check_matches_model_in_emulator``: the kernels' results on the family's small shape, run by
  cuda_cpu_emulator.py, must match the problem's ``Model`` within the problem's tolerances.
"""

from __future__ import annotations

import ast
import dataclasses

import pytest
import torch

from multiminddev.cuda import KernelCompileError
from multiminddev.tasks.builtin import make_problem
from multiminddev.tasks.builtin.spec import Family, Shape, Variant
from tests.tasks import cuda_cpu_emulator


def exec_source(source: str, name: str) -> dict:
    namespace: dict = {"__name__": name}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - our own generated sources
    return namespace


def model_outputs(family: Family) -> torch.Tensor:
    """The family's PyTorch Model on its small shape's inputs, seeded the same way for every
    family, so two families computing one operation give the same tensor (the disjointness
    tests of breadth and practice families compare these)."""
    ns = exec_source(family.render_problem(family.small), family.name)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]())
    torch.manual_seed(1)
    return model(*ns["get_inputs"]())


def small_shape(family: Family, dtype: str = "float32") -> Shape:
    return dataclasses.replace(family.small, dtype=dtype)


def kernel_launches(source: str) -> list[tuple[str, int]]:
    """(kernel name, number of args) of every ``kernels.NAME(..., args=(...))`` call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "kernels"):
            args = next(k.value for k in node.keywords if k.arg == "args")
            assert isinstance(args, ast.Tuple)
            found.append((node.func.attr, len(args.elts)))
    return found


def check_compiles_and_launches(family: Family, variant: Variant, dtype: str,
                                source: str | None = None) -> None:
    """``source``: the solution module to check (None: the family's own)."""
    source = source if source is not None else family.render_solution(variant, dtype)
    try:
        ns = exec_source(source, f"{family.name}_{variant.value}")
    except KernelCompileError as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"{family.name} {variant.value} {dtype}: {exc}")
    kernels = ns["kernels"]
    assert kernels.compile_result.arch == "sm_90" or torch.cuda.is_available()
    launches = kernel_launches(source)
    assert launches, "forward launches no kernel"
    for name, nargs in launches:
        assert name in kernels.signatures, f"launch of unknown kernel {name}"
        assert len(kernels.signatures[name].params) == nargs, name
    for resources in kernels.compile_result.kernels:
        assert resources.spill_store_bytes == 0, resources


def guarded(t: torch.Tensor, pad: int = 64) -> torch.Tensor:
    """A copy of a floating tensor inside a NaN-filled buffer: an out-of-bounds read by a
    kernel pulls NaN into its output (16-byte alignment is kept for vectorised loads)."""
    if not t.is_floating_point():
        return t.clone()
    buffer = torch.full((t.numel() + 2 * pad,), float("nan"), dtype=t.dtype)
    view = buffer[pad : pad + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def check_matches_model_in_emulator(family: Family, variant: Variant, dtype: str,
                                    source: str | None = None) -> None:
    """The kernels' results, on small shapes that still span several blocks, tiles and
    grid-stride steps, run by tests/tasks/cuda_cpu_emulator.py on CPU tensors. ``source``: the
    solution module to check (None: the family's own)."""
    s = small_shape(family, dtype)
    problem_ns = exec_source(family.render_problem(s), "problem")
    init = problem_ns["get_init_inputs"]()
    torch.manual_seed(0)
    model = problem_ns["Model"](*init)
    ns = cuda_cpu_emulator.emulated_namespace(
        source if source is not None else family.render_solution(variant, dtype))
    torch.manual_seed(0)
    new = ns["ModelNew"](*init)
    torch.manual_seed(1)
    inputs = problem_ns["get_inputs"]()
    expected = model(*inputs)
    got = new(*[guarded(x) for x in inputs])
    assert ns["torch"].intact(), "a kernel wrote outside its output tensor"
    assert got.shape == expected.shape and got.dtype == expected.dtype
    atol, rtol = make_problem(family, s).tolerances
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
