"""Undefined names, checked statically over all our code.

CI has no GPU, so GPU-only tests and benchmark code never run there; an undefined name in them
(a GPU test once used ``torch``, ``x`` and ``y`` it never defined) would only show on
the GPU machine. pyflakes' rules in ruff catch that class without running anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_undefined_or_shadowed_names():
    # F821 undefined name, F822 undefined name in __all__, F823 local used before assignment,
    # F811 redefinition of an unused name
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
         "--select", "F821,F822,F823,F811", "src", "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert "No module named ruff" not in out.stderr, "ruff is a dev dependency: pip install -e '.[dev]'"
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
