"""Gradient rules of matmul, einsum, convolutions and pooling.

matmul, einsum, conv and conv_transpose are compute-bound: their outputs are kept (no ``recompute``) and their
vjps are built from the inner backend's own fast ops (matmul, einsum, conv, conv_transpose). A convolution's
input and weight gradients use the inner backend's optional ``conv_input_grad`` / ``conv_weight_grad`` kernels
when it has them (see docs/contract.md, "Optional backward kernels") and a composition of ``conv_transpose`` /
``conv`` otherwise. Pools are memory-bound (recomputed under balanced checkpointing); max pooling scatters the
gradient through the forward's indices (the backend's optional ``max_pool_backward`` kernel where it has one),
average pooling spreads it over the windows. adaptive_avg_pool and
interpolate keep the automatic rule (Backend's default composition, differentiated through its primitives).
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.shapes import einsum_labels

from .complex_grads import conjugated, is_complex
from .graph import ADArray
from .recorder import Recorder
from .rules_elementwise import unbroadcast

_ALL = slice(None)
Pads = Sequence[tuple[int, int]]


def _val(h: Any) -> Any:
    return h.value if type(h) is ADArray else h


def _swap_last(be: Any, h: Any) -> Any:
    n = len(h.shape)
    return be.permute(h, tuple(range(n - 2)) + (n - 1, n - 2))


# ----------------------------------------------------------------------------------------------------------
# matmul
# ----------------------------------------------------------------------------------------------------------
def matmul_vjp(be: Any, g: Any, sa: tuple[int, ...], sb: tuple[int, ...], a: Callable[[], Any] | None,
               b: Callable[[], Any] | None) -> tuple[Any, Any]:
    """Gradients of numpy's matmul (1-d operands promoted, batches broadcast); a/b are getters or None when that
    operand's gradient is not wanted (the getter of a is needed for b's gradient and vice versa)."""
    if len(sa) == 1 and len(sb) == 1:  # dot: g is 0-d
        return (None if b is None else be.binary("mul", g, b()),
                None if a is None else be.binary("mul", g, a()))
    sa2 = (1,) + sa if len(sa) == 1 else sa
    sb2 = sb + (1,) if len(sb) == 1 else sb
    nb = len(g.shape) - (len(sa) > 1) - (len(sb) > 1)
    batch = tuple(g.shape[:nb])
    g2 = be.reshape(g, batch + (sa2[-2], sb2[-1]))
    da = db = None
    if b is not None:  # grad of a = g @ b^T, summed over a's broadcast batch dims
        bv = be.reshape(b(), sb2)
        da = be.reshape(unbroadcast(be, be.matmul(g2, _swap_last(be, bv)), sa2), sa)
    if a is not None:  # grad of b = a^T @ g
        av = be.reshape(a(), sa2)
        if len(sb2) == 2 and len(sa2) > 2 and tuple(sa2[:-2]) == batch:
            # a batched activation times a matrix (the linear layer): one flat GEMM, no batched sum
            k = sa2[-1]
            af = be.reshape(av, (math.prod(sa2[:-1]), k))
            gf = be.reshape(g2, (math.prod(sa2[:-1]), sb2[-1]))
            db = be.reshape(be.matmul(_swap_last(be, af), gf), sb)
        else:
            db = be.reshape(unbroadcast(be, be.matmul(_swap_last(be, av), g2), sb2), sb)
    return da, db


# ----------------------------------------------------------------------------------------------------------
# einsum
# ----------------------------------------------------------------------------------------------------------
def einsum_plan(equation: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[str], str, dict[str, int]] | None:
    """Explicit single-letter subscripts per operand, the output's, and each label's (broadcast) size; ellipsis
    dims get unused letters. None when the equation cannot be rewritten so (too many labels)."""
    try:
        labels, out = einsum_labels(equation, shapes)
    except ValueError:
        return None
    used = {c for lab in labels for c in lab if not c.startswith(".")}
    free = [c for c in string.ascii_letters if c not in used]
    ell = sorted({c for lab in labels for c in lab if c.startswith(".")} | {c for c in out if c.startswith(".")})
    if len(ell) > len(free):
        return None
    rename = dict(zip(ell, free))
    terms = ["".join(rename.get(c, c) for c in lab) for lab in labels]
    out_s = "".join(rename.get(c, c) for c in out)
    sizes: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        for c, n in zip(t, s):
            if n != 1 or c not in sizes:
                sizes[c] = int(n)
    return terms, out_s, sizes


def einsum_operand_grad(be: Any, g: Any, i: int, terms: list[str], out: str, sizes: dict[str, int],
                        shape: tuple[int, ...], others: list[Any]) -> Any:
    """Gradient of operand i: g contracted with the other operands onto operand i's subscripts.

    Labels operand i holds alone are constant along the gradient (expanded); labels it broadcasts (size 1 where
    the others have more) are summed; repeated labels (diagonals) are scattered back onto the diagonal."""
    lab = terms[i]
    uniq = list(dict.fromkeys(lab))
    dim = {c: int(n) for c, n in zip(lab, shape)}
    avail = set(out).union(*(terms[j] for j in range(len(terms)) if j != i))
    keep = [c for c in uniq if c in avail and not (dim[c] == 1 and sizes[c] != 1)]
    eq = ",".join([out] + [terms[j] for j in range(len(terms)) if j != i]) + "->" + "".join(keep)
    r = be.einsum(eq, g, *others)
    full = tuple(dim[c] for c in uniq)
    if len(keep) != len(uniq):
        r = be.reshape(r, tuple(dim[c] if c in keep else 1 for c in uniq))
        if tuple(r.shape) != full:
            r = be.contiguous(be.expand(r, full))
    if len(uniq) == len(lab):
        return r
    # a repeated label: write the gradient on the diagonal of a zero tensor
    z = be.full(tuple(shape), 0, be.dtype_of(g))
    key = []
    for c in lab:
        j = uniq.index(c)
        view = [1] * len(uniq)
        view[j] = dim[c]
        key.append(be.reshape(be.arange(0, dim[c], 1, dt.int64), tuple(view)))
    be.setitem(z, tuple(key), r)
    return z


# ----------------------------------------------------------------------------------------------------------
# convolution gradients (optional backend kernels, else compositions of conv / conv_transpose)
# ----------------------------------------------------------------------------------------------------------
def conv_input_grad(be: Any, gy: Any, w: Any, x_shape: tuple[int, ...], stride: tuple[int, ...],
                    padding: Pads, dilation: tuple[int, ...], groups: int) -> Any:
    """d conv / d x for batched x; the backend's ``conv_input_grad`` kernel or a transposed convolution."""
    kernel = getattr(be, "conv_input_grad", None)
    if kernel is not None:
        return kernel(gy, w, x_shape, stride, padding, dilation, groups)
    S, osz, K = x_shape[2:], tuple(gy.shape[2:]), tuple(w.shape[2:])
    lows, opads, crop = [], [], False
    for L, o, k, s, d, (lo, _hi) in zip(S, osz, K, stride, dilation, padding):
        span = (o - 1) * s + d * (k - 1) + 1  # padded positions the windows cover
        op = L + 2 * lo - span  # output_padding that makes the transposed output exactly L long
        if op < 0:  # asymmetric padding (more at the end): compute longer, crop below
            op, crop = 0, True
        lows.append(lo)
        opads.append(op)
    r = be.conv_transpose(gy, w, None, stride, tuple(lows), tuple(opads), dilation, groups)
    if crop:
        r = be.copy(be.getitem(r, (_ALL, _ALL) + tuple(slice(0, L) for L in S)))
    return r


