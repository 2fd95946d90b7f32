"""Gradient rules of the elementwise primitives: unary, binary, where, cast, copy and the in-place forms.

Each vjp computes with the inner backend ``be`` on plain values. Broadcast operands get their gradient summed
back to their own shape (:func:`unbroadcast`). Predicates, comparisons, bitwise and rounding ops are not
differentiable: their outputs are untracked (rounding ops give zero gradients, as in PyTorch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from ember.autograd import GRAD_MODE
from ember.compile import is_recording
from ember.errors import AutodiffError

from .complex_grads import conj, is_complex, real_part
from .graph import ADArray, Meta, Node, Version, keep, kept, new_array, new_node
from .recorder import Recorder

_new = object.__new__

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SQRT_PI_OVER_TWO = math.sqrt(math.pi) / 2.0

Getter = Callable[[], Any]


def unbroadcast(be: Any, g: Any, shape: tuple[int, ...]) -> Any:
    """Sum a broadcast gradient back to ``shape``."""
    gs = tuple(g.shape)
    if gs == tuple(shape):
        return g
    lead = len(gs) - len(shape)
    dims = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and gs[lead + i] != 1
    )
    if dims:
        g = be.reduce("sum", g, dims, True)
    return be.reshape(g, tuple(shape))


def _mul(be: Any, *xs: Any) -> Any:
    r = xs[0]
    for x in xs[1:]:
        r = be.binary("mul", r, x)
    return r


def _sq(be: Any, x: Any) -> Any:
    return be.binary("mul", x, x)


def _sinc_vjp(be: Any, g: Any, x: Any, y: Any) -> Any:
    """(cos(pi x) - sinc(x)) / x, 0 at x == 0 (PyTorch): the division runs on x with its zeros replaced by 1, so no
    0 / 0 reaches the masked entries."""
    zero = be.binary("eq", x, 0.0)
    safe = be.where(zero, 1.0, x)
    d = be.binary("div", be.binary("sub", be.unary("cos", be.binary("mul", safe, math.pi)), y), safe)
    return be.binary("mul", g, be.where(zero, 0.0, d))


# vjp(be, g, x, y) -> grad of x; x and y are getters of the input and the output values
UNARY_VJP: dict[str, Callable[[Any, Any, Getter, Getter], Any]] = {
    "neg": lambda be, g, x, y: be.unary("neg", g),
    "abs": lambda be, g, x, y: be.binary("mul", g, be.unary("sign", x())),
    "exp": lambda be, g, x, y: be.binary("mul", g, y()),
    "exp2": lambda be, g, x, y: _mul(be, g, y(), _LN2),
    "expm1": lambda be, g, x, y: be.binary("mul", g, be.binary("add", y(), 1.0)),
    "log": lambda be, g, x, y: be.binary("div", g, x()),
    "log2": lambda be, g, x, y: be.binary("div", g, be.binary("mul", x(), _LN2)),
    "log10": lambda be, g, x, y: be.binary("div", g, be.binary("mul", x(), _LN10)),
    "log1p": lambda be, g, x, y: be.binary("div", g, be.binary("add", x(), 1.0)),
    "sqrt": lambda be, g, x, y: be.binary("div", g, be.binary("mul", y(), 2.0)),
    "rsqrt": lambda be, g, x, y: _mul(be, g, y(), y(), y(), -0.5),
    "reciprocal": lambda be, g, x, y: be.unary("neg", _mul(be, g, y(), y())),
    "sin": lambda be, g, x, y: be.binary("mul", g, be.unary("cos", x())),
    "cos": lambda be, g, x, y: be.unary("neg", be.binary("mul", g, be.unary("sin", x()))),
    "tan": lambda be, g, x, y: be.binary("mul", g, be.binary("add", _sq(be, y()), 1.0)),
    "asin": lambda be, g, x, y: be.binary("mul", g, be.unary("rsqrt", be.binary("sub", 1.0, _sq(be, x())))),
    "acos": lambda be, g, x, y: be.unary(
        "neg", be.binary("mul", g, be.unary("rsqrt", be.binary("sub", 1.0, _sq(be, x()))))
    ),
    "atan": lambda be, g, x, y: be.binary("div", g, be.binary("add", _sq(be, x()), 1.0)),
    "sinh": lambda be, g, x, y: be.binary("mul", g, be.unary("cosh", x())),
    "cosh": lambda be, g, x, y: be.binary("mul", g, be.unary("sinh", x())),
    "tanh": lambda be, g, x, y: be.binary("mul", g, be.binary("sub", 1.0, _sq(be, y()))),
    "asinh": lambda be, g, x, y: be.binary("mul", g, be.unary("rsqrt", be.binary("add", _sq(be, x()), 1.0))),
    "acosh": lambda be, g, x, y: be.binary("mul", g, be.unary("rsqrt", be.binary("sub", _sq(be, x()), 1.0))),
    "atanh": lambda be, g, x, y: be.binary("div", g, be.binary("sub", 1.0, _sq(be, x()))),
    "erf": lambda be, g, x, y: _mul(be, g, be.unary("exp", be.unary("neg", _sq(be, x()))), _TWO_OVER_SQRT_PI),
    "erfc": lambda be, g, x, y: _mul(be, g, be.unary("exp", be.unary("neg", _sq(be, x()))), -_TWO_OVER_SQRT_PI),
    "erfinv": lambda be, g, x, y: _mul(be, g, be.unary("exp", _sq(be, y())), _SQRT_PI_OVER_TWO),
    "sigmoid": lambda be, g, x, y: _mul(be, g, y(), be.binary("sub", 1.0, y())),
    "sinc": lambda be, g, x, y: _sinc_vjp(be, g, x(), y()),
}
# PyTorch: the gradient of these step functions is zero everywhere
ZERO_GRAD_UNARY = frozenset({"sign", "floor", "ceil", "round", "trunc"})


def _zeros_like(be: Any, g: Any) -> Any:
    return be.binary("mul", g, 0.0)


def _max_min_vjp(op: str) -> Callable[..., tuple[Any, Any]]:
    """maximum/minimum: the gradient goes to the selected operand, ties split it in half; fmax/fmin: ties (and a
    NaN second operand) give it all to the first operand -- both as PyTorch's derivatives."""
    pick, loses = ("gt", "lt") if op == "maximum" else ("lt", "gt")

    def vjp(be: Any, g: Any, a: Getter, b: Getter, y: Getter) -> tuple[Any, Any]:
        av, bv = a(), b()
        if op in ("fmax", "fmin"):
            first = be.binary("ge" if op == "fmax" else "le", av, bv)
            first = be.binary("logical_or", first, be.unary("isnan", bv))
            return be.where(first, g, 0.0), be.where(first, 0.0, g)
        # PyTorch: where(a == b, g / 2, g), zeroed for the operand that lost; a NaN comparison loses nothing,
        # so both operands get the gradient there
        shared = be.where(be.binary("eq", av, bv), be.binary("mul", g, 0.5), g)
        lost_a = be.binary(loses, av, bv)
        ga = be.where(lost_a, 0.0, shared)
        gb = be.where(be.binary(pick, av, bv), 0.0, shared)
        return ga, gb

    return vjp


