"""Indexing with PyTorch's semantics: ``x[key]``, ``x[key] = value``, gather/scatter, index_select,
masked ops, nonzero, take.

``x[key]`` accepts ints, slices (positive steps), None, Ellipsis, Python bools, integer and bool tensors,
and nested lists / numpy arrays of ints or bools. The key is validated here (bounds, mask shapes, index
broadcasting) and normalised into one numpy-style key for the backend's ``getitem``/``setitem``: slices get
explicit in-range bounds, index tensors become non-negative int64 handles on the tensor's device.

Where PyTorch and numpy place the advanced-index dims differently (an int between a slice and an index
tensor: numpy counts the int as an advanced index, PyTorch applies it first as ``select``), the backend's
numpy-layout result is permuted into PyTorch's layout (and a setitem value the other way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..bridge import same_device, to_tensor, transfer
from ..compile import is_recording
from ..errors import (
    DeviceError,
    DTypeError,
    IndexOutOfRangeError,
    ShapeError,
    UnsupportedError,
    ValueRangeError,
)
from ..shapes import broadcast_shapes, norm_dim
from ..tensor import Tensor
from .conversion import clone
from .elementwise import keep_graph

Shape = tuple[int, ...]

# item kinds of a parsed key
_INT, _SLICE, _NONE, _IDX, _MASK, _BOOL0 = range(6)
_ADV = (_IDX, _MASK, _BOOL0)


def _fmt(shape: Any) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _t(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _minmax(stack: Any, h: Any) -> tuple[int, int]:
    """Smallest and largest value of a non-empty integer handle (one host sync each)."""
    dims = tuple(range(len(h.shape)))
    if not dims:
        v = int(stack.to_numpy(h).item())
        return v, v
    lo = int(stack.to_numpy(stack.reduce("min", h, dims, False)).item())
    hi = int(stack.to_numpy(stack.reduce("max", h, dims, False)).item())
    return lo, hi


def _index_handle(x: Tensor, idx: Tensor, size: int, dim: int, op: str, allow_negative: bool = True) -> Any:
    """idx as a non-negative int64 handle on x's device; IndexOutOfRangeError for values outside the dim."""
    if idx._device is not x._device:
        idx = transfer(idx, x._device)
    stack = x._device.stack
    h = idx._h if idx._dtype is dt.int64 else stack.cast(idx._h, dt.int64)
    if idx.numel() == 0:
        return h
    lo, hi = _minmax(stack, h)
    low_ok = -size if allow_negative else 0
    if lo < low_ok or hi >= size:
        bad = lo if lo < low_ok else hi
        raise IndexOutOfRangeError(f"{op}: index {bad} is out of bounds for dimension {dim} with size {size}")
    # under ember.compile the wrap is recorded whatever this call's indices hold: a replay may get negative ones
    if lo < 0 or (allow_negative and is_recording()):
        h = stack.where(stack.binary("lt", h, 0), stack.binary("add", h, size), h)
    return h


def _key_tensor(x: Tensor, obj: Any) -> Tensor:
    """A list / tuple / numpy array inside an index, as a tensor (ints -> int64, bools -> bool)."""
    arr = np.asarray(obj) if not isinstance(obj, np.ndarray) else obj
    if arr.dtype == object:
        if isinstance(obj, (list, tuple)) and any(isinstance(v, Tensor) for v in obj):
            arr = np.asarray([np.asarray(v.numpy()) if isinstance(v, Tensor) else v for v in obj])
        else:
            raise IndexOutOfRangeError(f"index: cannot use {type(obj).__name__} {obj!r} as an index")
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int64)  # [] has numpy dtype float64 but means "no indices"
    if arr.dtype.kind == "b":
        return to_tensor(arr, dt.bool_, x._device)
    if arr.dtype.kind in "iu":
        return to_tensor(arr, dt.int64, x._device)
    raise IndexOutOfRangeError(
        "index: tensors used as indices must be long, int, byte or bool tensors, got a sequence of "
        f"{arr.dtype}"
    )


class _Plan:
    """A normalised key: the backend key, the result shape in PyTorch's layout, and the layout fix-up."""

    __slots__ = ("key", "shape", "perm", "adv", "mask")

    def __init__(self, key: tuple[Any, ...], shape: Shape, perm: tuple[int, ...] | None, adv: bool) -> None:
        self.key = key
        self.shape = shape
        self.perm = perm
        self.adv = adv
        # the mask when the key's only tensor index is one bool/uint8 mask: PyTorch's index_put_ then takes
        # a one-element value through masked_fill_ (any value dtype; a uint8 mask is refused)
        self.mask: Tensor | None = None


