"""Random graphs through the fused stack equal the same ops run eagerly on the unfused backend.

A program is a list of backend-contract calls (unary, binary with tensors or scalars on either side, where, cast,
full, reduce, in-place binary) over inputs of a few broadcast-compatible shapes. It runs once eagerly on flex and
once on ``FusionBackend(inner)``, where a random subset of the intermediate handles is dropped (so the scheduler
inlines them) and the live ones are read back in a random order or after a flush. With kernels interpreted the
results must be bit-identical; with flex's generated code (numexpr may round transcendental functions by an ulp)
they must agree to a tight tolerance, and ops that turn an ulp into a different value (comparisons, rounding,
float-to-int casts) are only applied to values computed exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember import dtypes as dt
from ember.dtypes import DType
from ember_fusion.backend import FusionBackend

DTYPES = (dt.float32, dt.float64, dt.int32, dt.bool_)

UNARY = {
    "f": "neg abs exp log sqrt sin cos tanh sigmoid expm1 log1p reciprocal rsqrt floor ceil round trunc sign "
         "isnan isinf isfinite signbit".split(),
    "i": "neg abs sign bitwise_not".split(),
    "b": "logical_not bitwise_not".split(),
}
BINARY = {
    "f": "add sub mul div maximum minimum fmax fmin pow atan2 hypot copysign fmod eq ne lt le gt ge".split(),
    "i": "add sub mul maximum minimum bitwise_and bitwise_or bitwise_xor eq ne lt le gt ge".split(),
    "b": "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor maximum minimum eq ne".split(),
}
INPLACE = {"f": "add sub mul maximum minimum".split(), "i": "add sub mul maximum minimum".split(),
           "b": "bitwise_and bitwise_or bitwise_xor".split()}
# unary ops whose flex/numexpr results may differ by an ulp from numpy's
TRANSCENDENTAL = frozenset("exp log sin cos tanh sigmoid expm1 log1p rsqrt sqrt reciprocal".split())
INEXACT_BINARY = frozenset({"pow", "atan2", "hypot"})
# ops whose result jumps when the operand moves by an ulp
DISCONTINUOUS_UNARY = frozenset("floor ceil round trunc sign isnan isinf isfinite signbit".split())
DISCONTINUOUS_BINARY = frozenset("eq ne lt le gt ge fmod".split())
SCALARS = {"f": [0.0, 0.5, -1.5, 2.0, 3.0, -0.25], "i": [-2, -1, 0, 1, 2, 3], "b": [True, False]}


def _kind(d: DType) -> str:
    return "b" if d is dt.bool_ else ("f" if d.is_floating_point else "i")


@dataclass
class Val:
    shape: tuple[int, ...]
    dtype: DType
    exact: bool = True  # computed without transcendental rounding (comparisons on it agree across paths)


@dataclass
class Program:
    inputs: list[np.ndarray]
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    vals: list[Val] = field(default_factory=list)
    keep: list[bool] = field(default_factory=list)
    read: str = "each"
    read_order: list[int] = field(default_factory=list)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def _input_array(rng: np.random.Generator, shape: tuple[int, ...], d: DType) -> np.ndarray:
    k = _kind(d)
    if k == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if k == "i":
        return np.asarray(rng.integers(-5, 6, size=shape), np.int32)
    a = np.asarray(rng.standard_normal(shape) * 2, d.numpy)
    special = np.asarray(rng.random(shape) < 0.08)
    a[special] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], d.numpy), size=int(special.sum()))
    return a


def V(i: int) -> tuple[str, int]:  # noqa: N802 - an operand that is value i
    return ("v", i)


def S(x: Any) -> tuple[str, Any]:  # noqa: N802 - a Python scalar operand
    return ("s", x)


@st.composite
def programs(draw: st.DrawFn, exact_only: bool) -> Program:
    """A random program; ``exact_only`` keeps ulp-sensitive ops off values that may carry rounding differences."""
    rank = draw(st.integers(0, 3))
    base = tuple(draw(st.integers(2, 4)) for _ in range(rank))

    def sub_shape() -> tuple[int, ...]:  # lower rank and/or size-1 dims: broadcasts against base
        lo = draw(st.integers(0, rank))
        shape = tuple(1 if draw(st.integers(0, 3)) == 0 else n for n in base[lo:])
        # leading size-1 dims: equal element counts under different shapes (the scheduler inlines those)
        return (1,) * draw(st.integers(0, 1)) + shape if lo > 0 else shape

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prog = Program([])
    for _ in range(draw(st.integers(1, 3))):
        shape, d = sub_shape(), draw(st.sampled_from(DTYPES))
        prog.inputs.append(_input_array(rng, shape, d))
        prog.vals.append(Val(shape, d))

    def pick(pred: Any = lambda v: True) -> int | None:
        idx = [i for i, v in enumerate(prog.vals) if pred(v)]
        return draw(st.sampled_from(idx)) if idx else None

    def add(op: tuple[Any, ...], val: Val) -> int:
        prog.ops.append(op)
        prog.vals.append(val)
        return len(prog.vals) - 1

    def scalar(k: str) -> Any:
        return draw(st.sampled_from(SCALARS[k]))

    def sensitive_ok(v: Val) -> bool:
        return v.exact or not exact_only

    def cast(i: int, d: DType) -> int:
        v = prog.vals[i]
        if _kind(v.dtype) == "f" and _kind(d) == "i":
            # float -> int of nan/inf/huge values is undefined: zero them first (isfinite, abs < 1e6, where)
            fin = add(("unary", "isfinite", V(i)), Val(v.shape, dt.bool_, v.exact))
            i = add(("where", V(fin), V(i), S(0.0)), Val(v.shape, v.dtype, v.exact))
            big = add(("unary", "abs", V(i)), Val(v.shape, v.dtype, v.exact))
            ok = add(("binary", "lt", V(big), S(1e6)), Val(v.shape, dt.bool_, v.exact))
            i = add(("where", V(ok), V(i), S(0.0)), Val(v.shape, v.dtype, v.exact))
        return add(("cast", V(i), d), Val(v.shape, d, prog.vals[i].exact))

    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "where", "cast", "full", "reduce", "reduce",
                                     "inplace"]))
        if kind == "unary":
            i = pick()
            assert i is not None
            v = prog.vals[i]
            names = [n for n in UNARY[_kind(v.dtype)] if sensitive_ok(v) or n not in DISCONTINUOUS_UNARY]
            op = draw(st.sampled_from(names))
            pred = op in ("isnan", "isinf", "isfinite", "signbit", "logical_not")
            add(("unary", op, V(i)), Val(v.shape, dt.bool_ if pred else v.dtype, v.exact and op not in TRANSCENDENTAL))
        elif kind == "binary":
            i = pick()
            assert i is not None
            v = prog.vals[i]
            k = _kind(v.dtype)
            names = [n for n in BINARY[k] if sensitive_ok(v) or n not in DISCONTINUOUS_BINARY]
            op = draw(st.sampled_from(names))
            cmp = op in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor")
            exact = v.exact and op not in INEXACT_BINARY
            j = pick(lambda w, v=v, op=op: w.dtype is v.dtype and _broadcast(w.shape, v.shape) is not None
                     and (sensitive_ok(w) or op not in DISCONTINUOUS_BINARY))
            if j is None or draw(st.integers(0, 3)) == 0:
                a, b = (S(scalar(k)), V(i)) if draw(st.booleans()) else (V(i), S(scalar(k)))
                add(("binary", op, a, b), Val(v.shape, dt.bool_ if cmp else v.dtype, exact))
            else:
                w = prog.vals[j]
                shape = _broadcast(v.shape, w.shape)
                assert shape is not None
                add(("binary", op, V(i), V(j)), Val(shape, dt.bool_ if cmp else v.dtype, exact and w.exact))
        elif kind == "where":
            c = pick(lambda w: w.dtype is dt.bool_ and sensitive_ok(w))
            if c is None:
                continue
            cshape = prog.vals[c].shape
            i = pick(lambda w, cshape=cshape: _broadcast(w.shape, cshape) is not None)
            assert i is not None  # c itself qualifies
            v = prog.vals[i]
            shape = _broadcast(v.shape, cshape)
            assert shape is not None
            j = pick(lambda w, v=v, shape=shape: w.dtype is v.dtype and _broadcast(w.shape, shape) is not None)
            if j is None or draw(st.booleans()):
                s = S(scalar(_kind(v.dtype)))
                a, b = (V(i), s) if draw(st.booleans()) else (s, V(i))
                add(("where", V(c), a, b), Val(shape, v.dtype, v.exact))
            else:
                w = prog.vals[j]
                shape2 = _broadcast(shape, w.shape)
                assert shape2 is not None
                add(("where", V(c), V(i), V(j)), Val(shape2, v.dtype, v.exact and w.exact))
        elif kind == "cast":
            i = pick(lambda w: sensitive_ok(w) or _kind(w.dtype) != "f")
            if i is not None:
                cast(i, draw(st.sampled_from([*DTYPES, dt.int64])))
        elif kind == "full":
            d = draw(st.sampled_from(DTYPES))
            shape = sub_shape()
            add(("full", shape, scalar(_kind(d)), d), Val(shape, d))
        elif kind == "reduce":
            i = pick(lambda w: len(w.shape) > 0)
            if i is None:
                continue
            op = draw(st.sampled_from(["sum", "prod", "max", "min"]))
            if op in ("sum", "prod") and _kind(prog.vals[i].dtype) != "f":
                i = cast(i, dt.int64)  # core widens integer sums and products to int64 before reducing
            v = prog.vals[i]
            dims = tuple(sorted(draw(st.sets(st.integers(0, len(v.shape) - 1), min_size=1))))
            keep = draw(st.booleans())
            shape = tuple(1 if d in dims else n for d, n in enumerate(v.shape)) if keep else \
                tuple(n for d, n in enumerate(v.shape) if d not in dims)
            add(("reduce", op, V(i), dims, keep), Val(shape, v.dtype, v.exact))
        else:  # in-place binary on an earlier value (an input or a result)
            i = pick(lambda w: _kind(w.dtype) in INPLACE)
            assert i is not None
            v = prog.vals[i]
            k = _kind(v.dtype)
            op = draw(st.sampled_from(INPLACE[k]))
            j = pick(lambda w, v=v: w.dtype is v.dtype and _broadcast(w.shape, v.shape) == v.shape)
            other = S(scalar(k)) if j is None or draw(st.booleans()) else V(j)
            prog.ops.append(("inplace", op, V(i), other))
            if other[0] == "v":
                v.exact = v.exact and prog.vals[other[1]].exact

    n = len(prog.vals)
    prog.keep = [draw(st.integers(0, 2)) == 0 for _ in range(n)]
    prog.keep[-1] = True
    prog.read = draw(st.sampled_from(["each", "flush", "sync"]))
    prog.read_order = draw(st.permutations([i for i in range(n) if prog.keep[i]]))
    return prog


def _execute(prog: Program, be: Any, fused: bool) -> dict[int, np.ndarray]:
    """Run the program on ``be``. On the fused stack a handle that is not kept is released after its last use,
    so the scheduler may compute it inside a kernel without storing it."""
    hs: list[Any] = [be.from_numpy(a.copy()) for a in prog.inputs]
    last_use: dict[int, int] = {}
    for pos, op in enumerate(prog.ops):
        for a in op[1:]:
            if type(a) is tuple and len(a) == 2 and a[0] == "v":
                last_use[a[1]] = pos

    def arg(a: tuple[str, Any]) -> Any:
        return hs[a[1]] if a[0] == "v" else a[1]

    for pos, op in enumerate(prog.ops):
        kind = op[0]
        if kind == "unary":
            hs.append(be.unary(op[1], arg(op[2])))
        elif kind == "binary":
            hs.append(be.binary(op[1], arg(op[2]), arg(op[3])))
        elif kind == "where":
            hs.append(be.where(arg(op[1]), arg(op[2]), arg(op[3])))
        elif kind == "cast":
            hs.append(be.cast(arg(op[1]), op[2]))
        elif kind == "full":
            hs.append(be.full(op[1], op[2], op[3]))
        elif kind == "reduce":
            hs.append(be.reduce(op[1], arg(op[2]), op[3], op[4]))
        else:
            be.inplace_binary(op[1], arg(op[2]), arg(op[3]))
        if fused:
            if kind != "inplace":
                last_use.setdefault(len(hs) - 1, -1)
            for i, last in list(last_use.items()):
                if last <= pos and not prog.keep[i]:
                    hs[i] = None
                    del last_use[i]
    if fused and prog.read == "flush":
        be.flush()
    elif fused and prog.read == "sync":
        be.sync()
    return {i: np.array(be.to_numpy(hs[i]), copy=True) for i in prog.read_order}


def _compare(got: dict[int, np.ndarray], want: dict[int, np.ndarray], vals: list[Val], exact: bool) -> None:
    assert got.keys() == want.keys()
    for i, w in want.items():
        g = got[i]
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
        if g.dtype.kind != "f" or exact or vals[i].exact:
            np.testing.assert_array_equal(g, w, err_msg=f"value {i}")
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"NaN positions of value {i}")
        tol = 2e-5 if g.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"value {i}")


def _describe(prog: Program) -> str:
    lines = [f"input {i}: {a.dtype} {a.shape}" for i, a in enumerate(prog.inputs)]
    n = len(prog.inputs)
    for op in prog.ops:
        if op[0] == "inplace":
            lines.append(f"        {op}")
        else:
            lines.append(f"v{n:<3} = {op}  keep={prog.keep[n]}")
            n += 1
    lines.append(f"read={prog.read} order={prog.read_order}")
    return "\n".join(lines)


def _check(prog: Program, inner: Any, exact: bool) -> None:
    want = _execute(prog, inner, fused=False)
    fb = FusionBackend(inner)
    with np.errstate(all="ignore"):
        got = _execute(prog, fb, fused=True)
    try:
        _compare(got, want, prog.vals, exact)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nprogram:\n{_describe(prog)}") from None


# interp_cls is a function-scoped fixture that returns a class: nothing in it needs resetting between examples
SETTINGS = settings(
    max_examples=int(os.environ.get("EMBER_FUSION_EXAMPLES", "300")),  # raise it for a longer local search
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(prog=programs(exact_only=False))
def test_random_graphs_interpreted(prog: Program, interp_cls: type) -> None:
    """Kernels run through ember.ir.interpret: bit-identical to running the ops eagerly."""
    with np.errstate(all="ignore"):
        _check(prog, interp_cls(), exact=True)


@SETTINGS
@given(prog=programs(exact_only=True))
def test_random_graphs_flex_codegen(prog: Program) -> None:
    """Kernels compiled by flex's fusion_compile (numexpr or numpy paths): equal within an ulp-level tolerance."""
    from ember import Device

    inner = Device.flex().fusion(False).stack
    with np.errstate(all="ignore"):
        _check(prog, inner, exact=False)


