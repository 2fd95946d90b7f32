"""Ops whose output size depends on the data (Unique, NonMaxSuppression) and Det: computed from host copies of
the (small) inputs, as ONNX's reference does; their outputs are constants for autodiff."""

from __future__ import annotations

import numpy as np

import ember
from ember import Tensor

from .registry import Node, host_scalar, register


def _host(t: Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


@register("Unique")
def unique(node: Node, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    arr = _host(x)
    axis = node.attr("axis")
    sorted_ = node.attr("sorted", 1)
    if axis is None:
        values, first, inverse, counts = np.unique(arr.reshape(-1), return_index=True, return_inverse=True,
                                                   return_counts=True)
    else:
        values, first, inverse, counts = np.unique(arr, axis=axis, return_index=True, return_inverse=True,
                                                   return_counts=True)
    inverse = inverse.reshape(-1)
    if not sorted_:
        # order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    dev = x.device
    return (ember.tensor(np.ascontiguousarray(values), device=dev), ember.tensor(first.astype(np.int64), device=dev),
            ember.tensor(inverse.astype(np.int64), device=dev), ember.tensor(counts.astype(np.int64), device=dev))


def _iou(a: np.ndarray, b: np.ndarray, center: bool) -> float:
    if center:
        a = np.array([a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2])
        b = np.array([b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2])
    # corners may come in either order
    ay1, ay2 = sorted((a[0], a[2]))
    ax1, ax2 = sorted((a[1], a[3]))
    by1, by2 = sorted((b[0], b[2]))
    bx1, bx2 = sorted((b[1], b[3]))
    inter = max(0.0, min(ay2, by2) - max(ay1, by1)) * max(0.0, min(ax2, bx2) - max(ax1, bx1))
    union = (ay2 - ay1) * (ax2 - ax1) + (by2 - by1) * (bx2 - bx1) - inter
    return inter / union if union > 0 else 0.0


@register("NonMaxSuppression")
def non_max_suppression(node: Node, boxes: Tensor, scores: Tensor, max_out: Tensor | None = None,
                        iou_threshold: Tensor | None = None, score_threshold: Tensor | None = None) -> Tensor:
    bx, sc = _host(boxes), _host(scores)
    limit = int(host_scalar(max_out)) if max_out is not None else 0
    iou_t = float(host_scalar(iou_threshold)) if iou_threshold is not None else 0.0
    score_t = float(host_scalar(score_threshold)) if score_threshold is not None else None
    center = bool(node.attr("center_point_box", 0))
    picked: list[list[int]] = []
    for b in range(sc.shape[0]):
        for c in range(sc.shape[1]):
            s = sc[b, c]
            order = [i for i in np.argsort(-s, kind="stable") if score_t is None or s[i] > score_t]
            kept: list[int] = []
            for i in order:
                if limit and len(kept) >= limit:
                    break
                if all(_iou(bx[b, i], bx[b, k], center) <= iou_t for k in kept):
                    kept.append(i)
            picked += [[b, c, i] for i in kept]
    return ember.tensor(np.array(picked, dtype=np.int64).reshape(-1, 3), device=boxes.device)


@register("Det")
def det(node: Node, x: Tensor) -> Tensor:
    return ember.linalg.det(x)
