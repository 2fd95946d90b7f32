"""Conformance: the edges PyTorch defines and numpy would get wrong, on the device under test.

* value ranges: a Python int operand no 64-bit scalar holds is refused; in-range ints wrap into the tensor's dtype
  exactly as in torch; ``tensor()`` refuses values its dtype cannot hold and anything that is not a number
  (strings, None, complex); fill values, bounds and ``where`` scalars are range-checked;
* empty tensors: softmax-like ops over a zero-length dim, losses, pools, convs and padding behave as torch (a
  result, or a typed error where torch raises); allocations past memory are ``OutOfMemoryError``;
* non-finite inputs: softmax of a row whose max is infinite is NaN throughout; clamp's dtype rules;
* gradients (on the autodiff-decorated device): empty leaves get empty gradients, never None, and clamp / relu /
  hardtanh pass the gradient at their bounds and NaNs exactly as torch does.

Every expectation is torch's own result on the same input, computed in the test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember import (
    DimError,
    DTypeError,
    IndexOutOfRangeError,
    OutOfMemoryError,
    ShapeError,
    UnsupportedError,
    ValueRangeError,
)
from ember.nn import functional as EF
from ember.testing import require_dtype, torch_or_skip
from ember.testing._helpers import raises

torch = torch_or_skip()
TF = torch.nn.functional

INF, NAN = float("inf"), float("nan")


def _same(out: Any, ref: Any) -> None:
    """An ember tensor equal to a torch tensor: shape, dtype, values (NaN where torch has NaN)."""
    got = out.numpy()
    exp = ref.detach().numpy()
    assert got.shape == exp.shape, (got.shape, exp.shape)
    assert got.dtype == exp.dtype, (got.dtype, exp.dtype)
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-7, equal_nan=True)


def _torch_raises(fn: Callable[[], Any]) -> None:
    with pytest.raises((RuntimeError, ValueError, TypeError, OverflowError, IndexError, NotImplementedError)):
        fn()


def _need(*dtypes: Any) -> None:
    from ember.device import default_device

    require_dtype(default_device(), *dtypes)


# ------------------------------------------------------------------------------------------------------------
# value ranges
# ------------------------------------------------------------------------------------------------------------
_SCALAR_OPS = ["add", "sub", "mul", "floor_divide", "remainder", "eq", "lt", "bitwise_and", "maximum"]


@pytest.mark.parametrize("value", [10**20, 2**64, -(2**63) - 1], ids=["1e20", "2**64", "-2**63-1"])
@pytest.mark.parametrize("op", _SCALAR_OPS)
def test_python_int_operand_past_64_bits_is_refused(op, value):
    if op != "maximum":  # torch.maximum takes no scalar at all
        _torch_raises(lambda: getattr(torch, op)(torch.tensor([1, 2]), value))
    with raises(ValueRangeError, op, str(value), "64-bit"):
        getattr(ember, op)(ember.tensor([1, 2]), value)


def test_python_int_operand_past_64_bits_is_refused_everywhere():
    x = ember.tensor([1, 2])
    for fn, name in [(lambda: x * 10**20, "mul"), (lambda: 10**20 - x, "sub"), (lambda: x.add_(10**20), "add_"),
                     (lambda: ember.tensor([1.5]) + 2**70, "add"), (lambda: x == 2**70, "eq"),
                     (lambda: ember.add(x, 1, alpha=2**70), "add"), (lambda: (2**70) ** x, "pow")]:
        with raises(ValueRangeError, name, "64-bit"):
            fn()
    _torch_raises(lambda: torch.tensor([1, 2]) * 10**20)
    _torch_raises(lambda: torch.tensor([1.5]) + 2**70)


@pytest.mark.parametrize("case", [
    ("uint8", [100, 7], "add", 300), ("uint8", [100, 7], "lt", 300), ("uint8", [100, 7], "eq", 356),
    ("uint8", [100, 7], "sub", -1), ("int8", [100, -3], "mul", 1000), ("int8", [100, -3], "gt", 1000),
    ("int64", [1, 3], "mul", 2**63), ("int64", [1, 3], "add", 2**64 - 1), ("int32", [1, 3], "add", 2**40),
], ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}")
def test_in_range_int_operand_wraps_as_torch(case):
    dtype, data, op, value = case
    _need(getattr(ember, dtype))
    ref = getattr(torch, op)(torch.tensor(data, dtype=getattr(torch, dtype)), value)
    _same(getattr(ember, op)(ember.tensor(data, dtype=getattr(ember, dtype)), value), ref)


@pytest.mark.parametrize("data,dtype", [
    ([300, -1], "uint8"), ([-256], "uint8"), ([200], "int8"), ([-129], "int8"), ([2**31], "int32"),
    ([2**63], "int64"), ([2**70], "int64"), ([300.5], "uint8"), ([-1.0], "uint8"), ([INF], "int32"),
    ([NAN], "int32"), ([1e19], "int64"), ([[1, 2], [3, 2**70]], "int64"),
], ids=str)
def test_tensor_refuses_values_its_dtype_cannot_hold(data, dtype):
    _need(getattr(ember, dtype))
    _torch_raises(lambda: torch.tensor(data, dtype=getattr(torch, dtype)))
    with raises(ValueRangeError, "tensor()", "cannot be converted to type", dtype):
        ember.tensor(data, dtype=getattr(ember, dtype))


def test_tensor_int_past_64_bits_without_dtype_is_refused():
    _torch_raises(lambda: torch.tensor([2**70]))
    for data in ([2**70], 2**70, [1, 2**64], [2**63]):
        with raises(ValueRangeError, "tensor()", "int64"):
            ember.tensor(data)


@pytest.mark.parametrize("data,dtype", [
    ([-1, 255], "uint8"), ([-255], "uint8"), ([-128, 127], "int8"), ([2**70], "float32"), ([NAN, 0.0], "bool"),
    ([2, 0], "bool"), ([True, 255], "uint8"), ([-(2**63)], "int64"), ([255.0, 0.5], "uint8"),
], ids=str)
def test_tensor_in_range_values_match_torch(data, dtype):
    _need(getattr(ember, dtype))
    _same(ember.tensor(data, dtype=getattr(ember, dtype)), torch.tensor(data, dtype=getattr(torch, dtype)))


def test_tensor_of_numpy_data_casts_as_numpy_and_torch():
    _need(ember.uint8)
    a = np.array([300, -1, 7])
    _same(ember.tensor(a, dtype=ember.uint8), torch.tensor(a, dtype=torch.uint8))


@pytest.mark.parametrize("data,dtype,shown", [
    (["a"], "bool", "'a'"), (["1.5"], "float32", "'1.5'"), ([None, 1], "bool", "None"), ([None, 1], None, "None"),
    (["a"], None, "'a'"), ("a", None, "'a'"), ([b"a"], None, "b'a'"), ([[1], [None]], "int64", "None"),
    ([1j], "float32", "1j"), ([1, "a"], "float32", "'a'"), ([object()], "float32", "object"),
], ids=lambda v: (repr(v) if not isinstance(v, list) else str(v)).split(" at 0x")[0])  # same ids in every process
def test_tensor_refuses_what_is_not_a_number(data, dtype, shown):
    tdt = None if dtype is None else getattr(torch, dtype)
    _torch_raises(lambda: torch.tensor(data, dtype=tdt))
    with raises(DTypeError, "tensor()", shown):
        ember.tensor(data, dtype=None if dtype is None else getattr(ember, dtype))


@pytest.mark.parametrize("case", [
    ("full", "uint8", 300), ("full", "int8", -200), ("full", "int8", 128.0), ("full", "int64", 2**63),
    ("full", "int64", NAN), ("full", "int64", INF), ("fill_", "uint8", 300), ("fill_", "int8", -129),
    ("fill_", "int64", 2**63), ("clamp_max", "int8", 1000), ("clamp_min", "uint8", -256),
    ("where", "uint8", 300), ("masked_fill", "uint8", 300), ("masked_fill", "int8", -129),
], ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_fill_values_and_bounds_are_range_checked(case):
    op, dtype, value = case
    _need(getattr(ember, dtype))

    def run(lib: Any) -> Any:
        d = getattr(lib, dtype)
        x = lib.ones(2, dtype=d)
        if op == "full":
            return lib.full((2,), value, dtype=d)
        if op == "fill_":
            return x.fill_(value)
        if op == "clamp_max":
            return lib.clamp(x, max=value)
        if op == "clamp_min":
            return lib.clamp(x, min=value)
        if op == "where":
            return lib.where(lib.tensor([True, False]), x, value)
        return x.masked_fill(lib.tensor([True, False]), value)

    _torch_raises(lambda: run(torch))
    with raises(ValueRangeError, "cannot be converted to type", dtype, "without overflow"):
        run(ember)


@pytest.mark.parametrize("case", [
    ("full", "uint8", -1), ("full", "int64", 1.9), ("full", "bool", 2), ("fill_", "uint8", -255),
    ("clamp_min", "uint8", -1), ("clamp_max", "int8", 2.5), ("full", "float32", 2**63), ("masked_fill", "uint8", -1),
], ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_fill_values_and_bounds_in_range_match_torch(case):
    op, dtype, value = case
    _need(getattr(ember, dtype))

    def run(lib: Any) -> Any:
        d = getattr(lib, dtype)
        x = lib.ones(2, dtype=d) * 3 if dtype != "bool" else lib.ones(2, dtype=d)
        if op == "full":
            return lib.full((2,), value, dtype=d)
        if op == "fill_":
            return x.fill_(value)
        if op == "clamp_min":
            return lib.clamp(x, min=value)
        if op == "clamp_max":
            return lib.clamp(x, max=value)
        return x.masked_fill(lib.tensor([True, False]), value)

    _same(run(ember), run(torch))


def test_randint_range_must_fit_the_dtype():
    _need(ember.int8)
    with raises(ValueRangeError, "randint", "int8"):
        ember.randint(-129, 0, (2,), dtype=ember.int8)
    _torch_raises(lambda: torch.randint(-129, 0, (2,), dtype=torch.int8))
    with raises(ValueRangeError, "randint", "int64"):
        ember.randint(0, 2**63, (2,))
    with raises(ValueRangeError, "randint", "bool"):
        ember.randint(0, 5, (2,), dtype=ember.bool)
    _need(ember.uint8)
    assert ember.randint(0, 256, (64,), dtype=ember.uint8).numpy().max() <= 255


# ------------------------------------------------------------------------------------------------------------
# empty tensors, huge sizes, bad arguments
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim", [((2, 0), 1), ((0, 3), 1), ((2, 0, 3), 1), ((0,), 0)], ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_over_empty_dims_is_empty(name, shape, dim):
    _same(getattr(EF, name)(ember.zeros(*shape), dim=dim), getattr(TF, name)(torch.zeros(*shape), dim=dim))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_of_an_empty_batch(reduction):
    x, t = ember.zeros(0, 3), ember.zeros(0, dtype=ember.int64)
    _same(EF.cross_entropy(x, t, reduction=reduction),
          TF.cross_entropy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), reduction=reduction))


def test_batch_norm_and_attention_on_empty_or_zero_width_inputs():
    _same(EF.batch_norm(ember.zeros(0, 3), None, None, training=True),
          TF.batch_norm(torch.zeros(0, 3), None, None, training=True))
    with raises(ValueRangeError, "batch_norm", "more than 1 value per channel"):
        EF.batch_norm(ember.zeros(1, 3), None, None, training=True)
    q, v = np.ones((1, 2, 0), np.float32), np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    _same(EF.scaled_dot_product_attention(ember.tensor(q), ember.tensor(q), ember.tensor(v)),
          TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(q), torch.tensor(v)))


@pytest.mark.parametrize("make,op", [
    (lambda: ember.ones(2**62, 4), ""), (lambda: ember.zeros(10**13), ""), (lambda: ember.arange(10**15), "arange"),
    (lambda: ember.rand(10**13), "rand"), (lambda: ember.full((10**13,), 2.0), ""),
    (lambda: ember.randint(0, 5, (10**13,)), "randint"), (lambda: ember.eye(10**7), "eye"),
], ids=["ones-2**62", "zeros", "arange", "rand", "full", "randint", "eye"])
def test_allocations_past_memory_are_out_of_memory_errors(make, op):
    """The factories, whatever the backend (core maps a backend's MemoryError); flex and OpenCL also map the
    other ops' allocations (repeat, contiguous, arithmetic on expanded views), tested with those backends."""
    with raises(OutOfMemoryError, op) as info:
        make().numpy()  # numpy(): a lazily fused result allocates when it is realized
    assert "bytes" in str(info.value) or "allocate" in str(info.value)


@pytest.mark.parametrize("call,op", [
    (lambda x: x.squeeze(1.5), "squeeze"), (lambda x: x.flip(0.5), "flip"), (lambda x: x.movedim(0.5, 1), "movedim"),
    (lambda x: x.sum([0.5]), "sum"), (lambda x: x.unsqueeze(1.5), "unsqueeze"),
], ids=["squeeze", "flip", "movedim", "sum", "unsqueeze"])
def test_float_dims_are_typed_errors(call, op):
    x = ember.ones(1, 2)
    _torch_raises(lambda: call(torch.ones(1, 2)))
    with raises(DimError, f"{op}: ", "float"):
        call(x)


@pytest.mark.parametrize("pad", [[2, -2], [-2, 2], [-2, -2], [0, -3]], ids=str)
def test_pad_cropping_past_the_input_is_refused(pad):
    _torch_raises(lambda: TF.pad(torch.ones(1, 1), pad) if pad != [0, -3] else TF.pad(torch.ones(1, 2), pad))
    with raises(ShapeError, "pad", "negative output size"):
        EF.pad(ember.ones(1, 1) if pad != [0, -3] else ember.ones(1, 2), pad)


@pytest.mark.parametrize("pad", [[-1, 0], [-1, -1], [1, -1], [-2, 3]], ids=str)
def test_pad_negative_crops_match_torch(pad):
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    _same(EF.pad(ember.tensor(x), pad), TF.pad(torch.tensor(x), pad))


@pytest.mark.parametrize("call", [
    lambda F, lib: F.max_pool2d(lib.zeros(1, 1, 0, 4), 2, padding=1),
    lambda F, lib: F.max_pool2d(lib.zeros(1, 1, 4, 0), 2, padding=1, return_indices=True),
    lambda F, lib: F.max_pool1d(lib.zeros(1, 1, 0), 2, padding=1),
    lambda F, lib: F.avg_pool2d(lib.zeros(1, 1, 0, 4), 2, padding=1),
    lambda F, lib: F.max_pool2d(lib.zeros(1, 0, 4, 4), 2),
    lambda F, lib: F.adaptive_max_pool2d(lib.zeros(1, 0, 4, 4), 2),
    lambda F, lib: F.adaptive_avg_pool3d(lib.zeros(1, 0, 4, 4, 4), 2),
    lambda F, lib: F.conv1d(lib.zeros(1, 1, 0), lib.ones(1, 1, 1), padding=1),
    lambda F, lib: F.conv2d(lib.zeros(1, 1, 3, 3), lib.ones(0, 1, 2, 2)),
    lambda F, lib: F.conv_transpose2d(lib.zeros(1, 1, 0, 2), lib.ones(1, 1, 2, 2)),
], ids=["maxpool-h0", "maxpool-w0-indices", "maxpool1d", "avgpool", "maxpool-c0", "adaptive-max-c0",
        "adaptive-avg3d-c0", "conv1d-l0", "conv-out0", "convT-h0"])
def test_pools_and_convs_refuse_empty_non_batch_dims(call):
    _torch_raises(lambda: call(TF, torch))
    with raises(ShapeError):
        call(EF, ember)


def test_pools_and_convs_of_an_empty_batch_are_empty():
    # torch's 1-d and 2-d adaptive average pools take zero channels (its other pools refuse them)
    _same(EF.adaptive_avg_pool2d(ember.zeros(1, 0, 4, 4), 2), TF.adaptive_avg_pool2d(torch.zeros(1, 0, 4, 4), 2))
    _same(EF.max_pool2d(ember.zeros(0, 1, 4, 4), 2), TF.max_pool2d(torch.zeros(0, 1, 4, 4), 2))
    _same(EF.conv2d(ember.zeros(0, 1, 3, 3), ember.ones(2, 1, 2, 2)),
          TF.conv2d(torch.zeros(0, 1, 3, 3), torch.ones(2, 1, 2, 2)))


# ------------------------------------------------------------------------------------------------------------
# non-finite inputs, clamp's dtypes
# ------------------------------------------------------------------------------------------------------------
_ROWS = [[INF, 1.0, 2.0], [-INF, -INF, -INF], [INF, INF, 0.0], [-INF, 1.0, 2.0], [NAN, 1.0, 2.0], [INF, -INF, 3.0],
         [1e4, -1e4, 0.0], [1.0, 2.0, 3.0]]


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_with_infinite_rows_matches_torch(name, dim):
    x = np.array(_ROWS, np.float32)
    x = x if dim == 1 else np.ascontiguousarray(x.T)
    _same(getattr(EF, name)(ember.tensor(x), dim=dim), getattr(TF, name)(torch.tensor(x), dim=dim))


@pytest.mark.parametrize("target", [0, 1, 2])
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1}, {"reduction": "none"}], ids=str)
def test_cross_entropy_with_infinite_logits_matches_torch(target, kw):
    x = np.array(_ROWS, np.float32)
    t = np.full(len(_ROWS), target)
    _same(EF.cross_entropy(ember.tensor(x), ember.tensor(t), **kw), TF.cross_entropy(torch.tensor(x),
                                                                                     torch.tensor(t), **kw))


