"""The gradient-routing contract methods (select_at, select_ties, keep_graph, write_back, embedding) as
ember-autodiff implements them, through the core ops that call them, against torch autograd (float64).

Core computes these ops' values the same way on every stack and declares how they were selected; only the
differentiable stack turns that into PyTorch's gradient (ties, NaNs, returned indices, empty inputs, the padding
row, in-place writes). Every case runs with and without balanced checkpointing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import Device

torch = pytest.importorskip("torch")

NAN = math.nan


@pytest.fixture(params=[None, "balanced"], ids=["plain", "balanced"])
def dev(request: pytest.FixtureRequest) -> Device:
    base = Device.flex()
    return base.autodiff() if request.param is None else base.autodiff(checkpointing="balanced")


def _grads(dev: Device, fn: Callable[..., Any], tfn: Callable[..., Any], *arrays: np.ndarray) -> None:
    """fn on ember leaves and tfn on torch leaves, both summed with fixed weights, backpropagated; gradients
    compared (NaN-aware, None where torch gives None)."""
    xs = [ember.tensor(a, dtype=ember.float64, device=dev, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out, tout = fn(*xs), tfn(*ts)
    w = np.arange(1, int(np.prod(tout.shape)) + 1, dtype=np.float64).reshape(tuple(tout.shape))
    (out * ember.tensor(w, device=dev)).sum().backward()
    (tout * torch.tensor(w)).sum().backward()
    for i, (x, t) in enumerate(zip(xs, ts)):
        if t.grad is None:
            assert x.grad is None or not np.any(x.grad.numpy()), f"input {i}: torch has no gradient"
            continue
        assert x.grad is not None, f"input {i}: no gradient"
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12, equal_nan=True,
                                   err_msg=f"input {i}")


VECTORS = {
    "ties": np.array([1.0, 3.0, 3.0, 2.0, 3.0]),
    "nan": np.array([1.0, NAN, 3.0, NAN, 0.5]),
    "plain": np.array([0.3, -1.2, 2.5, 0.7, -0.1]),
}


@pytest.mark.parametrize("name", ["max", "min", "median"])
@pytest.mark.parametrize("vec", list(VECTORS), ids=list(VECTORS))
def test_full_reduction_splits_among_ties(dev: Device, name: str, vec: str) -> None:
    # PyTorch's evenly_distribute_backward: among the elements equal to the result, the NaNs when it is NaN
    a = VECTORS[vec].reshape(1, 5)
    _grads(dev, lambda x: getattr(x, name)(), lambda t: getattr(t, name)(), a)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True], ids=["dropdim", "keepdim"])
@pytest.mark.parametrize("dim", [0, 1])
def test_dim_reduction_follows_returned_index(dev: Device, name: str, keepdim: bool, dim: int) -> None:
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5], [NAN, 1.0, NAN]])
    _grads(dev, lambda x: getattr(x, name)(dim, keepdim=keepdim).values,
           lambda t: getattr(t, name)(dim, keepdim=keepdim).values, a)


def test_median_dim_follows_returned_index(dev: Device) -> None:
    a = np.array([[1.0, 3.0, 3.0, 2.0], [2.0, 2.0, 0.5, 2.0]])
    _grads(dev, lambda x: x.median(1).values, lambda t: t.median(1).values, a)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("vec", list(VECTORS), ids=list(VECTORS))
def test_cumulative_extreme_follows_indices(dev: Device, name: str, vec: str) -> None:
    a = np.stack([VECTORS[vec], VECTORS[vec][::-1]])
    _grads(dev, lambda x: getattr(ember, name)(x, 1).values, lambda t: getattr(torch, name)(t, 1).values, a)


def test_untracked_values_unchanged(dev: Device) -> None:
    a = np.array([[1.0, 3.0, 3.0], [NAN, 1.0, 0.0]])
    x = ember.tensor(a, device=dev, requires_grad=True)
    with ember.no_grad():
        outs = [x.max(), x.min(1).values, ember.cummax(x, 1).values, x.median()]
    t = torch.tensor(a)
    refs = [t.max(), t.min(1).values, torch.cummax(t, 1).values, t.median()]
    for o, r in zip(outs, refs):
        assert not o.requires_grad
        np.testing.assert_array_equal(o.numpy(), r.numpy())


def test_cat_skipped_empty_inputs_get_empty_gradients(dev: Device) -> None:
    e = ember.zeros(0, dtype=ember.float64, device=dev, requires_grad=True)
    b = ember.ones(2, 3, dtype=ember.float64, device=dev, requires_grad=True)
    (ember.cat([e, b, e]) * 2.0).sum().backward()
    assert e.grad is not None and e.grad.shape == (0,)
    np.testing.assert_array_equal(b.grad.numpy(), np.full((2, 3), 2.0))
    only = ember.zeros(0, dtype=ember.float64, device=dev, requires_grad=True)
    r = ember.cat([only, only])
    assert r.requires_grad and r.shape == (0,)
    r.sum().backward()
    assert only.grad is not None and only.grad.shape == (0,)


def test_empty_conv_ties_weight_and_bias(dev: Device) -> None:
    x = ember.zeros(0, 2, 5, 5, dtype=ember.float64, device=dev, requires_grad=True)
    w = ember.ones(3, 2, 3, 3, dtype=ember.float64, device=dev, requires_grad=True)
    b = ember.ones(3, dtype=ember.float64, device=dev, requires_grad=True)
    F.conv2d(x, w, b).sum().backward()
    for t in (x, w, b):
        assert t.grad is not None and t.grad.shape == t.shape and not np.any(t.grad.numpy())


@pytest.mark.parametrize("padding_idx", [1, -1, None])
def test_embedding_padding_row_gets_no_gradient(dev: Device, padding_idx: int | None) -> None:
    idx = np.array([[0, 1, 3], [3, 1, 2]])
    w = np.arange(15, dtype=np.float64).reshape(5, 3) / 7.0
    _grads(dev, lambda x: F.embedding(ember.tensor(idx, device=dev), x, padding_idx=padding_idx),
           lambda t: torch.nn.functional.embedding(torch.tensor(idx), t, padding_idx=padding_idx), w)


def test_inplace_on_leaf_that_requires_grad_is_refused(dev: Device) -> None:
    w = ember.ones(3, dtype=ember.float64, device=dev, requires_grad=True)
    with pytest.raises(ember.errors.AutodiffError, match="inplace activation.*leaf"):
        F.relu_(w)
    with ember.no_grad():  # allowed there, written into w's memory
        F.relu_(w.mul_(-1.0))
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))


def test_inplace_on_intermediate_keeps_history(dev: Device) -> None:
    a = np.array([-1.0, 0.5, 2.0, -0.3])

    def fn(x: Any) -> Any:
        y = x * 3.0
        z = y.exp()  # saved y's old value: the in-place write below must not disturb it
        F.relu_(y)
        return y + z

    def tfn(t: Any) -> Any:
        y = t * 3.0
        z = y.exp()
        y = torch.relu(y)
        return y + z

    _grads(dev, fn, tfn, a)


@pytest.mark.parametrize("name", ["relu", "relu6", "hardtanh"])
def test_clamping_activations_zero_gradient_at_bounds(dev: Device, name: str) -> None:
    # PyTorch: zero gradient at the tie (relu at 0) and at the bounds (hardtanh at -1 and 1, relu6 at 0 and 6);
    # a NaN passes the gradient
    a = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0, NAN])
    _grads(dev, getattr(F, name), getattr(torch.nn.functional, name), a)


def test_relu_inplace_on_intermediate(dev: Device) -> None:
    a = np.array([-1.0, 0.0, 2.0])
    _grads(dev, lambda x: F.relu((x * 2.0), inplace=True), lambda t: torch.relu_(t * 2.0), a)
    a = np.array([-1.0, 0.0, 2.0])
    _grads(dev, lambda x: F.relu((x * 2.0), inplace=True), lambda t: torch.relu_(t * 2.0), a)


@pytest.mark.parametrize("case", ["plain", "zero-row", "tiny"])
def test_cosine_similarity_clamp_is_invisible_to_the_gradient(dev: Device, case: str) -> None:
    a = np.array([[0.3, -1.2, 2.5], [0.7, -0.1, 0.4]])
    b = np.array([[1.0, 2.0, -0.5], [0.2, 0.1, -0.3]])
    if case == "zero-row":
        a[1] = 0.0
    elif case == "tiny":
        b[0] *= 1e-9  # norm below eps: the value is clamped, the gradient is not
    _grads(dev, lambda x, y: F.cosine_similarity(x, y, dim=1, eps=1e-8),
           lambda x, y: torch.nn.functional.cosine_similarity(x, y, dim=1, eps=1e-8), a, b)


# -- clamp (Backend.clamp): the input's gradient inside [lo, hi] inclusive, never at NaN; tensor bounds' outside --
_X = np.array([[-2.0, -0.5, 0.0, 0.5, 2.0, NAN], [1.0, -1.0, 0.25, -0.25, 3.0, -3.0]])


@pytest.mark.parametrize("case", ["scalars", "at-bounds", "min-only", "tensor-bounds", "crossed", "broadcast-bounds"])
def test_clamp_routes_each_operands_gradient_as_torch(dev: Device, case: str) -> None:
    if case == "scalars":
        _grads(dev, lambda x: ember.clamp(x, -0.5, 0.5), lambda x: torch.clamp(x, -0.5, 0.5), _X)
    elif case == "at-bounds":  # values equal to a bound keep the input's gradient (inclusive), like torch
        _grads(dev, lambda x: ember.clamp(x, -1.0, 1.0), lambda x: torch.clamp(x, -1.0, 1.0), _X)
    elif case == "min-only":
        _grads(dev, lambda x: ember.clamp(x, min=0.0), lambda x: torch.clamp(x, min=0.0), _X)
    elif case == "tensor-bounds":
        lo, hi = np.full((2, 6), -0.5), np.full((2, 6), 0.5)
        _grads(dev, lambda x, a, b: ember.clamp(x, a, b), lambda x, a, b: torch.clamp(x, a, b), _X, lo, hi)
    elif case == "crossed":  # hi < lo in some places: hi wins, and gets the gradient there
        lo, hi = np.full((2, 6), 0.5), np.array([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]] * 2)
        _grads(dev, lambda x, a, b: ember.clamp(x, a, b), lambda x, a, b: torch.clamp(x, a, b), _X, lo, hi)
    else:  # bounds broadcast against the input: their gradients are summed back to their own shapes
        lo, hi = np.array([-0.5] * 6), np.array([[0.4], [0.6]])
        _grads(dev, lambda x, a, b: ember.clamp(x, a, b), lambda x, a, b: torch.clamp(x, a, b), _X, lo, hi)
