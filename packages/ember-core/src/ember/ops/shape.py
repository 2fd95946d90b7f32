"""Shape and movement ops with PyTorch's names and semantics: reshape/view, permute/transpose, squeeze,
expand/broadcast, repeat/tile, flip/roll, cat/stack/split, tril/triu, diagonal, meshgrid, unfold.

Every op validates its arguments here (typed errors naming the op and the shapes) and then makes one or a few
calls to the backend's movement primitives (``reshape``, ``permute``, ``expand``, ``getitem``, ``cat``,
``flip``, ``tril``). Ops that PyTorch documents as views (reshape of viewable data, view, permute, transpose,
expand, squeeze, unsqueeze, narrow, split/chunk/unbind) may share memory with their input where the backend's
primitive returns a view (flex does, as numpy does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..bridge import same_device
from ..errors import DimError, DTypeError, IndexOutOfRangeError, ShapeError, UnsupportedError, ValueRangeError
from ..shapes import broadcast_shapes as _broadcast_shapes
from ..shapes import norm_dim, norm_dims, view_strides
from ..tensor import Tensor
from .elementwise import keep_graph

Shape = tuple[int, ...]


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
def _t(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _make(x: Tensor, h: Any) -> Tensor:
    return Tensor._make(h, x._dtype, x._device)


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _as_int(v: Any, op: str, what: str) -> int:
    if _is_int(v):
        return int(v)
    if isinstance(v, Tensor) and v.ndim == 0 and v._dtype.is_integer:
        return int(v.item())
    raise DTypeError(f"{op}: {what} must be an int, got {type(v).__name__} {v!r}")


def _int_args(args: Sequence[Any], op: str, what: str = "sizes") -> tuple[int, ...]:
    """Accept f(2, 3), f((2, 3)) and f([2, 3]) for a list of ints (negative values allowed). No arguments at all
    is the empty list, so ``x.reshape()``, ``x.expand()``, ``x.repeat()`` of a 0-d tensor give a 0-d tensor: a
    deliberate extension (PyTorch requires the argument), the same convention as ``zeros()`` in check_shape_arg."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return tuple(_as_int(a, op, what) for a in args)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _infer_shape(shape: tuple[int, ...], numel: int, op: str) -> Shape:
    """Resolve one -1 in shape against numel (PyTorch's infer_size)."""
    infer = -1
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            if infer >= 0:
                raise ShapeError(f"{op}: only one dimension can be inferred, got shape {_fmt(shape)}")
            infer = i
        elif s < 0:
            raise ShapeError(f"{op}: invalid shape dimension {s} in shape {_fmt(shape)}")
        else:
            known *= s
    if infer >= 0:
        if known == 0:
            raise ShapeError(
                f"{op}: cannot reshape tensor of {numel} elements into shape {_fmt(shape)} because the "
                "unspecified dimension size -1 can be any value and is ambiguous"
            )
        if numel % known == 0:
            return shape[:infer] + (numel // known,) + shape[infer + 1 :]
    elif known == numel:
        return shape
    raise ShapeError(f"{op}: shape '{_fmt(shape)}' is invalid for input of size {numel}")


def _reshape_h(x: Tensor, shape: Shape) -> Any:
    h = x._h
    if tuple(h.shape) == shape:
        return h
    return x._device.stack.reshape(h, shape)


# ----------------------------------------------------------------------------------------------------
# reshape / view
# ----------------------------------------------------------------------------------------------------
def reshape(input: Tensor, *shape: Any) -> Tensor:
    """Same data in a new shape (one size may be -1); a view when the data allows it, else a copy."""
    x = _t(input, "reshape")
    s = _infer_shape(_int_args(shape, "reshape"), x.numel(), "reshape")
    return _make(x, _reshape_h(x, s))


def view(input: Tensor, *shape: Any) -> Tensor:
    """Like reshape, but never copies: ShapeError when the strides do not allow a view (as PyTorch)."""
    x = _t(input, "view")
    if len(shape) == 1 and isinstance(shape[0], (dt.DType, str)):
        raise UnsupportedError(
            "view(dtype): reinterpreting a tensor's bits as another dtype is not supported"
        )
    s = _infer_shape(_int_args(shape, "view"), x.numel(), "view")
    strides = getattr(x._h, "strides", None)
    if strides is not None and tuple(x.shape) != s:
        item = x._h.dtype.itemsize if hasattr(x._h, "dtype") else x._dtype.itemsize
        if view_strides(tuple(x.shape), [st // item for st in strides], s) is None:
            raise ShapeError(
                f"view: view size {_fmt(s)} is not compatible with input tensor's size {_fmt(x.shape)} and "
                "stride "
                "(at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead."
            )
    return _make(x, _reshape_h(x, s))


def view_as(input: Tensor, other: Tensor) -> Tensor:
    return view(input, _t(other, "view_as").shape)


def reshape_as(input: Tensor, other: Tensor) -> Tensor:
    return reshape(input, _t(other, "reshape_as").shape)


def ravel(input: Tensor) -> Tensor:
    """A 1-d view (or copy) of the data."""
    x = _t(input, "ravel")
    return _make(x, _reshape_h(x, (x.numel(),)))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one; a 0-d input becomes 1-d."""
    x = _t(input, "flatten")
    n = x.ndim
    s = norm_dim(start_dim, n, "flatten")
    e = norm_dim(end_dim, n, "flatten")
    if s > e:
        raise DimError(f"flatten: start_dim ({start_dim}) cannot come after end_dim ({end_dim})")
    if n == 0:
        return _make(x, _reshape_h(x, (1,)))
    shape = x.shape
    new = shape[:s] + (_numel(shape[s : e + 1]),) + shape[e + 1 :]
    return _make(x, _reshape_h(x, new))


def unflatten(input: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split dim into sizes (one of which may be -1)."""
    x = _t(input, "unflatten")
    d = norm_dim(dim, x.ndim, "unflatten")
    if x.ndim == 0:
        raise DimError("unflatten: cannot unflatten a 0-d tensor")
    sizes_t = _int_args((sizes,), "unflatten")
    if not sizes_t:
        raise ShapeError("unflatten: sizes must be non-empty")
    n = x.shape[d]
    try:
        resolved = _infer_shape(sizes_t, n, "unflatten")
    except ShapeError:
        raise ShapeError(
            f"unflatten: provided sizes {_fmt(sizes_t)} don't multiply up to the size of dim {dim} ({n}) in "
            "the "
            f"input tensor of shape {_fmt(x.shape)}"
        ) from None
    return _make(x, _reshape_h(x, x.shape[:d] + resolved + x.shape[d + 1 :]))


# ----------------------------------------------------------------------------------------------------
# permutations
# ----------------------------------------------------------------------------------------------------
def _permute_h(x: Tensor, perm: tuple[int, ...]) -> Any:
    if perm == tuple(range(len(perm))):
        return x._h
    return x._device.stack.permute(x._h, perm)


def permute(input: Tensor, *dims: Any) -> Tensor:
    """Reorder the dims (``x.permute(2, 0, 1)`` or ``ember.permute(x, (2, 0, 1))``); a view."""
    x = _t(input, "permute")
    raw = _int_args(dims, "permute", "dims")
    n = x.ndim
    if len(raw) != n:
        raise DimError(
            f"permute: number of dims don't match in permute: the tensor has {n} dims (shape "
            f"{_fmt(x.shape)}) "
            f"but {len(raw)} dims were given: {raw}"
        )
    perm = tuple(norm_dim(d, n, "permute") for d in raw)
    if len(set(perm)) != n:
        raise DimError(f"permute: repeated dim in permute {raw}; dims must be a permutation of 0..{n - 1}")
    return _make(x, _permute_h(x, perm))


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dims; a view."""
    x = _t(input, "transpose")
    n = x.ndim
    a = norm_dim(dim0, n, "transpose")
    b = norm_dim(dim1, n, "transpose")
    if n < 2 or a == b:
        return _make(x, x._h)
    perm = list(range(n))
    perm[a], perm[b] = perm[b], perm[a]
    return _make(x, _permute_h(x, tuple(perm)))


def swapaxes(input: Tensor, axis0: int, axis1: int) -> Tensor:
    return transpose(input, axis0, axis1)


def swapdims(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return transpose(input, dim0, dim1)


def t(input: Tensor) -> Tensor:
    """Transpose a tensor of at most 2 dims (0-d and 1-d are returned as they are)."""
    x = _t(input, "t")
    if x.ndim > 2:
        raise ShapeError(
            f"t: expects a tensor with <= 2 dimensions, but got a {x.ndim}-d tensor of shape {_fmt(x.shape)}"
        )
    return transpose(x, 0, -1) if x.ndim == 2 else _make(x, x._h)


def _T(self: Tensor) -> Tensor:
    """All dims reversed (``x.T``)."""
    return _make(self, _permute_h(self, tuple(range(self.ndim - 1, -1, -1))))


def _mT(self: Tensor) -> Tensor:
    """The last two dims swapped (``x.mT``, batched matrix transpose)."""
    if self.ndim < 2:
        raise ShapeError(f"mT: tensor must have at least 2 dimensions, got shape {_fmt(self.shape)}")
    return transpose(self, -2, -1)


def movedim(input: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move the dims in source to the positions in destination, keeping the other dims' order."""
    x = _t(input, "movedim")
    n = x.ndim
    try:
        src = (source,) if _is_int(source) else tuple(source)  # type: ignore[arg-type]
        dst = (destination,) if _is_int(destination) else tuple(destination)  # type: ignore[arg-type]
    except TypeError:
        raise DimError(f"movedim: source and destination must be ints or sequences of ints, got "
                       f"{type(source).__name__} {source!r} and {type(destination).__name__} {destination!r}") from None
    if len(src) != len(dst):
        raise ValueRangeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain the same "
            f"number of dims as destination ({list(dst)} dims)"
        )
    s = norm_dims(src, n, "movedim") if n else tuple(norm_dim(d, 0, "movedim") for d in src)
    d = norm_dims(dst, n, "movedim") if n else tuple(norm_dim(v, 0, "movedim") for v in dst)
    if n == 0:
        return _make(x, x._h)
    perm: list[int | None] = [None] * n
    for a, b in zip(s, d):
        perm[b] = a
    rest = iter(i for i in range(n) if i not in s)
    out = tuple(p if p is not None else next(rest) for p in perm)
    return _make(x, _permute_h(x, out))


def moveaxis(input: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    return movedim(input, source, destination)


# ----------------------------------------------------------------------------------------------------
# squeeze / unsqueeze
# ----------------------------------------------------------------------------------------------------
def squeeze(input: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Remove size-1 dims (all of them, or those in dim; dims of other sizes are left alone). ``dim=None`` means
    all dims, like omitting it: a deliberate extension (PyTorch refuses an explicit None) that matches ember's
    dim=None convention of the reductions."""
    x = _t(input, "squeeze")
    shape = x.shape
    dims = norm_dims(dim, x.ndim, "squeeze")
    new = tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    return _make(x, _reshape_h(x, new))


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at dim (in range [-ndim-1, ndim])."""
    x = _t(input, "unsqueeze")
    d = norm_dim(dim, x.ndim + 1, "unsqueeze")
    shape = x.shape
    return _make(x, _reshape_h(x, shape[:d] + (1,) + shape[d:]))


def atleast_1d(*tensors: Any) -> Any:
    return _atleast(tensors, 1)


def atleast_2d(*tensors: Any) -> Any:
    return _atleast(tensors, 2)


def atleast_3d(*tensors: Any) -> Any:
    return _atleast(tensors, 3)


def _atleast(tensors: tuple[Any, ...], n: int) -> Any:
    single = len(tensors) == 1 and isinstance(tensors[0], Tensor)
    seq = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
    out = []
    for x in seq:
        x = _t(x, f"atleast_{n}d")
        s = x.shape
        if len(s) < n:
            if n == 3 and len(s) == 2:
                s = s + (1,)
            elif n == 3 and len(s) == 1:
                s = (1,) + s + (1,)
            else:
                s = (1,) * (n - len(s)) + s
            x = _make(x, _reshape_h(x, s))
        out.append(x)
    return out[0] if single else tuple(out)


# ----------------------------------------------------------------------------------------------------
# broadcasting
# ----------------------------------------------------------------------------------------------------
def _expand_shape(shape: Shape, sizes: tuple[int, ...], op: str) -> Shape:
    n, k = len(shape), len(sizes)
    if k < n:
        raise ShapeError(
            f"{op}: the number of sizes provided ({k}) must be greater or equal to the number of dimensions "
            "in "
            f"the tensor ({n}); sizes {_fmt(sizes)}, tensor shape {_fmt(shape)}"
        )
    out = []
    for i, s in enumerate(sizes):
        j = i - (k - n)
        if j < 0:
            if s < 0:
                raise ShapeError(
                    f"{op}: the expanded size of the tensor ({s}) isn't allowed in a leading, "
                    f"non-existing dimension {i}"
                )
            out.append(s)
            continue
        have = shape[j]
        if s == -1:
            out.append(have)
        elif s < 0:
            raise ShapeError(f"{op}: invalid size {s} at dim {i}")
        elif have == s or have == 1:
            out.append(s)
        else:
            raise ShapeError(
                f"{op}: the expanded size of the tensor ({s}) must match the existing size ({have}) at "
                f"non-singleton dimension {i}.  Target sizes: {_fmt(sizes)}.  Tensor sizes: {_fmt(shape)}"
            )
    return tuple(out)


def _expand_h(x: Tensor, shape: Shape) -> Any:
    if tuple(x._h.shape) == shape:
        return x._h
    return x._device.stack.expand(x._h, shape)


def expand(input: Tensor, *sizes: Any) -> Tensor:
    """Broadcast to sizes (-1 keeps a dim; new dims go in front); a view, no data is copied."""
    x = _t(input, "expand")
    return _make(x, _expand_h(x, _expand_shape(x.shape, _int_args(sizes, "expand"), "expand")))


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, _t(other, "expand_as").shape)


def broadcast_to(input: Tensor, size: Sequence[int]) -> Tensor:
    x = _t(input, "broadcast_to")
    return _make(x, _expand_h(x, _expand_shape(x.shape, _int_args((size,), "broadcast_to"), "broadcast_to")))


def broadcast_shapes(*shapes: Any) -> tuple[int, ...]:
    """The shape all the given shapes broadcast to (ints count as 1-d shapes, as in PyTorch)."""
    norm = [(s,) if _is_int(s) else tuple(s) for s in shapes]
    return _broadcast_shapes(*norm, op="broadcast_shapes")


def broadcast_tensors(*tensors: Any) -> tuple[Tensor, ...]:
    """Expand every tensor to their common broadcast shape (views)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    ts = [_t(x, "broadcast_tensors") for x in tensors]
    if not ts:
        return ()
    same_device("broadcast_tensors", *ts)
    shape = _broadcast_shapes(*(x.shape for x in ts), op="broadcast_tensors")
    return tuple(_make(x, _expand_h(x, shape)) for x in ts)


def repeat(input: Tensor, *repeats: Any) -> Tensor:
    """Tile the data ``repeats`` times along each dim (new leading dims allowed); always a copy."""
    x = _t(input, "repeat")
    reps = _int_args(repeats, "repeat", "repeats")
    n = x.ndim
    if len(reps) < n:
        raise ShapeError(
            f"repeat: number of dimensions of repeat dims ({len(reps)}) can not be smaller than number of "
            f"dimensions of tensor ({n}); repeats {_fmt(reps)}, shape {_fmt(x.shape)}"
        )
    if any(r < 0 for r in reps):
        raise ValueRangeError(f"repeat: repeats must be non-negative, got {_fmt(reps)}")
    shape = (1,) * (len(reps) - n) + x.shape
    stack = x._device.stack
    out_shape = tuple(r * s for r, s in zip(reps, shape))
    if all(r == 1 for r in reps):
        return _make(x, stack.copy(stack.reshape(x._h, out_shape)))
    # interleave a broadcast dim before each dim: (1, s0, 1, s1, ...) -> (r0, s0, r1, s1, ...) -> merge pairs
    inter = tuple(v for s in shape for v in (1, s))
    big = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    h = stack.expand(stack.reshape(x._h, inter), big)
    return _make(x, stack.contiguous(stack.reshape(h, out_shape)))


def tile(input: Tensor, dims: Sequence[int]) -> Tensor:
    """numpy.tile: like repeat, with missing leading repeats taken as 1."""
    x = _t(input, "tile")
    reps = _int_args((dims,), "tile", "dims")
    reps = (1,) * (x.ndim - len(reps)) + reps
    return repeat(x, reps)


# ----------------------------------------------------------------------------------------------------
# flips and rolls
# ----------------------------------------------------------------------------------------------------
def flip(input: Tensor, dims: Any) -> Tensor:
    """Reverse the order of elements along dims (a copy, as in PyTorch)."""
    x = _t(input, "flip")
    d = norm_dims(dims if not isinstance(dims, list) else tuple(dims), x.ndim, "flip")
    if not d:
        return _make(x, x._device.stack.copy(x._h))
    return _make(x, x._device.stack.flip(x._h, d))


def fliplr(input: Tensor) -> Tensor:
    x = _t(input, "fliplr")
    if x.ndim < 2:
        raise ShapeError(f"fliplr: input must be >= 2-d, got shape {_fmt(x.shape)}")
    return flip(x, (1,))


def flipud(input: Tensor) -> Tensor:
    x = _t(input, "flipud")
    if x.ndim < 1:
        raise ShapeError("flipud: input must be >= 1-d, got a 0-d tensor")
    return flip(x, (0,))


def roll(input: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Rotate elements along dims by shifts; with dims=None the flattened tensor is rolled."""
    x = _t(input, "roll")
    sh = (shifts,) if not isinstance(shifts, (tuple, list)) else tuple(shifts)
    sh = tuple(_as_int(s, "roll", "shifts") for s in sh)
    if dims is None:
        if len(sh) != 1:
            raise ValueRangeError(f"roll: shifts must have one element when dims is None, got {sh}")
        flat = reshape(x, -1)
        return reshape(roll(flat, sh, 0), x.shape)
    ds = (dims,) if _is_int(dims) else tuple(dims)  # type: ignore[arg-type]
    if not sh:
        raise ValueRangeError("roll: `shifts` required")
    if len(sh) != len(ds):
        raise ValueRangeError(f"roll: shifts and dimensions must align. shifts: {len(sh)}, dims: {len(ds)}")
    ds = tuple(_as_int(d, "roll", "dims") for d in ds)
    if x.numel() == 0:  # as in PyTorch, an empty tensor is copied before its dims are checked
        return _make(x, x._device.stack.copy(x._h))
    if x.ndim == 0:
        raise DimError(f"roll: Dimension specified as {ds[0]} but tensor has no dimensions")
    nd = tuple(norm_dim(d, x.ndim, "roll") for d in ds)
    stack = x._device.stack
    h = x._h
    for s, d in zip(sh, nd):
        n = h.shape[d] if x.ndim else 1
        if n == 0 or s % n == 0:
            continue
        k = n - s % n
        pre = (slice(None),) * d
        h = stack.cat([stack.getitem(h, pre + (slice(k, n),)), stack.getitem(h, pre + (slice(0, k),))], d)
    if h is x._h:
        h = stack.copy(h)
    return _make(x, h)


# ----------------------------------------------------------------------------------------------------
# slicing views
# ----------------------------------------------------------------------------------------------------
def narrow(input: Tensor, dim: int, start: Any, length: int) -> Tensor:
    """The slice [start, start + length) of dim (a view)."""
    x = _t(input, "narrow")
    if x.ndim == 0:
        raise DimError("narrow: cannot be applied to a 0-dim tensor")
    d = norm_dim(dim, x.ndim, "narrow")
    st = _as_int(start, "narrow", "start")
    ln = _as_int(length, "narrow", "length")
    n = x.shape[d]
    if not -n <= st <= n:
        raise IndexOutOfRangeError(
            f"narrow: start out of range (expected to be in range of [{-n}, {n}], but got {st})"
        )
    if st < 0:
        st += n
    if ln < 0:
        raise ValueRangeError(f"narrow: length must be non-negative, got {ln}")
    if st + ln > n:
        raise IndexOutOfRangeError(f"narrow: start ({st}) + length ({ln}) exceeds dimension size ({n}).")
    key = (slice(None),) * d + (slice(st, st + ln),)
    return _make(x, x._device.stack.getitem(x._h, key))


def select(input: Tensor, dim: int, index: int) -> Tensor:
    """The slice at index along dim, with dim removed (a view)."""
    x = _t(input, "select")
    if x.ndim == 0:
        raise DimError("select: cannot be applied to a 0-dim tensor")
    d = norm_dim(dim, x.ndim, "select")
    i = _as_int(index, "select", "index")
    n = x.shape[d]
    if not -n <= i < n:
        raise IndexOutOfRangeError(f"select: index {i} is out of bounds for dimension {d} with size {n}")
    key = (slice(None),) * d + (i % n,)
    return _make(x, x._device.stack.getitem(x._h, key))


def _slices(x: Tensor, d: int, bounds: Sequence[tuple[int, int]]) -> tuple[Tensor, ...]:
    stack = x._device.stack
    pre = (slice(None),) * d
    return tuple(_make(x, stack.getitem(x._h, pre + (slice(a, b),))) for a, b in bounds)


def split(tensor: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of size split_size (the last may be smaller), or of the listed sizes (views)."""
    x = _t(tensor, "split")
    if x.ndim == 0:
        raise DimError("split: cannot split a 0-d tensor")
    d = norm_dim(dim, x.ndim, "split")
    n = x.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = _int_args((split_size_or_sections,), "split", "split_sizes")
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ShapeError(
                f"split: split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at "
                f"dimension {d}, shape {_fmt(x.shape)}), but got split_sizes={_fmt(sizes)}"
            )
        bounds, pos = [], 0
        for s in sizes:
            bounds.append((pos, pos + s))
            pos += s
        return _slices(x, d, bounds)
    size = _as_int(split_size_or_sections, "split", "split_size")
    if size < 0:
        raise ValueRangeError(f"split: split_size must be non-negative, got {size}")
    if size == 0:
        if n != 0:
            raise ValueRangeError(
                f"split: split_size can only be 0 if dimension size is 0, but got dimension size of {n}"
            )
        return _slices(x, d, [(0, 0)])
    return _slices(x, d, [(a, min(a + size, n)) for a in range(0, max(n, 1), size)])


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Up to chunks pieces of equal size (the last may be smaller), as PyTorch."""
    x = _t(input, "chunk")
    c = _as_int(chunks, "chunk", "chunks")
    if c <= 0:
        raise ValueRangeError(f"chunk: expects `chunks` to be greater than 0, got: {c}")
    if x.ndim == 0:
        raise DimError("chunk: cannot chunk a 0-d tensor")
    d = norm_dim(dim, x.ndim, "chunk")
    n = x.shape[d]
    if n == 0:
        return _slices(x, d, [(0, 0)] * c)
    return split(x, -(-n // c), d)


def tensor_split(input: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """numpy.array_split: n nearly equal sections, or splits at the given indices (views)."""
    x = _t(input, "tensor_split")
    if x.ndim == 0:
        raise DimError("tensor_split: expected at least a 1-dimensional tensor, but got a 0-d tensor")
    d = norm_dim(dim, x.ndim, "tensor_split")
    n = x.shape[d]
    ios = indices_or_sections
    if isinstance(ios, Tensor):
        ios = ios.tolist() if ios.ndim == 1 else int(ios.item())
    if isinstance(ios, (list, tuple)):
        idx = _int_args((ios,), "tensor_split", "indices")
        cuts = [min(max(i + n if i < 0 else i, 0), n) for i in idx]
        starts = [0] + cuts
        ends = cuts + [n]
        return _slices(x, d, [(a, max(a, b)) for a, b in zip(starts, ends)])
    k = _as_int(ios, "tensor_split", "sections")
    if k <= 0:
        raise ValueRangeError(f"tensor_split: number of sections must be larger than 0, got {k}")
    base, extra = divmod(n, k)
    bounds, pos = [], 0
    for i in range(k):
        s = base + (1 if i < extra else 0)
        bounds.append((pos, pos + s))
        pos += s
    return _slices(x, d, bounds)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices along dim, dim removed (views)."""
    x = _t(input, "unbind")
    if x.ndim == 0:
        raise DimError("unbind: dimension specified as 0 but tensor has no dimensions")
    d = norm_dim(dim, x.ndim, "unbind")
    stack = x._device.stack
    pre = (slice(None),) * d
    return tuple(_make(x, stack.getitem(x._h, pre + (i,))) for i in range(x.shape[d]))


# ----------------------------------------------------------------------------------------------------
# joining
# ----------------------------------------------------------------------------------------------------
def _tensor_list(tensors: Any, op: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise DTypeError(f"{op}: expected a sequence of Tensors, got {type(tensors).__name__}")
    ts = list(tensors)
    if not ts:
        raise ValueRangeError(f"{op}: expected a non-empty list of Tensors")
    for i, v in enumerate(ts):
        if not isinstance(v, Tensor):
            raise DTypeError(f"{op}: expected Tensors, got {type(v).__name__} at position {i}")
    same_device(op, *ts)
    return ts


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along an existing dim; dtypes promote as in PyTorch; 1-d empty tensors are skipped."""
    ts = _tensor_list(tensors, "cat")
    for i, v in enumerate(ts):
        if v.ndim == 0:
            raise ShapeError(f"cat: zero-dimensional tensor (at position {i}) cannot be concatenated")
    rdt = ts[0]._dtype
    for v in ts[1:]:
        if v._dtype is not rdt:
            rdt = dt.promote_types(rdt, v._dtype)
    # PyTorch's legacy rule: tensors of shape (0,) are skipped whatever the others' rank
    keep = [(i, v) for i, v in enumerate(ts) if v.shape != (0,)]
    dev = ts[0]._device
    stack = dev.stack
    # skipped tensors still get (empty) gradients, as in PyTorch (Backend.keep_graph)
    skipped = [v for v in ts if v.shape == (0,)]
    if not keep:
        d = norm_dim(dim, 1, "cat")
        return Tensor._make(keep_graph(stack, stack.full((0,), 0, rdt), *skipped), rdt, dev)
    i0, ref = keep[0]
    n = ref.ndim
    d = norm_dim(dim, n, "cat")
    rshape = ref.shape
    for i, v in keep[1:]:
        if v.ndim != n:
            raise ShapeError(
                f"cat: tensors must have same number of dimensions: got {n} (tensor {i0}, shape "
                f"{_fmt(rshape)}) "
                f"and {v.ndim} (tensor {i}, shape {_fmt(v.shape)})"
            )
        for k in range(n):
            if k != d and v.shape[k] != rshape[k]:
                raise ShapeError(
                    f"cat: sizes of tensors must match except in dimension {d}. Expected size {rshape[k]} "
                    "but "
                    f"got size {v.shape[k]} for tensor number {i} in the list (shapes {_fmt(rshape)} and "
                    f"{_fmt(v.shape)}, dim {k})"
                )
    hs = [v._h if v._dtype is rdt else stack.cast(v._h, rdt) for _, v in keep]
    if len(hs) == 1:
        h = stack.copy(hs[0]) if hs[0] is keep[0][1]._h else hs[0]
    else:
        h = stack.cat(hs, d)
    return Tensor._make(keep_graph(stack, h, *skipped) if skipped else h, rdt, dev)


def concat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return cat(tensors, dim)


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    return cat(tensors, axis)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join equal-shaped tensors along a new dim."""
    ts = _tensor_list(tensors, "stack")
    s0 = ts[0].shape
    for i, v in enumerate(ts[1:], 1):
        if v.shape != s0:
            raise ShapeError(
                f"stack: expects each tensor to be equal size, but got {_fmt(s0)} at entry 0 and "
                f"{_fmt(v.shape)} at entry {i}"
            )
    d = norm_dim(dim, len(s0) + 1, "stack")
    new = s0[:d] + (1,) + s0[d:]
    parts = [_make(v, _reshape_h(v, new)) for v in ts]
    return cat(parts, d)


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    ts = atleast_1d(*_tensor_list(tensors, "hstack"))
    ts = (ts,) if isinstance(ts, Tensor) else ts
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    ts = atleast_2d(*_tensor_list(tensors, "vstack"))
    return cat((ts,) if isinstance(ts, Tensor) else ts, 0)


row_stack = vstack


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    ts = atleast_3d(*_tensor_list(tensors, "dstack"))
    return cat((ts,) if isinstance(ts, Tensor) else ts, 2)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    ts = _tensor_list(tensors, "column_stack")
    cols = [v if v.ndim >= 2 else reshape(v, (v.numel(), 1)) for v in ts]
    return cat(cols, 1)


# ----------------------------------------------------------------------------------------------------
# triangles, diagonals, grids, windows
# ----------------------------------------------------------------------------------------------------
def _tri(input: Tensor, diagonal: int, upper: bool) -> Tensor:
    op = "triu" if upper else "tril"
    x = _t(input, op)
    if x.ndim < 2:
        raise ShapeError(f"{op}: input tensor must have at least 2 dimensions, got shape {_fmt(x.shape)}")
    k = _as_int(diagonal, op, "diagonal")
    return _make(x, x._device.stack.tril(x._h, k, upper))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (elements above the diagonal-th diagonal zeroed)."""
    return _tri(input, diagonal, False)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims."""
    return _tri(input, diagonal, True)


def _arange(x: Tensor, start: int, n: int) -> Any:
    return x._device.stack.arange(start, start + n, 1, dt.int64)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The offset-th diagonal of the (dim1, dim2) planes as a new last dim (a copy; PyTorch makes a view)."""
    x = _t(input, "diagonal")
    if x.ndim < 2:
        raise ShapeError(f"diagonal: input must have at least 2 dimensions, got shape {_fmt(x.shape)}")
    a = norm_dim(dim1, x.ndim, "diagonal")
    b = norm_dim(dim2, x.ndim, "diagonal")
    if a == b:
        raise DimError(f"diagonal: dimensions cannot be identical {dim1}, {dim2}")
    k = _as_int(offset, "diagonal", "offset")
    rest = tuple(i for i in range(x.ndim) if i not in (a, b))
    h = _permute_h(x, rest + (a, b))
    rows, cols = x.shape[a], x.shape[b]
    r0, c0 = max(-k, 0), max(k, 0)
    length = max(min(rows - r0, cols - c0), 0)
    stack = x._device.stack
    key = (Ellipsis, _arange(x, r0 if length else 0, length), _arange(x, c0 if length else 0, length))
    return _make(x, stack.getitem(h, key))


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """1-d input: a square matrix with input on the diagonal-th diagonal; 2-d input: that diagonal."""
    x = _t(input, "diag")
    k = _as_int(diagonal, "diag", "diagonal")
    if x.ndim == 2:
        return globals()["diagonal"](x, k)
    if x.ndim != 1:
        raise ShapeError(
            f"diag: supports 1-d or 2-d tensors, got a {x.ndim}-d tensor of shape {_fmt(x.shape)}"
        )
    n = x.shape[0]
    m = n + abs(k)
    stack = x._device.stack
    out = stack.full((m, m), 0, x._dtype)
    stack.setitem(out, (_arange(x, max(-k, 0), n), _arange(x, max(k, 0), n)), x._h)
    return _make(x, out)


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Put the last dim of input on the offset-th diagonal of new (dim1, dim2) planes."""
    x = _t(input, "diag_embed")
    if x.ndim == 0:
        raise ShapeError("diag_embed: input must have at least 1 dimension")
    k = _as_int(offset, "diag_embed", "offset")
    nd = x.ndim + 1
    a = norm_dim(dim1, nd, "diag_embed")
    b = norm_dim(dim2, nd, "diag_embed")
    if a == b:
        raise DimError(f"diag_embed: diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = x.shape[-1]
    m = n + abs(k)
    stack = x._device.stack
    out = stack.full(x.shape[:-1] + (m, m), 0, x._dtype)
    stack.setitem(out, (Ellipsis, _arange(x, max(-k, 0), n), _arange(x, max(k, 0), n)), x._h)
    # out's last two dims are the planes; move them to (a, b)
    res = _make(x, out)
    return movedim(res, (nd - 2, nd - 1), (a, b))


def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 1-d tensors ('ij' matrix indexing, or 'xy' Cartesian: first two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueRangeError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = _tensor_list(list(tensors), "meshgrid")
    for i, v in enumerate(ts):
        if v.ndim > 1:
            raise ShapeError(
                f"meshgrid: expects 0-d or 1-d tensors, got shape {_fmt(v.shape)} at position {i}"
            )
        if v._dtype is not ts[0]._dtype:
            raise DTypeError(
                f"meshgrid: expects all tensors to have the same dtype, got {ts[0]._dtype.name} and "
                f"{v._dtype.name}"
            )
    sizes = [v.numel() for v in ts]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    n = len(ts)
    for i, v in enumerate(ts):
        pos = i
        if swap and i < 2:
            pos = 1 - i
        view_shape = tuple(sizes[pos] if j == pos else 1 for j in range(n))
        out.append(_make(v, v._device.stack.expand(_reshape_h(v, view_shape), tuple(sizes))))
    return tuple(out)


def _unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """Sliding windows of size with stride step along dimension, as a new last dim (Tensor.unfold)."""
    x = _t(self, "unfold")
    d = norm_dim(dimension, x.ndim, "unfold")
    size = _as_int(size, "unfold", "size")
    step = _as_int(step, "unfold", "step")
    n = x.shape[d] if x.ndim else 1
    if size < 0:
        raise ValueRangeError(f"unfold: size is {size} but must be >= 0")
    if size > n:
        raise ShapeError(
            f"unfold: maximum size for tensor at dimension {d} is {n} but size is {size} "
            f"(shape {_fmt(x.shape)})"
        )
    if step <= 0:
        raise ValueRangeError(f"unfold: step is {step} but must be > 0")
    if x.ndim == 0:  # the one element, or none of it for size 0 (PyTorch)
        stack = x._device.stack
        h = _reshape_h(x, (1,))
        return _make(x, stack.getitem(h, (slice(0, size),)) if size == 0 else h)
    count = (n - size) // step + 1
    stack = x._device.stack
    starts = stack.reshape(stack.binary("mul", stack.arange(0, count, 1, dt.int64), step), (count, 1))
    idx = stack.binary("add", starts, stack.reshape(stack.arange(0, size, 1, dt.int64), (1, size)))
    h = stack.getitem(x._h, (slice(None),) * d + (idx,))  # shape: pre + (count, size) + post
    nd = x.ndim + 1
    perm = tuple(range(d + 1)) + tuple(range(d + 2, nd)) + (d + 1,)
    return _make(x, stack.permute(h, perm) if perm != tuple(range(nd)) else h)


__all__ = [
    "reshape",
    "view_as",
    "reshape_as",
    "ravel",
    "flatten",
    "unflatten",
    "permute",
    "transpose",
    "swapaxes",
    "swapdims",
    "t",
    "movedim",
    "moveaxis",
    "squeeze",
    "unsqueeze",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "expand_as",
    "broadcast_to",
    "broadcast_shapes",
    "broadcast_tensors",
    "tile",
    "flip",
    "fliplr",
    "flipud",
    "roll",
    "narrow",
    "select",
    "split",
    "chunk",
    "tensor_split",
    "unbind",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "row_stack",
    "dstack",
    "column_stack",
    "tril",
    "triu",
    "diagonal",
    "diag",
    "diag_embed",
    "meshgrid",
]

TENSOR_METHODS: dict[str, Any] = {
    "reshape": reshape,
    "view": view,
    "view_as": view_as,
    "reshape_as": reshape_as,
    "ravel": ravel,
    "flatten": flatten,
    "unflatten": unflatten,
    "permute": permute,
    "transpose": transpose,
    "swapaxes": swapaxes,
    "swapdims": swapdims,
    "t": t,
    "T": property(_T),
    "mT": property(_mT),
    "movedim": movedim,
    "moveaxis": moveaxis,
    "squeeze": squeeze,
    "unsqueeze": unsqueeze,
    "expand": expand,
    "expand_as": expand_as,
    "broadcast_to": broadcast_to,
    "repeat": repeat,
    "tile": tile,
    "flip": flip,
    "fliplr": fliplr,
    "flipud": flipud,
    "roll": roll,
    "narrow": narrow,
    "select": select,
    "split": split,
    "chunk": chunk,
    "tensor_split": tensor_split,
    "unbind": unbind,
    "tril": tril,
    "triu": triu,
    "diagonal": diagonal,
    "diag": diag,
    "diag_embed": diag_embed,
    "unfold": _unfold,
}