def test_clamp_of_bool_promotes_as_torch():
    b = [True, False]
    for kw in ({"min": 0, "max": 1}, {"min": 0}, {"max": 0.5}):
        _same(ember.clamp(ember.tensor(b), **kw), torch.clamp(torch.tensor(b), **kw))
    _same(ember.clamp(ember.tensor(b), min=ember.tensor(0)), torch.clamp(torch.tensor(b), min=torch.tensor(0)))
    # one bool tensor bound runs (torch's maximum/minimum kernels); bool scalars or two bounds do not
    _same(ember.clamp(ember.tensor(b), min=ember.tensor(True)), torch.clamp(torch.tensor(b), min=torch.tensor(True)))
    _same(ember.tensor(b).clamp_(max=ember.tensor([False, True])),
          torch.tensor(b).clamp_(max=torch.tensor([False, True])))
    _torch_raises(lambda: torch.clamp(torch.tensor(b), min=True))
    with raises(UnsupportedError, "clamp", "bool"):
        ember.clamp(ember.tensor(b), min=True)
    with raises(UnsupportedError, "clamp", "bool"):
        ember.clamp(ember.tensor(b), min=ember.tensor(False), max=ember.tensor(True))
    _torch_raises(lambda: torch.tensor(b).clamp_(min=0))
    with raises(DTypeError, "clamp_", "int64", "bool"):
        ember.tensor(b).clamp_(min=0)