def _parse(x: Tensor, key: Any, op: str) -> _Plan:
    if not isinstance(key, tuple):
        key = (key,)
    items: list[tuple[int, Any]] = []
    ellipsis_at = -1
    consumed = 0
    n_tensors = 0
    mask: Tensor | None = None
    for k in key:
        if k is None:
            items.append((_NONE, None))
        elif k is Ellipsis:
            if ellipsis_at >= 0:
                raise IndexOutOfRangeError(f"{op}: an index can only have a single ellipsis ('...')")
            ellipsis_at = len(items)
        elif isinstance(k, (bool, np.bool_)):
            items.append((_BOOL0, bool(k)))
        elif isinstance(k, (int, np.integer)):
            items.append((_INT, int(k)))
            consumed += 1
        elif isinstance(k, slice):
            items.append((_SLICE, k))
            consumed += 1
        else:
            if not isinstance(k, Tensor):
                if isinstance(k, (list, tuple, np.ndarray)):
                    k = _key_tensor(x, k)
                else:
                    raise IndexOutOfRangeError(
                        f"{op}: only integers, slices (`:`), ellipsis (`...`), None and long or bool "
                        "tensors are "
                        f"valid indices (got {type(k).__name__})"
                    )
            d = k._dtype
            if d.is_floating_point or d in (dt.int8, dt.int16):  # PyTorch accepts these index dtypes only
                raise IndexOutOfRangeError(
                    f"{op}: tensors used as indices must be long, int, byte or bool tensors, got {d.name}"
                )
            is_mask = d is dt.bool_ or d is dt.uint8  # uint8 masks: PyTorch's deprecated byte-mask rule
            if k.ndim == 0:
                if is_mask:
                    items.append((_BOOL0, bool(k.item())))
                else:  # PyTorch treats a 0-d integer tensor as an int
                    items.append((_INT, int(k.item())))
                    consumed += 1
            elif is_mask:
                items.append((_MASK, k))
                consumed += k.ndim
                n_tensors += 1
                mask = k
            else:
                items.append((_IDX, k))
                consumed += 1
                n_tensors += 1
    ndim = x.ndim
    if consumed > ndim:
        raise IndexOutOfRangeError(
            f"{op}: too many indices for tensor of dimension {ndim} (shape {_fmt(x.shape)})"
        )
    fill = [(_SLICE, slice(None))] * (ndim - consumed)
    if ellipsis_at >= 0:
        items[ellipsis_at:ellipsis_at] = fill
    else:
        items.extend(fill)
    plan = _plan(x, items, op)
    if n_tensors == 1:
        plan.mask = mask
    return plan


def _plan(x: Tensor, items: list[tuple[int, Any]], op: str) -> _Plan:
    shape = x.shape
    stack = x._device.stack
    d = 0
    out_key: list[Any] = []
    basic: list[int] = []  # result sizes of slices and Nones, in order
    adv_shapes: list[Shape] = []
    # for the layout rule: the kinds in order, ints excluded (PyTorch) and included (numpy)
    seq: list[int] = []
    for kind, v in items:
        if kind == _INT:
            n = shape[d]
            if not -n <= v < n:
                raise IndexOutOfRangeError(
                    f"{op}: index {v} is out of bounds for dimension {d} with size {n}"
                )
            out_key.append(v % n)
            d += 1
        elif kind == _SLICE:
            n = shape[d]
            start, stop, step = (_slice_part(p, op) for p in (v.start, v.stop, v.step))
            if step is not None and step <= 0:
                if step == 0:
                    raise ValueRangeError(f"{op}: slice step cannot be zero")
                raise ValueRangeError(f"{op}: step must be greater than zero (got slice step {step})")
            s = slice(start, stop, step).indices(n)
            out_key.append(slice(*s))
            basic.append(len(range(*s)))
            d += 1
        elif kind == _NONE:
            out_key.append(None)
            basic.append(1)
        elif kind == _BOOL0:
            out_key.append(stack.full((), v, dt.bool_))
            adv_shapes.append((1 if v else 0,))
        elif kind == _IDX:
            out_key.append(_index_handle(x, v, shape[d], d, op))
            adv_shapes.append(v.shape)
            d += 1
        else:  # mask
            k = v.ndim
            if v.shape != shape[d : d + k]:
                raise IndexOutOfRangeError(
                    f"{op}: the shape of the mask {_fmt(v.shape)} at index 0 does not match the shape of the "
                    f"indexed tensor {_fmt(shape)} at index {d}"
                )
            m = v if v._device is x._device else transfer(v, x._device)
            mh = m._h if m._dtype is dt.bool_ else stack.cast(m._h, dt.bool_)
            out_key.append(mh)
            count = (
                int(
                    stack.to_numpy(
                        stack.reduce("sum", stack.cast(mh, dt.int64), tuple(range(k)), False)
                    ).item()
                )
                if v.numel()
                else 0
            )
            adv_shapes.append((count,))
            d += k
        seq.append(kind)
    if not adv_shapes:
        # a trailing Ellipsis keeps an all-int key a 0-d view instead of a detached scalar (numpy)
        return _Plan(tuple(out_key) + (Ellipsis,), tuple(basic), None, False)
    a_shape: Shape = ()
    for s in adv_shapes:
        try:
            a_shape = broadcast_shapes(a_shape, s, op=op)
        except ShapeError:
            raise IndexOutOfRangeError(
                f"{op}: shape mismatch: indexing tensors could not be broadcast together with shapes "
                + ", ".join(_fmt(t) for t in adv_shapes)
            ) from None
    pt = _position(seq, include_ints=False)
    pn = _position(seq, include_ints=True)
    na = len(a_shape)
    t_shape = tuple(basic[:pt]) + a_shape + tuple(basic[pt:])
    perm = None
    if pt != pn:
        # numpy layout: basic[:pn] + A + basic[pn:]; PyTorch's wants A after basic[:pt]
        def np_axis(i: int) -> int:
            return i if i < pn else i + na

        perm = (
            tuple(np_axis(i) for i in range(pt))
            + tuple(range(pn, pn + na))
            + tuple(np_axis(i) for i in range(pt, len(basic)))
        )
    return _Plan(tuple(out_key), t_shape, perm, True)