def test_generator_covers_every_op_kind() -> None:
    """The strategy produces every op kind (a guard against a generator that silently stops covering some)."""
    from hypothesis import Phase, find

    quick = settings(max_examples=500, database=None, phases=[Phase.generate])  # no shrinking: just find one
    for kind in ("unary", "binary", "where", "cast", "full", "reduce", "inplace"):
        find(programs(exact_only=False), lambda p, k=kind: any(op[0] == k for op in p.ops), settings=quick)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_of_a_broadcast_fill(op: str, interp_cls: type) -> None:
    """A reduction whose producer is only a fill plus a lower-rank input (the kernel expands to its shape)."""
    inner = interp_cls()
    fb = FusionBackend(inner)
    b_np = np.array([1.0, 2.0, 3.0], np.float32)
    f = fb.full((4, 3), 2.0, dt.float32)
    r = fb.reduce(op, fb.binary("add", f, fb.from_numpy(b_np.copy())), (0,), False)
    want = (b_np + 2.0) * 4 if op == "sum" else b_np + 2.0
    np.testing.assert_array_equal(fb.to_numpy(r), want)


def test_flex_zero_dim_float_to_int_cast_is_an_array() -> None:
    import ember

    dev = ember.Device.flex().fusion(False)
    x = ember.tensor(2.7, device=dev).to(ember.int32)
    np.testing.assert_array_equal((x + 1).numpy(), 3)
