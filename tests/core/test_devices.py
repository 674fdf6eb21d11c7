"""How CUDA_VISIBLE_DEVICES is read (pure)."""

from __future__ import annotations

from multiminddev.core.devices import cuda_visible_ids


def test_visible_ids_keep_the_order_and_drop_blanks():
    assert cuda_visible_ids("2, 3,") == ["2", "3"]
    assert cuda_visible_ids("GPU-39209553,MIG-1") == ["GPU-39209553", "MIG-1"]
    assert cuda_visible_ids("") == []
