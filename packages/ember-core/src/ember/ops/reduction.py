"""Reductions, scans, sorting and norms with PyTorch's names and semantics.

Every function validates its arguments (dims, dtypes, empty reductions) and then calls the device's stack:
``reduce``, ``argreduce``, ``cumulative``, ``sort``, ``topk``, ``logsumexp`` and elementwise primitives. NaN
behaves as in PyTorch: max/min/amax/amin propagate it, argmax/argmin pick it, sort puts it last (first when
descending), median and kthvalue treat it as the largest value.
"""

from __future__ import annotations

import builtins
import math
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from .. import dtypes as dt
from ..autograd import no_grad
from ..dtypes import DType
from ..errors import DimError, DTypeError, ShapeError, UnsupportedError, ValueRangeError
from ..shapes import norm_dim, norm_dims
from ..tensor import Tensor
from .elementwise import binary

Shape = tuple[int, ...]

_HALF = (dt.float16, dt.bfloat16)


# ------------------------------------------------------------------------------------------------------------
# result types (torch.return_types)
# ------------------------------------------------------------------------------------------------------------
def _values_indices(name: str) -> type:
    # functional form: the eight types differ only in name
    t = NamedTuple(name, [("values", Tensor), ("indices", Tensor)])  # noqa: UP014
    # pickle finds the type as ember.ops.reduction.return_types.<name>
    t.__qualname__ = f"return_types.{name}"
    t.__module__ = __name__
    return t


class _AMinMax(NamedTuple):
    """The result of :func:`aminmax`."""

    min: Tensor
    max: Tensor


_AMinMax.__qualname__ = "return_types.aminmax"

#: named result tuples with ``.values`` / ``.indices`` (PyTorch's ``torch.return_types``)
return_types = SimpleNamespace(
    **{n: _values_indices(n) for n in ("max", "min", "sort", "topk", "kthvalue", "median", "cummax",
                                       "cummin")},
    aminmax=_AMinMax,
)


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------
def _check(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor as input, got {type(x).__name__}")
    return x


def _dims(x: Tensor, dim: Any, op: str) -> tuple[int, ...]:
    """Normalised reduction dims; None and an empty list mean every dim (PyTorch)."""
    nd = len(x._h.shape)
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(nd))
    if isinstance(dim, (int, np.integer)):
        # norm_dim validates too for 0-d tensors (norm_dims skips the check there)
        d = norm_dim(dim, nd, op)
        return (d,) if nd else ()
    if not isinstance(dim, (list, tuple)):
        raise DimError(f"{op}: dim must be an int or a tuple of ints, got {type(dim).__name__} {dim!r}")
    return norm_dims(dim, nd, op)


def _check_keepdim(keepdim: Any, op: str) -> None:
    """PyTorch takes only a bool keepdim (a str or int is a TypeError there, not a truthy value)."""
    if type(keepdim) is not bool and not isinstance(keepdim, np.bool_):
        raise DTypeError(f"{op}(): argument 'keepdim' must be bool, not {type(keepdim).__name__}")