def test_clamp_values_and_nan_bounds_match_torch():
    x = np.array([NAN, -1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    for lo, hi in ((0.0, 1.0), (NAN, 1.0), (0.0, NAN), (2.0, 1.0), (None, 0.5), (-INF, INF)):
        _same(ember.clamp(ember.tensor(x), lo, hi), torch.clamp(torch.tensor(x), lo, hi))
    lo_t = np.array([0.0, NAN, -2.0, 1.0, 0.0, 3.0], np.float32)
    _same(ember.clamp(ember.tensor(x), min=ember.tensor(lo_t)), torch.clamp(torch.tensor(x), min=torch.tensor(lo_t)))


# ------------------------------------------------------------------------------------------------------------
# gradients (autodiff-decorated device under test)
# ------------------------------------------------------------------------------------------------------------
def _autodiff_installed() -> bool:
    from ember.plugins import registry

    registry.ensure_loaded()
    return registry.differentiable_decorator() is not None  # a declared capability, not a name


@pytest.fixture
def ad(device: Any) -> Any:
    """The device under test with gradient recording, made the default device for the test."""
    if getattr(device.stack, "differentiable", False):
        dev = device
    elif _autodiff_installed():
        dev = device.autodiff()
    else:
        pytest.skip("ember-autodiff is not installed")
    require_dtype(dev, ember.float64)
    previous = ember.default_device()
    ember.set_default_device(dev)
    try:
        yield dev
    finally:
        ember.set_default_device(previous)


def _grads(lib: Any, F: Any, fn: Callable[..., Any], arrays: list[np.ndarray]) -> list[Any]:
    leaves = [lib.tensor(a, dtype=lib.float64, requires_grad=True) for a in arrays]
    out = fn(lib, F, *leaves)
    if isinstance(out, tuple):
        out = out[0]
    w = np.random.default_rng(out.numel()).uniform(0.5, 1.5, tuple(out.shape))
    (out * lib.tensor(w, dtype=lib.float64)).sum().backward()
    return [leaf.grad for leaf in leaves]


def _check_grads(fn: Callable[..., Any], *arrays: Any) -> None:
    arrays = [np.asarray(a, np.float64) for a in arrays]
    exp = _grads(torch, TF, fn, arrays)
    got = _grads(ember, EF, fn, arrays)
    for g, e in zip(got, exp):
        assert (g is None) == (e is None), (g, e)
        if e is not None:
            _same(g, e)


Z = np.zeros
_EMPTY_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "relu": (lambda lib, F, x: F.relu(x), (Z((2, 0)),)),
    "clamp": (lambda lib, F, x: x.clamp(0, 1), (Z((0, 3)),)),
    "clamp_min": (lambda lib, F, x: x.clamp(min=0), (Z((0,)),)),
    "hardtanh": (lambda lib, F, x: F.hardtanh(x), (Z((2, 0)),)),
    "softplus": (lambda lib, F, x: F.softplus(x), (Z((0,)),)),
    "softmax": (lambda lib, F, x: F.softmax(x, 1), (Z((2, 0)),)),
    "log_softmax": (lambda lib, F, x: F.log_softmax(x, 1), (Z((2, 0)),)),
    "bce_logits": (lambda lib, F, x: F.binary_cross_entropy_with_logits(x, x.detach()), (Z((0,)),)),
    "normalize": (lambda lib, F, x: F.normalize(x), (Z((0, 3)),)),
    "cosine_similarity": (lambda lib, F, a, b: F.cosine_similarity(a, b), (Z((0, 3)), Z((0, 3)))),
    "cat": (lambda lib, F, a, b: lib.cat([a, b]), (Z((0,)), Z((0,)))),
    "cat_skipped": (lambda lib, F, a, b: lib.cat([a, b]), (Z((0,)), Z((2, 3)))),
    "pad": (lambda lib, F, x: F.pad(x, (1, 1)), (Z((0, 3)),)),
    "pad_reflect": (lambda lib, F, x: F.pad(x, (1, 1), mode="reflect"), (Z((0, 1, 3)),)),
    "conv2d": (lambda lib, F, x, w: F.conv2d(x, w), (Z((0, 1, 3, 3)), np.ones((2, 1, 2, 2)))),
    "conv_transpose2d": (lambda lib, F, x, w: F.conv_transpose2d(x, w), (Z((0, 1, 3, 3)), np.ones((1, 1, 2, 2)))),
    "max_pool2d": (lambda lib, F, x: F.max_pool2d(x, 2), (Z((0, 1, 4, 4)),)),
    "avg_pool2d": (lambda lib, F, x: F.avg_pool2d(x, 2), (Z((0, 1, 4, 4)),)),
    "adaptive_avg_pool2d": (lambda lib, F, x: F.adaptive_avg_pool2d(x, 2), (Z((0, 1, 4, 4)),)),
    "adaptive_max_pool2d": (lambda lib, F, x: F.adaptive_max_pool2d(x, 2), (Z((0, 1, 4, 4)),)),
    "interpolate": (lambda lib, F, x: F.interpolate(x, scale_factor=2), (Z((0, 1, 4)),)),
    "unfold": (lambda lib, F, x: F.unfold(x, 1), (Z((0, 1, 2, 2)),)),
    "sdpa": (lambda lib, F, q: F.scaled_dot_product_attention(q, q, q), (Z((1, 0, 4)),)),
    "layer_norm_weight": (lambda lib, F, x, w: F.layer_norm(x, (3,), w), (Z((0, 3)), np.ones(3))),
    "batch_norm": (lambda lib, F, x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   (Z((0, 3)), np.ones(3), np.zeros(3))),
    "group_norm": (lambda lib, F, x, w: F.group_norm(x, 1, w), (Z((0, 2, 3)), np.ones(2))),
    "gather": (lambda lib, F, x: x.gather(1, lib.zeros(0, 1, dtype=lib.int64)), (Z((0, 3)),)),
    "scatter_src": (lambda lib, F, x, s: x.scatter(1, lib.zeros(0, 1, dtype=lib.int64), s), (Z((0, 3)), Z((0, 1)))),
    "linear": (lambda lib, F, x, w, b: F.linear(x, w, b), (Z((0, 2)), np.ones((3, 2)), np.ones(3))),
    "cross_entropy": (lambda lib, F, x: F.cross_entropy(x, lib.zeros(0, dtype=lib.int64), reduction="sum"),
                      (Z((0, 3)),)),
    "mse_loss": (lambda lib, F, a, b: F.mse_loss(a, b, reduction="sum"), (Z((0,)), Z((0,)))),
}


@pytest.mark.parametrize("name", sorted(_EMPTY_CASES))
def test_gradients_of_empty_tensors_are_empty_tensors(ad, name):
    fn, arrays = _EMPTY_CASES[name]
    _check_grads(fn, *arrays)


_BOUNDARY_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "clamp": (lambda lib, F, x: x.clamp(0.0, 1.0), ([-1.0, 0.0, 0.5, 1.0, 2.0, NAN],)),
    "clamp_min_eq_max": (lambda lib, F, x: x.clamp(1.0, 1.0), ([0.0, 1.0, 2.0],)),
    "clamp_min_gt_max": (lambda lib, F, x: x.clamp(2.0, 1.0), ([0.0, 1.0, 1.5, 2.0, 3.0],)),
    "clamp_nan_min": (lambda lib, F, x: x.clamp(min=NAN), ([0.0, 1.0],)),
    "clamp_nan_max": (lambda lib, F, x: x.clamp(max=NAN), ([0.0, 1.0],)),
    "clamp_inf_bounds": (lambda lib, F, x: x.clamp(-INF, INF), ([INF, -INF, 0.0],)),
    "clamp_min": (lambda lib, F, x: x.clamp(min=0.0), ([-1.0, 0.0, 1.0],)),
    "clamp_max": (lambda lib, F, x: x.clamp(max=0.0), ([-1.0, 0.0, 1.0],)),
    "clamp_tensor_bounds": (lambda lib, F, x, lo, hi: x.clamp(lo, hi),
                            ([0.0, 1.0, 2.0, 0.5, 5.0], [0.0, 0.0, 3.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.5, 2.0])),
    "clamp_tensor_nan_min": (lambda lib, F, x, lo: x.clamp(min=lo), ([0.0, 1.0, 2.0, NAN], [NAN, 1.0, 2.0, 0.0])),
    "clamp_tensor_nan_max": (lambda lib, F, x, hi: x.clamp(max=hi), ([0.0, 1.0, -1.0], [NAN, 0.0, 0.0])),
    "clamp_broadcast_bound": (lambda lib, F, x, lo: x.clamp(min=lo), ([[0.0, 1.0], [2.0, -1.0]], [1.0])),
    "clamp_inplace": (lambda lib, F, x: (x * 1).clamp_(0.0, 1.0), ([-1.0, 0.0, 0.5, 1.0, 2.0],)),
    "clip": (lambda lib, F, x: lib.clip(x, 0.0, 1.0), ([0.0, 1.0],)),
    "relu": (lambda lib, F, x: F.relu(x), ([-1.0, 0.0, 1.0, NAN],)),
    "relu6": (lambda lib, F, x: F.relu6(x), ([0.0, 6.0, 3.0, 7.0],)),
    "hardtanh": (lambda lib, F, x: F.hardtanh(x), ([-1.0, 0.0, 1.0, 2.0, NAN],)),
    "maximum_tie": (lambda lib, F, x, y: lib.maximum(x, y), ([1.0, 1.0], [1.0, 0.0])),
    # max()/min() split the gradient among the NaNs when the result is NaN; amax leaves NaN gradients
    "max_all_nan": (lambda lib, F, x: x.max(), ([[NAN, NAN, 1.0], [2.0, 3.0, NAN]],)),
    "min_all_nan": (lambda lib, F, x: x.min(), ([[NAN, 0.0], [2.0, NAN]],)),
    "max_all_ties": (lambda lib, F, x: x.max(), ([[1.0, 3.0, 3.0], [2.0, 3.0, 0.0]],)),
    "amax_all_nan": (lambda lib, F, x: x.amax(), ([[NAN, 1.0], [2.0, 3.0]],)),
    # prod() with two zeros has a zero gradient even beside inf and NaN; with one zero it is the others' product
    "prod_two_zeros": (lambda lib, F, x: x.prod(), ([[0.3, -0.8], [-0.5, 0.0], [-0.0, INF], [NAN, 1.7]],)),
    "prod_one_zero": (lambda lib, F, x: x.prod(), ([[0.3, 0.0, 2.0], [INF, 1.0, 1.0]],)),
    "xlogy": (lambda lib, F, x, y: lib.xlogy(x, y), ([0.0, 1.0, NAN, 0.0, 2.0], [3.0, 0.0, 2.0, NAN, 0.5])),
    "xlogy_scalar": (lambda lib, F, x: lib.xlogy(x, 1e30), ([NAN, 1.0, 0.0],)),
}


