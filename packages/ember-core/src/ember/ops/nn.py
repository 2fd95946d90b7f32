"""The nn layer of the Bridge: every backend call ``ember.nn.functional`` makes goes through this module.

``ember.nn.functional`` parses PyTorch's arguments and validates them (ranks, shapes, dtypes, devices, option
values; typed errors naming the function), then calls one function here with validated Tensors and normalised
arguments (per-dim tuples, ``(lo, hi)`` padding pairs, computed output sizes). A function here promotes or casts
where the op needs it, runs a short chain of stack calls -- the backend's ``conv`` / ``max_pool`` / ``softmax`` ...
(contract methods with default compositions that fast backends override) or elementwise compositions -- on
handles, with no Tensor built between steps, and wraps the result once. So the functional API and ``ember.ops``
reach the stack through one layer, and a hot path (linear, conv2d, relu, cross_entropy) costs one extra Python
call over composing in nn.functional directly.

Data-dependent checks that need a host read (index ranges, probabilities in [0, 1]) read through
:func:`host_extrema` / :func:`class_target_bounds` here and raise in nn.functional, or raise here when the
check and the op share the read (:func:`embedding`, :func:`one_hot`).

Internal: nothing here is re-exported from ``ember``; the public API is ``ember.nn.functional``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import IndexOutOfRangeError, UnsupportedError, ValueRangeError
from ..tensor import Tensor
from .elementwise import keep_graph, unary, write_result

Handle = Any
Shape = tuple[int, ...]


# ------------------------------------------------------------------------------------------------------------
# handle-level helpers (private: they take the stack and handles)
# ------------------------------------------------------------------------------------------------------------
def _stack(x: Tensor) -> Any:
    return x._device._stack or x._device.stack


def _like(x: Tensor, h: Handle) -> Tensor:
    return Tensor._make(h, x._dtype, x._device)


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def _cast(s: Any, x: Tensor, d: DType) -> Handle:
    return x._h if x._dtype is d else s.cast(x._h, d)


def _mean(s: Any, h: Handle, dims: tuple[int, ...], keepdim: bool) -> Handle:
    n = _prod([h.shape[d] for d in dims])
    return s.binary("div", s.reduce("sum", h, dims, keepdim), float(n))


def _var(s: Any, h: Handle, dims: tuple[int, ...], correction: int = 0) -> tuple[Handle, Handle]:
    """(mean, variance) over dims with keepdim; two-pass for accuracy."""
    m = _mean(s, h, dims, True)
    c = s.binary("sub", h, m)
    n = _prod([h.shape[d] for d in dims])
    v = s.binary("div", s.reduce("sum", s.binary("mul", c, c), dims, True), float(max(n - correction, 0)))
    return m, v


def _reduce_loss(s: Any, h: Handle, reduction: str) -> Handle:
    """Apply 'none' / 'mean' / 'sum' to an elementwise loss handle."""
    if reduction == "none":
        return h
    dims = tuple(range(len(h.shape)))
    if reduction == "sum":
        return s.reduce("sum", h, dims, False) if dims else h
    n = _prod(h.shape)
    if not dims:
        return h
    return s.binary("div", s.reduce("sum", h, dims, False), float(n) if n else float("nan"))


def _vector_norm(s: Any, h: Handle, p: float, dims: tuple[int, ...], keepdim: bool) -> Handle:
    """p-norm over dims (p may be inf, -inf, 0 or any real), as torch.linalg.vector_norm."""
    a = s.unary("abs", h)
    if p == 2:
        return s.unary("sqrt", s.reduce("sum", s.binary("mul", h, h), dims, keepdim))
    if p == 1:
        return s.reduce("sum", a, dims, keepdim)
    if p == float("inf"):
        return s.reduce("max", a, dims, keepdim)
    if p == float("-inf"):
        return s.reduce("min", a, dims, keepdim)
    if p == 0:
        nz = s.binary("ne", h, 0.0)
        return s.reduce("sum", s.where(nz, s.binary("add", s.binary("mul", a, 0.0), 1.0),
                                       s.binary("mul", a, 0.0)), dims, keepdim)
    return s.binary("pow", s.reduce("sum", s.binary("pow", a, float(p)), dims, keepdim), 1.0 / float(p))


def _host_minmax(s: Any, h: Handle, kind: Callable[[Any], Any] = int) -> tuple[Any, Any]:
    """min and max of a non-empty handle as Python ints (or ``kind``), one small device->host transfer each."""
    dims = tuple(range(len(h.shape)))
    lo = s.reduce("min", h, dims, False) if dims else h
    hi = s.reduce("max", h, dims, False) if dims else h
    return kind(np.asarray(s.to_numpy(lo)).reshape(())), kind(np.asarray(s.to_numpy(hi)).reshape(()))


def _batch(s: Any, x: Tensor, unbatched: bool) -> Handle:
    return s.reshape(x._h, (1,) + x.shape) if unbatched else x._h


def _promote_pair(s: Any, a: Tensor, b: Tensor, d: DType, shape: Shape) -> tuple[Handle, Handle]:
    """Both operands cast to d and expanded to the (validated) broadcast shape."""
    ha, hb = _cast(s, a, d), _cast(s, b, d)
    if tuple(ha.shape) != shape:
        ha = s.expand(ha, shape)
    if tuple(hb.shape) != shape:
        hb = s.expand(hb, shape)
    return ha, hb


# ------------------------------------------------------------------------------------------------------------
# host reads for data-dependent checks
# ------------------------------------------------------------------------------------------------------------
def host_extrema(x: Tensor) -> tuple[Any, Any]:
    """(min, max) of a non-empty tensor as Python numbers (float for floating dtypes, else int)."""
    return _host_minmax(_stack(x), x._h, float if x._dtype.is_floating_point else int)


def class_target_bounds(target: Tensor, ignore_index: int, any_only: bool) -> tuple[bool, int, int]:
    """For int64 class targets: whether any target differs from ignore_index and -- unless ``any_only`` --
    the min and max of the targets with ignored ones read as 0 (``(any, 0, 0)`` when ``any_only``)."""
    s = _stack(target)
    valid = s.binary("ne", target._h, int(ignore_index))
    if any_only:
        dims = tuple(range(target.ndim))
        return bool(s.to_numpy(s.reduce("max", valid, dims, False) if dims else valid)), 0, 0
    lo, hi = _host_minmax(s, s.where(valid, target._h, 0))
    return True, int(lo), int(hi)


def cast(x: Tensor, d: DType) -> Tensor:
    """x in dtype d (x itself when it has it)."""
    return x if x._dtype is d else Tensor._make(_stack(x).cast(x._h, d), d, x._device)


# ------------------------------------------------------------------------------------------------------------
# activations
# ------------------------------------------------------------------------------------------------------------
def _relu(s: Any, x: Tensor) -> Handle:
    # Backend.relu: a differentiable stack gives PyTorch's gradient (zero at the tie x == 0)
    return s.relu(x._h)


def _hardtanh(s: Any, x: Tensor, lo: Any, hi: Any) -> Handle:
    # Backend.hardtanh: a differentiable stack gives PyTorch's gradient (zero at and beyond the bounds)
    return s.hardtanh(x._h, lo, hi)


def _gelu(s: Any, x: Tensor, approximate: str) -> Handle:
    h = x._h
    if approximate == "tanh":
        inner = s.binary("mul", s.binary("add", h, s.binary("mul", s.binary("mul", s.binary("mul", h, h), h),
                                                             0.044715)), math.sqrt(2.0 / math.pi))
        cdf = s.binary("mul", s.binary("add", s.unary("tanh", inner), 1.0), 0.5)
    else:
        cdf = s.binary("add", s.binary("mul", s.unary("erf", s.binary("mul", h, 1.0 / math.sqrt(2.0))), 0.5), 0.5)
    return s.binary("mul", h, cdf)


def gelu_composition(x: Tensor, approximate: str) -> Tensor:
    """GELU of x in contract ops (the default composition of ``train_kernels.gelu``, what runs where the backend
    has no kernel for it)."""
    return Tensor._make(_gelu(_stack(x), x, approximate), x._dtype, x._device)


#: dtypes the one-op GELU and layer norm (``ember.ops.train_kernels``) take where the backend has kernels for them
_KERNEL_DTYPES = (dt.float32, dt.float64)


def _elu(s: Any, x: Tensor, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> Handle:
    h = x._h
    neg = s.binary("mul", s.unary("expm1", s.binary("mul", h, input_scale) if input_scale != 1.0 else h),
                   float(alpha))
    r = s.where(s.binary("gt", h, 0.0), h, neg)
    return s.binary("mul", r, float(scale)) if scale != 1.0 else r


def _softplus_h(s: Any, h: Handle, beta: float, threshold: float) -> Handle:
    bx = s.binary("mul", h, float(beta)) if beta != 1 else h
    # log1p(exp(bx)) written stably: max(bx, 0) + log1p(exp(-|bx|))
    sp = s.binary("add", s.binary("maximum", bx, 0.0), s.unary("log1p", s.unary("exp", s.unary("neg",
                                                                                            s.unary("abs", bx)))))
    if beta != 1:
        sp = s.binary("div", sp, float(beta))
    return s.where(s.binary("gt", bx, float(threshold)), h, sp)


def _relu6_shifted(s: Any, h: Handle) -> Handle:
    return s.binary("minimum", s.binary("maximum", s.binary("add", h, 3.0), 0.0), 6.0)


def _softshrink(s: Any, x: Tensor, lambd: float) -> Handle:
    h = x._h
    shrunk = s.binary("sub", h, s.binary("mul", s.unary("sign", h), float(lambd)))
    return s.where(s.binary("gt", s.unary("abs", h), float(lambd)), shrunk, s.binary("mul", h, 0.0))


def _threshold(s: Any, x: Tensor, threshold: float, value: float) -> Handle:
    h = x._h
    zero = 0.0 if x._dtype.is_floating_point else 0
    fill = s.binary("add", s.binary("mul", h, zero), value)
    return s.where(s.binary("gt", h, threshold), h, fill)


#: elementwise activations: name -> composition (stack, input, *parameters) -> handle of the input's dtype
_ACTIVATIONS: dict[str, Callable[..., Handle]] = {
    "relu": _relu,
    "hardtanh": _hardtanh,
    "gelu": _gelu,
    "silu": lambda s, x: s.binary("mul", x._h, s.unary("sigmoid", x._h)),
    "elu": _elu,
    "leaky_relu": lambda s, x, slope: s.where(s.binary("gt", x._h, 0.0), x._h, s.binary("mul", x._h, float(slope))),
    "softplus": lambda s, x, beta, threshold: _softplus_h(s, x._h, beta, threshold),
    "softsign": lambda s, x: s.binary("div", x._h, s.binary("add", s.unary("abs", x._h), 1.0)),
    "mish": lambda s, x: s.binary("mul", x._h, s.unary("tanh", _softplus_h(s, x._h, 1.0, 20.0))),
    "hardsigmoid": lambda s, x: s.binary("div", _relu6_shifted(s, x._h), 6.0),
    "hardswish": lambda s, x: s.binary("div", s.binary("mul", x._h, _relu6_shifted(s, x._h)), 6.0),
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), stable for large |x|
    "logsigmoid": lambda s, x: s.binary("sub", s.binary("minimum", x._h, 0.0),
                                        s.unary("log1p", s.unary("exp", s.unary("neg", s.unary("abs", x._h))))),
    "tanhshrink": lambda s, x: s.binary("sub", x._h, s.unary("tanh", x._h)),
    "hardshrink": lambda s, x, lambd: s.where(s.binary("gt", s.unary("abs", x._h), float(lambd)), x._h,
                                              s.binary("mul", x._h, 0.0)),
    "softshrink": _softshrink,
    "threshold": _threshold,
}


def activation(name: str, x: Tensor, *params: Any, inplace: bool = False) -> Tensor:
    """The elementwise activation ``name`` (a key of the table above) of a validated x with its parameters
    (hardtanh: lo, hi in x's dtype; gelu: 'none' or 'tanh'; elu: alpha, scale, input_scale; leaky_relu: slope;
    softplus: beta, threshold; hardshrink/softshrink: lambd; threshold: threshold, value). ``inplace`` writes the
    result into x (``Backend.write_back``) and returns x. GELU is one op (and one backward op) where the backend has
    kernels for them (``train_kernels.gelu``)."""
    if name == "gelu" and not inplace and x._dtype in _KERNEL_DTYPES:
        from . import train_kernels as _tk

        if _tk.has_kernel(_tk.gelu, x):
            return _tk.gelu(x, approximate=params[0])
    h = _ACTIVATIONS[name](_stack(x), x, *params)
    if inplace:
        return write_result(x, h, "inplace activation")
    return Tensor._make(h, x._dtype, x._device)


def sigmoid(x: Tensor) -> Tensor:
    """ember.ops' sigmoid (a contract unary op)."""
    return unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    """ember.ops' tanh (a contract unary op)."""
    return unary("tanh", x)


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """x where x > 0, else weight * x; weight (1 or C elements, validated) lines up with dim 1."""
    s = _stack(x)
    n = weight.numel()
    # a single weight broadcasts everywhere
    view = (n,) + (1,) * (x.ndim - 2) if n > 1 else (1,) * x.ndim
    w = s.reshape(weight._h, view)
    h = x._h
    return _like(x, s.where(s.binary("gt", h, 0.0), h, s.binary("mul", h, w)))


