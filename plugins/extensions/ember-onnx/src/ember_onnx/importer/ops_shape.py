"""Shape and data-movement ONNX ops: reshape, slicing, gather/scatter, concat/split, pad, tile, constants, ..."""

from __future__ import annotations

from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember import Tensor

from ..dtypes import to_ember_dtype
from .registry import Node, host_ints, host_scalar, norm_axes, norm_axis, register


def _axes(node: Node, axes_input: Tensor | None, rank: int, since: int = 13) -> list[int] | None:
    """Axes given as an attribute (before opset ``since``) or as an input (from ``since``)."""
    raw = node.attr("axes") if node.opset < since else host_ints(axes_input)
    return None if raw is None else norm_axes(list(raw), rank)


@register("Shape")
def shape(node: Node, x: Tensor) -> Tensor:
    dims = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end", len(dims))
    return node.const(np.array(dims[start:end] if node.opset >= 15 else dims, dtype=np.int64))


@register("Size")
def size(node: Node, x: Tensor) -> Tensor:
    return node.const(np.array(x.numel(), dtype=np.int64))


@register("Reshape")
def reshape(node: Node, x: Tensor, shape: Tensor | None = None) -> Tensor:
    target = list(node.attr("shape")) if node.opset < 5 else host_ints(shape)
    if not node.attr("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@register("Flatten")
def flatten(node: Node, x: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", 1), x.dim())
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(lead, -1 if lead else int(np.prod(x.shape[axis:], dtype=np.int64)))


@register("Squeeze")
def squeeze(node: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
    dims = _axes(node, axes, x.dim())
    if dims is None:
        dims = [i for i, d in enumerate(x.shape) if d == 1]
    keep = [d for i, d in enumerate(x.shape) if i not in set(dims)]
    return x.reshape(keep)


@register("Unsqueeze")
def unsqueeze(node: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
    raw = node.attr("axes") if node.opset < 13 else host_ints(axes)
    rank = x.dim() + len(raw)
    dims = sorted(norm_axes(raw, rank))
    out = list(x.shape)
    for d in dims:
        out.insert(d, 1)
    return x.reshape(out)


@register("Transpose")
def transpose(node: Node, x: Tensor) -> Tensor:
    perm = node.attr("perm")
    return x.permute(*(list(perm) if perm is not None else list(range(x.dim()))[::-1]))


@register("Concat")
def concat(node: Node, *xs: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis"), xs[0].dim())
    return ember.cat([x for x in xs], dim=axis)


@register("Split")
def split(node: Node, x: Tensor, sizes: Tensor | None = None) -> tuple[Tensor, ...]:
    axis = norm_axis(node.attr("axis", 0), x.dim())
    parts = list(node.attr("split")) if node.opset < 13 and node.attr("split") is not None else host_ints(sizes)
    n = node.attr("num_outputs", node.num_outputs)
    if not parts:
        dim = x.shape[axis]
        chunk = -(-dim // n)
        parts = [min(chunk, dim - i * chunk) for i in range(n)]
    return tuple(ember.split(x, parts, dim=axis))


def _slice_index(x: Tensor, starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> Tensor:
    index: list[Any] = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        dim = x.shape[a]
        if st > 0:
            s = max(0, min(dim, s + dim if s < 0 else s))
            e = max(0, min(dim, e + dim if e < 0 else e))
            index[a] = slice(s, max(s, e), st)
        else:
            # negative steps: clamp as ONNX does, then take the forward slice and flip it
            s = max(-1, min(dim - 1, s + dim if s < 0 else s))
            e = max(-1, min(dim - 1, e + dim if e < 0 else e))
            if e >= s:
                index[a] = slice(0, 0)
            else:
                count = (s - e - 1) // (-st) + 1
                first = s - (count - 1) * (-st)
                index[a] = slice(first, s + 1, -st)
                flips.append(a)
    out = x[tuple(index)]
    return ember.flip(out, flips) if flips else out


@register("Slice")
def slice_(node: Node, x: Tensor, starts: Tensor | None = None, ends: Tensor | None = None,
           axes: Tensor | None = None, steps: Tensor | None = None) -> Tensor:
    if node.opset < 10:
        s, e = list(node.attr("starts")), list(node.attr("ends"))
        ax = node.attr("axes")
        st = [1] * len(s)
    else:
        s, e, ax, st = host_ints(starts), host_ints(ends), host_ints(axes), host_ints(steps)
        st = st or [1] * len(s)
    ax = norm_axes(list(ax) if ax is not None else list(range(len(s))), x.dim())
    big = 2**62
    s = [max(-big, min(big, v)) for v in s]
    e = [max(-big, min(big, v)) for v in e]
    return _slice_index(x, s, e, ax, st)


@register("Gather")
def gather(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", 0), x.dim())
    idx = idx.to(ember.int64)
    idx = ember.where(idx < 0, idx + x.shape[axis], idx)
    flat = ember.index_select(x, axis, idx.reshape(-1))
    return flat.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]))


@register("GatherElements")
def gather_elements(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", 0), x.dim())
    idx = idx.to(ember.int64)
    return ember.gather(x, axis, ember.where(idx < 0, idx + x.shape[axis], idx))


@register("GatherND")
def gather_nd(node: Node, x: Tensor, idx: Tensor) -> Tensor:
    b = node.attr("batch_dims", 0)
    idx = idx.to(ember.int64)
    k = idx.shape[-1]
    batch = list(x.shape[:b])
    nb = int(np.prod(batch, dtype=np.int64))
    rest = list(x.shape[b + k:])
    xs = x.reshape([nb] + list(x.shape[b:b + k]) + rest)
    ids = idx.reshape(nb, -1, k)
    dims = list(x.shape[b:b + k])
    ids = ember.where(ids < 0, ids + node.const(dims, ember.int64, like=None).to(ember.int64), ids) if k else ids
    strides = [int(np.prod(dims[i + 1:], dtype=np.int64)) for i in range(k)]
    lin = (ids * node.const(strides, ember.int64)).sum(dim=-1) if k else ember.zeros(ids.shape[:2], dtype=ember.int64,
                                                                                    device=x.device)
    base = ember.arange(nb, device=x.device, dtype=ember.int64).reshape(nb, 1) * int(np.prod(dims, dtype=np.int64))
    flat = xs.reshape([nb * int(np.prod(dims, dtype=np.int64))] + rest)
    out = ember.index_select(flat, 0, (lin + base).reshape(-1))
    return out.reshape(batch + list(idx.shape[b:-1]) + rest)


def _reduce_into(node: Node, data: Tensor, dim: int, idx: Tensor, upd: Tensor) -> Tensor:
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return ember.scatter(data, dim, idx, upd)
    if reduction == "add":
        return ember.scatter_add(data, dim, idx, upd)
    fn = {"mul": ember.mul, "max": ember.maximum, "min": ember.minimum}.get(reduction)
    if fn is None:
        raise node.fail(f"reduction {reduction!r} is not one of none, add, mul, max, min")
    # one scatter per update slice, so repeated indices combine in order (as ONNX's reference loop)
    out = data
    for i in range(idx.shape[dim]):
        i_sl = ember.narrow(idx, dim, i, 1)
        cur = ember.gather(out, dim, i_sl)
        out = ember.scatter(out, dim, i_sl, fn(cur, ember.narrow(upd, dim, i, 1)))
    return out


@register("ScatterElements", "Scatter")
def scatter_elements(node: Node, data: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    dim = norm_axis(node.attr("axis", 0), data.dim())
    idx = idx.to(ember.int64)
    idx = ember.where(idx < 0, idx + data.shape[dim], idx)
    return _reduce_into(node, data, dim, idx, upd)


@register("ScatterND")
def scatter_nd(node: Node, data: Tensor, idx: Tensor, upd: Tensor) -> Tensor:
    k = idx.shape[-1]
    dims = list(data.shape[:k])
    rest = list(data.shape[k:])
    n = int(np.prod(dims, dtype=np.int64))
    strides = [int(np.prod(dims[i + 1:], dtype=np.int64)) for i in range(k)]
    idx = idx.to(ember.int64).reshape(-1, k)
    idx = ember.where(idx < 0, idx + node.const(dims, ember.int64), idx)
    lin = (idx * node.const(strides, ember.int64)).sum(dim=-1)
    m = int(np.prod(rest, dtype=np.int64))
    flat = data.reshape(n, m)
    u = upd.reshape(-1, m)
    lin2 = lin.reshape(-1, 1).expand(lin.shape[0], m)
    return _reduce_into(node, flat, 0, lin2, u).reshape(data.shape)


@register("Expand")
def expand(node: Node, x: Tensor, shape: Tensor) -> Tensor:
    target = host_ints(shape)
    out_shape = ember.broadcast_shapes(tuple(x.shape), tuple(target))
    return ember.broadcast_to(x, out_shape)


@register("Tile")
def tile(node: Node, x: Tensor, repeats: Tensor) -> Tensor:
    return ember.tile(x, host_ints(repeats))


@register("ConstantOfShape")
def constant_of_shape(node: Node, shape: Tensor) -> Tensor:
    value = node.attr("value")
    arr = np.zeros(1, dtype=np.float32) if value is None else value
    dims = host_ints(shape)
    return node.const(np.full(dims, arr.reshape(-1)[0], dtype=arr.dtype))


@register("Constant")
def constant(node: Node) -> Tensor:
    for name, kind in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        v = node.attr(name)
        if v is not None:
            arr = np.asarray(v, dtype=kind) if kind is not None else v
            to_ember_dtype_of(arr, node)
            return node.const(np.array(arr, order="C"))
    raise node.fail("sparse or string constants have no ember equivalent")


def to_ember_dtype_of(arr: np.ndarray, node: Node) -> None:
    """Raise the typed dtype error for a constant ember cannot hold."""
    from onnx import helper

    try:
        elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
    except (KeyError, TypeError, ValueError):
        elem = -1
    to_ember_dtype(elem, node.op_type)


@register("Range")
def range_(node: Node, start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
    s, lim, d = host_scalar(start), host_scalar(limit), host_scalar(delta)
    n = max(int(np.ceil((lim - s) / d)), 0)
    return node.const(np.asarray(s, dtype=start.numpy().dtype) + np.arange(n).astype(start.numpy().dtype) * d)


@register("EyeLike")
def eye_like(node: Node, x: Tensor) -> Tensor:
    dtype = to_ember_dtype(node.attr("dtype"), "EyeLike") if node.attr("dtype") is not None else x.dtype
    rows, cols = x.shape
    k = node.attr("k", 0)
    return node.const(np.eye(rows, cols, k=k), dtype=dtype)


@register("Trilu")
def trilu(node: Node, x: Tensor, k: Tensor | None = None) -> Tensor:
    kk = int(host_scalar(k)) if k is not None else 0
    return ember.triu(x, kk) if node.attr("upper", 1) else ember.tril(x, kk)


@register("NonZero")
def nonzero(node: Node, x: Tensor) -> Tensor:
    if x.dim() == 0:
        # as numpy (ONNX's reference): a scalar counts as one element of a 1-d array
        return node.const(np.zeros((1, 1 if bool(host_scalar(x)) else 0), dtype=np.int64))
    return ember.nonzero(x).t().to(ember.int64)


@register("Compress")
def compress(node: Node, x: Tensor, cond: Tensor) -> Tensor:
    axis = node.attr("axis")
    keep = [i for i, c in enumerate(np.asarray(cond.numpy()).reshape(-1).tolist()) if c]
    if axis is None:
        flat = x.reshape(-1)
        return ember.index_select(flat, 0, node.const(keep, ember.int64))
    axis = norm_axis(axis, x.dim())
    return ember.index_select(x, axis, node.const(keep, ember.int64))


@register("Pad")
def pad(node: Node, x: Tensor, pads: Tensor | None = None, value: Tensor | None = None,
        axes: Tensor | None = None) -> Tensor:
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        p, fill = list(node.attr("pads") or node.attr("paddings")), node.attr("value", 0.0)
    else:
        p, fill = host_ints(pads), host_scalar(value) if value is not None else 0
    rank = x.dim()
    ax = norm_axes(host_ints(axes), rank) if axes is not None else list(range(rank))
    n = len(ax)
    begins = dict(zip(ax, p[:n]))
    ends = dict(zip(ax, p[n:]))
    # torch's pad lists (left, right) from the last dim backwards; negative pads crop
    spec: list[int] = []
    for d in range(rank - 1, -1, -1):
        spec += [begins.get(d, 0), ends.get(d, 0)]
    if mode == "constant":
        return F.pad(x, spec, mode="constant", value=fill)
    if mode in ("reflect", "edge", "wrap"):
        return _pad_index(x, [begins.get(d, 0) for d in range(rank)], [ends.get(d, 0) for d in range(rank)], mode)
    raise node.fail(f"mode {mode!r} is not one of constant, reflect, edge, wrap")


def _pad_index(x: Tensor, begins: list[int], ends: list[int], mode: str) -> Tensor:
    # reflect/edge/wrap as one gather per axis: works for any rank and any device
    out = x
    for d, (b, e) in enumerate(zip(begins, ends)):
        if b == 0 and e == 0:
            continue
        n = out.shape[d]
        pos = np.arange(-b, n + e)
        if mode == "edge":
            src = np.clip(pos, 0, n - 1)
        elif mode == "wrap":
            src = np.mod(pos, n)
        else:
            period = 2 * (n - 1) if n > 1 else 1
            m = np.mod(pos, period)
            src = np.where(m >= n, period - m, m)
        out = ember.index_select(out, d, ember.tensor(src.astype(np.int64), device=x.device))
    return out


@register("DepthToSpace")
def depth_to_space(node: Node, x: Tensor) -> Tensor:
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    if node.attr("mode", "DCR") == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def space_to_depth(node: Node, x: Tensor) -> Tensor:
    b = node.attr("blocksize")
    n, c, h, w = x.shape
    perm = (0, 1, 3, 5, 2, 4) if node.attr("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    t = x.reshape(n, c, h // b, b, w // b, b).permute(*perm)
    return t.reshape(n, c * b * b, h // b, w // b)


@register("OneHot")
def one_hot(node: Node, idx: Tensor, depth: Tensor, values: Tensor) -> Tensor:
    d = int(host_scalar(depth))
    axis = node.attr("axis", -1)
    i = idx.to(ember.int64)
    i = ember.where(i < 0, i + d, i)
    rank = idx.dim() + 1
    axis = norm_axis(axis, rank)
    classes = ember.arange(d, device=idx.device, dtype=ember.int64).reshape([d] + [1] * (rank - 1 - axis))
    hot = ember.unsqueeze(i, axis) == classes
    off, on = values[0], values[1]
    return ember.where(hot, on, off)


@register("ReverseSequence")
def reverse_sequence(node: Node, x: Tensor, lens: Tensor) -> Tensor:
    batch_axis, time_axis = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    lengths = host_ints(lens)
    t = x.shape[time_axis]
    src = np.tile(np.arange(t), (len(lengths), 1))
    for b, n in enumerate(lengths):
        src[b, :n] = np.arange(n)[::-1]
    index = ember.tensor(src.astype(np.int64), device=x.device)  # (batch, time)
    if batch_axis > time_axis:
        index = index.t()
    shape = [1] * x.dim()
    shape[batch_axis], shape[time_axis] = x.shape[batch_axis], t
    index = ember.broadcast_to(index.reshape(shape), tuple(x.shape))
    return ember.gather(x, time_axis, index)


@register("CenterCropPad")
def center_crop_pad(node: Node, x: Tensor, shape: Tensor) -> Tensor:
    target = host_ints(shape)
    axes = norm_axes(node.attr("axes") or list(range(x.dim())), x.dim())
    out = x
    for a, want in zip(axes, target):
        have = out.shape[a]
        if want < have:
            start = (have - want) // 2
            out = ember.narrow(out, a, start, want)
        elif want > have:
            before = (want - have) // 2
            spec = [0, 0] * (out.dim() - 1 - a) + [before, want - have - before]
            out = F.pad(out, spec)
    return out
