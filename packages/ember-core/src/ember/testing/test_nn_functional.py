"""Conformance: ember.nn.functional linear, embedding, one_hot, dropout, normalisation and attention on the
device under test, against torch."""

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
MM_TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def test_nn_exposes_functional():
    assert ember.nn.functional is F
    for name in F.__all__:
        assert callable(getattr(F, name)), name


# ---------------------------------------------------------------------------------------------- linear
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("xshape", [(5,), (3, 5), (2, 3, 5)])
def test_linear(dtype, xshape):
    x, w, b = rand(xshape, dtype, 1), rand((4, 5), dtype, 2), rand((4,), dtype, 3)
    check(F.linear(E(x, "strided"), E(w, "strided"), E(b)), TF.linear(T(x), T(w), T(b)), **MM_TOL[dtype])
    check(F.linear(E(x), E(w)), TF.linear(T(x), T(w)), **MM_TOL[dtype])
    w1 = rand((5,), dtype, 4)
    check(F.linear(E(x), E(w1)), TF.linear(T(x), T(w1)), **MM_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_bilinear(dtype):
    x1, x2 = rand((2, 3, 4), dtype, 1), rand((2, 3, 5), dtype, 2)
    w, b = rand((6, 4, 5), dtype, 3), rand((6,), dtype, 4)
    check(F.bilinear(E(x1), E(x2, "strided"), E(w), E(b)), TF.bilinear(T(x1), T(x2), T(w), T(b)), **MM_TOL[dtype])
    check(F.bilinear(E(x1[0]), E(x2[0]), E(w)), TF.bilinear(T(x1[0]), T(x2[0]), T(w)), **MM_TOL[dtype])


def test_linear_errors():
    x = E(rand((2, 5), np.float32))
    with raises(ember.ShapeError, "linear: input has 5 features (shape (2, 5)) but weight expects 4 "
                                  "(weight shape (3, 4))"):
        F.linear(x, E(rand((3, 4), np.float32)))
    with raises(ember.DTypeError, "linear", "weight", "float64"):
        F.linear(x, E(rand((3, 5))))
    with raises(ember.ShapeError, "linear", "bias", "(2,)"):
        F.linear(x, E(rand((3, 5), np.float32)), E(rand((2,), np.float32)))
    with raises(ember.ShapeError, "linear", "weight with 2 dims"):
        F.linear(x, E(rand((1, 3, 5), np.float32)))
    with raises(ember.DTypeError, "linear", "int64"):
        F.linear(ember.tensor([[1, 2]]), ember.tensor([[1, 2]]))
    with raises(ember.ShapeError, "bilinear", "(6, 4, 5)"):
        F.bilinear(E(rand((2, 3))), E(rand((2, 5))), E(rand((6, 4, 5))))


# ---------------------------------------------------------------------------------------------- embedding
def test_embedding_and_padding_idx():
    w = rand((10, 3), np.float32)
    idx = np.array([[1, 2, 9], [0, 2, 4]])
    check(F.embedding(E(idx), E(w)), TF.embedding(T(idx), T(w)))
    check(F.embedding(E(idx), E(w), padding_idx=-1), TF.embedding(T(idx), T(w), padding_idx=-1))
    check(F.embedding(E(idx.astype(np.int32)), E(w)), TF.embedding(T(idx.astype(np.int32)), T(w)))
    check(F.embedding(E(np.array(3)), E(w)), TF.embedding(T(np.array(3)), T(w)))


def test_embedding_max_norm_renormalises_weight_in_place():
    w = rand((6, 4), np.float64, scale=3.0)
    idx = np.array([0, 2, 2, 5])
    we, wt = E(w.copy()), T(w.copy())
    check(F.embedding(E(idx), we, max_norm=1.0), TF.embedding(T(idx), wt, max_norm=1.0))
    check(we, wt)
    assert np.allclose(we.numpy()[1], w[1])  # unreferenced rows untouched


def test_embedding_errors():
    w = E(rand((10, 3), np.float32))
    with raises(ember.IndexOutOfRangeError, "embedding", "index 12", "10 rows"):
        F.embedding(ember.tensor([1, 12]), w)
    with raises(ember.IndexOutOfRangeError, "embedding", "index -1"):
        F.embedding(ember.tensor([-1, 2]), w)
    with raises(ember.DTypeError, "embedding", "float32"):
        F.embedding(ember.tensor([1.0]), w)
    with raises(ember.ShapeError, "embedding", "weight with 2 dims"):
        F.embedding(ember.tensor([1]), E(rand((10,))))
    with raises(ember.ValueRangeError, "embedding", "padding_idx"):
        F.embedding(ember.tensor([1]), w, padding_idx=10)


def test_one_hot():
    t = np.array([[0, 3], [2, 1]])
    check(F.one_hot(E(t)), TF.one_hot(T(t)))
    check(F.one_hot(E(t), 6), TF.one_hot(T(t), 6))
    check(F.one_hot(E(np.zeros((0,), np.int64)), 3), TF.one_hot(T(np.zeros((0,), np.int64)), 3))
    with raises(ember.IndexOutOfRangeError, "one_hot", "3", "num_classes=3"):
        F.one_hot(E(t), 3)
    with raises(ember.IndexOutOfRangeError, "one_hot", "non-negative"):
        F.one_hot(ember.tensor([-1, 0]))
    with raises(ember.DTypeError, "one_hot", "int32"):
        F.one_hot(ember.tensor(np.array([1], np.int32)))
    with raises(ember.ValueRangeError, "one_hot", "empty"):
        F.one_hot(E(np.zeros((0,), np.int64)))


# ---------------------------------------------------------------------------------------------- dropout
def test_dropout_statistics_and_scaling():
    ember.manual_seed(0)
    x = ember.ones(200, 100)
    y = F.dropout(x, 0.3).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    assert np.allclose(y[kept], 1 / 0.7)
    assert F.dropout(x, 0.3, training=False) is x
    assert F.dropout(x, 0.0) is x
    assert (F.dropout(x, 1.0).numpy() == 0).all()


def test_dropout_uses_device_stream():
    ember.manual_seed(5)
    a = F.dropout(ember.ones(50), 0.5).numpy()
    ember.manual_seed(5)
    b = F.dropout(ember.ones(50), 0.5).numpy()
    assert (a == b).all()


def test_dropout_inplace():
    x = ember.ones(100, 10)
    out = F.dropout(x, 0.5, inplace=True)
    assert out is x and (x.numpy() == 0).any()


@pytest.mark.parametrize("fn,shape,lead", [
    ("dropout1d", (4, 8, 30), 2), ("dropout1d", (8, 30), 1), ("dropout2d", (4, 8, 5, 6), 2),
    ("dropout2d", (8, 5, 6), 2), ("dropout3d", (2, 8, 3, 4, 5), 2), ("dropout3d", (8, 3, 4, 5), 1),
])
def test_feature_dropout_zeroes_whole_channels(fn, shape, lead):
    ember.manual_seed(1)
    y = getattr(F, fn)(ember.ones(*shape), 0.5).numpy()
    per = y.reshape(shape[:lead] + (-1,))
    assert ((per == 0).all(-1) | (per == 2.0).all(-1)).all()
    assert (per == 0).all(-1).any() and (per == 2.0).all(-1).any()


def test_dropout_errors():
    x = ember.ones(2, 3)
    with raises(ember.ValueRangeError, "dropout", "between 0 and 1", "1.5"):
        F.dropout(x, 1.5)
    with raises(ember.ShapeError, "dropout2d", "(2, 3)"):
        F.dropout2d(x)
    with raises(ember.DTypeError, "dropout", "int64"):
        F.dropout(ember.tensor([1, 2]))


# ---------------------------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ns", [(5,), (4, 5)])
def test_layer_norm(dtype, ns):
    x = rand((3, 4, 5), dtype, 1, 3.0) + 2
    w, b = rand(ns, dtype, 2), rand(ns, dtype, 3)
    check(F.layer_norm(E(x, "strided"), ns, E(w), E(b)), TF.layer_norm(T(x), ns, T(w), T(b)), dtype)
    check(F.layer_norm(E(x), ns[-1] if len(ns) == 1 else ns, eps=1e-3),
          TF.layer_norm(T(x), ns, eps=1e-3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    x = rand((3, 4, 5), dtype, 1)
    w = rand((4, 5), dtype, 2)
    check(F.rms_norm(E(x), (4, 5), E(w)), TF.rms_norm(T(x), (4, 5), T(w)), dtype)
    check(F.rms_norm(E(x, "strided"), [5], eps=1e-2), TF.rms_norm(T(x), [5], eps=1e-2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_norm_training_updates_running_stats(dtype, shape):
    x = rand(shape, dtype, 1, 2.0) + 1
    w, b = rand((3,), dtype, 2), rand((3,), dtype, 3)
    rm, rv = rand((3,), dtype, 4), np.abs(rand((3,), dtype, 5)) + 0.5
    erm, erv, trm, trv = E(rm.copy()), E(rv.copy()), T(rm.copy()), T(rv.copy())
    out = F.batch_norm(E(x, "strided"), erm, erv, E(w), E(b), training=True, momentum=0.2)
    ref = TF.batch_norm(T(x), trm, trv, T(w), T(b), training=True, momentum=0.2)
    check(out, ref, dtype)
    check(erm, trm, dtype)
    check(erv, trv, dtype)
    # eval mode uses the running stats
    check(F.batch_norm(E(x), erm, erv, E(w), E(b)), TF.batch_norm(T(x), trm, trv, T(w), T(b)), dtype)
    check(F.batch_norm(E(x), None, None, training=True), TF.batch_norm(T(x), None, None, training=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 6, 3, 4), 2), ((3, 4), 2), ((2, 4, 3), 1)])
def test_group_norm(dtype, shape, groups):
    x = rand(shape, dtype, 1, 2.0)
    c = shape[1]
    w, b = rand((c,), dtype, 2), rand((c,), dtype, 3)
    check(F.group_norm(E(x, "strided"), groups, E(w), E(b)), TF.group_norm(T(x), groups, T(w), T(b)), dtype)
    check(F.group_norm(E(x), groups, eps=1e-2), TF.group_norm(T(x), groups, eps=1e-2), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5)])
def test_instance_norm(dtype, shape):
    x = rand(shape, dtype, 1, 2.0)
    w, b = rand((3,), dtype, 2), rand((3,), dtype, 3)
    rm, rv = rand((3,), dtype, 4), np.abs(rand((3,), dtype, 5)) + 0.5
    check(F.instance_norm(E(x, "strided"), weight=E(w), bias=E(b)), TF.instance_norm(T(x), weight=T(w), bias=T(b)),
          dtype)
    erm, erv, trm, trv = E(rm.copy()), E(rv.copy()), T(rm.copy()), T(rv.copy())
    check(F.instance_norm(E(x), erm, erv, momentum=0.3), TF.instance_norm(T(x), trm, trv, momentum=0.3), dtype)
    check(erm, trm, dtype)
    check(erv, trv, dtype)
    check(F.instance_norm(E(x), erm, erv, use_input_stats=False),
          TF.instance_norm(T(x), trm, trv, use_input_stats=False), dtype)


def test_norm_errors():
    x = E(rand((2, 3, 4), np.float32))
    with raises(ember.ShapeError, "layer_norm", "normalized_shape (5,)", "(2, 3, 4)"):
        F.layer_norm(x, 5)
    with raises(ember.ShapeError, "layer_norm", "weight", "(4,)", "(3,)"):
        F.layer_norm(x, 4, E(rand((3,), np.float32)))
    with raises(ember.DTypeError, "layer_norm", "bias", "float64"):
        F.layer_norm(x, 4, None, E(rand((4,))))
    with raises(ember.ShapeError, "rms_norm", "normalized_shape"):
        F.rms_norm(x, (3,))
    with raises(ember.ValueRangeError, "batch_norm", "more than 1 value per channel", "(1, 3)"):
        F.batch_norm(E(rand((1, 3), np.float32)), None, None, training=True)
    with raises(ember.ValueRangeError, "batch_norm", "running_mean"):
        F.batch_norm(x, None, None)
    with raises(ember.ShapeError, "batch_norm", "running_mean", "(3,)", "(4,)"):
        F.batch_norm(x, ember.zeros(4), ember.ones(4))
    with raises(ember.ShapeError, "batch_norm", "at least 2 dims"):
        F.batch_norm(E(rand((3,), np.float32)), None, None, training=True)
    with raises(ember.ShapeError, "group_norm", "divisible by num_groups", "(2, 3, 4)", "num_groups=2"):
        F.group_norm(x, 2)
    with raises(ember.ShapeError, "instance_norm", "at least 3 dims"):
        F.instance_norm(E(rand((2, 3), np.float32)))
    with raises(ember.ValueRangeError, "instance_norm", "more than 1 spatial element"):
        F.instance_norm(E(rand((2, 3, 1), np.float32)))


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", [None, "bool", "float", "causal", "bool-broadcast"])
def test_sdpa(dtype, mask):
    q, k, v = rand((2, 3, 5, 8), dtype, 1), rand((2, 3, 7, 8), dtype, 2), rand((2, 3, 7, 6), dtype, 3)
    kw_e, kw_t = {}, {}
    if mask == "bool":
        m = np.random.default_rng(4).random((2, 3, 5, 7)) > 0.3
        m[0, 0, 1] = False  # one fully-masked row gives zeros
        kw_e["attn_mask"], kw_t["attn_mask"] = E(m), T(m)
    elif mask == "bool-broadcast":
        m = np.random.default_rng(4).random((5, 7)) > 0.3
        kw_e["attn_mask"], kw_t["attn_mask"] = E(m), T(m)
    elif mask == "float":
        m = rand((1, 3, 5, 7), dtype, 5)
        kw_e["attn_mask"], kw_t["attn_mask"] = E(m), T(m)
    elif mask == "causal":
        kw_e["is_causal"] = kw_t["is_causal"] = True
    check(F.scaled_dot_product_attention(E(q, "strided"), E(k), E(v), **kw_e),
          TF.scaled_dot_product_attention(T(q), T(k), T(v), **kw_t), **MM_TOL[dtype])
    check(F.scaled_dot_product_attention(E(q), E(k), E(v), scale=0.3, **kw_e),
          TF.scaled_dot_product_attention(T(q), T(k), T(v), scale=0.3, **kw_t), **MM_TOL[dtype])


def test_sdpa_gqa_and_3d():
    q, k, v = rand((2, 6, 4, 8), np.float64, 1), rand((2, 2, 5, 8), np.float64, 2), rand((2, 2, 5, 3), np.float64, 3)
    check(F.scaled_dot_product_attention(E(q), E(k), E(v), enable_gqa=True),
          TF.scaled_dot_product_attention(T(q), T(k), T(v), enable_gqa=True))
    q3, k3, v3 = q[0], k[0, :1].repeat(6, 0), v[0, :1].repeat(6, 0)
    check(F.scaled_dot_product_attention(E(q3), E(k3), E(v3), is_causal=True),
          TF.scaled_dot_product_attention(T(q3), T(k3), T(v3), is_causal=True))


def test_sdpa_dropout_is_random_and_unbiased_shape():
    ember.manual_seed(0)
    q = E(rand((2, 4, 8), np.float32))
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    b = F.scaled_dot_product_attention(q, q, q)
    assert a.shape == b.shape and not np.allclose(a.numpy(), b.numpy())


def test_sdpa_errors():
    q = E(rand((2, 4, 8), np.float32))
    with raises(ember.ShapeError, "scaled_dot_product_attention", "same embedding size", "(2, 4, 6)"):
        F.scaled_dot_product_attention(q, E(rand((2, 4, 6), np.float32)), q)
    with raises(ember.ShapeError, "scaled_dot_product_attention", "same sequence length"):
        F.scaled_dot_product_attention(q, q, E(rand((2, 5, 8), np.float32)))
    with raises(ember.ValueRangeError, "scaled_dot_product_attention", "is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.ones(4, 4), is_causal=True)
    with raises(ember.DTypeError, "scaled_dot_product_attention", "attn_mask", "int64"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.tensor(np.ones((4, 4), np.int64)))
    with raises(ember.ShapeError, "scaled_dot_product_attention", "attn_mask of shape (3, 4)"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ember.ones(3, 4))
    with raises(ember.DTypeError, "scaled_dot_product_attention", "key", "float64"):
        F.scaled_dot_product_attention(q, E(rand((2, 4, 8))), q)
    with raises(ember.ShapeError, "scaled_dot_product_attention", "multiple", "(2, 3, 4, 8)"):
        F.scaled_dot_product_attention(E(rand((2, 4, 4, 8), np.float32)),
                                       E(rand((2, 3, 4, 8), np.float32)),
                                       E(rand((2, 3, 4, 8), np.float32)), enable_gqa=True)
    with raises(ember.ValueRangeError, "scaled_dot_product_attention", "dropout_p"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=2.0)
