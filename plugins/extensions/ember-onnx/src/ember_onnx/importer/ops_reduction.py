"""Reductions, arg-reductions, scans, softmax family and TopK."""

from __future__ import annotations

import numpy as np

import ember
import ember.nn.functional as F
from ember import Tensor

from ..dtypes import numpy_dtype
from .registry import Node, host_ints, host_scalar, norm_axes, norm_axis, register

#: the opset from which each reduction takes its axes as an input instead of an attribute
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _reduce_dims(node: Node, x: Tensor, axes: Tensor | None) -> list[int] | None:
    since = _AXES_INPUT_SINCE.get(node.op_type, 18)
    raw = node.attr("axes") if node.opset < since else host_ints(axes)
    if not raw:
        return [] if node.attr("noop_with_empty_axes", 0) else None
    return norm_axes(list(raw), x.dim())


def _reduce(node: Node, x: Tensor, axes: Tensor | None, fn) -> Tensor:  # noqa: ANN001 - a local callable
    dims = _reduce_dims(node, x, axes)
    keep = bool(node.attr("keepdims", 1))
    if dims == []:
        return fn(x, None, None)
    dims = list(range(x.dim())) if dims is None else dims
    if x.dim() == 0:
        return fn(x, None, None)
    return fn(x, dims, keep)


def _empty_fill(x: Tensor, dims: list[int], keep: bool, value: float) -> Tensor:
    shape = [1 if i in dims else d for i, d in enumerate(x.shape)] if keep else \
        [d for i, d in enumerate(x.shape) if i not in dims]
    return ember.full(shape, value, dtype=x.dtype, device=x.device)


