"""Core's value-range rules, the gradient-preserving empty paths and the default softmax composition, against torch.

The device-generic behaviour (every op on every device) is in the conformance kit's ``test_edge_cases``; these tests
pin down the helpers it rests on: ``dtypes.convert_scalar`` / ``fits`` / ``check_scalar_int`` (PyTorch's c10
overflow rules), ``ops.elementwise.keep_graph`` and ``tracks_grad``, ``Backend.softmax`` and flex's allocation
errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.backend import Backend
from ember.errors import DTypeError, OutOfMemoryError, ValueRangeError
from ember.nn import functional as EF
from ember.ops.elementwise import keep_graph, tracks_grad

torch = pytest.importorskip("torch")
FLEX = ember.Device.flex()
PLAIN = ember.Device.parse("flex+fusion(enabled=False)")  # numpy handles in and out, nothing deferred
AD = FLEX.autodiff()
INF, NAN = float("inf"), float("nan")

_INT_DTYPES = ["uint8", "int8", "int16", "int32", "int64"]
_VALUES = [0, 1, -1, 127, 128, -128, -129, 255, 256, -255, -256, 2**15, -(2**15) - 1, 2**31, -(2**31) - 1,
           2**63 - 1, 2**63, -(2**63), 1.5, -0.5, 127.9, 128.0, -128.5, 255.0, 255.5, -1.0, INF, -INF, NAN, True,
           False]


@pytest.mark.parametrize("dtype", _INT_DTYPES)
def test_convert_scalar_agrees_with_torch_full(dtype):
    """Every value torch.full accepts for an integer dtype converts to the same value; every one it refuses is a
    ValueRangeError naming the value and dtype."""
    d = getattr(dt, dtype)
    for v in _VALUES:
        try:
            ref = torch.full((1,), v, dtype=getattr(torch, dtype)).item()
        except (RuntimeError, OverflowError):
            with pytest.raises(ValueRangeError, match="cannot be converted|64-bit") as info:
                dt.convert_scalar(v, d, "full")
            assert str(v) in str(info.value) or str(int(v) if isinstance(v, bool) else v) in str(info.value)
            continue
        got = dt.convert_scalar(v, d, "full")
        assert got == ref and type(got) is int, (v, got, ref)


def test_convert_scalar_for_float_and_bool_dtypes():
    assert dt.convert_scalar(2**63, dt.float32, "full") == float(2**63)
    assert dt.convert_scalar(True, dt.float64, "full") == 1.0
    assert dt.convert_scalar(NAN, dt.bool_, "full") is True  # torch: any non-zero is True, NaN included
    assert dt.convert_scalar(0.0, dt.bool_, "full") is False
    assert dt.convert_scalar(np.int16(-3), dt.int8, "full") == -3
    with pytest.raises(ValueRangeError, match="full: Python int 18446744073709551616 is too big"):
        dt.convert_scalar(2**64, dt.float32, "full")
    with pytest.raises(DTypeError, match="fill_: value must be a number, got str 'a'"):
        dt.convert_scalar("a", dt.float32, "fill_")
    with pytest.raises(DTypeError, match="NoneType"):
        dt.convert_scalar(None, dt.int64, "where")


def test_check_scalar_int_bounds_are_torchs():
    for ok in (-(2**63), 0, 2**63, 2**64 - 1):
        dt.check_scalar_int(ok, "add")
        torch.tensor([1]) + ok  # noqa: B018 - torch takes it too
    for bad in (-(2**63) - 1, 2**64, 10**30):
        with pytest.raises(ValueRangeError, match=f"add: Python int {bad} is too big"):
            dt.check_scalar_int(bad, "add")
        with pytest.raises(OverflowError):
            torch.tensor([1]) + bad  # noqa: B018
    dt.check_scalar_int(1e300, "add")  # floats are not ints: no check (inf in float32, as torch)


def test_fits_is_c10_overflows():
    assert dt.fits(-255, dt.uint8) and not dt.fits(-256, dt.uint8)  # negatives wrap for unsigned dtypes
    assert dt.fits(255.0, dt.uint8) and not dt.fits(-1.0, dt.uint8) and not dt.fits(255.5, dt.uint8)
    assert not dt.fits(NAN, dt.int64) and not dt.fits(INF, dt.int32)
    assert dt.int_range(dt.int16) == (-(2**15), 2**15 - 1)


def test_tensor_range_checks_apply_to_python_data_only():
    """numpy arrays cast as numpy (and torch) cast them; lists and scalars are checked value by value."""
    a = np.array([300, -1])
    assert ember.tensor(a, dtype=ember.uint8).numpy().tolist() == torch.tensor(a, dtype=torch.uint8).tolist()
    with pytest.raises(ValueRangeError, match="tensor\\(\\): value 300 cannot be converted to type uint8"):
        ember.tensor([300, -1], dtype=ember.uint8)
    with pytest.raises(ValueRangeError, match="value 300 cannot be converted to type uint8"):
        ember.tensor(np.int64(300), dtype=ember.uint8)  # a numpy scalar is a value, as in torch
    big = [[float(i) for i in range(1000)]] * 50  # a large ordinary list keeps working
    assert ember.tensor(big).shape == (50, 1000)


# ------------------------------------------------------------------------------------------------------------
# gradient-preserving empty paths
# ------------------------------------------------------------------------------------------------------------
def test_keep_graph_is_a_no_op_off_autodiff_and_untracked():
    s = FLEX.stack
    h = s.full((0, 3), 0.0, dt.float32)
    assert keep_graph(s, h, ember.zeros(0, 3)) is h
    ad = AD.stack
    h2 = ad.full((0, 3), 0.0, dt.float32)
    assert keep_graph(ad, h2, ember.zeros(0, 3, device=AD)) is h2  # no input requires grad
    assert not tracks_grad(ad, 1.0, None, h2)


def test_keep_graph_gives_zero_gradients_even_for_non_finite_inputs():
    w = ember.tensor([INF, NAN, 1.0], device=AD, requires_grad=True)
    x = ember.zeros(0, 3, device=AD, requires_grad=True)
    s = AD.stack
    out = keep_graph(s, s.full((2,), 1.0, dt.float32), x, w, None, 3.0)
    y = ember.Tensor._make(out, ember.float32, AD)
    assert y.numpy().tolist() == [1.0, 1.0]  # the tie adds exactly 0
    y.sum().backward()
    assert x.grad.shape == (0, 3)
    assert w.grad.numpy().tolist() == [0.0, 0.0, 0.0]


def test_tracked_and_untracked_clamp_and_activations_give_identical_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 7)) * 2
    x[0, :3] = [NAN, INF, -INF]
    x[1, :4] = [0.0, 1.0, -1.0, 6.0]
    lo = rng.standard_normal((6, 7))
    lo[2, 0] = NAN
    for fn in (lambda t, b: t.clamp(-1.0, 1.0), lambda t, b: t.clamp(min=b), lambda t, b: t.clamp(b, b + 0.5),
               lambda t, b: t.clamp(max=0.25), lambda t, b: EF.relu(t), lambda t, b: EF.hardtanh(t),
               lambda t, b: EF.relu6(t * 4)):
        plain = fn(ember.tensor(x, device=FLEX), ember.tensor(lo, device=FLEX)).numpy()
        tracked = fn(ember.tensor(x, device=AD, requires_grad=True), ember.tensor(lo, device=AD, requires_grad=True))
        np.testing.assert_array_equal(tracked.numpy(), plain)
    ref = torch.clamp(torch.tensor(x), min=torch.tensor(lo), max=torch.tensor(lo) + 0.5).numpy()
    np.testing.assert_array_equal(ember.tensor(x, device=AD, requires_grad=True).clamp(
        ember.tensor(lo, device=AD), ember.tensor(lo, device=AD) + 0.5).numpy(), ref)


def test_clamp_gradients_reach_tensor_bounds_as_torch():
    x, lo, hi = [0.0, 1.0, 2.0, 0.5, 5.0, NAN], [0.0, 0.0, 3.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.5, 2.0, 1.0]

    def grads(lib: Any, **kw: Any) -> list[list[float]]:
        ts = [lib.tensor(v, dtype=lib.float64, requires_grad=True, **kw) for v in (x, lo, hi)]
        lib.clamp(*ts).sum().backward()
        return [t.grad.numpy().tolist() for t in ts]

    assert grads(ember, device=AD) == grads(torch)


# ------------------------------------------------------------------------------------------------------------
# the default softmax composition and flex's kernels
# ------------------------------------------------------------------------------------------------------------
_ROWS = np.array([[INF, 1.0, 2.0], [-INF, -INF, -INF], [INF, -INF, 0.0], [-INF, 0.0, 1.0], [NAN, 0.0, 1.0],
                  [1.0, 2.0, 3.0]], np.float64)


@pytest.mark.parametrize("log", [False, True])
def test_default_softmax_composition_and_flex_match_torch(log):
    be = PLAIN.stack
    ref = (torch.log_softmax if log else torch.softmax)(torch.tensor(_ROWS), 1).numpy()
    np.testing.assert_allclose(Backend.softmax(be, _ROWS.copy(), 1, log), ref, equal_nan=True)
    np.testing.assert_allclose(be.softmax(_ROWS.copy(), 1, log), ref, equal_nan=True)
    assert be.softmax(np.zeros((2, 0)), 1, log).shape == (2, 0)


def test_flex_allocation_errors_name_the_op_and_sizes():
    be = PLAIN.stack
    with pytest.raises(OutOfMemoryError, match=r"full: .*shape \(4611686018427387904, 4\).*float32") as info:
        ember.full((2**62, 4), 1.0, device=ember.Device.parse("flex+fusion(enabled=False)")).numpy()
    assert isinstance(info.value, MemoryError)
    with pytest.raises(OutOfMemoryError, match=r"arange: .*1000000000000000 elements, 8000000000000000 bytes"):
        ember.arange(10**15, device=FLEX)
    with pytest.raises(OutOfMemoryError, match="add: flex"):
        be.binary("add", np.broadcast_to(np.ones(1, np.float32), (10**13,)), 1.0)
    with pytest.raises(OutOfMemoryError, match="eye: .*10000000 elements|eye: cannot allocate"):
        ember.eye(10**7, device=FLEX)
    assert math.prod((3, 4)) == ember.ones(3, 4, device=FLEX).numel()  # ordinary sizes are untouched


@pytest.mark.parametrize("device", ["flex", "flex+fusion(enabled=False)", "flex+autodiff"])
@pytest.mark.parametrize("make", [lambda d: ember.ones(2, device=d).repeat(10**13),
                                  lambda d: ember.ones(1, device=d).expand(10**13).contiguous(),
                                  lambda d: ember.ones(1, device=d).expand(10**13) + 1,
                                  lambda d: ember.ones(1, device=d).expand(10**13).exp()],
                         ids=["repeat", "contiguous", "add", "exp"])
def test_flex_ops_past_memory_are_out_of_memory_errors(device, make):
    with pytest.raises(OutOfMemoryError, match="flex \\(host memory\\) cannot allocate"):
        make(ember.Device.parse(device)).numpy()


def test_add_with_the_default_alpha_skips_the_alpha_checks(monkeypatch):
    """alpha=1 (an int) is the hot path: no result-dtype computation, no extra call; other alphas are checked."""
    from ember.ops import pointwise

    def boom(*args: Any) -> None:
        raise AssertionError("_scaled called for alpha=1")

    a = ember.tensor([1, 2], device=PLAIN)
    monkeypatch.setattr(pointwise, "_scaled", boom)
    assert ember.add(a, a).tolist() == [2, 4] and ember.sub(a, 1, alpha=1).tolist() == [0, 1]
    monkeypatch.undo()
    with pytest.raises(DTypeError, match="Boolean alpha only supported for Boolean results"):
        ember.add(a, a, alpha=True)  # True == 1, yet torch refuses it for an int64 result
    t = torch.tensor([1, 2])
    assert ember.add(a, a, alpha=np.int64(3)).tolist() == torch.add(t, t, alpha=3).tolist() == [4, 8]


def test_integer_division_checks_the_scalar_as_the_kernel_sees_it():
    """A Python int operand wraps to the compute dtype (torch's c10 conversion): 2**63 and 2**16 are 0 in int16, so
    division by them is division by zero; in int64 2**63 is -2**63, a valid divisor."""
    from ember.ops.elementwise import _check_int

    x16 = ember.tensor([3], dtype=ember.int16, device=PLAIN)
    for v in (2**63, 2**16, 0):
        with pytest.raises(ValueRangeError, match=f"floor_divide: ZeroDivisionError.*int {v}"):
            _check_int("floor_divide", x16, v, PLAIN.stack, dt.int16)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            torch.tensor([3], dtype=torch.int16).floor_divide(v)
    _check_int("floor_divide", x16, 2**16 + 1, PLAIN.stack, dt.int16)  # 1 in int16
    x64 = ember.tensor([3], device=PLAIN)
    assert ember.floor_divide(x64, 2**63).tolist() == torch.tensor([3]).floor_divide(2**63).tolist() == [-1]
    _check_int("remainder", ember.tensor([], dtype=ember.int16, device=PLAIN), 0, PLAIN.stack, dt.int16)  # empty
