"""SFT-only "breadth" families and GRPO-only "practice" families: elementwise operations the
corpus does not have.

Why: after SFT on the corpus's training split, a small model facing a held-out family (``abs``,
``scale``, ``softplus``, ``sub``, ...) tends to copy a memorised training kernel instead of
translating the problem's ``forward`` into CUDA. These families add operations, each with the
corpus's own kernel templates, so SFT sees many ``forward`` -> ``op()`` translations that differ
only where the operation differs.

They are for SFT only: not in ``FAMILIES``, never in a split, never evaluated as held-out (the
held-out set stays exactly as it was). Their problems carry ``MULTIMINDDEV["breadth"] = True``
(``problem.extra["breadth"]``) and ``split == ""``; ``reference_solution`` finds their
solutions; ``load_problems("builtin:breadth")`` loads them.

None computes a corpus family's operation (``breadth_families`` refuses a shared name or the
same ``forward``; tests/tasks/test_breadth.py also compares their outputs), and none has a pole
on randn inputs (no reciprocal, division by an input, or log of one), so the naive fp32 kernel
meets the corpus's default tolerance (1e-4; 1e-2 for float16). The float16 shapes go to
operations that are exact in float16 (negation, sign, clamps, selections), where the kernel's
float arithmetic and one final rounding give torch's result bit for bit.

The practice families (``practice_families``, ``load_problems("builtin:practice")``) are a
second such list, for GRPO only: SFT never sees them (``builtin:breadth`` does not load them),
and none computes a corpus or breadth family's operation. Why: after SFT, every family GRPO
trained on was one SFT had taught, so GRPO only sharpened memorised kernels; the held-out
failures are operations the Generator was never shown (``abs``, ``softplus``, ``scale``: it
writes ``hardtanh``'s ``op()`` body). On unseen operations a correct
kernel needs the ``forward`` read and translated, which is what these reward. Their problems
carry no marker (spec.py's ``Family.practice`` says why): their names are disjoint from the
corpus's and breadth's, and ``reference_solution`` finds them by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from multiminddev.tasks.builtin.elementwise import binary_family, unary_family
from multiminddev.tasks.builtin.spec import Family

BREADTH_TAG = "breadth"
PRACTICE_TAG = "practice"

# torch.selu's constants (torch/nn/functional.py, aten/src/ATen/native/Activation.cpp)
_SELU = "1.0507009873554805f * (v > 0.f ? v : 1.6732632423543772f * expm1f(v))"


def _families() -> list[Family]:
    u, b = unary_family, binary_family
    return [
        u("neg", "Negation: -x", "-x", "-v", half=True),
        u("sin", "Sine", "torch.sin(x)", "sinf(v)", flops_per_elem=8),
        u("atan", "Arctangent", "torch.atan(x)", "atanf(v)", flops_per_elem=8),
        u("expm1", "exp(x) - 1, accurate near 0", "torch.expm1(x)", "expm1f(v)",
          flops_per_elem=4),
        u("sign", "Sign: -1, 0 or 1", "torch.sign(x)", "(float)((v > 0.f) - (v < 0.f))",
          half=True, flops_per_elem=2),
        # Not relu6: on randn inputs (|x| > 6 about once in 5e8) it is relu, a corpus family.
        u("clamp", "Clamp to [-2, 1]", "torch.clamp(x, min=-2.0, max=1.0)",
          "fminf(fmaxf(v, -2.f), 1.f)", half=True, flops_per_elem=2),
        u("softsign", "Softsign: x / (1 + |x|)", "F.softsign(x)", "v / (1.f + fabsf(v))",
          flops_per_elem=3),
        # The stable form torch itself uses: no exp overflow for large |x|.
        u("logsigmoid", "Log-sigmoid: log(sigmoid(x))", "F.logsigmoid(x)",
          "fminf(v, 0.f) - log1pf(expf(-fabsf(v)))", flops_per_elem=6),
        u("selu", "SELU: scaled ELU with the self-normalising constants", "torch.selu(x)",
          _SELU, flops_per_elem=5),
        u("tanhshrink", "Tanhshrink: x - tanh(x)", "F.tanhshrink(x)", "v - tanhf(v)",
          flops_per_elem=5),
        u("softshrink", "Softshrink: move x towards 0 by lambd, 0 within [-lambd, lambd]",
          "F.softshrink(x, self.lambd)", "v > p0 ? v - p0 : (v < -p0 ? v + p0 : 0.f)",
          init=(("lambd", "0.5"),), params=("self.lambd", "0.0"), flops_per_elem=3),
        u("hardshrink", "Hardshrink: 0 where |x| <= 0.5, else x", "F.hardshrink(x, 0.5)",
          "fabsf(v) > 0.5f ? v : 0.f", half=True, flops_per_elem=2),
        u("quick_gelu", "QuickGELU: x * sigmoid(1.702 * x)", "x * torch.sigmoid(1.702 * x)",
          "v / (1.f + expf(-1.702f * v))", flops_per_elem=5),
        u("shift", "Add a scalar", "x + self.shift", "v + p0",
          init=(("shift", "0.25"),), params=("self.shift", "0.0")),
        b("minimum", "Elementwise minimum of two tensors", "torch.minimum(a, b)", "fminf(a, b)",
          half=True),
        b("atan2", "Elementwise atan2(a, b): the angle of the point (b, a)", "torch.atan2(a, b)",
          "atan2f(a, b)", flops_per_elem=10),
        b("hypot", "Elementwise hypotenuse sqrt(a^2 + b^2)", "torch.hypot(a, b)",
          "hypotf(a, b)", flops_per_elem=5),
        b("gated", "Gate one tensor by the sigmoid of another: a * sigmoid(b)",
          "a * torch.sigmoid(b)", "a / (1.f + expf(-b))", flops_per_elem=5),
    ]


def _practice() -> list[Family]:
    u, b = unary_family, binary_family
    # fp32 only, no poles on randn inputs, none a corpus or breadth operation (checked by
    # practice_families, and by value in tests/tasks/test_practice.py). Four read __init__
    # parameters (p0/p1), as the held-out ``scale`` does.
    return [
        u("cos", "Cosine", "torch.cos(x)", "cosf(v)", flops_per_elem=8),
        u("erf", "Error function", "torch.erf(x)", "erff(v)", flops_per_elem=8),
        u("cube", "Cube: x * x * x", "x * x * x", "v * v * v", flops_per_elem=2),
        u("sinh", "Hyperbolic sine", "torch.sinh(x)", "sinhf(v)", flops_per_elem=6),
        u("cosh", "Hyperbolic cosine", "torch.cosh(x)", "coshf(v)", flops_per_elem=6),
        u("gaussian", "Gaussian bump: exp(-x^2)", "torch.exp(-x * x)", "expf(-v * v)",
          flops_per_elem=3),
        u("exp2", "Base-2 exponential", "torch.exp2(x)", "exp2f(v)", flops_per_elem=2),
        u("floor", "Round down to an integer", "torch.floor(x)", "floorf(v)"),
        u("trunc", "Round towards zero to an integer", "torch.trunc(x)", "truncf(v)"),
        u("relu_squared", "Squared ReLU: relu(x)^2", "torch.relu(x) * torch.relu(x)",
          "v > 0.f ? v * v : 0.f", flops_per_elem=2),
        u("isru", "Inverse square root unit: x / sqrt(1 + x^2)", "x * torch.rsqrt(1 + x * x)",
          "v * rsqrtf(1.f + v * v)", flops_per_elem=4),
        u("log_cosh", "log(cosh(x))", "torch.log(torch.cosh(x))", "logf(coshf(v))",
          flops_per_elem=8),
        u("celu", "CELU with alpha", "F.celu(x, alpha=self.alpha)",
          "v > 0.f ? v : p0 * expm1f(v / p0)", init=(("alpha", "0.5"),),
          params=("self.alpha", "0.0"), flops_per_elem=5),
        u("swish_beta", "Swish with a slope: x * sigmoid(beta * x)",
          "x * torch.sigmoid(self.beta * x)", "v / (1.f + expf(-p0 * v))",
          init=(("beta", "0.5"),), params=("self.beta", "0.0"), flops_per_elem=5),
        u("clamp_min", "Clamp from below at a floor", "torch.clamp_min(x, self.floor)",
          "fmaxf(v, p0)", init=(("floor", "-0.25"),), params=("self.floor", "0.0")),
        u("threshold", "Threshold: x where x > threshold, else value",
          "F.threshold(x, self.threshold, self.value)", "v > p0 ? v : p1",
          init=(("threshold", "0.1"), ("value", "-1.0")),
          params=("self.threshold", "self.value")),
        b("mul_add", "a * b + a", "a * b + a", "a * b + a", flops_per_elem=2),
        b("copysign", "a's magnitude with b's sign", "torch.copysign(a, b)", "copysignf(a, b)"),
        b("tanh_gate", "Gate one tensor by the tanh of another: a * tanh(b)",
          "a * torch.tanh(b)", "a * tanhf(b)", flops_per_elem=5),
        b("relu_mul", "relu(a) * b", "torch.relu(a) * b", "fmaxf(a, 0.f) * b",
          flops_per_elem=2),
        b("average", "Mean of two tensors: (a + b) / 2", "(a + b) * 0.5", "0.5f * (a + b)",
          flops_per_elem=2),
        b("select_positive", "a where a > 0, else b", "torch.where(a > 0, a, b)",
          "a > 0.f ? a : b"),
    ]


def _signature(family: Family) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """What makes two families compute the same thing from the same problem text."""
    return (family.forward_args, " ".join(family.forward.split()), family.init_args)


def check_disjoint(breadth: Iterable[Family], corpus: Iterable[Family], *,
                   other: str = "corpus") -> None:
    """Raise if a breadth family shares a name or a ``forward`` with a corpus family: it would
    be a corpus (and maybe held-out) operation trained on under another label. ``other`` names
    the second list in the message (practice families are also checked against breadth's)."""
    corpus = list(corpus)
    names = {f.name for f in corpus}
    signatures = {_signature(f): f.name for f in corpus}
    for family in breadth:
        if family.name in names:
            raise RuntimeError(f"breadth family {family.name!r} has a {other} family's name")
        if (twin := signatures.get(_signature(family))) is not None:
            raise RuntimeError(
                f"breadth family {family.name!r} computes {other} family {twin!r}'s forward"
            )


def breadth_families() -> list[Family]:
    """The SFT-only families, marked ``breadth=True`` and tagged ``"breadth"``, by name."""
    from multiminddev.tasks.builtin import FAMILIES  # lazily: the package imports this module

    families = [
        dataclasses.replace(f, breadth=True, tags=(*f.tags, BREADTH_TAG)) for f in _families()
    ]
    names = [f.name for f in families]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate breadth family names: {sorted(names)}")
    check_disjoint(families, FAMILIES)
    return sorted(families, key=lambda f: f.name)


def practice_families() -> list[Family]:
    """The GRPO-only practice families (``practice``, tagged ``"practice"``), by name;
    disjoint from the corpus and from the SFT breadth families."""
    families = [
        dataclasses.replace(f, practice=True, tags=(*f.tags, PRACTICE_TAG))
        for f in _practice()
    ]
    names = [f.name for f in families]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate practice family names: {sorted(names)}")
    from multiminddev.tasks.builtin import FAMILIES

    check_disjoint(families, FAMILIES)
    check_disjoint(families, breadth_families(), other="breadth")
    return sorted(families, key=lambda f: f.name)