@pytest.mark.parametrize("name", sorted(_BOUNDARY_CASES))
def test_gradients_at_bounds_and_nans_match_torch(ad, name):
    fn, arrays = _BOUNDARY_CASES[name]
    _check_grads(fn, *arrays)


def test_clamp_gradient_is_untouched_without_grad_mode(ad):
    x = ember.tensor([0.0, 1.0, 2.0], dtype=ember.float64, requires_grad=True)
    with ember.no_grad():
        y = x.clamp(0.5, 1.5)
    assert not y.requires_grad
    _same(y, torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64))
    assert math.isnan(ember.clamp(ember.tensor([NAN]), 0.0, 1.0).item())


def test_small_edges_found_beside_the_others():
    _same(ember.square(ember.tensor([True, False])), torch.square(torch.tensor([True, False])))  # int64
    with raises(DTypeError, "square", "int"):
        ember.square(-1)
    for args in ((0, 0, 1), (0, 1, 1), (0, 0, 3)):  # 0-d unfold: the element, or nothing for size 0
        _same(ember.tensor(0.5).unfold(*args), torch.tensor(0.5).unfold(*args))
    _same(ember.nan_to_num(ember.tensor([NAN, 1.0]), nan=None), torch.nan_to_num(torch.tensor([NAN, 1.0]), nan=None))
    _same(ember.linspace(1000.0, INF, 1), torch.linspace(1000.0, INF, 1))