def _max_min_one_grad(be: Any, op: str, g: Any, x: Any, other: Any) -> Any:
    """maximum/minimum's gradient for the operand ``x`` alone (the other needs none, e.g. relu's 0): the same values
    as :func:`_max_min_vjp` (zero where ``x`` lost, half on ties, all of it on NaN) in one compare and one where,
    plus the tie pass only when a tie exists -- relu's backward runs on large activations every training step."""
    lost = be.binary("lt" if op == "maximum" else "gt", x, other)
    gx = be.where(lost, 0.0, g)
    tie = be.binary("eq", x, other)
    # without ties the pass changes nothing; ember.compile records it unconditionally rather than read the data
    # (a read would end the recorded graph), so a replay matches eager bit for bit whatever the ties
    if math.prod(tie.shape) and (is_recording() or bool(
            be.to_numpy(be.reduce("max", tie, tuple(range(len(tie.shape))), False)))):
        gx = be.where(tie, be.binary("mul", g, 0.5), gx)
    return gx


def _pow_vjp(be: Any, g: Any, a: Getter, b: Getter, y: Getter) -> tuple[Any, Any]:
    av, bv = a(), b()
    # d/da a**b = b * a**(b-1), defined as 0 where b == 0 (avoids 0 * inf at a == 0)
    ga = be.binary("mul", g, be.binary("mul", bv, be.binary("pow", av, be.binary("sub", bv, 1.0))))
    ga = be.where(be.binary("eq", bv, 0.0), 0.0, ga)
    # d/db a**b = a**b * log(a), defined as 0 where a == 0 and b >= 0 (PyTorch)
    gb = be.binary("mul", g, be.binary("mul", y(), be.unary("log", av)))
    gb = be.where(be.binary("logical_and", be.binary("eq", av, 0.0), be.binary("ge", bv, 0.0)), 0.0, gb)
    return ga, gb


