"""Elementwise ops: arithmetic, comparison, logical, bitwise and math functions, with PyTorch's promotion.

The hot path (``a + b``) is: one rule-cache lookup for (op, dtypes), one broadcast-cache lookup when shapes
differ, optional casts, one backend call. No plugin machinery, no repeated validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from .. import opinfo
from ..dtypes import DType
from ..errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ..shapes import broadcast_shapes
from ..tensor import Tensor

# the dtype rules are the op registry's; the finer sets below (logical, shifts, no-bool) are this module's own
_FLOAT_RESULT = opinfo.FLOAT_BINARY_OPS
_BOOL_RESULT = opinfo.COMPARISON_OPS
_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})
_INT_ONLY = opinfo.INTEGRAL_BINARY_OPS
_SHIFTS = frozenset({"bitwise_left_shift", "bitwise_right_shift"})
_NO_BOOL = frozenset({"sub", "remainder", "fmod", "floor_divide"})

_SCALAR_TYPES = (bool, int, float, complex)
_new = object.__new__

#: the binary ops defined on complex operands (PyTorch: no ordering, rounding, bitwise or modulo ops on complex)
COMPLEX_BINARY = frozenset({"add", "sub", "mul", "div", "pow", "eq", "ne"})
#: the unary ops defined on complex inputs; abs (a real result) goes to :func:`ember.ops.complex.abs_complex`
COMPLEX_UNARY = frozenset(
    "neg exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan sinh cosh tanh asin acos atan asinh "
    "acosh atanh isnan isinf isfinite abs".split())


def complex_unsupported(op: str, d: DType, what: str = "") -> DTypeError:
    """The DTypeError for an op PyTorch does not define on complex tensors (ordering, rounding, bitwise...)."""
    return DTypeError(f"{op}: not supported for complex dtype {d.name}{what} (PyTorch defines no {op} on complex "
                      "numbers); take .real, .imag or .abs() first")

# (op, dtype_a, dtype_b, a_is_dimensioned, b_is_dimensioned) -> (compute dtype, result dtype)
_rule_cache: dict[tuple[Any, ...], tuple[DType, DType]] = {}


def _operand_desc(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"Tensor{tuple(x.shape)}:{x._dtype.name}"
    return f"{type(x).__name__} {x!r}"


def _rule(op: str, a: Any, b: Any) -> tuple[DType, DType]:
    """Compute and result dtypes for a binary op (PyTorch rules), cached by operand dtype signature.

    Dimensioned-ness only matters between two tensors of different dtypes; the key says so.
    """
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    ka = a._dtype if ta else type(a)
    kb = b._dtype if tb else type(b)
    key = (op, ka, kb, ta and tb and ka is not kb and a.ndim > 0, ta and tb and ka is not kb and b.ndim > 0)
    r = _rule_cache.get(key)
    if r is None:
        r = _rule_cache[key] = _compute_rule(op, a, b)
    return r


def _kind(x: Any) -> DType | None:
    return x._dtype if isinstance(x, Tensor) else dt.bool_ if isinstance(x, bool) else None


def _compute_rule(op: str, a: Any, b: Any) -> tuple[DType, DType]:
    promoted = dt.result_type(a, b)
    if promoted.is_complex:
        if op not in COMPLEX_BINARY:
            raise complex_unsupported(op, promoted, f" ({_operand_desc(a)}, {_operand_desc(b)})")
        return (promoted, dt.bool_ if op in _BOOL_RESULT else promoted)
    if op in _LOGICAL:
        return (dt.bool_, dt.bool_)
    if op in _BOOL_RESULT:
        return (promoted, dt.bool_)
    if op in _INT_ONLY:
        if promoted.is_floating_point:
            raise DTypeError(
                f"{op}: not implemented for floating dtypes ({_operand_desc(a)}, {_operand_desc(b)}); "
                "bitwise ops need integer or bool tensors"
            )
        if op in _SHIFTS and promoted is dt.bool_:
            raise DTypeError(f"{op}: not implemented for bool operands")
        return (promoted, promoted)
    if op == "sub" and dt.bool_ in (_kind(a), _kind(b)):
        # PyTorch refuses a bool operand even when the promoted type is an integer
        raise DTypeError(
            f"sub: subtraction, the `-` operator, with a bool operand is not supported ({_operand_desc(a)}, "
            f"{_operand_desc(b)}); use ~ / logical_not to invert a mask, or logical_xor"
        )
    if op in _FLOAT_RESULT and not promoted.is_floating_point:
        f = dt.get_default_dtype()
        return (f, f)
    if op in _NO_BOOL and promoted is dt.bool_:
        raise DTypeError(
            f"{op}: not supported for two bool operands ({_operand_desc(a)}, {_operand_desc(b)}); "
            "use logical_xor / logical ops, or cast to an integer dtype first"
        )
    return (promoted, promoted)


# (op, dtype) -> (compute, result) for the common case of two tensors of one dtype
_same_cache: dict[tuple[str, DType], tuple[DType, DType]] = {}
#: binary_operator's mark for a dtype its short path does not take (casts or integer checks needed)
_SLOW = object()


_INT_RANGE = {
    d: (int(np.iinfo(d.numpy).min), int(np.iinfo(d.numpy).max)) for d in dt.INT_DTYPES
}


def _scalar_for(v: Any, dtype: DType) -> Any:
    """Fit a Python scalar to the compute dtype: integers wrap around like PyTorch's, bools stay bools."""
    if dtype.category == 3:
        return complex(v)
    if dtype.category == 2 and type(v) is float:
        return v
    if dtype.category == 1 and type(v) is int:
        lo, hi = _INT_RANGE[dtype]
        if not lo <= v <= hi:
            span = hi - lo + 1
            v = (v - lo) % span + lo
    elif dtype.category == 1 and type(v) is bool:
        v = int(v)
    elif dtype.category == 0 and type(v) is not bool:
        v = bool(v)
    elif dtype.category == 2 and type(v) is not float:
        v = float(v)
    return v