def _extreme(kind: str):  # noqa: ANN202
    def fn(x: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
        if dims is None:
            return x
        if any(x.shape[d] == 0 for d in dims):
            # ONNX: max of an empty set is the lowest value of the type, min the highest
            if x.dtype.is_floating_point:
                lim = -np.inf if kind == "max" else np.inf
            elif x.dtype == ember.bool_:
                lim = kind != "max"
            else:
                info = np.iinfo(numpy_dtype(x.dtype))
                lim = info.min if kind == "max" else info.max
            return _empty_fill(x, dims, keep, lim)
        return (ember.amax if kind == "max" else ember.amin)(x, dim=dims, keepdim=keep)

    return fn


def _sum(x: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
    return x if dims is None else ember.sum(x, dim=dims, keepdim=keep).to(x.dtype)


def _prod(x: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
    if dims is None:
        return x
    out = x
    for d in sorted(dims, reverse=True):
        out = ember.prod(out, dim=d, keepdim=keep)
    return out.to(x.dtype)


def _mean(x: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
    if dims is None:
        return x
    if x.dtype.is_floating_point:
        return ember.mean(x, dim=dims, keepdim=keep)
    n = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    return ember.div(ember.sum(x, dim=dims, keepdim=keep), n, rounding_mode="trunc").to(x.dtype)


def _then(first, after):  # noqa: ANN001, ANN202
    def fn(x: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
        return after(first(x) if dims is None else _sum(first(x), dims, keep))

    return fn


_REDUCTIONS = {
    "ReduceSum": _sum, "ReduceMean": _mean, "ReduceMax": _extreme("max"), "ReduceMin": _extreme("min"),
    "ReduceProd": _prod,
    "ReduceL1": _then(ember.abs, lambda t: t),
    "ReduceL2": _then(lambda t: t * t, lambda t: ember.sqrt(t.to(ember.float64)).to(t.dtype)
                      if not t.dtype.is_floating_point else ember.sqrt(t)),
    "ReduceSumSquare": _then(lambda t: t * t, lambda t: t),
    "ReduceLogSum": _then(lambda t: t, ember.log),
}


def _reduction(fn):  # noqa: ANN001, ANN202
    def run(node: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
        return _reduce(node, x, axes, fn)

    return run


for _name, _fn in _REDUCTIONS.items():
    register(_name)(_reduction(_fn))


@register("ReduceLogSumExp")
def reduce_log_sum_exp(node: Node, x: Tensor, axes: Tensor | None = None) -> Tensor:
    def fn(t: Tensor, dims: list[int] | None, keep: bool | None) -> Tensor:
        if dims is None:
            return t
        if any(t.shape[d] == 0 for d in dims):
            return _empty_fill(t, dims, bool(keep), -np.inf)
        return ember.logsumexp(t, dim=dims, keepdim=keep)

    return _reduce(node, x, axes, fn)


@register("ArgMax", "ArgMin")
def arg_extreme(node: Node, x: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", 0), x.dim())
    keep = bool(node.attr("keepdims", 1))
    t = x
    if node.attr("select_last_index", 0):
        # the last occurrence: search the reversed axis and map the index back
        t = ember.flip(x, [axis])
    out = (ember.argmax if node.op_type == "ArgMax" else ember.argmin)(t, dim=axis, keepdim=keep)
    if node.attr("select_last_index", 0):
        out = (x.shape[axis] - 1) - out
    return out.to(ember.int64)


@register("CumSum", "CumProd")
def cumulative(node: Node, x: Tensor, axis: Tensor) -> Tensor:
    dim = norm_axis(int(host_scalar(axis)), x.dim())
    fn = ember.cumsum if node.op_type == "CumSum" else ember.cumprod
    t = ember.flip(x, [dim]) if node.attr("reverse", 0) else x
    out = fn(t, dim=dim).to(x.dtype)
    if node.attr("exclusive", 0):
        # shift by one along the axis, filling with the identity
        ident = 0 if node.op_type == "CumSum" else 1
        pad = ember.full([1 if i == dim else d for i, d in enumerate(x.shape)], ident, dtype=x.dtype,
                         device=x.device)
        out = ember.cat([pad, ember.narrow(out, dim, 0, x.shape[dim] - 1)], dim=dim)
    return ember.flip(out, [dim]) if node.attr("reverse", 0) else out


def _coerced(node: Node, x: Tensor, fn) -> Tensor:  # noqa: ANN001
    # before opset 13, softmax-like ops flatten to 2-D at `axis` (default 1) and work on the trailing block
    if node.opset < 13:
        axis = norm_axis(node.attr("axis", 1), x.dim())
        lead = int(np.prod(x.shape[:axis], dtype=np.int64))
        return fn(x.reshape(lead, -1), 1).reshape(x.shape)
    return fn(x, norm_axis(node.attr("axis", -1), x.dim()))


@register("Softmax")
def softmax(node: Node, x: Tensor) -> Tensor:
    return _coerced(node, x, lambda t, d: F.softmax(t, dim=d))


@register("LogSoftmax")
def log_softmax(node: Node, x: Tensor) -> Tensor:
    return _coerced(node, x, lambda t, d: F.log_softmax(t, dim=d))


@register("Hardmax")
def hardmax(node: Node, x: Tensor) -> Tensor:
    def fn(t: Tensor, d: int) -> Tensor:
        idx = ember.argmax(t, dim=d, keepdim=True)
        pos = ember.arange(t.shape[d], device=t.device).reshape([-1] + [1] * (t.dim() - 1 - d))
        return (pos == idx).to(t.dtype)

    return _coerced(node, x, fn)


@register("TopK")
def topk(node: Node, x: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    axis = norm_axis(node.attr("axis", -1), x.dim())
    largest = bool(node.attr("largest", 1))
    kk = int(host_scalar(k)) if node.opset >= 10 else node.attr("k")
    # a stable sort keeps equal values in index order, as ONNX requires
    values, indices = ember.sort(x, dim=axis, descending=largest, stable=True)
    return ember.narrow(values, axis, 0, kk), ember.narrow(indices, axis, 0, kk).to(ember.int64)
