"""Recording: which ops are deferred, what forces execution, errors at the call site, and mutation safety."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember import DTypeError, ShapeError
from ember import dtypes as dt
from ember_fusion.backend import FusionBackend
from ember_fusion.graph import FArray

F32 = np.float32


def _arr(*shape: int, seed: int = 0, dtype: Any = F32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------------------------------------------
# the stack API: recorded ops stay pending and run nothing
# ----------------------------------------------------------------------------------------------------------------
def test_recorded_ops_are_pending_and_run_nothing(fb: FusionBackend) -> None:
    a_np, b_np = _arr(3, 4), _arr(4, seed=1)
    a, b = fb.from_numpy(a_np.copy()), fb.from_numpy(b_np.copy())
    before = fb.stats.kernels_run
    u = fb.unary("exp", a)
    s = fb.binary("mul", u, 2.0)
    r = fb.binary("sub", 1.0, s)
    bb = fb.binary("add", r, b)  # broadcast operand
    c = fb.binary("gt", bb, 0.0)
    w = fb.where(c, bb, -1.0)
    k = fb.cast(w, dt.float64)
    f = fb.full((3, 4), 0.5, dt.float64)
    m = fb.binary("add", k, f)
    red = fb.reduce("sum", m, (1,), False)
    handles = [u, s, r, bb, c, w, k, f, m, red]
    assert all(h.node.value is None for h in handles)
    assert fb.stats.kernels_run == before
    assert fb.stats.realizations == 0
    assert fb.stats.recorded == len(handles)
    # dtypes and shapes are known without running anything
    assert fb.dtype_of(c) is dt.bool_ and fb.dtype_of(k) is dt.float64
    assert red.shape == (3,) and bb.shape == (3, 4)

    e = np.exp(a_np) * 2.0
    want_bb = (1.0 - e) + b_np
    want_w = np.where(want_bb > 0, want_bb, F32(-1.0)).astype(np.float64)
    np.testing.assert_allclose(fb.to_numpy(red), (want_w + 0.5).sum(1), rtol=1e-5)
    assert fb.stats.kernels_run > before
    np.testing.assert_allclose(fb.to_numpy(w), want_w.astype(F32), rtol=1e-5)
    np.testing.assert_array_equal(fb.to_numpy(c), want_bb > 0)


def test_reduce_keepdim_and_all_dims(fb: FusionBackend) -> None:
    x_np = _arr(2, 3, 4)
    x = fb.from_numpy(x_np.copy())
    sq = fb.binary("mul", x, x)
    r1 = fb.reduce("max", sq, (0, 2), True)
    r2 = fb.reduce("min", sq, (0, 1, 2), False)
    r3 = fb.reduce("prod", fb.binary("add", sq, 1.0), (1,), False)
    assert r1.node.value is None and r2.node.value is None and r3.node.value is None
    assert r1.shape == (1, 3, 1) and r2.shape == () and r3.shape == (2, 4)
    np.testing.assert_allclose(fb.to_numpy(r1), (x_np * x_np).max(axis=(0, 2), keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(fb.to_numpy(r2), (x_np * x_np).min(), rtol=1e-6)
    np.testing.assert_allclose(fb.to_numpy(r3), (x_np * x_np + 1).prod(axis=1), rtol=1e-5)


def test_sync_runs_everything_pending(fb: FusionBackend) -> None:
    x = fb.from_numpy(_arr(5))
    ys = [fb.binary("mul", x, float(i)) for i in range(4)]
    assert all(y.node.value is None for y in ys)
    fb.sync()
    assert all(y.node.value is not None for y in ys)
    kernels = fb.stats.kernels_run
    for i, y in enumerate(ys):
        np.testing.assert_allclose(fb.to_numpy(y), fb.to_numpy(x) * i, rtol=1e-6)
    assert fb.stats.kernels_run == kernels  # reads of realized values run nothing


def test_boundary_ops_realize_their_inputs_only(fb: FusionBackend) -> None:
    a_np, b_np = _arr(3, 4), _arr(4, 2, seed=1)
    a, b = fb.from_numpy(a_np.copy()), fb.from_numpy(b_np.copy())
    t = fb.unary("tanh", a)
    other = fb.binary("add", b, 1.0)
    mm = fb.matmul(t, b)  # boundary: t is realized, the independent pending value is not
    assert t.node.value is not None and type(mm) is not FArray  # a boundary's result: the inner handle
    assert other.node.value is None
    np.testing.assert_allclose(fb.to_numpy(mm), np.tanh(a_np) @ b_np, rtol=1e-5)
    r = fb.reshape(fb.binary("mul", a, 3.0), (4, 3))
    assert type(r) is not FArray
    np.testing.assert_allclose(fb.to_numpy(r), (a_np * 3).reshape(4, 3), rtol=1e-6)
    g = fb.getitem(fb.binary("sub", a, 1.0), (slice(1, None), 0))
    assert type(g) is not FArray
    np.testing.assert_allclose(fb.to_numpy(g), (a_np - 1)[1:, 0], rtol=1e-6)
    assert fb.stats.boundaries >= 3


# ----------------------------------------------------------------------------------------------------------------
# Tensor level: what records and what forces execution
# ----------------------------------------------------------------------------------------------------------------
def test_tensor_elementwise_ops_are_recorded(fused_dev: ember.Device, is_pending: Callable[[Any], bool]) -> None:
    x_np = _arr(4, 5)
    x = ember.tensor(x_np, device=fused_dev)
    y = ember.nn.functional.relu(x * 2 + 1)
    z = ember.where(y > 1, y, x).to(ember.float64)
    s = z.sum(dim=1, keepdim=True)
    f = ember.full((4, 5), 3.0, device=fused_dev)
    g = (f * x).amax(dim=0)
    for t in (y, z, s, f, g):
        assert is_pending(t), t._h.node
    want_y = np.maximum(x_np * 2 + 1, 0)
    want_z = np.where(want_y > 1, want_y, x_np).astype(np.float64)
    np.testing.assert_allclose(s.numpy(), want_z.sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(g.numpy(), (3 * x_np).max(0), rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), want_z, rtol=1e-6)


@pytest.mark.parametrize("read", ["numpy", "item", "bool", "float", "str", "repr", "tolist", "sync"])
def test_tensor_reads_force_execution(fused_dev: ember.Device, is_pending: Callable[[Any], bool], read: str) -> None:
    x = ember.tensor([1.5, -2.0, 3.25], device=fused_dev)
    y = (x * 2).sum() if read in ("item", "bool", "float") else x * 2
    assert is_pending(y)
    if read == "numpy":
        np.testing.assert_array_equal(y.numpy(), [3.0, -4.0, 6.5])
    elif read == "item":
        assert y.item() == 5.5
    elif read == "bool":
        assert bool(y) is True
    elif read == "float":
        assert float(y) == 5.5
    elif read in ("str", "repr"):
        text = str(y) if read == "str" else repr(y)
        assert "6.5" in text and "-4." in text
    elif read == "tolist":
        assert y.tolist() == [3.0, -4.0, 6.5]
    else:
        fused_dev.sync()
    assert not is_pending(y)


def test_tensor_boundary_ops_force_execution(fused_dev: ember.Device, is_pending: Callable[[Any], bool]) -> None:
    a_np, b_np = _arr(3, 4), _arr(4, 2, seed=1)
    a, b = ember.tensor(a_np, device=fused_dev), ember.tensor(b_np, device=fused_dev)
    h = a.tanh()
    assert is_pending(h)
    mm = h @ b
    assert not is_pending(h)
    np.testing.assert_allclose(mm.numpy(), np.tanh(a_np) @ b_np, rtol=1e-5)
    for make, want in (
        (lambda t: t[1:, ::2], lambda n: n[1:, ::2]),
        (lambda t: t.reshape(2, 6), lambda n: n.reshape(2, 6)),
        (lambda t: t.t(), lambda n: n.T),
    ):
        p = a * 3 - 1
        assert is_pending(p)
        v = make(p)
        assert not is_pending(p)
        np.testing.assert_allclose(v.numpy(), want(a_np * 3 - 1), rtol=1e-6)


@pytest.mark.parametrize("how", ["add_", "mul_", "setitem", "copy_", "fill_"])
def test_tensor_in_place_ops_on_pending_values(fused_dev: ember.Device, how: str) -> None:
    x_np = _arr(3, 4)
    x = ember.tensor(x_np, device=fused_dev)
    y = x * 2  # pending
    want = x_np * 2
    if how == "add_":
        y.add_(1)
        want = want + 1
    elif how == "mul_":
        y.mul_(y)
        want = want * want
    elif how == "setitem":
        y[0] = 5.0
        want[0] = 5.0
    elif how == "copy_":
        y.copy_(x)
        want = x_np.copy()
    else:
        y.fill_(7.0)
        want = np.full_like(want, 7.0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), x_np)


# ----------------------------------------------------------------------------------------------------------------
# errors are raised at the op, not at a later read
# ----------------------------------------------------------------------------------------------------------------
def test_shape_mismatch_raises_at_the_op(fused_dev: ember.Device, stats_of: Callable[[Any], Any]) -> None:
    a = ember.ones(3, 4, device=fused_dev) * 2
    b = ember.ones(5, device=fused_dev) + 1
    recorded = stats_of(fused_dev)["fusion_recorded"]
    with pytest.raises(ShapeError, match=r"\(3, 4\).*\(5,\)|\(5,\).*\(3, 4\)"):
        a + b
    assert stats_of(fused_dev)["fusion_recorded"] == recorded  # nothing was recorded for the failed op
    with pytest.raises(ShapeError):
        ember.where(a > 0, a, b)
    with pytest.raises(ShapeError):
        a.add_(ember.ones(3, 1, 2, device=fused_dev))
    np.testing.assert_array_equal(a.numpy(), np.full((3, 4), 2.0, F32))  # the graph is still usable


def test_dtype_errors_raise_at_the_op(fused_dev: ember.Device) -> None:
    f = ember.ones(3, device=fused_dev) * 2
    i = ember.tensor([1, 2, 3], dtype=ember.int32, device=fused_dev) + 1
    with pytest.raises(DTypeError):
        f & f  # bitwise op on floats
    with pytest.raises(DTypeError):
        (i > 1) - (i > 2)  # subtracting bools
    with pytest.raises(DTypeError):
        f.bitwise_not()
    with pytest.raises(Exception) as info:
        f.sum(dim=3)
    assert isinstance(info.value, ember.EmberError)
    np.testing.assert_array_equal(i.numpy(), [2, 3, 4])


# ----------------------------------------------------------------------------------------------------------------
# mutation safety: pending readers keep the values they read when their inputs are later changed in place
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mutate", ["add_", "setitem", "copy_", "zero_", "iadd", "mul_self"])
def test_pending_reader_keeps_old_values(fused_dev: ember.Device, is_pending: Callable[[Any], bool],
                                         mutate: str) -> None:
    x_np = _arr(3, 4)
    x = ember.tensor(x_np, device=fused_dev)
    y = x * 2
    z = (x + 1).sum(dim=0)
    assert is_pending(y) and is_pending(z)
    if mutate == "add_":
        x.add_(1)
    elif mutate == "setitem":
        x[0] = 5.0
    elif mutate == "copy_":
        x.copy_(ember.zeros(3, 4, device=fused_dev))
    elif mutate == "zero_":
        x.zero_()
    elif mutate == "iadd":
        x += 10
    else:
        x.mul_(x)
    np.testing.assert_allclose(y.numpy(), x_np * 2, rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), (x_np + 1).sum(0), rtol=1e-5)


@pytest.mark.parametrize("view", ["t", "slice", "reshape", "select"])
def test_pending_reader_of_a_view_keeps_old_values(fused_dev: ember.Device, view: str) -> None:
    x_np = _arr(4, 4)
    x = ember.tensor(x_np, device=fused_dev)
    views = {"t": (lambda t: t.t(), lambda n: n.T), "slice": (lambda t: t[1:], lambda n: n[1:]),
             "reshape": (lambda t: t.reshape(2, 8), lambda n: n.reshape(2, 8)),
             "select": (lambda t: t[:, 2], lambda n: n[:, 2])}
    make, want = views[view]
    v = make(x)
    y = v * 3 + 1
    x.add_(100)  # mutate the base
    np.testing.assert_allclose(y.numpy(), want(x_np) * 3 + 1, rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), want(x_np + 100), rtol=1e-6)  # the view itself does see the write


def test_mutating_a_view_keeps_pending_readers_of_the_base(fused_dev: ember.Device) -> None:
    x_np = _arr(3, 4)
    x = ember.tensor(x_np, device=fused_dev)
    y = x.exp()
    v = x[1:]
    v.mul_(0)
    v2 = x.t()
    v2[0] = -1.0
    np.testing.assert_allclose(y.numpy(), np.exp(x_np), rtol=1e-6)
    want = x_np.copy()
    want[1:] = 0
    want[:, 0] = -1
    np.testing.assert_allclose(x.numpy(), want)


def test_in_place_on_pending_value_keeps_other_readers(fused_dev: ember.Device) -> None:
    x_np = _arr(5)
    x = ember.tensor(x_np, device=fused_dev)
    a = x * 2  # pending
    b = a + 1  # pending reader of a's old value
    a.add_(10)
    c = a * 3  # reads the new value
    np.testing.assert_allclose(b.numpy(), x_np * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), (x_np * 2 + 10) * 3, rtol=1e-6)
    np.testing.assert_allclose(a.numpy(), x_np * 2 + 10, rtol=1e-6)


def test_stack_in_place_ops_flush_pending_readers(fb: FusionBackend) -> None:
    x_np = _arr(3, 4)
    x = fb.from_numpy(x_np.copy())
    y = fb.binary("mul", x, 2.0)
    fb.inplace_binary("add", x, 1.0)
    np.testing.assert_allclose(fb.to_numpy(y), x_np * 2, rtol=1e-6)
    y2 = fb.unary("neg", x)
    fb.setitem(x, (0,), 9.0)
    np.testing.assert_allclose(fb.to_numpy(y2), -(x_np + 1), rtol=1e-6)
    y3 = fb.binary("add", x, x)
    fb.assign(x, fb.full((3, 4), 0.0, dt.float32))
    want = x_np + 1
    want[0] = 9
    np.testing.assert_allclose(fb.to_numpy(y3), want * 2, rtol=1e-6)
    np.testing.assert_array_equal(fb.to_numpy(x), np.zeros((3, 4), F32))


def test_in_place_with_a_pending_operand_that_reads_the_target(fb: FusionBackend) -> None:
    # x += x.T-like read of the target's own memory through a view: must not read half-updated values
    x_np = np.arange(16, dtype=F32).reshape(4, 4)
    x = fb.from_numpy(x_np.copy())
    xt = fb.permute(x, (1, 0))
    other = fb.binary("mul", xt, 1.0)
    fb.inplace_binary("add", x, other)
    np.testing.assert_array_equal(fb.to_numpy(x), x_np + x_np.T)


# ----------------------------------------------------------------------------------------------------------------
# threads
# ----------------------------------------------------------------------------------------------------------------
def _thread_work(k: int, run: Callable[[np.ndarray], np.ndarray], errors: list[BaseException]) -> None:
    try:
        for it in range(25):
            x_np = np.random.default_rng(k * 1000 + it).standard_normal((8, 6)).astype(F32)
            got = run(x_np)
            want = (np.tanh(x_np * (k + 1)) + 1).sum(1) * 0.5
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        errors.append(exc)


def _run_threads(run: Callable[[int], Callable[[np.ndarray], np.ndarray]], warm: bool = True) -> None:
    if warm:
        # flex's fused kernels time both code paths on their first calls per size class; warming up here lets the
        # threads run the chosen paths (test_threads_with_cold_flex_kernels runs the timing itself under threads)
        warm_up = run(0)
        for _ in range(8):
            warm_up(np.ones((8, 6), F32))
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_thread_work, args=(k, run(k), errors)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        import traceback

        raise AssertionError("".join(traceback.format_exception(errors[0])))


def test_threads_on_one_fused_stack(fb: FusionBackend) -> None:
    def run(k: int) -> Callable[[np.ndarray], np.ndarray]:
        def f(x_np: np.ndarray) -> np.ndarray:
            x = fb.from_numpy(x_np)
            t = fb.binary("add", fb.unary("tanh", fb.binary("mul", x, float(k + 1))), 1.0)
            return fb.to_numpy(fb.binary("mul", fb.reduce("sum", t, (1,), False), 0.5))

        return f

    _run_threads(run)
    assert fb.stats.plan_hits > 0


def test_threads_on_the_fused_device(fused_dev: ember.Device) -> None:
    def run(k: int) -> Callable[[np.ndarray], np.ndarray]:
        def f(x_np: np.ndarray) -> np.ndarray:
            x = ember.tensor(x_np, device=fused_dev)
            return (((x * (k + 1)).tanh() + 1).sum(dim=1) * 0.5).numpy()

        return f

    _run_threads(run)


def test_threads_with_cold_flex_kernels() -> None:
    from ember import Device

    for _ in range(5):
        fb = FusionBackend(Device.flex().fusion(False).stack)

        def run(k: int, fb: FusionBackend = fb) -> Callable[[np.ndarray], np.ndarray]:
            def f(x_np: np.ndarray) -> np.ndarray:
                x = fb.from_numpy(x_np)
                t = fb.binary("add", fb.unary("tanh", fb.binary("mul", x, float(k + 1))), 1.0)
                return fb.to_numpy(fb.binary("mul", fb.reduce("sum", t, (1,), False), 0.5))

            return f

        _run_threads(run, warm=False)