def _atan2_vjp(be: Any, g: Any, a: Getter, b: Getter, y: Getter) -> tuple[Any, Any]:
    av, bv = a(), b()
    den = be.binary("add", _sq(be, av), _sq(be, bv))
    return (be.binary("div", be.binary("mul", g, bv), den),
            be.unary("neg", be.binary("div", be.binary("mul", g, av), den)))


def _hypot_vjp(be: Any, g: Any, a: Getter, b: Getter, y: Getter) -> tuple[Any, Any]:
    yv = y()
    return (be.binary("mul", g, be.binary("div", a(), yv)), be.binary("mul", g, be.binary("div", b(), yv)))


def _copysign_vjp(be: Any, g: Any, a: Getter, b: Getter, y: Getter) -> tuple[Any, Any]:
    av = a()
    # |a| * sign(b): d/da = sign(a) * sign_bit_of(b), zero at a == 0 (PyTorch); d/db = 0
    s = be.binary("div", y(), av)
    ga = be.where(be.binary("eq", av, 0.0), 0.0, be.binary("mul", g, s))
    return ga, _zeros_like(be, g)


# vjp(be, g, a, b, y) -> (grad a, grad b) at the broadcast shape; getters for operands (scalars allowed)
BINARY_VJP: dict[str, Callable[..., tuple[Any, Any]]] = {
    "add": lambda be, g, a, b, y: (g, g),
    "sub": lambda be, g, a, b, y: (g, be.unary("neg", g)),
    "mul": lambda be, g, a, b, y: (be.binary("mul", g, b()), be.binary("mul", g, a())),
    "div": lambda be, g, a, b, y: (
        be.binary("div", g, b()),
        be.unary("neg", be.binary("div", be.binary("mul", g, y()), b())),
    ),
    "pow": _pow_vjp,
    "maximum": _max_min_vjp("maximum"),
    "minimum": _max_min_vjp("minimum"),
    "fmax": _max_min_vjp("fmax"),
    "fmin": _max_min_vjp("fmin"),
    "atan2": _atan2_vjp,
    "hypot": _hypot_vjp,
    "copysign": _copysign_vjp,
    "remainder": lambda be, g, a, b, y: (
        g, be.unary("neg", be.binary("mul", g, be.unary("floor", be.binary("div", a(), b())))),
    ),
    "fmod": lambda be, g, a, b, y: (
        g, be.unary("neg", be.binary("mul", g, be.unary("trunc", be.binary("div", a(), b())))),
    ),
    "floor_divide": lambda be, g, a, b, y: (_zeros_like(be, g), _zeros_like(be, g)),
}


