"""Small values run at once (``eager_below``): no recording, the inner backend's own op and handle, same bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import Device, ValueRangeError
from ember import dtypes as dt
from ember_fusion.backend import DEFAULT_EAGER_BELOW, FusionBackend
from ember_fusion.graph import FArray

F32 = np.float32


def _arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


@pytest.fixture
def efb(inner: Any) -> FusionBackend:
    """A fused stack that runs ops on fewer than 64 elements at once."""
    return FusionBackend(inner, eager_below=64)


def test_devices_default_and_a_bare_backend_records_everything(default_fused_dev: Device, inner: Any) -> None:
    assert default_fused_dev.stack.eager_below == DEFAULT_EAGER_BELOW == 1 << 19
    assert FusionBackend(inner).eager_below == 0
    assert Device.parse("flex+fusion(eager_below=0)").stack.eager_below == 0
    assert default_fused_dev.fusion(eager_below=100).stack.eager_below == 100


@pytest.mark.parametrize("value", [-1, "abc", 1.5, (4,)])
def test_eager_below_must_be_a_count(default_fused_dev: Device, value: Any) -> None:
    with pytest.raises(ValueRangeError, match="eager_below"):
        default_fused_dev.fusion(eager_below=value).stack  # noqa: B018


def test_small_ops_run_at_once_large_ones_are_recorded(efb: FusionBackend) -> None:
    small, large = efb.from_numpy(_arr(4, 8)), efb.from_numpy(_arr(8, 8, seed=1))
    before = efb.stats.as_dict()
    s = efb.unary("tanh", efb.binary("mul", small, 2.0))
    assert type(s) is not FArray  # the inner backend's handle
    after = efb.stats.as_dict()
    assert after["fusion_eager"] - before["fusion_eager"] == 2
    assert after["fusion_recorded"] - before["fusion_recorded"] == 2
    assert after["fusion_realizations"] == before["fusion_realizations"]
    big = efb.binary("add", large, 1.0)
    assert type(big) is FArray and big.node.value is None
    # a small op reading a pending value is recorded too (it joins the pending graph)
    part = efb.reduce("sum", big, (1,), False)
    assert type(part) is FArray and part.node.value is None
    np.testing.assert_array_equal(efb.to_numpy(part), (_arr(8, 8, seed=1) + F32(1)).sum(1))
    np.testing.assert_array_equal(efb.to_numpy(s), np.tanh(_arr(4, 8) * F32(2)))


def test_every_recorded_op_has_an_eager_path(efb: FusionBackend) -> None:
    inner = efb.inner
    x, y = _arr(3, 5), _arr(3, 5, seed=1)
    hx, hy = efb.from_numpy(x), efb.from_numpy(y)
    ix, iy = inner.from_numpy(x), inner.from_numpy(y)
    before = efb.stats.eager
    got = {
        "unary": efb.unary("exp", hx), "binary": efb.binary("sub", hx, hy), "rbinary": efb.binary("div", 2.0, hy),
        "where": efb.where(efb.binary("gt", hx, hy), hx, 0.5), "cast": efb.cast(hx, dt.int32),
        "full": efb.full((2, 3), 1.5, dt.float32), "reduce": efb.reduce("max", hx, (0,), True),
    }
    want = {
        "unary": inner.unary("exp", ix), "binary": inner.binary("sub", ix, iy), "rbinary": inner.binary("div", 2.0, iy),
        "where": inner.where(inner.binary("gt", ix, iy), ix, 0.5), "cast": inner.cast(ix, dt.int32),
        "full": inner.full((2, 3), 1.5, dt.float32), "reduce": inner.reduce("max", ix, (0,), True),
    }
    assert efb.stats.eager - before == 8  # the comparison inside where too
    for k, h in got.items():
        assert type(h) is not FArray, k
        assert efb.dtype_of(h) is inner.dtype_of(want[k]), k
        np.testing.assert_array_equal(efb.to_numpy(h), inner.to_numpy(want[k]), err_msg=k)


def test_a_broadcast_result_counts_as_the_work(efb: FusionBackend) -> None:
    # two 8-element operands, a 64-element result: at the threshold, so recorded
    col, row = efb.from_numpy(_arr(8, 1)), efb.from_numpy(_arr(1, 8, seed=1))
    out = efb.binary("mul", col, row)
    assert type(out) is FArray and out.node.value is None
    np.testing.assert_array_equal(efb.to_numpy(out), _arr(8, 1) * _arr(1, 8, seed=1))


def test_a_realized_farray_is_in_memory(efb: FusionBackend) -> None:
    big = efb.binary("add", efb.from_numpy(_arr(10, 10)), 1.0)
    small = efb.reduce("sum", big, (0, 1), False)  # recorded: its input is pending
    efb.to_numpy(small)
    assert type(small) is FArray and small.node.value is not None
    before = efb.stats.eager
    twice = efb.binary("mul", small, 2.0)  # a realized FArray: runs at once
    assert type(twice) is not FArray and efb.stats.eager == before + 1
    np.testing.assert_array_equal(efb.to_numpy(twice), (_arr(10, 10) + F32(1)).sum() * F32(2))


def test_in_place_on_an_inner_handle(efb: FusionBackend) -> None:
    a_np, b_np = _arr(10, 10), _arr(10, 10, seed=1)
    a = efb.binary("mul", efb.from_numpy(a_np.copy()), 1.0)  # 100 elements: recorded
    efb.to_numpy(a)
    target = efb.from_numpy(a_np.copy())  # an inner handle
    assert type(target) is not FArray
    # a pending right-hand side: one fused plan writes straight into the target
    pending_b = efb.binary("add", efb.from_numpy(b_np.copy()), 1.0)
    efb.inplace_binary("sub", target, pending_b)
    np.testing.assert_array_equal(efb.to_numpy(target), a_np - (b_np + F32(1)))
    # the right-hand side reads the target itself: still exact
    efb.inplace_binary("add", target, efb.binary("mul", target, 0.5))
    ref = a_np - (b_np + F32(1))
    np.testing.assert_array_equal(efb.to_numpy(target), ref + ref * F32(0.5))
    # a scalar and a value in memory
    efb.inplace_binary("mul", target, 2.0)
    efb.inplace_binary("add", target, efb.from_numpy(b_np.copy()))
    np.testing.assert_array_equal(efb.to_numpy(target), (ref + ref * F32(0.5)) * F32(2) + b_np)


@pytest.mark.parametrize("n", [7, 1000, (1 << 19) - 1, 1 << 19, (1 << 19) + 3])
def test_default_device_is_bit_identical_to_unfused_around_the_threshold(default_fused_dev: Device, n: int) -> None:
    x_np, y_np = _arr(n), _arr(n, seed=1)

    def chain(x: Any, y: Any) -> Any:
        z = (x * 0.7 - y).tanh() * y + x.exp() / (1 + y * y)
        return z, z.sum(), ember.where(z > 0, z, y).max()

    fused = chain(ember.tensor(x_np, device=default_fused_dev), ember.tensor(y_np, device=default_fused_dev))
    plain_dev = default_fused_dev.fusion(False)
    plain = chain(ember.tensor(x_np, device=plain_dev), ember.tensor(y_np, device=plain_dev))
    for f, p in zip(fused, plain):
        np.testing.assert_array_equal(f.numpy(), p.numpy())


def test_small_op_loop_records_nothing_on_the_default_device(default_fused_dev: Device) -> None:
    # the shape of an LSTM step: boundaries (matmul, chunk) and small elementwise ops; nothing is planned
    dev = default_fused_dev.autodiff()
    rng = np.random.default_rng(0)
    w = ember.tensor(rng.standard_normal((16, 4)).astype(F32), device=dev, requires_grad=True)
    x = ember.tensor(rng.standard_normal((3, 16)).astype(F32), device=dev)
    before = default_fused_dev.memory_report()
    h = ember.zeros(3, 1, device=dev)
    for _ in range(5):
        i, f, g, o = (x @ w).chunk(4, 1)
        h = o.sigmoid() * (f.sigmoid() * h + i.sigmoid() * g.tanh()).tanh()
    h.sum().backward()
    after = default_fused_dev.memory_report()
    assert after["fusion_eager"] - before["fusion_eager"] > 50
    assert after["fusion_realizations"] == before["fusion_realizations"]
    assert w.grad is not None and np.all(np.isfinite(w.grad.numpy()))