# ------------------------------------------------------------------------------------------------------------
# fuzz failure classes: pointwise and reduction argument checks (alpha, uint64 scalars, clamp, lerp, xlogy, ...)
# ------------------------------------------------------------------------------------------------------------
def test_add_alpha_is_checked_against_the_result_dtype():
    _torch_raises(lambda: torch.add(torch.tensor([1, 2]), 3, alpha=0.5))
    with raises(DTypeError, "add", "alpha must not be a floating point", "0.5", "int64"):
        ember.add(ember.tensor([1, 2]), 3, alpha=0.5)
    _torch_raises(lambda: torch.add(torch.tensor([1.0]), torch.tensor([1.0]), alpha=True))
    with raises(DTypeError, "add", "Boolean alpha", "float32"):
        ember.add(ember.tensor([1.0]), ember.tensor([1.0]), alpha=True)
    with raises(DTypeError, "sub_", "Boolean alpha"):
        ember.tensor([1, 2]).sub_(1, alpha=False)
    _same(ember.add(ember.tensor([True, False]), ember.tensor([False, False]), alpha=True),
          torch.add(torch.tensor([True, False]), torch.tensor([False, False]), alpha=True))
    _same(ember.add(ember.tensor([1.0, 2.0]), 1.5, alpha=2.0), torch.add(torch.tensor([1.0, 2.0]), 1.5, alpha=2.0))
    _same(ember.tensor([1, 2]).add_(3, alpha=2), torch.tensor([1, 2]).add_(3, alpha=2))


@pytest.mark.parametrize("op", ["gt", "fmod", "add", "mul", "floor_divide"])
def test_uint64_python_int_does_not_promote_with_bool(op):
    _torch_raises(lambda: getattr(torch, op)(torch.tensor([True, False]), 2**63))
    with raises(DTypeError, op, "Promotion for uint16, uint32, uint64", "bool", str(2**63)):
        getattr(ember, op)(ember.tensor([True, False]), 2**63)
    # other dtypes take it, wrapped like torch's: 2**63 is 0 in int16, so comparisons see 0
    _same(ember.gt(ember.tensor([1, -1], dtype=ember.int16), 2**63),
          torch.gt(torch.tensor([1, -1], dtype=torch.int16), 2**63))


@pytest.mark.parametrize("op", ["floor_divide_", "remainder_", "fmod_"])
def test_integer_division_by_a_scalar_that_wraps_to_zero_is_refused(op):
    _torch_raises(lambda: getattr(torch.tensor(3, dtype=torch.int16), op)(2**63))
    with raises(ValueRangeError, "ZeroDivisionError", str(2**63)):
        getattr(ember.tensor(3, dtype=ember.int16), op)(2**63)


def test_integer_division_of_an_empty_tensor_by_zero_is_computed():
    ref = torch.tensor([], dtype=torch.int64).remainder_(torch.tensor(False))
    _same(ember.tensor([], dtype=ember.int64).remainder_(ember.tensor(False)), ref)
    _same(ember.floor_divide(ember.zeros((2, 0), dtype=ember.int32), 0),
          torch.floor_divide(torch.zeros((2, 0), dtype=torch.int32), 0))


def test_positive_refuses_bool_tensors_and_non_tensors():
    _torch_raises(lambda: torch.positive(torch.tensor([True])))
    with raises(DTypeError, "positive", "bool"):
        ember.positive(ember.tensor([True]))
    with raises(DTypeError, "positive", "NoneType"):
        ember.positive(None)
    x = ember.tensor([1.0, -2.0])
    assert ember.positive(x) is x


def test_clamp_with_a_number_and_a_0d_tensor_bound_takes_the_tensor_as_a_number():
    # torch's Number overload takes the 0-d tensor's value: the result promotes as with two numbers
    x, lo = [1, 5, 9], 2
    for hi, hd in ((7.5, "float16"), (6, "int64"), (4.0, "float64")):
        _need(getattr(ember, hd))
        _same(ember.clamp(ember.tensor(x), lo, ember.tensor(hi, dtype=getattr(ember, hd))),
              torch.clamp(torch.tensor(x), lo, torch.tensor(hi, dtype=getattr(torch, hd))))
        _same(ember.tensor(x).clamp(min=ember.tensor(hi, dtype=getattr(ember, hd)), max=9),
              torch.tensor(x).clamp(min=torch.tensor(hi, dtype=getattr(torch, hd)), max=9))
    # a dimensioned tensor beside a number is an ember extension (torch refuses it): the number is a scalar bound
    _torch_raises(lambda: torch.clamp(torch.tensor([1.0, 3.0]), min=0.0, max=torch.tensor([2.0, 2.5])))
    _same(ember.clamp(ember.tensor([-1.0, 3.0]), min=0.0, max=ember.tensor([2.0, 2.5])),
          torch.clamp(torch.tensor([-1.0, 3.0]), min=torch.tensor(0.0), max=torch.tensor([2.0, 2.5])))


def test_lerp_dtypes_and_infinite_ends_follow_torch():
    _need(ember.float64)
    _torch_raises(lambda: torch.lerp(torch.ones(2), torch.ones(2, dtype=torch.float64), 0.5))
    with raises(DTypeError, "lerp", "float32", "`end`", "float64"):
        ember.lerp(ember.ones(2), ember.ones(2, dtype=ember.float64), 0.5)
    with raises(DTypeError, "lerp", "`weight`", "float64"):
        ember.lerp(ember.ones(2), ember.ones(2), ember.tensor([0.5], dtype=ember.float64))
    _torch_raises(lambda: torch.lerp(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), 1))
    with raises(DTypeError, "lerp", "int64"):
        ember.lerp(ember.ones(2, dtype=ember.int64), ember.ones(2, dtype=ember.int64), 1)
    start, end = [[-1.5, 1.25, INF, -INF], [0.0, NAN, 2.0, -3.0]], [[0.0], [1.0]]
    for w in (0.5, 0.25, 1.0, -0.75, 2.0):
        _same(ember.lerp(ember.tensor(start), ember.tensor(end), w),
              torch.lerp(torch.tensor(start), torch.tensor(end), w))
    _same(ember.lerp(ember.tensor(start), ember.tensor(end), ember.tensor(0.75, dtype=ember.float64)),
          torch.lerp(torch.tensor(start), torch.tensor(end), torch.tensor(0.75, dtype=torch.float64)))
    # three 0-d operands promote together: a float64 weight makes the result float64
    _same(ember.lerp(ember.tensor(1.0), ember.tensor(2.0), ember.tensor(0.3, dtype=ember.float64)),
          torch.lerp(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(0.3, dtype=torch.float64)))
    w = [0.5, 0.3, -0.6, 1.0]
    _same(ember.lerp(ember.tensor(start), ember.tensor(end), ember.tensor(w)),
          torch.lerp(torch.tensor(start), torch.tensor(end), torch.tensor(w)))


def test_isclose_needs_one_dtype_and_compares_bools():
    _torch_raises(lambda: torch.isclose(torch.ones(2), torch.ones(2, dtype=torch.int64)))
    with raises(DTypeError, "isclose", "float32 did not match int64"):
        ember.isclose(ember.ones(2), ember.ones(2, dtype=ember.int64))
    with raises(DTypeError, "isclose", "int64 did not match float32"):
        ember.allclose(ember.ones(2, dtype=ember.int64), ember.ones(2))
    a, b = [[True, False, True]], [[True], [False]]
    _same(ember.isclose(ember.tensor(a), ember.tensor(b), equal_nan=True),
          torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=True))
    assert ember.allclose(ember.zeros((0, 2, 1), dtype=ember.bool), ember.tensor([[True], [False]])) \
        == torch.allclose(torch.zeros((0, 2, 1), dtype=torch.bool), torch.tensor([[True], [False]]))
    assert not ember.allclose(ember.tensor(a), ember.tensor(b))


def test_xlogy_dtype_and_zero_x_follow_torch():
    x = [[0, 2, 1, 0], [0, 0, 3, 0]]
    y = [1.5, -0.5, 0.0, INF]
    _same(ember.xlogy(ember.tensor(x, dtype=ember.uint8), ember.tensor(y)),
          torch.xlogy(torch.tensor(x, dtype=torch.uint8), torch.tensor(y)))
    _same(ember.xlogy(ember.tensor(y), ember.tensor(x, dtype=ember.uint8)),
          torch.xlogy(torch.tensor(y), torch.tensor(x, dtype=torch.uint8)))
    _same(ember.xlogy(ember.tensor(x), ember.tensor(y)), torch.xlogy(torch.tensor(x), torch.tensor(y)))
    _same(ember.xlogy(0, ember.tensor(y)), torch.xlogy(0, torch.tensor(y)))
    _same(ember.xlogy(ember.tensor(x), 2), torch.xlogy(torch.tensor(x), 2))
    _same(ember.xlogy(ember.tensor(x), 2**63), torch.xlogy(torch.tensor(x), 2**63))
    _torch_raises(lambda: torch.xlogy(torch.tensor(x), 10**20))
    with raises(ValueRangeError, "xlogy", str(10**20), "64-bit"):
        ember.xlogy(ember.tensor(x), 10**20)


