"""Conformance: every unary and binary elementwise op of the contract, through the public functions, vs torch.

The ops, their torch oracles, sample domains and float32 tolerances come from the op registry (``ember.opinfo``):
an op added there is tested here without editing this module.

Inputs cover float32/float64/integer/bool dtypes, broadcasting, non-contiguous (strided, transposed) handles,
0-d and empty tensors, and the special values (NaN, +-inf, -0.0). Where torch refuses an input, ember must raise
a typed error instead of computing something else.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember import opinfo
from ember.testing import assert_close, noncontiguous, require_dtype, to_torch, torch_or_skip

FLOATS = np.array([-2.5, -1.0, -0.5, -0.0, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5, 3.7, np.nan, np.inf, -np.inf])
UNIT = np.array([-0.99, -0.5, -0.1, 0.0, 0.1, 0.5, 0.9, 0.99])
INTS = np.array([-7, -3, -1, 0, 1, 2, 3, 5, 7, 100])
BOOLS = np.array([True, False, True, True, False, False])
DTYPES = (dt.float32, dt.float64, dt.int32, dt.int64, dt.int8, dt.uint8, dt.bool_)

UNARY_OPS = sorted(opinfo.UNARY_OPS)
BINARY_OPS = sorted(opinfo.BINARY_OPS)
#: unary compositions without required arguments beyond the input, and those the kit calls with fixed ones
UNARY_COMPOSITIONS = sorted(op.name for op in opinfo.select(arity=1, kind="composition"))
BINARY_COMPOSITIONS = sorted(op.name for op in opinfo.select(arity=2, kind="composition"))
_COMPOSITION_ARGS: dict[str, tuple[float, ...]] = {"clamp": (-1.0, 1.0), "clamp_min": (0.5,), "clamp_max": (0.5,)}

# Torch computes these with different (still correct) rounding in float32; compare a little looser.
_LOOSE32 = {op.name for op in opinfo.OPS if op.loose_float32}


def _sample(d: dt.DType, op: str = "") -> np.ndarray:
    if d is dt.bool_:
        return BOOLS
    if d.is_floating_point:
        unit = op in opinfo.BY_NAME and opinfo.get(op).samples == "unit"
        return (UNIT if unit else FLOATS).astype(d.numpy)
    v = INTS if d.is_signed else np.abs(INTS)
    return np.clip(v, -128, 127).astype(d.numpy)


def _tol(op: str, d: dt.DType) -> dict[str, float]:
    if d is dt.float32 and op in _LOOSE32:
        return {"rtol": 3e-5, "atol": 1e-6}
    return {}


# Where torch refuses an input but the answer is unambiguous, ember may define it (documented extensions):
# rounding a bool is the identity; hypot of integers computes in the default float dtype (as atan2 does in
# torch); bool ** bool is a bool. The oracle for these is torch on equivalent inputs.
_UNARY_EXTENSIONS = {("floor", "bool"), ("ceil", "bool"), ("round", "bool"), ("trunc", "bool")}


def _category(t: ember.Tensor) -> str:
    return "bool" if t.dtype is dt.bool_ else "int" if t.dtype.is_integer else "float"


def _run_unary(torch, op: str, e: ember.Tensor, what: str, args: tuple[float, ...] = ()) -> None:
    tfn = getattr(torch, opinfo.get(op).torch)
    if (op, _category(e)) in _UNARY_EXTENSIONS:
        assert_close(getattr(ember, op)(e), to_torch(e), msg=f"{op}({what}) is the identity")
        return
    try:
        want = tfn(to_torch(e), *args)
    except (RuntimeError, TypeError, NotImplementedError):
        with pytest.raises(ember.EmberError):
            getattr(ember, op)(e, *args)
        return
    got = getattr(ember, op)(e, *args)
    assert got.device == e.device
    assert_close(got, want, msg=f"{op}({what})", **_tol(op, got.dtype))


@pytest.mark.parametrize("op", UNARY_OPS)
@pytest.mark.parametrize("d", DTYPES, ids=str)
def test_unary_op_matches_torch(device, op, d):
    torch = torch_or_skip()
    require_dtype(device, d)
    a = _sample(d, op)
    _run_unary(torch, op, ember.tensor(a, device=device), f"{d.name}{a.shape}")
    m = np.resize(a, (3, 5))
    _run_unary(torch, op, noncontiguous(m, device), f"non-contiguous {d.name}{m.shape}")


@pytest.mark.parametrize("op", UNARY_OPS)
@pytest.mark.parametrize("shape", [(), (0,), (2, 0)], ids=str)
def test_unary_op_0d_and_empty(device, op, shape):
    torch = torch_or_skip()
    n = int(np.prod(shape, dtype=np.int64))
    a = np.full(shape, 0.5 if n == 0 or op != "acosh" else 1.5, dtype=np.float32)
    _run_unary(torch, op, ember.tensor(a, device=device), f"float32{shape}")


@pytest.mark.parametrize("op", UNARY_COMPOSITIONS)
@pytest.mark.parametrize("d", DTYPES, ids=str)
def test_unary_composition_matches_torch(device, op, d):
    """The unary compositions of ember.ops.pointwise (square, frac, clamp, ...) on the kit's samples."""
    torch = torch_or_skip()
    require_dtype(device, d)
    a = _sample(d, op)
    args = _COMPOSITION_ARGS.get(op, ())
    _run_unary(torch, op, ember.tensor(a, device=device), f"{d.name}{a.shape}", args)
    m = np.resize(a, (3, 5))
    _run_unary(torch, op, noncontiguous(m, device), f"non-contiguous {d.name}{m.shape}", args)


