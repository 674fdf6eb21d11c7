"""Shared fixtures. GPU tests carry @pytest.mark.gpu and are skipped where no GPU is present."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@functools.cache
def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `pytest -m gpu` on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own cache so cache hits are the test's own."""
    monkeypatch.setenv("MULTIMINDDEV_CACHE", str(tmp_path_factory.getbasetemp() / "mmd-cache"))


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
