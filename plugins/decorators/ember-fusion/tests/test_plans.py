"""Partitioning and the plan cache: what is stored, how many kernels run, when a plan is reused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember import nn, optim
from ember.nn import functional as F
from ember_fusion import backend as backend_mod
from ember_fusion.backend import FusionBackend

F32 = np.float32


def _arr(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def _gelu_chain(fb: FusionBackend, x: Any, c: float = 0.044715) -> tuple[Any, list[Any]]:
    """A tanh-GELU as 8 recorded ops; returns the result and the intermediate nodes."""
    x3 = fb.binary("mul", fb.binary("mul", x, x), x)
    inner = fb.binary("mul", fb.binary("add", x, fb.binary("mul", x3, c)), 0.7978845608)
    t = fb.binary("add", fb.unary("tanh", inner), 1.0)
    y = fb.binary("mul", fb.binary("mul", x, t), 0.5)
    return y, [x3.node, inner.node, t.node]


def _gelu_np(x: np.ndarray, c: float = 0.044715) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + c * x**3)))


# ----------------------------------------------------------------------------------------------------------------
# dead intermediates are never stored; live ones are stored once
# ----------------------------------------------------------------------------------------------------------------
def test_dropped_intermediates_are_not_stored(fb: FusionBackend) -> None:
    x_np = _arr(64)
    x = fb.from_numpy(x_np.copy())
    y, intermediates = _gelu_chain(fb, x)
    np.testing.assert_allclose(fb.to_numpy(y), _gelu_np(x_np), rtol=1e-5, atol=1e-6)
    assert all(n.value is None for n in intermediates)  # computed inside the kernel, never written out
    assert fb.stats.kernels_run == 1
    (plan,) = fb._plans.values()
    assert len(plan.stored) == 1 and len(plan.steps) == 1


def test_live_intermediate_is_stored_and_read_without_recomputation(fb: FusionBackend) -> None:
    x_np = _arr(64)
    x = fb.from_numpy(x_np.copy())
    t = fb.unary("tanh", fb.binary("mul", x, 0.5))  # kept by the caller
    y = fb.binary("mul", fb.binary("add", t, 1.0), x)
    np.testing.assert_allclose(fb.to_numpy(y), (np.tanh(x_np * 0.5) + 1) * x_np, rtol=1e-5)
    assert t.node.value is not None  # stored by the same plan
    (plan,) = fb._plans.values()
    assert len(plan.stored) == 2
    kernels, realizations = fb.stats.kernels_run, fb.stats.realizations
    np.testing.assert_allclose(fb.to_numpy(t), np.tanh(x_np * 0.5), rtol=1e-6)
    assert (fb.stats.kernels_run, fb.stats.realizations) == (kernels, realizations)


def test_elementwise_outputs_of_one_shape_share_a_kernel(fb: FusionBackend) -> None:
    x_np, y_np = _arr(8, 8), _arr(8, 8, seed=1)
    x, y = fb.from_numpy(x_np.copy()), fb.from_numpy(y_np.copy())
    outs = [fb.binary("add", x, y), fb.binary("mul", x, y), fb.unary("exp", fb.binary("sub", x, y))]
    fb.flush()
    assert fb.stats.kernels_run == 1  # three outputs written by one pass
    np.testing.assert_allclose(fb.to_numpy(outs[2]), np.exp(x_np - y_np), rtol=1e-6)


def test_softmax_pieces(fb: FusionBackend) -> None:
    x_np = _arr(4, 10)
    x = fb.from_numpy(x_np.copy())
    m = fb.reduce("max", x, (1,), True)
    e = fb.unary("exp", fb.binary("sub", x, m))
    s = fb.reduce("sum", e, (1,), True)
    p = fb.binary("div", e, s)
    del e
    want_e = np.exp(x_np - x_np.max(1, keepdims=True))
    np.testing.assert_allclose(fb.to_numpy(p), want_e / want_e.sum(1, keepdims=True), rtol=1e-5)
    assert fb.stats.kernels_run == 3  # max, sum(exp(x - m)), exp(x - m) / s: exp(x - m) is never stored
    np.testing.assert_allclose(fb.to_numpy(s), want_e.sum(1, keepdims=True), rtol=1e-5)


def test_reduction_read_broadcast_is_stored_once(fb: FusionBackend) -> None:
    # layer-norm statistics: mean, then the mean of squared deviations
    x_np = _arr(6, 16)
    x = fb.from_numpy(x_np.copy())
    mean = fb.binary("div", fb.reduce("sum", x, (1,), True), 16.0)
    d = fb.binary("sub", x, mean)
    var = fb.binary("div", fb.reduce("sum", fb.binary("mul", d, d), (1,), True), 16.0)
    y = fb.binary("div", d, fb.unary("sqrt", fb.binary("add", var, 1e-5)))
    del d
    want_d = x_np - x_np.mean(1, keepdims=True)
    want = want_d / np.sqrt((want_d**2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(fb.to_numpy(y), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fb.to_numpy(var), (want_d**2).mean(1, keepdims=True), rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# the plan cache
# ----------------------------------------------------------------------------------------------------------------
def _run_chain(fb: FusionBackend, x_np: np.ndarray, b_np: np.ndarray, scale: float) -> np.ndarray:
    x, b = fb.from_numpy(x_np.copy()), fb.from_numpy(b_np.copy())
    y = fb.binary("mul", fb.unary("sigmoid", fb.binary("add", x, b)), scale)
    return fb.to_numpy(fb.reduce("sum", y, (0,), False))


def _chain_np(x: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    return (scale / (1 + np.exp(-(x + b)))).sum(0)


def test_plan_hit_with_other_scalars_data_and_dims(fb: FusionBackend, stats_of: Callable[[Any], Any]) -> None:
    cases = [((3, 4), 0.5, 0), ((3, 4), 2.0, 1), ((3, 4), -1.0, 2), ((5, 7), 3.0, 3), ((9, 2), 0.25, 4)]
    compiled = []
    for shape, scale, seed in cases:
        x_np, b_np = _arr(*shape, seed=seed), _arr(shape[1], seed=seed + 10)
        np.testing.assert_allclose(_run_chain(fb, x_np, b_np, scale), _chain_np(x_np, b_np, scale), rtol=1e-5)
        st = stats_of(fb)
        compiled.append(st["fusion_kernels_compiled"] + st["fusion_kernels_interpreted"])
    assert compiled == [compiled[0]] * len(cases)  # kernels compiled on the first run only
    st = stats_of(fb)
    assert st["fusion_plan_misses"] == 1
    assert st["fusion_plan_hits"] == len(cases) - 1
    assert st["fusion_plans_cached"] == 1


@pytest.mark.parametrize("shape", [(4, 4), (1, 4), (3, 1)])
def test_plan_miss_when_dim_equality_or_size_one_changes(fb: FusionBackend, stats_of: Callable[[Any], Any],
                                                         shape: tuple[int, int]) -> None:
    x_np, b_np = _arr(3, 4), _arr(4, seed=1)
    _run_chain(fb, x_np, b_np, 1.0)
    x_np, b_np = _arr(*shape, seed=2), _arr(shape[1], seed=3)
    np.testing.assert_allclose(_run_chain(fb, x_np, b_np, 1.0), _chain_np(x_np, b_np, 1.0), rtol=1e-5)
    assert stats_of(fb)["fusion_plan_misses"] == 2


@pytest.mark.parametrize("change", ["op", "dtype", "keep_intermediate", "reduce_dim", "scalar_type"])
def test_plan_miss_on_structural_change(fb: FusionBackend, stats_of: Callable[[Any], Any], change: str) -> None:
    def run(variant: str) -> Any:
        x_np = _arr(3, 4)
        dtype = np.float64 if variant == "dtype" else F32
        x = fb.from_numpy(x_np.astype(dtype))
        a = fb.binary("mul", x, 2 if variant == "scalar_type" else 2.0)
        b = fb.unary("cos" if variant == "op" else "sin", a)
        r = fb.reduce("sum", b, (0,) if variant == "reduce_dim" else (1,), False)
        if variant != "keep_intermediate":
            del a
        out = fb.to_numpy(r)
        want = np.sin(x_np.astype(dtype) * 2) if variant != "op" else np.cos(x_np.astype(dtype) * 2)
        np.testing.assert_allclose(out, want.sum(0 if variant == "reduce_dim" else 1), rtol=1e-5)
        return out

    run("base")
    run("base")
    assert stats_of(fb)["fusion_plan_hits"] == 1
    run(change)
    assert stats_of(fb)["fusion_plan_misses"] == 2


def test_plan_cache_is_bounded(fb: FusionBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_mod, "PLAN_CACHE_SIZE", 3)
    x = fb.from_numpy(_arr(4))
    for op in ("sin", "cos", "tan", "exp", "tanh"):
        fb.to_numpy(fb.unary("neg", fb.unary(op, x)))  # two ops: a single op runs without a plan
    assert len(fb._plans) == 3


def test_plan_cache_keeps_recently_used_plans(fb: FusionBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_mod, "PLAN_CACHE_SIZE", 2)
    x = fb.from_numpy(_arr(4))
    for op in ("sin", "cos", "sin", "tan", "sin"):  # sin is used most recently when tan evicts a plan
        fb.to_numpy(fb.unary("neg", fb.unary(op, x)))
    assert fb.stats.plan_hits == 2


def test_a_single_op_on_values_in_memory_runs_without_a_plan(fb: FusionBackend) -> None:
    x_np = _arr(3, 4)
    x = fb.from_numpy(x_np.copy())
    before = fb.memory_report()
    np.testing.assert_allclose(fb.to_numpy(fb.binary("add", x, 1.5)), x_np + 1.5, rtol=1e-6)
    np.testing.assert_allclose(fb.to_numpy(fb.reduce("max", x, (1,), False)), x_np.max(1), rtol=1e-6)
    np.testing.assert_array_equal(fb.to_numpy(fb.full((2,), 7, dt.int32)), [7, 7])
    after = fb.memory_report()
    assert after["fusion_single_ops"] - before["fusion_single_ops"] == 3
    assert after["fusion_plan_hits"] + after["fusion_plan_misses"] == before["fusion_plan_hits"] + \
        before["fusion_plan_misses"]


# ----------------------------------------------------------------------------------------------------------------
# what the scheduler hands to fusion_compile
# ----------------------------------------------------------------------------------------------------------------
def test_each_distinct_kernel_is_compiled_once(ifb: FusionBackend) -> None:
    for n in (4, 8, 16, 4):
        x = ifb.from_numpy(_arr(n, seed=n))
        ifb.to_numpy(ifb.binary("add", ifb.unary("exp", x), 1.0))
    assert len(ifb.inner.kernels) == 1
    (k,) = ifb.inner.kernels
    assert [i.op for i in k.body] == ["load", "unary", "scalar", "binary"]
    assert k.reduce is None and k.scalars == 1 and k.inputs == (dt.float32,)


def test_fills_become_scalar_arguments(ifb: FusionBackend) -> None:
    x_np = _arr(3, 4)
    x = ifb.from_numpy(x_np.copy())
    y = ifb.binary("mul", x, ifb.full((3, 4), 1.5, dt.float32))
    np.testing.assert_allclose(ifb.to_numpy(y), x_np * 1.5, rtol=1e-6)
    (k,) = ifb.inner.kernels
    assert k.inputs == (dt.float32,) and k.scalars == 1  # the fill was not materialized


def test_reduce_kernel_shape(ifb: FusionBackend) -> None:
    x_np = _arr(2, 3, 4)
    x = ifb.from_numpy(x_np.copy())
    r = ifb.reduce("sum", ifb.binary("mul", x, x), (0, 2), False)
    np.testing.assert_allclose(ifb.to_numpy(r), (x_np**2).sum((0, 2)), rtol=1e-5)
    # the backend declined the fused reduction (it returns None), so the body was offered alone to run before
    # the backend's own reduce
    k, body = ifb.inner.kernels
    assert k.rank == 3 and k.reduce == ("sum", (0, 2)) and len(k.outputs) == 1
    assert body.reduce is None and body.body == k.body and body.outputs == k.outputs


def test_reduce_kernel_dims_are_sorted(ifb: FusionBackend) -> None:
    # core's norm_dims keeps the user's order: x.sum(dim=(2, 0)) reaches the backend as dims (2, 0)
    x_np = _arr(2, 3, 4)
    x = ifb.from_numpy(x_np.copy())
    r = ifb.reduce("sum", ifb.binary("mul", x, 2.0), (2, 0), False)
    np.testing.assert_allclose(ifb.to_numpy(r), (x_np * 2).sum((0, 2)), rtol=1e-5)
    k = ifb.inner.kernels[0]
    assert k.reduce is not None and list(k.reduce[1]) == sorted(k.reduce[1])


def test_kernel_order_respects_dependencies_through_inlined_values(fb: FusionBackend) -> None:
    # z (4,) is inlined into x (1, 4) (equal element counts), so x's group has the same level as y's group; the
    # group of shape (1, 4) starts earlier (x1) and runs before y is computed
    a_np, b_np = np.arange(4.0).reshape(1, 4), np.arange(4.0) * 10
    a, b = fb.from_numpy(a_np.copy()), fb.from_numpy(b_np.copy())
    x1 = fb.binary("mul", a, 2.0)
    y = fb.binary("add", b, 1.0)
    z = fb.binary("mul", y, 3.0)
    x = fb.binary("add", z, a)
    del z
    fb.flush()
    np.testing.assert_array_equal(fb.to_numpy(x), (b_np + 1) * 3 + a_np)
    np.testing.assert_array_equal(fb.to_numpy(x1), a_np * 2)
    np.testing.assert_array_equal(fb.to_numpy(y), b_np + 1)


def test_kernel_order_bug_at_tensor_level(fused_dev: ember.Device) -> None:
    a = ember.tensor([[0.0, 1.0, 2.0, 3.0]], device=fused_dev)
    bias = ember.tensor([0.0, 10.0, 20.0, 30.0], device=fused_dev)
    h = a * 2
    b1 = bias + 1
    out = (b1 * 3) + a
    fused_dev.sync()
    np.testing.assert_array_equal(out.numpy(), [[3.0, 34.0, 65.0, 96.0]])
    np.testing.assert_array_equal(h.numpy(), [[0.0, 2.0, 4.0, 6.0]])


# ----------------------------------------------------------------------------------------------------------------
# the size bound
# ----------------------------------------------------------------------------------------------------------------
def test_max_pending_bound_flushes_on_the_stack(inner: Any) -> None:
    fb = FusionBackend(inner, max_pending=8)
    x_np = _arr(5)
    h = fb.from_numpy(x_np.copy())
    hs = []
    for i in range(7):
        h = fb.binary("add", h, 1.0)
        hs.append(h)
        assert h.node.value is None, i
    h = fb.binary("add", h, 1.0)  # the 8th recorded op runs everything pending
    assert all(x.node.value is not None for x in [*hs, h])
    assert fb.stats.realizations == 1
    np.testing.assert_allclose(fb.to_numpy(h), x_np + 8, rtol=1e-6)
    h2 = fb.binary("mul", h, 2.0)
    assert h2.node.value is None  # the count starts again


def test_max_pending_option_on_a_device(fused_dev: ember.Device, is_pending: Callable[[Any], bool]) -> None:
    dev = fused_dev.fusion(max_pending=8, eager_below=0)
    stack = dev.stack
    assert isinstance(stack, FusionBackend) and stack.max_pending == 8
    assert stack is not fused_dev.stack and stack.inner is fused_dev.stack.inner  # one flex backend, one pool
    x = ember.tensor(np.ones(4, F32), device=dev)
    assert not is_pending(x)
    ts = []
    for _ in range(7):
        x = x + 1
        ts.append(x)
    assert all(is_pending(t) for t in ts)
    x = x * 2
    assert not any(is_pending(t) for t in [*ts, x])
    np.testing.assert_array_equal(x.numpy(), np.full(4, 16.0, F32))


# ----------------------------------------------------------------------------------------------------------------
# a training loop replays its plans
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_training_loop_hits_its_plans(fused_dev: ember.Device, stats_of: Callable[[Any], Any], opt_name: str) -> None:
    dev = fused_dev.autodiff()
    fused = dev.stack.inner
    assert isinstance(fused, FusionBackend)
    rng = np.random.default_rng(0)
    x_np, w_true = rng.standard_normal((32, 5)).astype(F32), rng.standard_normal((5, 1)).astype(F32)
    X, Y = ember.tensor(x_np, device=dev), ember.tensor(x_np @ w_true, device=dev)
    ember.manual_seed(0)  # the initial weights: a fixed start, so "it still trains" below is not a matter of luck
    model = nn.Linear(5, 1).to(dev)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd" else \
        optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for it in range(12):
        if it == 3:
            before = stats_of(fused)
        opt.zero_grad()
        loss = F.mse_loss(model(X), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    after = stats_of(fused)
    hits = after["fusion_plan_hits"] - before["fusion_plan_hits"]
    misses = after["fusion_plan_misses"] - before["fusion_plan_misses"]
    assert hits > 0 and misses == 0, (hits, misses)
    assert losses[-1] < losses[0] * 0.5  # it still trains

    # the same steps on an unfused device give the same weights
    ref_dev = fused_dev.fusion(False).autodiff()
    assert "Fusion" not in type(ref_dev.stack.inner).__name__
    ref = nn.Linear(5, 1).to(ref_dev)
    model2 = nn.Linear(5, 1).to(dev)
    with ember.no_grad():
        ref.weight.copy_(ember.tensor(model2.weight.numpy(), device=ref_dev))
        ref.bias.copy_(ember.tensor(model2.bias.numpy(), device=ref_dev))
    opts = [optim.Adam(m.parameters(), lr=0.05) for m in (model2, ref)]
    for m, o, d in ((model2, opts[0], dev), (ref, opts[1], ref_dev)):
        xs, ys = ember.tensor(x_np, device=d), ember.tensor(x_np @ w_true, device=d)
        for _ in range(5):
            o.zero_grad()
            F.mse_loss(m(xs), ys).backward()
            o.step()
    np.testing.assert_allclose(model2.weight.numpy(), ref.weight.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model2.bias.numpy(), ref.bias.numpy(), rtol=1e-5, atol=1e-6)
