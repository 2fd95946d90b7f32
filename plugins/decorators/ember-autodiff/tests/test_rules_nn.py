"""Gradient rules of matmul, einsum, convolutions, pooling and interpolation (rules_nn) against torch autograd.

Everything runs in float64 through the public entry points (``ember.matmul``, ``ember.einsum``,
``ember.nn.functional``), with and without balanced checkpointing, and seeds the backward with a random
gradient so no reduction rule sits on the gradient path. Convolutions are also checked on an inner backend
without the optional ``conv_input_grad`` / ``conv_weight_grad`` kernels (the composition fallback).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember
import ember.nn.functional as F
from ember import Device
from ember.backend import Backend
from ember.tensor import Tensor
from ember_autodiff.backend import AutodiffBackend

# flex's own backend class, reached through core (no plugin imports another, tests included)
FlexBackend = type(Device.flex().stack.base_backend)

pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")

PLAIN = Device.flex().autodiff()
BALANCED = Device.flex().autodiff(checkpointing="balanced")


def _missing(name: str) -> bool:
    return getattr(AutodiffBackend, name) is getattr(Backend, name)


# the fallback compositions of adaptive_avg_pool / interpolate / einsum run reductions on the autodiff stack
needs_reduce = pytest.mark.skipif(_missing("reduce") or _missing("cumulative"),
                                  reason="reduction rules not installed yet (parallel work)")


class _NoKernels(FlexBackend):
    """flex without the optional conv backward kernels: the decorator must fall back to compositions."""

    conv_input_grad = None  # type: ignore[assignment]
    conv_weight_grad = None  # type: ignore[assignment]


@pytest.fixture(params=["plain", "balanced"])
def dev(request: pytest.FixtureRequest) -> Device:
    return PLAIN if request.param == "plain" else BALANCED


@pytest.fixture(params=["kernels", "no_kernels"])
def kdev(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Device:
    """The plain autodiff device, its inner flex backend with or without the optional backward kernels."""
    if request.param == "no_kernels":
        monkeypatch.setattr(PLAIN.stack, "inner", _NoKernels())
    return PLAIN


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(abs(hash(request.node.name)) % (2**32))


def _np(t: Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


def check(dev: Device, rng: np.random.Generator, fe: Callable[..., Any], ft: Callable[..., Any],
          *arrays: np.ndarray | None, grad: tuple[bool, ...] | None = None, tol: float = 1e-10) -> None:
    """Run fe on ember leaves and ft on torch leaves (None passes through); compare output and gradients."""
    grad = grad or tuple(a is not None for a in arrays)
    es = [None if a is None else ember.tensor(a, dtype=ember.float64, device=dev, requires_grad=r)
          for a, r in zip(arrays, grad)]
    ts = [None if a is None else torch.tensor(a, dtype=torch.float64, requires_grad=r)
          for a, r in zip(arrays, grad)]
    ye, yt = fe(*es), ft(*ts)
    np.testing.assert_allclose(_np(ye), yt.detach().numpy(), rtol=tol, atol=tol)
    g = rng.standard_normal(tuple(yt.shape))
    ye.backward(ember.tensor(g, dtype=ember.float64, device=dev))
    yt.backward(torch.tensor(g, dtype=torch.float64))
    for i, (e, t) in enumerate(zip(es, ts)):
        if e is None or not t.requires_grad:
            continue
        assert e.grad is not None, f"operand {i} got no gradient"
        assert e.grad.shape == tuple(t.shape)
        np.testing.assert_allclose(_np(e.grad), t.grad.numpy(), rtol=tol, atol=tol, err_msg=f"operand {i}")


def _r(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


# ----------------------------------------------------------------------------------------------------------
# matmul
# ----------------------------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((2, 3), (5, 3, 4)),
    ((5, 1, 2, 3), (4, 3, 2)),
    ((3,), (5, 3, 4)),
    ((5, 2, 3), (3,)),
    ((1, 2, 3), (6, 3, 4)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_ranks(dev: Device, rng: np.random.Generator, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check(dev, rng, ember.matmul, torch.matmul, _r(rng, *sa), _r(rng, *sb))


def test_matmul_one_side_and_views(dev: Device, rng: np.random.Generator) -> None:
    check(dev, rng, lambda a, b: a.transpose(0, 1) @ b, lambda a, b: a.transpose(0, 1) @ b,
          _r(rng, 3, 4), _r(rng, 3, 2), grad=(False, True))
    check(dev, rng, lambda a, b: a @ b.transpose(-1, -2), lambda a, b: a @ b.transpose(-1, -2),
          _r(rng, 2, 4, 3), _r(rng, 2, 5, 3), grad=(True, False))


def test_matmul_same_tensor_accumulates(dev: Device, rng: np.random.Generator) -> None:
    check(dev, rng, lambda a: a @ a, lambda a: a @ a, _r(rng, 4, 4))


# ----------------------------------------------------------------------------------------------------------
# einsum
# ----------------------------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]),
    ("ii->", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("bii->bi", [(2, 3, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ij,k->ik", [(2, 3), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(1, 2, 3), (4, 3, 5)]),
    ("...ij,...jk->...ik", [(2, 3), (4, 3, 5)]),
    ("i...,i...->...", [(3, 2, 4), (3, 1, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij,ij->ij", [(1, 4), (3, 4)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM_CASES)
def test_einsum(dev: Device, rng: np.random.Generator, eq: str, shapes: list[tuple[int, ...]]) -> None:
    arrays = [_r(rng, *s) for s in shapes]
    check(dev, rng, lambda *xs: ember.einsum(eq, *xs), lambda *xs: torch.einsum(eq, *xs), *arrays)


def test_einsum_partial_grad(dev: Device, rng: np.random.Generator) -> None:
    check(dev, rng, lambda a, b: ember.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b),
          _r(rng, 2, 3), _r(rng, 3, 4), grad=(False, True))


# ----------------------------------------------------------------------------------------------------------
# convolution
# ----------------------------------------------------------------------------------------------------------
CONV_CASES = [
    # nd, x shape, w shape, kwargs
    (1, (2, 4, 9), (6, 4, 3), {}),
    (1, (2, 4, 10), (6, 2, 4), {"stride": 3, "padding": 2, "dilation": 2, "groups": 2}),
    (1, (2, 3, 8), (4, 3, 4), {"padding": "same"}),
    (1, (2, 3, 9), (4, 3, 2), {"padding": "same", "dilation": 3}),
    (2, (2, 4, 7, 6), (6, 2, 3, 2), {"stride": (2, 1), "padding": 1, "dilation": (1, 2), "groups": 2}),
    (2, (2, 3, 8, 7), (5, 3, 4, 2), {"padding": "same"}),
    (2, (1, 4, 9, 9), (4, 1, 3, 3), {"stride": 2, "padding": (0, 1), "groups": 4}),
    (2, (2, 3, 11, 10), (4, 3, 3, 3), {"stride": 3}),
    (3, (2, 2, 5, 6, 5), (4, 2, 2, 3, 2), {"stride": (1, 2, 1), "padding": (1, 0, 1)}),
    (3, (1, 4, 5, 5, 6), (4, 2, 3, 2, 3), {"padding": "same", "dilation": (1, 2, 1), "groups": 2}),
]
CONV = {1: (F.conv1d, TF.conv1d), 2: (F.conv2d, TF.conv2d), 3: (F.conv3d, TF.conv3d)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("nd,xs,ws,kw", CONV_CASES)
def test_conv(kdev: Device, rng: np.random.Generator, nd: int, xs: tuple[int, ...], ws: tuple[int, ...],
              kw: dict[str, Any], bias: bool) -> None:
    fe, ft = CONV[nd]
    b = _r(rng, ws[0]) if bias else None
    check(kdev, rng, lambda x, w, b: fe(x, w, b, **kw), lambda x, w, b: ft(x, w, b, **kw),
          _r(rng, *xs), _r(rng, *ws), b)


def test_conv_balanced_and_partial(dev: Device, rng: np.random.Generator) -> None:
    kw = {"stride": 2, "padding": 1}
    for grad in ((True, False, False), (False, True, False), (False, False, True), (False, True, True)):
        check(dev, rng, lambda x, w, b: F.conv2d(x, w, b, **kw), lambda x, w, b: TF.conv2d(x, w, b, **kw),
              _r(rng, 2, 3, 7, 7), _r(rng, 4, 3, 3, 3), _r(rng, 4), grad=grad)


def test_conv_chain_through_relu(dev: Device, rng: np.random.Generator) -> None:
    """Two convs with an activation between: exercises saved outputs under balanced checkpointing."""
    def fe(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
        return F.conv2d(F.relu(F.conv2d(x, w1, padding=1)), w2, stride=2)

    def ft(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return TF.conv2d(TF.relu(TF.conv2d(x, w1, padding=1)), w2, stride=2)

    check(dev, rng, fe, ft, _r(rng, 2, 3, 8, 8), _r(rng, 4, 3, 3, 3), _r(rng, 5, 4, 2, 2))


def test_no_kernel_fallback_is_used(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """Without the optional kernels the gradient comes from conv_transpose (input) and conv (weight)."""
    inner = _NoKernels()
    calls: list[str] = []
    orig_t, orig_c = inner.conv_transpose, inner.conv
    monkeypatch.setattr(inner, "conv_transpose", lambda *a: calls.append("conv_transpose") or orig_t(*a))
    monkeypatch.setattr(inner, "conv", lambda *a: calls.append("conv") or orig_c(*a))
    monkeypatch.setattr(PLAIN.stack, "inner", inner)
    x = ember.tensor(_r(rng, 1, 2, 5, 5), dtype=ember.float64, device=PLAIN, requires_grad=True)
    w = ember.tensor(_r(rng, 3, 2, 3, 3), dtype=ember.float64, device=PLAIN, requires_grad=True)
    y = F.conv2d(x, w, padding="same")
    y.backward(ember.ones(y.shape, dtype=ember.float64, device=PLAIN))
    assert calls == ["conv", "conv_transpose", "conv"]


def test_flex_kernels_are_used(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    inner = PLAIN.stack.inner
    calls: list[str] = []
    for name in ("conv_input_grad", "conv_weight_grad"):
        orig = getattr(inner, name)
        monkeypatch.setattr(inner, name, lambda *a, _n=name, _o=orig: calls.append(_n) or _o(*a))
    x = ember.tensor(_r(rng, 1, 2, 5, 5), dtype=ember.float64, device=PLAIN, requires_grad=True)
    w = ember.tensor(_r(rng, 3, 2, 3, 3), dtype=ember.float64, device=PLAIN, requires_grad=True)
    F.conv2d(x, w).backward(ember.ones((1, 3, 3, 3), dtype=ember.float64, device=PLAIN))
    assert sorted(calls) == ["conv_input_grad", "conv_weight_grad"]


@pytest.mark.parametrize("kernel", ["max_pool_backward", None])
def test_max_pool_gradient_through_the_kernel_or_the_scatter(monkeypatch: pytest.MonkeyPatch,
                                                             rng: np.random.Generator, kernel: str | None) -> None:
    """flex's optional max_pool_backward kernel is used when present; hidden, the scatter composition gives the same
    gradient; both equal torch's (overlapping windows included: gradients landing on one input add up)."""
    inner = PLAIN.stack.inner
    calls: list[str] = []
    if kernel is None:
        monkeypatch.setattr(type(inner), "max_pool_backward", property(lambda self: None))
    else:
        orig = inner.max_pool_backward
        monkeypatch.setattr(inner, "max_pool_backward", lambda *a: calls.append("kernel") or orig(*a))
    x_np = _r(rng, 2, 3, 7, 7)
    for ks, st in ((2, 2), (3, 1)):  # disjoint and overlapping windows
        x = ember.tensor(x_np, dtype=ember.float64, device=PLAIN, requires_grad=True)
        y = F.max_pool2d(x, ks, st)
        g_np = _r(rng, *y.shape)
        y.backward(ember.tensor(g_np, dtype=ember.float64, device=PLAIN))
        tx = torch.tensor(x_np, requires_grad=True)
        torch.nn.functional.max_pool2d(tx, ks, st).backward(torch.tensor(g_np))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert calls == (["kernel", "kernel"] if kernel else [])


