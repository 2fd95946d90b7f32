"""Named elementwise functions (``ember.exp``, ``ember.add(a, b, alpha=2)``, ``clamp``, ``where``, ...)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes as dt
from .. import opinfo as _opinfo
from ..dtypes import convert_scalar
from ..errors import DeviceError, DTypeError, ShapeError, UnsupportedError, ValueRangeError
from ..shapes import broadcast_shapes
from ..tensor import Tensor
from .elementwise import binary, inplace_binary, unary, write_result
from .nn import activation

#: the elementwise ops whose front door lives in this module, from the op registry (ember.opinfo)
_OPS = tuple(_opinfo.select(module=__name__))


def _make_unary(op: str) -> Any:
    def f(input: Tensor) -> Tensor:
        return unary(op, input)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"Elementwise ``{op}`` (PyTorch's ``torch.{op}``)."
    return f


def _make_binary(op: str) -> Any:
    def f(input: Any, other: Any) -> Tensor:
        if not isinstance(input, Tensor) and not isinstance(other, Tensor):
            raise DTypeError(f"{op}: expected at least one Tensor operand, got {type(input).__name__} and "
                             f"{type(other).__name__}")
        return binary(op, input, other)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"Elementwise ``{op}`` with broadcasting and PyTorch's type promotion."
    return f


def _make_inplace_unary(op: str) -> Any:
    def f(self: Tensor) -> Tensor:
        r = unary(op, self)
        if r._dtype is not self._dtype:
            raise DTypeError(f"{op}_: result type {r._dtype.name} can't be cast to {self._dtype.name} in place")
        return write_result(self, r._h, op + "_")

    f.__name__ = f.__qualname__ = op + "_"
    return f


def _make_inplace_binary(op: str) -> Any:
    def f(self: Tensor, other: Any) -> Tensor:
        return inplace_binary(op, self, other)

    f.__name__ = f.__qualname__ = op + "_"
    return f


# the front doors of the primitives without extra arguments, and their aliases (``arcsin`` is ``asin``), generated
# from their registry entries; the hand-written ones (``custom``: add, sub, div, round) are defined below
_g = globals()
for _info in _OPS:
    if _info.kind == "primitive" and not _info.custom:
        _g[_info.name] = (_make_unary if _info.arity == 1 else _make_binary)(_info.name)


def _scaled(op: str, input: Any, other: Any, alpha: Any) -> Any:
    """alpha * other for add/sub, with PyTorch's checks of alpha against the result dtype: a bool alpha only for
    a bool result, a float alpha not for an integral one."""
    if type(alpha) is int and alpha == 1:  # the common case: no checks, no multiply
        return other
    if isinstance(alpha, np.generic):
        alpha = alpha.item()
    if not isinstance(alpha, (bool, int, float)):
        raise DTypeError(f"{op}: alpha must be a Python number, got {type(alpha).__name__} {alpha!r}")
    rdt = dt.result_type(input, other)
    if type(alpha) is bool and rdt is not dt.bool_:
        raise DTypeError(f"{op}: Boolean alpha only supported for Boolean results (alpha={alpha}, result "
                         f"dtype {rdt.name})")
    if type(alpha) is float and not rdt.is_floating_point:
        raise DTypeError(f"{op}: For integral input tensors, argument alpha must not be a floating point number "
                         f"(alpha={alpha}, result dtype {rdt.name})")
    if alpha == 1:
        return other
    dt.check_scalar_int(alpha, op)
    return binary("mul", other, alpha) if isinstance(other, Tensor) else other * alpha


def add(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    """input + alpha * other."""
    if type(alpha) is not int or alpha != 1:  # the common alpha=1 costs no call
        other = _scaled("add", input, other, alpha)
    return binary("add", input, other)


def sub(input: Any, other: Any, *, alpha: Any = 1) -> Tensor:
    """input - alpha * other."""
    if type(alpha) is not int or alpha != 1:  # the common alpha=1 costs no call
        other = _scaled("sub", input, other, alpha)
    return binary("sub", input, other)



def rsub(input: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return sub(other, input, alpha=alpha)


def div_(self: Tensor, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    r = div(self, other, rounding_mode=rounding_mode)
    if r.shape != self.shape:
        raise ShapeError(f"div_: output with shape {self.shape} doesn't match the broadcast shape {r.shape}")
    if r._dtype is not self._dtype and not dt.can_cast(r._dtype, self._dtype):
        raise DTypeError(f"div_: result type {r._dtype.name} can't be cast to {self._dtype.name}")
    return write_result(self, r._h if r._dtype is self._dtype else self._device.stack.cast(r._h, self._dtype), "div_")


def div(input: Any, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    """``torch.div`` with rounding_mode None (true division), 'trunc' or 'floor'."""
    if rounding_mode is None:
        return binary("div", input, other)
    if rounding_mode == "floor":
        return binary("floor_divide", input, other)
    if rounding_mode == "trunc":
        if not dt.result_type(input, other).is_floating_point:
            from .elementwise import _check_int

            _check_int("div", input, other, (input if isinstance(input, Tensor) else other)._device.stack)
        q = binary("div", input, other)
        r = unary("trunc", q)
        promoted = dt.result_type(input, other)
        return r if promoted.is_floating_point else r.to(promoted)
    raise ValueRangeError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def round(input: Tensor, decimals: int = 0) -> Tensor:  # noqa: A001 - PyTorch's name
    """Round half to even; with decimals, round to that many decimal places."""
    if decimals == 0:
        return unary("round", input)
    if not input._dtype.is_floating_point:
        return input.clone()
    s = 10.0 ** decimals
    return binary("div", unary("round", binary("mul", input, s)), s)


def square(input: Tensor) -> Tensor:
    """input * input; a bool tensor squares as int64, as in PyTorch (pow(bool, 2))."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"square: expected a Tensor, got {type(input).__name__} {input!r}")
    if input._dtype is dt.bool_:
        input = input.to(dt.int64)
    return binary("mul", input, input)


