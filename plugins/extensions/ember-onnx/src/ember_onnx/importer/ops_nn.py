"""Neural-network ONNX ops: matmul/Gemm/Einsum, convolution, pooling, normalization, dropout, losses."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember import Tensor

from ..dtypes import numpy_dtype
from .registry import Node, host_scalar, norm_axis, register

_FLOAT32 = 1  # TensorProto.FLOAT: the stash_type default


@register("MatMul")
def matmul(node: Node, a: Tensor, b: Tensor) -> Tensor:
    return ember.matmul(a, b)


@register("Gemm")
def gemm(node: Node, a: Tensor, b: Tensor, c: Tensor | None = None) -> Tensor:
    if node.attr("transA", 0):
        a = a.t()
    if node.attr("transB", 0):
        b = b.t()
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    out = ember.matmul(a, b)
    if alpha != 1.0:
        out = out * alpha
    if c is not None:
        out = out + (c * beta if beta != 1.0 else c)
    return out


@register("Einsum")
def einsum(node: Node, *xs: Tensor) -> Tensor:
    return ember.einsum(node.attr("equation").replace(" ", ""), *xs)


# -- geometry shared by convolution and pooling -----------------------------------------------------------------
def _auto_pads(node: Node, sizes: list[int], kernel: list[int], strides: list[int],
               dilations: list[int]) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) per spatial dim from ``pads`` or ``auto_pad``."""
    n = len(sizes)
    mode = node.attr("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            begins.append(small if mode == "SAME_UPPER" else total - small)
            ends.append(total - begins[-1])
        return begins, ends
    if mode == "VALID":
        return [0] * n, [0] * n
    pads = list(node.attr("pads") or [0] * (2 * n))
    return pads[:n], pads[n:]


def _spatial(node: Node, x: Tensor, kernel: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    n = len(kernel)
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    begins, ends = _auto_pads(node, list(x.shape[2:]), kernel, strides, dilations)
    return strides, dilations, begins, ends


def _pad_spatial(x: Tensor, begins: list[int], ends: list[int], value: float = 0.0) -> Tensor:
    if not any(begins) and not any(ends):
        return x
    spec: list[int] = []
    for b, e in reversed(list(zip(begins, ends))):
        spec += [b, e]
    return F.pad(x, spec, mode="constant", value=value)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@register("Conv")
def conv(node: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    strides, dilations, begins, ends = _spatial(node, x, kernel)
    group = node.attr("group", 1)
    fn = _CONV.get(len(kernel))
    if fn is None:
        raise node.fail(f"{len(kernel)}-d convolution is not supported (1-3 spatial dims)")
    if begins == ends:
        return fn(x, w, b, strides, begins, dilations, group)
    return fn(_pad_spatial(x, begins, ends), w, b, strides, 0, dilations, group)


@register("ConvTranspose")
def conv_transpose(node: Node, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    n = len(kernel)
    strides = list(node.attr("strides") or [1] * n)
    dilations = list(node.attr("dilations") or [1] * n)
    group = node.attr("group", 1)
    out_pad = list(node.attr("output_padding") or [0] * n)
    sizes = list(x.shape[2:])
    full = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(sizes, strides, kernel, dilations)]
    out_shape = node.attr("output_shape")
    mode = node.attr("auto_pad", "NOTSET")
    if out_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-n:] if out_shape is not None else [i * s for i, s in zip(sizes, strides)]
        totals = [f + p - t for f, p, t in zip(full, out_pad, target)]
        begins = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in totals]
        ends = [t - bg for t, bg in zip(totals, begins)]
    else:
        pads = list(node.attr("pads") or [0] * (2 * n))
        begins, ends = pads[:n], pads[n:]
    fn = _CONV_T.get(n)
    if fn is None:
        raise node.fail(f"{n}-d transposed convolution is not supported (1-3 spatial dims)")
    y = fn(x, w, None, strides, 0, 0, group, dilations)
    # output_padding adds positions no input reaches (bias only); pads crop the full output
    y = _pad_spatial(y, [0] * n, out_pad)
    # negative pads (an output_shape larger than the full output) extend with zeros; positive ones crop
    y = _pad_spatial(y, [max(-bg, 0) for bg in begins], [max(-e, 0) for e in ends])
    for d, (bg, e) in enumerate(zip(begins, ends)):
        bg, e = max(bg, 0), max(e, 0)
        y = ember.narrow(y, 2 + d, bg, y.shape[2 + d] - bg - e)
    if b is not None:
        y = y + b.reshape([1, -1] + [1] * n)
    return y


def _pool_geometry(node: Node, x: Tensor) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """kernel, strides, dilations, begin pads, end pads (to pad the input with), output sizes."""
    kernel = list(node.attr("kernel_shape"))
    strides, dilations, begins, ends = _spatial(node, x, kernel)
    ceil_mode = node.attr("ceil_mode", 0)
    mode = node.attr("auto_pad", "NOTSET")
    outs, pad_ends = [], []
    for size, k, s, d, bg, e in zip(x.shape[2:], kernel, strides, dilations, begins, ends):
        ext = (k - 1) * d + 1
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
        elif mode == "VALID":
            out = (size - ext) // s + 1 if not ceil_mode else -(-(size - ext + 1) // s)
        else:
            span = size + bg + e - ext
            out = (-(-span // s) if ceil_mode else span // s) + 1
            if ceil_mode and (out - 1) * s >= size + bg:
                out -= 1  # the last window would start in the end padding
        outs.append(max(out, 0))
        pad_ends.append((out - 1) * s + ext - size - bg)
    return kernel, strides, dilations, begins, pad_ends, outs


def _windows(x: Tensor, kernel: list[int], strides: list[int], dilations: list[int], outs: list[int]):  # noqa: ANN202
    """Each kernel offset's strided view of a (padded) input: one tensor of the output's shape per offset."""
    for offset in itertools.product(*[range(k) for k in kernel]):
        index: list[Any] = [slice(None), slice(None)]
        for o, s, d, n in zip(offset, strides, dilations, outs):
            index.append(slice(o * d, o * d + (n - 1) * s + 1, s))
        yield x[tuple(index)]


def _crop_or_pad(x: Tensor, begins: list[int], ends: list[int], value: float) -> Tensor:
    # negative end pads crop what no window reads
    pos_ends = [max(e, 0) for e in ends]
    out = _pad_spatial(x, begins, pos_ends, value)
    for d, e in enumerate(ends):
        if e < 0:
            out = ember.narrow(out, 2 + d, 0, out.shape[2 + d] + e)
    return out


def _lowest(x: Tensor) -> float:
    return -math.inf if x.dtype.is_floating_point else float(np.iinfo(numpy_dtype(x.dtype)).min)


@register("MaxPool")
def max_pool(node: Node, x: Tensor) -> Any:
    kernel, strides, dilations, begins, ends, outs = _pool_geometry(node, x)
    padded = _crop_or_pad(x, begins, ends, _lowest(x))
    if not node.wants(1):
        out = None
        for view in _windows(padded, kernel, strides, dilations, outs):
            out = view if out is None else ember.maximum(out, view)
        return out
    # indices: flat positions in the unpadded input (row-major over N, C and the spatial dims)
    sizes = list(x.shape[2:])
    best = None
    best_idx = None
    for offset, view in zip(itertools.product(*[range(k) for k in kernel]),
                            _windows(padded, kernel, strides, dilations, outs)):
        coords = np.zeros(outs, dtype=np.int64)
        for d, (o, s, dl, bg, n) in enumerate(zip(offset, strides, dilations, begins, outs)):
            pos = np.arange(n) * s + o * dl - bg
            shape = [1] * len(outs)
            shape[d] = n
            if node.attr("storage_order", 0) and len(sizes) == 2:
                stride = sizes[0] if d == 1 else 1
            else:
                stride = int(np.prod(sizes[d + 1:], dtype=np.int64))
            coords = coords + pos.reshape(shape) * stride
        idx = ember.tensor(coords, device=x.device)
        if best is None:
            best, best_idx = view, ember.broadcast_to(idx, tuple(view.shape))
        else:
            take = view > best
            best = ember.where(take, view, best)
            best_idx = ember.where(take, idx, best_idx)
    plane = int(np.prod(sizes, dtype=np.int64))
    base = ember.arange(x.shape[0] * x.shape[1], device=x.device, dtype=ember.int64) * plane
    return best, best_idx + base.reshape([x.shape[0], x.shape[1]] + [1] * len(sizes))


@register("AveragePool")
def average_pool(node: Node, x: Tensor) -> Tensor:
    kernel, strides, dilations, begins, ends, outs = _pool_geometry(node, x)
    padded = _crop_or_pad(x, begins, ends, 0.0)
    total = None
    for view in _windows(padded, kernel, strides, dilations, outs):
        total = view if total is None else total + view
    # the divisor counts the input (and the pads, with count_include_pad), never the ceil-mode overhang
    _, _, pad_begins, pad_ends = _spatial(node, x, kernel)
    include = bool(node.attr("count_include_pad", 0))
    count = np.zeros(outs, dtype=np.float64)
    spans = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(outs, strides, kernel, dilations)]
    axes_mask = []
    for size, pb, pe, span in zip(x.shape[2:], pad_begins, pad_ends, spans):
        pos = np.arange(span)
        lo, hi = (0, pb + size + pe) if include else (pb, pb + size)
        axes_mask.append(((pos >= lo) & (pos < hi)).astype(np.float64))
    mask = axes_mask[0]
    for m in axes_mask[1:]:
        mask = np.multiply.outer(mask, m)
    for offset in itertools.product(*[range(k) for k in kernel]):
        index = tuple(slice(o * d, o * d + (n - 1) * s + 1, s) for o, s, d, n in zip(offset, strides, dilations, outs))
        count = count + mask[index]
    return total / ember.tensor(np.maximum(count, 1.0), dtype=x.dtype, device=x.device)


@register("LpPool")
def lp_pool(node: Node, x: Tensor) -> Tensor:
    p = node.attr("p", 2)
    kernel, strides, dilations, begins, ends, outs = _pool_geometry(node, x)
    padded = _crop_or_pad(ember.abs(x) ** p, begins, ends, 0.0)
    total = None
    for view in _windows(padded, kernel, strides, dilations, outs):
        total = view if total is None else total + view
    return total ** (1.0 / p)


@register("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(node: Node, x: Tensor) -> Tensor:
    dims = list(range(2, x.dim()))
    if node.op_type == "GlobalAveragePool":
        return ember.mean(x, dim=dims, keepdim=True)
    if node.op_type == "GlobalMaxPool":
        return ember.amax(x, dim=dims, keepdim=True)
    p = node.attr("p", 2)
    return ember.sum(ember.abs(x) ** p, dim=dims, keepdim=True) ** (1.0 / p)


# -- normalization ------------------------------------------------------------------------------------------------
def _channel(t: Tensor, rank: int) -> Tensor:
    return t.reshape([1, -1] + [1] * (rank - 2))


@register("BatchNormalization")
def batch_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor) -> Any:
    eps = node.attr("epsilon", 1e-5)
    # training_mode (opset 14+) returns the updated running statistics as extra outputs
    training = node.attr("training_mode", 0)
    r = x.dim()
    if not training:
        y = (x - _channel(mean, r)) / ember.sqrt(_channel(var, r) + eps) * _channel(scale, r) + _channel(bias, r)
        return y
    dims = [0] + list(range(2, r))
    bm = ember.mean(x, dim=dims)
    bv = ember.var(x, dim=dims, correction=0)
    mom = node.attr("momentum", 0.9)
    y = (x - _channel(bm, r)) / ember.sqrt(_channel(bv, r) + eps) * _channel(scale, r) + _channel(bias, r)
    return y, mean * mom + bm * (1 - mom), var * mom + bv * (1 - mom)


def _stash(node: Node, x: Tensor) -> Tensor:
    return x.to(ember.float32) if node.attr("stash_type", _FLOAT32) == _FLOAT32 and x.dtype != ember.float32 else x


@register("InstanceNormalization")
def instance_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    dims = list(range(2, x.dim()))
    mu = ember.mean(x, dim=dims, keepdim=True)
    var = ember.var(x, dim=dims, keepdim=True, correction=0)
    r = x.dim()
    return (x - mu) / ember.sqrt(var + node.attr("epsilon", 1e-5)) * _channel(scale, r) + _channel(bias, r)


@register("LayerNormalization")
def layer_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor | None = None) -> Any:
    axis = norm_axis(node.attr("axis", -1), x.dim())
    dims = list(range(axis, x.dim()))
    t = _stash(node, x)
    mu = ember.mean(t, dim=dims, keepdim=True)
    var = ember.mean((t - mu) * (t - mu), dim=dims, keepdim=True)
    inv = ember.rsqrt(var + node.attr("epsilon", 1e-5))
    y = ((t - mu) * inv).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return y, mu, inv


@register("RMSNormalization")
def rms_norm(node: Node, x: Tensor, scale: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", -1), x.dim())
    dims = list(range(axis, x.dim()))
    t = _stash(node, x)
    inv = ember.rsqrt(ember.mean(t * t, dim=dims, keepdim=True) + node.attr("epsilon", 1e-5))
    return (t * inv).to(x.dtype) * scale


@register("GroupNormalization")
def group_norm(node: Node, x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    g = node.attr("num_groups")
    n, c = x.shape[0], x.shape[1]
    t = _stash(node, x).reshape(n, g, -1)
    mu = ember.mean(t, dim=2, keepdim=True)
    var = ember.var(t, dim=2, keepdim=True, correction=0)
    y = ((t - mu) * ember.rsqrt(var + node.attr("epsilon", 1e-5))).to(x.dtype).reshape(x.shape)
    r = x.dim()
    if node.opset < 21:
        # opset 18: scale and bias are per group
        scale = scale.reshape(g, 1).expand(g, c // g).reshape(c)
        bias = bias.reshape(g, 1).expand(g, c // g).reshape(c)
    return y * _channel(scale, r) + _channel(bias, r)


@register("LpNormalization")
def lp_normalization(node: Node, x: Tensor) -> Tensor:
    axis = norm_axis(node.attr("axis", -1), x.dim())
    p = node.attr("p", 2)
    norm = ember.sum(ember.abs(x), dim=axis, keepdim=True) if p == 1 else \
        ember.sqrt(ember.sum(x * x, dim=axis, keepdim=True))
    # a zero norm gives zeros, not NaN (ONNX's reference)
    zero = norm == 0
    return ember.where(zero, ember.zeros_like(x), x / ember.where(zero, ember.ones_like(norm), norm))


@register("MeanVarianceNormalization")
def mean_variance_normalization(node: Node, x: Tensor) -> Tensor:
    dims = list(node.attr("axes") or [0, 2, 3])
    mu = ember.mean(x, dim=dims, keepdim=True)
    var = ember.mean(x * x, dim=dims, keepdim=True) - mu * mu
    return (x - mu) / (ember.sqrt(var) + 1e-9)


@register("LRN")
def lrn(node: Node, x: Tensor) -> Tensor:
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    sq = x * x
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = F.pad(sq, [0, 0] * (x.dim() - 2) + [lo, hi])
    total = None
    for i in range(size):
        view = ember.narrow(padded, 1, i, x.shape[1])
        total = view if total is None else total + view
    return x / (bias + alpha / size * total) ** beta


@register("Dropout")
def dropout(node: Node, x: Tensor, ratio: Tensor | None = None, training: Tensor | None = None) -> Any:
    train = bool(host_scalar(training)) if training is not None else False
    r = float(host_scalar(ratio)) if ratio is not None else node.attr("ratio", 0.5)
    if train and r > 0:
        mask = ember.rand(list(x.shape), device=x.device) >= r
        y = ember.where(mask, x / (1 - r), ember.zeros_like(x))
    else:
        mask = ember.ones(list(x.shape), dtype=ember.bool_, device=x.device)
        y = x
    return (y, mask) if node.wants(1) else y


# -- losses ------------------------------------------------------------------------------------------------------
def _nll(node: Node, logp: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    t = target.to(ember.int64)
    ignore = node.attr("ignore_index")
    valid = t != ignore if ignore is not None else None
    safe = ember.where(valid, t, ember.zeros_like(t)) if valid is not None else t
    picked = -ember.gather(logp, 1, ember.unsqueeze(safe, 1)).squeeze(1)
    w = ember.index_select(weight, 0, safe.reshape(-1)).reshape(safe.shape) if weight is not None else None
    if valid is not None:
        vf = valid.to(logp.dtype)
        w = vf if w is None else w * vf
    loss = picked if w is None else picked * w
    how = node.attr("reduction", "mean")
    if how == "none":
        return loss
    if how == "sum":
        return ember.sum(loss)
    if w is None:
        return ember.mean(loss)
    return ember.sum(loss) / ember.sum(w)


@register("NegativeLogLikelihoodLoss")
def nll_loss(node: Node, logp: Tensor, target: Tensor, weight: Tensor | None = None) -> Tensor:
    return _nll(node, logp, target, weight)


@register("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(node: Node, scores: Tensor, labels: Tensor, weight: Tensor | None = None) -> Any:
    logp = F.log_softmax(scores, dim=1)
    loss = _nll(node, logp, labels, weight)
    return (loss, logp) if node.wants(1) else loss


@register("MaxUnpool")
def max_unpool(node: Node, x: Tensor, indices: Tensor, output_shape: Tensor | None = None) -> Tensor:
    kernel = list(node.attr("kernel_shape"))
    n = len(kernel)
    strides = list(node.attr("strides") or [1] * n)
    pads = list(node.attr("pads") or [0] * (2 * n))
    if output_shape is not None:
        out = [int(v) for v in np.asarray(output_shape.detach().numpy()).reshape(-1).tolist()]
    else:
        spatial = [(i - 1) * s + k - pb - pe for i, s, k, pb, pe in
                   zip(x.shape[2:], strides, kernel, pads[:n], pads[n:])]
        out = list(x.shape[:2]) + spatial
    # MaxPool's indices count over the whole (N, C, spatial...) tensor
    total = int(np.prod(out, dtype=np.int64))
    flat = ember.zeros(total, dtype=x.dtype, device=x.device)
    return ember.scatter(flat, 0, indices.reshape(-1).to(ember.int64), x.reshape(-1)).reshape(out)


@register("Col2Im")
def col2im(node: Node, x: Tensor, image_shape: Tensor, block_shape: Tensor) -> Tensor:
    image = [int(v) for v in np.asarray(image_shape.detach().numpy()).reshape(-1).tolist()]
    block = [int(v) for v in np.asarray(block_shape.detach().numpy()).reshape(-1).tolist()]
    n = len(image)
    if n != 2:
        raise node.fail(f"Col2Im over {n} spatial dims is not supported (2 only)")
    pads = list(node.attr("pads") or [0] * (2 * n))
    if pads[:n] != pads[n:]:
        raise node.fail(f"Col2Im with asymmetric pads {pads} is not supported")
    return F.fold(x, image, block, dilation=list(node.attr("dilations") or [1] * n), padding=pads[:n],
                  stride=list(node.attr("strides") or [1] * n))