# The common ops one gradient at a time: each reads only the saved values its own formula needs (PyTorch saves
# only those), so x * c, x / c and x - c neither compute an unneeded gradient nor fail backward when the value
# that only the untracked operand's gradient would read was modified in place afterwards.
_ONE_SIDED: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add": (lambda be, g, a, b, y: g, lambda be, g, a, b, y: g),
    "sub": (lambda be, g, a, b, y: g, lambda be, g, a, b, y: be.unary("neg", g)),
    "mul": (lambda be, g, a, b, y: be.binary("mul", g, b()), lambda be, g, a, b, y: be.binary("mul", g, a())),
    "div": (lambda be, g, a, b, y: be.binary("div", g, b()),
            lambda be, g, a, b, y: be.unary("neg", be.binary("div", be.binary("mul", g, y()), b()))),
}

# what the one-sided rules read, given (a needs a gradient, b needs one): (save a, save b, save y). Saving only
# what a rule reads keeps the graph small and, as in PyTorch, lets later in-place writes to unread operands pass
_ONE_SIDED_SAVES: dict[str, Callable[[bool, bool], tuple[bool, bool, bool]]] = {
    "add": lambda na, nb: (False, False, False),
    "sub": lambda na, nb: (False, False, False),
    "mul": lambda na, nb: (nb, na, False),
    "div": lambda na, nb: (False, True, nb),
}


#: _ONE_SIDED_SAVES as a table: op -> its (save a, save b, save y) at index need_a + 2 * need_b
_ONE_SIDED_KEEP: dict[str, tuple[tuple[bool, bool, bool], ...]] = {
    op: tuple(f(bool(k & 1), bool(k & 2)) for k in range(4)) for op, f in _ONE_SIDED_SAVES.items()}

_MAX_MIN = frozenset({"maximum", "minimum"})


def _unsaved() -> Any:
    raise AssertionError("autodiff rule read an operand it declared it does not need")  # a bug in this module


#: binary rules that only ever combine an operand with the incoming gradient (a scalar operand is fine there)
_SCALAR_SAFE = frozenset({"add", "sub", "mul", "div", "floor_divide"})

#: what ElementwiseRules.binary needs of a differentiable op, in one lookup: (its rule, its one-sided rules or
#: None, what those read (_ONE_SIDED_KEEP's row) or None, whether a Python-scalar operand may stay a scalar)
_BINARY_SPECS: dict[str, tuple[Callable[..., tuple[Any, Any]], Any, Any, bool]] = {
    op: (rule, _ONE_SIDED.get(op), _ONE_SIDED_KEEP.get(op), op in _SCALAR_SAFE) for op, rule in BINARY_VJP.items()}

_KEEP_ALL = ((True, True, True),) * 4

#: _BINARY_SPECS with the saves spelled out, for binary's non-checkpointing path: op -> one row per
#: ``need_a + 2 * need_b`` of (rule, one-sided rules, keep a, keep b, keep y, scalar-safe), one lookup per op
_BINARY_PLANS: dict[str, tuple[tuple[Any, Any, bool, bool, bool, bool], ...]] = {
    op: tuple((rule, sided, *k, safe) for k in (keeps or _KEEP_ALL))
    for op, (rule, sided, keeps, safe) in _BINARY_SPECS.items()}


def _scalar_getter(be: Any, scalar: Any, other: Getter) -> Getter:
    """A getter of ``scalar`` as a 0-d handle of the other operand's dtype (built at backward time only)."""
    return lambda: be.full((), scalar, be.dtype_of(other()))


