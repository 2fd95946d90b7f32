"""Conformance: ember.nn.functional losses and distances on the device under test, against torch.nn.functional."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.nn import functional as F
from ember.testing import torch_or_skip
from ember.testing._helpers import NN_DTYPES as DTYPES
from ember.testing._helpers import E, T, check, raises, rand

torch = torch_or_skip()

TF = torch.nn.functional
REDUCTIONS = ["mean", "sum", "none"]


def _targets(shape, c, seed=0, ignore=None):
    t = np.random.default_rng(seed).integers(0, c, shape).astype(np.int64)
    if ignore is not None and t.size:
        t.reshape(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(6, 5), (5,), (3, 4, 2, 3)], ids=["NC", "C", "NCd1d2"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("ignore", [None, 2])
def test_cross_entropy_class_indices(dtype, reduction, shape, weighted, smoothing, ignore):
    c = shape[1] if len(shape) > 1 else shape[0]
    x = rand(shape, dtype, scale=2.0)
    tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    t = _targets(tshape, c, 1, ignore)
    w = np.abs(rand((c,), dtype, 2)) + 0.1 if weighted else None
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    if ignore is not None:
        kw["ignore_index"] = ignore
    out = F.cross_entropy(E(x, "strided"), E(t), None if w is None else E(w), **kw)
    try:
        ref = TF.cross_entropy(T(x), T(t), None if w is None else T(w), **kw)
    except RuntimeError:  # torch fails on unbatched input with label smoothing; use the batched equivalent
        ref = TF.cross_entropy(T(x[None]), T(t[None]), None if w is None else T(w), **kw)
        ref = ref.reshape(()) if reduction == "none" else ref
    check(out, ref, dtype)
    out = F.nll_loss(F.log_softmax(E(x), dim=1 if len(shape) > 1 else 0), E(t), None if w is None else E(w),
                     reduction=reduction, **({"ignore_index": ignore} if ignore is not None else {}))
    ref = TF.nll_loss(TF.log_softmax(T(x), dim=1 if len(shape) > 1 else 0), T(t), None if w is None else T(w),
                      reduction=reduction, **({"ignore_index": ignore} if ignore is not None else {}))
    check(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(6, 5), (5,), (2, 4, 3)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_probabilities(dtype, reduction, shape, smoothing, weighted):
    x = rand(shape, dtype)
    cdim = 1 if len(shape) > 1 else 0
    p = TF.softmax(T(rand(shape, dtype, 3)), cdim).numpy()
    c = shape[cdim]
    w = np.abs(rand((c,), dtype, 2)) + 0.1 if weighted else None
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    check(F.cross_entropy(E(x), E(p, "strided"), None if w is None else E(w), **kw),
          TF.cross_entropy(T(x), T(p), None if w is None else T(w), **kw), dtype)


def test_cross_entropy_all_ignored_is_nan():
    x = rand((3, 4), np.float32)
    t = np.full(3, -100, np.int64)
    out = F.cross_entropy(E(x), E(t))
    assert np.isnan(out.item()) and np.isnan(TF.cross_entropy(T(x), T(t)).item())


@pytest.mark.parametrize("fn", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_regression_losses(fn, reduction, dtype):
    a, b = rand((4, 5), dtype, 1, 2.0), rand((4, 5), dtype, 2, 2.0)
    check(getattr(F, fn)(E(a, "strided"), E(b), reduction=reduction),
          getattr(TF, fn)(T(a), T(b), reduction=reduction), dtype)


def test_regression_loss_options():
    a, b = rand((4, 5), np.float64, 1, 2.0), rand((4, 5), np.float64, 2, 2.0)
    w = np.abs(rand((4, 5), np.float64, 3))
    for beta in (0.0, 0.5, 3.0):
        check(F.smooth_l1_loss(E(a), E(b), beta=beta), TF.smooth_l1_loss(T(a), T(b), beta=beta))
    check(F.huber_loss(E(a), E(b), delta=0.3), TF.huber_loss(T(a), T(b), delta=0.3))
    for fn in ("mse_loss", "l1_loss"):
        for red in REDUCTIONS:
            check(getattr(F, fn)(E(a), E(b), reduction=red, weight=E(w)),
                  getattr(TF, fn)(T(a), T(b), reduction=red, weight=T(w)))
    for red in REDUCTIONS:
        check(F.huber_loss(E(a), E(b), reduction=red, weight=E(w)), TF.huber_loss(T(a), T(b), reduction=red,
                                                                                   weight=T(w)))
    # broadcasting target and dtype promotion, as torch
    b1 = rand((5,), np.float32, 4)
    with pytest.warns(UserWarning):
        ref = TF.mse_loss(T(a), T(b1))
    check(F.mse_loss(E(a), E(b1)), ref)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy(reduction, dtype):
    x = 1 / (1 + np.exp(-rand((3, 4), dtype, 1)))
    x[0, 0], x[0, 1] = 0.0, 1.0  # log clamps to -100
    t = np.random.default_rng(2).random((3, 4)).astype(dtype)
    w = np.abs(rand((4,), dtype, 3))
    check(F.binary_cross_entropy(E(x), E(t), reduction=reduction),
          TF.binary_cross_entropy(T(x), T(t), reduction=reduction), dtype)
    check(F.binary_cross_entropy(E(x, "strided"), E(t), E(w), reduction=reduction),
          TF.binary_cross_entropy(T(x), T(t), T(w), reduction=reduction), dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy_with_logits(reduction, dtype):
    x = rand((3, 4), dtype, 1, 5.0)
    x[0, 0], x[0, 1] = 80.0, -80.0
    t = np.random.default_rng(2).random((3, 4)).astype(dtype)
    w = np.abs(rand((3, 1), dtype, 3))
    pw = np.abs(rand((4,), dtype, 4))
    for kw in ({}, {"weight": w}, {"pos_weight": pw}, {"weight": w, "pos_weight": pw}):
        check(F.binary_cross_entropy_with_logits(E(x, "strided"), E(t), reduction=reduction,
                                                 **{k: E(v) for k, v in kw.items()}),
              TF.binary_cross_entropy_with_logits(T(x), T(t), reduction=reduction,
                                                  **{k: T(v) for k, v in kw.items()}), dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kl_div(reduction, log_target, dtype):
    x = TF.log_softmax(T(rand((3, 5), dtype, 1)), 1).numpy()
    t = TF.softmax(T(rand((3, 5), dtype, 2)), 1).numpy()
    t[0, 0] = 0.0
    if log_target:
        t = np.log(t + 1e-3).astype(dtype)
    check(F.kl_div(E(x), E(t, "strided"), reduction=reduction, log_target=log_target),
          TF.kl_div(T(x), T(t), reduction=reduction, log_target=log_target), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cosine_similarity_and_pairwise_distance(dtype):
    a, b = rand((4, 6), dtype, 1), rand((4, 6), dtype, 2)
    a[0] = 0.0
    for dim in (0, 1, -1):
        check(F.cosine_similarity(E(a, "strided"), E(b), dim=dim), TF.cosine_similarity(T(a), T(b), dim=dim), dtype)
    b1 = rand((6,), dtype, 3)
    check(F.cosine_similarity(E(a), E(b1), dim=-1), TF.cosine_similarity(T(a), T(b1), dim=-1), dtype)
    for p in (2.0, 1.0, 3.0, float("inf")):
        for keepdim in (False, True):
            check(F.pairwise_distance(E(a), E(b), p=p, keepdim=keepdim),
                  TF.pairwise_distance(T(a), T(b), p=p, keepdim=keepdim), dtype)


def _f(*shape, dtype=np.float32):
    return E(rand(shape, dtype))


def test_loss_errors():
    x = _f(4, 10)
    with raises(ember.IndexOutOfRangeError, "cross_entropy: target 12 is out of bounds for 10 classes"):
        F.cross_entropy(x, ember.tensor([1, 2, 12, 3]))
    with raises(ember.IndexOutOfRangeError, "nll_loss: target -1 is out of bounds for 10 classes"):
        F.nll_loss(x, ember.tensor([1, -1, 2, 3]))
    with raises(ember.DTypeError, "cross_entropy", "bool"):  # a float64 target is promoted with the input
        F.cross_entropy(x, ember.zeros(4, 10, dtype=ember.bool))
    with raises(ember.ShapeError, "cross_entropy", "(4, 9)", "(4, 10)"):
        F.cross_entropy(x, _f(4, 9))
    with raises(ember.DTypeError, "cross_entropy", "int32"):
        F.cross_entropy(x, ember.tensor(np.array([1, 2, 3, 4], np.int32)))
    with raises(ember.ShapeError, "cross_entropy", "expected target of shape (4,)", "(3,)"):
        F.cross_entropy(x, ember.tensor([1, 2, 3]))
    with raises(ember.ShapeError, "cross_entropy", "weight", "(10,)"):
        F.cross_entropy(x, ember.tensor([1, 2, 3, 4]), weight=_f(9))
    with raises(ember.ValueRangeError, "cross_entropy", "reduction", "'avg'"):
        F.cross_entropy(x, ember.tensor([1, 2, 3, 4]), reduction="avg")
    with raises(ember.ValueRangeError, "cross_entropy", "label_smoothing"):
        F.cross_entropy(x, ember.tensor([1, 2, 3, 4]), label_smoothing=1.5)
    with raises(ember.ShapeError, "cross_entropy", "()"):
        F.cross_entropy(ember.tensor(1.0), ember.tensor(0))
    with raises(ember.ValueRangeError, "mse_loss", "reduction"):
        F.mse_loss(x, x, reduction="batchmean")
    with raises(ember.ShapeError, "mse_loss", "(4, 10)", "(3, 10)"):
        F.mse_loss(x, _f(3, 10))
    with raises(ember.DTypeError, "l1_loss", "target", "int64"):
        F.l1_loss(x, ember.tensor(np.ones((4, 10), np.int64)))
    with raises(ember.ShapeError, "mse_loss", "weights and input must have the same size"):
        F.mse_loss(x, x, weight=_f(10))
    with raises(ember.ValueRangeError, "binary_cross_entropy", "between 0 and 1"):
        F.binary_cross_entropy(x, x)
    with raises(ember.ShapeError, "binary_cross_entropy", "target size (4, 1)"):
        F.binary_cross_entropy(ember.tensor(np.full((4, 10), 0.5, np.float32)), _f(4, 1))
    with raises(ember.DTypeError, "binary_cross_entropy_with_logits", "target", "float64"):
        F.binary_cross_entropy_with_logits(x, _f(4, 10, dtype=np.float64))
    with raises(ember.ShapeError, "binary_cross_entropy_with_logits", "pos_weight", "(3,)"):
        F.binary_cross_entropy_with_logits(x, x, pos_weight=_f(3))
    with raises(ember.ValueRangeError, "smooth_l1_loss", "beta"):
        F.smooth_l1_loss(x, x, beta=-1.0)
    with raises(ember.ValueRangeError, "huber_loss", "delta"):
        F.huber_loss(x, x, delta=0.0)
    with raises(ember.ValueRangeError, "kl_div", "reduction"):
        F.kl_div(x, x, reduction="avg")
    with raises(ember.ShapeError, "cosine_similarity", "not broadcastable"):
        F.cosine_similarity(x, _f(3, 10))