def frac(input: Tensor) -> Tensor:
    """input - trunc(input), the fractional part with input's sign; floating dtypes only, as in PyTorch."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"frac: expected a Tensor, got {type(input).__name__} {input!r}")
    if not input._dtype.is_floating_point:
        raise DTypeError(f"frac: not implemented for {input._dtype.name} (Tensor{tuple(input.shape)}); "
                         "floating point tensors only")
    return binary("sub", input, unary("trunc", input))



def relu(input: Tensor) -> Tensor:
    """max(input, 0), NaN propagates (``torch.relu``; the same op as ``nn.functional.relu``); bool is refused."""
    _check_relu(input, "relu")
    return activation("relu", input)


def relu_(self: Tensor) -> Tensor:
    """relu in place."""
    _check_relu(self, "relu_")
    return activation("relu", self, inplace=True)


def _check_relu(x: Any, op: str) -> None:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__} {x!r}")
    if x._dtype.is_bool:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    if x._dtype.is_complex:
        raise DTypeError(f"{op}: not supported for complex dtype {x._dtype.name} (clamp is not supported for complex "
                         "types, as in PyTorch)")


def positive(input: Tensor) -> Tensor:
    """input itself (PyTorch's unary ``+``), refused for bool tensors and non-tensors as in PyTorch."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"positive: argument 'input' must be a Tensor, got {type(input).__name__} {input!r}")
    if input._dtype is dt.bool_:
        raise DTypeError(f"positive: the `+` operator, on a bool tensor (Tensor{tuple(input.shape)}:bool) is not "
                         "supported; use logical ops on masks")
    return input


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - PyTorch's names
    """Limit values to [min, max]; either bound may be a scalar or a tensor; NaN (in input or a bound)
    propagates; the result has the promoted dtype of input and bounds (a bool input with int bounds gives int64).

    Gradients follow PyTorch: input gets it where min <= input <= max (inclusive, never at NaN), a tensor min
    where input < min < max, a tensor max where input > max or max < min."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"clamp: expected a Tensor, got {type(input).__name__}")
    if min is None and max is None:
        raise ValueRangeError("clamp: at least one of 'min' or 'max' must not be None")
    if input._dtype.is_complex or any(isinstance(v, complex) or (isinstance(v, Tensor) and v._dtype.is_complex)
                                      for v in (min, max)):
        raise DTypeError(f"clamp: not supported for complex types (input {input._dtype.name}; complex numbers have "
                         "no order), as in PyTorch")
    if min is not None and max is not None and isinstance(min, Tensor) is not isinstance(max, Tensor):
        # PyTorch has (Number?, Number?) and (Tensor?, Tensor?) overloads: a 0-d tensor beside a number passes
        # as a number there (its value, promoting as a number, no gradient), as here. A dimensioned tensor beside
        # a number, which PyTorch refuses, is an ember extension (numpy's clip takes it): the number bound acts as
        # a scalar operand of the same op
        t = min if isinstance(min, Tensor) else max
        if not t.ndim:
            if t is min:
                min = t.item()  # noqa: A001
            else:
                max = t.item()  # noqa: A001
    bounds = [b for b in (min, max) if b is not None]
    for b in bounds:
        if not isinstance(b, Tensor) and not isinstance(b, (bool, int, float, np.generic)):
            raise DTypeError(f"clamp: bounds must be numbers or Tensors, got {type(b).__name__} {b!r}")
        if isinstance(b, Tensor) and b._device is not input._device:
            raise DeviceError(f"clamp: expected all tensors on the same device, got {input._device} and {b._device}")
    rdt = dt.result_type(input, *bounds)
    # PyTorch's bool kernels: only one bound, a tensor (clamp_min/clamp_max through maximum/minimum)
    if rdt is dt.bool_ and not (len(bounds) == 1 and isinstance(bounds[0], Tensor)):
        raise UnsupportedError(
            f"clamp: not implemented for bool (input {input._dtype.name}, bounds "
            f"{', '.join(b._dtype.name if isinstance(b, Tensor) else type(b).__name__ for b in bounds)}); "
            "cast to an integer dtype first"
        )
    dev = input._device
    stack = dev.stack
    shape = input.shape
    for b in bounds:
        if isinstance(b, Tensor):
            shape = broadcast_shapes(shape, b.shape, op="clamp")

    def operand(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, Tensor):
            return v._h if v._dtype is rdt else stack.cast(v._h, rdt)
        return convert_scalar(v, rdt, "clamp")  # PyTorch refuses bounds the dtype cannot hold

    # the stack clamps (Backend.clamp): a differentiable stack routes each operand's gradient as PyTorch does
    h = stack.clamp(operand(input), operand(min), operand(max))
    if tuple(h.shape) != shape:
        h = stack.expand(h, shape)
    return Tensor._make(h, rdt, dev)


def _write_inplace(self: Tensor, r: Tensor, op: str) -> Tensor:
    """Store r, an op's out-of-place result, into self as PyTorch's in-place twin does: r's dtype must cast to
    self's (PyTorch's can_cast) and r's shape must be self's (no broadcasting of the target)."""
    if r._dtype is not self._dtype and not dt.can_cast(r._dtype, self._dtype):
        raise DTypeError(f"{op}: result type {r._dtype.name} can't be cast to the desired output type "
                         f"{self._dtype.name}")
    if r.shape != self.shape:
        raise ShapeError(f"{op}: output with shape {self.shape} doesn't match the broadcast shape {r.shape}")
    return write_result(self, r._h if r._dtype is self._dtype else self._device.stack.cast(r._h, self._dtype), op)


def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    return _write_inplace(self, clamp(self, min, max), "clamp_")


def lerp_(self: Tensor, end: Tensor, weight: Any) -> Tensor:
    """lerp in place."""
    return _write_inplace(self, lerp(self, end, weight), "lerp_")


def _addc(op: str, input: Tensor, tensor1: Tensor, tensor2: Tensor, value: Any) -> Tensor:
    """input + value * (tensor1 op tensor2) in the three tensors' promoted dtype; value is cast to it (PyTorch
    truncates a float value for integer tensors)."""
    for name, t in (("input", input), ("tensor1", tensor1), ("tensor2", tensor2)):
        if not isinstance(t, Tensor):
            raise DTypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__} {t!r}")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DTypeError(f"{op}: value must be a number, got {type(value).__name__} {value!r}")
    kind = "div" if op == "addcdiv" else "mul"
    if kind == "div" and not (tensor1._dtype.is_floating_point or tensor2._dtype.is_floating_point):
        raise DTypeError(f"{op}: integer division of tensor1 ({tensor1._dtype.name}) by tensor2 "
                         f"({tensor2._dtype.name}) is not supported, as in PyTorch; cast one to a floating dtype")
    rd = dt.result_type(input, tensor1, tensor2)
    if rd is dt.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    if not rd.is_floating_point:
        value = int(value)
    t1 = tensor1.to(rd)
    if value != 1:  # PyTorch's order, value * tensor1 first: the same rounding
        t1 = binary("mul", t1, value)
    return binary("add", input.to(rd), binary(kind, t1, tensor2.to(rd)))


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    """``input + value * tensor1 * tensor2`` (``torch.addcmul``), broadcast, in the promoted dtype; bool refused."""
    return _addc("addcmul", input, tensor1, tensor2, value)


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    """``input + value * tensor1 / tensor2`` (``torch.addcdiv``); tensor1 or tensor2 must be floating, as in
    PyTorch."""
    return _addc("addcdiv", input, tensor1, tensor2, value)


def addcmul_(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    """addcmul in place (optimizers' ``exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)``)."""
    return _write_inplace(self, addcmul(self, tensor1, tensor2, value=value), "addcmul_")


def addcdiv_(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    """addcdiv in place (``p.addcdiv_(exp_avg, denom, value=-lr)``)."""
    return _write_inplace(self, addcdiv(self, tensor1, tensor2, value=value), "addcdiv_")


def clamp_min(input: Tensor, min: Any) -> Tensor:  # noqa: A002
    return clamp(input, min=min)


def clamp_max(input: Tensor, max: Any) -> Tensor:  # noqa: A002
    return clamp(input, max=max)


def where(condition: Tensor, input: Any = None, other: Any = None) -> Any:
    """Elements of input where condition holds, else of other (both broadcast); ``where(cond)`` is nonzero."""
    if input is None and other is None:
        from .indexing import nonzero

        return nonzero(condition, as_tuple=True)
    if not isinstance(condition, Tensor):
        raise DTypeError(f"where: condition must be a Tensor, got {type(condition).__name__}")
    if condition._dtype is not dt.bool_:
        raise DTypeError(f"where: expected condition to be a bool tensor, got {condition._dtype.name}")
    dev = condition._device
    shape = condition.shape
    for v in (input, other):
        if isinstance(v, Tensor):
            if v._device is not dev:
                raise DeviceError(f"where: expected all tensors on the same device, got {dev} and {v._device}")
            shape = broadcast_shapes(shape, v.shape, op="where")
    cands = [v for v in (input, other) if isinstance(v, Tensor)] or [input, other]
    rdt = dt.result_type(*(v for v in (input, other)))
    del cands
    stack = dev.stack
    ha = input._h if isinstance(input, Tensor) else convert_scalar(input, rdt, "where")
    hb = other._h if isinstance(other, Tensor) else convert_scalar(other, rdt, "where")
    if isinstance(input, Tensor) and input._dtype is not rdt:
        ha = stack.cast(ha, rdt)
    if isinstance(other, Tensor) and other._dtype is not rdt:
        hb = stack.cast(hb, rdt)
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        ha = stack.full((), ha, rdt)
    if rdt.is_complex:  # the contract's scalars are bool/int/float: a complex one travels as a 0-d handle
        ha = stack.full((), ha, rdt) if isinstance(ha, complex) else ha
        hb = stack.full((), hb, rdt) if isinstance(hb, complex) else hb
    h = stack.where(condition._h, ha, hb)
    if tuple(h.shape) != shape:
        h = stack.expand(h, shape)
    return Tensor._make(h, rdt, dev)


def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """Replace NaN with nan, +inf with posinf (default: dtype max), -inf with neginf (default: dtype min)."""
    if not input._dtype.is_floating_point:
        return input.clone()
    nan = 0.0 if nan is None else nan  # PyTorch takes None for the default
    info = np.finfo(input._dtype.numpy)
    posinf = float(info.max) if posinf is None else posinf
    neginf = float(info.min) if neginf is None else neginf
    out = where(unary("isnan", input), nan, input)
    out = where(unary("isposinf", out), posinf, out)
    return where(unary("isneginf", out), neginf, out)


def lerp(input: Tensor, end: Tensor, weight: Any) -> Tensor:
    """``input + weight * (end - input)``, computed as PyTorch does: from ``end`` backwards where
    ``abs(weight) >= 0.5``, so ``lerp(-inf, 0, 0.5)`` is -inf, not NaN. ``end`` (and a tensor weight) must have
    input's floating dtype."""
    if not isinstance(input, Tensor) or not isinstance(end, Tensor):
        raise DTypeError(f"lerp: input and end must be Tensors, got {type(input).__name__} and "
                         f"{type(end).__name__}")
    d = input._dtype
    if end._dtype is not d:
        raise DTypeError(f"lerp: expected dtype {d.name} for `end` but got dtype {end._dtype.name}")
    if isinstance(weight, Tensor) and weight._dtype is not d and not weight.ndim:
        # a 0-d weight of another dtype promotes as a 0-d operand (it decides only when all three are 0-d)
        rd = dt.result_type(input, end, weight)
        if rd is not d:
            input, end, d = input.to(rd), end.to(rd), rd
        weight = weight.to(d)
    if isinstance(weight, Tensor):
        if weight._dtype is not d:
            raise DTypeError(f"lerp: expected dtype {d.name} for `weight` but got dtype {weight._dtype.name}")
    elif isinstance(weight, np.generic):
        weight = weight.item()
    elif not isinstance(weight, (bool, int, float)):
        raise DTypeError(f"lerp: weight must be a Tensor or a number, got {type(weight).__name__}")
    if not d.is_floating_point:
        raise DTypeError(f"lerp: not implemented for {d.name} (floating point tensors only)")
    diff = binary("sub", end, input)
    if not isinstance(weight, Tensor):
        if -0.5 < weight < 0.5:  # (the module-level abs is ember's)
            return binary("add", input, binary("mul", diff, weight))
        return binary("sub", end, binary("mul", diff, 1 - weight))
    # PyTorch's two branches as one expression, base + coef * diff with (base, coef) = (input, w) or (end, w - 1):
    # the wheres select before the multiply, so a masked-out branch adds no 0 * inf NaN to the gradients
    small = binary("lt", unary("abs", weight), 0.5)
    coef = where(small, weight, binary("sub", weight, 1))
    return binary("add", where(small, input, end), binary("mul", coef, diff))


def xlogy(input: Any, other: Any) -> Tensor:
    """input * log(other), 0 where input == 0 unless other is NaN (PyTorch)."""
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise DTypeError(f"xlogy: expected at least one Tensor operand, got {type(input).__name__} and "
                         f"{type(other).__name__}")
    rdt = dt.result_type(input, other)
    if not rdt.is_floating_point:
        rdt = (input if isinstance(input, Tensor) else other)._device.default_dtype
    # both operands in the result dtype first, so log(uint8) of a float16 xlogy stays float16, as in PyTorch
    if not isinstance(other, Tensor):
        # a number other: its log is a number too, of the value in the result dtype (2**63 is inf in float16)
        if isinstance(other, np.generic):
            other = other.item()
        if not isinstance(other, (bool, int, float)):
            raise DTypeError(f"xlogy: unsupported operand of type {type(other).__name__}")
        dt.check_scalar_int(other, "xlogy")
        with np.errstate(over="ignore"):  # a value past the dtype's range is inf there, as in PyTorch
            y = float(np.asarray(other, dtype=rdt.numpy))
        if y == math.inf or y != y:
            ly = y
        else:
            ly = math.log(y) if y > 0 else -math.inf if y == 0 else math.nan
        if isinstance(input, Tensor) and input._dtype is not rdt:
            input = input.to(rdt)
        prod = binary("mul", input, ly)
        return prod if math.isfinite(ly) or y != y else where(binary("eq", input, 0), 0.0, prod)
    if other._dtype is not rdt:
        other = other.to(rdt)
    if isinstance(input, Tensor) and input._dtype is not rdt:
        input = input.to(rdt)
    # x == 0 gives 0 for every y but NaN (log(y) = -inf, NaN for y < 0, +inf): there y is replaced by 1, so value
    # and gradients are 0 (no 0 * inf or 0 / 0 in backward) while the gradient of x stays log(y) at x == 0 for a
    # finite positive y, as PyTorch's
    bad_log = binary("logical_or", binary("le", other, 0), unary("isposinf", other))
    if not isinstance(input, Tensor):
        if input != 0:
            return binary("mul", input, unary("log", other))
        zero = bad_log
    else:
        zero = binary("logical_and", binary("eq", input, 0), bad_log)
    return binary("mul", input, unary("log", where(zero, 1.0, other)))


def full_like(x: Tensor, value: Any, dtype: Any) -> Tensor:
    from .creation import full_like as _full_like

    return _full_like(x, value, dtype=dtype)


def _desc(x: Any) -> str:
    return f"Tensor{tuple(x.shape)}:{x._dtype.name}" if isinstance(x, Tensor) else f"{type(x).__name__} {x!r}"


def logaddexp(input: Tensor, other: Tensor) -> Tensor:
    """log(exp(input) + exp(other)), computed stably in the promoted floating dtype (a bool or integer operand beside
    a floating one is cast first, as PyTorch's kernel sees it); integer and bool results are refused, as in PyTorch."""
    rdt = dt.result_type(input, other)
    if not rdt.is_floating_point:  # PyTorch has no integer or bool kernel (exp would leave the dtype)
        raise DTypeError(f"logaddexp: not implemented for {rdt.name} (operands {_desc(input)}, {_desc(other)}); "
                         "floating point operands only")
    if isinstance(input, Tensor) and input._dtype is not rdt:
        input = input.to(rdt)
    if isinstance(other, Tensor) and other._dtype is not rdt:
        other = other.to(rdt)
    m = binary("maximum", input, other)
    m = where(unary("isfinite", m), m, 0.0)
    return binary("add", m, unary("log", binary("add", unary("exp", binary("sub", input, m)),
                                                   unary("exp", binary("sub", other, m)))))


def isclose(input: Tensor, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """``abs(input - other) <= atol + rtol * abs(other)`` (or equal); both Tensors of one dtype, as in PyTorch;
    bool tensors compare for equality."""
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        raise DTypeError(f"isclose: expected Tensors for input and other, got {type(input).__name__} and "
                         f"{type(other).__name__}")
    if other._dtype is not input._dtype:
        raise DTypeError(f"isclose: {input._dtype.name} did not match {other._dtype.name} (input "
                         f"Tensor{tuple(input.shape)}, other Tensor{tuple(other.shape)}); cast one first")
    if input._dtype is dt.bool_:
        return binary("eq", input, other)
    diff = unary("abs", binary("sub", input, other))
    tol = binary("add", binary("mul", unary("abs", other), rtol), atol)
    # an infinite difference is never within tolerance (inf vs -inf), only exact equality is
    within = binary("logical_and", unary("isfinite", diff), binary("le", diff, tol))
    close = binary("logical_or", binary("eq", input, other), within)
    if equal_nan:
        both = binary("logical_and", unary("isnan", input),
                      unary("isnan", other))
        close = binary("logical_or", close, both)
    return close


def allclose(input: Tensor, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return bool(isclose(input, other, rtol, atol, equal_nan).numpy().all())


def equal(input: Tensor, other: Tensor) -> bool:
    """True when both tensors have the same shape and elements."""
    return input.shape == other.shape and bool(binary("eq", input, other).numpy().all())


# in-place twins whose out-of-place op takes extra arguments (alpha, rounding_mode, bounds)
_INPLACE_CUSTOM: dict[str, Any] = {
    "lerp_": lerp_,
    "addcmul_": addcmul_,
    "addcdiv_": addcdiv_,
    "relu_": relu_,
    "add_": lambda self, other, *, alpha=1: inplace_binary("add", self, _scaled("add_", self, other, alpha)),
    "sub_": lambda self, other, *, alpha=1: inplace_binary("sub", self, _scaled("sub_", self, other, alpha)),
    "div_": div_,
    "clamp_": clamp_,
    "clip_": clamp_,
}


def _tensor_methods() -> dict[str, Any]:
    """Every registry entry's Tensor methods: the function for its name and aliases, the in-place twin for
    ``<name>_`` (generated unless the op takes extra arguments)."""
    methods: dict[str, Any] = {}
    for info in _OPS:
        fn = _g[info.name]
        for m in info.methods:
            if m in _INPLACE_CUSTOM:
                methods[m] = _INPLACE_CUSTOM[m]
            elif m == info.name + "_":
                methods[m] = (_make_inplace_unary if info.arity == 1 else _make_inplace_binary)(info.name)
            else:
                methods[m] = fn
    # Tensor.where(condition, other) puts self in the middle of where(condition, input, other)
    methods["where"] = lambda self, condition, other: where(condition, self, other)
    return methods


for _info in _OPS:
    for _alias in _info.aliases:
        _g[_alias] = _g[_info.name]
TENSOR_METHODS: dict[str, Any] = _tensor_methods()
__all__ = [fn for info in _OPS for fn in info.functions]