def _unary_vjp(inner: Any, rule: Callable[..., Any], x: Getter, y: Getter, g: Any) -> tuple[Any]:
    """The vjp of a recorded unary op (``ElementwiseRules.unary``); complex values as in :func:`_binary_vjp`."""
    if is_complex(inner, g):
        r = rule(inner, conj(inner, g), x, y)
        return (conj(inner, r) if r is not None and is_complex(inner, r) else r,)
    return (rule(inner, g, x, y),)


def _binary_vjp(inner: Any, op: str, sided: Any, rule: Any, pa: Getter, pb: Getter, y: Getter,
                sa: tuple[int, ...] | None, sb: tuple[int, ...] | None, need_a: bool, need_b: bool,
                g: Any) -> tuple[Any, Any]:
    """The vjp of a recorded binary op (``ElementwiseRules.binary``): gradients of the operands that need one,
    summed back to their shapes. Complex values follow torch's convention (:func:`complex_grads.conjugated`): the
    output's gradient has the output's dtype, so its dtype says whether to conjugate -- decided here, at backward,
    rather than on every recorded op."""
    cx = is_complex(inner, g)
    if cx:
        g = conj(inner, g)
    if sided is not None:
        da = sided[0](inner, g, pa, pb, y) if need_a else None
        db = sided[1](inner, g, pa, pb, y) if need_b else None
    elif op in _MAX_MIN and need_a != need_b:
        da = _max_min_one_grad(inner, op, g, pa(), pb()) if need_a else None
        db = _max_min_one_grad(inner, op, g, pb(), pa()) if need_b else None
    else:
        da, db = rule(inner, g, pa, pb, y)
    res = (unbroadcast(inner, da, sa) if need_a else None, unbroadcast(inner, db, sb) if need_b else None)
    if cx:
        res = tuple(r if r is None or not is_complex(inner, r) else conj(inner, r) for r in res)
    return res


def _shape(x: Any) -> tuple[int, ...] | None:
    return tuple(x.shape) if type(x) is ADArray else None


