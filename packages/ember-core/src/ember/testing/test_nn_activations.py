"""Conformance: ember.nn.functional activations and the softmax family on the device under test, against
torch.nn.functional."""

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

POINTWISE = [
    ("relu", {}), ("relu6", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {}), ("elu", {}),
    ("elu", {"alpha": 0.5}), ("selu", {}), ("celu", {}), ("celu", {"alpha": 2.0}), ("leaky_relu", {}),
    ("leaky_relu", {"negative_slope": 0.2}), ("softplus", {}), ("softplus", {"beta": 2.0, "threshold": 3.0}),
    ("softsign", {}), ("mish", {}), ("hardswish", {}), ("hardsigmoid", {}), ("hardtanh", {}),
    ("hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("sigmoid", {}), ("tanh", {}), ("logsigmoid", {}),
    ("tanhshrink", {}), ("hardshrink", {}), ("hardshrink", {"lambd": 1.0}), ("softshrink", {}),
    ("softshrink", {"lambd": 0.2}), ("threshold", {"threshold": 0.3, "value": -2.0}),
]


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,kw", POINTWISE, ids=[f"{n}-{k}" for n, k in POINTWISE])
def test_pointwise_matches_torch(name, kw, dtype, layout):
    a = rand((4, 7), dtype, scale=4.0)
    a[0, :4] = [0.0, 30.0, -30.0, 3.0]  # zero, softplus threshold region, large negative, hardswish knee
    if name == "threshold":
        out, ref = F.threshold(E(a, layout), **kw), TF.threshold(T(a), **kw)
    else:
        out, ref = getattr(F, name)(E(a, layout), **kw), getattr(TF, name)(T(a), **kw)
    check(out, ref, dtype)


@pytest.mark.parametrize("name", ["relu", "relu6", "elu", "selu", "celu", "leaky_relu", "silu", "mish",
                                  "hardswish", "hardsigmoid", "hardtanh"])
def test_inplace_writes_input(name):
    a = rand((3, 5), np.float32, scale=3.0)
    x = E(a)
    out = getattr(F, name)(x, inplace=True)
    assert out is x
    check(x, getattr(TF, name)(T(a)))


def test_underscore_inplace_variants():
    a = rand((3, 5), np.float64, scale=3.0)
    for name in ("relu_", "elu_", "leaky_relu_", "hardtanh_"):
        x = E(a)
        assert getattr(F, name)(x) is x
        check(x, getattr(TF, name)(T(a)))


def test_relu_int_and_nan():
    x = ember.tensor([1, -2, 3])
    out = F.relu(x)
    assert out.dtype == ember.int64 and out.tolist() == [1, 0, 3]
    y = F.relu(ember.tensor([float("nan"), -1.0]))
    assert np.isnan(y.numpy()[0]) and y.numpy()[1] == 0


def test_prelu_matches_torch():
    a = rand((2, 3, 4), np.float32)
    for w in (np.array([0.25], np.float32), np.array([0.1, 0.2, 0.3], np.float32)):
        check(F.prelu(E(a), E(w)), TF.prelu(T(a), T(w)))
    a1 = rand((5,), np.float64)
    check(F.prelu(E(a1), E(np.array([0.3]))), TF.prelu(T(a1), T(np.array([0.3]))))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family(fn, dtype, dim):
    a = rand((3, 4, 5), dtype, scale=5.0)
    for layout in ("contiguous", "strided"):
        check(getattr(F, fn)(E(a, layout), dim=dim), getattr(TF, fn)(T(a), dim=dim), dtype)


def test_softmax_dtype_argument_and_implicit_dim():
    a = rand((2, 3), np.float32)
    if ember.default_device().supports_dtype(ember.float64):
        out = F.softmax(E(a), dim=1, dtype=ember.float64)
        check(out, TF.softmax(T(a), dim=1, dtype=torch.float64))
    with pytest.warns(UserWarning):
        out = F.log_softmax(E(a))
    with pytest.warns(UserWarning):
        ref = TF.log_softmax(T(a))
    check(out, ref)
    i = ember.tensor([[1, 2], [3, 4]])
    check(F.softmax(i, 1, dtype=ember.float32), TF.softmax(T(np.array([[1, 2], [3, 4]])), 1, dtype=torch.float32))


def test_softmax_infinite_rows():
    a = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, 5.0]])
    check(F.softmax(E(a), -1), TF.softmax(T(a), -1))
    check(F.log_softmax(E(a), -1), TF.log_softmax(T(a), -1))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_glu(dim):
    a = rand((4, 6, 2), np.float64)
    check(F.glu(E(a, "strided"), dim), TF.glu(T(a), dim))


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("dim", [1, -1, 0])
def test_normalize(p, dim):
    a = rand((3, 4, 5), np.float32)
    a[0, :, 0] = 0.0  # a zero vector: eps keeps it finite
    check(F.normalize(E(a), p=p, dim=dim), TF.normalize(T(a), p=p, dim=dim))


def test_activation_errors():
    x = ember.tensor([[1.0, 2.0, 3.0]])
    with raises(ember.ValueRangeError, "gelu", "approximate", "'fast'"):
        F.gelu(x, approximate="fast")
    with raises(ember.DTypeError, "gelu", "int64"):
        F.gelu(ember.tensor([1, 2]))
    with raises(ember.DTypeError, "silu", "Tensor"):
        F.silu([1.0, 2.0])
    with raises(ember.ShapeError, "glu", "even", "size 3"):
        F.glu(x, -1)
    with raises(ember.DimError, "glu"):
        F.glu(x, 2)
    with raises(ember.DimError, "softmax"):
        F.softmax(x, dim=3)
    with raises(ember.DTypeError, "softmax", "int64"):
        F.softmax(ember.tensor([1, 2]), dim=0)
    with raises(ember.DTypeError, "softmax", "floating"):
        F.softmax(x, dim=0, dtype=ember.int32)
    with raises(ember.ValueRangeError, "hardtanh", "min_val"):
        F.hardtanh(x, 2.0, 1.0)
    with raises(ember.ShapeError, "prelu", "weight", "(2,)"):
        F.prelu(E(rand((2, 3, 4))), E(np.ones(2)))
    with raises(ember.DTypeError, "prelu", "float32", "float64"):
        F.prelu(E(rand((2, 3), np.float32)), E(np.ones(3)))
    with raises(ember.ValueRangeError, "softshrink", "lambda"):
        F.softshrink(x, -1.0)
    with raises(ember.ValueRangeError, "celu", "alpha"):
        F.celu(x, alpha=0.0)
    with raises(ember.ValueRangeError, "normalize", "out="):
        F.normalize(x, out=x)