def test_xlogy_with_a_half_tensor_and_a_byte_scalar_stays_half():
    _need(ember.float16)
    h = [[1.8, 0.0, -0.5]]
    for y in (2**63, 1e30, 70000.0, 60000.0, -1.0, 0.0):  # y past float16's range is inf there, as in torch
        _same(ember.xlogy(ember.tensor(h, dtype=ember.float16), y),
              torch.xlogy(torch.tensor(h, dtype=torch.float16), y))
    _same(ember.xlogy(ember.tensor(h, dtype=ember.float16), ember.tensor(2, dtype=ember.uint8)),
          torch.xlogy(torch.tensor(h, dtype=torch.float16), torch.tensor(2, dtype=torch.uint8)))


def test_logaddexp_casts_a_bool_operand_to_the_float_result():
    _need(ember.float64)
    a, b = [[False, True, True]], [-0.0, 1.5, -INF]
    _same(ember.logaddexp(ember.tensor(a), ember.tensor(b, dtype=ember.float64)),
          torch.logaddexp(torch.tensor(a), torch.tensor(b, dtype=torch.float64)))


@pytest.mark.parametrize("op", ["amin", "amax", "logsumexp"])
def test_reduction_keepdim_must_be_bool(op):
    _torch_raises(lambda: getattr(torch, op)(torch.ones(2, 3), 1, keepdim="yes"))
    with raises(DTypeError, op, "keepdim", "must be bool", "str"):
        getattr(ember, op)(ember.ones(2, 3), 1, keepdim="yes")
    with raises(DTypeError, op, "keepdim", "int"):
        getattr(ember.ones(2, 3), op)(1, keepdim=1)
    _same(getattr(ember, op)(ember.ones(2, 3), 1, keepdim=np.bool_(True)),
          getattr(torch, op)(torch.ones(2, 3), 1, keepdim=True))


def test_norm_keepdim_must_be_bool():
    _torch_raises(lambda: torch.ones(4).norm(p=-1, dim=-1, keepdim="yes"))
    with raises(DTypeError, "vector_norm", "keepdim", "must be bool", "str"):  # was a raw TypeError unfused
        ember.ones(4).norm(p=-1, dim=-1, keepdim="yes")
    with raises(DTypeError, "vector_norm", "keepdim", "int"):
        ember.linalg.vector_norm(ember.ones(4), 2, 0, 1)
    _same(ember.ones(2, 3).norm(p=1, dim=1, keepdim=True), torch.ones(2, 3).norm(p=1, dim=1, keepdim=True))


def test_logsumexp_needs_a_dim():
    _torch_raises(lambda: torch.logsumexp(torch.ones(2), dim=None))
    with raises(DimError, "logsumexp", "dim", "None"):
        ember.logsumexp(ember.ones(2), dim=None)


@pytest.mark.parametrize("weight", ["tensor", "number"])
def test_lerp_gradients_at_infinite_ends_match_torch(ad, weight):
    start, end = [-INF, 0.5, 1.0, INF, NAN, -2.0], [-0.122, INF, 3.0, 1.0, 0.0, -2.0]
    if weight == "number":
        for w in (0.766, 0.25):
            _check_grads(lambda lib, F, a, b, w=w: lib.lerp(a, b, w), start, end)
    else:
        _check_grads(lambda lib, F, a, b, w: lib.lerp(a, b, w), start, end, [0.766, 0.3, -0.7, 0.5, 0.2, 1.5])
        _check_grads(lambda lib, F, a, b, w: lib.lerp(a, b, w), start, end, 0.766)  # 0-d weight


# ------------------------------------------------------------------------------------------------------------
# fuzz failure classes: creation, shape, indexing and nn.functional (overflowing fills, roll, scatter, index_put,
# take_along_dim, fill_, mixed-dtype losses and norms, integer activations, 0-d softmax gradients)
# ------------------------------------------------------------------------------------------------------------
def test_float_fill_values_past_the_dtype_range_are_refused():
    _need(ember.float16)
    _torch_raises(lambda: torch.full_like(torch.zeros(0, dtype=torch.float16), 1e30))
    with raises(ValueRangeError, "full_like", "1e+30", "float16", "overflow"):
        ember.full_like(ember.zeros(0, dtype=ember.float16), 1e30)
    with raises(ValueRangeError, "full", "float32", "overflow"):
        ember.full((2,), 1e300, dtype=ember.float32)
    with raises(ValueRangeError, "linspace", "float16", "overflow"):
        ember.linspace(3.0, 1e30, 5, dtype=ember.float16)
    with raises(ValueRangeError, "fill_", "float16", "overflow"):
        ember.zeros(2, dtype=ember.float16).fill_(1e30)
    # infinities are not overflow
    _same(ember.full_like(ember.zeros(2, dtype=ember.float16), INF),
          torch.full_like(torch.zeros(2, dtype=torch.float16), INF))
    _same(ember.full((2,), 65504.0, dtype=ember.float16), torch.full((2,), 65504.0, dtype=torch.float16))


@pytest.mark.parametrize("start,end,steps", [(1000.0, INF, 4), (1000.0, INF, 2), (-INF, INF, 3), (1.0, NAN, 3),
                                             (0.0, 1.0, 7), (-3.0, 5.0, 6), (2.0, -2.0, 5)])
def test_linspace_uses_torchs_two_sided_formula(start, end, steps):
    _same(ember.linspace(start, end, steps), torch.linspace(start, end, steps))
    _same(ember.linspace(0, 10, 5, dtype=ember.int64), torch.linspace(0, 10, 5, dtype=torch.int64))


def test_roll_dims_of_0d_and_empty_tensors_follow_torch():
    _torch_raises(lambda: torch.roll(torch.tensor(1.0), (0,), (0,)))
    with raises(DimError, "roll", "Dimension specified as 0 but tensor has no dimensions"):
        ember.roll(ember.tensor(1.0), (0,), (0,))
    _same(ember.roll(ember.tensor(1.0), 1), torch.roll(torch.tensor(1.0), 1))
    # torch copies an empty tensor before it looks at the dims (-5 is out of range for 4 dims)
    _same(ember.roll(ember.zeros(0, 1, 3, 3), (-2, 0, -3), (1, -5, -5)),
          torch.roll(torch.zeros(0, 1, 3, 3), (-2, 0, -3), (1, -5, -5)))
    with raises(ValueRangeError, "roll", "shifts and dimensions must align"):
        ember.roll(ember.zeros(0, 2), (1, 2), (0,))
    with raises(ValueRangeError, "roll", "`shifts` required"):
        ember.roll(ember.zeros(2, 2), (), ())
    with raises(DTypeError, "roll", "dims"):
        ember.roll(ember.zeros(0, 2), 1, "a")


def test_scatter_and_gather_with_an_empty_index_skip_its_checks():
    x, tx = ember.ones(2, 3), torch.ones(2, 3)
    # any dtype and rank of an empty index: self is returned unchanged, as torch
    _same(ember.scatter(x, 0, ember.zeros(2, 0, 1, dtype=ember.int64), 0.5),
          torch.scatter(tx, 0, torch.zeros(2, 0, 1, dtype=torch.int64), 0.5))
    _same(ember.scatter(x, -1, ember.zeros(0, 1), ember.zeros(0, 1)),
          torch.scatter(tx, -1, torch.zeros(0, 1), torch.zeros(0, 1)))
    y, ty = ember.tensor([[-4], [-3]]), torch.tensor([[-4], [-3]])
    y.scatter_(-1, ember.zeros(1, 0), False)
    ty.scatter_(-1, torch.zeros(1, 0), False)
    _same(y, ty)
    _same(ember.gather(x, 1, ember.zeros(2, 0, 1)), torch.gather(tx, 1, torch.zeros(2, 0, 1)))
    # still checked: the dim and src's dtype
    _torch_raises(lambda: torch.scatter(tx, 5, torch.zeros(0, dtype=torch.int64), 1.0))
    with raises(DimError, "scatter", "dimension out of range"):
        ember.scatter(x, 5, ember.zeros(0, dtype=ember.int64), 1.0)
    with raises(DTypeError, "scatter", "self.dtype", "src.dtype", "int64"):
        ember.scatter(x, 0, ember.zeros(0, dtype=ember.int64), ember.zeros(0, dtype=ember.int64))