def conv_weight_grad(be: Any, x: Any, gy: Any, w_shape: tuple[int, ...], stride: tuple[int, ...],
                     padding: Pads, dilation: tuple[int, ...], groups: int) -> Any:
    """d conv / d w for batched x; the backend's ``conv_weight_grad`` kernel, or a convolution of x (batch and
    channels swapped) with gy as the weight: stride and dilation trade places, groups stay groups."""
    kernel = getattr(be, "conv_weight_grad", None)
    if kernel is not None:
        return kernel(x, gy, w_shape, stride, padding, dilation, groups)
    nd = len(w_shape) - 2
    n, c = x.shape[0], x.shape[1]
    cg = c // groups
    sp = tuple(range(3, 3 + nd))
    xt = be.reshape(x, (n, groups, cg) + tuple(x.shape[2:]))
    xt = be.reshape(be.permute(xt, (2, 1, 0) + sp), (cg, groups * n) + tuple(x.shape[2:]))
    gt = be.permute(gy, (1, 0) + tuple(range(2, 2 + nd)))  # (C_out, N, *out): one N-channel group per conv group
    r = be.conv(xt, gt, None, tuple(dilation), tuple(padding), tuple(stride), groups)  # (C_in/g, C_out, *K')
    r = be.getitem(r, (_ALL, _ALL) + tuple(slice(0, k) for k in w_shape[2:]))
    return be.copy(be.permute(r, (1, 0) + tuple(range(2, 2 + nd))))


def _bias_grad(be: Any, g: Any) -> Any:
    return be.reduce("sum", g, (0,) + tuple(range(2, len(g.shape))), False)