def _slice_part(p: Any, op: str) -> int | None:
    if p is None:
        return None
    if isinstance(p, (int, np.integer)) and not isinstance(p, bool):
        return int(p)
    if isinstance(p, Tensor) and p.ndim == 0 and p._dtype.is_integer:
        return int(p.item())
    raise IndexOutOfRangeError(f"{op}: slice indices must be integers or None, got {type(p).__name__} {p!r}")


def _position(seq: list[int], include_ints: bool) -> int:
    """Where the advanced-index dims go among the basic dims: at the first advanced index when the advanced
    indices are adjacent, else in front (numpy counts ints as advanced, PyTorch does not)."""
    adv_kinds = _ADV + ((_INT,) if include_ints else ())
    kinds = [k for k in seq if include_ints or k != _INT]
    pos = [i for i, k in enumerate(kinds) if k in adv_kinds]
    if pos[-1] - pos[0] + 1 != len(pos):
        return 0
    return sum(1 for k in kinds[: pos[0]] if k in (_SLICE, _NONE))


def _fast_key(shape: Shape, key: Any) -> tuple[Any, ...] | None:
    """The backend key for the common all-int / all-slice keys (positive steps, in range), else None."""
    items = key if type(key) is tuple else (key,)
    if len(items) > len(shape):
        return None
    out = []
    for k, n in zip(items, shape):
        tk = type(k)
        if tk is int:
            if not -n <= k < n:
                return None
            out.append(k % n)
        elif tk is slice:
            step = k.step
            if step is not None and (type(step) is not int or step <= 0):
                return None
            start, stop = k.start, k.stop
            if (start is not None and type(start) is not int) or (stop is not None and type(stop) is not int):
                return None
            out.append(slice(*k.indices(n)))
        else:
            return None
    out.append(Ellipsis)  # keeps an all-int key a 0-d view
    return tuple(out)


def getitem(x: Tensor, key: Any) -> Tensor:
    """``x[key]``: basic indexing returns a view (where the backend makes one); advanced indexing copies."""
    fast = _fast_key(x._h.shape, key)
    if fast is not None:
        return Tensor._make(x._device.stack.getitem(x._h, fast), x._dtype, x._device)
    plan = _parse(x, key, "index")
    stack = x._device.stack
    h = stack.getitem(x._h, plan.key)
    if plan.perm is not None:
        h = stack.permute(h, plan.perm)
    return Tensor._make(h, x._dtype, x._device)


def _fill_scalar(v: Any, dtype: dt.DType, op: str) -> Any:
    """A Python scalar converted to dtype's kind with PyTorch's range check (float -> int truncates)."""
    if isinstance(v, np.generic):
        v = v.item()
    if not isinstance(v, (bool, int, float)):
        raise DTypeError(f"{op}: value must be a number or a Tensor, got {type(v).__name__}")
    return dt.convert_scalar(v, dtype, op)


def _check_writable(x: Tensor, op: str) -> None:
    strides = getattr(x._h, "strides", None)
    if strides is not None and x.numel() > 1 and any(st == 0 and n > 1 for st, n in zip(strides, x._h.shape)):
        raise UnsupportedError(
            f"{op}: unsupported operation: more than one element of the written-to tensor (shape "
            f"{_fmt(x.shape)}) refers to a single memory location (an expanded tensor?). Please clone() the "
            "tensor "
            "before performing the operation."
        )


