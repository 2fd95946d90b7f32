"""Shared fixtures of the ember-fusion tests.

Scheduling is tested independently of any code generator: fused stacks are built directly as
``FusionBackend(inner)`` over flex (whose ``fusion_compile`` may generate numexpr code) and over a flex subclass
whose ``fusion_compile`` returns None, so every kernel runs through :func:`ember.ir.interpret`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ember import Device
from ember_fusion.backend import FusionBackend
from ember_fusion.graph import FArray

#: flex's backend class, reached through its device (no plugin imports another plugin, tests included)
FlexBackend: type = type(Device.flex().stack.base_backend)


class InterpretingFlex(FlexBackend):
    """flex that supports fusion but compiles nothing: kernels run op by op via ``ember.ir.interpret``."""

    name = "flex-interp"

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self.kernels: list[Any] = []

    def fusion_compile(self, kernel: Any) -> Any:
        self.kernels.append(kernel)  # tests inspect what the scheduler produced
        return None


def unfused_flex() -> Any:
    """flex's own backend instance (``Device.flex()`` is unfused: flex declines automatic fusion)."""
    return Device.flex().fusion(False).stack


@pytest.fixture(params=["flex", "interpret"])
def inner(request: pytest.FixtureRequest) -> Any:
    """The backend under the fusion decorator: flex itself, or flex with kernels interpreted."""
    return unfused_flex() if request.param == "flex" else InterpretingFlex()


@pytest.fixture
def fb(inner: Any) -> FusionBackend:
    """A fresh fused stack (its own plan cache and stats) over ``inner``."""
    return FusionBackend(inner)


@pytest.fixture
def ifb() -> FusionBackend:
    """A fresh fused stack over the interpreting flex (its ``inner.kernels`` lists every compiled kernel)."""
    return FusionBackend(InterpretingFlex())


@pytest.fixture
def default_fused_dev() -> Device:
    """The fused flex device with default settings, ``Device.flex().fusion()`` (flex declines automatic fusion,
    so the decorator is named)."""
    dev = Device.flex().fusion()
    assert type(dev.stack).__name__ == "FusionBackend"
    return dev


@pytest.fixture
def fused_dev(default_fused_dev: Device) -> Device:
    """The fused flex device that records every op (``eager_below=0``): these tests use small tensors, which the
    default device runs eagerly (too small for a plan to pay), to check what recording and planning do."""
    return default_fused_dev.fusion(eager_below=0)


@pytest.fixture
def stats_of() -> Callable[[Any], dict[str, Any]]:
    """``stats_of(device_or_backend)``: its ``memory_report()`` restricted to the ``fusion_*`` counters."""

    def get(obj: Any) -> dict[str, Any]:
        return {k: v for k, v in obj.memory_report().items() if k.startswith("fusion_")}

    return get


def pending(t: Any) -> bool:
    """Whether a Tensor (or a handle) is recorded but not yet computed: values in memory are FArrays with a
    realized node or the inner backend's own handles."""
    h = getattr(t, "_h", t)
    return type(h) is FArray and h.node.value is None


@pytest.fixture
def interp_cls() -> type[InterpretingFlex]:
    return InterpretingFlex


@pytest.fixture
def is_pending() -> Callable[[Any], bool]:
    return pending


@pytest.fixture(autouse=True)
def _flush_fused_flex() -> Any:
    """Leave nothing pending on the shared fused flex stack between tests."""
    yield
    for dev in (Device.flex(), Device.flex().fusion(eager_below=0)):
        stack = dev.stack
        if isinstance(stack, FusionBackend):
            stack.flush()