def test_scatter_and_gather_take_int32_indices():
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    i = np.array([[1, 0, 1]], np.int32)
    _same(ember.gather(ember.tensor(a), 0, ember.tensor(i)), torch.gather(torch.tensor(a), 0, torch.tensor(i)))
    x, tx = ember.tensor(a), torch.tensor(a)
    x.scatter_(0, ember.tensor(i), 9.0)
    tx.scatter_(0, torch.tensor(i), 9.0)
    _same(x, tx)
    _torch_raises(lambda: torch.gather(torch.tensor(a), 0, torch.tensor(i.astype(np.int16))))
    with raises(DTypeError, "gather", "int32/int64", "int16"):
        ember.gather(ember.tensor(a), 0, ember.tensor(i.astype(np.int16)))


def test_take_along_dim_wraps_indices_modulo_the_dim_size():
    y = np.array([[[4]], [[3]]], np.int32)
    z = np.arange(12).reshape(3, 4)
    for i in (-1, -2, -3, 2, 5):
        idx = np.array([[[i]]])
        _same(ember.take_along_dim(ember.tensor(y), ember.tensor(idx), -3),
              torch.take_along_dim(torch.tensor(y), torch.tensor(idx), -3))
    idx = np.array([[5], [-5], [-9]])
    _same(ember.take_along_dim(ember.tensor(z), ember.tensor(idx), 1),
          torch.take_along_dim(torch.tensor(z), torch.tensor(idx), 1))
    # the flattened form does not wrap
    _torch_raises(lambda: torch.take_along_dim(torch.tensor(z), torch.tensor([-1])))
    with raises(ember.IndexOutOfRangeError, "index -1 is out of bounds"):
        ember.take_along_dim(ember.tensor(z), ember.tensor([-1]))
    with raises(ember.IndexOutOfRangeError, "take_along_dim", "size 0"):
        ember.take_along_dim(ember.zeros(3, 0), ember.ones(3, 1, dtype=ember.int64), 1)


def test_index_put_value_dtype_rules_follow_torch():
    def both(fn: Callable[[Any], Any]) -> None:
        x, tx = ember.zeros(3, 2), torch.zeros(3, 2)
        fn(x)
        fn(tx)
        _same(x, tx)

    def put(key: Callable[[Any], Any], value: Callable[[Any], Any]) -> Callable[[Any], None]:
        def f(x: Any) -> None:
            lib = torch if isinstance(x, torch.Tensor) else ember
            x[key(lib)] = value(lib)
        return f

    int64_rows = put(lambda lib: lib.tensor([0, 2]), lambda lib: lib.ones(2, dtype=lib.int64))
    _torch_raises(lambda: int64_rows(torch.zeros(3, 2)))
    with raises(DTypeError, "index_put", "dtypes match", "float32", "int64"):
        int64_rows(ember.zeros(3, 2))
    with raises(DTypeError, "index_put_", "dtypes match"):
        ember.zeros(3).index_put_((ember.tensor([0, 1]),), ember.tensor(5, dtype=ember.int64), accumulate=True)
    # basic indexing copies (casts); a one-element value with a single bool mask is a masked fill (casts)
    both(put(lambda lib: slice(0, 2), lambda lib: lib.ones(2, dtype=lib.int64)))
    both(put(lambda lib: lib.tensor(1), lambda lib: lib.ones(2, dtype=lib.int64)))
    both(put(lambda lib: lib.tensor([True, False, True]), lambda lib: lib.tensor([7], dtype=lib.int64)))
    both(put(lambda lib: lib.tensor([0, 2]), lambda lib: 7))
    # ... but masked_fill_ refuses a uint8 mask, scalar value or not
    _torch_raises(lambda: torch.zeros(3).index_put_((torch.tensor([1, 0, 1], dtype=torch.uint8),), torch.tensor(5.0)))
    with raises(DTypeError, "masked_fill_ only supports boolean masks", "uint8"):
        ember.zeros(3).index_put_((ember.tensor([1, 0, 1], dtype=ember.uint8),), ember.tensor(5.0))
    x = ember.zeros(3)
    x.index_put_((ember.tensor([1, 0, 1], dtype=ember.uint8),), ember.tensor([5.0, 6.0]))
    assert x.tolist() == [5.0, 0.0, 6.0]
    with raises(ValueRangeError, "index_put", "9223372036854775808"):
        ember.zeros(3)[0:1] = 1 << 63


def test_fill_with_a_tensor_value_needs_0d_and_casts_without_range_check():
    _torch_raises(lambda: torch.tensor(True).fill_(torch.tensor([3], dtype=torch.int8)))
    with raises(ShapeError, "fill_", "0-dimension value tensor", "1 dimensions"):
        ember.tensor(True).fill_(ember.tensor([3], dtype=ember.int8))
    for value, dtype in ((-0.5, "uint8"), (-1.5, "uint8"), (300, "uint8"), (300.0, "int8"), (0.5, "bool")):
        x, tx = ember.zeros(2, dtype=getattr(ember, dtype)), torch.zeros(2, dtype=getattr(torch, dtype))
        x.fill_(ember.tensor(value))
        tx.fill_(torch.tensor(value))
        _same(x, tx)
    with raises(ValueRangeError, "fill_", "uint8", "overflow"):  # a Python number is range-checked
        ember.zeros(2, dtype=ember.uint8).fill_(-0.5)


def test_losses_and_distances_promote_their_inputs_as_torch():
    _need(ember.float16, ember.float64)
    b = np.array([[True, False, True]])
    f = np.array([[1.0, 2.0, 3.0]], np.float32)
    _same(EF.cosine_similarity(ember.tensor(b), ember.tensor(-0.5, dtype=ember.float16)),
          TF.cosine_similarity(torch.tensor(b), torch.tensor(-0.5, dtype=torch.float16)))
    _same(EF.mse_loss(ember.tensor(b), ember.tensor(f, dtype=ember.float64)),
          TF.mse_loss(torch.tensor(b), torch.tensor(f, dtype=torch.float64)))
    _same(EF.mse_loss(ember.tensor([[1, 2, 3]]), ember.tensor(f), reduction="none"),
          TF.mse_loss(torch.tensor([[1, 2, 3]]), torch.tensor(f), reduction="none"))
    _torch_raises(lambda: TF.mse_loss(torch.tensor([1, 2]), torch.tensor([1, 2])))
    with raises(DTypeError, "mse_loss", "floating point", "int64"):
        EF.mse_loss(ember.tensor([1, 2]), ember.tensor([1, 2]))
    with raises(DTypeError, "cosine_similarity", "floating point", "bool"):
        EF.cosine_similarity(ember.tensor(b), ember.tensor(b))
    p = np.array([[0.2, 0.3, 0.5]])
    _same(EF.cross_entropy(ember.tensor(f), ember.tensor(p)), TF.cross_entropy(torch.tensor(f), torch.tensor(p)))
    got = EF.cross_entropy(ember.tensor(f, dtype=ember.float16), ember.tensor(p, dtype=ember.float32))
    exp = TF.cross_entropy(torch.tensor(f, dtype=torch.float16), torch.tensor(p, dtype=torch.float32))
    assert got.dtype is ember.float32  # log_softmax in float16, then the float32 product
    np.testing.assert_allclose(got.numpy(), exp.numpy(), rtol=1e-3)  # float16 rounding differs per backend


