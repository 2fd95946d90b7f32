"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul, MatMulInteger
(uint8/int8, per tensor, per axis or blocked; the 2/4-bit, uint16 and float8 types have no ember dtype)."""

from __future__ import annotations

import numpy as np

import ember
from ember import Tensor

from ..dtypes import numpy_dtype, to_ember_dtype
from .registry import Node, norm_axis, register


def _limits(dtype: ember.DType) -> tuple[int, int]:
    info = np.iinfo(numpy_dtype(dtype))
    return int(info.min), int(info.max)


def _along(node: Node, t: Tensor, x: Tensor) -> Tensor:
    """A per-axis scale or zero point (1-D) shaped to broadcast against ``x`` on ``axis``."""
    if t.dim() == 0 or t.numel() == 1 and x.dim() == 0:
        return t.reshape([])
    axis = norm_axis(node.attr("axis", 1), x.dim())
    block = node.attr("block_size", 0)
    if block:
        # blocked: t has x's shape with ceil(dim / block) on axis; each entry covers `block` consecutive ones
        index = ember.tensor(np.arange(x.shape[axis]) // block, device=x.device)
        return ember.index_select(t, axis, index)
    shape = [1] * x.dim()
    shape[axis] = t.numel()
    return t.reshape(shape)


@register("QuantizeLinear")
def quantize_linear(node: Node, x: Tensor, scale: Tensor, zero_point: Tensor | None = None) -> Tensor:
    if node.attr("output_dtype", 0):
        out_dtype = to_ember_dtype(node.attr("output_dtype"), "QuantizeLinear output_dtype")
    else:
        out_dtype = zero_point.dtype if zero_point is not None else ember.uint8
    lo, hi = _limits(out_dtype)
    s = _along(node, scale, x).to(ember.float32)
    q = ember.round(x.to(ember.float32) / s)  # half to even, as ONNX
    if zero_point is not None:
        q = q + _along(node, zero_point, x).to(ember.float32)
    return ember.clamp(q, float(lo), float(hi)).to(out_dtype)


@register("DequantizeLinear")
def dequantize_linear(node: Node, x: Tensor, scale: Tensor, zero_point: Tensor | None = None) -> Tensor:
    v = x.to(ember.float32)
    if zero_point is not None:
        v = v - _along(node, zero_point, x).to(ember.float32)
    return (v * _along(node, scale, x).to(ember.float32)).to(scale.dtype)


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear(node: Node, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    lo = ember.minimum(ember.amin(x, dim=tuple(range(x.dim()))), ember.zeros([], dtype=x.dtype, device=x.device))
    hi = ember.maximum(ember.amax(x, dim=tuple(range(x.dim()))), ember.zeros([], dtype=x.dtype, device=x.device))
    scale = (hi - lo) / 255.0
    zp = ember.clamp(ember.round(-lo / scale), 0.0, 255.0)
    y = ember.clamp(ember.round(x / scale) + zp, 0.0, 255.0)
    return y.to(ember.uint8), scale, zp.to(ember.uint8)


def _centered(t: Tensor, zp: Tensor | None, axis_shape: list[int] | None = None) -> Tensor:
    # float64 holds every uint8/int8 product sum exactly
    v = t.to(ember.float64)
    if zp is None:
        return v
    z = zp.to(ember.float64)
    if axis_shape is not None and z.numel() > 1:
        z = z.reshape(axis_shape)
    return v - z


@register("MatMulInteger")
def matmul_integer(node: Node, a: Tensor, b: Tensor, a_zp: Tensor | None = None,
                   b_zp: Tensor | None = None) -> Tensor:
    # a's zero point is per row (M), b's per column (N)
    out = ember.matmul(_centered(a, a_zp, [-1, 1]), _centered(b, b_zp, [1, -1]))
    return out.to(ember.int32)


@register("QLinearMatMul")
def qlinear_matmul(node: Node, a: Tensor, a_scale: Tensor, a_zp: Tensor, b: Tensor, b_scale: Tensor, b_zp: Tensor,
                   y_scale: Tensor, y_zp: Tensor) -> Tensor:
    acc = ember.matmul(_centered(a, a_zp, [-1, 1]), _centered(b, b_zp, [1, -1]))
    factor = a_scale.to(ember.float64) * b_scale.to(ember.float64) / y_scale.to(ember.float64)
    lo, hi = _limits(y_zp.dtype)
    q = ember.round(acc * factor.reshape([-1] if factor.numel() > 1 else [])) + y_zp.to(ember.float64)
    return ember.clamp(q, float(lo), float(hi)).to(y_zp.dtype)
