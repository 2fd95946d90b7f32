"""Default compositions of the larger ops, written only in terms of the backend contract's primitives.

Every function takes the backend instance ``be`` first and touches data only through ``be.<method>(...)``; the
host (numpy) is used solely for small index and weight tables that depend on shapes, never on tensor values,
which are then uploaded with ``be.from_numpy``. Semantics and layouts follow PyTorch.

Because a handle does not carry its ember dtype, tensors of "the same dtype as x" are made from x itself:
:func:`_filled` copies one element of a reference handle and overwrites it, and :func:`_to_like` rebuilds a
host float table exactly-as-rounded in the reference's dtype from a 0..255 digit table (no mixed-dtype
primitive call is ever issued). Functions that may need a dtype for empty inputs take an optional ``dtype``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import UnsupportedError
from .shapes import einsum_labels, pool_output_size

Handle = Any

_ALL = slice(None)


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------
def _prod(xs: Sequence[int]) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def _filled(be, ref: Handle, shape: Sequence[int], value: Any, dtype: dt.DType | None = None) -> Handle:
    """A new contiguous handle of ``shape`` filled with ``value`` in ref's dtype (or ``dtype`` when given)."""
    shape = tuple(int(s) for s in shape)
    if dtype is not None:
        return be.full(shape, value, dtype)
    if any(s == 0 for s in ref.shape):
        raise UnsupportedError("cannot derive a dtype from an empty tensor here; pass dtype")
    one = be.getitem(ref, (slice(0, 1),) * len(ref.shape))
    one = be.reshape(one, (1,) * len(shape))
    out = be.copy(be.expand(one, shape))
    be.setitem(out, (_ALL,) * len(shape), value)
    return out