def _value_handle(x: Tensor, value: Any, target: Shape, op: str) -> tuple[Any, bool]:
    """value as a handle of x's dtype broadcastable to target (or a scalar); second item: is a handle."""
    if isinstance(value, Tensor):
        if value._device is not x._device:
            raise DeviceError(
                f"{op}: expected the value on the tensor's device {x._device}, got {value._device} "
                "(move it with .to(device))"
            )
    elif isinstance(value, (bool, int, float, np.generic)):
        return _fill_scalar(value, x._dtype, op), False
    else:
        value = to_tensor(value, x._dtype, x._device)
    stack = x._device.stack
    h = value._h if value._dtype is x._dtype else stack.cast(value._h, x._dtype)
    vs = tuple(h.shape)
    # PyTorch drops leading size-1 dims of the value that the target lacks
    strip = 0
    while len(vs) - strip > len(target) and vs[strip] == 1:
        strip += 1
    if strip:
        vs = vs[strip:]
        h = stack.reshape(h, vs)
    try:
        ok = len(vs) <= len(target) and broadcast_shapes(vs, target, op=op) == target
    except ShapeError:
        ok = False
    if not ok:
        raise ShapeError(
            f"{op}: shape mismatch: value tensor of shape {_fmt(value.shape)} cannot be broadcast to "
            "indexing "
            f"result of shape {_fmt(target)}"
        )
    return h, True


def _check_put_value(x: Tensor, plan: _Plan, value: Any, accumulate: bool, op: str) -> None:
    """PyTorch's index_put_ rules on the value: a one-element value with a single-mask key goes through
    masked_fill_ (which refuses a uint8 mask, and casts the value); otherwise a tensor value of an advanced
    index must have the destination's dtype (basic indexing copies, which casts)."""
    if not accumulate and plan.mask is not None and (not isinstance(value, Tensor) or value.numel() == 1):
        if plan.mask._dtype is not dt.bool_:
            raise DTypeError(
                f"{op}: masked_fill_ only supports boolean masks, but got mask with dtype {plan.mask._dtype.name} "
                "(a one-element value with a single mask index is a masked fill)"
            )
        return
    if plan.adv and isinstance(value, Tensor) and value._dtype is not x._dtype:
        raise DTypeError(
            f"{op}: Index put requires the source and destination dtypes match, got {x._dtype.name} for the "
            f"destination and {value._dtype.name} for the source"
        )


def setitem(x: Tensor, key: Any, value: Any) -> None:
    """``x[key] = value`` in place: value (a number or tensor) is cast to x's dtype and broadcast."""
    plan = _parse(x, key, "index_put")
    _check_writable(x, "index_put")
    if type(value) is int and not -(1 << 63) <= value < (1 << 63):  # PyTorch unpacks an int value as int64
        raise ValueRangeError(f"index_put: value {value} overflows a 64-bit integer (PyTorch: Overflow when unpacking)")
    if plan.adv:
        _check_put_value(x, plan, value, False, "index_put")
    v, is_handle = _value_handle(x, value, plan.shape, "index_put")
    stack = x._device.stack
    if is_handle and plan.perm is not None:
        # bring the value into numpy's layout: expand to PyTorch's result shape, then invert the permutation
        v = stack.expand(v, plan.shape) if tuple(v.shape) != plan.shape else v
        inv = [0] * len(plan.perm)
        for i, p in enumerate(plan.perm):
            inv[p] = i
        v = stack.permute(v, tuple(inv))
    try:
        stack.setitem(x._h, plan.key, v)
    except ValueError as exc:  # e.g. a read-only view on the backend
        raise UnsupportedError(f"index_put: the backend could not write into the tensor: {exc}") from None