def test_cross_entropy_ignores_targets_on_nan_rows():
    _need(ember.float64)
    x = np.array([[-0.741, -0.141, -0.0, -0.112], [2.56, -0.431, -INF, 0.253], [-INF, INF, 0.617, -0.306]])
    t = np.array([2, 1, 0])
    for kw in ({}, {"reduction": "none"}, {"reduction": "sum"}, {"label_smoothing": 0.1, "reduction": "none"}):
        _same(EF.cross_entropy(ember.tensor(x), ember.tensor(t), ignore_index=0, **kw),
              TF.cross_entropy(torch.tensor(x), torch.tensor(t), ignore_index=0, **kw))


def test_cross_entropy_probability_target_promotes_the_weight_as_torch():
    _need(ember.float64)
    x = np.array([[-1.131, 1.864, -0.977, 0.48], [0.208, 0.445, -1.086, 0.28]], dtype=np.float32)
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], dtype=np.float32)
    for w in (np.array([0.97, 1.385, 1.209, 1.552]), np.array([1, 2, 3, 4])):  # float64 and int64 weights
        _same(EF.cross_entropy(ember.tensor(x), ember.tensor(p), weight=ember.tensor(w)),
              TF.cross_entropy(torch.tensor(x), torch.tensor(p), weight=torch.tensor(w)))
    with raises(ShapeError, "cross_entropy", "weight", "(4,)"):
        EF.cross_entropy(ember.tensor(x), ember.tensor(p), weight=ember.ones(3))
    _same(EF.cross_entropy(ember.tensor(x), ember.tensor(p), ignore_index=-1),  # a negative one is unused, as torch
          TF.cross_entropy(torch.tensor(x), torch.tensor(p), ignore_index=-1))
    _torch_raises(lambda: TF.cross_entropy(torch.tensor(x), torch.tensor(p), ignore_index=0))
    with raises(UnsupportedError, "cross_entropy", "ignore_index", "probability"):
        EF.cross_entropy(ember.tensor(x), ember.tensor(p), ignore_index=0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_targets_as_uint8_and_zero_classes_match_torch(reduction):
    x = np.array([[-1.131, 1.864, -0.977], [0.208, 0.445, -1.086]], dtype=np.float32)
    t8 = np.array([1, 2], dtype=np.uint8)  # torch takes int64 or uint8 class indices
    _same(EF.cross_entropy(ember.tensor(x), ember.tensor(t8), reduction=reduction),
          TF.cross_entropy(torch.tensor(x), torch.tensor(t8), reduction=reduction))
    _same(EF.nll_loss(ember.tensor(x), ember.tensor(t8), reduction=reduction),
          TF.nll_loss(torch.tensor(x), torch.tensor(t8), reduction=reduction))
    with raises(DTypeError, "cross_entropy", "int32"):
        EF.cross_entropy(ember.tensor(x), ember.tensor(t8.astype(np.int32)))
    # zero classes: only ignored targets are allowed, and 'mean' is 0 / 0
    empty, ignored = np.ones((3, 0), np.float32), np.zeros(3, np.int64)
    _same(EF.cross_entropy(ember.tensor(empty), ember.tensor(ignored), ignore_index=0, reduction=reduction),
          TF.cross_entropy(torch.tensor(empty), torch.tensor(ignored), ignore_index=0, reduction=reduction))
    _same(EF.cross_entropy(ember.tensor(empty), ember.tensor(ignored), ignore_index=0, label_smoothing=0.1,
                           reduction=reduction),
          TF.cross_entropy(torch.tensor(empty), torch.tensor(ignored), ignore_index=0, label_smoothing=0.1,
                           reduction=reduction))  # NaN: the smoothing term divides by 0 classes
    with raises(IndexOutOfRangeError, "cross_entropy", "0 classes"):
        EF.cross_entropy(ember.tensor(empty), ember.tensor(ignored), reduction=reduction)
    probs = np.ones((1, 0), np.float32)
    got = EF.cross_entropy(ember.tensor(probs), ember.tensor(probs), reduction=reduction).numpy()
    exp = TF.cross_entropy(torch.tensor(probs), torch.tensor(probs), reduction=reduction).numpy()
    np.testing.assert_array_equal(got, exp)  # NaN for 'mean' (torch divides by numel / C), zeros otherwise


def test_integer_input_of_hardtanh_dropout_and_softmax_follows_torch():
    for dtype, lo, hi in (("int64", -1.0, 0.5), ("int8", -1.5, 2.5), ("uint8", 0.0, 2.0)):
        a = np.array([4, 0, 3, 1]).astype(dtype)
        _same(EF.hardtanh(ember.tensor(a), lo, hi), TF.hardtanh(torch.tensor(a), lo, hi))
    with raises(ValueRangeError, "hardtanh", "unsigned", "negative"):
        EF.hardtanh(ember.tensor([4, 0], dtype=ember.uint8), -1.0, 2.0)
    with raises(DTypeError, "hardtanh", "Bool"):
        EF.hardtanh(ember.tensor([True]), -1.0, 2.0)
    with raises(ValueRangeError, "hardtanh", "int8", "overflow"):
        EF.hardtanh(ember.tensor([1], dtype=ember.int8), -1000.0, 1000.0)
    i = np.array([[1, 2, 3]])
    for p, training in ((0.0, True), (1.0, True), (0.5, False)):
        _same(EF.dropout(ember.tensor(i), p, training), TF.dropout(torch.tensor(i), p, training))
    _same(EF.dropout(ember.tensor([True, False]), 1.0), TF.dropout(torch.tensor([True, False]), 1.0))
    _torch_raises(lambda: TF.dropout(torch.tensor(i), 0.5))
    with raises(DTypeError, "dropout", "int64"):
        EF.dropout(ember.tensor(i), 0.5)
    for fn in ("softmax", "log_softmax"):
        _same(getattr(EF, fn)(ember.zeros(4, 0, 2, dtype=ember.int8), 0),
              getattr(TF, fn)(torch.zeros(4, 0, 2, dtype=torch.int8), 0))
        with raises(DTypeError, fn, "int8"):
            getattr(EF, fn)(ember.zeros(2, 2, dtype=ember.int8), 1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_takes_float32_parameters_with_half_input(dtype):
    _need(getattr(ember, dtype))
    a = np.array([[1.0, 2.0, 3.5], [0.25, -1.0, 2.0]], np.float32)
    w, b = np.array([1.1, 0.9, 1.0], np.float32), np.array([0.1, 0.0, -0.2], np.float32)
    got = EF.layer_norm(ember.tensor(a, dtype=getattr(ember, dtype)), [3], ember.tensor(w), ember.tensor(b))
    exp = TF.layer_norm(torch.tensor(a, dtype=getattr(torch, dtype)), [3], torch.tensor(w), torch.tensor(b))
    assert got.dtype is getattr(ember, dtype)
    np.testing.assert_allclose(got.float().numpy(), exp.float().numpy(), atol=1e-2)
    # mixing is float32 parameters only, both of them
    with raises(DTypeError, "layer_norm", "bias"):
        EF.layer_norm(ember.tensor(a, dtype=getattr(ember, dtype)), [3], ember.tensor(w, dtype=getattr(ember, dtype)),
                      ember.tensor(b))


def test_softmax_of_a_non_finite_0d_tensor_has_torchs_nan_gradient(ad):
    for fn in ("softmax", "log_softmax", "softmin"):
        for v in (0.5, NAN, INF, -INF):
            _check_grads(lambda lib, F, x, fn=fn: getattr(F, fn)(x, 0), v)


@pytest.mark.parametrize("other", ["0-d zero", "zero rows", "finite"])
def test_cosine_similarity_gradient_at_a_zero_vector_matches_torch(ad, other):
    a = [[-1.424, 0.194], [-2.108, -0.745], [-0.089, -0.491], [0.123, 0.157]]
    b = {"0-d zero": 0.0, "zero rows": np.zeros((4, 2)), "finite": [[0.0, 2.0]]}[other]
    for dim in (-2, -1):  # torch clamps the norms to eps out of the gradient's sight
        _check_grads(lambda lib, F, x, y, dim=dim: F.cosine_similarity(x, y, dim=dim), a, b)