def _out_shape(shape: Shape, dims: tuple[int, ...], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _count(shape: Shape, dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= shape[d]
    return n


def _dtype_arg(dtype: Any, op: str) -> DType | None:
    return None if dtype is None else dt.as_dtype(dtype)


def _nonempty(x: Tensor, dims: tuple[int, ...], op: str, full: bool) -> None:
    """Reductions without an identity (max, min, argmax ...) reject zero-size reduced dims as PyTorch does."""
    shape = x._h.shape
    if full and x.numel() == 0:
        raise ShapeError(
            f"{op}(): Expected reduction dim to be specified for input.numel() == 0 (input of shape "
            f"{tuple(shape)}). Specify the reduction dim with the 'dim' argument."
        )
    for d in dims:
        if shape[d] == 0:
            raise ShapeError(
                f"{op}(): Expected reduction dim {d} to have non-zero size (input of shape {tuple(shape)})"
            )


def _reduce(stack: Any, op: str, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
    # a 0-d tensor has nothing to reduce; the backend contract wants non-empty dims
    return stack.reduce(op, h, dims, keepdim) if dims else stack.copy(h)


def _as_1d(stack: Any, h: Any) -> Any:
    """View a 0-d handle as shape (1,) so that dim 0 exists for the backend (PyTorch accepts dim 0/-1)."""
    return stack.reshape(h, (1,))


# ------------------------------------------------------------------------------------------------------------
# sum, prod, mean
# ------------------------------------------------------------------------------------------------------------
def _acc_dtype(d: DType) -> DType:
    """The dtype sum/prod produce without dtype=: integers and bool widen to int64."""
    return dt.int64 if d.category < 2 else d


def _sum_like(op: str, x: Tensor, dim: Any, keepdim: bool, dtype: Any, name: str) -> Tensor:
    _check(x, name)
    dims = _dims(x, dim, name)
    out = _dtype_arg(dtype, name) or _acc_dtype(x._dtype)
    stack = x._device.stack
    h = x._h
    # half types accumulate in float32 (as PyTorch does) for accuracy
    cdt = dt.float32 if out in _HALF else out
    if x._dtype is not cdt:
        h = stack.cast(h, cdt)
    r = _reduce(stack, op, h, dims, keepdim)
    if cdt is not out:
        r = stack.cast(r, out)
    return Tensor._make(r, out, x._device)


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:  # noqa: A001
    """Sum over dim (None: all); integer and bool inputs give int64."""
    return _sum_like("sum", input, dim, keepdim, dtype, "sum")


def prod(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Product over dim (None: all); integer and bool inputs give int64; the empty product is 1."""
    return _sum_like("prod", input, dim, keepdim, dtype, "prod")


def _float_input(x: Tensor, dtype: Any, op: str) -> DType:
    """The result dtype of a float-only reduction (mean, var, ...): dtype= or the input's (must be float)."""
    if dtype is not None:
        d = dt.as_dtype(dtype)
        if not (d.is_floating_point or d.is_complex):
            raise DTypeError(
                f"{op}(): could not infer output dtype. Optional dtype must be either a floating point or "
                f"complex dtype. Got: {d.name}"
            )
        return d
    if not (x._dtype.is_floating_point or x._dtype.is_complex):
        raise DTypeError(
            f"{op}(): could not infer output dtype. Input dtype must be either a floating point or complex "
            f"dtype. Got: {x._dtype.name} (pass dtype=ember.float32 or cast first)"
        )
    return x._dtype


def _mean_of(stack: Any, h: Any, dims: tuple[int, ...], keepdim: bool, n: int) -> Any:
    s = _reduce(stack, "sum", h, dims, keepdim)
    # 0/0 gives nan for an empty reduction, as in PyTorch
    return stack.binary("div", s, builtins.float(n)) if n != 1 else s


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Arithmetic mean over dim; floating inputs only (or pass dtype=); the mean of nothing is nan."""
    x = _check(input, "mean")
    out = _float_input(x, dtype, "mean")
    dims = _dims(x, dim, "mean")
    stack = x._device.stack
    cdt = dt.float32 if out in _HALF else out
    h = x._h if x._dtype is cdt else stack.cast(x._h, cdt)
    r = _mean_of(stack, h, dims, keepdim, _count(x._h.shape, dims))
    if cdt is not out:
        r = stack.cast(r, out)
    return Tensor._make(r, out, x._device)


def _zero_nan(x: Tensor, h: Any) -> Any:
    stack = x._device.stack
    return stack.where(stack.unary("isnan", h), 0, h) if x._dtype.is_floating_point else h


def nansum(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Sum treating NaN as zero."""
    x = _check(input, "nansum")
    clean = Tensor._make(_zero_nan(x, x._h), x._dtype, x._device)
    return _sum_like("sum", clean, dim, keepdim, dtype, "nansum")


def nanmean(input: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    """Mean of the non-NaN elements (nan where there are none)."""
    x = _check(input, "nanmean")
    if not x._dtype.is_floating_point:
        raise DTypeError(
            f"nanmean(): expected input to have floating point or complex dtype but got {x._dtype.name}"
        )
    out = _float_input(x, dtype, "nanmean")
    dims = _dims(x, dim, "nanmean")
    stack = x._device.stack
    cdt = dt.float32 if out in _HALF else out
    h = x._h if x._dtype is cdt else stack.cast(x._h, cdt)
    keep = stack.cast(stack.unary("logical_not", stack.unary("isnan", h)), cdt)
    s = _reduce(stack, "sum", stack.where(stack.unary("isnan", h), 0, h), dims, keepdim)
    r = stack.binary("div", s, _reduce(stack, "sum", keep, dims, keepdim))
    if cdt is not out:
        r = stack.cast(r, out)
    return Tensor._make(r, out, x._device)


# ------------------------------------------------------------------------------------------------------------
# max, min and friends
# ------------------------------------------------------------------------------------------------------------
def _all_dims(dim: Any) -> bool:
    return dim is None or (isinstance(dim, (list, tuple)) and not dim)


def _extreme(op: str, x: Tensor, dim: Any, keepdim: bool, name: str) -> Tensor:
    shape = x._h.shape
    if (keepdim is False and (dim is None or (type(dim) is tuple and not dim)) and shape and 0 not in shape
            and not x._dtype.is_complex):
        # the common call (x.amax(), x.max()): every dim of a non-empty real tensor, nothing to normalise or reject
        return Tensor._make(x._device.stack.reduce(op, x._h, tuple(range(len(shape))), False), x._dtype, x._device)
    _check_keepdim(keepdim, name)
    _no_complex(x, name)
    keepdim = bool(keepdim)
    dims = _dims(x, dim, name)
    _nonempty(x, dims, name, _all_dims(dim))
    h = _reduce(x._device.stack, op, x._h, dims, keepdim)
    return Tensor._make(h, x._dtype, x._device)


def amax(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """Maximum over dim (an int or tuple; () or None: all); NaN propagates."""
    return _extreme("max", _check(input, "amax"), dim, keepdim, "amax")


def amin(input: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """Minimum over dim (an int or tuple; () or None: all); NaN propagates."""
    return _extreme("min", _check(input, "amin"), dim, keepdim, "amin")


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False) -> Any:
    """(min, max) over dim (None: all) in one call."""
    x = _check(input, "aminmax")
    _no_complex(x, "aminmax")
    if dim is not None:
        norm_dim(dim, x.ndim, "aminmax")  # one int only, as in PyTorch
    return return_types.aminmax(_extreme("min", x, dim, keepdim, "aminmax"),
                                _extreme("max", x, dim, keepdim, "aminmax"))


def _argreduce(op: str, x: Tensor, d: int, keepdim: bool) -> Any:
    """Backend argmax/argmin along one normalised dim of x (0-d and bool inputs handled here)."""
    stack = x._device.stack
    h = x._h
    if x._dtype is dt.bool_:
        h = stack.cast(h, dt.uint8)  # not every backend orders bools
    if not h.shape:
        return stack.full((), 0, dt.int64)
    return stack.argreduce(op, h, d, keepdim)


def _no_complex(x: Tensor, op: str) -> None:
    if x._dtype.is_complex:  # PyTorch: complex numbers have no order
        raise DTypeError(f"{op}(): not supported for complex dtype {x._dtype.name} (complex numbers have no order); "
                         "reduce .real, .imag or .abs() instead")


def _max_min(op: str, input: Any, dim: Any, keepdim: bool) -> Any:
    x = _check(input, op)
    _no_complex(x, op)
    if isinstance(dim, Tensor):  # max(a, b) is maximum(a, b)
        return binary("maximum" if op == "max" else "minimum", x, dim)
    if dim is None:
        if not (x._dtype.is_floating_point and x.ndim):
            return _extreme(op, x, None, False, op)
        # PyTorch splits max()'s gradient evenly among the elements equal to it (the NaNs when it is NaN): the
        # value is computed without recording and declared selected from those elements (Backend.select_ties)
        with no_grad():
            r = _extreme(op, x, None, False, op)
        r._h = x._device.stack.select_ties(x._h, r._h)
        return r
    d = norm_dim(dim, x.ndim, op)
    _nonempty(x, (d,) if x.ndim else (), op, False)
    stack = x._device.stack
    if x.ndim and x._dtype.is_floating_point:
        # PyTorch gives the gradient of max(dim)/min(dim) to the returned index only (amax splits ties): the
        # values are declared selected at the indices (Backend.select_at)
        with no_grad():
            idx = _argreduce("argmax" if op == "max" else "argmin", x, d, keepdim)
            values = _reduce(stack, op, x._h, (d,), keepdim)
        values = stack.select_at(x._h, d, idx, values)
    else:
        values = _reduce(stack, op, x._h, (d,) if x.ndim else (), keepdim)
        idx = _argreduce("argmax" if op == "max" else "argmin", x, d, keepdim)
    rt = return_types.max if op == "max" else return_types.min
    return rt(Tensor._make(values, x._dtype, x._device), Tensor._make(idx, dt.int64, x._device))


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    """``max(x)``: the maximum; ``max(x, dim, keepdim)``: (values, indices); ``max(x, other)``: maximum."""
    return _max_min("max", input, dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A001
    """``min(x)``: the minimum; ``min(x, dim, keepdim)``: (values, indices); ``min(x, other)``: minimum."""
    return _max_min("min", input, dim, keepdim)


def _arg(op: str, input: Any, dim: Any, keepdim: bool) -> Tensor:
    x = _check(input, op)
    _no_complex(x, op)
    if x._dtype is dt.bool_:
        raise DTypeError(f"{op}(): does not support bool input (cast to an integer dtype first)")
    if dim is None:
        _nonempty(x, (), op, True)
        h = x._h
        if not h.shape:
            return Tensor._make(x._device.stack.full((), 0, dt.int64), dt.int64, x._device)
        return Tensor._make(x._device.stack.argreduce(op, h, None, keepdim), dt.int64, x._device)
    d = norm_dim(dim, x.ndim, op)
    _nonempty(x, (d,) if x.ndim else (), op, False)
    return Tensor._make(_argreduce(op, x, d, keepdim), dt.int64, x._device)


def argmax(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (the first; NaN counts as the maximum); dim None: index into the flat tensor."""
    return _arg("argmax", input, dim, keepdim)


def argmin(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (the first; NaN counts as the minimum); dim None: index into the flat tensor."""
    return _arg("argmin", input, dim, keepdim)


# ------------------------------------------------------------------------------------------------------------
# logical reductions
# ------------------------------------------------------------------------------------------------------------
def _logical(op: str, x: Tensor, dim: Any, keepdim: bool) -> Tensor:
    _check(x, op)
    # unlike sum, PyTorch's all/any reduce nothing for dim=()
    dims = () if isinstance(dim, (list, tuple)) and not dim else _dims(x, dim, op)
    stack = x._device.stack
    out = dt.uint8 if x._dtype is dt.uint8 else dt.bool_  # PyTorch keeps uint8 for uint8 inputs
    shape = x._h.shape
    if _count(shape, dims) == 0 and dims:
        # min/max have no identity; all() of nothing is True, any() of nothing is False
        h = stack.full(_out_shape(shape, dims, keepdim), op == "all", out)
        return Tensor._make(h, out, x._device)
    h = x._h if x._dtype is dt.bool_ else stack.cast(x._h, dt.bool_)
    r = _reduce(stack, "min" if op == "all" else "max", h, dims, keepdim)
    if out is not dt.bool_:
        r = stack.cast(r, out)
    return Tensor._make(r, out, x._device)


def all(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where every element (over dim) is non-zero."""
    return _logical("all", input, dim, keepdim)


def any(input: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where some element (over dim) is non-zero."""
    return _logical("any", input, dim, keepdim)


def count_nonzero(input: Tensor, dim: Any = None) -> Tensor:
    """Number of non-zero elements over dim (int64)."""
    x = _check(input, "count_nonzero")
    dims = _dims(x, dim, "count_nonzero")
    stack = x._device.stack
    nz = stack.cast(x._h if x._dtype is dt.bool_ else stack.cast(x._h, dt.bool_), dt.int64)
    return Tensor._make(_reduce(stack, "sum", nz, dims, False), dt.int64, x._device)


# ------------------------------------------------------------------------------------------------------------
# var, std
# ------------------------------------------------------------------------------------------------------------
def _correction(op: str, unbiased: Any, correction: Any) -> builtins.float:
    if unbiased is not None and correction is not None:
        raise ValueRangeError(f"{op}(): pass either unbiased= or correction=, not both")
    if correction is not None:
        if isinstance(correction, bool) or not isinstance(correction, (int, builtins.float)):
            raise DTypeError(f"{op}(): correction must be a number, got {type(correction).__name__}")
        return builtins.float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def _var_mean(op: str, input: Any, dim: Any, unbiased: Any, keepdim: bool,
              correction: Any) -> tuple[Tensor, Tensor]:
    x = _check(input, op)
    if isinstance(dim, bool):  # var(x, True): the old unbiased-only overload
        dim, unbiased = None, dim
    c = _correction(op, unbiased, correction)
    if not x._dtype.is_floating_point:
        raise DTypeError(f"{op}(): std and var only support floating point dtypes, got {x._dtype.name}")
    dims = _dims(x, dim, op)
    stack = x._device.stack
    out = x._dtype
    cdt = dt.float32 if out in _HALF else out
    h = x._h if out is cdt else stack.cast(x._h, cdt)
    n = _count(x._h.shape, dims)
    m = _mean_of(stack, h, dims, True, n)
    dev = stack.binary("sub", h, m)
    s = _reduce(stack, "sum", stack.binary("mul", dev, dev), dims, keepdim)
    # a correction >= N divides by zero: inf (or nan for 0/0), as PyTorch does
    v = stack.binary("div", s, builtins.max(n - c, 0.0))
    if not keepdim:
        m = stack.reshape(m, _out_shape(x._h.shape, dims, False))
    if cdt is not out:
        v, m = stack.cast(v, out), stack.cast(m, out)
    return Tensor._make(v, out, x._device), Tensor._make(m, out, x._device)


def var(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: Any = None) -> Tensor:
    """Variance over dim with Bessel's correction by default (correction=1; unbiased=False means 0)."""
    return _var_mean("var", input, dim, unbiased, keepdim, correction)[0]


def std(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction: Any = None) -> Tensor:
    """Standard deviation over dim (the square root of :func:`var`)."""
    v = _var_mean("std", input, dim, unbiased, keepdim, correction)[0]
    return Tensor._make(v._device.stack.unary("sqrt", v._h), v._dtype, v._device)


def var_mean(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple[Tensor, Tensor]:
    """(var, mean) in one pass over the data."""
    return _var_mean("var_mean", input, dim, unbiased, keepdim, correction)


def std_mean(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple[Tensor, Tensor]:
    """(std, mean) in one pass over the data."""
    v, m = _var_mean("std_mean", input, dim, unbiased, keepdim, correction)
    return Tensor._make(v._device.stack.unary("sqrt", v._h), v._dtype, v._device), m


# ------------------------------------------------------------------------------------------------------------
# logsumexp
# ------------------------------------------------------------------------------------------------------------
def logsumexp(input: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over dim, computed stably; integer inputs give the default float dtype."""
    x = _check(input, "logsumexp")
    if x._dtype.is_complex:  # PyTorch has a complex logsumexp; ember's max-shifted composition has no complex form
        raise DTypeError(f"logsumexp(): not implemented for complex dtype {x._dtype.name} in ember")
    _check_keepdim(keepdim, "logsumexp")
    keepdim = bool(keepdim)
    if dim is None:  # PyTorch has no all-dims default here: dim is a required int or tuple of ints
        raise DimError("logsumexp(): argument 'dim' must be an int or a tuple of ints, not None")
    dims = _dims(x, dim, "logsumexp")
    stack = x._device.stack
    out = x._dtype if x._dtype.is_floating_point else x._device.default_dtype
    cdt = dt.float32 if out in _HALF else out
    h = x._h if x._dtype is cdt else stack.cast(x._h, cdt)
    shape = x._h.shape
    if not dims:
        r = stack.copy(h)
    elif _count(shape, dims) == 0:
        # log(0); as sum(x) - inf rather than a constant so that autodiff stacks give x its (empty) gradient
        r = stack.binary("add", stack.reduce("sum", h, dims, keepdim), -math.inf)
    else:
        r = stack.logsumexp(h, dims, keepdim)
    if cdt is not out:
        r = stack.cast(r, out)
    return Tensor._make(r, out, x._device)


# ------------------------------------------------------------------------------------------------------------
# scans
# ------------------------------------------------------------------------------------------------------------
def _cumulative(op: str, input: Any, dim: Any, dtype: Any, name: str) -> Tensor:
    x = _check(input, name)
    d = norm_dim(dim, x.ndim, name)
    out = _dtype_arg(dtype, name) or _acc_dtype(x._dtype)
    stack = x._device.stack
    h = x._h if x._dtype is out else stack.cast(x._h, out)
    if not x.ndim:
        return Tensor._make(stack.copy(h), out, x._device)
    return Tensor._make(stack.cumulative(op, h, d), out, x._device)


def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    """Inclusive running sum along dim; integer and bool inputs give int64."""
    return _cumulative("sum", input, dim, dtype, "cumsum")


def cumprod(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    """Inclusive running product along dim; integer and bool inputs give int64."""
    return _cumulative("prod", input, dim, dtype, "cumprod")


def _scan(stack: Any, op: str, h: Any, dim: int) -> Any:
    """Inclusive scan of a binary op along dim: Hillis-Steele, log2(n) whole-tensor steps."""
    n = h.shape[dim]
    pre = (slice(None),) * dim
    s = 1
    while s < n:
        head = stack.getitem(h, pre + (slice(0, s),))
        prev = stack.getitem(h, pre + (slice(0, n - s),))
        tail = stack.binary(op, stack.getitem(h, pre + (slice(s, None),)), prev)
        h = stack.cat([head, tail], dim)
        s *= 2
    return h


def _cum_extreme(op: str, input: Any, dim: Any) -> Any:
    x = _check(input, op)
    _no_complex(x, op)
    d = norm_dim(dim, x.ndim, op)
    stack = x._device.stack
    rt = getattr(return_types, op)
    if not x.ndim:
        return rt(Tensor._make(stack.copy(x._h), x._dtype, x._device),
                  Tensor._make(stack.full((), 0, dt.int64), dt.int64, x._device))
    h = stack.cast(x._h, dt.uint8) if x._dtype is dt.bool_ else x._h
    shape = h.shape
    # the values are declared selected at the indices below (Backend.select_at: the gradient goes to the
    # selected elements, as in PyTorch), so the scan itself records nothing
    with no_grad():
        v = _scan(stack, "maximum" if op == "cummax" else "minimum", h, d)
    # PyTorch moves the index at every element that equals the running extreme (ties: the last one wins) and
    # at every NaN; after a NaN the extreme stays NaN and only later NaNs move the index
    mark = stack.binary("eq", h, v)
    if x._dtype.is_floating_point:
        mark = stack.binary("logical_or", mark, stack.unary("isnan", h))
    view = tuple(shape[d] if i == d else 1 for i in range(len(shape)))
    pos = stack.expand(stack.reshape(stack.arange(0, shape[d], 1, dt.int64), view), shape)
    idx = _scan(stack, "maximum", stack.where(mark, pos, -1), d)
    if x._dtype.is_floating_point:
        v = stack.select_at(h, d, idx, v)
    if x._dtype is dt.bool_:
        v = stack.cast(v, dt.bool_)
    return rt(Tensor._make(v, x._dtype, x._device), Tensor._make(idx, dt.int64, x._device))


def cummax(input: Tensor, dim: int) -> Any:
    """Running maximum along dim and the index where it was (last) attained: (values, indices)."""
    return _cum_extreme("cummax", input, dim)


def cummin(input: Tensor, dim: int) -> Any:
    """Running minimum along dim and the index where it was (last) attained: (values, indices)."""
    return _cum_extreme("cummin", input, dim)


# ------------------------------------------------------------------------------------------------------------
# sorting and selection
# ------------------------------------------------------------------------------------------------------------
def _sort_handles(x: Tensor, d: int, descending: bool, stable: bool) -> tuple[Any, Any]:
    stack = x._device.stack
    if not x.ndim:
        return stack.copy(x._h), stack.full((), 0, dt.int64)
    return stack.sort(x._h, d, bool(descending), bool(stable))


def sort(input: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Any:
    """Sorted values and their original indices along dim; NaN sorts as the largest value."""
    x = _check(input, "sort")
    _no_complex(x, "sort")
    d = norm_dim(dim, x.ndim, "sort")
    v, i = _sort_handles(x, d, descending, stable)
    return return_types.sort(Tensor._make(v, x._dtype, x._device), Tensor._make(i, dt.int64, x._device))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The indices that sort input along dim."""
    x = _check(input, "argsort")
    _no_complex(x, "argsort")
    d = norm_dim(dim, x.ndim, "argsort")
    return Tensor._make(_sort_handles(x, d, descending, stable)[1], dt.int64, x._device)


def _check_k(op: str, k: Any, size: int, d: int, lo: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        if hasattr(k, "__index__") and not isinstance(k, bool):
            k = k.__index__()
        else:
            raise DTypeError(f"{op}(): k must be an int, got {type(k).__name__}")
    if not lo <= k <= size:
        raise ValueRangeError(
            f"{op}(): selected number k={k} out of range for dimension {d} of size {size} "
            f"(expected {lo} <= k <= {size})"
        )
    return int(k)


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:  # noqa: A002
    """The k largest (or smallest) values along dim and their indices; NaN counts as the largest."""
    x = _check(input, "topk")
    _no_complex(x, "topk")
    if x._dtype is dt.bool_:
        raise DTypeError("topk(): does not support bool tensors (cast to an integer dtype first)")
    d = norm_dim(dim, x.ndim, "topk")
    size = x._h.shape[d] if x.ndim else 1
    k = _check_k("topk", k, size, d, 0)
    stack = x._device.stack
    if not x.ndim:
        # PyTorch returns the element itself for k 0 or 1 on a 0-d tensor
        v, i = stack.copy(x._h), stack.full((), 0, dt.int64)
    else:
        v, i = stack.topk(x._h, k, d, bool(largest), bool(sorted))
    return return_types.topk(Tensor._make(v, x._dtype, x._device), Tensor._make(i, dt.int64, x._device))


def _select(op: str, x: Tensor, pos: int, d: int, keepdim: bool) -> tuple[Any, Any]:
    """Value and index of sorted position pos along dim d (x has at least one dim, size > pos)."""
    stack = x._device.stack
    v, i = stack.sort(x._h, d, False, True)
    key = (slice(None),) * d + (slice(pos, pos + 1) if keepdim else pos,)
    return stack.getitem(v, key), stack.getitem(i, key)


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    """The k-th smallest value (1-based) along dim and its index; NaN counts as the largest."""
    x = _check(input, "kthvalue")
    _no_complex(x, "kthvalue")
    d = norm_dim(dim, x.ndim, "kthvalue")
    size = x._h.shape[d] if x.ndim else 1
    k = _check_k("kthvalue", k, size, d, 1)
    stack = x._device.stack
    if not x.ndim:
        v, i = stack.copy(x._h), stack.full((), 0, dt.int64)
    else:
        v, i = _select("kthvalue", x, k - 1, d, keepdim)
    return return_types.kthvalue(Tensor._make(v, x._dtype, x._device), Tensor._make(i, dt.int64, x._device))


def median(input: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median (NaN if any element is NaN); with dim, (values, indices) along it."""
    x = _check(input, "median")
    _no_complex(x, "median")
    stack = x._device.stack
    if dim is None:
        n = x.numel()
        if n == 0:
            if not x._dtype.is_floating_point:
                raise ShapeError(f"median(): cannot take the median of an empty {x._dtype.name} tensor")
            return Tensor._make(stack.full((), math.nan, x._dtype), x._dtype, x._device)
        flat = Tensor._make(stack.reshape(x._h, (n,)), x._dtype, x._device)
        # the median is found without recording; PyTorch splits its gradient evenly among the elements equal
        # to it (the NaNs when it is NaN): Backend.select_ties
        with no_grad():
            v, _ = _select("median", flat, (n - 1) // 2, 0, False)
            if x._dtype.is_floating_point:
                # NaN sorts last, so the last sorted element says whether there is one
                top = stack.reduce("max", flat._h, (0,), False)
                v = stack.where(stack.unary("isnan", top), top, v)
        if x._dtype.is_floating_point:
            v = stack.select_ties(flat._h, v)
        return Tensor._make(v, x._dtype, x._device)
    d = norm_dim(dim, x.ndim, "median")
    _nonempty(x, (d,) if x.ndim else (), "median", False)
    if not x.ndim:
        v, i = stack.copy(x._h), stack.full((), 0, dt.int64)
    else:
        n = x._h.shape[d]
        v, i = _select("median", x, (n - 1) // 2, d, keepdim)
        if x._dtype.is_floating_point:
            nan = stack.unary("isnan", x._h)
            has = stack.reduce("max", nan, (d,), keepdim)
            first = stack.argreduce("argmax", stack.cast(nan, dt.uint8), d, keepdim)
            v = stack.where(has, math.nan, v)
            i = stack.where(has, first, i)
    return return_types.median(Tensor._make(v, x._dtype, x._device), Tensor._make(i, dt.int64, x._device))


# ------------------------------------------------------------------------------------------------------------
# norms
# ------------------------------------------------------------------------------------------------------------
def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: Any = None) -> Tensor:
    """The ord-norm of x over dim (None: all elements): ord 2, 1, inf, -inf, 0 (non-zero count) or any p."""
    t = _check(x, "linalg.vector_norm")
    _check_keepdim(keepdim, "linalg.vector_norm")
    if isinstance(ord, bool) or not isinstance(ord, (int, builtins.float)):
        raise DTypeError(f"linalg.vector_norm: ord must be a number, got {type(ord).__name__} {ord!r}")
    if t._dtype.is_complex:  # torch: the norm of |x|, a real result (dtype, if given, is complex: x's cast)
        if dtype is not None:
            want = dt.as_dtype(dtype)
            if not want.is_complex:
                raise DTypeError(f"linalg.vector_norm: dtype should be complex for complex inputs, but got "
                                 f"{want.name}")
            t = t.to(want)
        return vector_norm(t.abs(), ord, dim, keepdim)
    if not t._dtype.is_floating_point:
        raise DTypeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {t._dtype.name}"
        )
    out = t._dtype
    if dtype is not None:
        out = dt.as_dtype(dtype)
        if not out.is_floating_point:
            raise DTypeError(f"linalg.vector_norm: dtype must be a floating point dtype, got {out.name}")
    dims = _dims(t, dim, "linalg.vector_norm")
    stack = t._device.stack
    cdt = dt.float32 if out in _HALF else out
    h = t._h if t._dtype is cdt else stack.cast(t._h, cdt)
    shape = t._h.shape
    if ord < 0 or ord == math.inf:
        if _count(shape, dims) == 0 and (dims or t.numel() == 0):
            raise ShapeError(
                f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor (shape "
                f"{tuple(shape)}) because the operation does not have an identity"
            )
    a = stack.unary("abs", h)
    if ord == math.inf or ord == -math.inf:
        r = _reduce(stack, "max" if ord > 0 else "min", a, dims, keepdim)
    elif ord == 0:
        r = _reduce(stack, "sum", stack.cast(stack.binary("ne", h, 0.0), cdt), dims, keepdim)
    elif ord == 1:
        r = _reduce(stack, "sum", a, dims, keepdim)
    elif ord == 2:
        r = stack.unary("sqrt", _reduce(stack, "sum", stack.binary("mul", h, h), dims, keepdim))
    else:
        p = builtins.float(ord)
        r = stack.binary("pow", _reduce(stack, "sum", stack.binary("pow", a, p), dims, keepdim), 1.0 / p)
    if cdt is not out:
        r = stack.cast(r, out)
    return Tensor._make(r, out, t._device)


def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """``torch.norm``: 'fro' (the 2-norm of the elements over dim) or a number p (a vector p-norm)."""
    if p is None or p == "fro":
        if dim is not None and not isinstance(dim, int) and len(dim) > 2:
            raise ShapeError(f"norm(): the Frobenius norm takes at most 2 dims, got dim={dim}")
        return vector_norm(input, 2, dim, keepdim, dtype=dtype)
    if p == "nuc":
        raise UnsupportedError("norm(): p='nuc' is a matrix norm; use ember.linalg.matrix_norm(x, 'nuc')")
    if isinstance(p, str):
        raise ValueRangeError(f"norm(): unknown norm type p={p!r} (expected 'fro', 'nuc' or a number)")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


__all__ = [
    "sum", "prod", "mean", "nansum", "nanmean", "amax", "amin", "aminmax", "max", "min", "argmax", "argmin",
    "all", "any", "count_nonzero", "var", "std", "var_mean", "std_mean", "logsumexp", "cumsum", "cumprod",
    "cummax", "cummin", "sort", "argsort", "topk", "kthvalue", "median", "vector_norm", "norm",
    "return_types",
]

TENSOR_METHODS: dict[str, Any] = {
    name: globals()[name]
    for name in __all__
    if name not in ("var_mean", "std_mean", "vector_norm", "return_types")
}
