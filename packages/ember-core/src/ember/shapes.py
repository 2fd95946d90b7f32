"""Shape arithmetic: broadcasting, dim normalisation, size arguments, pooling output sizes and view strides.

Every layer needs these: the Bridge and the ops validate user input with them, the backend contract's default
compositions size their outputs with them, and backends and decorators (flex, OpenCL, fusion) compute result
shapes and strides with them. This module is therefore a *leaf*: it imports only the standard library, numpy
and :mod:`ember.errors`, so any ember module or plugin can import it at module level without an import cycle
(``tests/test_invariants.py`` holds it to that). Anything that needs a tensor, a device or a dtype belongs in
the Bridge (``ember.bridge``), not here.

Errors are ember's typed errors and name the op: :class:`~ember.errors.ShapeError` for shapes,
:class:`~ember.errors.DimError` for dims.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import DimError, ShapeError, ValueRangeError

Shape = tuple[int, ...]


class Size(tuple):
    """A tensor's shape: a tuple of ints, as ``torch.Size`` (``x.shape``, ``x.size()``, ``ember.Size([2, 3])``).

    It compares, hashes and unpacks as the plain tuple it is, so it can be passed wherever a shape is accepted;
    slicing and ``+`` keep it a Size, and :meth:`numel` is the number of elements. ``repr`` is PyTorch's
    (``ember.Size([2, 3])``); ``str`` and f-strings give the tuple, ``(2, 3)``, so messages stay short.
    """

    __slots__ = ()

    def __new__(cls, sizes: Any = ()) -> Size:
        """``ember.Size(iterable of ints)``; anything else is a ShapeError naming the offending item, as torch
        refuses it. (Shapes ember makes itself skip the check: :func:`as_size`.)"""
        try:
            items = list(sizes)
        except TypeError:
            raise ShapeError(f"Size: expected an iterable of ints, got {type(sizes).__name__}") from None
        for i, v in enumerate(items):
            if not hasattr(v, "__index__"):  # ints, numpy ints and bools, as torch.Size takes them
                raise ShapeError(f"Size: expected an iterable of ints, item {i} is {type(v).__name__}: {v!r}")
        return tuple.__new__(cls, [v.__index__() for v in items])

    def numel(self) -> int:
        """The number of elements of a tensor of this shape (1 for ``Size([])``)."""
        return math.prod(self)

    def __getitem__(self, index: Any) -> Any:
        got = tuple.__getitem__(self, index)
        return _new_size(Size, got) if isinstance(index, slice) else got

    def __add__(self, other: Any) -> Size:
        if not isinstance(other, tuple):
            return NotImplemented
        return as_size(tuple.__add__(self, other))

    def __radd__(self, other: Any) -> Size:
        if not isinstance(other, tuple):
            return NotImplemented
        return as_size(tuple.__add__(other, self))

    def __repr__(self) -> str:
        return f"ember.Size({list(self)})"

    def __str__(self) -> str:
        # printed and formatted as the plain tuple: error messages and logs read "(2, 3)" (repr says it is a Size)
        return tuple.__repr__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Size, (tuple(self),))


_new_size = tuple.__new__


def as_size(shape: Any) -> Size:
    """``shape`` (a tuple of ints ember already checked, such as a handle's shape) as a :class:`Size`, without
    re-checking its items: the path ``Tensor.shape`` takes on every call."""
    return _new_size(Size, shape)


# (a, b) -> broadcast shape; ops ask the same pair on every call, so the hot path is one dict lookup. Bounded so
# that a workload with ever-new shapes cannot grow it without limit; only valid results are stored.
_pair_cache: dict[tuple[Shape, Shape], Shape] = {}
_PAIR_CACHE_LIMIT = 4096


def _shape_text(shapes: Sequence[Shape]) -> str:
    texts = [str(tuple(s)) for s in shapes]
    return " and ".join(texts) if len(texts) <= 2 else ", ".join(texts[:-1]) + " and " + texts[-1]


def _as_shape(s: Any, op: str, shapes: Sequence[Any]) -> Shape:
    """s as a tuple of non-negative Python ints (numpy integers accepted); ShapeError otherwise."""
    try:
        items = tuple(s)
    except TypeError:
        raise ShapeError(f"{op}: expected shapes (sequences of ints), got {type(s).__name__} {s!r}") from None
    out = []
    for n in items:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ShapeError(f"{op}: sizes must be ints, got {type(n).__name__} {n!r} in shape {items}")
        if n < 0:
            raise ShapeError(f"{op}: negative size {n} in shape {items}")
        out.append(int(n))
    return tuple(out)


def _broadcast_pair(a: Shape, b: Shape, op: str, shapes: Sequence[Shape]) -> Shape:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {_shape_text(shapes)} are not broadcastable (dim {i - n}: {x} vs {y})")
    r = tuple(out)
    if len(_pair_cache) < _PAIR_CACHE_LIMIT:
        _pair_cache[(a, b)] = r
    return r


def broadcast_shapes(*shapes: Sequence[int], op: str = "broadcast_shapes") -> Shape:
    """The shape that shapes broadcast to under numpy's (and PyTorch's) rules; no shapes give ``()``.

    Raises :class:`~ember.errors.ShapeError` naming op, every shape and the first mismatching dim (counted from
    the right) when they do not broadcast, or when a shape holds a negative or non-int size. Pairs are cached,
    so the two-shape call an elementwise op makes on every invocation costs one dict lookup after the first;
    sizes are validated when a pair is first seen (the cache answers by value, and ``2.0 == 2``).

    >>> broadcast_shapes((2, 1, 3), (4, 1), op="add")
    (2, 4, 3)
    """
    if len(shapes) == 2:
        try:
            r = _pair_cache.get(shapes)  # type: ignore[call-overload]
        except TypeError:  # an unhashable shape (a list): normalised below
            r = None
        if r is not None:
            return r
    norm = [_as_shape(s, op, shapes) for s in shapes]
    if not norm:
        return ()
    out = norm[0]
    for s in norm[1:]:
        key = (out, s)
        r = _pair_cache.get(key)
        out = r if r is not None else _broadcast_pair(out, s, op, norm)
    return out


def norm_dim(dim: Any, ndim: int, op: str) -> int:
    """dim (possibly negative) as an index in ``range(ndim)``; a 0-d tensor accepts -1 and 0 as PyTorch does.

    Raises :class:`~ember.errors.DimError` naming op for a non-int (bools included) or out-of-range dim.
    """
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise DimError(f"{op}: dim must be an int, got {type(dim).__name__} {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise DimError(f"{op}: dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return int(dim) % n


def norm_dims(dims: Any, ndim: int, op: str) -> tuple[int, ...]:
    """dim=None (all dims), an int, or a sequence of ints as non-negative dims in the given order.

    A 0-d tensor validates the dims (-1 and 0 only) and gives ``()``. Raises
    :class:`~ember.errors.DimError` naming op for bad or repeated dims.
    """
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        d = norm_dim(dims, ndim, op)  # validates even for 0-d tensors, where the only dim is "no dim"
        return (d,) if ndim else ()
    if not isinstance(dims, (tuple, list)):
        try:
            dims = tuple(dims)
        except TypeError:
            raise DimError(f"{op}: dim must be an int or a sequence of ints, got {type(dims).__name__} "
                           f"{dims!r}") from None
    out = tuple(norm_dim(d, ndim, op) for d in dims)
    if len(set(out)) != len(out):
        raise DimError(f"{op}: dim {tuple(dims)} appears multiple times in the list of dims")
    return out if ndim else ()


def check_shape_arg(shape: Any, op: str) -> Shape:
    """A size argument as a shape: accepts ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])`` and ``f(torch.Size)`` (pass
    the ``*size`` tuple); sizes must be non-negative ints (anything with ``__index__`` counts).

    No sizes at all is the 0-d shape (``zeros()``, ``rand()``): a deliberate extension, PyTorch requires the
    size argument. Raises :class:`~ember.errors.ShapeError` naming op.
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            if hasattr(s, "__index__") and not isinstance(s, bool):
                s = s.__index__()
            else:
                raise ShapeError(f"{op}: sizes must be ints, got {type(s).__name__} {s!r} in {tuple(shape)}")
        if s < 0:
            raise ShapeError(f"{op}: negative dimension {s} in size {tuple(shape)}")
        out.append(int(s))
    return tuple(out)