def _to_like(be, ref: Handle, table: Any, dtype: dt.DType | None = None, _cache: dict | None = None) -> Handle:
    """Upload the host float table ``table`` as a handle of ref's (floating) dtype.

    With ``dtype`` known this is a plain upload. Otherwise the table's magnitudes are split into base-256
    digits which are gathered from a digit table built in ref's dtype (cumulative sum of ones, exact in every
    float dtype) and scaled by powers of two, so the result is the table rounded to ref's dtype within an ulp.
    """
    t = np.asarray(table, dtype=np.float64)
    if dtype is not None:
        return be.from_numpy(np.ascontiguousarray(t.astype(dtype.numpy)))
    a = np.abs(t)
    m = float(a.max()) if a.size else 0.0
    if m == 0.0:
        return _filled(be, ref, t.shape, 0)
    digits = None if _cache is None else _cache.get("digits")
    if digits is None:
        one = _filled(be, ref, (1,), 1)
        digits = be.binary("sub", be.cumulative("sum", be.expand(one, (256,)), 0), 1)
        if _cache is not None:
            _cache["digits"] = digits
    _, e = np.frexp(m)  # m < 2**e
    frac = a / (2.0 ** int(e))
    acc = None
    nz = a[a > 0]
    _, e_min = np.frexp(nz.min())
    # enough base-256 digits for float64's 53 bits of the smallest nonzero magnitude (capped: tinier parts of
    # a table are far below any float's resolution relative to its largest entry)
    ndig = min(-(-(int(e) - int(e_min) + 54) // 8), 24)
    for j in reversed(range(ndig)):
        c = np.floor(frac * (256.0 ** (j + 1))) % 256.0
        if not c.any():
            continue
        term = be.getitem(digits, (be.from_numpy(np.ascontiguousarray(c.astype(np.int64))),))
        term = be.binary("mul", term, 2.0 ** (int(e) - 8 * (j + 1)))
        acc = term if acc is None else be.binary("add", acc, term)
    neg = t < 0
    if neg.any():
        sign = be.where(be.from_numpy(np.ascontiguousarray(neg)), -1.0, _filled(be, ref, (1,) * t.ndim, 1))
        acc = be.binary("mul", acc, sign)
    return acc


def _i64(be, arr: Any) -> Handle:
    return be.from_numpy(np.ascontiguousarray(np.asarray(arr, dtype=np.int64)))


def _take(be, h: Handle, axis: int, idx: np.ndarray) -> Handle:
    """h indexed by the host int table idx along axis, with a full broadcast key (a fresh contiguous result)."""
    shape = tuple(h.shape)
    n = len(shape)
    key = []
    for d in range(n):
        view = [1] * n
        if d == axis:
            view[d] = len(idx)
            key.append(_i64(be, np.asarray(idx, dtype=np.int64).reshape(view)))
        else:
            view[d] = shape[d]
            key.append(be.reshape(be.arange(0, shape[d], 1, dt.int64), tuple(view)))
    return be.getitem(h, tuple(key))


def _flatten_batch(be, x: Handle, nd: int) -> tuple[Handle, tuple[int, ...]]:
    """Reshape x (..., *spatial) to (B, *spatial); returns the new handle and the leading shape."""
    lead = tuple(x.shape[: len(x.shape) - nd])
    return be.reshape(x, (_prod(lead),) + tuple(x.shape[len(x.shape) - nd:])), lead


def _tap_key(taps: Sequence[int], dil: Sequence[int], stride: Sequence[int], out: Sequence[int]) -> tuple:
    return (_ALL,) + tuple(
        slice(t * dd, t * dd + (o - 1) * s + 1, s) for t, dd, s, o in zip(taps, dil, stride, out)
    )


# ----------------------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------------------
def pad(be, h: Handle, pads: Sequence[tuple[int, int]], mode: str, value: Any = 0,
        dtype: dt.DType | None = None) -> Handle:
    """Pad every dim by (lo, hi) (pads for the trailing dims when fewer are given); negative pads crop."""
    shape = tuple(h.shape)
    n = len(shape)
    pads = [(0, 0)] * (n - len(pads)) + [(int(lo), int(hi)) for lo, hi in pads]
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return be.copy(h)
    if mode == "constant":
        src = h
        if any(lo < 0 or hi < 0 for lo, hi in pads):
            key = tuple(slice(max(-lo, 0), sz - max(-hi, 0)) for (lo, hi), sz in zip(pads, shape))
            src = be.getitem(h, key)
        cshape = tuple(src.shape)
        if all(lo <= 0 and hi <= 0 for lo, hi in pads):
            return be.copy(src)
        out_shape = tuple(c + max(lo, 0) + max(hi, 0) for c, (lo, hi) in zip(cshape, pads))
        out = _filled(be, h, out_shape, value, dtype) if _prod(shape) or dtype is not None else None
        if out is None:
            if _prod(out_shape) == 0:
                return be.reshape(be.copy(h), out_shape)
            raise UnsupportedError("constant pad of an empty tensor needs dtype")
        if _prod(cshape):
            be.setitem(out, tuple(slice(max(lo, 0), max(lo, 0) + c) for c, (lo, hi) in zip(cshape, pads)), src)
        return out
    if mode not in ("reflect", "replicate", "circular"):
        raise UnsupportedError(f"pad mode {mode!r}")
    # negative pads crop. As in PyTorch, circular wraps within the cropped extent, while reflect and replicate
    # index the whole input (the same as crop-first for replicate; different for reflect)
    out = h
    for d, ((lo, hi), sz) in enumerate(zip(pads, shape)):
        if lo == 0 and hi == 0:
            continue
        if mode == "circular":
            first = max(-lo, 0)
            sz = sz - first - max(-hi, 0)
            lo, hi = max(lo, 0), max(hi, 0)
        else:
            first = 0
        i = np.arange(sz + lo + hi, dtype=np.int64) - lo
        if mode == "replicate":
            i = np.clip(i, 0, sz - 1)
        elif mode == "circular":
            i = np.mod(i, sz)
        else:  # reflect (edge not repeated)
            m = sz - 1
            if m == 0:
                i = np.zeros_like(i)
            else:
                i = np.mod(np.abs(i), 2 * m)
                i = np.where(i > m, 2 * m - i, i)
        out = _take(be, out, d, i + first)
    return out


# ----------------------------------------------------------------------------------------------------------
# convolution
# ----------------------------------------------------------------------------------------------------------
def conv(be, x: Handle, w: Handle, b: Handle | None, stride: Sequence[int],
         padding: Sequence[tuple[int, int]], dilation: Sequence[int], groups: int) -> Handle:
    """N-d cross-correlation by im2col: x (N, C_in, *S), w (C_out, C_in/groups, *k), b (C_out,) or None."""
    nd = len(w.shape) - 2
    unbatched = len(x.shape) == nd + 1
    if unbatched:
        x = be.reshape(x, (1,) + tuple(x.shape))
    n, cin = x.shape[0], x.shape[1]
    cout, cin_g = w.shape[0], w.shape[1]
    ks = tuple(w.shape[2:])
    g = int(groups)
    pads = [(int(lo), int(hi)) for lo, hi in padding]
    if any(lo or hi for lo, hi in pads):
        x = be.pad(x, ((0, 0), (0, 0)) + tuple(pads), "constant", 0)
    sp = tuple(x.shape[2:])
    out = tuple((L - d * (k - 1) - 1) // s + 1 for L, k, s, d in zip(sp, ks, stride, dilation))
    P = _prod(out)
    K = _prod(ks)
    cols = []
    for taps in itertools.product(*(range(k) for k in ks)):
        sl = be.getitem(x, (_ALL,) + _tap_key(taps, dilation, stride, out))
        cols.append(be.reshape(sl, (n, cin, 1, P)))
    col = cols[0] if K == 1 else be.cat(cols, 2)
    col = be.reshape(col, (n, g, cin_g * K, P))
    wm = be.reshape(w, (g, cout // g, cin_g * K))
    y = be.matmul(wm, col)  # (N, g, cout_g, P)
    y = be.reshape(y, (n, cout) + out)
    if b is not None:
        y = be.binary("add", y, be.reshape(b, (1, cout) + (1,) * nd))
    if unbatched:
        y = be.reshape(y, (cout,) + out)
    return y


def conv_transpose(be, x: Handle, w: Handle, b: Handle | None, stride: Sequence[int], padding: Sequence[int],
                   output_padding: Sequence[int], dilation: Sequence[int], groups: int) -> Handle:
    """Transposed convolution: x (N, C_in, *S), w (C_in, C_out/groups, *k) as in PyTorch."""
    nd = len(w.shape) - 2
    unbatched = len(x.shape) == nd + 1
    if unbatched:
        x = be.reshape(x, (1,) + tuple(x.shape))
    n, cin = x.shape[0], x.shape[1]
    g = int(groups)
    cin_g, cout_g = cin // g, w.shape[1]
    cout = cout_g * g
    ks = tuple(w.shape[2:])
    S = tuple(x.shape[2:])
    P, K = _prod(S), _prod(ks)
    lout = tuple((L - 1) * s - 2 * p + d * (k - 1) + op + 1
                 for L, s, p, d, k, op in zip(S, stride, padding, dilation, ks, output_padding))
    lbuf = tuple(max((L - 1) * s + d * (k - 1) + 1, p + lo)
                 for L, s, d, k, p, lo in zip(S, stride, dilation, ks, padding, lout))
    xm = be.reshape(x, (n, g, cin_g, P))
    wm = be.reshape(w, (g, cin_g, cout_g, K))
    wm = be.reshape(be.permute(wm, (0, 3, 2, 1)), (g, K * cout_g, cin_g))
    cols = be.matmul(wm, xm)  # (N, g, K*cout_g, P)
    cols = be.reshape(cols, (n, g, K, cout_g) + S)
    buf = _filled(be, x, (n, cout) + lbuf, 0)
    for ti, taps in enumerate(itertools.product(*(range(k) for k in ks))):
        contrib = be.reshape(be.getitem(cols, (_ALL, _ALL, ti)), (n, cout) + S)
        key = (_ALL,) + _tap_key(taps, dilation, stride, S)
        be.setitem(buf, key, be.binary("add", be.getitem(buf, key), contrib))
    y = be.getitem(buf, (_ALL, _ALL) + tuple(slice(p, p + lo) for p, lo in zip(padding, lout)))
    if b is not None:
        y = be.binary("add", y, be.reshape(b, (1, cout) + (1,) * nd))
    else:
        y = be.copy(y)
    if unbatched:
        y = be.reshape(y, (cout,) + lout)
    return y


# ----------------------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------------------
def max_pool(be, x: Handle, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int], ceil_mode: bool, return_indices: bool):
    """Max pooling over the trailing len(kernel_size) dims; indices are flat per input plane (PyTorch)."""
    nd = len(kernel_size)
    ks, st, pd, dl = (tuple(int(v) for v in t) for t in (kernel_size, stride, padding, dilation))
    xb, lead = _flatten_batch(be, x, nd)
    S = tuple(xb.shape[1:])
    B = xb.shape[0]
    out = tuple(pool_output_size(L, k, s, p, d, ceil_mode) for L, k, s, p, d in zip(S, ks, st, pd, dl))
    need = tuple((o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, st, dl, ks))
    pads = ((0, 0),) + tuple((p, max(nn - L - p, 0)) for p, nn, L in zip(pd, need, S))
    xp = be.pad(xb, pads, "constant", float("-inf")) if any(lo or hi for lo, hi in pads) else xb
    taps_all = list(itertools.product(*(range(k) for k in ks)))
    if not return_indices:
        cur = None
        for taps in taps_all:
            v = be.getitem(xp, _tap_key(taps, dl, st, out))
            cur = v if cur is None else be.binary("maximum", cur, v)
        cur = be.copy(cur) if len(taps_all) == 1 else cur
        return be.reshape(cur, lead + out)
    # running (val > cur) | isnan(val) update exactly as PyTorch's kernels, tracking the flat input index
    strides_in = [_prod(S[d + 1:]) for d in range(nd)]
    grids = np.meshgrid(*[np.arange(o, dtype=np.int64) for o in out], indexing="ij")
    first = np.zeros(out, dtype=np.int64)
    for d in range(nd):
        c0 = grids[d] * st[d] - pd[d]
        c0 = np.where(c0 < 0, c0 + (-(c0) + dl[d] - 1) // dl[d] * dl[d], c0)
        first += c0 * strides_in[d]
    cur = _filled(be, xb, (B,) + out, float("-inf"))
    idx = be.expand(be.reshape(_i64(be, first), (1,) + out), (B,) + out)
    for taps in taps_all:
        v = be.getitem(xp, _tap_key(taps, dl, st, out))
        flat = np.zeros(out, dtype=np.int64)
        for d in range(nd):
            flat += (grids[d] * st[d] - pd[d] + taps[d] * dl[d]) * strides_in[d]
        upd = be.binary("logical_or", be.binary("gt", v, cur), be.unary("isnan", v))
        cur = be.where(upd, v, cur)
        idx = be.where(upd, be.reshape(_i64(be, flat), (1,) + out), idx)
    return be.reshape(cur, lead + out), be.reshape(idx, lead + out)


def avg_pool(be, x: Handle, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             ceil_mode: bool, count_include_pad: bool, divisor_override: int | None,
             dtype: dt.DType | None = None) -> Handle:
    nd = len(kernel_size)
    ks, st, pd = (tuple(int(v) for v in t) for t in (kernel_size, stride, padding))
    dl = (1,) * nd
    xb, lead = _flatten_batch(be, x, nd)
    S = tuple(xb.shape[1:])
    out = tuple(pool_output_size(L, k, s, p, 1, ceil_mode) for L, k, s, p in zip(S, ks, st, pd))
    need = tuple((o - 1) * s + k for o, s, k in zip(out, st, ks))
    pads = ((0, 0),) + tuple((p, max(nn - L - p, 0)) for p, nn, L in zip(pd, need, S))
    xp = be.pad(xb, pads, "constant", 0) if any(lo or hi for lo, hi in pads) else xb
    acc = None
    taps_all = list(itertools.product(*(range(k) for k in ks)))
    for taps in taps_all:
        v = be.getitem(xp, _tap_key(taps, dl, st, out))
        acc = v if acc is None else be.binary("add", acc, v)
    if divisor_override:
        return be.reshape(be.binary("div", acc, float(divisor_override)), lead + out)
    div = np.ones((), dtype=np.float64)
    for d in range(nd):
        start = np.arange(out[d], dtype=np.int64) * st[d] - pd[d]
        end = np.minimum(start + ks[d], S[d] + pd[d])
        if count_include_pad:
            cnt = end - start
        else:
            cnt = np.minimum(end, S[d]) - np.maximum(start, 0)
        div = np.multiply.outer(div, cnt.astype(np.float64))
    divh = _to_like(be, xb, div, dtype)
    return be.reshape(be.binary("div", acc, be.reshape(divh, (1,) + out)), lead + out)


def _adaptive_windows(n: int, o: int) -> tuple[np.ndarray, np.ndarray, int]:
    i = np.arange(o, dtype=np.int64)
    start = (i * n) // o
    end = -((-(i + 1) * n) // o)
    return start, end, int((end - start).max()) if o else 0


def _adaptive_stack(be, x: Handle, output_size: Sequence[int]):
    """(stacked (B, P, K), bool mask (P, K) host, flat input index (P, K) host, lead, out, S)."""
    nd = len(output_size)
    xb, lead = _flatten_batch(be, x, nd)
    S = tuple(xb.shape[1:])
    out = tuple(int(o) for o in output_size)
    B = xb.shape[0]
    masks, coords, kmaxes = [], [], []
    g = xb
    for d in range(nd):
        start, end, km = _adaptive_windows(S[d], out[d])
        j = np.arange(km, dtype=np.int64)
        raw = start[:, None] + j[None, :]
        valid = raw < end[:, None]
        idx = np.minimum(raw, end[:, None] - 1)
        masks.append(valid)
        coords.append(idx)
        kmaxes.append(km)
        if not (S[d] % out[d] == 0 and km == S[d] // out[d]):
            g = be.getitem(g, (_ALL,) * (d + 1) + (_i64(be, idx.reshape(-1)),))
    inter = []
    for d in range(nd):
        inter += [out[d], kmaxes[d]]
    g = be.reshape(g, (B,) + tuple(inter))
    perm = (0,) + tuple(1 + 2 * d for d in range(nd)) + tuple(2 + 2 * d for d in range(nd))
    P, K = _prod(out), _prod(kmaxes)
    g = be.reshape(be.permute(g, perm), (B, P, K))
    # host tables over (o_1..o_nd, k_1..k_nd)
    mask = np.ones((), dtype=bool)
    flat = np.zeros((), dtype=np.int64)
    strides_in = [_prod(S[d + 1:]) for d in range(nd)]
    for d in range(nd):
        shp = [1] * (2 * nd)
        shp[d], shp[nd + d] = out[d], kmaxes[d]
        mask = mask & masks[d].reshape(shp)
        flat = flat + coords[d].reshape(shp) * strides_in[d]
    return g, mask.reshape(P, K), flat.reshape(P, K), lead, out, xb


def adaptive_avg_pool(be, x: Handle, output_size: Sequence[int], dtype: dt.DType | None = None) -> Handle:
    g, mask, _, lead, out, xb = _adaptive_stack(be, x, output_size)
    if not mask.all():
        g = be.where(be.from_numpy(np.ascontiguousarray(mask)), g, 0)
    s = be.reduce("sum", g, (2,), False)
    cnt = _to_like(be, xb, mask.sum(axis=1).astype(np.float64), dtype)
    return be.reshape(be.binary("div", s, be.reshape(cnt, (1, mask.shape[0]))), lead + out)


def adaptive_max_pool(be, x: Handle, output_size: Sequence[int], return_indices: bool):
    g, mask, flat, lead, out, _ = _adaptive_stack(be, x, output_size)
    if not mask.all():
        g = be.where(be.from_numpy(np.ascontiguousarray(mask)), g, float("-inf"))
    v = be.reshape(be.reduce("max", g, (2,), False), lead + out)
    if not return_indices:
        return v
    a = be.argreduce("argmax", g, 2, False)  # (B, P)
    P = mask.shape[0]
    idx = be.getitem(_i64(be, flat), (be.arange(0, P, 1, dt.int64), a))
    return v, be.reshape(idx, lead + out)


# ----------------------------------------------------------------------------------------------------------
# interpolate
# ----------------------------------------------------------------------------------------------------------
def _scale_of(scales, d):
    if scales is None:
        return None
    s = scales[d]
    return float(s) if s is not None and s > 0 else None


def _nearest_index(n: int, o: int, scale: float | None, exact: bool) -> np.ndarray:
    dst = np.arange(o, dtype=np.int64)
    if not exact:
        if o == n:
            return dst
        if o == 2 * n:
            return dst >> 1
    s = np.float32(1.0 / scale) if scale is not None else np.float32(n) / np.float32(o)
    if exact:
        src = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32))
    else:
        src = np.floor(dst.astype(np.float32) * s)
    return np.minimum(src.astype(np.int64), n - 1)


def _area_scale(n: int, o: int, align_corners: bool, scale: float | None) -> float:
    if align_corners:
        return (n - 1) / (o - 1) if o > 1 else 0.0
    return 1.0 / scale if scale is not None else n / o


def _source_index(n: int, o: int, align_corners: bool, scale: float | None, cubic: bool):
    """Real source coordinates, then (i0 guarded, lambda) as PyTorch's guard_index_and_lambda."""
    sc = _area_scale(n, o, align_corners, scale)
    dst = np.arange(o, dtype=np.float64)
    if align_corners:
        src = sc * dst
    else:
        src = sc * (dst + 0.5) - 0.5
        if not cubic:
            src = np.maximum(src, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    lam = np.clip(src - i0, 0.0, 1.0)
    return i0, lam


def _cubic_coeffs(t: np.ndarray, A: float = -0.75) -> list[np.ndarray]:
    def c1(v):
        return ((A + 2) * v - (A + 3)) * v * v + 1

    def c2(v):
        return ((A * v - 5 * A) * v + 8 * A) * v - 4 * A

    return [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)]


def interpolate(be, x: Handle, size: Sequence[int], mode: str, align_corners: bool | None,
                scales: Sequence[float | None] | None, dtype: dt.DType | None = None) -> Handle:
    nd = len(size)
    size = tuple(int(s) for s in size)
    if mode == "area":
        return adaptive_avg_pool(be, x, size, dtype)
    xb, lead = _flatten_batch(be, x, nd)
    S = tuple(xb.shape[1:])
    ac = bool(align_corners)
    h = xb
    if mode in ("nearest", "nearest-exact"):
        # one gather with broadcast index tables (batch, then every spatial dim): a single contiguous pass
        B = xb.shape[0]
        key = [be.reshape(be.arange(0, B, 1, dt.int64), (B,) + (1,) * nd)]
        for d in range(nd):
            idx = _nearest_index(S[d], size[d], _scale_of(scales, d), mode == "nearest-exact")
            key.append(_i64(be, idx.reshape((1,) * (d + 1) + (size[d],) + (1,) * (nd - 1 - d))))
        return be.reshape(be.getitem(xb, tuple(key)), lead + size)
    if mode not in ("linear", "bilinear", "trilinear", "bicubic"):
        raise UnsupportedError(f"interpolate mode {mode!r}")
    cubic = mode == "bicubic"
    cache: dict = {}
    for d in reversed(range(nd)):  # innermost dim first, as PyTorch's nested loops
        n, o = S[d], size[d]
        i0, lam = _source_index(n, o, ac, _scale_of(scales, d), cubic)
        view = (1,) * (d + 1) + (o,) + (1,) * (nd - 1 - d)
        if cubic:
            idxs = [np.clip(i0 - 1 + j, 0, n - 1) for j in range(4)]
            ws = _cubic_coeffs(lam)
        else:
            idxs = [i0, i0 + (i0 < n - 1).astype(np.int64)]
            ws = None
        terms = None
        if cubic:
            for idx, wt in zip(idxs, ws):
                g = _take(be, h, d + 1, idx)
                t = be.binary("mul", g, be.reshape(_to_like(be, xb, wt, dtype, cache), view))
                terms = t if terms is None else be.binary("add", terms, t)
        else:
            lam_h = be.reshape(_to_like(be, xb, lam, dtype, cache), view)
            w0 = be.binary("sub", 1.0, lam_h)
            g0 = _take(be, h, d + 1, idxs[0])
            g1 = _take(be, h, d + 1, idxs[1])
            terms = be.binary("add", be.binary("mul", g0, w0), be.binary("mul", g1, lam_h))
        h = terms
    return be.reshape(h, lead + size)


# ----------------------------------------------------------------------------------------------------------
# scatter
# ----------------------------------------------------------------------------------------------------------
def scatter(be, h: Handle, dim: int, index: Handle, src: Handle | Any, reduce: str | None) -> Handle:
    """A copy of h with src scattered along dim at index (PyTorch's scatter / scatter_reduce semantics)."""
    shape = tuple(h.shape)
    I = tuple(index.shape)
    n = len(shape)
    out_empty = _prod(I) == 0
    if out_empty:
        return be.copy(h)
    head = tuple(slice(0, s) for s in I)
    if not hasattr(src, "shape"):
        if reduce is None:
            out = be.copy(h)
            be.setitem(out, be._index_grid(I, dim, index), src)
            return out
        src = be.expand(_filled(be, h, (1,) * n, src), I)
    elif tuple(src.shape) != I:
        src = be.getitem(src, head)
    if reduce is None:
        out = be.copy(h)
        be.setitem(out, be._index_grid(I, dim, index), src)
        return out
    if reduce in ("add", "sum"):
        op, neutral = "add", 0
    elif reduce in ("multiply", "prod"):
        op, neutral = "mul", 1
    else:
        raise UnsupportedError(f"scatter reduce {reduce!r}")
    # sort the index along dim, then a segmented (Hillis-Steele) scan sums runs of equal targets exactly
    L = I[dim]
    keys, perm = be.sort(index, dim, False, True)
    val = be.gather(src, dim, perm)

    def sl(a, lo, hi):
        return be.getitem(a, (_ALL,) * dim + (slice(lo, hi),))

    off = 1
    while off < L:
        same = be.binary("eq", sl(keys, off, L), sl(keys, 0, L - off))
        upd = be.binary(op, sl(val, off, L), be.where(same, sl(val, 0, L - off), neutral))
        val = be.cat([sl(val, 0, off), upd], dim)
        off *= 2
    last_shape = I[:dim] + (1,) + I[dim + 1:]
    if L > 1:
        end = be.cat([be.binary("ne", sl(keys, 0, L - 1), sl(keys, 1, L)),
                      be.full(last_shape, True, dt.bool_)], dim)
        M = shape[dim]
        dest = be.where(end, keys, M)
        ext = be.cat([h, _filled(be, h, shape[:dim] + (1,) + shape[dim + 1:], neutral)], dim)
    else:
        dest = keys
        ext = be.copy(h)
    key = be._index_grid(I, dim, dest)
    be.setitem(ext, key, be.binary(op, be.getitem(ext, key), val))
    if L > 1:
        ext = be.copy(be.getitem(ext, (_ALL,) * dim + (slice(0, shape[dim]),)))
    return ext


# ----------------------------------------------------------------------------------------------------------
# einsum
# ----------------------------------------------------------------------------------------------------------
def einsum(be, equation: str, *hs: Handle) -> Handle:
    labels, out = einsum_labels(equation, [tuple(h.shape) for h in hs])
    sizes: dict[str, int] = {}
    for h, lab in zip(hs, labels):
        for c, s in zip(lab, h.shape):
            if int(s) != 1 or c not in sizes:
                sizes[c] = int(s)
    ops = []
    for h, lab in zip(hs, labels):
        lab = list(lab)
        # diagonals of repeated labels
        while len(set(lab)) != len(lab):
            c = next(c for c in lab if lab.count(c) > 1)
            pos = [i for i, l in enumerate(lab) if l == c]
            rest = [i for i in range(len(lab)) if i not in pos]
            h = be.permute(h, tuple(pos + rest))
            ar = be.arange(0, h.shape[0], 1, dt.int64)
            h = be.getitem(h, (ar,) * len(pos))
            lab = [c] + [lab[i] for i in rest]
        ops.append([h, lab])
    fresh = False

    def needed_after(k: int) -> set:
        s = set(out)
        for _, lab in ops[k + 1:]:
            s.update(lab)
        return s

    def sum_unneeded(h, lab, keep):
        dims = tuple(i for i, c in enumerate(lab) if c not in keep)
        if not dims:
            return h, lab, False
        h = be.reduce("sum", h, dims, False)
        return h, [c for c in lab if c in keep], True

    # early reduction of labels private to one operand
    for k in range(len(ops)):
        others = set(out)
        for j, (_, lab) in enumerate(ops):
            if j != k:
                others.update(lab)
        ops[k][0], ops[k][1], f = sum_unneeded(ops[k][0], ops[k][1], others)
        fresh = f if k == 0 else fresh
    h, la = ops[0]
    for k in range(1, len(ops)):
        hb, lb = ops[k]
        keep = needed_after(k)
        h, la, _ = sum_unneeded(h, la, keep | set(lb))
        hb, lb, _ = sum_unneeded(hb, lb, keep | set(la))
        batch = [c for c in la if c in lb and c in keep]
        contr = [c for c in la if c in lb and c not in keep]
        a_only = [c for c in la if c not in lb]
        b_only = [c for c in lb if c not in la]
        ta = be.permute(h, tuple(la.index(c) for c in batch + a_only + contr))
        ta = be.expand(ta, tuple(sizes[c] if c in lb else h.shape[la.index(c)] for c in batch + a_only + contr))
        tb = be.permute(hb, tuple(lb.index(c) for c in batch + contr + b_only))
        tb = be.expand(tb, tuple(sizes[c] if c in la else hb.shape[lb.index(c)] for c in batch + contr + b_only))
        bs = [ta.shape[i] for i in range(len(batch))]
        as_ = [ta.shape[len(batch) + i] for i in range(len(a_only))]
        cs = [ta.shape[len(batch) + len(a_only) + i] for i in range(len(contr))]
        bo = [tb.shape[len(batch) + len(contr) + i] for i in range(len(b_only))]
        ta = be.reshape(ta, (_prod(bs), _prod(as_), _prod(cs)))
        tb = be.reshape(tb, (_prod(bs), _prod(cs), _prod(bo)))
        h = be.reshape(be.matmul(ta, tb), tuple(bs + as_ + bo))
        la = batch + a_only + b_only
        fresh = True
    h, la, f = sum_unneeded(h, la, set(out))
    fresh = fresh or f
    perm = tuple(la.index(c) for c in out)
    if perm != tuple(range(len(la))):
        h = be.permute(h, perm)
        fresh = False
    if not fresh:
        h = be.copy(h)
    return h