def index_put_(input: Tensor, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
    """``input[indices] = values`` in place; with accumulate=True repeated indices add up."""
    x = _t(input, "index_put_")
    if not isinstance(indices, (tuple, list)):
        raise DTypeError(f"index_put_: indices must be a tuple of tensors, got {type(indices).__name__}")
    key = tuple(indices)
    if not accumulate:
        setitem(x, key, values)
        return x
    for k in key:
        if not isinstance(k, Tensor):
            raise DTypeError("index_put_: with accumulate=True indices must be tensors")
    # accumulate: linearise the indices over the leading dims, then index_add along one merged dim
    plan = _parse(x, key, "index_put_")
    _check_put_value(x, plan, values, True, "index_put_")
    lead = len(key) if all(k._dtype not in (dt.bool_, dt.uint8) for k in key) else None
    if lead is None:
        nz: list[Tensor] = []
        for k in key:
            nz.extend(nonzero(k, as_tuple=True) if k._dtype in (dt.bool_, dt.uint8) else (k,))
        return index_put_(x, tuple(nz), values, accumulate=True)
    stack = x._device.stack
    a_shape = plan.shape[: len(plan.shape) - (x.ndim - lead)]
    shape = x.shape
    lin = None
    for i, h in enumerate(plan.key[:lead]):
        h = stack.expand(h, a_shape) if tuple(h.shape) != a_shape else h
        lin = h if lin is None else stack.binary("add", stack.binary("mul", lin, shape[i]), h)
    m = 1
    for s in a_shape:
        m *= s
    rest = shape[lead:]
    v, is_handle = _value_handle(x, values, plan.shape, "index_put_")
    if not is_handle:
        v = stack.full(plan.shape, v, x._dtype)
    elif tuple(v.shape) != plan.shape:
        v = stack.expand(v, plan.shape)
    flat_n = 1
    for s in shape[:lead]:
        flat_n *= s
    flat = stack.reshape(x._h, (flat_n,) + rest)
    lin1 = stack.reshape(lin, (m,))
    v1 = stack.reshape(v, (m,) + rest)
    idx = stack.expand(stack.reshape(lin1, (m,) + (1,) * len(rest)), (m,) + rest)
    res = stack.scatter(flat, 0, idx, v1, "add")
    stack.assign(x._h, stack.reshape(res, shape))
    return x


def index_put(input: Tensor, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
    return index_put_(clone(_t(input, "index_put")), indices, values, accumulate)


# ----------------------------------------------------------------------------------------------------
# gather / scatter
# ----------------------------------------------------------------------------------------------------
def _int64_index(index: Any, op: str) -> Tensor:
    if not isinstance(index, Tensor):
        raise DTypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index._dtype is not dt.int64:
        raise DTypeError(f"{op}: expected dtype int64 for index, got {index._dtype.name}")
    return index


def _scatter_gather_index(index: Any, op: str) -> Tensor | None:
    """gather/scatter's index: int64 or int32 (widened to int64), as PyTorch. None for an empty index, which
    PyTorch does not check further (any dtype, any rank): the op then leaves self unchanged."""
    if not isinstance(index, Tensor):
        raise DTypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index.numel() == 0:
        return None
    if index._dtype is dt.int64:
        return index
    if index._dtype is dt.int32:
        return index.to(dt.int64)
    raise DTypeError(f"{op}: expected dtype int32/int64 for index, got {index._dtype.name}")


def _check_index_values(stack: Any, h: Any, size: int, dim: int, op: str) -> None:
    if not all(h.shape):
        return
    lo, hi = _minmax(stack, h)
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise IndexOutOfRangeError(f"{op}: index {bad} is out of bounds for dimension {dim} with size {size}")


def _as1(h: Any, stack: Any) -> Any:
    return stack.reshape(h, (1,)) if not h.shape else h


def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim=0); index has input's rank and is no larger
    than input outside dim."""
    x = _t(input, "gather")
    idx_or_none = _scatter_gather_index(index, "gather")
    same_device("gather", x, index)
    n = x.ndim
    d = norm_dim(dim, n, "gather")
    stack = x._device.stack
    if idx_or_none is None:  # PyTorch: an empty index gives an empty result whatever its dtype and rank
        return Tensor._make(keep_graph(stack, stack.full(index.shape, 0, x._dtype), x), x._dtype, x._device)
    idx = idx_or_none
    xs = x.shape or (1,)
    ixs = idx.shape or (1,)
    if len(ixs) != len(xs) and not (x.ndim <= 1 and idx.ndim <= 1):
        raise ShapeError(
            f"gather: index tensor must have the same number of dimensions as input tensor, got index shape "
            f"{_fmt(idx.shape)} and input shape {_fmt(x.shape)}"
        )
    for k in range(len(ixs)):
        if k != d and ixs[k] > xs[k]:
            raise ShapeError(
                f"gather: size does not match at dimension {k} expected index {_fmt(idx.shape)} to be no "
                "larger "
                f"than self {_fmt(x.shape)} apart from dimension {d}"
            )
    _check_index_values(stack, idx._h, xs[d], d, "gather")
    h = stack.gather(_as1(x._h, stack), d, _as1(idx._h, stack))
    if not idx.ndim:
        h = stack.reshape(h, ())
    return Tensor._make(h, x._dtype, x._device)


def _check_src(op: str, x: Tensor, src: Tensor) -> None:
    """scatter's src must be on x's device with x's dtype."""
    same_device(op, x, src)
    if src._dtype is not x._dtype:
        raise DTypeError(f"{op}: expected self.dtype to be equal to src.dtype, got {x._dtype.name} and "
                         f"{src._dtype.name}")


def _scatter_args(
    x: Tensor, dim: int, index: Any, src: Any, value: Any, reduce: str | None, op: str
) -> tuple[int, Any, Any]:
    idx_or_none = _scatter_gather_index(index, op)
    same_device(op, x, index)
    if reduce not in (None, "add", "multiply"):
        raise ValueRangeError(f"{op}: reduce argument must be either 'add' or 'multiply', got {reduce!r}")
    if src is not None and value is not None:
        raise ValueRangeError(f"{op}: give either src or value, not both")
    if src is None and value is None:
        raise ValueRangeError(f"{op}: missing src (a Tensor) or value (a number)")
    d = norm_dim(dim, x.ndim, op)
    if idx_or_none is None:
        # PyTorch returns early on an empty index: only the dim, src's dtype and value's type are checked
        if isinstance(src, Tensor):
            _check_src(op, x, src)
            return d, None, src._h
        v = src if src is not None else value
        if not isinstance(v, (Tensor, bool, int, float, np.generic)):
            raise DTypeError(f"{op}: value must be a number or a Tensor, got {type(v).__name__}")
        return d, None, None
    idx = idx_or_none
    xs = x.shape or (1,)
    ixs = idx.shape or (1,)
    if len(ixs) != len(xs) and not (x.ndim <= 1 and idx.ndim <= 1):
        raise ShapeError(
            f"{op}: index tensor must have the same number of dimensions as self tensor, got index shape "
            f"{_fmt(idx.shape)} and self shape {_fmt(x.shape)}"
        )
    stack = x._device.stack
    if isinstance(src, Tensor):
        _check_src(op, x, src)
        ss = src.shape or (1,)
        if len(ss) != len(ixs) and not (src.ndim <= 1 and idx.ndim <= 1):
            raise ShapeError(
                f"{op}: index shape {_fmt(idx.shape)} and src shape {_fmt(src.shape)} must have the "
                "same number of dimensions"
            )
        sv: Any = _as1(src._h, stack)
    else:
        if src is not None:
            value = src
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ShapeError(
                    f"{op}: value must be a number or a 1-element tensor, got shape {_fmt(value.shape)}"
                )
            value = value.item()
        sv = _fill_scalar(value, x._dtype, op)
        ss = None
    for k in range(len(ixs)):
        if (k != d and ixs[k] > xs[k]) or (ss is not None and ixs[k] > ss[k]):
            raise ShapeError(
                f"{op}: expected index {_fmt(idx.shape)} to be no larger than self {_fmt(x.shape)} apart "
                "from "
                f"dimension {d}" + (f" and to be no larger size than src {_fmt(src.shape)}" if ss else "")
            )
    _check_index_values(stack, idx._h, xs[d], d, op)
    return d, _as1(idx._h, stack), sv


def _scatter(x: Tensor, dim: int, index: Any, src: Any, value: Any, reduce: str | None, op: str) -> Any:
    x = _t(x, op)
    d, ih, sv = _scatter_args(x, dim, index, src, value, reduce, op)
    stack = x._device.stack
    if ih is None:  # empty index: self unchanged (a copy, still in src's graph)
        return keep_graph(stack, stack.copy(x._h), sv) if sv is not None else stack.copy(x._h)
    h = stack.scatter(_as1(x._h, stack), d, ih, sv, reduce)
    return stack.reshape(h, ()) if not x.ndim else h


def scatter(
    input: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None, reduce: str | None = None
) -> Tensor:
    """A copy of input with src (a tensor) or value (a number) written at index along dim; reduce=None
    replaces, 'add' / 'multiply' combine with what is there."""
    return Tensor._make(
        _scatter(input, dim, index, src, value, reduce, "scatter"), input._dtype, input._device
    )


def scatter_(
    input: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None, reduce: str | None = None
) -> Tensor:
    """In-place scatter."""
    h = _scatter(input, dim, index, src, value, reduce, "scatter_")
    _check_writable(input, "scatter_")
    input._device.stack.assign(input._h, h)
    return input


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return scatter(input, dim, index, _t(src, "scatter_add"), reduce="add")


def scatter_add_(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return scatter_(input, dim, index, _t(src, "scatter_add_"), reduce="add")


def _vector_index(x: Tensor, index: Any, op: str) -> Tensor:
    if not isinstance(index, Tensor):
        raise DTypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index._dtype not in (dt.int64, dt.int32):
        raise DTypeError(f"{op}: expected an int64 or int32 index, got {index._dtype.name}")
    if index.ndim > 1:
        raise ShapeError(f"{op}: index is supposed to be a vector, got shape {_fmt(index.shape)}")
    same_device(op, x, index)
    return index


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of input at index (a vector) along dim."""
    x = _t(input, "index_select")
    idx = _vector_index(x, index, "index_select")
    d = norm_dim(dim, x.ndim, "index_select")
    stack = x._device.stack
    xs = x.shape or (1,)
    ih = idx._h if idx._dtype is dt.int64 else stack.cast(idx._h, dt.int64)
    _check_index_values(stack, ih, xs[d], d, "index_select")
    h = stack.index_select(_as1(x._h, stack), d, _as1(ih, stack))
    if not x.ndim:
        h = stack.reshape(h, ())
    return Tensor._make(h, x._dtype, x._device)


def _index_add(x: Tensor, dim: int, index: Any, source: Any, alpha: Any, op: str) -> Any:
    x = _t(x, op)
    idx = _vector_index(x, index, op)
    src = _t(source, op)
    same_device(op, x, src)
    d = norm_dim(dim, x.ndim, op)
    xs = x.shape or (1,)
    ss = src.shape or (1,)
    k = idx.numel()
    if len(ss) != len(xs) or ss[d] != k or any(ss[i] != xs[i] for i in range(len(xs)) if i != d):
        raise ShapeError(
            f"{op}: source shape {_fmt(src.shape)} must match self shape {_fmt(x.shape)} except at "
            f"dim {d}, where it must equal the number of indices ({k})"
        )
    if src._dtype is not x._dtype:
        raise DTypeError(
            f"{op}: self ({x._dtype.name}) and source ({src._dtype.name}) must have the same dtype"
        )
    stack = x._device.stack
    ih = idx._h if idx._dtype is dt.int64 else stack.cast(idx._h, dt.int64)
    _check_index_values(stack, ih, xs[d], d, op)
    sh = _as1(src._h, stack)
    if alpha != 1:
        sh = stack.binary("mul", sh, _fill_scalar(alpha, x._dtype, op))
    if k == 0 or not all(ss):
        return keep_graph(stack, stack.copy(x._h), sh)
    view = tuple(k if i == d else 1 for i in range(len(ss)))
    full_idx = stack.expand(stack.reshape(_as1(ih, stack), view), ss)
    h = stack.scatter(_as1(x._h, stack), d, full_idx, sh, "add")
    return stack.reshape(h, ()) if not x.ndim else h


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    """A copy of input with alpha * source added at index (a vector) along dim; repeated indices add up."""
    return Tensor._make(
        _index_add(input, dim, index, source, alpha, "index_add"), input._dtype, input._device
    )


def index_add_(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    h = _index_add(input, dim, index, source, alpha, "index_add_")
    input._device.stack.assign(input._h, h)
    return input


# ----------------------------------------------------------------------------------------------------
# masks
# ----------------------------------------------------------------------------------------------------
def _mask(x: Tensor, mask: Any, op: str) -> Tensor:
    if not isinstance(mask, Tensor):
        raise DTypeError(f"{op}: mask must be a Tensor, got {type(mask).__name__}")
    if mask._dtype is not dt.bool_:
        raise DTypeError(f"{op}: only supports boolean masks, but got mask with dtype {mask._dtype.name}")
    same_device(op, x, mask)
    return mask


def _mask_value(x: Tensor, value: Any, op: str) -> Any:
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ShapeError(
                f"{op}: only supports a 0-dimensional value tensor, but got tensor with "
                f"{value.ndim} dimension(s)"
            )
        value = value.item()
    return _fill_scalar(value, x._dtype, op)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    """input with value where mask (broadcast against input) is True."""
    x = _t(input, "masked_fill")
    m = _mask(x, mask, "masked_fill")
    v = _mask_value(x, value, "masked_fill")
    shape = broadcast_shapes(x.shape, m.shape, op="masked_fill")
    stack = x._device.stack
    h = x._h if x.shape == shape else stack.expand(x._h, shape)
    mh = m._h if m.shape == shape else stack.expand(m._h, shape)
    return Tensor._make(stack.masked_fill(h, mh, v), x._dtype, x._device)


def masked_fill_(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    x = _t(input, "masked_fill_")
    m = _mask(x, mask, "masked_fill_")
    v = _mask_value(x, value, "masked_fill_")
    if broadcast_shapes(x.shape, m.shape, op="masked_fill_") != x.shape:
        raise ShapeError(
            f"masked_fill_: mask of shape {_fmt(m.shape)} cannot be broadcast to the tensor's shape "
            f"{_fmt(x.shape)} in place"
        )
    _check_writable(x, "masked_fill_")
    stack = x._device.stack
    mh = m._h if m.shape == x.shape else stack.expand(m._h, x.shape)
    stack.assign(x._h, stack.masked_fill(x._h, mh, v))
    return x


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The elements of input where mask (broadcast with input) is True, as a 1-d tensor."""
    x = _t(input, "masked_select")
    m = _mask(x, mask, "masked_select")
    shape = broadcast_shapes(x.shape, m.shape, op="masked_select")
    stack = x._device.stack
    h = x._h if x.shape == shape else stack.expand(x._h, shape)
    mh = m._h if m.shape == shape else stack.expand(m._h, shape)
    if not shape:
        h, mh = stack.reshape(h, (1,)), stack.reshape(mh, (1,))
    return Tensor._make(stack.getitem(h, (mh,)), x._dtype, x._device)


def nonzero(input: Tensor, *, as_tuple: bool = False) -> Any:
    """Indices of the non-zero elements: a (count, ndim) int64 tensor, or a tuple of 1-d index tensors."""
    x = _t(input, "nonzero")
    stack = x._device.stack
    dev = x._device
    mh = x._h if x._dtype is dt.bool_ else stack.binary("ne", x._h, 0)
    shape = x.shape
    if not shape:
        mh = stack.reshape(mh, (1,))
        cols = [stack.getitem(stack.arange(0, 1, 1, dt.int64), (mh,))]
        if as_tuple:
            return (Tensor._make(cols[0], dt.int64, dev),)
        return Tensor._make(stack.full((cols[0].shape[0], 0), 0, dt.int64), dt.int64, dev)
    cols = []
    for d, n in enumerate(shape):
        view = tuple(n if i == d else 1 for i in range(len(shape)))
        grid = stack.expand(stack.reshape(stack.arange(0, n, 1, dt.int64), view), shape)
        cols.append(stack.getitem(grid, (mh,)))
    if as_tuple:
        return tuple(Tensor._make(c, dt.int64, dev) for c in cols)
    k = cols[0].shape[0]
    return Tensor._make(stack.cat([stack.reshape(c, (k, 1)) for c in cols], 1), dt.int64, dev)


def argwhere(input: Tensor) -> Tensor:
    return nonzero(input)


def take(input: Tensor, index: Tensor) -> Tensor:
    """input treated as 1-d, read at index (any shape; negative values count from the end)."""
    x = _t(input, "take")
    idx = _int64_index(index, "take")
    same_device("take", x, idx)
    n = x.numel()
    stack = x._device.stack
    flat = stack.reshape(x._h, (n,))
    if idx.numel() == 0:
        return Tensor._make(keep_graph(stack, stack.full(idx.shape, 0, x._dtype), x), x._dtype, x._device)
    ih = _index_handle(x, idx, n, 0, "take")
    return Tensor._make(stack.getitem(flat, (ih,)), x._dtype, x._device)


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """Values at indices along dim (indices broadcast against input outside dim); dim=None works on the
    flattened input."""
    x = _t(input, "take_along_dim")
    idx = _int64_index(indices, "take_along_dim")
    same_device("take_along_dim", x, idx)
    stack = x._device.stack
    if dim is None:  # the flattened form does not wrap indices (PyTorch gathers directly)
        return gather(
            Tensor._make(stack.reshape(x._h, (x.numel(),)), x._dtype, x._device),
            0,
            Tensor._make(stack.reshape(idx._h, (idx.numel(),)), idx._dtype, idx._device),
        )
    if x.ndim != idx.ndim:
        raise ShapeError(
            f"take_along_dim: input and indices should have the same number of dimensions, but got "
            f"{x.ndim} dimensions for input (shape {_fmt(x.shape)}), and {idx.ndim} dimensions for "
            f"indices (shape {_fmt(idx.shape)})"
        )
    d = norm_dim(dim, x.ndim, "take_along_dim")
    if x.ndim == 0:
        return gather(x, 0, idx)
    xs, ixs = list(x.shape), list(idx.shape)
    xs[d] = ixs[d] = 1
    b = list(broadcast_shapes(tuple(xs), tuple(ixs), op="take_along_dim"))
    xshape = tuple(b[:d] + [x.shape[d]] + b[d + 1 :])
    ishape = tuple(b[:d] + [idx.shape[d]] + b[d + 1 :])
    xb = Tensor._make(stack.expand(x._h, xshape) if xshape != x.shape else x._h, x._dtype, x._device)
    ib = Tensor._make(
        stack.expand(idx._h, ishape) if ishape != idx.shape else idx._h, idx._dtype, idx._device
    )
    n = x.shape[d]
    if ib.numel():
        if n == 0:
            raise IndexOutOfRangeError(
                f"take_along_dim: cannot take indices {_fmt(idx.shape)} along dimension {d} of size 0 "
                f"(input shape {_fmt(x.shape)})"
            )
        ib = ib % n  # PyTorch wraps the indices of the dim form modulo the dim's size (so -1 is the last)
    return gather(xb, d, ib)


__all__ = [
    "gather",
    "scatter",
    "scatter_add",
    "index_select",
    "index_add",
    "index_put",
    "masked_fill",
    "masked_select",
    "nonzero",
    "argwhere",
    "take",
    "take_along_dim",
]

TENSOR_METHODS: dict[str, Any] = {
    "gather": gather,
    "scatter": scatter,
    "scatter_": scatter_,
    "scatter_add": scatter_add,
    "scatter_add_": scatter_add_,
    "index_select": index_select,
    "index_add": index_add,
    "index_add_": index_add_,
    "index_put": index_put,
    "index_put_": index_put_,
    "masked_fill": masked_fill,
    "masked_fill_": masked_fill_,
    "masked_select": masked_select,
    "nonzero": nonzero,
    "argwhere": argwhere,
    "take": take,
    "take_along_dim": take_along_dim,
}
