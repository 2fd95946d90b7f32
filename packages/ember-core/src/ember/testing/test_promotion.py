"""Conformance: PyTorch's type promotion, exhaustively over dtype pairs, 0-d tensors and Python scalars.

The oracle is ``torch.result_type`` plus the actual torch op: the ember result must have the same dtype and
values, and where torch refuses a combination ember must raise a typed error (never compute something else).
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.testing import ALL_DTYPES, assert_close, pairs, require_dtype, to_torch, torch_dtype, torch_or_skip

OPS = ("add", "sub", "mul", "div", "eq", "lt", "maximum", "remainder", "bitwise_and", "logical_xor")
PAIRS = pairs(ALL_DTYPES)
SCALARS = (True, 2, -3, 2.5, 300)


def _ids(p: tuple[dt.DType, dt.DType]) -> str:
    return f"{p[0].name}-{p[1].name}"


def test_promote_types_table_matches_torch():
    torch = torch_or_skip()
    bad = []
    for a, b in PAIRS:
        want = dt.as_dtype(str(torch.promote_types(torch_dtype(a), torch_dtype(b))))
        if ember.promote_types(a, b) is not want:
            bad.append(f"{a.name}+{b.name}: ember {ember.promote_types(a, b).name}, torch {want.name}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("kind", ["dim-dim", "dim-0d", "0d-dim", "0d-0d"])
def test_result_type_table_matches_torch(device, kind):
    torch = torch_or_skip()
    bad = []
    for a, b in PAIRS:
        if not (device.supports_dtype(a) and device.supports_dtype(b)):
            continue
        sa = () if kind.startswith("0d") else (2,)
        sb = () if kind.endswith("0d") else (2,)
        ea, eb = ember.zeros(sa, dtype=a, device=device), ember.zeros(sb, dtype=b, device=device)
        want = torch.result_type(torch.zeros(sa, dtype=torch_dtype(a)), torch.zeros(sb, dtype=torch_dtype(b)))
        if ember.result_type(ea, eb) is not dt.as_dtype(str(want)):
            bad.append(f"{a.name}{sa} with {b.name}{sb}: ember {ember.result_type(ea, eb).name}, torch {want}")
    assert not bad, "\n".join(bad)


def _values(d: dt.DType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    base = np.array([1, 2, 3, 5, 7, 4], dtype=np.int64)[: int(np.prod(shape, dtype=np.int64)) or 0]
    base = np.roll(base, seed)
    if d is dt.bool_:
        return (base % 2 == 1).reshape(shape)
    return base.reshape(shape).astype(d.numpy)


def _check_op(device, torch, op: str, ea, eb, ta, tb, what: str) -> None:
    tfn = getattr(torch, op)
    try:
        want = tfn(ta, tb)
    except (RuntimeError, TypeError, NotImplementedError):
        with pytest.raises(ember.EmberError):
            getattr(ember, op)(ea, eb)
        return
    got = getattr(ember, op)(ea, eb)
    assert got.device == device
    assert_close(got, want, msg=f"{op}({what})")


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
@pytest.mark.parametrize("kind", ["dim-dim", "dim-0d", "0d-dim"])
def test_binary_ops_promote_like_torch(device, pair, kind):
    torch = torch_or_skip()
    a, b = pair
    require_dtype(device, a, b)
    sa = () if kind.startswith("0d") else (2, 3)
    sb = () if kind.endswith("0d") else (3,)
    na, nb = _values(a, sa, 0), _values(b, sb, 1)
    ea, eb = ember.tensor(na, device=device), ember.tensor(nb, device=device)
    ta, tb = to_torch(ea), to_torch(eb)
    for op in OPS:
        _check_op(device, torch, op, ea, eb, ta, tb, f"{a.name}{sa}, {b.name}{sb}")


@pytest.mark.parametrize("d", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_tensor_scalar_ops_promote_like_torch(device, d, scalar):
    torch = torch_or_skip()
    require_dtype(device, d)
    e = ember.tensor(_values(d, (4,), 2), device=device)
    t = to_torch(e)
    for op in ("add", "sub", "mul", "div", "eq", "lt", "remainder", "bitwise_or"):
        _check_op(device, torch, op, e, scalar, t, scalar, f"{d.name}(4,), {scalar!r}")
    # the operator forms, reflected included
    for name in ("__add__", "__radd__", "__mul__", "__rmul__", "__sub__", "__rsub__", "__truediv__",
                 "__rtruediv__", "__lt__", "__ge__", "__mod__", "__rmod__", "__floordiv__", "__pow__", "__and__",
                 "__ror__"):
        try:
            want = getattr(t, name)(scalar)
        except (RuntimeError, TypeError):
            with pytest.raises(ember.EmberError):
                getattr(e, name)(scalar)
            continue
        if want is NotImplemented:
            continue
        assert_close(getattr(e, name)(scalar), want, msg=f"{d.name} {name} {scalar!r}")


def test_numpy_scalars_act_as_0d_tensors(device):
    torch = torch_or_skip()
    e = ember.tensor([1, 2], dtype=ember.int32, device=device)
    t = to_torch(e)
    assert_close(e + np.float32(1.5), t + torch.tensor(1.5, dtype=torch.float32))
    assert_close(e + np.int64(3), t + torch.tensor(3, dtype=torch.int64))


def test_int_scalar_wraps_to_tensor_dtype(device):
    torch_or_skip()
    for d in (dt.uint8, dt.int8, dt.int16):
        if device.supports_dtype(d):
            e = ember.tensor([1, 100], dtype=d, device=device)
            assert_close(e + 300, to_torch(e) + 300, msg=f"{d.name} + 300 wraps")
            assert_close(e - 3, to_torch(e) - 3, msg=f"{d.name} - 3 wraps")


def test_unsupported_operand_types_raise(device):
    e = ember.ones(2, device=device)
    with pytest.raises(ember.DTypeError, match="unsupported operand"):
        ember.add(e, "1")
    with pytest.raises(ember.DTypeError, match="at least one Tensor"):
        ember.mul(2, 3)
    with pytest.raises(ember.DTypeError, match="result_type"):
        ember.result_type(e, [1, 2])
