"""Resize, Upsample and GridSample: separable interpolation matrices (Resize) and gathered taps (GridSample).

The matrices are built on the host from ONNX's coordinate rules (every ``coordinate_transformation_mode``,
``nearest_mode``, cubic ``cubic_coeff_a``/``exclude_outside``, antialiasing) and applied with ``tensordot`` on the
device, so the op is differentiable and runs anywhere. ``tf_crop_and_resize`` samples outside the input get
``extrapolation_value``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import ember
from ember import Tensor

from .registry import Node, host_floats, host_ints, norm_axes, register


def _source(mode: str, x: np.ndarray, scale: float, n_in: int, n_out: int, roi: tuple[float, float]) -> np.ndarray:
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.full_like(x, -0.5)
    if mode == "align_corners":
        # ONNX divides by the float output length (scale * n_in) minus one, not the rounded size
        length = scale * n_in
        return x * (n_in - 1) / (length - 1) if length > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if n_out > 1:
            return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1)
        return np.full_like(x, 0.5 * (start + end) * (n_in - 1))
    raise ValueError(mode)


def _nearest(pos: np.ndarray, how: str) -> np.ndarray:
    if how == "round_prefer_floor":
        return np.where(pos - np.floor(pos) == 0.5, np.floor(pos), np.round(pos))
    if how == "round_prefer_ceil":
        return np.where(pos - np.floor(pos) == 0.5, np.ceil(pos), np.round(pos))
    if how == "floor":
        return np.floor(pos)
    return np.ceil(pos)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def axis_matrix(node: Node, n_in: int, n_out: int, scale: float, roi: tuple[float, float]) -> tuple[np.ndarray,
                                                                                                    np.ndarray]:
    """(weights (n_out, n_in), valid (n_out,)): output ``i`` is ``weights[i] @ input`` where ``valid[i]``."""
    mode = node.attr("mode", "nearest")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    if node.opset < 11:
        coord = "asymmetric"
    x = np.arange(n_out, dtype=np.float64)
    pos = _source(coord, x, scale, n_in, n_out, roi)
    weights = np.zeros((n_out, n_in), dtype=np.float64)
    valid = np.ones(n_out, dtype=bool)
    if coord == "tf_crop_and_resize":
        valid = (pos >= 0) & (pos <= n_in - 1)
    rows = np.arange(n_out)
    if mode == "nearest":
        how = node.attr("nearest_mode", "round_prefer_floor") if node.opset >= 11 else "floor"
        idx = np.clip(_nearest(pos, how), 0, n_in - 1).astype(np.int64)
        weights[rows, idx] = 1.0
        return weights, valid
    antialias = bool(node.attr("antialias", 0)) and scale < 1
    # ONNX takes the ratio in (0, 1]: an integral position counts from the pixel on its left (this moves the
    # antialiasing window; the plain kernels give the same weights either way)
    base = np.ceil(pos) - 1 if antialias else np.floor(pos)
    frac = pos - base
    if mode == "linear":
        if antialias:
            start = int(math.floor(-1 / scale) + 1)
            offsets = np.arange(start, start + 2 - 2 * start)
            taps = np.clip(1 - np.abs((offsets[None, :] - frac[:, None]) * scale), 0, None)
        else:
            offsets = np.array([0, 1])
            taps = np.stack([1 - frac, frac], axis=1)
    elif mode == "cubic":
        a = node.attr("cubic_coeff_a", -0.75)
        if antialias:
            start = int(math.floor(-2 / scale) + 1)
            offsets = np.arange(start, 2 - start)
            taps = _cubic((offsets[None, :] - frac[:, None]) * scale, a)
        else:
            offsets = np.array([-1, 0, 1, 2])
            taps = _cubic(offsets[None, :] - frac[:, None], a)
    else:
        raise node.fail(f"mode {mode!r} is not one of nearest, linear, cubic")
    idx = base[:, None].astype(np.int64) + offsets[None, :]
    inside = (idx >= 0) & (idx < n_in)
    if antialias:
        taps = taps / taps.sum(axis=1, keepdims=True)
    if node.attr("exclude_outside", 0):
        taps = np.where(inside, taps, 0.0)
        sums = taps.sum(axis=1, keepdims=True)
        taps = taps / np.where(sums == 0, 1, sums)
    clipped = np.clip(idx, 0, n_in - 1)
    for k in range(idx.shape[1]):
        np.add.at(weights, (rows, clipped[:, k]), taps[:, k])
    return weights, valid


def _resize(node: Node, x: Tensor, roi: Tensor | None, scales: Tensor | None, sizes: Tensor | None) -> Tensor:
    rank = x.dim()
    axes = norm_axes(list(node.attr("axes") or range(rank)), rank)
    scale_v = host_floats(scales) if scales is not None and scales.numel() else None
    size_v = host_ints(sizes) if sizes is not None and sizes.numel() else None
    in_sizes = [x.shape[a] for a in axes]
    if size_v is not None:
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            out_sizes = size_v
            scale_v = [o / i for o, i in zip(out_sizes, in_sizes)]
        else:
            pick = min if policy == "not_larger" else max
            s = pick(o / i for o, i in zip(size_v, in_sizes))
            scale_v = [s] * len(axes)
            out_sizes = [int(math.floor(s * i + 0.5)) for i in in_sizes]
    else:
        out_sizes = [int(math.floor(i * s)) for i, s in zip(in_sizes, scale_v)]
    roi_v = host_floats(roi) if roi is not None and roi.numel() else None
    out = x
    valids = []
    for k, (a, n_in, n_out, s) in enumerate(zip(axes, in_sizes, out_sizes, scale_v)):
        r = (roi_v[k], roi_v[k + len(axes)]) if roi_v is not None else (0.0, 1.0)
        if n_in == n_out and s == 1.0 and node.attr("coordinate_transformation_mode") != "tf_crop_and_resize":
            continue
        w, valid = axis_matrix(node, n_in, n_out, s, r)
        wt = ember.tensor(w, dtype=x.dtype if x.dtype.is_floating_point else ember.float32, device=x.device)
        moved = ember.movedim(out if out.dtype.is_floating_point else out.to(ember.float32), a, -1)
        out = ember.movedim(ember.matmul(moved, wt.t()), -1, a)
        valids.append((a, valid))
    if out.dtype != x.dtype:
        out = ember.round(out).to(x.dtype) if not x.dtype.is_floating_point else out.to(x.dtype)
    if valids and any(not v.all() for _, v in valids):
        mask = np.ones(list(out.shape), dtype=bool)
        for a, v in valids:
            shape = [1] * rank
            shape[a] = v.shape[0]
            mask = mask & v.reshape(shape)
        fill = ember.full(list(out.shape), node.attr("extrapolation_value", 0.0), dtype=out.dtype, device=x.device)
        out = ember.where(ember.tensor(mask, device=x.device), out, fill)
    return out


@register("Resize")
def resize(node: Node, x: Tensor, roi: Tensor | None = None, scales: Tensor | None = None,
           sizes: Tensor | None = None) -> Tensor:
    if node.opset < 11:
        # Resize-10: (X, scales)
        return _resize(node, x, None, roi, None)
    return _resize(node, x, roi, scales, sizes)


@register("Upsample")
def upsample(node: Node, x: Tensor, scales: Tensor | None = None) -> Tensor:
    if scales is None:
        scales = ember.tensor(np.asarray(node.attr("scales"), dtype=np.float32), device=x.device)
    return _resize(node, x, None, scales, None)


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    """Reflect coordinates by the near border until they fall within [lo, hi] (ONNX's ``_gs_reflect``)."""
    rng = hi - lo
    if rng <= 0:
        return ember.zeros_like(x) + lo
    below, above = x < lo, x > hi
    dx = ember.where(below, lo - x, ember.where(above, x - hi, ember.zeros_like(x)))
    n = ember.floor(dx / rng)
    r = dx - n * rng
    even = ember.remainder(n, 2.0) == 0
    from_below = ember.where(even, lo + r, hi - r)
    from_above = ember.where(even, hi - r, lo + r)
    return ember.where(below, from_below, ember.where(above, from_above, x))


def _cubic_weights(t: Tensor) -> list[Tensor]:
    a = -0.75
    t1, t2 = t + 1, 1 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1, ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


@register("GridSample")
def grid_sample(node: Node, x: Tensor, grid: Tensor) -> Tensor:
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear" if node.opset >= 20 else
                                                                    "bilinear"), node.attr("mode", "linear"))
    padding = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    n, c = x.shape[0], x.shape[1]
    dims = list(x.shape[2:])
    r = len(dims)
    out_sp = list(grid.shape[1:-1])
    q = int(np.prod(out_sp, dtype=np.int64))
    flat = x.reshape(n, c, -1)
    g = grid.reshape(n, q, r).to(x.dtype)
    coords = []
    for i, size in enumerate(dims):
        u = g[:, :, r - 1 - i]  # the grid lists coordinates from the last spatial dim
        pos = (u + 1) / 2 * (size - 1) if align else ((u + 1) * size - 1) / 2
        if mode == "nearest":
            pos = ember.round(pos)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            pos = ember.clamp(pos, 0.0, size - 1.0)
        elif padding == "reflection":
            pos = _reflect(pos, lo, hi)
        coords.append((pos, size, lo, hi))

    def taps(pos: Tensor) -> list[tuple[Tensor, Tensor | None]]:
        if mode == "nearest":
            return [(pos, None)]
        base = ember.floor(pos)
        t = pos - base
        if mode == "linear":
            return [(base, 1 - t), (base + 1, t)]
        return [(base + k, w) for k, w in zip((-1, 0, 1, 2), _cubic_weights(t))]

    per_dim = []
    for pos, size, lo, hi in coords:
        entries = []
        for idx, w in taps(pos):
            valid = None
            if padding == "zeros":
                valid = (idx >= 0) & (idx <= size - 1)
                idx = ember.clamp(idx, 0.0, size - 1.0)
            elif padding == "border":
                idx = ember.clamp(idx, 0.0, size - 1.0)
            else:
                idx = ember.clamp(ember.trunc(_reflect(idx, lo, hi)), 0.0, size - 1.0)
            entries.append((idx.to(ember.int64), w, valid))
        per_dim.append(entries)
    strides = [int(np.prod(dims[i + 1:], dtype=np.int64)) for i in range(r)]
    out = None
    for combo in itertools.product(*per_dim):
        lin = None
        weight = None
        valid = None
        for (idx, w, v), stride in zip(combo, strides):
            term = idx * stride
            lin = term if lin is None else lin + term
            if w is not None:
                weight = w if weight is None else weight * w
            if v is not None:
                valid = v if valid is None else valid & v
        index = ember.broadcast_to(lin.reshape(n, 1, q), (n, c, q))
        vals = ember.gather(flat, 2, index)
        if valid is not None:
            vals = ember.where(valid.reshape(n, 1, q), vals, ember.zeros_like(vals))
        if weight is not None:
            vals = vals * weight.reshape(n, 1, q)
        out = vals if out is None else out + vals
    return out.reshape([n, c] + out_sp)