def binary(op: str, a: Any, b: Any) -> Tensor:
    """Apply a binary elementwise op; at least one operand is a Tensor, the other a Tensor or scalar."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        dev = a._device
        if b._device is not dev:
            raise DeviceError(
                f"{op}: expected all tensors on the same device, got {dev} and {b._device} "
                "(move one with .to(device))"
            )
        ha, hb = a._h, b._h
        if ha.shape != hb.shape:
            broadcast_shapes(ha.shape, hb.shape, op=op)
        da = a._dtype
        if da is b._dtype:  # hot path: one dtype, no casts
            r = _same_cache.get((op, da))
            if r is None:
                r = _same_cache[(op, da)] = _compute_rule(op, a, b)
            stack = dev._stack or dev.stack
            if da.category == 1 and op in _INT_CHECKED:
                _check_int(op, a, b, stack)
            if r[0] is not da:  # integer operands of div, atan2, ... compute in the default float dtype
                ha, hb = stack.cast(ha, r[0]), stack.cast(hb, r[0])
            t = _new(Tensor)  # Tensor._make inlined: this is the hottest path of eager code
            t._h = stack.binary(op, ha, hb)
            t._dtype = r[1]
            t._device = dev
            return t
        cdt, rdt = _rule(op, a, b)
        stack = dev._stack or dev.stack
        if da is not cdt:
            ha = stack.cast(ha, cdt)
        if b._dtype is not cdt:
            hb = stack.cast(hb, cdt)
    elif isinstance(a, Tensor):
        dev = a._device
        b = _check_scalar(op, b, a)
        cdt, rdt = _rule(op, a, b)
        stack = dev._stack or dev.stack
        ha = a._h if a._dtype is cdt else stack.cast(a._h, cdt)
        hb = _scalar_for(b, cdt) if cdt.category != 3 else stack.full((), complex(b), cdt)
    else:
        dev = b._device
        a = _check_scalar(op, a, b)
        cdt, rdt = _rule(op, a, b)
        stack = dev._stack or dev.stack
        # the contract's scalar operands are bool/int/float: a complex one travels as a 0-d handle
        ha = _scalar_for(a, cdt) if cdt.category != 3 else stack.full((), complex(a), cdt)
        hb = b._h if b._dtype is cdt else stack.cast(b._h, cdt)
    if cdt.category == 1 and op in _INT_CHECKED:
        _check_int(op, a, b, stack, cdt)
    return Tensor._make(stack.binary(op, ha, hb), rdt, dev)


def binary_operator(op: str) -> Any:
    """``Tensor.__add__`` and the other forward binary dunders: ``binary(op, self, other)`` with the commonest case
    (another tensor of the same device and dtype, or a Python float with a floating tensor) decided in the dunder
    itself, without the rule lookup and one call frame (this is the path of every eager ``a + b``). The cases are
    learned from :func:`binary`'s own rules: a dtype takes the short path once ``binary`` has computed ``op`` on
    it in its own dtype without an integer check; every other call, and every error, goes through :func:`binary`.

    On that path, a stack with :attr:`~ember.backend.Backend.binary_kernels` (flex) gets small operands straight
    into its kernel, which checks the shapes itself (raising where they do not broadcast: the op then reruns
    through :func:`binary`, which raises the typed error); any other stack gets ``binary`` once the shapes are
    equal (different shapes go through :func:`binary`, which validates the broadcast)."""
    same: dict[DType, Any] = {}  # dtype -> result dtype, or _SLOW
    flt: dict[DType, Any] = {}

    def fwd(self: Tensor, other: Any) -> Tensor:
        if isinstance(other, Tensor):
            dev, d = self._device, self._dtype
            if other._device is dev and other._dtype is d:
                rd = same.get(d)
                if rd is None:
                    out = binary(op, self, other)  # raises for dtypes op refuses: nothing learned then
                    r = _same_cache[(op, d)]
                    same[d] = r[1] if r[0] is d and not (d.category == 1 and op in _INT_CHECKED) else _SLOW
                    return out
                if rd is not _SLOW:
                    stack = dev._stack or dev.stack  # read every call: ember.compile and capture swap it
                    ha, hb = self._h, other._h
                    kernels = stack.binary_kernels
                    if kernels is not None and 1 < ha.size < stack.binary_kernel_elems > hb.size:
                        try:
                            h = kernels[op](ha, hb)
                        except Exception:  # shapes that do not broadcast (or an op without kernel): checked path
                            return binary(op, self, other)
                    elif ha.shape == hb.shape:
                        h = stack.binary(op, ha, hb)
                    else:
                        return binary(op, self, other)
                    t = _new(Tensor)
                    t._h = h
                    t._dtype = rd
                    t._device = dev
                    return t
        elif type(other) is float:
            d = self._dtype
            rd = flt.get(d)
            if rd is None:
                out = binary(op, self, other)
                cdt, rdt = _rule(op, self, other)
                flt[d] = rdt if cdt is d and d.category == 2 else _SLOW
                return out
            if rd is not _SLOW:
                dev = self._device
                t = _new(Tensor)
                t._h = (dev._stack or dev.stack).binary(op, self._h, other)
                t._dtype = rd
                t._device = dev
                return t
        return binary(op, self, other)

    return fwd


def _check_scalar(op: str, v: Any, t: Tensor) -> Any:
    """A Python or numpy scalar operand of ``op`` with tensor ``t``, checked as PyTorch checks it."""
    if isinstance(v, _SCALAR_TYPES):
        if type(v) is int and not -(2**63) <= v < 2**63:
            dt.check_scalar_int(v, op)  # raises: no 64-bit scalar holds it (PyTorch refuses, numpy would wrap)
            if t._dtype is dt.bool_:
                # PyTorch makes an int in [2**63, 2**64) a uint64 scalar, which does not promote with bool
                raise DTypeError(
                    f"{op}: Promotion for uint16, uint32, uint64 types is not supported, attempted to promote "
                    f"bool ({_operand_desc(t)}) and uint64 (Python int {v})"
                )
        return v
    if isinstance(v, np.generic):
        return v.item()
    raise DTypeError(f"{op}: unsupported operand of type {type(v).__name__} (expected a Tensor or a Python number)")


_INT_CHECKED = frozenset({"pow", "floor_divide", "remainder", "fmod"})


def _check_int(op: str, a: Any, b: Any, stack: Any, cdt: DType | None = None) -> None:
    """Integer pow and division need a look at the operands: PyTorch raises where numpy silently returns 0."""
    if op == "pow":
        _check_int_pow(a, b)
        if cdt is not None and type(b) is int and not _INT_RANGE[cdt][0] <= b <= _INT_RANGE[cdt][1]:
            raise ValueRangeError(f"pow: exponent {b} cannot be converted to {cdt.name} without overflow")
        return
    if (isinstance(a, Tensor) and not a.numel()) or (isinstance(b, Tensor) and not b.numel()):
        return  # an empty result divides nothing (PyTorch computes it)
    if isinstance(b, Tensor):
        zero = stack.binary("eq", b._h, 0)
        if b.ndim:
            zero = stack.reduce("max", zero, tuple(range(b.ndim)), False)
        hit = bool(stack.to_numpy(zero))
    else:
        # the scalar as the kernel sees it: an int wraps to the compute dtype (2**63 is 0 in int16)
        hit = (b if cdt is None else _scalar_for(b, cdt)) == 0
    if hit:
        raise ValueRangeError(f"{op}: ZeroDivisionError: integer division by zero (divisor {_operand_desc(b)})")


def _check_int_pow(a: Any, b: Any) -> None:
    if not isinstance(b, Tensor) and b < 0:
        raise DTypeError("pow: integers to negative integer powers are not allowed")


def inplace_binary(op: str, a: Tensor, b: Any) -> Tensor:
    """a (op)= b in place, PyTorch rules: the result dtype must cast to a's dtype and shape must stay a's."""
    if isinstance(b, Tensor):
        if b._device is not a._device:
            raise DeviceError(f"{op}_: expected all tensors on the same device, got {a._device} and {b._device}")
        if b.shape != a.shape and broadcast_shapes(a.shape, b.shape, op=op + "_") != a.shape:
            raise ShapeError(
                f"{op}_: output with shape {a.shape} doesn't match the broadcast shape "
                f"{broadcast_shapes(a.shape, b.shape, op=op + '_')}"
            )
    else:
        b = _check_scalar(op + "_", b, a)
    cdt, rdt = _rule(op, a, b)
    if cdt.category == 1 and op in _INT_CHECKED:
        _check_int(op, a, b, a._device.stack, cdt)
    if not dt.can_cast(rdt, a._dtype):
        raise DTypeError(f"{op}_: result type {rdt.name} can't be cast to the desired output type {a._dtype.name}")
    _bump_version(a)
    stack = a._device.stack
    if cdt is a._dtype and rdt is a._dtype:
        hb = b._h if isinstance(b, Tensor) else (
            _scalar_for(b, cdt) if cdt.category != 3 else stack.full((), complex(b), cdt))
        if isinstance(b, Tensor) and b._dtype is not cdt:
            hb = stack.cast(hb, cdt)
        stack.inplace_binary(op, a._h, hb)
    else:
        r = binary(op, a, b)
        stack.assign(a._h, stack.cast(r._h, a._dtype) if r._dtype is not a._dtype else r._h)
    return a


def write_result(t: Tensor, h: Any, op: str) -> Tensor:
    """Make h (already of t's dtype and shape) the contents of t, for in-place ops computed out of place.

    The stack decides how (``Backend.write_back``): normally h is copied into t's memory, so views of t see it;
    a differentiable stack that tracks t rebinds t to h instead, so that what its graph saved stays valid.
    """
    t._h = t._device.stack.write_back(t._h, h, op)
    return t


def tracks_grad(stack: Any, *handles: Any) -> bool:
    """Whether an op on ``handles`` is recorded for gradients: a differentiable stack, grad mode on, and an
    operand that requires grad (Python scalars and None never do). Ops whose gradient PyTorch defines other than
    their primitive composition would (clamp, relu at a tie) take a differently composed path then."""
    if not stack.differentiable:
        return False
    from ..autograd import is_grad_enabled

    return is_grad_enabled() and any(
        h is not None and not isinstance(h, (bool, int, float)) and stack.requires_grad(h) for h in handles
    )


def keep_graph(stack: Any, out: Any, *inputs: Any) -> Any:
    """``out`` (a handle built without reading ``inputs``: an op whose input or output is empty skips its kernel)
    declared to depend on the inputs (Tensors, handles, Python scalars or None), so a differentiable stack gives
    them zero gradients of their own shapes -- empty for empty inputs -- as in PyTorch, not missing ones
    (``Backend.keep_graph``; every other stack returns ``out``)."""
    hs = [x._h if isinstance(x, Tensor) else x for x in inputs]
    return stack.keep_graph(out, [h for h in hs if h is not None and not isinstance(h, (bool, int, float))])


def _bump_version(t: Tensor) -> None:
    """Hook for version counters (autodiff's in-place checks); cheap no-op otherwise."""


# ---------------------------------------------------------------------------------------------------------------
# unary
# ---------------------------------------------------------------------------------------------------------------
_FLOAT_UNARY = opinfo.FLOAT_UNARY_OPS
_PRED_UNARY = opinfo.PREDICATE_UNARY_OPS
_INT_IDENTITY = frozenset("floor ceil round trunc".split())


#: the unary ops whose result on a floating tensor is not a tensor of its dtype (predicates) or an error
_FLOAT_NOT_SAME = _PRED_UNARY | {"bitwise_not"}


def unary(op: str, x: Tensor) -> Tensor:
    """Apply a unary elementwise op (PyTorch's dtype rules: integer inputs of float ops compute in the default
    float dtype, predicates give bool, complex inputs only PyTorch's subset)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    d = x._dtype
    dev = x._device
    stack = dev._stack or dev.stack
    h = x._h
    if d.category == 2 and op not in _FLOAT_NOT_SAME:  # hot path: a floating tensor keeps its dtype
        t = _new(Tensor)  # Tensor._make inlined (one frame less on every activation)
        t._h = stack.unary(op, h)
        t._dtype = d
        t._device = dev
        return t
    if d.category == 3:  # complex: PyTorch's subset; abs has a real result (and its own gradient)
        if op not in COMPLEX_UNARY:
            raise complex_unsupported(op, d)
        if op == "abs":
            from .complex import abs_complex

            return abs_complex(x)
        return Tensor._make(stack.unary(op, h), dt.bool_ if op in _PRED_UNARY else d, x._device)
    if op in _FLOAT_UNARY:
        if not d.is_floating_point:
            d = x._device.default_dtype
            h = stack.cast(h, d)
        return Tensor._make(stack.unary(op, h), d, x._device)
    if op in _PRED_UNARY:
        if not d.is_floating_point and op not in ("logical_not", "signbit"):
            # integers are never nan/inf
            val = op == "isfinite"
            return Tensor._make(stack.full(x.shape, val, dt.bool_), dt.bool_, x._device)
        return Tensor._make(stack.unary(op, h), dt.bool_, x._device)
    if (op in _INT_IDENTITY and not d.is_floating_point) or (op == "sign" and d is dt.bool_):
        return Tensor._make(stack.copy(h), d, x._device)
    if op == "bitwise_not" and d.is_floating_point:
        raise DTypeError(f"bitwise_not: not implemented for {d.name} (integer or bool tensors only)")
    if op == "neg" and d is dt.bool_:
        raise DTypeError("neg: negation, the `-` operator, on a bool tensor is not supported; use ~ or logical_not")
    if op == "abs" and d is dt.bool_:
        raise DTypeError("abs: not supported for bool tensors")
    return Tensor._make(stack.unary(op, h), d, x._device)