def test_unbatched_handles_at_the_contract_level(kdev: Device, rng: np.random.Generator) -> None:
    """The contract allows unbatched (C, *S) inputs to conv / conv_transpose (core batches them itself)."""
    s = kdev.stack
    cases = [
        (lambda x, w: s.conv(x, w, None, (2, 1), ((1, 2), (0, 1)), (1, 2), 2),
         lambda x, w: TF.conv2d(TF.pad(x, (0, 1, 1, 2)), w, None, (2, 1), 0, (1, 2), 2), (4, 1, 3, 2)),
        (lambda x, w: s.conv_transpose(x, w, None, (2, 1), (1, 0), (1, 0), (1, 1), 1),
         lambda x, w: TF.conv_transpose2d(x, w, None, (2, 1), (1, 0), (1, 0), 1, (1, 1)), (2, 3, 3, 2)),
    ]
    for fwd, tfwd, ws in cases:
        xa, wa = _r(rng, 2, 6, 5), _r(rng, *ws)
        x = ember.tensor(xa, dtype=ember.float64, device=kdev, requires_grad=True)
        w = ember.tensor(wa, dtype=ember.float64, device=kdev, requires_grad=True)
        y = Tensor._make(fwd(x._h, w._h), ember.float64, kdev)
        tx, tw = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
        ty = tfwd(tx, tw)
        assert y.shape == tuple(ty.shape)
        np.testing.assert_allclose(_np(y), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
        g = rng.standard_normal(tuple(ty.shape))
        y.backward(ember.tensor(g, dtype=ember.float64, device=kdev))
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(_np(x.grad), tx.grad.numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(_np(w.grad), tw.grad.numpy(), rtol=1e-10, atol=1e-10)


CONVT_CASES = [
    (1, (2, 4, 5), (4, 3, 3), {}),
    (1, (2, 4, 5), (4, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}),
    (1, (2, 2, 6), (2, 3, 2), {"stride": 3, "output_padding": 2}),  # output_padding beyond padding
    (2, (2, 4, 4, 5), (4, 3, 3, 2), {"stride": (2, 1), "padding": (1, 0), "output_padding": (1, 0)}),
    (2, (1, 6, 3, 4), (6, 1, 3, 3), {"stride": 2, "padding": 1, "dilation": 2, "output_padding": 1, "groups": 3}),
    (3, (1, 2, 3, 3, 2), (2, 3, 2, 2, 3), {"stride": (2, 1, 2), "padding": (0, 1, 1), "output_padding": (1, 0, 0)}),
]
CONVT = {1: (F.conv_transpose1d, TF.conv_transpose1d), 2: (F.conv_transpose2d, TF.conv_transpose2d),
         3: (F.conv_transpose3d, TF.conv_transpose3d)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("nd,xs,ws,kw", CONVT_CASES)
def test_conv_transpose(kdev: Device, rng: np.random.Generator, nd: int, xs: tuple[int, ...],
                        ws: tuple[int, ...], kw: dict[str, Any], bias: bool) -> None:
    fe, ft = CONVT[nd]
    b = _r(rng, ws[1] * kw.get("groups", 1)) if bias else None
    check(kdev, rng, lambda x, w, b: fe(x, w, b, **kw), lambda x, w, b: ft(x, w, b, **kw),
          _r(rng, *xs), _r(rng, *ws), b)


def test_conv_transpose_balanced(dev: Device, rng: np.random.Generator) -> None:
    kw = {"stride": 2, "padding": 1, "output_padding": 1}
    check(dev, rng, lambda x, w: F.conv_transpose2d(x, w, **kw), lambda x, w: TF.conv_transpose2d(x, w, **kw),
          _r(rng, 2, 3, 4, 4), _r(rng, 3, 2, 3, 3))


# ----------------------------------------------------------------------------------------------------------
# pooling and interpolation
# ----------------------------------------------------------------------------------------------------------
MAXPOOL_CASES = [
    (1, (2, 3, 11), {"kernel_size": 3, "stride": 1}),  # overlapping windows accumulate
    (1, (2, 3, 10), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    (2, (2, 3, 7, 8), {"kernel_size": 2}),
    (2, (2, 3, 9, 8), {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2}),
    (2, (1, 2, 7, 7), {"kernel_size": (3, 2), "stride": (2, 1), "ceil_mode": True}),
    (2, (3, 8, 9), {"kernel_size": 3, "stride": 2}),  # unbatched
    (3, (1, 2, 5, 6, 5), {"kernel_size": 2, "stride": 1, "padding": 1}),
]
MAXPOOL = {1: (F.max_pool1d, TF.max_pool1d), 2: (F.max_pool2d, TF.max_pool2d), 3: (F.max_pool3d, TF.max_pool3d)}


@pytest.mark.parametrize("nd,xs,kw", MAXPOOL_CASES)
def test_max_pool(dev: Device, rng: np.random.Generator, nd: int, xs: tuple[int, ...], kw: dict[str, Any]) -> None:
    fe, ft = MAXPOOL[nd]
    check(dev, rng, lambda x: fe(x, **kw), lambda x: ft(x, **kw), _r(rng, *xs))


def test_max_pool_ties_follow_torch(dev: Device, rng: np.random.Generator) -> None:
    x = rng.integers(0, 3, (2, 2, 7, 7)).astype(np.float64)  # many equal maxima in overlapping windows
    kw = {"kernel_size": 3, "stride": 1, "padding": 1}
    check(dev, rng, lambda x: F.max_pool2d(x, **kw), lambda x: TF.max_pool2d(x, **kw), x)


def test_max_pool_indices_untracked(dev: Device, rng: np.random.Generator) -> None:
    a = _r(rng, 2, 3, 6, 6)
    x = ember.tensor(a, dtype=ember.float64, device=dev, requires_grad=True)
    y, idx = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
    ty, tidx = TF.max_pool2d(torch.tensor(a), 3, stride=2, padding=1, return_indices=True)
    assert y.requires_grad and not idx.requires_grad
    assert idx.dtype == ember.int64
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    check(dev, rng, lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[0],
          lambda x: TF.max_pool2d(x, 3, 2, 1, return_indices=True)[0], a)


AVGPOOL_CASES = [
    (1, (2, 3, 10), {"kernel_size": 3, "stride": 2, "padding": 1}),
    (1, (2, 3, 10), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False, "ceil_mode": True}),
    (2, (2, 3, 7, 8), {"kernel_size": 2}),
    (2, (2, 3, 7, 8), {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False}),
    (2, (1, 2, 9, 8), {"kernel_size": (3, 2), "stride": 2, "padding": 1, "ceil_mode": True}),
    (2, (1, 2, 6, 6), {"kernel_size": 3, "stride": 2, "divisor_override": 5}),
    (3, (1, 2, 5, 6, 5), {"kernel_size": 2, "stride": 1, "padding": 1, "count_include_pad": False}),
]
AVGPOOL = {1: (F.avg_pool1d, TF.avg_pool1d), 2: (F.avg_pool2d, TF.avg_pool2d), 3: (F.avg_pool3d, TF.avg_pool3d)}


@pytest.mark.parametrize("nd,xs,kw", AVGPOOL_CASES)
def test_avg_pool(dev: Device, rng: np.random.Generator, nd: int, xs: tuple[int, ...], kw: dict[str, Any]) -> None:
    fe, ft = AVGPOOL[nd]
    check(dev, rng, lambda x: fe(x, **kw), lambda x: ft(x, **kw), _r(rng, *xs))


@pytest.mark.parametrize("out", [(3, 4), (2, 2), (5, 3)])
def test_adaptive_max_pool(dev: Device, rng: np.random.Generator, out: tuple[int, int]) -> None:
    check(dev, rng, lambda x: F.adaptive_max_pool2d(x, out), lambda x: TF.adaptive_max_pool2d(x, out),
          _r(rng, 2, 3, 7, 6))
    check(dev, rng, lambda x: F.adaptive_max_pool1d(x, out[0]), lambda x: TF.adaptive_max_pool1d(x, out[0]),
          _r(rng, 2, 3, 7))


@needs_reduce
@pytest.mark.parametrize("out", [(3, 4), (1, 1), (5, 3)])
def test_adaptive_avg_pool(dev: Device, rng: np.random.Generator, out: tuple[int, int]) -> None:
    check(dev, rng, lambda x: F.adaptive_avg_pool2d(x, out), lambda x: TF.adaptive_avg_pool2d(x, out),
          _r(rng, 2, 3, 7, 6))


@needs_reduce
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(9, 5), (3, 4)])
def test_interpolate_bilinear(dev: Device, rng: np.random.Generator, align_corners: bool,
                              size: tuple[int, int]) -> None:
    kw = {"size": size, "mode": "bilinear", "align_corners": align_corners}
    check(dev, rng, lambda x: F.interpolate(x, **kw), lambda x: TF.interpolate(x, **kw), _r(rng, 2, 3, 5, 6))


def test_untracked_results_have_no_grad_fn(rng: np.random.Generator) -> None:
    x = ember.tensor(_r(rng, 1, 2, 5, 5), dtype=ember.float64, device=PLAIN)
    w = ember.tensor(_r(rng, 3, 2, 3, 3), dtype=ember.float64, device=PLAIN)
    for y in (F.conv2d(x, w), F.max_pool2d(x, 2), F.avg_pool2d(x, 2), ember.einsum("ncij->nc", x),
              x.reshape(2, 25) @ x.reshape(25, 2)):
        assert not y.requires_grad and y.grad_fn is None
    with ember.no_grad():
        w.requires_grad_()
        assert F.conv2d(x, w).grad_fn is None
    assert F.conv2d(x, w).grad_fn is not None


# ----------------------------------------------------------------------------------------------------------
# rough timing (printed, not asserted): run with -s to see it
# ----------------------------------------------------------------------------------------------------------
def test_conv2d_train_step_timing(rng: np.random.Generator) -> None:
    xa = rng.standard_normal((64, 64, 13, 13)).astype(np.float32)
    wa = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    ga = rng.standard_normal((64, 64, 13, 13)).astype(np.float32)

    def best(fn: Callable[[], Any], n: int = 5) -> float:
        fn()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    x = ember.tensor(xa, device=PLAIN, requires_grad=True)
    w = ember.tensor(wa, device=PLAIN, requires_grad=True)
    g = ember.tensor(ga, device=PLAIN)

    def ember_step() -> None:
        F.conv2d(x, w, padding=1).backward(g)

    tx, tw, tg = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True), torch.tensor(ga)

    def torch_step() -> None:
        TF.conv2d(tx, tw, padding=1).backward(tg)

    te, tt = best(ember_step), best(torch_step)
    print(f"\nconv2d fwd+bwd x(64,64,13,13) w(64,64,3,3) float32: flex+autodiff {te * 1e3:.1f} ms, "
          f"torch {tt * 1e3:.1f} ms (torch threads {torch.get_num_threads()})")
    np.testing.assert_allclose(_np(w.grad), tw.grad.numpy(), rtol=1e-3, atol=1e-1)  # both accumulated 6 steps
