"""Matrix products: matmul (every rank combination, batch broadcasting), mm, bmm, mv, dot, outer, einsum."""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..amp.autocast_mode import STATE as _AMP
from ..amp.autocast_mode import run as _amp_run
from ..bridge import same_device
from ..errors import DTypeError, ShapeError
from ..shapes import broadcast_shapes, einsum_labels
from ..tensor import Tensor


def _operands(op: str, a: Any, b: Any) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise DTypeError(f"{op}: expected Tensors, got {type(a).__name__} and {type(b).__name__}")
    same_device(op, a, b)
    if a._dtype is not b._dtype:
        raise DTypeError(f"{op}: expected both operands to have the same dtype, got {a._dtype.name} and "
                         f"{b._dtype.name}")
    if a._dtype is dt.bool_:
        raise DTypeError(f"{op}: not implemented for bool tensors")
    return a, b


def matmul_shape(sa: tuple[int, ...], sb: tuple[int, ...], op: str = "matmul") -> tuple[int, ...]:
    """Result shape of numpy/PyTorch matmul; ShapeError names both shapes."""
    if not sa or not sb:
        raise ShapeError(f"{op}: both arguments need at least 1 dimension, got shapes {sa} and {sb}")
    ka = sa[-1]
    kb = sb[-2] if len(sb) > 1 else sb[0]
    if ka != kb:
        raise ShapeError(f"{op}: shapes {sa} and {sb} cannot be multiplied ({ka} != {kb})")
    batch = broadcast_shapes(sa[:-2], sb[:-2], op=op) if len(sa) > 2 or len(sb) > 2 else ()
    out = batch + (sa[-2:-1] if len(sa) > 1 else ()) + (sb[-1:] if len(sb) > 1 else ())
    return out


def matmul(input: Any, other: Any) -> Tensor:
    """Matrix product with PyTorch's rank rules: 1-d operands are promoted and squeezed, batches broadcast."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("matmul", matmul, input, other)
    a, b = _operands("matmul", input, other)
    matmul_shape(a.shape, b.shape)
    return Tensor._make(a._device.stack.matmul(a._h, b._h), a._dtype, a._device)


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("mm", mm, input, mat2)
    if input.ndim != 2 or mat2.ndim != 2:
        raise ShapeError(f"mm: expected 2-d tensors, got shapes {input.shape} and {mat2.shape}")
    return matmul(input, mat2)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("bmm", bmm, input, mat2)
    if input.ndim != 3 or mat2.ndim != 3 or input.shape[0] != mat2.shape[0]:
        raise ShapeError(f"bmm: expected 3-d tensors with equal batch size, got {input.shape} and {mat2.shape}")
    return matmul(input, mat2)


def mv(input: Tensor, vec: Tensor) -> Tensor:
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("mv", mv, input, vec)
    if input.ndim != 2 or vec.ndim != 1:
        raise ShapeError(f"mv: expected a 2-d and a 1-d tensor, got shapes {input.shape} and {vec.shape}")
    return matmul(input, vec)


def dot(input: Tensor, other: Tensor) -> Tensor:
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("dot", dot, input, other)
    if input.ndim != 1 or other.ndim != 1:
        raise ShapeError(f"dot: expected 1-d tensors, got shapes {input.shape} and {other.shape}")
    return matmul(input, other)


inner = dot
vdot = dot


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    if input.ndim != 1 or vec2.ndim != 1:
        raise ShapeError(f"outer: expected 1-d tensors, got shapes {input.shape} and {vec2.shape}")
    return input.reshape(-1, 1) * vec2.reshape(1, -1)


ger = outer


def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation (``torch.einsum``); operands may also be passed as one list."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy): one thread-local read when off
        return _amp_run("einsum", einsum, equation, *operands)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(o, Tensor) for o in operands):
        raise DTypeError("einsum: expected one or more Tensor operands")
    dev = same_device("einsum", *operands)
    d = operands[0]._dtype
    for o in operands[1:]:
        d = dt.promote_types(d, o._dtype)
    einsum_labels(equation, [o.shape for o in operands])  # typed errors before any work
    stack = dev.stack
    hs = [o._h if o._dtype is d else stack.cast(o._h, d) for o in operands]
    return Tensor._make(stack.einsum(equation.replace(" ", ""), *hs), d, dev)


def tensordot(a: Tensor, b: Tensor, dims: Any = 2) -> Tensor:
    if isinstance(dims, int):
        da = list(range(a.ndim - dims, a.ndim))
        db = list(range(dims))
    else:
        da, db = [list(x) if isinstance(x, (list, tuple)) else [x] for x in dims]
    letters = "abcdefghijklmnopqrstuvwxyz"
    la = list(letters[: a.ndim])
    lb = list(letters[a.ndim: a.ndim + b.ndim])
    for i, j in zip(da, db):
        lb[j % b.ndim] = la[i % a.ndim]
    out = [c for i, c in enumerate(la) if i not in {x % a.ndim for x in da}]
    out += [c for j, c in enumerate(lb) if j not in {x % b.ndim for x in db}]
    return einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b)


__all__ = ["matmul", "mm", "bmm", "mv", "dot", "inner", "vdot", "outer", "ger", "einsum", "tensordot"]

TENSOR_METHODS: dict[str, Any] = {
    "matmul": matmul, "mm": mm, "bmm": bmm, "mv": mv, "dot": dot, "outer": outer, "inner": inner,
}