def softmax(x: Tensor, dim: int, dtype: DType, log: bool = False, negate: bool = False) -> Tensor:
    """(log-)softmax of x (or of -x with ``negate``) along the normalised dim, computed in ``dtype`` (x is cast
    first; validated floating, or x's own dtype for an empty x)."""
    s = _stack(x)
    h = _cast(s, x, dtype)
    if negate:
        h = s.unary("neg", h)
    if x.ndim == 0:
        # as that of a 1-element vector, so its value (NaN for a non-finite input) and its gradient
        # (g - exp(y) * g: NaN there too) are torch's
        return Tensor._make(s.reshape(s.softmax(s.reshape(h, (1,)), 0, log), ()), dtype, x._device)
    if 0 in x.shape:  # nothing to normalise; backends need not reduce an empty dim (PyTorch: empty result)
        return Tensor._make(keep_graph(s, s.full(x.shape, 0.0, dtype), h), dtype, x._device)
    return Tensor._make(s.softmax(h, dim, log), dtype, x._device)


def glu(x: Tensor, dim: int) -> Tensor:
    """a * sigmoid(b) for the two halves a, b of x along the normalised dim (of even size)."""
    s = _stack(x)
    n = x.shape[dim]
    pre = (slice(None),) * dim
    a = s.getitem(x._h, pre + (slice(0, n // 2),))
    b = s.getitem(x._h, pre + (slice(n // 2, n),))
    return _like(x, s.binary("mul", a, s.unary("sigmoid", b)))


def normalize(x: Tensor, p: float, dim: int | None, eps: float) -> Tensor:
    """x / max(||x||_p, eps) along the normalised dim (None: a 0-d x, divided by its absolute value)."""
    s = _stack(x)
    if dim is None:
        nrm = s.unary("abs", x._h)
    else:
        nrm = _vector_norm(s, x._h, float(p), (dim,), True)
    den = s.binary("maximum", nrm, float(eps))
    return _like(x, s.binary("div", x._h, den))


# ------------------------------------------------------------------------------------------------------------
# affine maps, lookups, dropout
# ------------------------------------------------------------------------------------------------------------
def linear(x: Tensor, weight: Tensor, bias: Tensor | None, out_shape: Shape) -> Tensor:
    """x @ weight.T + bias (weight 2-d, or 1-d for a dot product) reshaped to out_shape."""
    s = _stack(x)
    if weight.ndim == 2:
        xh = x._h
        if len(xh.shape) > 2:
            # leading dims flattened into one 2-D GEMM: a batched 3-D @ 2-D matmul loops over the batch (and over a
            # transposed input it is several times slower than one GEMM of all rows)
            xh = s.reshape(xh, (_prod(xh.shape[:-1]), xh.shape[-1]))
        h = s.matmul(xh, s.permute(weight._h, (1, 0)))
    else:
        h = s.matmul(x._h, weight._h)
    if bias is not None:
        # core checked bias: 1-d, out_features long. On a bare backend (a decorator must see the add as its own
        # op) with a non-empty reduction (an empty one may give a broadcast fill) and one dtype throughout, add it
        # into matmul's fresh result in place: no second (rows, out) buffer to allocate and write
        if getattr(s, "inner", None) is None and weight.shape[-1] > 0 and bias._dtype is x._dtype is weight._dtype:
            s.inplace_binary("add", h, bias._h)
        else:
            h = s.binary("add", h, bias._h)
    if tuple(h.shape) != out_shape:
        h = s.reshape(h, out_shape)
    return _like(x, h)


def bilinear(x1: Tensor, x2: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """y[..., o] = x1[..., i] * weight[o, i, j] * x2[..., j] + bias[o]."""
    s = _stack(x1)
    o, i1, i2 = weight.shape
    lead = x1.shape[:-1]
    b = _prod(lead)
    a1 = s.reshape(x1._h, (b, i1))
    a2 = s.reshape(x2._h, (b, 1, i2))
    wm = s.reshape(s.permute(weight._h, (1, 0, 2)), (i1, o * i2))
    t = s.reshape(s.matmul(a1, wm), (b, o, i2))
    h = s.reduce("sum", s.binary("mul", t, a2), (2,), False) if i2 else s.full((b, o), 0.0, x1._dtype)
    if bias is not None:
        h = s.binary("add", h, bias._h)
    return _like(x1, s.reshape(h, lead + (o,)))


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None, max_norm: float | None,
              norm_type: float) -> Tensor:
    """Rows of weight (num_embeddings, dim) at the int32/int64 indices of input. Raises IndexOutOfRangeError
    for an index outside weight (one host read); max_norm renormalises the referenced rows of weight in place
    (untracked, as torch); a differentiable stack keeps the padding row's gradient at zero."""
    s = _stack(input)
    num = weight.shape[0]
    idx = input._h if input._dtype is dt.int64 else s.cast(input._h, dt.int64)
    flat = s.reshape(idx, (input.numel(),))
    if input.numel():
        lo, hi = _host_minmax(s, flat)
        if lo < 0 or hi >= num:
            raise IndexOutOfRangeError(f"embedding: index {lo if lo < 0 else hi} is out of range for weight with "
                                       f"{num} rows (weight shape {weight.shape})")
        if max_norm is not None:
            from ..autograd import no_grad

            with no_grad():  # renormalising the weight in place is not part of the gradient (as in torch)
                _renorm_rows(s, weight, flat, float(max_norm), float(norm_type))
    h = s.embedding(weight._h, flat, None if padding_idx is None else padding_idx % num)
    return _like(weight, s.reshape(h, input.shape + (weight.shape[1],)))


def _renorm_rows(s: Any, weight: Tensor, flat: Handle, max_norm: float, norm_type: float) -> None:
    rows = np.unique(np.asarray(s.to_numpy(flat)))
    ridx = s.from_numpy(np.ascontiguousarray(rows.astype(np.int64)))
    sel = s.index_select(weight._h, 0, ridx)
    nrm = _vector_norm(s, sel, norm_type, (1,), True)
    scale = s.binary("div", max_norm, s.binary("add", nrm, 1e-7))
    over = s.binary("gt", nrm, max_norm)
    new = s.where(over, s.binary("mul", sel, scale), sel)
    s.setitem(weight._h, (ridx,), new)


def one_hot(t: Tensor, num_classes: int) -> Tensor:
    """int64 one-hot encoding of int64 t (num_classes -1: max value + 1); class values are range-checked
    (IndexOutOfRangeError, one host read)."""
    s = _stack(t)
    if t.numel() == 0:
        if num_classes == -1:
            raise ValueRangeError("one_hot: can not infer the total number of classes from an empty tensor")
        return Tensor._make(s.full(t.shape + (num_classes,), 0, dt.int64), dt.int64, t._device)
    lo, hi = _host_minmax(s, t._h)
    if lo < 0:
        raise IndexOutOfRangeError(f"one_hot: class values must be non-negative, got {lo}")
    c = hi + 1 if num_classes == -1 else int(num_classes)
    if hi >= c:
        raise IndexOutOfRangeError(f"one_hot: class value {hi} is out of range for num_classes={c}")
    ar = s.reshape(s.arange(0, c, 1, dt.int64), (1,) * t.ndim + (c,))
    eq = s.binary("eq", s.reshape(t._h, t.shape + (1,)), ar)
    return Tensor._make(s.cast(eq, dt.int64), dt.int64, t._device)


def dropout(x: Tensor, p: float, inplace: bool, mask_shape: Shape) -> Tensor:
    """Zero elements (or whole mask_shape-broadcast features) of a non-empty x with probability 0 < p <= 1 and
    scale the rest by 1 / (1 - p); one draw from the device's random stream."""
    s = _stack(x)
    if p == 1.0:
        h = s.binary("mul", x._h, 0.0) if x._dtype.is_floating_point else s.full(x.shape, 0, x._dtype)
    else:
        keep = s.binary("lt", s.rand(mask_shape, x._dtype), 1.0 - p)
        scale = s.binary("mul", s.cast(keep, x._dtype), 1.0 / (1.0 - p))
        h = s.binary("mul", x._h, scale)
    if inplace:
        s.assign(x._h, h)
        return x
    return _like(x, h)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                                 dropout_p: float, is_causal: bool, scale: float, repeat_k: int, repeat_v: int,
                                 out_shape: Shape) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v for validated operands; key/value heads (dim -3) are repeated
    repeat_k / repeat_v times (GQA). Rows whose every position is masked give zeros (a "safe" softmax)."""
    s = _stack(query)
    d = query._dtype
    kh, vh = _repeat_heads(s, key._h, repeat_k), _repeat_heads(s, value._h, repeat_v)
    L, S = query.shape[-2], key.shape[-2]
    if _prod(out_shape) == 0 or S == 0:
        return _like(query, keep_graph(s, s.full(out_shape, 0.0, d), query, key, value, attn_mask))
    nk = len(kh.shape)
    scores = s.binary("mul", s.matmul(query._h, s.permute(kh, tuple(range(nk - 2)) + (nk - 1, nk - 2))), scale)
    keep = None
    if is_causal:
        r = s.reshape(s.arange(0, L, 1, dt.int64), (L, 1))
        c = s.reshape(s.arange(0, S, 1, dt.int64), (1, S))
        keep = s.binary("le", c, r)  # top-left aligned lower triangle, as torch
    elif attn_mask is not None and attn_mask._dtype is dt.bool_:
        keep = attn_mask._h
    elif attn_mask is not None:
        scores = s.binary("add", scores, attn_mask._h)
    if keep is not None:
        scores = s.where(keep, scores, float("-inf"))
    last = len(scores.shape) - 1
    attn = s.softmax(scores, last, False)
    # safe softmax: a row that is entirely -inf gives zeros instead of NaN
    m = s.reduce("max", scores, (last,), True)
    attn = s.where(s.binary("eq", m, float("-inf")), 0.0, attn)
    if dropout_p > 0.0:
        if dropout_p == 1.0:
            attn = s.binary("mul", attn, 0.0)
        else:
            mask = s.binary("lt", s.rand(tuple(attn.shape), d), 1.0 - dropout_p)
            attn = s.binary("mul", attn, s.binary("mul", s.cast(mask, d), 1.0 / (1.0 - dropout_p)))
    return _like(query, s.reshape(s.matmul(attn, vh), out_shape))


def _repeat_heads(s: Any, h: Handle, r: int) -> Handle:
    """repeat_interleave by r along dim -3 (each key/value head serves r query heads)."""
    if r == 1:
        return h
    shape = tuple(h.shape)
    n = len(shape)
    e = s.reshape(h, shape[:-2] + (1,) + shape[-2:])
    e = s.expand(e, shape[:-2] + (r,) + shape[-2:])
    return s.reshape(s.contiguous(e), shape[:n - 3] + (shape[-3] * r,) + shape[-2:])


# ------------------------------------------------------------------------------------------------------------
# convolution, pooling, resampling, padding, unfold/fold, pixel shuffle
# ------------------------------------------------------------------------------------------------------------
def conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Shape, padding: tuple[tuple[int, int], ...],
         dilation: Shape, groups: int, unbatched: bool, out: Shape) -> Tensor:
    """N-d convolution (the backend's ``conv``) of validated operands; ``out`` is the spatial output size. An
    empty batch, channel or output runs no kernel (zeros tied to the operands for gradients)."""
    s = _stack(x)
    n = 1 if unbatched else x.shape[0]
    cout = weight.shape[0]
    if n == 0 or cout == 0 or _prod(out) == 0:
        h = keep_graph(s, s.full((n, cout) + out, 0.0, x._dtype), x, weight, bias)
    else:
        h = s.conv(_batch(s, x, unbatched), weight._h, None if bias is None else bias._h, stride, padding,
                   dilation, groups)
    if unbatched:
        h = s.reshape(h, (cout,) + out)
    return _like(x, h)


def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Shape, padding: Shape,
                   output_padding: Shape, dilation: Shape, groups: int, unbatched: bool, out: Shape) -> Tensor:
    """N-d transposed convolution (the backend's ``conv_transpose``) of validated operands; ``out`` is the
    spatial output size. An empty batch or input runs no kernel (the bias alone where the input is empty)."""
    s = _stack(x)
    xs = ((1,) + x.shape) if unbatched else x.shape
    n, sp = xs[0], xs[2:]
    cout = weight.shape[1] * groups
    if n == 0 or _prod(sp) == 0 or cout == 0:
        h = s.full((n, cout) + out, 0.0, x._dtype)
        if bias is not None and _prod(sp) == 0 and n:
            h = s.binary("add", h, s.reshape(bias._h, (1, cout) + (1,) * len(out)))
        h = keep_graph(s, h, x, weight, bias)
    else:
        h = s.conv_transpose(_batch(s, x, unbatched), weight._h, None if bias is None else bias._h, stride,
                             padding, output_padding, dilation, groups)
    if unbatched:
        h = s.reshape(h, (cout,) + out)
    return _like(x, h)


def _pool_float(s: Any, x: Tensor, op: str) -> DType:
    """The float dtype integers are pooled in: float64 (exact up to 2**53), or on a backend without it float32
    when every value is exact there (|v| <= 2**24), so the backend's -inf padding stays valid and nothing rounds."""
    if dt.float64 in s.supported_dtypes:
        return dt.float64
    if x._dtype in (dt.bool_, dt.int8, dt.uint8, dt.int16):
        return dt.float32
    if x.numel() == 0:
        return dt.float32
    dims = tuple(range(x.ndim))  # min and max, not abs: abs(-2**31) overflows int32
    largest = max(abs(int(s.to_numpy(s.reduce(r, x._h, dims, False)).item())) for r in ("min", "max"))
    if largest <= 2**24:
        return dt.float32
    raise UnsupportedError(f"{op}: {x._dtype.name} values up to {largest} pool exactly only in float64, which the "
                           f"device {x._device} does not support")


def max_pool(x: Tensor, nd: int, kernel_size: Shape, stride: Shape, padding: Shape, dilation: Shape,
             ceil_mode: bool, return_indices: bool, out: Shape) -> Any:
    """Max pooling over the last nd dims (the backend's ``max_pool``); integers are pooled in float64 (exact up
    to 2**53; see :func:`_pool_float`) so the backend's -inf padding stays valid. Returns values, or (values,
    int64 indices)."""
    s = _stack(x)
    lead = x.shape[:-nd]
    if _prod(lead) == 0:
        v = keep_graph(s, s.full(lead + out, 0, x._dtype), x)
        if return_indices:
            return _like(x, v), Tensor._make(s.full(lead + out, 0, dt.int64), dt.int64, x._device)
        return _like(x, v)
    h = x._h if x._dtype.is_floating_point else s.cast(x._h, _pool_float(s, x, "max_pool"))
    r = s.max_pool(h, kernel_size, stride, padding, dilation, bool(ceil_mode), bool(return_indices))
    v, idx = (r if return_indices else (r, None))
    if not x._dtype.is_floating_point:
        v = s.cast(v, x._dtype)
    if return_indices:
        return _like(x, v), Tensor._make(idx, dt.int64, x._device)
    return _like(x, v)


def avg_pool(x: Tensor, nd: int, kernel_size: Shape, stride: Shape, padding: Shape, ceil_mode: bool,
             count_include_pad: bool, divisor_override: int | None, out: Shape) -> Tensor:
    """Average pooling over the last nd dims (the backend's ``avg_pool``); integer averages are computed in
    float64 and truncated, as torch."""
    s = _stack(x)
    lead = x.shape[:-nd]
    if _prod(lead) == 0:
        return _like(x, keep_graph(s, s.full(lead + out, 0, x._dtype), x))
    h = x._h if x._dtype.is_floating_point else s.cast(x._h, dt.float64)
    v = s.avg_pool(h, kernel_size, stride, padding, bool(ceil_mode), bool(count_include_pad), divisor_override)
    if not x._dtype.is_floating_point:
        v = s.cast(v, x._dtype)
    return _like(x, v)


def adaptive_avg_pool(x: Tensor, nd: int, out: Shape) -> Tensor:
    """Average pooling of the last nd dims to the output size ``out`` (the backend's ``adaptive_avg_pool``)."""
    s = _stack(x)
    lead = x.shape[:-nd]
    if _prod(lead) == 0 or _prod(out) == 0:
        return _like(x, keep_graph(s, s.full(lead + out, 0.0, x._dtype), x))
    return _like(x, s.adaptive_avg_pool(x._h, out))


def adaptive_max_pool(x: Tensor, nd: int, out: Shape, return_indices: bool) -> Any:
    """Max pooling of the last nd dims to the output size ``out`` (the backend's ``adaptive_max_pool``)."""
    s = _stack(x)
    lead = x.shape[:-nd]
    if _prod(lead) == 0 or _prod(out) == 0:
        v = _like(x, keep_graph(s, s.full(lead + out, 0.0, x._dtype), x))
        return (v, Tensor._make(s.full(lead + out, 0, dt.int64), dt.int64, x._device)) if return_indices else v
    r = s.adaptive_max_pool(x._h, out, bool(return_indices))
    if return_indices:
        return _like(x, r[0]), Tensor._make(r[1], dt.int64, x._device)
    return _like(x, r)


def interpolate(x: Tensor, out: Shape, mode: str, align_corners: bool | None,
                scales: tuple[float, ...] | None) -> Tensor:
    """Resize the spatial dims of (N, C, *spatial) x to ``out`` (the backend's ``interpolate``; 'area' is an
    adaptive average pool)."""
    s = _stack(x)
    if x.shape[0] * x.shape[1] == 0:
        return _like(x, keep_graph(s, s.full(x.shape[:2] + out, 0, x._dtype), x))
    if mode == "area":
        return _like(x, s.adaptive_avg_pool(x._h, out))
    return _like(x, s.interpolate(x._h, out, mode, align_corners, scales))


def pad(x: Tensor, pairs: tuple[tuple[int, int], ...], mode: str, fill: Any, out: Shape) -> Tensor:
    """x padded by a validated (lo, hi) pair per dim (the backend's ``pad``); ``out`` is the result's shape."""
    s = _stack(x)
    if _prod(out) == 0:
        return _like(x, keep_graph(s, s.full(out, 0, x._dtype), x))
    if _prod(x.shape) == 0:
        return _like(x, keep_graph(s, s.full(out, fill, x._dtype), x))
    return _like(x, s.pad(x._h, pairs, mode, fill if mode == "constant" else None))


def _tap_key(taps: tuple[int, ...], dl: Shape, st: Shape, out: Shape) -> tuple[Any, ...]:
    return (slice(None), slice(None)) + tuple(
        slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, s, o in zip(taps, dl, st, out))


def unfold(x: Tensor, unbatched: bool, kernel_size: Shape, dilation: Shape, padding: Shape, stride: Shape,
           out: Shape) -> Tensor:
    """Sliding blocks of (N, C, H, W) x as columns (N, C * kH * kW, L) (unbatched: without N); ``out`` is the
    validated block grid."""
    s = _stack(x)
    h = _batch(s, x, unbatched)
    n, c = h.shape[:2]
    K, L = _prod(kernel_size), _prod(out)
    if n * c == 0:
        r = keep_graph(s, s.full((n, c * K, L), 0, x._dtype), x)
    else:
        if any(padding):
            h = s.pad(h, ((0, 0), (0, 0)) + tuple((p, p) for p in padding), "constant", 0)
        cols = [s.reshape(s.getitem(h, _tap_key(t, dilation, stride, out)), (n, c, 1, L))
                for t in itertools.product(*(range(k) for k in kernel_size))]
        r = s.reshape(cols[0] if K == 1 else s.cat(cols, 2), (n, c * K, L))
    if unbatched:
        r = s.reshape(r, (c * K, L))
    return _like(x, r)


def fold(x: Tensor, unbatched: bool, output_size: Shape, kernel_size: Shape, dilation: Shape, padding: Shape,
         stride: Shape, out: Shape) -> Tensor:
    """Sum validated columns (N, C * kH * kW, L) back into (N, C, *output_size); ``out`` is the block grid."""
    s = _stack(x)
    h = _batch(s, x, unbatched)
    n, ck = h.shape[:2]
    K = _prod(kernel_size)
    c = ck // K
    full = tuple(S + 2 * p for S, p in zip(output_size, padding))
    buf = s.full((n, c) + full, 0, x._dtype)
    if not n * c:
        buf = keep_graph(s, buf, x)
    else:
        cols = s.reshape(h, (n, c, K) + out)
        for i, t in enumerate(itertools.product(*(range(k) for k in kernel_size))):
            key = _tap_key(t, dilation, stride, out)
            part = s.getitem(cols, (slice(None), slice(None), i))
            s.setitem(buf, key, s.binary("add", s.getitem(buf, key), part))
    if any(padding):
        buf = s.getitem(buf, (slice(None), slice(None)) + tuple(slice(p, p + S) for p, S in zip(padding,
                                                                                                  output_size)))
    if unbatched:
        buf = s.reshape(buf, (c,) + output_size)
    return _like(x, buf)


def pixel_shuffle(x: Tensor, r: int, inverse: bool) -> Tensor:
    """(*, C * r * r, H, W) -> (*, C, H * r, W * r); ``inverse`` (pixel_unshuffle) the other way."""
    s = _stack(x)
    *lead, c, H, W = x.shape
    b = _prod(lead)
    if inverse:
        h = s.permute(s.reshape(x._h, (b, c, H // r, r, W // r, r)), (0, 1, 3, 5, 2, 4))
        shape = tuple(lead) + (c * r * r, H // r, W // r)
    else:
        co = c // (r * r)
        h = s.permute(s.reshape(x._h, (b, co, r, r, H, W)), (0, 1, 4, 2, 5, 3))
        shape = tuple(lead) + (co, H * r, W * r)
    return _like(x, s.reshape(s.contiguous(h), shape))


# ------------------------------------------------------------------------------------------------------------
# normalisation
# ------------------------------------------------------------------------------------------------------------
def _affine(s: Any, h: Handle, weight: Tensor | None, bias: Tensor | None, view: Shape) -> Handle:
    if weight is not None:
        h = s.binary("mul", h, s.reshape(weight._h, view))
    if bias is not None:
        h = s.binary("add", h, s.reshape(bias._h, view))
    return h


def _normalized(s: Any, h: Handle, m: Handle, v: Handle, eps: float) -> Handle:
    return s.binary("mul", s.binary("sub", h, m), s.unary("rsqrt", s.binary("add", v, float(eps))))


def _update_running(s: Any, running: Tensor, stat: Handle, momentum: float) -> None:
    """running = (1 - momentum) * running + momentum * stat, in place and untracked (as torch, under no_grad)."""
    from ..autograd import no_grad

    with no_grad():  # running statistics are buffers: they must not join the gradient graph
        new = s.binary("add", s.binary("mul", running._h, 1.0 - momentum), s.binary("mul", stat, float(momentum)))
        s.assign(running._h, new)


def update_running_stats(running_mean: Tensor | None, running_var: Tensor | None, mean: Tensor, var: Tensor,
                         momentum: float, count: int) -> None:
    """Batch norm's running statistics from a batch's mean and biased variance over ``count`` values per channel
    (the variance stored unbiased, as PyTorch), in place and untracked."""
    s = _stack(mean)
    if running_mean is not None:
        _update_running(s, running_mean, mean._h, momentum)
    if running_var is not None:
        _update_running(s, running_var, s.binary("mul", var._h, count / (count - 1)), momentum)


def dropout_factors(like: Tensor, shape: Shape, p: float, d: DType) -> Tensor:
    """Dropout as factors of dtype ``d`` on ``like``'s device: ``1 / (1 - p)`` where a draw from the device's stream
    keeps the element (``rand < 1 - p``), 0 elsewhere -- the same draw :func:`dropout` and the attention
    composition make."""
    s = _stack(like)
    keep = s.binary("lt", s.rand(shape, d), 1.0 - p)
    return Tensor._make(s.binary("mul", s.cast(keep, d), 1.0 / (1.0 - p)), d, like._device)


def layer_norm(x: Tensor, normalized_shape: Shape, weight: Tensor | None, bias: Tensor | None, eps: float,
               mixed: bool) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the trailing normalized_shape dims, then weight and bias; ``mixed``
    (float16/bfloat16 x with float32 parameters) computes in float32. One op (and one backward op) where the
    backend has kernels for them (``train_kernels.layer_norm``)."""
    s = _stack(x)
    if x.numel() == 0:
        return _like(x, keep_graph(s, s.copy(x._h), weight, bias))
    if not mixed and x._dtype in _KERNEL_DTYPES:
        from . import train_kernels as _tk

        if _tk.has_kernel(_tk.layer_norm, x):
            return _tk.layer_norm(x, weight, bias, normalized_shape=tuple(normalized_shape), eps=float(eps))[0]
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    h = s.cast(x._h, dt.float32) if mixed else x._h
    m, v = _var(s, h, dims)
    r = _affine(s, _normalized(s, h, m, v, eps), weight, bias, normalized_shape)
    return _like(x, s.cast(r, x._dtype) if mixed else r)


def rms_norm(x: Tensor, normalized_shape: Shape, weight: Tensor | None, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the trailing normalized_shape dims, then weight."""
    s = _stack(x)
    if x.numel() == 0:
        return _like(x, keep_graph(s, s.copy(x._h), weight))
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    ms = _mean(s, s.binary("mul", x._h, x._h), dims, True)
    h = s.binary("mul", x._h, s.unary("rsqrt", s.binary("add", ms, float(eps))))
    return _like(x, _affine(s, h, weight, None, normalized_shape))


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
               bias: Tensor | None, training: bool, momentum: float, eps: float) -> Tensor:
    """Per-channel normalisation of (N, C, *) x; in training, batch statistics are used and the running ones
    updated in place (running_var with the unbiased variance, as torch)."""
    s = _stack(x)
    c = x.shape[1]
    view = (1, c) + (1,) * (x.ndim - 2)
    dims = (0,) + tuple(range(2, x.ndim))
    count = _prod([x.shape[d] for d in dims])
    if x.numel() == 0:  # PyTorch: an empty result still tied to weight and bias; running stats untouched
        return _like(x, keep_graph(s, s.copy(x._h), weight, bias))
    if training:
        m, v = _var(s, x._h, dims)
        if running_mean is not None:
            _update_running(s, running_mean, s.reshape(m, (c,)), momentum)
        if running_var is not None:
            unbiased = s.binary("mul", s.reshape(v, (c,)), count / (count - 1))
            _update_running(s, running_var, unbiased, momentum)
    else:
        assert running_mean is not None and running_var is not None  # nn.functional checked
        m = s.reshape(running_mean._h, view)
        v = s.reshape(running_var._h, view)
    return _like(x, _affine(s, _normalized(s, x._h, m, v, eps), weight, bias, view))


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """Normalise (N, C, *) x over groups of C // num_groups channels (and all spatial positions)."""
    s = _stack(x)
    if x.numel() == 0:
        return _like(x, keep_graph(s, s.copy(x._h), weight, bias))
    n, c = x.shape[:2]
    g = s.reshape(x._h, (n, num_groups, x.numel() // n // num_groups))
    m, v = _var(s, g, (2,))
    h = s.reshape(_normalized(s, g, m, v, eps), x.shape)
    return _like(x, _affine(s, h, weight, bias, (1, c) + (1,) * (x.ndim - 2)))


def instance_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                  bias: Tensor | None, use_input_stats: bool, momentum: float, eps: float) -> Tensor:
    """Normalise each (n, c) plane of (N, C, *) x over its spatial positions (input statistics, whose batch
    mean updates the running ones, or the running ones)."""
    s = _stack(x)
    n, c = x.shape[:2]
    view = (1, c) + (1,) * (x.ndim - 2)
    dims = tuple(range(2, x.ndim))
    count = _prod(x.shape[2:])
    if use_input_stats:
        m, v = _var(s, x._h, dims)
        if running_mean is not None:
            _update_running(s, running_mean, _mean(s, s.reshape(m, (n, c)), (0,), False), momentum)
        if running_var is not None:
            unbiased = s.binary("mul", s.reshape(v, (n, c)), count / (count - 1))
            _update_running(s, running_var, _mean(s, unbiased, (0,), False), momentum)
    else:
        assert running_mean is not None and running_var is not None  # nn.functional checked
        m = s.reshape(running_mean._h, view)
        v = s.reshape(running_var._h, view)
    return _like(x, _affine(s, _normalized(s, x._h, m, v, eps), weight, bias, view))


# ------------------------------------------------------------------------------------------------------------
# losses and distances
# ------------------------------------------------------------------------------------------------------------
def _weighted(s: Any, loss: Handle, weight: Tensor | None, d: DType, reduction: str, mean_by_weight: bool) -> Handle:
    """Apply an optional elementwise weight (the loss's shape, validated) and the reduction."""
    if weight is None:
        return _reduce_loss(s, loss, reduction)
    w = _cast(s, weight, d)
    loss = s.binary("mul", loss, w)
    if reduction == "mean" and mean_by_weight:
        dims = tuple(range(len(loss.shape)))
        if not dims:
            return s.binary("div", loss, w)
        return s.binary("div", s.reduce("sum", loss, dims, False), s.reduce("sum", w, dims, False))
    return _reduce_loss(s, loss, reduction)


def _smooth_l1(s: Any, a: Handle, b: Handle, beta: float) -> Handle:
    ad = s.unary("abs", s.binary("sub", a, b))
    if beta == 0:
        return ad
    quad = s.binary("div", s.binary("mul", s.binary("mul", ad, ad), 0.5), float(beta))
    return s.where(s.binary("lt", ad, float(beta)), quad, s.binary("sub", ad, 0.5 * beta))


def _huber(s: Any, a: Handle, b: Handle, delta: float) -> Handle:
    ad = s.unary("abs", s.binary("sub", a, b))
    quad = s.binary("mul", s.binary("mul", ad, ad), 0.5)
    lin = s.binary("mul", s.binary("sub", ad, 0.5 * delta), float(delta))
    return s.where(s.binary("lt", ad, float(delta)), quad, lin)


def _kl_div(s: Any, a: Handle, b: Handle, log_target: bool) -> Handle:
    if log_target:
        return s.binary("mul", s.unary("exp", b), s.binary("sub", b, a))
    # xlogy(t, t): 0 where t == 0, so zero targets contribute nothing (and NaN stays NaN)
    tlogt = s.where(s.binary("eq", b, 0.0), s.binary("mul", b, 0.0), s.binary("mul", b, s.unary("log", b)))
    return s.binary("sub", tlogt, s.binary("mul", b, a))


def _sq_diff(s: Any, a: Handle, b: Handle) -> Handle:
    diff = s.binary("sub", a, b)
    return s.binary("mul", diff, diff)


#: elementwise losses of (input, target): name -> (composition (stack, a, b, *params), weight 'mean' divides by
#: the summed weight)
_POINTWISE_LOSSES: dict[str, tuple[Callable[..., Handle], bool]] = {
    "mse_loss": (_sq_diff, True),
    "l1_loss": (lambda s, a, b: s.unary("abs", s.binary("sub", a, b)), True),
    "smooth_l1_loss": (_smooth_l1, True),
    "huber_loss": (_huber, False),
    "kl_div": (_kl_div, True),
}


def pointwise_loss(name: str, input: Tensor, target: Tensor, d: DType, shape: Shape, reduction: str,
                   weight: Tensor | None = None, *params: Any) -> Tensor:
    """The elementwise loss ``name`` (mse_loss, l1_loss, smooth_l1_loss: beta, huber_loss: delta, kl_div:
    log_target) of input and target promoted to d and broadcast to shape, weighted and reduced ('none', 'mean',
    'sum'; kl_div also 'batchmean': the sum divided by input.shape[0])."""
    s = _stack(input)
    a, b = _promote_pair(s, input, target, d, shape)
    fn, mean_by_weight = _POINTWISE_LOSSES[name]
    loss = fn(s, a, b, *params)
    if reduction == "batchmean":
        total = _reduce_loss(s, loss, "sum")
        if input.ndim > 0:
            total = s.binary("div", total, float(input.shape[0]))
        return Tensor._make(total, d, input._device)
    return Tensor._make(_weighted(s, loss, weight, d, reduction, mean_by_weight), d, input._device)


#: torch's binary_cross_entropy backward divides by max(x * (1 - x), _BCE_EPS): a prediction of exactly 0 or 1
#: gets the finite gradient (x - t) / _BCE_EPS (0 when it is right), not 0 / 0
_BCE_EPS = 1e-12


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str) -> Tensor:
    """-(t * log(x) + (1 - t) * log(1 - x)) with each log clamped to >= -100, as torch (x validated in [0, 1]).

    Values and gradients match torch's at x == 0 and x == 1 too: there the loss is the constant the clamped logs
    give (100 * t at 0, 100 * (1 - t) at 1) plus a term that is exactly 0 in value and whose derivative is
    torch's (x - t) / 1e-12, and the logs read 0.5 instead of x, so no 1 / 0 reaches their gradients (0 * inf
    would be NaN). Between, the logs' own gradient is torch's (x - t) / (x * (1 - x)). Two deliberate
    differences: for 0 < x < 1e-12, where torch clamps the denominator to 1e-12, ember gives the exact
    derivative (so through a sigmoid the logit's gradient is exactly sigmoid(z) - t); at an edge the target's
    gradient is the finite +-100 of the clamped logs where torch gives +-inf."""
    s = _stack(input)
    d = input._dtype
    x, t = input._h, target._h
    edge = s.binary("eq", s.binary("mul", x, s.binary("sub", 1.0, x)), 0.0)  # x == 0 or x == 1 (x is in [0, 1])
    safe = s.where(edge, 0.5, x)
    lx = s.binary("maximum", s.unary("log", safe), -100.0)
    l1x = s.binary("maximum", s.unary("log1p", s.unary("neg", safe)), -100.0)  # log1p as torch: exact near 0
    inner = s.unary("neg", s.binary("add", s.binary("mul", t, lx), s.binary("mul", s.binary("sub", 1.0, t), l1x)))
    # at an edge e (0 or 1): 100 * |t - e| written linearly in t (the clamped logs' value and target gradient),
    # plus (x - e) * ((x - e) / 2 + e - t) / eps: 0 at x == e, derivative (x - t) / eps. The eps term runs in
    # float32 for 16-bit floats, where 1e-12 rounds to 0 (torch's backward also divides in float32 there)
    w = d if d.itemsize >= 4 else dt.float32
    e = s.cast(s.binary("ge", x, 0.5), d)
    at_edge = s.binary("mul", s.binary("sub", s.binary("add", t, e), s.binary("mul", s.binary("mul", e, t), 2.0)),
                       100.0)
    ew = s.cast(e, w)
    xe = s.binary("sub", _cast(s, input, w), ew)
    slope = s.binary("mul", xe, s.binary("sub", s.binary("add", s.binary("mul", xe, 0.5), ew), _cast(s, target, w)))
    slope = s.binary("div", slope, _BCE_EPS)
    loss = s.where(edge, s.binary("add", at_edge, slope if w is d else s.cast(slope, d)), inner)
    if weight is not None:
        loss = s.binary("mul", loss, weight._h)
    return _like(input, _reduce_loss(s, loss, reduction))


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None, reduction: str,
                                     pos_weight: Tensor | None) -> Tensor:
    """Sigmoid + binary cross-entropy in one stable formula; pos_weight scales the positive term."""
    s = _stack(input)
    x, t = input._h, target._h
    # log1p(exp(-|x|)) + max(-x, 0) is -log(sigmoid(x)) without overflow
    sp = s.binary("add", s.unary("log1p", s.unary("exp", s.unary("neg", s.unary("abs", x)))),
                  s.binary("maximum", s.unary("neg", x), 0.0))
    if pos_weight is not None:
        lw = s.binary("add", s.binary("mul", s.binary("sub", pos_weight._h, 1.0), t), 1.0)
        sp = s.binary("mul", sp, lw)
    loss = s.binary("add", s.binary("mul", s.binary("sub", 1.0, t), x), sp)
    if weight is not None:
        loss = s.binary("mul", loss, weight._h)
    return _like(input, _reduce_loss(s, loss, reduction))


def _nll(s: Any, logp: Handle, target: Handle, weight: Tensor | None, ignore_index: int, reduction: str,
         d: DType) -> tuple[Handle, Handle]:
    """(reduced loss, per-element weights) for batched logp (N, C, *) and target (N, *)."""
    valid = s.binary("ne", target, int(ignore_index))
    safe = s.where(valid, target, 0)
    tshape = tuple(target.shape)
    w = s.cast(valid, d)
    if logp.shape[1] == 0:  # no classes: every target is ignore_index (checked), nothing to pick; 'mean' is 0/0
        zeros = s.full(tshape, 0.0, d)
        out = zeros if reduction == "none" else _reduce_loss(s, zeros, "sum") if reduction == "sum" \
            else s.full((), float("nan"), d)
        return keep_graph(s, out, logp), w
    idx = s.reshape(safe, (tshape[0], 1) + tshape[1:])
    picked = s.reshape(s.gather(logp, 1, idx), tshape)
    if weight is not None:
        wt = s.reshape(s.index_select(weight._h, 0, s.reshape(safe, (_prod(tshape),))), tshape)
        w = s.binary("mul", wt, w)
    # ignored targets give exactly 0, even where their row's log-probabilities are NaN (inf logits), as torch
    loss = s.where(valid, s.unary("neg", s.binary("mul", picked, w)), 0.0)
    if reduction == "none":
        return loss, w
    dims = tuple(range(len(tshape)))
    total = s.reduce("sum", loss, dims, False)
    if reduction == "sum":
        return total, w
    return s.binary("div", total, s.reduce("sum", w, dims, False)), w


def _batched(s: Any, input: Tensor, target: Tensor) -> tuple[Handle, Handle, bool]:
    if input.ndim == 1:
        return s.reshape(input._h, (1,) + input.shape), s.reshape(target._h, (1,)), True
    return input._h, target._h, False


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str) -> Tensor:
    """-input[n, target[n]] (weighted) for (N, C, *) or (C,) input and validated int64 class targets; 'mean'
    divides by the total weight of the non-ignored targets."""
    s = _stack(input)
    x, t, unb = _batched(s, input, target)
    loss, _ = _nll(s, x, t, weight, ignore_index, reduction, input._dtype)
    if unb and reduction == "none":
        loss = s.reshape(loss, ())
    return _like(input, loss)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                  label_smoothing: float) -> Tensor:
    """log_softmax over the class dim + nll_loss, for validated int64 class targets, with label smoothing."""
    s = _stack(input)
    c = input.shape[1] if input.ndim >= 2 else input.shape[0]
    x, t, unb = _batched(s, input, target)
    logp = s.softmax(x, 1, True) if c else x  # no classes: nothing to normalise (a backend may not reduce empty)
    loss, w = _nll(s, logp, t, weight, ignore_index, reduction, input._dtype)
    if label_smoothing > 0:
        lw = s.binary("mul", logp, s.reshape(weight._h, (1, c) + (1,) * (len(x.shape) - 2))) \
            if weight is not None else logp
        smooth = s.unary("neg", s.reduce("sum", lw, (1,), False))
        valid = s.binary("ne", t, int(ignore_index))
        smooth = s.where(valid, smooth, 0.0)
        if reduction != "none":
            dims = tuple(range(len(smooth.shape)))
            smooth = s.reduce("sum", smooth, dims, False)
            if reduction == "mean":
                # torch normalises by the summed weight of the non-ignored targets (their count without weight)
                smooth = s.binary("div", smooth, s.reduce("sum", w, dims, False))
        loss = s.binary("add", s.binary("mul", loss, 1.0 - label_smoothing),
                        s.binary("mul", smooth, label_smoothing / c if c else float("nan")))  # torch: 0 classes, NaN
    if unb and reduction == "none":
        loss = s.reshape(loss, ())
    return _like(input, loss)


def cross_entropy_probs(input: Tensor, target: Tensor, weight: Tensor | None, d: DType, reduction: str,
                        label_smoothing: float) -> Tensor:
    """Cross-entropy against class probabilities (target of the input's shape): log_softmax in the input's
    dtype, then the product with the target (and the weight) in their promoted dtype d, as torch."""
    s = _stack(input)
    cdim = 1 if input.ndim >= 2 else 0
    c = input.shape[cdim]
    if input.numel() == 0:
        if c == 0 and reduction == "mean":  # torch divides by numel / C: 0 / 0
            return Tensor._make(keep_graph(s, s.full((), float("nan"), d), input), d, input._device)
        return Tensor._make(_reduce_loss(s, s.reduce("sum", _cast(s, input, d), (cdim,), False), reduction), d,
                            input._device)
    t = _cast(s, target, d)
    if label_smoothing > 0:
        t = s.binary("add", s.binary("mul", t, 1.0 - label_smoothing), label_smoothing / c)
    logp = s.softmax(input._h, cdim, True)
    prodh = s.binary("mul", logp if input._dtype is d else s.cast(logp, d), t)
    if weight is not None:
        wview = (1, c) + (1,) * (input.ndim - 2) if input.ndim >= 2 else (c,)
        prodh = s.binary("mul", prodh, s.reshape(_cast(s, weight, d), wview))
    loss = s.unary("neg", s.reduce("sum", prodh, (cdim,), False))
    return Tensor._make(_reduce_loss(s, loss, reduction), d, input._device)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int, eps: float, d: DType, shape: Shape) -> Tensor:
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) along the normalised dim of the broadcast shape."""
    s = _stack(x1)
    a, b = _promote_pair(s, x1, x2, d, shape)
    # Backend.clamped_norm: a differentiable stack gives torch's gradient (the clamp is invisible to it)
    n1, n2 = s.clamped_norm(a, dim, float(eps)), s.clamped_norm(b, dim, float(eps))
    r = s.reduce("sum", s.binary("mul", s.binary("div", a, n1), s.binary("div", b, n2)), (dim,), False)
    return Tensor._make(r, d, x1._device)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float, eps: float, keepdim: bool, d: DType,
                      shape: Shape) -> Tensor:
    """||x1 - x2 + eps||_p over the last dim of the broadcast shape."""
    s = _stack(x1)
    a, b = _promote_pair(s, x1, x2, d, shape)
    diff = s.binary("add", s.binary("sub", a, b), float(eps))
    return Tensor._make(_vector_norm(s, diff, float(p), (len(shape) - 1,), bool(keepdim)), d, x1._device)