# ----------------------------------------------------------------------------------------------------------
# pooling gradients
# ----------------------------------------------------------------------------------------------------------
def unpool(be: Any, g: Any, idx: Any, x_shape: tuple[int, ...], nd: int, overlap: bool) -> Any:
    """Scatter g back to the input through flat per-plane indices; overlapping windows accumulate. The backend's
    ``max_pool_backward`` kernel where it has one (the contract's optional backward kernels), with the same values."""
    kernel = getattr(be, "max_pool_backward", None)
    if kernel is not None:
        return kernel(g, idx, tuple(x_shape), nd, overlap)
    lead = x_shape[: len(x_shape) - nd]
    B = math.prod(lead)
    P = math.prod(g.shape[len(lead):])
    g2 = be.reshape(g, (B, P))
    i2 = be.reshape(idx, (B, P))
    z = be.full((B, math.prod(x_shape[len(lead):])), 0, be.dtype_of(g))
    return be.reshape(be.scatter(z, 1, i2, g2, "add" if overlap else None), x_shape)


def avg_pool_grad(be: Any, g: Any, x_shape: tuple[int, ...], ks: tuple[int, ...], st: tuple[int, ...],
                  pd: tuple[int, ...], count_include_pad: bool, divisor_override: int | None) -> Any:
    """Each output's gradient divided by its window's divisor and added over the window (linear: exact)."""
    nd = len(ks)
    lead = x_shape[: len(x_shape) - nd]
    S = x_shape[len(lead):]
    osz = tuple(g.shape[len(lead):])
    B = math.prod(lead)
    dtype = be.dtype_of(g)
    if divisor_override:
        gs = be.binary("div", g, float(divisor_override))
    else:  # the divisor table depends on shapes only (as the forward's): built on the host
        div = np.ones((), dtype=np.float64)
        for d in range(nd):
            start = np.arange(osz[d], dtype=np.int64) * st[d] - pd[d]
            end = np.minimum(start + ks[d], S[d] + pd[d])
            cnt = end - start if count_include_pad else np.minimum(end, S[d]) - np.maximum(start, 0)
            div = np.multiply.outer(div, cnt.astype(np.float64))
        divh = be.from_numpy(np.ascontiguousarray(div.astype(dtype.numpy)))
        gs = be.binary("div", g, be.reshape(divh, (1,) * len(lead) + osz))
    gs = be.reshape(gs, (B,) + osz)
    span = tuple(max((o - 1) * s + k, p + L) for o, s, k, p, L in zip(osz, st, ks, pd, S))
    buf = be.full((B,) + span, 0, dtype)
    for taps in itertools.product(*(range(k) for k in ks)):
        key = (_ALL,) + tuple(slice(t, t + (o - 1) * s + 1, s) for t, o, s in zip(taps, osz, st))
        be.setitem(buf, key, be.binary("add", be.getitem(buf, key), gs))
    r = be.getitem(buf, (_ALL,) + tuple(slice(p, p + L) for p, L in zip(pd, S)))
    return be.reshape(be.copy(r), x_shape)