class ElementwiseRules(Recorder):
    """Mixin of AutodiffBackend: elementwise primitives and their gradients."""

    def unary(self, op: str, h: ADArray) -> ADArray:
        inner = self.inner
        value = inner.unary(op, h.value)
        if h.meta is None or not GRAD_MODE.enabled or (op not in UNARY_VJP and op not in ZERO_GRAD_UNARY):
            return new_array(value)  # self.tracking(h) and self.wrap inlined
        if op in ZERO_GRAD_UNARY:
            return self.record(op, value, (h,), lambda g: (_zeros_like(inner, g),))
        x = self.save(h)
        rule = UNARY_VJP[op]
        if self.balanced:
            return self._record_balanced_unary(op, value, h, x, rule)
        # recorded without self.record, the vjp's arguments on the node, no closure (see binary): this runs for
        # every activation
        out = new_array(value)
        out.meta = new_node(op, (h.meta,), _unary_vjp, (inner, rule, x, keep(out)))  # its own meta (see Node)
        return out

    def _record_balanced_unary(self, op: str, value: Any, h: ADArray, x: Getter,
                               rule: Callable[..., Any]) -> ADArray:
        """unary's recording under balanced checkpointing: the node carries the recipe that recomputes it."""
        inner = self.inner
        y: Getter = _unsaved

        def vjp(g: Any) -> tuple[Any]:
            return _unary_vjp(inner, rule, x, y, g)

        out = self.record(op, value, (h,), vjp, recompute=lambda: inner.unary(op, x()))
        y = self.save(out)
        return out

    def clamp(self, h: ADArray, lo: Any, hi: Any) -> ADArray:
        """PyTorch's clamp gradients: h's where lo <= h <= hi (never at NaN; maximum/minimum would split ties
        and pass NaN), a tensor lo's where h < lo < hi, a tensor hi's where h > hi or hi < lo."""
        inner = self.inner

        def val(v: Any) -> Any:
            return v.value if type(v) is ADArray else v

        value = inner.clamp(h.value, val(lo), val(hi))
        if not self.tracking(h, lo, hi):
            return self.wrap(value)
        x, glo, ghi = self.save(h), self.save(lo) if type(lo) is ADArray else None, \
            self.save(hi) if type(hi) is ADArray else None

        def bound(v: Any, getter: Any) -> Any:
            return getter() if getter is not None else v

        def vjp(g: Any) -> tuple[Any, Any, Any]:
            xv = x()
            lv = None if lo is None else bound(lo, glo)
            hv = None if hi is None else bound(hi, ghi)
            if lv is not None and hv is not None:
                inside = inner.binary("logical_and", inner.binary("ge", xv, lv), inner.binary("le", xv, hv))
            elif lv is not None:
                inside = inner.binary("ge", xv, lv)
            else:
                inside = inner.binary("le", xv, hv)
            dx = dlo = dhi = None
            if h.meta is not None:
                dx = unbroadcast(inner, inner.where(inside, g, 0.0), tuple(h.shape))
            if type(lo) is ADArray and lo.meta is not None:
                below = inner.binary("lt", xv, lv)
                if hv is not None:
                    below = inner.binary("logical_and", below, inner.binary("lt", lv, hv))
                dlo = unbroadcast(inner, inner.where(below, g, 0.0), tuple(lo.shape))
            if type(hi) is ADArray and hi.meta is not None:
                above = inner.binary("gt", xv, hv)
                if lv is not None:
                    above = inner.binary("logical_or", above, inner.binary("lt", hv, lv))
                dhi = unbroadcast(inner, inner.where(above, g, 0.0), tuple(hi.shape))
            return dx, dlo, dhi

        return self.record("clamp", value, (h, lo, hi), vjp,
                           recompute=lambda: inner.clamp(x(), bound(val(lo), glo), bound(val(hi), ghi)))

    def binary(self, op: str, a: Any, b: Any) -> ADArray:
        # the hottest path of the decorator (every eager a + b): self.tracking, self.record, self.save, keep,
        # conjugated and the ADArray/Node constructors are inlined here, the op's rules come from one table
        # lookup, and the node holds its vjp's arguments as a tuple (no partial, no closure cells)
        inner = self.inner
        ta, tb = type(a) is ADArray, type(b) is ADArray
        out = _new(ADArray)  # new_array inlined
        if ta and tb:
            va, vb, sa, sb = a.value, b.value, a.shape, b.shape
            same = sa == sb
            kernels = inner.binary_kernels  # flex: the ufunc itself for small operands (Backend.binary_kernels)
            if same and kernels is not None and 1 < va.size < inner.binary_kernel_elems:
                try:
                    value = kernels[op](va, vb)
                except Exception:  # core validated the shapes: an op without kernel, or the backend's typed error
                    value = inner.binary(op, va, vb)
            else:
                value = inner.binary(op, va, vb)
            out.shape = sa if same else value.shape  # an operand's shape tuple: one allocation less
            ma, mb = a.meta, b.meta
        else:  # a Python scalar operand
            va = a.value if ta else a
            vb = b.value if tb else b
            value = inner.binary(op, va, vb)
            out.shape = value.shape
            sa = a.shape if ta else None  # unbroadcast makes them tuples, when it runs
            sb = b.shape if tb else None
            ma = a.meta if ta else None
            mb = b.meta if tb else None
        out.value = value
        out.base = out._version = out.recipe = out.meta = None
        if (ma is None and mb is None) or not GRAD_MODE.enabled:
            return out
        plans = _BINARY_PLANS.get(op)
        if plans is None:  # not differentiable (comparisons, bitwise ops): an untracked result
            return out
        need_a, need_b = ma is not None, mb is not None
        rule, sided, keep_a, keep_b, keep_y, scalar_safe = plans[need_a + 2 * need_b]
        if self.balanced:  # every rule may read everything; balanced recipes rebuild the output
            save = self.save
            ga, gb = save(a), save(b)
            pa, pb = self._scalar_operands(a, b, ga, gb, sa, sb, scalar_safe)
            return self._record_balanced_binary(op, value, a, b, ga, gb, partial(
                _binary_vjp, inner, op, sided, rule, pa, pb))
        # keep() inlined: a getter of the value as it is now, version-checked at backward
        if keep_a:
            if ta:
                counter = a._version
                if counter is None:
                    counter = a._version = Version()
                ga = partial(kept, va, counter, counter.n)
            else:
                ga = self.save(a)
        else:
            ga = _unsaved
        if keep_b:
            if tb:
                counter = b._version
                if counter is None:
                    counter = b._version = Version()
                gb = partial(kept, vb, counter, counter.n)
            else:
                gb = self.save(b)
        else:
            gb = _unsaved
        pa, pb = ga, gb
        if (sa is None or sb is None) and not scalar_safe:
            pa, pb = self._scalar_operands(a, b, ga, gb, sa, sb, scalar_safe)
        out.meta = node = _new(Node)  # new_node inlined; the node is the output's own meta (see Node)
        node.name = op
        node.inputs = (ma, mb)
        node.vjp = _binary_vjp
        node.args = (inner, op, sided, rule, pa, pb, keep(out) if keep_y else _unsaved, sa, sb, need_a, need_b)
        return out

    def _scalar_operands(self, a: Any, b: Any, ga: Getter, gb: Getter, sa: Any, sb: Any,
                         scalar_safe: bool) -> tuple[Getter, Getter]:
        """The operand getters binary's rule reads: rules other than the scalar-safe ones combine the two operands
        with each other (or apply unary ops to them), so a Python-scalar operand becomes a 0-d handle there, since
        backends never see two scalars."""
        pa, pb = ga, gb
        if (sa is None or sb is None) and not scalar_safe:
            if sa is None:
                pa = _scalar_getter(self.inner, a, gb)
            if sb is None:
                pb = _scalar_getter(self.inner, b, ga)
        return pa, pb

    def _record_balanced_binary(self, op: str, value: Any, a: Any, b: Any, ga: Getter, gb: Getter,
                                vjp_of: Callable[..., tuple[Any, Any]]) -> ADArray:
        """binary's recording under balanced checkpointing: the output is saved (its getter recomputes it from
        the operands when it was freed) and the node carries the recipe."""
        inner = self.inner
        sa, sb = _shape(a), _shape(b)
        need_a = sa is not None and a.meta is not None
        need_b = sb is not None and b.meta is not None
        y: Getter = _unsaved

        def vjp(g: Any) -> tuple[Any, Any]:
            return vjp_of(y, sa, sb, need_a, need_b, g)  # type: ignore[no-any-return]

        out = self.record(op, value, (a, b), vjp, recompute=lambda: inner.binary(op, ga(), gb()))
        y = self.save(out)
        return out

    def where(self, cond: Any, a: Any, b: Any) -> ADArray:
        inner = self.inner
        c = cond.value if type(cond) is ADArray else cond
        av = a.value if type(a) is ADArray else a
        bv = b.value if type(b) is ADArray else b
        value = inner.where(c, av, bv)
        if not self.tracking(a, b):
            return self.wrap(value)
        sa, sb = _shape(a), _shape(b)
        gc = self.save(cond)

        def vjp(g: Any) -> tuple[Any, Any]:
            cv = gc()
            return (None if sa is None else unbroadcast(inner, inner.where(cv, g, 0.0), sa),
                    None if sb is None else unbroadcast(inner, inner.where(cv, 0.0, g), sb))

        ga_, gb_ = self.save(a), self.save(b)
        return self.record("where", value, (a, b), vjp,
                           recompute=lambda: inner.where(gc(), ga_(), gb_()))

    def cast(self, h: ADArray, dtype: Any) -> ADArray:
        inner = self.inner
        value = inner.cast(h.value, dtype)
        if not self.tracking(h) or not (dtype.is_floating_point or dtype.is_complex):
            return self.wrap(value)
        src = inner.dtype_of(h.value)
        x = self.save(h)

        def vjp(g: Any) -> tuple[Any]:
            if dtype.is_complex and not src.is_complex:  # a real value promoted to complex: its gradient is real
                g = real_part(inner, g)
            return (inner.cast(g, src),)

        return self.record("cast", value, (h,), vjp, recompute=lambda: inner.cast(x(), dtype))

    def dtype_of(self, h: ADArray) -> Any:
        return self.inner.dtype_of(h.value)

    def copy(self, h: ADArray) -> ADArray:
        inner = self.inner
        value = inner.copy(h.value)
        if not self.tracking(h):
            return self.wrap(value)
        x = self.save(h)
        return self.record("clone", value, (h,), lambda g: (g,),
                           recompute=lambda: inner.copy(x()))

    def contiguous(self, h: ADArray) -> ADArray:
        inner = self.inner
        value = inner.contiguous(h.value)
        if not self.tracking(h):
            return self.wrap(value)
        x = self.save(h)
        return self.record("contiguous", value, (h,), lambda g: (g,),
                           recompute=lambda: inner.contiguous(x()))

    # -- in place: the array's history is rebased onto a node of the op (PyTorch's CopySlices idea) ------------
    def _rebase(self, name: str, h: ADArray, inputs: tuple[Any, ...], vjp: Callable[[Any], Any]) -> None:
        metas = tuple(x.meta if type(x) is ADArray else None for x in inputs)
        if GRAD_MODE.enabled and any(m is not None for m in metas):
            h.meta = Meta(Node(name, metas, vjp))
            h.recipe = None  # its value is now the in-place result: keep it as saved
        elif h.meta is not None and h.meta.node is not None:
            h.meta = None  # overwritten under no_grad: no history left

    def assign(self, dst: ADArray, src: Any) -> None:
        self.check_inplace("copy_", dst)
        tracked = self.tracking(src)
        self.inner.assign(dst.value, src.value if type(src) is ADArray else src)
        if tracked:
            shape = tuple(src.shape)
            inner = self.inner
            # the old contents of dst are fully overwritten: no gradient flows to them
            self._rebase("copy_", dst, (src,), lambda g: (unbroadcast(inner, g, shape),))
        elif dst.meta is not None and dst.meta.node is not None:
            self._rebase("copy_", dst, (), lambda g: ())

    def write_back(self, dst: ADArray, src: ADArray, op: str) -> ADArray:
        """An in-place op computed out of place: while dst is tracked, its graph may have saved its old value,
        so the tensor is rebound to ``src`` (whose node continues dst's history) instead of overwriting dst's
        memory; a leaf that requires grad is refused, as in PyTorch."""
        if GRAD_MODE.enabled and dst.meta is not None:
            if dst.meta.node is None:
                raise AutodiffError(
                    f"{op}: a leaf tensor that requires grad is being used in an in-place operation; wrap it in "
                    "`with ember.no_grad():` (e.g. for parameter updates) or clone() it first"
                )
            return src
        self.assign(dst, src)
        return dst

    def inplace_binary(self, op: str, a: ADArray, b: Any) -> None:
        if not self.tracking(a, b):
            self.check_inplace(op + "_", a)
            self.inner.inplace_binary(op, a.value, b.value if type(b) is ADArray else b)
            if a.meta is not None and a.meta.node is not None:
                self._rebase(op + "_", a, (), lambda g: ())
            return
        # out of place on the inner backend, then written back: the rule needs the old value of a
        result = self.binary(op, ADArray(self.inner.copy(a.value), a.meta), b)
        self.check_inplace(op + "_", a)
        self.inner.assign(a.value, result.value)
        a.meta = result.meta
        a.recipe = None
