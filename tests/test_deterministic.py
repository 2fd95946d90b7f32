"""ember.use_deterministic_algorithms (torch's names and semantics) across the installed backends.

Backends declare their nondeterministic kernels through ``register_backend_traits(nondeterministic_ops=...)`` and
alert before running one: ember-opencl's atomic float scatter-reduce. flex declares none, so everything runs there.
Backends are reached by name through the registry; no plugin is imported.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, runtime
from ember.errors import UnsupportedError, ValueRangeError


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = (ember.are_deterministic_algorithms_enabled(), ember.is_deterministic_algorithms_warn_only_enabled())
    yield
    ember.use_deterministic_algorithms(before[0], warn_only=before[1])


def _device(kind: str) -> Device:
    if kind not in ember.plugins.manager.registry.ensure_loaded().backends:
        pytest.skip(f"backend {kind} is not installed")
    try:
        dev = Device.parse(kind)
        ember.zeros(1, device=dev)
    except ember.EmberError as exc:
        pytest.skip(f"no {kind} device here: {exc}")
    return dev


def test_flags_follow_torch() -> None:
    ember.use_deterministic_algorithms(False)
    assert not ember.are_deterministic_algorithms_enabled()
    assert not ember.is_deterministic_algorithms_warn_only_enabled()
    ember.use_deterministic_algorithms(True)
    assert ember.are_deterministic_algorithms_enabled() and not ember.is_deterministic_algorithms_warn_only_enabled()
    ember.use_deterministic_algorithms(True, warn_only=True)
    assert ember.are_deterministic_algorithms_enabled() and ember.is_deterministic_algorithms_warn_only_enabled()
    ember.use_deterministic_algorithms(False, warn_only=True)  # torch keeps reporting warn_only
    torch = pytest.importorskip("torch")
    try:
        torch.use_deterministic_algorithms(False, warn_only=True)
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        assert ember.is_deterministic_algorithms_warn_only_enabled() is warn_only
        assert ember.are_deterministic_algorithms_enabled() is torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bad_mode_is_a_typed_error(bad: Any) -> None:
    with pytest.raises(ValueRangeError, match="use_deterministic_algorithms: expected a bool mode"):
        ember.use_deterministic_algorithms(bad)
    with pytest.raises(ValueRangeError, match="warn_only"):
        ember.use_deterministic_algorithms(True, warn_only=1)


def _scatter_ops(dev: Device) -> list[tuple[str, Any]]:
    idx = ember.tensor([0, 1, 1, 3], device=dev)
    src = ember.ones(4, device=dev)
    base = ember.zeros(5, device=dev)
    return [
        ("scatter_add", lambda: base.scatter_add(0, idx, src)),
        ("index_add", lambda: base.index_add(0, idx, src)),
        ("index_put_accumulate", lambda: base.clone().index_put_((idx,), src, accumulate=True)),
    ]


def test_flex_declares_nothing_and_runs_everything() -> None:
    dev = _device("flex")
    assert not runtime.backend_traits().get("flex", runtime.BackendTraits("flex")).nondeterministic_ops
    ember.use_deterministic_algorithms(True)
    for name, op in _scatter_ops(dev):
        np.testing.assert_array_equal(op().numpy(), [1.0, 2.0, 0.0, 1.0, 0.0], err_msg=name)


def test_opencl_atomic_scatter_is_refused_or_warned() -> None:
    dev = _device("opencl")
    assert "scatter" in runtime.nondeterministic_ops().get("opencl", {})
    ember.use_deterministic_algorithms(True)
    for _, op in _scatter_ops(dev):
        with pytest.raises(UnsupportedError, match=r"scatter \(reduce='add', float32\) on backend 'opencl' does not "
                                                   r"have a deterministic implementation: .*atomic"):
            op()
    # integer sums are exact in any order, and a plain scatter has no reduction: both run
    ints = ember.zeros(5, dtype=ember.int64, device=dev).scatter_add(
        0, ember.tensor([0, 1, 1, 3], device=dev), ember.ones(4, dtype=ember.int64, device=dev))
    np.testing.assert_array_equal(ints.numpy(), [1, 2, 0, 1, 0])
    ember.use_deterministic_algorithms(True, warn_only=True)
    for name, op in _scatter_ops(dev):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = op()
        assert any("deterministic" in str(w.message) for w in caught), name
        np.testing.assert_array_equal(out.numpy(), [1.0, 2.0, 0.0, 1.0, 0.0], err_msg=name)
    ember.use_deterministic_algorithms(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, op in _scatter_ops(dev):
            op()


def test_alert_names_a_declared_reason_and_is_silent_when_off() -> None:
    from ember.plugins import hookimpl, manager

    reg = manager.registry.ensure_loaded()

    class Plugin:
        @hookimpl
        def register_backend_traits(self, register: Any) -> None:
            register("racy", nondeterministic_ops={"histc": "float atomics"})

    plugin = Plugin()
    reg.register_plugin(plugin, "racy-test")
    try:
        ember.use_deterministic_algorithms(False)
        runtime.alert_not_deterministic("histc", "racy")
        ember.use_deterministic_algorithms(True)
        with pytest.raises(UnsupportedError, match="histc on backend 'racy' .*: float atomics, but"):
            runtime.alert_not_deterministic("histc", "racy")
    finally:
        reg._manager().unregister(plugin)
        reg.plugins[:] = [p for p in reg.plugins if p.name != "racy-test"]