class NNRules(Recorder):
    """Mixin of AutodiffBackend: matmul, einsum, conv, conv_transpose, max/avg/adaptive-max pooling."""

    def embedding(self, weight: ADArray, index: ADArray, padding_idx: int | None) -> ADArray:
        """Rows of weight at index; the padding row receives no gradient (PyTorch): its rows are selected
        from an untracked alias of weight."""
        rows = self.index_select(weight, 0, index)
        if padding_idx is None or not self.tracking(weight):
            return rows
        pad = self.reshape(self.binary("eq", index, padding_idx), (index.shape[0], 1))
        return self.where(pad, self.index_select(self.wrap(weight.value), 0, index), rows)

    def relu(self, h: ADArray) -> ADArray:
        """PyTorch's relu gradient: zero where x <= 0 (at 0 too; maximum's rule would split the tie), g where
        x > 0 or x is NaN."""
        inner = self.inner
        value = inner.relu(h.value)
        if not self.tracking(h):
            return self.wrap(value)
        x = self.save(h)
        return self.record("relu", value, (h,), lambda g: (inner.where(inner.binary("le", x(), 0.0), 0.0, g),),
                           recompute=lambda: inner.relu(x()))

    def hardtanh(self, h: ADArray, lo: Any, hi: Any) -> ADArray:
        """PyTorch's hardtanh gradient: zero where x <= lo or x >= hi (the bounds included), g inside and at a
        NaN."""
        inner = self.inner
        value = inner.hardtanh(h.value, lo, hi)
        if not self.tracking(h):
            return self.wrap(value)
        x = self.save(h)

        def vjp(g: Any) -> tuple[Any]:
            xv = x()
            outside = inner.binary("logical_or", inner.binary("le", xv, lo), inner.binary("ge", xv, hi))
            return (inner.where(outside, 0.0, g),)

        return self.record("hardtanh", value, (h,), vjp, recompute=lambda: inner.hardtanh(x(), lo, hi))

    def matmul(self, a: ADArray, b: ADArray) -> ADArray:
        inner = self.inner
        value = inner.matmul(a.value, b.value)
        if not self.tracking(a, b):
            return self.wrap(value)
        sa, sb = tuple(a.shape), tuple(b.shape)
        # each operand is saved only when the other one needs a gradient (compute-bound: no recompute)
        get_b = self.save(b) if a.meta is not None else None
        get_a = self.save(a) if b.meta is not None else None
        def vjp(g: Any) -> tuple[Any, Any]:
            return matmul_vjp(inner, g, sa, sb, get_a, get_b)

        return self.record("matmul", value, (a, b), conjugated(inner, vjp) if is_complex(inner, value) else vjp)

    def einsum(self, equation: str, *hs: ADArray) -> ADArray:
        inner = self.inner
        if not self.tracking(*hs):
            return self.wrap(inner.einsum(equation, *(_val(h) for h in hs)))
        shapes = [tuple(h.shape) for h in hs]
        plan = einsum_plan(equation, shapes)
        if plan is None:
            return Backend.einsum(self, equation, *hs)  # type: ignore[arg-type]
        terms, out, sizes = plan
        value = inner.einsum(equation, *(_val(h) for h in hs))
        wanted = [type(h) is ADArray and h.meta is not None for h in hs]
        getters = [self.save(h) if any(wanted[:j] + wanted[j + 1:]) else None
                   for j, h in enumerate(hs)]

        def vjp(g: Any) -> list[Any]:
            grads = []
            for i, want in enumerate(wanted):
                if not want:
                    grads.append(None)
                    continue
                others = [getters[j]() for j in range(len(hs)) if j != i]  # type: ignore[misc]
                grads.append(einsum_operand_grad(inner, g, i, terms, out, sizes, shapes[i], others))
            return grads

        return self.record("einsum", value, hs, vjp)

    def conv(self, x: ADArray, w: ADArray, b: ADArray | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> ADArray:
        inner = self.inner
        if not self.tracking(x, w, b):
            return self.wrap(inner.conv(x.value, w.value, _val(b), stride, padding, dilation, groups))
        if any(lo < 0 or hi < 0 for lo, hi in padding) and not hasattr(inner, "conv_input_grad"):
            # cropping pads: the differentiated default composition handles them
            return Backend.conv(self, x, w, b, stride, padding, dilation, groups)  # type: ignore[arg-type]
        value = inner.conv(x.value, w.value, _val(b), stride, padding, dilation, groups)
        nd = len(w.shape) - 2
        unbatched = len(x.shape) == nd + 1
        xs = (1,) + tuple(x.shape) if unbatched else tuple(x.shape)
        ws = tuple(w.shape)
        need_x, need_w = x.meta is not None, w.meta is not None
        need_b = type(b) is ADArray and b.meta is not None
        get_w = self.save(w) if need_x else None
        get_x = self.save(x) if need_w else None

        def vjp(g: Any) -> tuple[Any, Any, Any]:
            if unbatched:
                g = inner.reshape(g, (1,) + tuple(g.shape))
            dx = dw = db = None
            if need_x:
                dx = conv_input_grad(inner, g, get_w(), xs, stride, padding, dilation, groups)  # type: ignore[misc]
                if unbatched:
                    dx = inner.reshape(dx, xs[1:])
            if need_w:
                xv = get_x()  # type: ignore[misc]
                xv = inner.reshape(xv, xs) if unbatched else xv
                dw = conv_weight_grad(inner, xv, g, ws, stride, padding, dilation, groups)
            if need_b:
                db = _bias_grad(inner, g)
            return dx, dw, db

        return self.record("convolution", value, (x, w, b), vjp)

    def conv_transpose(self, x: ADArray, w: ADArray, b: ADArray | None, stride: tuple[int, ...],
                       padding: tuple[int, ...], output_padding: tuple[int, ...], dilation: tuple[int, ...],
                       groups: int) -> ADArray:
        inner = self.inner
        value = inner.conv_transpose(x.value, w.value, _val(b), stride, padding, output_padding, dilation, groups)
        if not self.tracking(x, w, b):
            return self.wrap(value)
        nd = len(w.shape) - 2
        unbatched = len(x.shape) == nd + 1
        xs = (1,) + tuple(x.shape) if unbatched else tuple(x.shape)
        ws = tuple(w.shape)
        # the transposed conv is conv's input gradient: y plays conv's input (padded (p, p - output_padding))
        pads = tuple((p, p - op) for p, op in zip(padding, output_padding))
        need_x, need_w = x.meta is not None, w.meta is not None
        need_b = type(b) is ADArray and b.meta is not None
        get_w = self.save(w) if need_x else None
        get_x = self.save(x) if need_w else None

        def vjp(g: Any) -> tuple[Any, Any, Any]:
            if unbatched:
                g = inner.reshape(g, (1,) + tuple(g.shape))
            gb = g
            osz = tuple(g.shape[2:])
            if any(hi < 0 for _, hi in pads):  # output_padding beyond padding: those outputs see no input
                g = inner.copy(inner.getitem(g, (_ALL, _ALL) + tuple(
                    slice(0, o + min(hi, 0)) for o, (_, hi) in zip(osz, pads))))
            cp = tuple((lo, max(hi, 0)) for lo, hi in pads)
            dx = dw = db = None
            if need_x:
                dx = inner.conv(g, get_w(), None, stride, cp, dilation, groups)  # type: ignore[misc]
                if unbatched:
                    dx = inner.reshape(dx, xs[1:])
            if need_w:
                xv = get_x()  # type: ignore[misc]
                xv = inner.reshape(xv, xs) if unbatched else xv
                dw = conv_weight_grad(inner, g, xv, ws, stride, cp, dilation, groups)
            if need_b:
                db = _bias_grad(inner, gb)
            return dx, dw, db

        return self.record("convolution_transpose", value, (x, w, b), vjp)

    def max_pool(self, x: ADArray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], ceil_mode: bool,
                 return_indices: bool) -> Any:
        inner = self.inner
        if not self.tracking(x):
            r = inner.max_pool(x.value, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
            return self.wrap_many(r) if return_indices else self.wrap(r)
        v, idx = inner.max_pool(x.value, kernel_size, stride, padding, dilation, ceil_mode, True)
        xs, nd = tuple(x.shape), len(kernel_size)
        # windows overlap when the stride is shorter than the dilated kernel: their gradients must add up
        overlap = any(s < d * (k - 1) + 1 for s, d, k in zip(stride, dilation, kernel_size))
        recompute = None
        if self.balanced:
            get_x = self.save(x)

            def recompute() -> Any:
                return inner.max_pool(get_x(), kernel_size, stride, padding, dilation, ceil_mode, False)

        out = self.record("max_pool", v, (x,),
                          lambda g: (unpool(inner, g, idx, xs, nd, overlap),), recompute=recompute)
        return (out, self.wrap(idx)) if return_indices else out

    def adaptive_max_pool(self, x: ADArray, output_size: tuple[int, ...], return_indices: bool) -> Any:
        inner = self.inner
        if not self.tracking(x):
            r = inner.adaptive_max_pool(x.value, output_size, return_indices)
            return self.wrap_many(r) if return_indices else self.wrap(r)
        v, idx = inner.adaptive_max_pool(x.value, output_size, True)
        xs, nd = tuple(x.shape), len(output_size)
        overlap = any(n % o for n, o in zip(xs[len(xs) - nd:], output_size))
        recompute = None
        if self.balanced:
            get_x = self.save(x)

            def recompute() -> Any:
                return inner.adaptive_max_pool(get_x(), output_size, False)

        out = self.record("adaptive_max_pool", v, (x,),
                          lambda g: (unpool(inner, g, idx, xs, nd, overlap),), recompute=recompute)
        return (out, self.wrap(idx)) if return_indices else out

    def avg_pool(self, x: ADArray, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], ceil_mode: bool, count_include_pad: bool,
                 divisor_override: int | None) -> ADArray:
        inner = self.inner
        value = inner.avg_pool(x.value, kernel_size, stride, padding, ceil_mode, count_include_pad,
                               divisor_override)
        if not self.tracking(x):
            return self.wrap(value)
        xs = tuple(x.shape)
        recompute = None
        if self.balanced:
            get_x = self.save(x)

            def recompute() -> Any:
                return inner.avg_pool(get_x(), kernel_size, stride, padding, ceil_mode, count_include_pad,
                                      divisor_override)

        return self.record("avg_pool", value, (x,),
                           lambda g: (avg_pool_grad(inner, g, xs, kernel_size, stride, padding, count_include_pad,
                                                    divisor_override),),
                           recompute=recompute)
