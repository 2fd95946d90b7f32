"""Extension ops on a fused device: a backend's own implementation is a fusion boundary (it receives the backend's
handles, computed first); ``fusable=True`` has the default composition recorded and fused instead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
from ember import dispatch
from ember.device import Device
from ember.plugins.manager import OpSpec, registry


def _axpy_default(be: Any, x: Any, y: Any, alpha: float = 2.0) -> Any:
    return be.binary("add", be.binary("mul", x, alpha), y)


@pytest.fixture
def calls() -> Iterator[list[Any]]:
    seen: list[Any] = []

    def axpy_flex(be: Any, x: Any, y: Any, alpha: float = 2.0) -> Any:
        seen.append((type(be).__name__, type(x).__name__, type(y).__name__))
        return x * alpha + y

    registry.ensure_loaded()
    registry.ops["test_axpy"] = OpSpec("test_axpy", _axpy_default, {"flex": axpy_flex})
    registry.ops["test_axpy_fusable"] = OpSpec("test_axpy_fusable", _axpy_default, {"flex": axpy_flex},
                                               fusable=True)
    dispatch.clear_cache()
    try:
        yield seen
    finally:
        del registry.ops["test_axpy"], registry.ops["test_axpy_fusable"]
        dispatch.clear_cache()


def test_a_backend_implementation_runs_as_a_boundary_on_computed_inputs(fused_dev: Device, calls: list[Any],
                                                                       stats_of: Any) -> None:
    x = ember.arange(6, dtype=ember.float32, device=fused_dev)
    y = x * 3  # pending: the boundary computes it first
    before = stats_of(fused_dev)["fusion_boundaries"]
    out = dispatch.call("test_axpy", x, y, alpha=0.5)
    assert calls == [("FlexBackend", "ndarray", "ndarray")]  # flex's own function, with flex's handles
    np.testing.assert_allclose(out.numpy(), np.arange(6) * 0.5 + np.arange(6) * 3)
    assert stats_of(fused_dev)["fusion_boundaries"] == before + 1
    assert out.device is fused_dev


def test_a_fusable_op_is_recorded_and_fused(fused_dev: Device, calls: list[Any], stats_of: Any) -> None:
    x = ember.arange(6, dtype=ember.float32, device=fused_dev)
    before = stats_of(fused_dev)
    out = dispatch.call("test_axpy_fusable", x, x * 3)
    assert calls == []  # the default composition ran on the fused stack
    assert out._h.node.value is None  # ... and only recorded
    np.testing.assert_allclose(out.numpy(), np.arange(6) * 2.0 + np.arange(6) * 3)
    after = stats_of(fused_dev)
    assert after["fusion_recorded"] - before["fusion_recorded"] == 3  # x * 3, mul, add
    assert after["fusion_boundaries"] == before["fusion_boundaries"]


def test_an_unfused_device_calls_the_backend_implementation_directly(calls: list[Any]) -> None:
    dev = Device.flex().fusion(False)
    x = ember.arange(3, dtype=ember.float32, device=dev)
    out = dispatch.call("test_axpy_fusable", x, x)
    assert calls == [("FlexBackend", "ndarray", "ndarray")]
    np.testing.assert_allclose(out.numpy(), np.arange(3) * 3.0)