def pool_output_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output length of a pooling window (size k, stride s, padding p, dilation d) over n elements, PyTorch's
    rule: with ceil_mode, a window that would start in the right padding is dropped. Never negative (0 when
    the window does not fit); callers that must refuse an empty output check for 0."""
    num = n + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        out = -(-num // s) + 1
        if (out - 1) * s >= n + p:
            out -= 1
    else:
        out = num // s + 1
    return max(out, 0)


def view_strides(shape: Shape, strides: Sequence[int], new_shape: Shape) -> tuple[int, ...] | None:
    """The strides that view data laid out as (shape, strides) in new_shape without a copy, or None when no view
    exists (PyTorch's computeStride). Strides are in elements; a helper for backends with strided handles."""
    if math.prod(shape) == 0 or not shape or not new_shape:
        out, acc = [], 1
        for n in reversed(new_shape):
            out.append(acc)
            acc *= max(n, 1)
        return tuple(reversed(out))
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    # walk the old dims from the innermost; a "chunk" is a run of dims contiguous relative to each other, and the
    # new dims covering the same number of elements take strides inside that chunk
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


__all__ = [
    "Shape",
    "broadcast_shapes",
    "check_shape_arg",
    "norm_dim",
    "norm_dims",
    "pool_output_size",
    "view_strides",
]


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """Row-major element strides of ``shape`` (a size-0 dim counts as 1, as numpy does)."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def expand_strides(shape: Shape, strides: Sequence[int], new_shape: Shape) -> tuple[int, ...]:
    """Strides of a broadcast view of a strided array to ``new_shape``: 0 on new and expanded dims (the shapes are
    known to broadcast)."""
    lead = len(new_shape) - len(shape)
    return (0,) * lead + tuple(s if n == new_shape[lead + d] else 0 for d, (n, s) in enumerate(zip(shape, strides)))


def basic_index_layout(shape: Shape, strides: Sequence[int], offset: int,
                       key: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, offset) of the view a key of ints, slices, None and Ellipsis selects from a strided array
    (ints already in range), in elements: what a backend with strided handles needs for ``getitem``."""
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        used = sum(1 for k in key if k is not None and k is not Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - used) + key[i + 1:]
    out_shape: list[int] = []
    out_strides: list[int] = []
    d = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n, s = shape[d], strides[d]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            length = len(range(start, stop, step))
            if length:
                offset += start * s
            out_shape.append(length)
            out_strides.append(s * step)
        else:
            idx = int(k)
            offset += (idx + n if idx < 0 else idx) * s
        d += 1
    out_shape.extend(shape[d:])
    out_strides.extend(strides[d:])
    return tuple(out_shape), tuple(out_strides), offset


def einsum_labels(equation: str, shapes: Sequence[Shape], op: str = "einsum") -> tuple[list[list[str]], list[str]]:
    """Check an einsum equation against the operands' shapes and label every dim: one label list per operand and
    the output's (``torch.einsum``'s rules: an implicit output is the ellipsis dims, then the labels used once,
    sorted). Ellipsis dims get the labels ``".0"``, ``".1"``, ... (right-aligned across operands).

    Raises ValueRangeError for a malformed equation (operand count, a subscript that is no letter, an output
    label absent from the inputs) and ShapeError when subscripts and shapes disagree, naming op and the equation.

    >>> einsum_labels("ij,jk->ik", [(2, 3), (3, 4)])
    ([['i', 'j'], ['j', 'k']], ['i', 'k'])
    >>> einsum_labels("...i,i", [(5, 2, 3), (3,)])
    ([['.0', '.1', 'i'], ['i']], ['.0', '.1'])
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueRangeError(f"{op}: equation {equation!r} has {len(terms)} operands but {len(shapes)} were given")
    sizes: dict[str, int] = {}
    ell = 0
    for term, shape in zip(terms, shapes):
        letters = term.replace("...", "")
        if not all(c.isalpha() for c in letters) or term.count("...") > 1:
            raise ValueRangeError(f"{op}: invalid subscript {term!r} in {equation!r}")
        has_ell = "..." in term
        if (not has_ell and len(letters) != len(shape)) or (has_ell and len(letters) > len(shape)):
            raise ShapeError(f"{op}: subscript {term!r} does not match operand of shape {tuple(shape)}")
        lead = term.index("...") if has_ell else len(letters)
        dims = list(shape[:lead]) + list(shape[len(shape) - (len(letters) - lead):])
        for c, n in zip(letters, dims):
            if sizes.setdefault(c, n) != n and n != 1 and sizes[c] != 1:
                raise ShapeError(f"{op}: subscript {c!r} has size {n} for one operand and {sizes[c]} for another")
        if has_ell:
            ell = max(ell, len(shape) - len(letters))
    if arrow and not all(c.isalpha() for c in rhs.replace("...", "")):
        raise ValueRangeError(f"{op}: invalid output subscript {rhs!r} in {equation!r}")
    if arrow:
        for c in rhs.replace("...", ""):
            if c not in sizes:
                raise ValueRangeError(f"{op}: output subscript {c!r} does not appear in the inputs of {equation!r}")
    ell_labels = [f".{j}" for j in range(ell)]
    labels = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            a, b = term.split("...")
            e = len(shape) - (len(term) - 3)
            labels.append(list(a) + ell_labels[ell - e:] + list(b))
        else:
            labels.append(list(term))
    if not arrow:
        counts: dict[str, int] = {}
        for lab in labels:
            for c in lab:
                if not c.startswith("."):
                    counts[c] = counts.get(c, 0) + 1
        return labels, ell_labels + sorted(c for c, k in counts.items() if k == 1)
    if "..." in rhs:
        a, b = rhs.split("...")
        return labels, list(a) + ell_labels + list(b)
    return labels, list(rhs)