def test_elementwise_ops_are_exported_as_functions_and_methods():
    """Every registry entry's functions (aliases too) and Tensor methods exist."""
    missing = [fn for op in opinfo.OPS for fn in op.functions if not callable(getattr(ember, fn, None))]
    missing += [f"Tensor.{m}" for op in opinfo.OPS for m in op.methods if not callable(getattr(ember.Tensor, m, None))]
    assert not missing, f"elementwise ops without a public function/method: {missing}"


@pytest.mark.parametrize("d", [dt.float16, dt.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["neg", "abs", "exp", "log", "sqrt", "sigmoid", "tanh", "floor", "isnan", "erf"])
def test_unary_half_types(device, op, d):
    torch = torch_or_skip()
    require_dtype(device, d)
    _run_unary(torch, op, ember.tensor(FLOATS.astype(d.numpy), device=device), d.name)


# --------------------------------------------------------------------------------------------------------------
# binary
# --------------------------------------------------------------------------------------------------------------
_SHIFT_AMOUNTS = np.array([0, 1, 2, 3, 5])


def _binary_inputs(op: str, d: dt.DType) -> tuple[np.ndarray, np.ndarray]:
    """(3, 4) and (4,) operands: broadcasting, and integer divisors / shift amounts / exponents in range."""
    a = np.resize(_sample(d), (3, 4))
    b = np.resize(_sample(d)[::-1], (4,))
    rhs = opinfo.get(op).int_rhs
    if d.category == 1:
        if rhs == "nonzero":
            b = np.where(b == 0, 3, b).astype(d.numpy)
        if rhs == "shift":
            b = np.resize(_SHIFT_AMOUNTS, (4,)).astype(d.numpy)
        if rhs == "exponent":
            a = np.resize(np.array([-3, -1, 0, 1, 2, 3]), (3, 4)).astype(d.numpy)
            b = np.array([0, 1, 2, 3]).astype(d.numpy)
    if d is dt.bool_ and rhs == "nonzero":
        b = np.ones(4, dtype=bool)
    return a, b


def _torch_binary(torch, op: str, ta, tb):
    cats = {("bool" if x.dtype == torch.bool else "float" if x.dtype.is_floating_point else "int")
            for x in (ta, tb) if isinstance(x, torch.Tensor)}
    if op == "hypot" and "float" not in cats:
        return torch.hypot(*(x.to(torch.get_default_dtype()) for x in (ta, tb)))
    if op == "pow" and cats == {"bool"}:
        return torch.pow(ta.long(), tb.long()).bool()
    tfn = getattr(torch, opinfo.get(op).torch)
    if not isinstance(tb, torch.Tensor):
        try:
            return tfn(ta, tb)
        except TypeError:  # torch.maximum & co. take tensors only; ember also takes a scalar (a wrapped number)
            return tfn(ta, torch.tensor(tb, dtype=ta.dtype if ta.dtype.is_floating_point else None))
    return tfn(ta, tb)


def _run_binary(torch, op: str, ea, eb, what: str) -> None:
    ta = to_torch(ea) if isinstance(ea, ember.Tensor) else ea
    tb = to_torch(eb) if isinstance(eb, ember.Tensor) else eb
    try:
        want = _torch_binary(torch, op, ta, tb)
    except (RuntimeError, TypeError, NotImplementedError):
        with pytest.raises(ember.EmberError):
            getattr(ember, op)(ea, eb)
        return
    got = getattr(ember, op)(ea, eb)
    if not isinstance(got, ember.Tensor):  # allclose, equal: a Python bool
        assert got == want, f"{op}({what}): {got} != {want}"
        return
    assert_close(got, want, msg=f"{op}({what})", **_tol(op, got.dtype))


@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("d", DTYPES, ids=str)
def test_binary_op_matches_torch(device, op, d):
    torch = torch_or_skip()
    require_dtype(device, d)
    a, b = _binary_inputs(op, d)
    ea, eb = ember.tensor(a, device=device), ember.tensor(b, device=device)
    _run_binary(torch, op, ea, eb, f"{d.name}{a.shape}, {d.name}{b.shape}")
    _run_binary(torch, op, eb, ea, f"{d.name}{b.shape}, {d.name}{a.shape}")
    _run_binary(torch, op, noncontiguous(a, device), noncontiguous(np.resize(b, (3, 4)), device),
                f"non-contiguous {d.name}(3, 4)")
    col = ember.tensor(b[:3].reshape(3, 1), device=device)
    _run_binary(torch, op, col, eb, f"{d.name}(3, 1), {d.name}(4,) -> (3, 4)")


@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_op_mixed_float_dtypes_and_scalars(device, op):
    torch = torch_or_skip()
    require_dtype(device, dt.float64)
    a = ember.tensor(np.resize(FLOATS, (2, 7)).astype(np.float32), device=device)
    b = ember.tensor(np.resize(FLOATS[::-1], (7,)), device=device)  # float64
    _run_binary(torch, op, a, b, "float32(2, 7), float64(7,)")
    _run_binary(torch, op, a, 1.5, "float32(2, 7), 1.5")
    _run_binary(torch, op, a, ember.tensor(2.0, dtype=ember.float64, device=device), "float32(2, 7), 0-d float64")


@pytest.mark.parametrize("op", BINARY_OPS)
@pytest.mark.parametrize("shapes", [((), ()), ((0,), (0,)), ((2, 0), (0,)), ((0, 3), (1, 3)), ((), (0, 2))],
                         ids=str)
def test_binary_op_0d_and_empty(device, op, shapes):
    torch = torch_or_skip()
    sa, sb = shapes
    ea = ember.tensor(np.full(sa, 3, dtype=np.int64), device=device)
    eb = ember.tensor(np.full(sb, 2, dtype=np.int64), device=device)
    _run_binary(torch, op, ea, eb, f"int64{sa}, int64{sb}")
    fa, fb = ea.to(ember.float32), eb.to(ember.float32)
    _run_binary(torch, op, fa, fb, f"float32{sa}, float32{sb}")


@pytest.mark.parametrize("op", BINARY_COMPOSITIONS)
@pytest.mark.parametrize("d", DTYPES, ids=str)
def test_binary_composition_matches_torch(device, op, d):
    """The binary compositions of ember.ops.pointwise (xlogy, logaddexp, isclose, ...): broadcast, both orders, and
    beside a float64 tensor."""
    torch = torch_or_skip()
    require_dtype(device, d, dt.float64)
    a, b = np.resize(_sample(d), (3, 4)), np.resize(_sample(d)[::-1], (4,))
    ea, eb = ember.tensor(a, device=device), ember.tensor(b, device=device)
    _run_binary(torch, op, ea, eb, f"{d.name}{a.shape}, {d.name}{b.shape}")
    _run_binary(torch, op, eb, ea, f"{d.name}{b.shape}, {d.name}{a.shape}")
    f = ember.tensor(np.resize(FLOATS, (4,)), dtype=ember.float64, device=device)
    _run_binary(torch, op, ea, f, f"{d.name}{a.shape}, float64(4,)")


def test_binary_ops_are_exported_as_functions():
    missing = [op for op in BINARY_OPS if not callable(getattr(ember, op, None))]
    assert not missing, f"binary ops without a public function: {missing}"


def test_broadcast_mismatch_raises_shape_error(device):
    a, b = ember.ones(2, 3, device=device), ember.ones(4, device=device)
    with pytest.raises(ember.ShapeError, match=r"add: shapes \(2, 3\) and \(4,\) are not broadcastable"):
        a + b
    with pytest.raises(ember.ShapeError, match="mul"):
        ember.mul(a, b)


# --------------------------------------------------------------------------------------------------------------
# NaN / inf and integer semantics
# --------------------------------------------------------------------------------------------------------------
def test_max_min_propagate_nan_fmax_fmin_ignore_it(device):
    nan = float("nan")
    a = ember.tensor([nan, 1.0, nan, -np.inf], device=device)
    b = ember.tensor([1.0, nan, nan, 2.0], device=device)
    assert_close(ember.maximum(a, b), np.array([nan, nan, nan, 2.0], np.float32))
    assert_close(ember.minimum(a, b), np.array([nan, nan, nan, -np.inf], np.float32))
    assert_close(ember.fmax(a, b), np.array([1.0, 1.0, nan, 2.0], np.float32))
    assert_close(ember.fmin(a, b), np.array([1.0, 1.0, nan, -np.inf], np.float32))


def test_remainder_follows_python_fmod_follows_c(device):
    a = ember.tensor([-7, 7, -7, 7, 5], device=device)
    b = ember.tensor([2, -2, -2, 2, 5], device=device)
    assert_close(ember.remainder(a, b), np.array([x % y for x, y in zip([-7, 7, -7, 7, 5], [2, -2, -2, 2, 5])]))
    assert_close(a % b, np.array([1, -1, -1, 1, 0]))
    assert_close(ember.fmod(a, b), np.array([-1, 1, -1, 1, 0]))
    f = ember.tensor([-7.5, 7.5, -0.5], device=device)
    assert_close(f % 2.0, np.array([0.5, 1.5, 1.5], np.float32))
    assert_close(ember.fmod(f, 2.0), np.array([-1.5, 1.5, -0.5], np.float32))


def test_floor_divide_floors(device):
    a = ember.tensor([-7, 7, -8, 7], device=device)
    assert_close(a // 2, np.array([-4, 3, -4, 3]))
    assert_close(a // -2, np.array([3, -4, 4, -4]))
    assert_close(ember.tensor([-7.0, 7.0], device=device) // 2, np.array([-4.0, 3.0], np.float32))
    assert_close(ember.div(a, 2, rounding_mode="floor"), np.array([-4, 3, -4, 3]))
    assert_close(ember.div(a, 2, rounding_mode="trunc"), np.array([-3, 3, -4, 3]))
    with pytest.raises(ember.ValueRangeError, match="rounding_mode"):
        ember.div(a, 2, rounding_mode="round")


@pytest.mark.parametrize("d", [dt.int8, dt.int32, dt.int64, dt.uint8], ids=str)
@pytest.mark.parametrize("form", ["floor_divide", "remainder", "fmod", "div_trunc", "scalar", "reflected"])
def test_integer_division_by_zero_raises(device, d, form):
    """torch raises ZeroDivisionError for integer division by zero; ember raises ValueRangeError saying so."""
    require_dtype(device, d)
    a = ember.tensor([4, 6, 8], dtype=d, device=device)
    z = ember.tensor([1, 0, 2], dtype=d, device=device)
    calls = {
        "floor_divide": lambda: a // z,
        "remainder": lambda: a % z,
        "fmod": lambda: ember.fmod(a, z),
        "div_trunc": lambda: ember.div(a, z, rounding_mode="trunc"),
        "scalar": lambda: a // 0,
        "reflected": lambda: 8 % z,
    }
    with pytest.raises(ember.ValueRangeError, match="ZeroDivisionError") as info:
        calls[form]()
    assert "integer division by zero" in str(info.value)
    assert a.tolist() == [4, 6, 8], "a failed op must not change its inputs"


def test_float_division_by_zero_gives_inf_nan(device):
    a = ember.tensor([1.0, -1.0, 0.0], device=device)
    assert_close(a / 0.0, np.array([np.inf, -np.inf, np.nan], np.float32))
    assert_close(ember.tensor([1, 0], device=device) / 0, np.array([np.inf, np.nan], np.float32))


@pytest.mark.parametrize("d", [dt.int8, dt.int16, dt.int32, dt.int64, dt.uint8], ids=str)
def test_integer_overflow_wraps(device, d):
    torch_or_skip()
    require_dtype(device, d)
    info = np.iinfo(d.numpy)
    a = ember.tensor([info.max, info.min, info.max], dtype=d, device=device)
    b = ember.tensor([1, 1, 2], dtype=d, device=device)
    ta, tb = to_torch(a), to_torch(b)
    assert_close(a + b, ta + tb, msg="add wraps")
    assert_close(a - b, ta - tb, msg="sub wraps")
    assert_close(a * b, ta * tb, msg="mul wraps")
    assert_close(a + 1, ta + 1, msg="scalar add wraps")


@pytest.mark.parametrize("d", [dt.uint8, dt.int8, dt.int16], ids=str)
@pytest.mark.parametrize("scalar", [300, -1, 256, -300, 40000, -200])
def test_comparison_with_out_of_range_int_scalar_matches_torch(device, d, scalar):
    # the scalar does not fit the tensor's dtype: whatever torch answers (wrapped or mathematical), ember must too
    torch = torch_or_skip()
    require_dtype(device, d)
    info = np.iinfo(d.numpy)
    a = ember.tensor([44, 0, info.max, info.min, 100], dtype=d, device=device)
    ta = to_torch(a)
    for op in ("eq", "ne", "lt", "le", "gt", "ge"):
        assert_close(getattr(ember, op)(a, scalar), getattr(torch, op)(ta, scalar), msg=f"{op}({d.name}, {scalar})")
    for name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
        # the operators too (a scalar on the left reaches the mirrored dunder, as with torch)
        assert_close(getattr(a, name)(scalar), getattr(ta, name)(scalar), msg=f"{name}({d.name}, {scalar})")


def test_integer_pow_semantics(device):
    torch = torch_or_skip()
    a = ember.tensor([1, -1, 2, -2, 3], device=device)
    b = ember.tensor([-1, -3, -2, -1, 2], device=device)
    assert_close(a ** b, to_torch(a) ** to_torch(b), msg="integer tensor ** negative integer tensor")
    assert_close(a ** 2, to_torch(a) ** 2)
    assert_close(2 ** ember.tensor([0, 3], device=device), 2 ** torch.tensor([0, 3]))
    with pytest.raises(ember.DTypeError, match="negative integer powers"):
        a ** -1
    assert_close(a ** -1.0, to_torch(a) ** -1.0)


# --------------------------------------------------------------------------------------------------------------
# operators: reflected, in-place, comparison, bitwise
# --------------------------------------------------------------------------------------------------------------
_OPERATORS = ["__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__",
              "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rfloordiv__", "__rmod__", "__rpow__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"]


@pytest.mark.parametrize("name", _OPERATORS)
@pytest.mark.parametrize("other", [2, 1.5, "tensor"], ids=str)
def test_python_operators_match_torch(device, name, other):
    torch_or_skip()
    e = ember.tensor([[1.0, -2.5, 3.0], [0.5, 4.0, -1.0]], device=device)
    o = ember.tensor([2.0, 1.5, -3.0], device=device) if other == "tensor" else other
    t = to_torch(e)
    to = to_torch(o) if other == "tensor" else o
    assert_close(getattr(e, name)(o), getattr(t, name)(to), msg=f"{name} {other}")


def test_unary_operators(device):
    torch = torch_or_skip()
    e = ember.tensor([1, -2, 3], device=device)
    assert_close(-e, -to_torch(e))
    assert_close(abs(e), abs(to_torch(e)))
    assert_close(+e, to_torch(e))
    assert_close(~e, ~to_torch(e))
    m = ember.tensor([True, False], device=device)
    assert_close(~m, torch.tensor([False, True]))
    with pytest.raises(ember.DTypeError, match="neg"):
        _ = -m
    with pytest.raises(ember.DTypeError, match="bitwise_not"):
        _ = ~ember.tensor([1.0], device=device)


def test_numpy_array_on_the_left_defers_to_ember(device):
    e = ember.tensor([1.0, 2.0], device=device)
    r = np.float32(2.0) * e
    assert isinstance(r, ember.Tensor)
    assert_close(r, np.array([2.0, 4.0], np.float32))


@pytest.mark.parametrize(
    "dst,src,expected",
    [
        (dt.float32, dt.float64, dt.float32),
        (dt.float32, dt.int64, dt.float32),
        (dt.int64, dt.int32, dt.int64),
        (dt.int32, dt.int64, dt.int32),
        (dt.float64, dt.bool_, dt.float64),
    ],
    ids=str,
)
def test_inplace_keeps_dtype_and_identity(device, dst, src, expected):
    torch_or_skip()
    require_dtype(device, dst, src)
    x = ember.tensor([[1, 2, 3], [4, 5, 6]], dtype=dst, device=device)
    y = ember.tensor([1, 0, 1], dtype=src, device=device)
    tx, ty = to_torch(x), to_torch(y)
    before = id(x)
    x += y
    tx += ty
    assert id(x) == before, "x += y must update x in place"
    assert_close(x, tx, dtype=expected)
    x *= 2
    tx *= 2
    assert_close(x, tx)


def test_inplace_refuses_unsafe_casts_and_shape_growth(device):
    x = ember.tensor([1, 2, 3], device=device)
    with pytest.raises(ember.DTypeError, match="can't be cast"):
        x += 1.5
    with pytest.raises(ember.DTypeError, match="can't be cast"):
        x += ember.tensor([1.0, 2.0, 3.0], device=device)
    with pytest.raises(ember.DTypeError, match="can't be cast"):
        x /= 2
    with pytest.raises(ember.DTypeError, match="can't be cast"):
        m = ember.tensor([True], device=device)
        m += 1
    with pytest.raises(ember.ShapeError, match=r"doesn't match the broadcast shape"):
        x += ember.ones(2, 3, dtype=ember.int64, device=device)
    assert x.tolist() == [1, 2, 3], "a refused in-place op must leave its target unchanged"


def test_inplace_named_methods(device):
    torch_or_skip()
    x = ember.tensor([0.5, 1.5, -2.0], device=device)
    t = to_torch(x)
    assert x.add_(1.0, alpha=2) is x
    t.add_(1.0, alpha=2)
    assert_close(x, t)
    x.mul_(ember.tensor([2.0, 2.0, 2.0], device=device)).exp_()
    t.mul_(2.0).exp_()
    assert_close(x, t)
    with pytest.raises(ember.DTypeError, match="exp_"):
        ember.tensor([1, 2], device=device).exp_()


def test_add_sub_alpha(device):
    torch = torch_or_skip()
    a = ember.tensor([1.0, 2.0], device=device)
    b = ember.tensor([3.0, 5.0], device=device)
    assert_close(ember.add(a, b, alpha=2), torch.add(to_torch(a), to_torch(b), alpha=2))
    assert_close(ember.sub(a, b, alpha=0.5), torch.sub(to_torch(a), to_torch(b), alpha=0.5))


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
                                "bitwise_right_shift"])
def test_bitwise_on_float_raises(device, op):
    a = ember.tensor([1.0, 2.0], device=device)
    b = ember.tensor([1, 2], device=device)
    for x, y in ((a, a), (a, b), (b, 1.5)):
        with pytest.raises(ember.DTypeError, match=op) as info:
            getattr(ember, op)(x, y)
        assert "float" in str(info.value)


def test_bitwise_on_ints_and_bools(device):
    torch_or_skip()
    a = ember.tensor([12, -5, 7], dtype=ember.int32, device=device)
    b = ember.tensor([10, 3, -1], dtype=ember.int32, device=device)
    ta, tb = to_torch(a), to_torch(b)
    for name in ("__and__", "__or__", "__xor__"):
        assert_close(getattr(a, name)(b), getattr(ta, name)(tb), msg=name)
    assert_close(a << 2, ta << 2)
    assert_close(a >> 1, ta >> 1)
    m, n = ember.tensor([True, False, True], device=device), ember.tensor([True, True, False], device=device)
    assert_close(m & n, to_torch(m) & to_torch(n))
    assert_close(m ^ n, to_torch(m) ^ to_torch(n))


# --------------------------------------------------------------------------------------------------------------
# named composites: where, clamp, nan_to_num, isclose / allclose
# --------------------------------------------------------------------------------------------------------------
def test_where_matches_torch(device):
    torch = torch_or_skip()
    c = ember.tensor([[True, False, True], [False, False, True]], device=device)
    a = ember.tensor([1.0, 2.0, 3.0], device=device)
    b = ember.tensor([[10], [20]], dtype=ember.int64, device=device)
    tc, ta, tb = to_torch(c), to_torch(a), to_torch(b)
    assert_close(ember.where(c, a, b), torch.where(tc, ta, tb))
    assert_close(ember.where(c, a, 0.5), torch.where(tc, ta, 0.5))
    assert_close(ember.where(c, 1, b), torch.where(tc, 1, tb))
    assert_close(ember.where(c, 1.0, 0.0), torch.where(tc, 1.0, 0.0))
    assert_close(a.where(c, b), ta.where(tc, tb))


def test_where_errors(device):
    a = ember.ones(3, device=device)
    with pytest.raises(ember.DTypeError, match="bool"):
        ember.where(ember.tensor([1, 0, 1], device=device), a, a)
    with pytest.raises(ember.ShapeError, match="where"):
        ember.where(ember.tensor([True, False], device=device), a, a)


def test_clamp_matches_torch(device):
    torch = torch_or_skip()
    x = ember.tensor([-3.0, -0.5, 0.0, 2.0, 9.0, float("nan")], device=device)
    t = to_torch(x)
    assert_close(ember.clamp(x, -1.0, 1.0), torch.clamp(t, -1.0, 1.0))
    assert_close(ember.clamp(x, min=0.0), torch.clamp(t, min=0.0))
    assert_close(x.clamp(max=1), t.clamp(max=1))
    lo = ember.tensor([-1.0, 0.0, 0.0, 3.0, 0.0, 0.0], device=device)
    assert_close(ember.clamp(x, lo, 5.0), torch.clamp(t, to_torch(lo), torch.tensor(5.0)))
    i = ember.tensor([1, 5, 9], device=device)
    assert_close(ember.clamp(i, 2, 7), torch.clamp(to_torch(i), 2, 7))
    assert_close(ember.clamp(i, 2.5, 7.0), torch.clamp(to_torch(i), 2.5, 7.0))
    with pytest.raises(ember.ValueRangeError, match="clamp"):
        ember.clamp(x)


def test_nan_to_num_matches_torch(device):
    torch = torch_or_skip()
    for d in (dt.float32, dt.float64, dt.float16):
        if not device.supports_dtype(d):
            continue
        x = ember.tensor([np.nan, np.inf, -np.inf, 1.5], dtype=d, device=device)
        t = to_torch(x)
        assert_close(ember.nan_to_num(x), torch.nan_to_num(t), msg=d.name)
        assert_close(ember.nan_to_num(x, nan=2.0, posinf=9.0, neginf=-9.0),
                     torch.nan_to_num(t, nan=2.0, posinf=9.0, neginf=-9.0), msg=d.name)
    i = ember.tensor([1, 2], device=device)
    assert_close(ember.nan_to_num(i), torch.nan_to_num(to_torch(i)))


def test_isclose_allclose_match_torch(device):
    torch = torch_or_skip()
    f = dt.float64 if device.supports_dtype(dt.float64) else dt.float32  # the widest float the device has
    a = ember.tensor([1.0, 1.0 + 1e-6, 1.1, np.nan, np.inf, -np.inf, 0.0], dtype=f, device=device)
    b = ember.tensor([1.0, 1.0, 1.0, np.nan, np.inf, np.inf, 1e-9], dtype=f, device=device)
    ta, tb = to_torch(a), to_torch(b)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 1e-3, "rtol": 0.0}):
        assert_close(ember.isclose(a, b, **kw), torch.isclose(ta, tb, **kw), msg=str(kw))
        assert ember.allclose(a, b, **kw) == torch.allclose(ta, tb, **kw), kw
    one = ember.tensor(1.0, dtype=f, device=device)
    assert ember.allclose(ember.tensor([1.0, 1.05], dtype=f, device=device), one, rtol=0.1)
    assert not ember.allclose(ember.tensor([1.0, 1.5], dtype=f, device=device), one, rtol=0.1)
