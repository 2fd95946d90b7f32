"""The op table of the fuzz suite: every public op the suite calls, with a generator of valid and invalid
arguments and the call, written once for both libraries (``ns.m`` is ``torch`` or ``ember``, ``ns.F`` their
``nn.functional``, ``ns.kw`` the creation keywords: the device for ember).

Generators draw through :class:`G` (a thin layer over hypothesis' ``data.draw``), so every case is reproducible
from hypothesis' derandomized seed. Roughly one case in four is deliberately invalid: a junk argument, a wrong
dtype, a mismatched shape, an out-of-range dim, a negative size; the values include NaN, ±inf, empty and 0-d
tensors.

``ALLOWED`` lists the cases where ember may return a result although torch raises (a documented extension); each
entry says why. It is empty unless a deliberate extension needs it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fuzz_engine import DT, Arr, Case, Outcome, run_case
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

# -- drawing ------------------------------------------------------------------------------------------------------
#: dtype pool, float32-heavy as real programs are
DTYPES = ("float32",) * 4 + ("float64", "float64", "int64", "int64", "int32", "bool", "uint8", "int8", "int16",
                            "float16")
FLOATS = ("float32", "float32", "float64", "float16")
#: values both libraries receive unchanged where a tensor, a dim or a size was expected
JUNK: tuple[Any, ...] = (None, "a", "0", 1.5, float("nan"), [1, 2], (2,), -1, 10**20, True, {"k": 1}, b"x", 3 + 1j)
#: Python scalar operands: small, float, bool, huge (overflow), non-finite
SCALARS: tuple[Any, ...] = (0, 1, -2, 3, 0.5, -1.5, 2.0, True, False, 10**20, 2**63, -(2**63), float("nan"),
                            float("inf"), -float("inf"), 1e-30, 1e30)


class G:
    """Draws for one case (``data.draw`` of hypothesis, or any callable taking a strategy)."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def chance(self, p: float) -> bool:
        # hypothesis' simplest draw (0) means "no": its first, minimal example is a plain valid call
        return self.draw(st.integers(0, 999)) >= 1000 - int(p * 1000)

    def pick(self, seq: Any) -> Any:
        return self.draw(st.sampled_from(list(seq)))

    def bad(self, p: float = 0.2) -> bool:
        """Whether to break this argument (each generator decides how)."""
        return self.chance(p)

    def junk(self) -> Any:
        return self.pick(JUNK)

    def scalar(self, dtype: str | None = None) -> Any:
        if dtype and not self.chance(0.15):
            if dtype == "bool":
                return self.pick((True, False))
            if dtype.startswith(("int", "uint")):
                return self.int(-3, 5)
            return self.pick((0.5, -1.5, 2.0, 0.0, 3, float("nan"), float("inf")))
        return self.pick(SCALARS)

    def dtype(self, pool: Any = DTYPES) -> str:
        return self.pick(pool)

    def side(self, max_side: int = 4, min_side: int = 0) -> int:
        if min_side == 0 and self.chance(0.07):
            return 0
        return self.int(max(min_side, 1), max_side)

    def shape(self, min_rank: int = 0, max_rank: int = 4, max_side: int = 4, min_side: int = 0) -> tuple[int, ...]:
        n = self.int(min_rank, max_rank)
        return tuple(self.side(max_side, min_side) for _ in range(n))

    def values(self, shape: tuple[int, ...], dtype: str, special: bool = True, distinct: bool = False,
               positive: bool = False, lo: int = -4, hi: int = 5) -> np.ndarray:
        rng = np.random.default_rng(self.int(0, 2**31))
        n = int(np.prod(shape)) if shape else 1
        if dtype == "bool":
            return rng.random(shape) < 0.5
        if dtype.startswith(("int", "uint")):
            if distinct:
                a = rng.permutation(n) - (0 if dtype == "uint8" or positive else n // 2)
                return a.reshape(shape).astype(dtype)
            return rng.integers(0 if dtype == "uint8" or positive else lo, hi, size=shape).astype(dtype)
        if distinct:
            a = (rng.permutation(n) - n / 2) / 2 + rng.uniform(0, 0.1)
        else:
            a = rng.standard_normal(n) * (3 if self.chance(0.2) else 1)
        if positive:
            a = np.abs(a) + 0.1
        if special and n and self.chance(0.15):
            k = self.int(1, max(1, n // 2))
            a[rng.integers(0, n, size=k)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], size=k)
        return a.reshape(shape).astype(dtype)

    def arr(self, shape: tuple[int, ...] | None = None, dtype: str | None = None, grad: bool = False,
            **kw: Any) -> Arr:
        shape = self.shape() if shape is None else tuple(shape)
        dtype = self.dtype() if dtype is None else dtype
        data = self.values(shape, dtype, **kw)
        return Arr(data, grad=grad and dtype == "float64")

    def farr(self, shape: tuple[int, ...] | None = None, grad: bool = True, **kw: Any) -> Arr:
        """A float array (float64 and differentiable in the gradient checks when ``grad``; sometimes another
        dtype, so that dtype checks are fuzzed too)."""
        if self.bad(0.1):
            dtype = self.dtype()
        else:
            dtype = self.pick(("float64", "float64", "float32", "float32", "float16"))
        return self.arr(shape, dtype, grad=grad, **kw)

    def dim(self, ndim: int, bad: float = 0.15) -> Any:
        if self.bad(bad):
            return self.pick((ndim, -ndim - 1, ndim + 3, 1.5, None, "0"))
        if ndim == 0:
            return self.pick((0, -1))
        return self.int(-ndim, ndim - 1)

    def broadcastable(self, shape: tuple[int, ...], bad: float = 0.1) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape`` (sometimes not, when ``bad``)."""
        k = self.int(0, len(shape))
        out = [1 if self.chance(0.3) else s for s in shape[len(shape) - k:]]
        if self.chance(0.15):
            out = [self.side(3)] + out
        if out and self.bad(bad):
            i = self.int(0, len(out) - 1)
            out[i] = out[i] + self.int(2, 3)
        return tuple(out)


# -- the table ----------------------------------------------------------------------------------------------------
@dataclass
class Op:
    name: str
    gen: Callable[[G], Case]
    call: Callable[..., Any]
    #: check gradients against torch autograd on a differentiable device (float64 leaves)
    grad: bool = False
    grad_tol: dict[str, float] | None = None
    #: names of ember functions / Tensor methods this entry exercises (for the coverage cross-check)
    covers: tuple[str, ...] = ()
    #: ``allowed(case, torch_error, ember_error)`` -> a reason when exactly one side may raise (see ALLOWED)
    allowed: Callable[[Case, BaseException | None, BaseException | None], str | None] | None = None


OPS: list[Op] = []


def op(name: str, gen: Callable[[G], Case], call: Callable[..., Any], **kw: Any) -> Op:
    o = Op(name, gen, call, **kw)
    if not o.covers:
        o.covers = (name,)
    OPS.append(o)
    return o


def _mode(g: G) -> str:
    return g.pick(("fn", "fn", "method"))


def _fn_or_method(name: str) -> Callable[..., Any]:
    def call(ns: Any, x: Any, *args: Any, _mode: str = "fn", **kw: Any) -> Any:
        if _mode == "method" and hasattr(x, name):
            return getattr(x, name)(*args, **kw)
        return getattr(ns.m, name)(x, *args, **kw)

    return call


# ---- elementwise unary ----
UNARY = ("neg abs sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan sinh cosh "
         "tanh asinh acosh atanh erf erfc erfinv floor ceil trunc sigmoid isnan isinf isfinite isposinf isneginf "
         "logical_not bitwise_not signbit square frac round positive sinc").split()
NONDIFF = {"isnan", "isinf", "isfinite", "isposinf", "isneginf", "logical_not", "bitwise_not", "signbit"}


def _gen_unary(g: G) -> Case:
    x = g.junk() if g.bad(0.05) else g.arr(grad=True)
    return Case((x,), {"_mode": _mode(g)})


for _n in UNARY:
    op(_n, _gen_unary, _fn_or_method(_n), grad=_n not in NONDIFF)

INPLACE_UNARY = ("neg abs sign exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan "
                 "sinh cosh tanh asinh acosh atanh erf erfc erfinv floor ceil trunc sigmoid round sinc relu").split()


def _inplace_unary(name: str) -> Callable[..., Any]:
    def call(ns: Any, x: Any) -> Any:
        r = getattr(x, name + "_")()
        return r, x  # the result and the mutated input

    return call


def _gen_unary_inplace(g: G) -> Case:
    return Case((g.arr(),))


for _n in INPLACE_UNARY:
    op(_n + "_", _gen_unary_inplace, _inplace_unary(_n))


# ---- elementwise binary (broadcasting, scalar operands, operators) ----
BINARY_OPERATORS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floor_divide": "//", "remainder": "%", "pow": "**",
    "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "bitwise_left_shift": "<<",
    "bitwise_right_shift": ">>", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
}
BINARY = ("add sub mul div floor_divide remainder fmod pow maximum minimum fmax fmin atan2 copysign hypot eq ne lt le "
          "gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor bitwise_left_shift "
          "bitwise_right_shift xlogy logaddexp").split()
DIFF_BINARY = set("add sub mul div pow maximum minimum fmax fmin atan2 hypot xlogy logaddexp".split())


def _gen_binary(name: str) -> Callable[[G], Case]:
    grad = name in DIFF_BINARY

    def gen(g: G) -> Case:
        same_dtype = g.chance(0.5)
        x = g.arr(grad=grad)
        dt = x.data.dtype.name if same_dtype else None
        mode = g.pick(("fn", "method", "op", "rop") if name in BINARY_OPERATORS else ("fn", "method"))
        if g.chance(0.3):
            y: Any = g.scalar(dt)
        elif g.bad(0.04):
            y = g.junk()
        else:
            y = g.arr(g.broadcastable(x.data.shape), dt, grad=grad)
        if g.chance(0.1):  # the scalar or tensor on the left
            x, y = y, x
            if mode in ("method",) and not isinstance(x, Arr):
                mode = "rop" if name in BINARY_OPERATORS else "fn"
        kw: dict[str, Any] = {"_mode": mode}
        if name == "div" and mode in ("fn", "method") and g.chance(0.3):
            kw["rounding_mode"] = g.pick(("trunc", "floor", None, "bad"))
        if name in ("add", "sub") and mode in ("fn", "method") and g.chance(0.2):
            kw["alpha"] = g.pick((2, 0.5, True, -1))
        return Case((x, y), kw)

    return gen


def _binary_call(name: str) -> Callable[..., Any]:
    sym = BINARY_OPERATORS.get(name)

    def call(ns: Any, x: Any, y: Any, _mode: str = "fn", **kw: Any) -> Any:
        if _mode == "op":
            return eval(f"x {sym} y")  # noqa: S307 - a fixed operator symbol from the table above
        if _mode == "rop":
            return eval(f"y {sym} x")  # noqa: S307
        if _mode == "method" and hasattr(x, name):
            return getattr(x, name)(y, **kw)
        return getattr(ns.m, name)(x, y, **kw)

    return call


for _n in BINARY:
    op(_n, _gen_binary(_n), _binary_call(_n), grad=_n in DIFF_BINARY)

INPLACE_BINARY = ("add sub mul div floor_divide remainder fmod pow maximum minimum atan2 copysign hypot bitwise_and "
                  "bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift").split()


def _gen_binary_inplace(g: G) -> Case:
    x = g.arr()
    y = g.scalar(None) if g.chance(0.3) else g.arr(g.broadcastable(x.data.shape, bad=0.15))
    return Case((x, y))


def _inplace_binary(name: str) -> Callable[..., Any]:
    def call(ns: Any, x: Any, y: Any) -> Any:
        r = getattr(x, name + "_")(y)
        return r, x

    return call


for _n in INPLACE_BINARY:
    op(_n + "_", _gen_binary_inplace, _inplace_binary(_n))


def _gen_iop(g: G) -> Case:
    x = g.arr()
    y = g.scalar(None) if g.chance(0.4) else g.arr(g.broadcastable(x.data.shape, bad=0.15))
    return Case((x, y), {"sym": g.pick(("+=", "-=", "*=", "/=", "//=", "%=", "**=", "&=", "|="))})


def _iop(ns: Any, x: Any, y: Any, sym: str) -> Any:
    x0 = x
    scope = {"x": x, "y": y}
    exec(f"x {sym} y", {}, scope)  # noqa: S102 - a fixed augmented-assignment symbol
    return scope["x"], x0


# aliases: same generators as their originals, so an alias that drifts from its original shows
UNARY_ALIASES = "negative absolute arcsin arccos arctan arcsinh arccosh arctanh".split()
for _n in UNARY_ALIASES:
    op(_n, _gen_unary, _fn_or_method(_n))
BINARY_ALIASES = {"multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "greater": "gt",
                  "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne", "arctan2": "atan2",
                  "rsub": "sub"}


def _gen_alias(name: str, orig: str) -> Callable[[G], Case]:
    base = _gen_binary(orig)

    def gen(g: G) -> Case:
        c = base(g)
        if c.kwargs["_mode"] in ("op", "rop"):  # aliases have no operator: call them by name
            c.kwargs["_mode"] = "fn"
        if orig == "div" and name == "true_divide":  # torch.true_divide takes no rounding_mode
            c.kwargs.pop("rounding_mode", None)
        if orig == "sub" and name == "rsub" and c.kwargs["_mode"] == "method":
            c.kwargs["_mode"] = "fn"
        return c

    return gen


for _n, _orig in BINARY_ALIASES.items():
    op(_n, _gen_alias(_n, _orig), _binary_call(_n))


def _gen_clamp_one(g: G) -> Case:
    x = g.arr(grad=True)
    b = g.scalar(x.data.dtype.name) if g.chance(0.6) else g.arr(g.broadcastable(x.data.shape), grad=True)
    return Case((x, b), {"_mode": _mode(g)})


op("clamp_min", _gen_clamp_one, _fn_or_method("clamp_min"), grad=True)
op("clamp_max", _gen_clamp_one, _fn_or_method("clamp_max"), grad=True)


def _clamp_inplace(ns: Any, x: Any, min: Any = None, max: Any = None, _mode: str = "fn") -> Any:
    r = x.clamp_(min, max) if _mode == "fn" else x.clip_(min, max)
    return r, x


op("inplace_operators", _gen_iop, _iop, covers=("__iadd__", "__isub__", "__imul__", "__itruediv__"))


def _gen_clamp(g: G) -> Case:
    x = g.arr(grad=True)
    def bound() -> Any:
        r = g.int(0, 5)
        if r == 0:
            return None
        if r <= 2:
            return g.scalar(x.data.dtype.name)
        if r == 3 and g.bad(0.3):
            return g.junk()
        return g.arr(g.broadcastable(x.data.shape), g.pick((x.data.dtype.name, g.dtype())), grad=True)

    return Case((x,), {"min": bound(), "max": bound(), "_mode": _mode(g)})


op("clamp", _gen_clamp, _fn_or_method("clamp"), grad=True, covers=("clamp", "clip"))
op("clamp_", _gen_clamp, _clamp_inplace, covers=("clamp_", "clip_"))


def _gen_where(g: G) -> Case:
    shape = g.shape()
    cond = g.arr(g.broadcastable(shape), "bool" if not g.bad(0.15) else g.dtype())
    x = g.arr(shape, grad=True) if not g.chance(0.2) else g.scalar()
    y = g.arr(g.broadcastable(shape), grad=True) if not g.chance(0.2) else g.scalar()
    return Case((cond, x, y))


op("where", _gen_where, lambda ns, c, x, y: ns.m.where(c, x, y), grad=True)


def _gen_lerp(g: G) -> Case:
    x = g.farr()
    return Case((x, g.farr(g.broadcastable(x.data.shape)), g.pick((0.5, 0.0, 2.0)) if g.chance(0.6) else
                 g.farr(g.broadcastable(x.data.shape))))


op("lerp", _gen_lerp, lambda ns, a, b, w: ns.m.lerp(a, b, w), grad=True)
op("lerp_", _gen_lerp, lambda ns, a, b, w: (a.lerp_(b, w), a))


def _gen_addc(g: G) -> Case:
    x = g.arr(grad=True)
    kw = {"value": g.pick((1, 0.5, -2, 3.0))} if g.chance(0.7) else {}
    return Case((x, g.arr(g.broadcastable(x.data.shape), grad=True), g.arr(g.broadcastable(x.data.shape), grad=True)),
                kw)


# addcdiv's gradients are not fuzzed: torch's backward fails when tensor2 is an integer tensor (it casts a float
# gradient to tensor2's dtype), where ember's differentiates the composition's div
for _name, _grad in (("addcmul", True), ("addcdiv", False)):
    op(_name, _gen_addc, (lambda n: lambda ns, a, b, c, **kw: getattr(ns.m, n)(a, b, c, **kw))(_name), grad=_grad)
    op(_name + "_", _gen_addc,
       (lambda n: lambda ns, a, b, c, **kw: (getattr(a, n + "_")(b, c, **kw), a))(_name))


def _gen_nan_to_num(g: G) -> Case:
    kw = {k: g.pick((None, 0.0, 1e3, -5)) for k in ("nan", "posinf", "neginf") if g.chance(0.5)}
    return Case((g.arr(),), kw)


op("nan_to_num", _gen_nan_to_num, lambda ns, x, **kw: ns.m.nan_to_num(x, **kw))


def _gen_isclose(g: G) -> Case:
    x = g.arr()
    return Case((x, g.arr(g.broadcastable(x.data.shape), g.pick((x.data.dtype.name, g.dtype())))),
                {"equal_nan": g.chance(0.5)})


op("isclose", _gen_isclose, lambda ns, a, b, **kw: ns.m.isclose(a, b, **kw))
op("allclose", _gen_isclose, lambda ns, a, b, **kw: ns.m.allclose(a, b, **kw))
op("equal", _gen_isclose, lambda ns, a, b, **kw: ns.m.equal(a, b))


# ---- reductions ----
def _gen_reduce(dims: str, distinct: bool = False, need_dim: bool = False, floats: bool = False,
                keepdim: bool = True, extra: Callable[[G, Arr], dict[str, Any]] | None = None) -> Callable[[G], Case]:
    """dims: "none" (no dim), "int", "tuple" (int, tuple or None)."""

    def gen(g: G) -> Case:
        x = (g.farr(distinct=distinct) if floats else g.arr(distinct=distinct, grad=True))
        nd = x.data.ndim
        kw: dict[str, Any] = {}
        if dims != "none" and (need_dim or g.chance(0.75)):
            if dims == "tuple" and nd and g.chance(0.3):
                k = g.int(1, nd)
                ds = tuple(g.int(-nd, nd - 1) for _ in range(k))
                kw["dim"] = ds if not g.bad(0.1) else ds + (nd + 1,)
            else:
                kw["dim"] = g.dim(nd)
            if keepdim and g.chance(0.5):
                kw["keepdim"] = g.pick((True, False)) if not g.bad(0.05) else "yes"
        if extra:
            kw.update(extra(g, x))
        loose = (not distinct) or (x.data.dtype.kind == "f" and np.isnan(x.data).sum() > 1) \
            or x.data.dtype == np.bool_ or x.data.dtype.itemsize < 2
        return Case((x,), {**kw, "_mode": _mode(g)}, loose_indices=loose)

    return gen


def _dtype_kw(g: G, x: Arr) -> dict[str, Any]:
    return {"dtype": DT(g.pick(("float64", "int64", "float32", "bool")))} if g.chance(0.15) else {}


op("sum", _gen_reduce("tuple", extra=_dtype_kw), _fn_or_method("sum"), grad=True)
op("prod", _gen_reduce("int"), _fn_or_method("prod"), grad=True)
op("mean", _gen_reduce("tuple"), _fn_or_method("mean"), grad=True)
op("nansum", _gen_reduce("tuple"), _fn_or_method("nansum"))
op("nanmean", _gen_reduce("tuple"), _fn_or_method("nanmean"))
op("amax", _gen_reduce("tuple"), _fn_or_method("amax"), grad=True)
op("amin", _gen_reduce("tuple"), _fn_or_method("amin"))
op("max", _gen_reduce("int", distinct=True), _fn_or_method("max"), grad=True)
op("min", _gen_reduce("int", distinct=True), _fn_or_method("min"))
op("argmax", _gen_reduce("int", distinct=True), _fn_or_method("argmax"))
op("argmin", _gen_reduce("int", distinct=True), _fn_or_method("argmin"))
op("all", _gen_reduce("int"), _fn_or_method("all"))
op("any", _gen_reduce("int"), _fn_or_method("any"))
op("count_nonzero", _gen_reduce("tuple", keepdim=False), _fn_or_method("count_nonzero"))


def _correction(g: G, x: Arr) -> dict[str, Any]:
    return {"correction": g.pick((0, 1, 2))} if g.chance(0.4) else {}


op("var", _gen_reduce("tuple", floats=True, extra=_correction), _fn_or_method("var"), grad=True)
op("std", _gen_reduce("tuple", floats=True, extra=_correction), _fn_or_method("std"))
op("logsumexp", _gen_reduce("tuple", need_dim=True, floats=True), _fn_or_method("logsumexp"), grad=True)
op("median", _gen_reduce("int", distinct=True), _fn_or_method("median"))
op("cumsum", _gen_reduce("int", need_dim=True, keepdim=False, extra=_dtype_kw), _fn_or_method("cumsum"), grad=True)
op("cumprod", _gen_reduce("int", need_dim=True, keepdim=False), _fn_or_method("cumprod"))
op("cummax", _gen_reduce("int", need_dim=True, keepdim=False, distinct=True), _fn_or_method("cummax"))
op("cummin", _gen_reduce("int", need_dim=True, keepdim=False, distinct=True), _fn_or_method("cummin"))
op("sort", _gen_reduce("int", distinct=True, keepdim=False,
                       extra=lambda g, x: {"descending": g.chance(0.5)} if g.chance(0.5) else {}),
   _fn_or_method("sort"), grad=True)
op("argsort", _gen_reduce("int", distinct=True, keepdim=False,
                          extra=lambda g, x: {"descending": g.chance(0.5)}), _fn_or_method("argsort"))


def _gen_topk(g: G) -> Case:
    x = g.arr(distinct=True, grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and nd and -nd <= d < nd else 1
    k = g.int(0, size) if not g.bad(0.15) else g.pick((size + 1, -1, 1.5))
    kw = {"dim": d}
    if g.chance(0.5):
        kw["largest"] = g.chance(0.5)
    return Case((x, k), {**kw, "_mode": _mode(g)}, loose_indices=x.data.dtype.itemsize < 2
                or x.data.dtype == np.bool_ or (x.data.dtype.kind == "f" and np.isnan(x.data).sum() > 1))


op("topk", _gen_topk, _fn_or_method("topk"), grad=True)


def _gen_kthvalue(g: G) -> Case:
    c = _gen_topk(g)
    k = c.args[1]
    if isinstance(k, int) and k == 0:
        k = 1
    kw = {"dim": c.kwargs["dim"], "keepdim": g.chance(0.5), "_mode": c.kwargs["_mode"]}
    return Case((c.args[0], k), kw, loose_indices=c.loose_indices)


op("kthvalue", _gen_kthvalue, _fn_or_method("kthvalue"))


def _gen_norm(g: G) -> Case:
    c = _gen_reduce("tuple", floats=True)(g)
    return Case(c.args, {**c.kwargs, "p": g.pick((2, 1, float("inf"), "fro", 0, -1))})


op("norm", _gen_norm, _fn_or_method("norm"))


# ---- shape ops ----
def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _gen_reshape(g: G) -> Case:
    x = g.arr(grad=True)
    n = x.data.size
    # a factorisation of n, sometimes with -1 or broken
    shape: list[Any] = []
    rest = n
    for _ in range(g.int(0, 3)):
        divs = [d for d in range(1, 5) if rest % d == 0] if rest else [0, 1, 2]
        d = g.pick(divs)
        shape.append(d)
        rest = rest // d if d else rest
    if rest != 1 or not shape:
        shape.append(rest)
    if shape and g.chance(0.3):
        shape[g.int(0, len(shape) - 1)] = -1
    if g.bad(0.2):
        shape.append(g.pick((2, -1, -2, 0, 1.5, "2")))
    as_tuple = g.chance(0.5)
    return Case((x, tuple(shape) if as_tuple else shape), {"_mode": _mode(g)})


def _reshape(ns: Any, x: Any, shape: Any, _mode: str = "fn") -> Any:
    if _mode == "method" and hasattr(x, "reshape"):
        return x.reshape(*shape) if isinstance(shape, list) else x.reshape(shape)
    return ns.m.reshape(x, shape)


op("reshape", _gen_reshape, _reshape, grad=True)
op("view", _gen_reshape, lambda ns, x, shape, _mode="fn": x.view(*shape) if isinstance(shape, list)
   else x.view(shape), grad=True)


def _gen_permute(g: G) -> Case:
    x = g.arr(grad=True)
    nd = x.data.ndim
    dims = list(g.draw(st.permutations(list(range(nd))))) if nd else []
    dims = [d - nd if g.chance(0.3) else d for d in dims]
    if g.bad(0.25):
        r = g.int(0, 2)
        if r == 0:
            dims.append(0)
        elif r == 1 and dims:
            dims[0] = dims[-1] if len(dims) > 1 else nd + 1
        else:
            dims = dims[:-1]
    return Case((x, tuple(dims)), {"_mode": _mode(g)})


op("permute", _gen_permute, _fn_or_method("permute"), grad=True)


def _gen_two_dims(g: G) -> Case:
    x = g.arr(grad=True)
    return Case((x, g.dim(x.data.ndim), g.dim(x.data.ndim)), {"_mode": _mode(g)})


op("transpose", _gen_two_dims, _fn_or_method("transpose"), grad=True)
op("movedim", _gen_two_dims, _fn_or_method("movedim"))
op("swapaxes", _gen_two_dims, _fn_or_method("swapaxes"))


def _gen_squeeze(g: G) -> Case:
    x = g.arr((*g.shape(0, 3, 2),), grad=True)
    r = g.int(0, 3)
    args: tuple[Any, ...] = (x,)
    if r == 1:
        args += (g.dim(x.data.ndim),)
    elif r == 2 and x.data.ndim:
        args += (tuple(g.int(-x.data.ndim, x.data.ndim - 1) for _ in range(g.int(1, x.data.ndim))),)
    elif r == 3:
        args += (g.pick((1.5, "0", None, [0])),)
    return Case(args, {"_mode": _mode(g)})


op("squeeze", _gen_squeeze, _fn_or_method("squeeze"), grad=True)


def _gen_unsqueeze(g: G) -> Case:
    x = g.arr(grad=True)
    return Case((x, g.dim(x.data.ndim + 1)), {"_mode": _mode(g)})


op("unsqueeze", _gen_unsqueeze, _fn_or_method("unsqueeze"), grad=True)


def _gen_expand(g: G) -> Case:
    x = g.arr(g.shape(0, 3, 3), grad=True)
    sizes: list[Any] = [g.pick((-1, s)) if s != 1 else g.int(0, 3) for s in x.data.shape]
    sizes = [g.side(3) for _ in range(g.int(0, 2))] + sizes
    if g.bad(0.25):
        if sizes:
            sizes[g.int(0, len(sizes) - 1)] = g.pick((-2, 5, 1.5, None))
        else:
            sizes = [-1]
    return Case((x, sizes))


op("expand", _gen_expand, lambda ns, x, sizes: x.expand(*sizes), grad=True)
op("broadcast_to", _gen_expand, lambda ns, x, sizes: ns.m.broadcast_to(x, tuple(sizes)))


def _gen_repeat(g: G) -> Case:
    x = g.arr(g.shape(0, 3, 3), grad=True)
    reps = [g.int(0, 3) for _ in range(x.data.ndim + g.int(0, 2))]
    if g.bad(0.2):
        reps = reps[:-1] if reps else [-1]
        if reps:
            reps[0] = g.pick((-1, 1.5, reps[0]))
    return Case((x, reps))


op("repeat", _gen_repeat, lambda ns, x, reps: x.repeat(*reps), grad=True)
op("tile", _gen_repeat, lambda ns, x, reps: ns.m.tile(x, tuple(reps)))


def _gen_cat(g: G) -> Case:
    shape = list(g.shape(1, 3, 3))
    nd = len(shape)
    d = g.dim(nd, 0.1)
    dt = g.dtype()
    parts = []
    for _ in range(g.int(0 if g.bad(0.1) else 1, 3)):
        s = list(shape)
        if isinstance(d, int) and -nd <= d < nd:
            s[d] = g.int(0, 3)
        if g.bad(0.1) and s:
            s[g.int(0, nd - 1)] += 1
        if g.bad(0.05):
            s = []
        parts.append(g.arr(tuple(s), dt if g.chance(0.8) else g.dtype(), grad=True))
    seq = parts if g.chance(0.5) else tuple(parts)
    return Case((seq,), {"dim": d} if g.chance(0.8) else {})


op("cat", _gen_cat, lambda ns, seq, **kw: ns.m.cat(seq, **kw), grad=True, covers=("cat", "concat", "concatenate"))


def _gen_stack(g: G) -> Case:
    shape = g.shape(0, 3, 3)
    dt = g.dtype()
    parts = [g.arr(shape if not g.bad(0.1) else g.shape(0, 2, 2), dt if g.chance(0.8) else g.dtype(), grad=True)
             for _ in range(g.int(0 if g.bad(0.1) else 1, 3))]
    return Case((parts,), {"dim": g.dim(len(shape) + 1)})


op("stack", _gen_stack, lambda ns, seq, **kw: ns.m.stack(seq, **kw), grad=True)


def _gen_split(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 5), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and -nd <= d < nd else 2
    if g.chance(0.5):
        spec: Any = g.int(1, max(size, 1)) if not g.bad(0.15) else g.pick((0, -1, 1.5))
    else:
        spec = []
        rest = size
        while rest > 0:
            k = g.int(0, rest)
            spec.append(k)
            rest -= k
            if len(spec) > 5:
                spec.append(rest)
                break
        if g.bad(0.2):
            spec.append(g.pick((1, -1)))
    return Case((x, spec), {"dim": d, "_mode": _mode(g)})


op("split", _gen_split, _fn_or_method("split"), grad=True)


def _gen_chunk(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 5))
    return Case((x, g.int(1, 5) if not g.bad(0.15) else g.pick((0, -1, 1.5))),
                {"dim": g.dim(x.data.ndim), "_mode": _mode(g)})


op("chunk", _gen_chunk, _fn_or_method("chunk"))
op("tensor_split", _gen_chunk, _fn_or_method("tensor_split"))


def _gen_flatten(g: G) -> Case:
    x = g.arr(grad=True)
    nd = x.data.ndim
    kw: dict[str, Any] = {}
    if g.chance(0.7):
        kw["start_dim"] = g.dim(nd)
    if g.chance(0.7):
        kw["end_dim"] = g.dim(nd)
    return Case((x,), {**kw, "_mode": _mode(g)})


op("flatten", _gen_flatten, _fn_or_method("flatten"), grad=True)


def _gen_unflatten(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 4))
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and -nd <= d < nd else 4
    sizes = [s for s in (1, 2, 4) if size and size % s == 0]
    first = g.pick(sizes) if sizes else 0
    shape = (first, -1) if g.chance(0.5) else (first, size // first if first else 0)
    if g.bad(0.2):
        shape = (size + 1, 1) if g.chance(0.5) else (-1, -1)
    return Case((x, d, shape))


op("unflatten", _gen_unflatten, lambda ns, x, d, s: ns.m.unflatten(x, d, s))


def _gen_flip(g: G) -> Case:
    x = g.arr(grad=True)
    nd = x.data.ndim
    dims = tuple(g.dim(nd, 0.1) for _ in range(g.int(0 if nd else 1, max(nd, 1))))
    return Case((x, dims), {"_mode": _mode(g)})


op("flip", _gen_flip, _fn_or_method("flip"), grad=True)


def _gen_roll(g: G) -> Case:
    x = g.arr(grad=True)
    nd = x.data.ndim
    if g.chance(0.3):
        return Case((x, g.int(-5, 5)))
    dims = tuple(g.dim(nd, 0.1) for _ in range(g.int(1, max(nd, 1))))
    shifts = tuple(g.int(-5, 5) for _ in range(len(dims) + (1 if g.bad(0.1) else 0)))
    return Case((x, shifts, dims), {"_mode": _mode(g)})


op("roll", _gen_roll, _fn_or_method("roll"), grad=True)


def _gen_narrow(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 5), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and -nd <= d < nd else 3
    start = g.int(-size, size) if size else 0
    length = g.int(0, max(size - (start % size if size else 0), 0))
    if g.bad(0.2):
        length = g.pick((size + 1, -1))
    return Case((x, d, start, length), {"_mode": _mode(g)})


op("narrow", _gen_narrow, _fn_or_method("narrow"), grad=True)


def _gen_select(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 4), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and -nd <= d < nd else 2
    i = g.int(-size, size - 1) if size and not g.bad(0.15) else g.pick((size, -size - 1, 1.5))
    return Case((x, d, i), {"_mode": _mode(g)})


op("select", _gen_select, _fn_or_method("select"), grad=True)


def _gen_unbind(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 3))
    return Case((x,), {"dim": g.dim(x.data.ndim), "_mode": _mode(g)})


op("unbind", _gen_unbind, _fn_or_method("unbind"))


def _gen_tri(g: G) -> Case:
    x = g.arr(g.shape(2 if not g.bad(0.15) else 0, 4, 4), grad=True)
    return Case((x,), {"diagonal": g.int(-3, 3), "_mode": _mode(g)})


op("tril", _gen_tri, _fn_or_method("tril"), grad=True)
op("triu", _gen_tri, _fn_or_method("triu"))


def _gen_diagonal(g: G) -> Case:
    x = g.arr(g.shape(2 if not g.bad(0.15) else 0, 4, 4), grad=True)
    nd = x.data.ndim
    kw = {"offset": g.int(-3, 3)}
    if nd >= 2 and g.chance(0.5):
        kw["dim1"], kw["dim2"] = g.dim(nd), g.dim(nd)
    return Case((x,), {**kw, "_mode": _mode(g)})


op("diagonal", _gen_diagonal, _fn_or_method("diagonal"), grad=True)


def _gen_t(g: G) -> Case:
    return Case((g.arr(g.shape(0, 3, 3), grad=True),), {"_mode": _mode(g)})


op("t", _gen_t, _fn_or_method("t"), grad=True)


# ---- indexing ----
def _index_tensor(g: G, size: int, shape: tuple[int, ...] | None = None, bad: float = 0.1) -> Arr:
    shape = g.shape(0, 2, 3) if shape is None else shape
    rng = np.random.default_rng(g.int(0, 2**31))
    hi = max(size, 1)
    data = rng.integers(-size if size else 0, hi, size=shape) if size else np.zeros(shape, np.int64)
    if g.bad(bad) and data.size:
        data.reshape(-1)[0] = g.pick((size, -size - 1, 100))
    dtype = "int64" if not g.bad(0.08) else g.pick(("int32", "float32", "bool", "uint8"))
    return Arr(data.astype(dtype))


def _gen_key(g: G, shape: tuple[int, ...]) -> Any:
    parts: list[Any] = []
    d = 0
    for _ in range(g.int(1, 3)):
        size = shape[d] if d < len(shape) else 0
        r = g.int(0, 9)
        if r <= 2:
            parts.append(g.int(-size, size - 1) if size and not g.bad(0.15) else g.pick((size, -size - 1, 5)))
            d += 1
        elif r <= 5:
            step = g.pick((None, 1, 2, 3)) if not g.bad(0.15) else g.pick((0, -1))
            parts.append(slice(g.pick((None, 0, 1, -1, -9, 9)), g.pick((None, 2, -1, 9, -9)), step))
            d += 1
        elif r == 6:
            parts.append(None)
        elif r == 7:
            parts.append(Ellipsis)
            d = len(shape)
        elif r == 8:
            parts.append(_index_tensor(g, size))
            d += 1
        else:
            mshape = shape[d:d + 1] if d < len(shape) else (g.int(0, 2),)
            if g.bad(0.1):
                mshape = (mshape[0] + 1,) if mshape else (1,)
            parts.append(g.arr(mshape, "bool"))
            d += 1
    if g.bad(0.05):
        return g.pick((1.5, "a", [0.5], {"a": 1}))
    return parts[0] if len(parts) == 1 and g.chance(0.5) else tuple(parts)


def _gen_getitem(g: G) -> Case:
    x = g.arr(grad=True)
    return Case((x, _gen_key(g, x.data.shape)))


op("__getitem__", _gen_getitem, lambda ns, x, key: x[key], grad=True, covers=("__getitem__",))


def _gen_setitem(g: G) -> Case:
    x = g.arr()
    key = _gen_key(g, x.data.shape)
    value = g.scalar(x.data.dtype.name) if g.chance(0.5) else g.arr(g.shape(0, 1, 2), g.pick(
        (x.data.dtype.name, g.dtype())))
    return Case((x, key, value))


def _setitem(ns: Any, x: Any, key: Any, value: Any) -> Any:
    x[key] = value
    return x


op("__setitem__", _gen_setitem, _setitem, covers=("__setitem__",))


def _gen_gather(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 3), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    ok = isinstance(d, int) and -nd <= d < nd
    size = x.data.shape[d] if ok else 2
    ishape = tuple(g.int(0, s) for s in x.data.shape)
    if g.bad(0.1):
        ishape = ishape + (1,)
    idx = _index_tensor(g, size, ishape)
    idx = Arr(np.where(idx.data < 0, idx.data % max(size, 1), idx.data).astype(idx.data.dtype)) \
        if idx.data.dtype.kind == "i" and not g.bad(0.15) else idx
    return Case((x, d, idx))


op("gather", _gen_gather, lambda ns, x, d, i: ns.m.gather(x, d, i), grad=True)
op("take_along_dim", _gen_gather, lambda ns, x, d, i: ns.m.take_along_dim(x, i, dim=d))


def _gen_scatter(g: G) -> Case:
    c = _gen_gather(g)
    x, d, idx = c.args
    src: Any = g.arr(idx.data.shape, x.data.dtype.name if g.chance(0.8) else g.dtype()) if g.chance(0.7) \
        else g.scalar(x.data.dtype.name)
    # duplicate indices make scatter's result order-dependent (torch documents it as undefined): avoid them
    return Case((x, d, idx, src), shape_only=_dups_along(idx.data, d))


def _dups_along(idx: np.ndarray, d: Any) -> bool:
    if not isinstance(d, int) or idx.ndim == 0 or idx.dtype.kind not in "iu" or not -idx.ndim <= d < idx.ndim:
        return False
    if idx.size == 0:
        return False
    m = np.moveaxis(idx, d, -1).reshape(-1, idx.shape[d])
    return any(len(set(r.tolist())) < len(r) for r in m)


op("scatter", _gen_scatter, lambda ns, x, d, i, s: ns.m.scatter(x, d, i, s))


def _gen_scatter_add(g: G) -> Case:
    c = _gen_scatter(g)
    x, d, idx, src = c.args
    if not isinstance(src, Arr):
        src = g.arr(idx.data.shape, x.data.dtype.name)
    return Case((x, d, idx, src))


op("scatter_add", _gen_scatter_add, lambda ns, x, d, i, s: ns.m.scatter_add(x, d, i, s))


def _gen_index_select(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 3), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and -nd <= d < nd else 2
    idx = _index_tensor(g, size, (g.int(0, 4),) if not g.bad(0.1) else (1, 1))
    idx = Arr(np.abs(idx.data) % max(size, 1)) if idx.data.dtype.kind == "i" and not g.bad(0.1) else idx
    return Case((x, d, idx))


op("index_select", _gen_index_select, lambda ns, x, d, i: ns.m.index_select(x, d, i), grad=True)


def _gen_index_add(g: G) -> Case:
    x, d, idx = _gen_index_select(g).args
    shape = list(x.data.shape)
    if isinstance(d, int) and -len(shape) <= d < len(shape):
        shape[d] = idx.data.shape[0] if idx.data.ndim == 1 else 1
    src = g.arr(tuple(shape), x.data.dtype.name if g.chance(0.8) else g.dtype())
    return Case((x, d, idx, src), tol={"rtol": 1e-3, "atol": 1e-4})


op("index_add", _gen_index_add, lambda ns, x, d, i, s: ns.m.index_add(x, d, i, s))


def _gen_masked_fill(g: G) -> Case:
    x = g.arr(grad=True)
    mask = g.arr(g.broadcastable(x.data.shape), "bool" if not g.bad(0.15) else g.dtype())
    value: Any = g.scalar(x.data.dtype.name) if g.chance(0.8) else g.arr((), g.dtype())
    return Case((x, mask, value), {"_mode": _mode(g)})


op("masked_fill", _gen_masked_fill, _fn_or_method("masked_fill"), grad=True)


def _gen_masked_select(g: G) -> Case:
    x = g.arr(grad=True)
    return Case((x, g.arr(g.broadcastable(x.data.shape), "bool" if not g.bad(0.15) else g.dtype())))


op("masked_select", _gen_masked_select, lambda ns, x, m: ns.m.masked_select(x, m), grad=True)


def _gen_take(g: G) -> Case:
    x = g.arr()
    return Case((x, _index_tensor(g, x.data.size)))


op("take", _gen_take, lambda ns, x, i: ns.m.take(x, i))
op("nonzero", lambda g: Case((g.arr(),)), lambda ns, x: ns.m.nonzero(x))


# ---- creation ----
def _gen_size(g: G) -> list[Any]:
    sizes: list[Any] = list(g.shape(0, 3, 4))
    if g.bad(0.25):
        bad = g.pick((-1, -3, 1.5, "2", None, 2**62, True, [2]))
        sizes.insert(g.int(0, len(sizes)), bad)
    return sizes


def _dtype_arg(g: G, p: float = 0.5) -> dict[str, Any]:
    if not g.chance(p):
        return {}
    if g.bad(0.1):
        return {"dtype": g.pick((int, "x", 5, None))}
    return {"dtype": DT(g.dtype())}


def _gen_fill(g: G) -> Case:
    return Case((_gen_size(g),), {**_dtype_arg(g), "as_tuple": g.chance(0.5)})


def _filled(name: str) -> Callable[..., Any]:
    def call(ns: Any, sizes: list[Any], as_tuple: bool = False, **kw: Any) -> Any:
        fn = getattr(ns.m, name)
        return fn(tuple(sizes), **kw, **ns.kw) if as_tuple else fn(*sizes, **kw, **ns.kw)

    return call


op("zeros", _gen_fill, _filled("zeros"))
op("ones", _gen_fill, _filled("ones"))


def _gen_empty(g: G) -> Case:
    c = _gen_fill(g)
    c.shape_only = True
    return c


op("empty", _gen_empty, _filled("empty"))


def _gen_full(g: G) -> Case:
    return Case((tuple(_gen_size(g)), g.scalar()), _dtype_arg(g))


op("full", _gen_full, lambda ns, size, v, **kw: ns.m.full(size, v, **kw, **ns.kw))


def _gen_like(g: G) -> Case:
    return Case((g.arr(),), _dtype_arg(g, 0.3))


op("zeros_like", _gen_like, lambda ns, x, **kw: ns.m.zeros_like(x, **kw))
op("ones_like", _gen_like, lambda ns, x, **kw: ns.m.ones_like(x, **kw))
op("full_like", lambda g: Case((g.arr(), g.scalar()), _dtype_arg(g, 0.3)),
   lambda ns, x, v, **kw: ns.m.full_like(x, v, **kw))


def _gen_arange(g: G) -> Case:
    def num() -> Any:
        return g.pick((0, 1, 3, -2, 5, 0.5, -1.5, 2.25, 10))

    r = g.int(1, 3)
    args = tuple(num() for _ in range(r))
    if r == 3 and g.bad(0.2):
        args = args[:2] + (g.pick((0, 0.0, -1, 2**62, float("nan"))),)
    if g.bad(0.1):
        args = (g.pick((float("inf"), float("nan"), 2**62, "3", None)),) + args[1:]
    return Case(args, _dtype_arg(g, 0.3))


op("arange", _gen_arange, lambda ns, *a, **kw: ns.m.arange(*a, **kw, **ns.kw))


def _gen_linspace(g: G) -> Case:
    steps = g.int(0, 6) if not g.bad(0.2) else g.pick((-1, 1.5, "3"))
    return Case((g.pick((0, -1.5, 2, 1e3)), g.pick((1, 5.5, -3, float("inf"))), steps), _dtype_arg(g, 0.3))


op("linspace", _gen_linspace, lambda ns, a, b, n, **kw: ns.m.linspace(a, b, n, **kw, **ns.kw))


def _gen_eye(g: G) -> Case:
    args: tuple[Any, ...] = (g.int(0, 4) if not g.bad(0.15) else g.pick((-1, 1.5)),)
    if g.chance(0.5):
        args += (g.int(0, 4) if not g.bad(0.15) else g.pick((-2, "2")),)
    return Case(args, _dtype_arg(g, 0.4))


op("eye", _gen_eye, lambda ns, *a, **kw: ns.m.eye(*a, **kw, **ns.kw))

LEAVES: tuple[Any, ...] = (0, 1, -3, 2.5, True, False, float("nan"), float("inf"), 255, 300, -1, 2**31, 2**70,
                           10**20, -(2**63))
BAD_LEAVES: tuple[Any, ...] = (None, "a", "1.5", 1 + 2j, [], object)


def _gen_tensor(g: G) -> Case:
    def leaf() -> Any:
        if g.bad(0.05):
            return g.pick(BAD_LEAVES)
        kind = g.int(0, 2)
        if kind == 0:
            return g.int(-5, 5)
        if kind == 1:
            return g.pick((0.5, -1.25, 3.0))
        return g.pick(LEAVES)

    shape = g.shape(0, 3, 3)

    def build(s: tuple[int, ...]) -> Any:
        if not s:
            return leaf()
        items = [build(s[1:]) for _ in range(s[0])]
        if items and g.bad(0.03):
            items[-1] = build(s[2:]) if len(s) > 1 else [leaf()]  # ragged
        return items

    data = build(shape)
    if g.chance(0.1) and isinstance(data, list):
        data = tuple(data)
    return Case((data,), _dtype_arg(g, 0.5))


op("tensor", _gen_tensor, lambda ns, data, **kw: ns.m.tensor(data, **kw, **ns.kw), covers=("tensor", "as_tensor"))


# ---- linear algebra ----
def _gen_matmul(g: G) -> Case:
    k = g.side(4)
    r = g.int(0, 4)
    bshape = g.shape(0, 2, 2)
    if r == 0:
        a_shape, b_shape = (k,), (k,)
    elif r == 1:
        a_shape, b_shape = (g.side(3), k), (k,)
    elif r == 2:
        a_shape, b_shape = (k,), (k, g.side(3))
    else:
        a_shape, b_shape = bshape + (g.side(3), k), g.broadcastable(bshape, 0.05) + (k, g.side(3))
    if g.bad(0.15):
        b_shape = (b_shape[0] + 1,) + b_shape[1:] if len(b_shape) < 2 else b_shape[:-2] + (b_shape[-2] + 1,
                                                                                           b_shape[-1])
    if g.bad(0.1):
        a_shape = ()
    dt = g.pick(("float32", "float64", "float64", "int64")) if not g.bad(0.1) else g.dtype()
    return Case((g.arr(a_shape, dt, grad=True, special=False), g.arr(b_shape, dt if g.chance(0.9) else g.dtype(),
                                                                    grad=True, special=False)),
                {"_mode": g.pick(("fn", "op"))}, tol={"rtol": 1e-3, "atol": 1e-4})


def _matmul(ns: Any, a: Any, b: Any, _mode: str = "fn") -> Any:
    return a @ b if _mode == "op" else ns.m.matmul(a, b)


op("matmul", _gen_matmul, _matmul, grad=True, covers=("matmul", "__matmul__"))


def _gen_mm(rank: int) -> Callable[[G], Case]:
    def gen(g: G) -> Case:
        batch = (g.side(3),) if rank == 3 else ()
        n, k, m = g.side(3), g.side(3), g.side(3)
        a, b = batch + (n, k), batch + (k, m)
        if g.bad(0.2):
            b = g.shape(1, 3, 3)
        dt = g.pick(("float32", "float64")) if not g.bad(0.1) else g.dtype()
        return Case((g.arr(a, dt, grad=True, special=False), g.arr(b, dt, grad=True, special=False)),
                    tol={"rtol": 1e-3, "atol": 1e-4})

    return gen


op("mm", _gen_mm(2), lambda ns, a, b: ns.m.mm(a, b), grad=True)
op("bmm", _gen_mm(3), lambda ns, a, b: ns.m.bmm(a, b), grad=True)


def _gen_vec2(g: G) -> Case:
    n = g.side(4)
    dt = g.pick(("float32", "float64")) if not g.bad(0.1) else g.dtype()
    b = (n,) if not g.bad(0.15) else g.shape(0, 2, 3)
    return Case((g.arr((n,), dt, grad=True, special=False), g.arr(b, dt, grad=True, special=False)))


op("dot", _gen_vec2, lambda ns, a, b: ns.m.dot(a, b), grad=True)
op("outer", _gen_vec2, lambda ns, a, b: ns.m.outer(a, b), grad=True)


def _gen_mv(g: G) -> Case:
    n, k = g.side(3), g.side(3)
    dt = g.pick(("float32", "float64"))
    v = (k,) if not g.bad(0.2) else (k + 1,)
    return Case((g.arr((n, k), dt, grad=True, special=False), g.arr(v, dt, grad=True, special=False)))


op("mv", _gen_mv, lambda ns, a, b: ns.m.mv(a, b), grad=True)


# ---- nn.functional ----
def _gen_softmax(g: G) -> Case:
    x = g.farr()
    kw: dict[str, Any] = {"dim": g.dim(x.data.ndim)}
    if g.chance(0.15):
        kw["dtype"] = DT(g.pick(("float64", "float32", "int64")))
    return Case((x,), kw)


op("softmax", _gen_softmax, lambda ns, x, **kw: ns.F.softmax(x, **kw), grad=True)
op("log_softmax", _gen_softmax, lambda ns, x, **kw: ns.F.log_softmax(x, **kw), grad=True)


def _gen_act(extra: Callable[[G], dict[str, Any]] | None = None) -> Callable[[G], Case]:
    def gen(g: G) -> Case:
        x = g.farr() if not g.bad(0.05) else g.junk()
        return Case((x,), extra(g) if extra else {})

    return gen


op("relu", _gen_act(), lambda ns, x: ns.F.relu(x), grad=True)
op("gelu", _gen_act(lambda g: {"approximate": g.pick(("none", "tanh", "bad"))} if g.chance(0.5) else {}),
   lambda ns, x, **kw: ns.F.gelu(x, **kw), grad=True)
op("silu", _gen_act(), lambda ns, x: ns.F.silu(x), grad=True)
op("leaky_relu", _gen_act(lambda g: {"negative_slope": g.pick((0.01, 0.2, -1.0))}),
   lambda ns, x, **kw: ns.F.leaky_relu(x, **kw), grad=True)
op("elu", _gen_act(lambda g: {"alpha": g.pick((1.0, 0.5))}), lambda ns, x, **kw: ns.F.elu(x, **kw), grad=True)
op("softplus", _gen_act(lambda g: {"beta": g.pick((1.0, 2.0)), "threshold": g.pick((20.0, 1.0))}),
   lambda ns, x, **kw: ns.F.softplus(x, **kw), grad=True)
op("hardtanh", _gen_act(lambda g: {"min_val": g.pick((-1.0, 0.0, 2.0)), "max_val": g.pick((1.0, 0.5))}),
   lambda ns, x, **kw: ns.F.hardtanh(x, **kw), grad=True)


def _gen_dropout(g: G) -> Case:
    x = g.farr()
    r = g.int(0, 2)
    if r == 0:
        kw: dict[str, Any] = {"p": 0.0}
    elif r == 1:
        kw = {"p": g.pick((0.3, 0.9)), "training": False}
    else:
        kw = {"p": g.pick((-0.1, 1.5))}  # invalid p: both must refuse
    return Case((x,), kw)


op("dropout", _gen_dropout, lambda ns, x, **kw: ns.F.dropout(x, **kw), grad=True)


def _gen_conv2d(g: G) -> Case:
    groups = g.pick((1, 1, 2))
    n, cin_g, cout_g = g.int(1, 2), g.int(1, 2), g.int(1, 2)
    h, w = g.int(1, 5), g.int(1, 5)
    kh, kw_ = g.int(1, 3), g.int(1, 3)
    x_shape: tuple[int, ...] = (n, cin_g * groups, h, w)
    if g.chance(0.15):
        x_shape = x_shape[1:]  # unbatched
    w_shape = (cout_g * groups, cin_g, kh, kw_)
    if g.bad(0.15):
        w_shape = (w_shape[0], w_shape[1] + 1, kh, kw_)
    dt = g.pick(("float32", "float64", "float64")) if not g.bad(0.08) else g.dtype()
    args: tuple[Any, ...] = (g.arr(x_shape, dt, grad=True, special=False), g.arr(w_shape, dt, grad=True,
                                                                                special=False))
    kw: dict[str, Any] = {"groups": groups}
    if g.chance(0.5):
        kw["bias"] = g.arr((w_shape[0],), dt, grad=True, special=False)
    if g.chance(0.5):
        kw["stride"] = g.pick((1, 2, (1, 2))) if not g.bad(0.1) else 0
    if g.chance(0.5):
        kw["padding"] = g.pick((0, 1, (1, 0), "same", "valid")) if not g.bad(0.1) else g.pick((-1, "bad"))
    if g.chance(0.3):
        kw["dilation"] = g.pick((1, 2))
    return Case(args, kw, tol={"rtol": 1e-3, "atol": 1e-4})


op("conv2d", _gen_conv2d, lambda ns, x, w, **kw: ns.F.conv2d(x, w, **kw), grad=True,
   grad_tol={"rtol": 1e-6, "atol": 1e-8})


def _gen_pool(avg: bool) -> Callable[[G], Case]:
    def gen(g: G) -> Case:
        shape = (g.int(1, 2), g.int(1, 2), g.int(0 if g.bad(0.1) else 1, 5), g.int(1, 5))
        if g.chance(0.2):
            shape = shape[1:]
        x = g.farr(shape)
        k = g.pick((1, 2, 3, (2, 1))) if not g.bad(0.1) else g.pick((0, -1))
        kw: dict[str, Any] = {"kernel_size": k}
        if g.chance(0.5):
            kw["stride"] = g.pick((1, 2, None))
        if g.chance(0.5):
            kw["padding"] = g.pick((0, 1))
        if g.chance(0.3):
            kw["ceil_mode"] = True
        if avg and g.chance(0.3):
            kw["count_include_pad"] = g.chance(0.5)
        if not avg and g.chance(0.2):
            kw["dilation"] = 2
        return Case((x,), kw, loose_indices=True)

    return gen


op("max_pool2d", _gen_pool(False), lambda ns, x, **kw: ns.F.max_pool2d(x, **kw), grad=True)
op("avg_pool2d", _gen_pool(True), lambda ns, x, **kw: ns.F.avg_pool2d(x, **kw), grad=True)


def _gen_pad(g: G) -> Case:
    x = g.farr(g.shape(1, 4, 4))
    k = g.int(1, min(3, x.data.ndim)) * 2 if not g.bad(0.1) else 3
    pad = [g.int(-2, 3) if g.chance(0.3) else g.int(0, 2) for _ in range(k)]
    kw: dict[str, Any] = {}
    if g.chance(0.4):
        kw["mode"] = g.pick(("constant", "reflect", "replicate", "circular", "bogus"))
    if g.chance(0.3) and kw.get("mode", "constant") == "constant":
        kw["value"] = g.pick((0.0, 1.5, float("nan")))
    return Case((x, pad), kw)


op("pad", _gen_pad, lambda ns, x, p, **kw: ns.F.pad(x, p, **kw), grad=True)


def _gen_cross_entropy(g: G) -> Case:
    n, c = g.side(3), g.side(4)
    unbatched = g.chance(0.15)
    x = g.farr((c,) if unbatched else (n, c))
    if g.chance(0.25):  # class probabilities
        t: Any = g.farr(x.data.shape, grad=False, positive=True, special=False)
    else:
        tshape = () if unbatched else (n,)
        if g.bad(0.1):
            tshape = (n + 1,)
        t = _index_tensor(g, c, tshape, bad=0.1)
        t = Arr(np.abs(t.data) % max(c, 1)) if t.data.dtype.kind == "i" and not g.bad(0.1) else t
    kw: dict[str, Any] = {}
    if g.chance(0.3):
        kw["reduction"] = g.pick(("mean", "sum", "none", "bad"))
    if g.chance(0.2):
        kw["label_smoothing"] = g.pick((0.0, 0.1, 1.5))
    if g.chance(0.2) and not unbatched:
        kw["ignore_index"] = 0
    if g.chance(0.2):
        kw["weight"] = g.farr((c,), grad=False, positive=True)
    return Case((x, t), kw)


op("cross_entropy", _gen_cross_entropy, lambda ns, x, t, **kw: ns.F.cross_entropy(x, t, **kw), grad=True)


def _gen_nll(g: G) -> Case:
    c = _gen_cross_entropy(g)
    kw = {k: v for k, v in c.kwargs.items() if k != "label_smoothing"}
    return Case(c.args, kw)


op("nll_loss", _gen_nll, lambda ns, x, t, **kw: ns.F.nll_loss(x, t, **kw), grad=True)


def _gen_pair_loss(g: G) -> Case:
    x = g.farr()
    y = g.farr(x.data.shape if not g.bad(0.15) else g.broadcastable(x.data.shape))
    kw = {"reduction": g.pick(("mean", "sum", "none", "bad"))} if g.chance(0.4) else {}
    return Case((x, y), kw)


op("mse_loss", _gen_pair_loss, lambda ns, x, y, **kw: ns.F.mse_loss(x, y, **kw), grad=True)
op("l1_loss", _gen_pair_loss, lambda ns, x, y, **kw: ns.F.l1_loss(x, y, **kw), grad=True)


def _gen_layer_norm(g: G) -> Case:
    x = g.farr(g.shape(1, 3, 4))
    k = g.int(1, x.data.ndim)
    ns_ = tuple(x.data.shape[-k:])
    if g.bad(0.15):
        ns_ = (ns_[0] + 1,) + ns_[1:]
    kw: dict[str, Any] = {}
    if g.chance(0.5):
        kw["weight"] = g.farr(ns_)
    if g.chance(0.5):
        kw["bias"] = g.farr(ns_)
    if g.chance(0.2):
        kw["eps"] = g.pick((1e-5, 0.0, 1.0))
    return Case((x, list(ns_) if g.chance(0.5) else ns_), kw, tol={"rtol": 1e-3, "atol": 1e-4})


op("layer_norm", _gen_layer_norm, lambda ns, x, s, **kw: ns.F.layer_norm(x, s, **kw), grad=True)


def _gen_batch_norm(g: G) -> Case:
    c = g.side(3, 1)
    shape = (g.side(3, 1), c) + g.shape(0, 2, 3, 1)
    x = g.farr(shape, special=False)
    dt = x.data.dtype.name if x.data.dtype.kind == "f" else "float32"
    csize = c if not g.bad(0.1) else c + 1
    rm = g.arr((csize,), dt, special=False)
    rv = g.arr((csize,), dt, special=False, positive=True)
    kw: dict[str, Any] = {"training": g.chance(0.5)}
    if g.chance(0.5):
        kw["weight"] = g.arr((c,), dt, grad=True, special=False)
        kw["bias"] = g.arr((c,), dt, grad=True, special=False)
    if g.chance(0.3):
        kw["momentum"] = g.pick((0.1, 0.5))
    if g.chance(0.1):
        rm = rv = None  # training without running statistics
        kw["training"] = True
    return Case((x, rm, rv), kw, tol={"rtol": 1e-3, "atol": 1e-3})


def _batch_norm(ns: Any, x: Any, rm: Any, rv: Any, **kw: Any) -> Any:
    out = ns.F.batch_norm(x, rm, rv, **kw)
    return (out,) + ((rm, rv) if rm is not None else ())  # running statistics are updated in place


op("batch_norm", _gen_batch_norm, _batch_norm, grad=True, grad_tol={"rtol": 1e-5, "atol": 1e-7})


def _gen_linear(g: G) -> Case:
    fin, fout = g.side(4), g.side(3)
    x = g.farr(g.shape(0, 2, 3) + (fin if not g.bad(0.15) else fin + 1,), special=False)
    dt = x.data.dtype.name
    kw = {"bias": g.arr((fout,), dt, grad=True, special=False)} if g.chance(0.5) else {}
    return Case((x, g.arr((fout, fin), dt, grad=True, special=False)), kw, tol={"rtol": 1e-3, "atol": 1e-4})


op("linear", _gen_linear, lambda ns, x, w, **kw: ns.F.linear(x, w, **kw), grad=True)


def _gen_embedding(g: G) -> Case:
    num = g.side(5, 1)
    return Case((_index_tensor(g, num, g.shape(0, 2, 3), bad=0.1), g.farr((num, g.side(3, 1)))))


def _embedding(ns: Any, idx: Any, w: Any) -> Any:
    return ns.F.embedding(idx, w)


op("embedding", _gen_embedding, _embedding, grad=True)


def _gen_one_hot(g: G) -> Case:
    n = g.side(4, 1)
    idx = _index_tensor(g, n, g.shape(0, 2, 3), bad=0.1)
    idx = Arr(np.abs(idx.data) % n) if idx.data.dtype.kind == "i" and not g.bad(0.1) else idx
    kw = {"num_classes": g.pick((n, -1, n + 2))} if g.chance(0.6) else {}
    if not kw and idx.data.size == 0:
        kw = {"num_classes": n}
    return Case((idx,), kw)


op("one_hot", _gen_one_hot, lambda ns, i, **kw: ns.F.one_hot(i, **kw))


def _gen_normalize(g: G) -> Case:
    x = g.farr(g.shape(1, 3, 4))
    return Case((x,), {"p": g.pick((2.0, 1.0)), "dim": g.dim(x.data.ndim)})


op("normalize", _gen_normalize, lambda ns, x, **kw: ns.F.normalize(x, **kw), grad=True)


def _gen_cosine(g: G) -> Case:
    x = g.farr(g.shape(1, 3, 4))
    return Case((x, g.farr(g.broadcastable(x.data.shape, 0.1))), {"dim": g.dim(x.data.ndim)})


op("cosine_similarity", _gen_cosine, lambda ns, a, b, **kw: ns.F.cosine_similarity(a, b, **kw), grad=True)


# ---- conversion ----
def _gen_to(g: G) -> Case:
    return Case((g.arr(), DT(g.dtype()) if not g.bad(0.1) else g.pick(("bogus", 5, None))))


op("to", _gen_to, lambda ns, x, d: x.to(d), covers=("to",))


def _gen_cast(g: G) -> Case:
    return Case((g.arr(), g.pick(("float", "double", "half", "int", "long", "short", "bool", "byte", "char"))))


op("casts", _gen_cast, lambda ns, x, m: getattr(x, m)(),
   covers=("float", "double", "half", "int", "long", "short", "bool", "byte", "char"))
op("clone", lambda g: Case((g.arr(grad=True),)), lambda ns, x: x.clone(), grad=True)
op("item", lambda g: Case((g.arr(g.shape(0, 2, 2)),)), lambda ns, x: x.item())
op("tolist", lambda g: Case((g.arr(),)), lambda ns, x: x.tolist())


# ---- the rest of the Tensor-method registry ----
op("aminmax", _gen_reduce("int"), lambda ns, x, _mode="fn", **kw: tuple(ns.m.aminmax(x, **kw)))
op("argwhere", lambda g: Case((g.arr(),)), lambda ns, x: ns.m.argwhere(x))


def _gen_diag(g: G) -> Case:
    x = g.arr(g.shape(1 if not g.bad(0.1) else 0, 2 if not g.bad(0.1) else 3, 4), grad=True)
    return Case((x,), {"diagonal": g.int(-3, 3), "_mode": _mode(g)})


op("diag", _gen_diag, _fn_or_method("diag"), grad=True)


def _gen_diag_embed(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 3), grad=True)
    kw = {"offset": g.int(-2, 2)}
    if g.chance(0.4):
        kw["dim1"], kw["dim2"] = g.dim(x.data.ndim + 1), g.dim(x.data.ndim + 1)
    return Case((x,), kw)


op("diag_embed", _gen_diag_embed, lambda ns, x, **kw: ns.m.diag_embed(x, **kw), grad=True)


def _gen_as(g: G) -> Case:
    x = g.arr(g.shape(0, 3, 3), grad=True)
    other = g.arr(g.broadcastable(x.data.shape, 0.0)[::-1] if g.bad(0.3) else x.data.shape[::-1], g.dtype())
    return Case((x, other))


op("expand_as", lambda g: Case((g.arr(grad=True) if g.chance(0.5) else g.arr((1, 3), grad=True),
                                g.arr(g.shape(0, 3, 3)))),
   lambda ns, x, o: x.expand_as(o), grad=True)
op("reshape_as", _gen_as, lambda ns, x, o: x.reshape_as(o), grad=True)
op("view_as", _gen_as, lambda ns, x, o: x.view_as(o))
op("type_as", _gen_as, lambda ns, x, o: x.type_as(o))
op("fliplr", lambda g: Case((g.arr(grad=True),)), lambda ns, x: ns.m.fliplr(x), grad=True)
op("flipud", lambda g: Case((g.arr(grad=True),)), lambda ns, x: ns.m.flipud(x), grad=True)
op("moveaxis", _gen_two_dims, _fn_or_method("moveaxis"))
op("swapdims", _gen_two_dims, _fn_or_method("swapdims"))
op("ravel", lambda g: Case((g.arr(grad=True),)), lambda ns, x: ns.m.ravel(x), grad=True)
op("inner", _gen_vec2, lambda ns, a, b: ns.m.inner(a, b), grad=True)
op("T", lambda g: Case((g.arr(g.shape(0, 2, 3), grad=True),)), lambda ns, x: x.T, grad=True)
op("mT", lambda g: Case((g.arr(g.shape(1 if g.bad(0.1) else 2, 4, 3), grad=True),)), lambda ns, x: x.mT,
   grad=True)


def _gen_unfold(g: G) -> Case:
    x = g.arr(g.shape(0, 3, 5), grad=True)
    nd = x.data.ndim
    d = g.dim(nd, 0.1)
    size = x.data.shape[d] if isinstance(d, int) and nd and -nd <= d < nd else 1
    return Case((x, d, g.int(0, size + 1) if not g.bad(0.1) else -1, g.int(1, 3) if not g.bad(0.1) else 0))


op("unfold", _gen_unfold, lambda ns, x, d, size, step: x.unfold(d, size, step), grad=True)


def _mutating(name: str, n_args: int) -> Callable[..., Any]:
    def call(ns: Any, x: Any, *args: Any) -> Any:
        r = getattr(x, name)(*args)
        return r, x

    return call


def _gen_index_add_(g: G) -> Case:
    return _gen_index_add(g)


op("index_add_", _gen_index_add_, _mutating("index_add_", 3))
op("scatter_", _gen_scatter, _mutating("scatter_", 3))
op("scatter_add_", _gen_scatter_add, _mutating("scatter_add_", 3))
op("masked_fill_", lambda g: Case(_gen_masked_fill(g).args), _mutating("masked_fill_", 2))


def _gen_index_put(g: G) -> Case:
    x = g.arr(g.shape(1, 3, 3))
    k = g.int(1, x.data.ndim)
    n = g.int(0, 3)
    idx = tuple(Arr(np.abs(_index_tensor(g, s, (n,), 0.1).data) % max(s, 1)) if not g.bad(0.1) else
                _index_tensor(g, s, (n,), 0.5) for s in x.data.shape[:k])
    # duplicate index rows make the written value order-dependent (undefined in torch): compare shapes then
    rows = list(zip(*[i.data.tolist() for i in idx])) if n else []
    values = g.arr((n,) + x.data.shape[k:] if not g.bad(0.1) else (n + 1,), x.data.dtype.name) if g.chance(0.7) \
        else g.arr((), x.data.dtype.name)
    return Case((x, idx, values), {"accumulate": g.chance(0.3)}, shape_only=len(set(rows)) < len(rows))


op("index_put", _gen_index_put, lambda ns, x, i, v, **kw: x.index_put(i, v, **kw))
op("index_put_", _gen_index_put, lambda ns, x, i, v, **kw: (x.index_put_(i, v, **kw), x))


def _gen_copy_(g: G) -> Case:
    x = g.arr()
    return Case((x, g.arr(g.broadcastable(x.data.shape, 0.15), g.dtype())))


op("copy_", _gen_copy_, _mutating("copy_", 1))
op("fill_", lambda g: Case((g.arr(), g.scalar() if g.chance(0.8) else g.arr(g.shape(0, 1, 2)))),
   _mutating("fill_", 1))
op("zero_", lambda g: Case((g.arr(),)), _mutating("zero_", 0))
op("contiguous", lambda g: Case((g.arr(grad=True),)), lambda ns, x: x.contiguous(), grad=True)
op("cpu", lambda g: Case((g.arr(),)), lambda ns, x: x.cpu())
op("bfloat16", lambda g: Case((g.arr(special=False),)), lambda ns, x: x.bfloat16().float(),
   covers=("bfloat16",))


# ---- the allow-list -------------------------------------------------------------------------------------------
# ``allowed(case, torch_error, ember_error)`` -> a reason, or None. Exactly one side raised: torch (ember returned a
# result) or ember (a typed refusal where torch computes). Each entry says why the difference is deliberate.
def _scalar_operand(case: Case, torch_error: BaseException | None, ember_error: BaseException | None) -> str | None:
    # ember's binary functions take a Python scalar for either operand, as its operators (and numpy) do; torch's
    # functions want a Tensor there ("must be Tensor, not int", "invalid combination ... got (int, Tensor)").
    # The value is the one torch's reflected operator gives, so accepting it loses nothing.
    if ember_error is not None or not isinstance(torch_error, TypeError):
        return None
    msg = str(torch_error)
    scalar_in_tensor_slot = any(f"must be Tensor, not {t}" in msg or f"got ({t}, Tensor" in msg or
                                f"got ({t}," in msg and "Tensor" in msg for t in ("int", "float", "bool"))
    if scalar_in_tensor_slot and any(isinstance(a, (int, float)) for a in case.args):
        return "Python scalar operand where torch's function wants a Tensor (ember extension, numpy semantics)"
    return None


def _missing_inplace_twin(case: Case, torch_error: BaseException | None,
                          ember_error: BaseException | None) -> str | None:
    # ember offers in-place twins of every binary op (maximum_, minimum_); torch has none for these two
    if ember_error is None and isinstance(torch_error, AttributeError) and "has no attribute" in str(torch_error):
        return "in-place twin torch lacks (ember extension)"
    return None


def _checks_dim_of_empty(case: Case, torch_error: BaseException | None,
                         ember_error: BaseException | None) -> str | None:
    # torch skips the dim check of cummax/cummin on an empty tensor; ember checks it always (a DimError)
    from ember.errors import DimError

    if torch_error is None and isinstance(ember_error, DimError) and case.args and getattr(case.args[0], "data",
                                                                                             np.ones(1)).size == 0:
        return "ember checks the dim of an empty tensor, torch does not"
    return None


def _no_complex(case: Case, torch_error: BaseException | None, ember_error: BaseException | None) -> str | None:
    # ember has no complex dtypes (ember.dtypes defines none): a typed refusal of complex data is its contract
    from ember.errors import EmberError

    if torch_error is None and isinstance(ember_error, EmberError) and "complex" in str(ember_error):
        return "ember has no complex dtypes"
    return None


def _clip_style_bounds(case: Case, torch_error: BaseException | None,
                       ember_error: BaseException | None) -> str | None:
    # torch's clamp has a Number and a Tensor overload and refuses one bound of each kind; ember broadcasts a
    # tensor bound beside a number like numpy's clip (documented in ember.ops.pointwise.clamp)
    if ember_error is None and isinstance(torch_error, TypeError) and "invalid combination" in str(torch_error):
        return "a tensor bound beside a number works as numpy's clip (ember extension)"
    return None


def _no_size_is_0d(case: Case, torch_error: BaseException | None, ember_error: BaseException | None) -> str | None:
    # ember reads an absent size as the 0-d shape (zeros(), x.expand() / x.repeat() of a 0-d x) and squeeze(x, None)
    # as squeeze-all, like dim=None of its reductions (ember.shapes.check_shape_arg, ember.ops.shape); torch
    # requires the argument
    if ember_error is None and isinstance(torch_error, TypeError) and (
            "missing 1 required positional argument" in str(torch_error) or "invalid combination" in str(torch_error)):
        return "no size means the 0-d shape, squeeze(None) squeezes all (ember extension)"
    return None


ALLOWED: dict[str, Callable[[Case, BaseException | None, BaseException | None], str | None]] = {
    **dict.fromkeys(("empty", "ones", "zeros", "expand", "repeat", "squeeze"), _no_size_is_0d),
    "clamp": _clip_style_bounds,
    "clamp_": _clip_style_bounds,
    "tensor": _no_complex,
}
for _n in [*BINARY, *BINARY_ALIASES, *(n + "_" for n in INPLACE_BINARY)]:
    ALLOWED[_n] = _scalar_operand
for _n in ("maximum_", "minimum_"):
    ALLOWED[_n] = _missing_inplace_twin
for _n in ("cummax", "cummin"):
    ALLOWED[_n] = _checks_dim_of_empty



def _torch_lacks_kernel(case: Case, torch_error: BaseException | None,
                        ember_error: BaseException | None) -> str | None:
    # torch's NotImplementedError '"floor_vml_cpu" not implemented for 'Bool'' is a kernel torch's CPU build lacks
    # for that dtype, not an invalid call: ember computing it (floor of a bool, hypot of ints) is an extension
    if ember_error is None and isinstance(torch_error, NotImplementedError) and "not implemented for" in str(
            torch_error):
        return "torch has no CPU kernel for this dtype; ember computes it"
    return None


def _either(*rules: Callable[..., str | None]) -> Callable[..., str | None]:
    def allowed(case: Case, torch_error: BaseException | None, ember_error: BaseException | None) -> str | None:
        for rule in rules:
            reason = rule(case, torch_error, ember_error)
            if reason:
                return reason
        return None

    return allowed


for _o in OPS:
    _o.allowed = _either(*(r for r in (ALLOWED.get(_o.name), _torch_lacks_kernel) if r))

BY_NAME = {o.name: o for o in OPS}
assert len(BY_NAME) == len(OPS), "op names must be unique"


# -- coverage of core's Tensor-method registry ----------------------------------------------------------------------
#: registry names deliberately not fuzzed, with the reason
_COMPLEX_TESTED = ("complex tensors (the fuzz table draws real dtypes); tested against torch in "
                   "packages/ember-core/tests/test_complex.py and the kit's test_complex_dtypes")
NOT_FUZZED: dict[str, str] = {
    "cuda": "moves to a CUDA device, which these machines lack; its errors are tested in test_size_and_cuda.py",
    "bernoulli": "random samples (torch's cannot match); tested in packages/ember-core/tests/test_distributions.py",
    "multinomial": "random samples (torch's cannot match); tested in packages/ember-core/tests/test_distributions.py",
    "real": _COMPLEX_TESTED,
    "imag": _COMPLEX_TESTED,
    "is_complex": _COMPLEX_TESTED,
    "angle": _COMPLEX_TESTED,
    "conj": _COMPLEX_TESTED,
    "conj_physical": _COMPLEX_TESTED,
    "resolve_conj": _COMPLEX_TESTED,
    "is_conj": _COMPLEX_TESTED,
}


def registry_names() -> set[str]:
    """The names in core's Tensor-method registry (each op module's ``TENSOR_METHODS``)."""
    from importlib import import_module

    names: set[str] = set()
    for mod in ("creation", "pointwise", "reduction", "shape", "indexing", "linalg", "conversion", "complex"):
        names |= set(getattr(import_module(f"ember.ops.{mod}"), "TENSOR_METHODS", {}))
    return names


def covered_names() -> set[str]:
    return {n for o in OPS for n in o.covers}


def uncovered_methods() -> set[str]:
    return registry_names() - covered_names() - set(NOT_FUZZED)


# -- running ------------------------------------------------------------------------------------------------------
def fuzz_settings(examples: int) -> settings:
    # no shrinking: every case is classified and collected (nothing raises inside the property), and a failing
    # case is printed in full; a fixed seed per op (run_op) and no database make every run draw the same cases
    return settings(max_examples=examples, derandomize=False, database=None, deadline=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
                    print_blob=False)


def run_op(op: Op, device: str, examples: int) -> list[Outcome]:
    """Every outcome of ``examples`` drawn cases of ``op`` on ``device`` (forward, then gradients). The seed is
    the op's name: every device sees the same cases, and two ops do not share their first draws."""
    outcomes: list[Outcome] = []

    @seed(zlib.crc32(op.name.encode()))
    @fuzz_settings(examples)
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        case = op.gen(G(data.draw))
        outcomes.extend(run_case(op, case, device))

    draw()
    return outcomes
