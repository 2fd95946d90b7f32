"""numpy kernels for core's one-op GELU and layer norm (``ember.ops.train_kernels``: ``nn.gelu``,
``nn.gelu_backward``, ``nn.layer_norm``, ``nn.layer_norm_backward``).

Both are elementwise or row-wise chains that numpy would run as 5-20 full passes over memory (each with its own
temporary). Here every kernel walks its input in blocks of about :data:`BLOCK` elements and runs the whole chain on
a block while it is in cache, in a few block-sized scratch arrays; large inputs are cut into ranges of whole blocks
that run on flex's thread pool (:mod:`ember_flex.threads`, sized by ``ember.set_num_threads``). Every element (and
every row's statistics) is computed by the same ufuncs on the same block whatever the number of threads, and the
cross-row sums of the layer-norm backward are added block by block in a fixed order, so results do not depend on the
thread count.

GELU, exact (``approximate='none'``): numpy has no erf, and scipy's float32 ``erf`` is a scalar float64 loop (20x
PyTorch's GELU here). float32 writes erf(x / sqrt 2) as ``tanh(x h(x**2))``, h a degree-6 polynomial fitted to
atanh(erf(x / sqrt 2)) / x (``_TANH_ERF``): GELU = ``x (1 + t) / 2`` and its derivative ``(1 + t) / 2 + x phi(x)``
(phi's exp from the same x**2), the one approximation in both. Measured against float64 erf over a dense sweep of
|x| <= 12: GELU's absolute error <= 5.7e-7 (PyTorch's float32 GELU: 1.2e-6), the derivative's <= 2.3e-7, inside
PyTorch's float32 tolerances (rtol 1.3e-6, atol 1e-5); like PyTorch's ``x (1 + erf) / 2`` it is absolute, not
relative, in the far negative tail (``1 + t`` cancels there: GELU(-5.7) = -3.8e-8 comes out in steps of ~2e-7 x).
inf, -inf and NaN give the erf formula's inf, NaN, NaN (derivative: NaN) without a special path. float64 uses
scipy's ``erfc`` (``x * erfc(-x / sqrt 2) / 2``). tanh: ``0.5 * x * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 x**2)))``
and torch's ``gelu_backward`` formula.

Every numpy pass costs (0.11-0.15 ns an element in cache here for an in-place add or multiply, ~0.28 into another
array or for a reciprocal or maximum, 0.37 for tanh, 0.6 for exp), so the float32 chains are in-place passes over
one scratch block and the output block: 18 forward, 23 backward. The Abramowitz & Stegun erfc form they replace
(``max(x, 0) - |x| q``, ``erfc = P(1 / (1 + p z)) exp(-z**2)``) took 20 forward, with a reciprocal, an exp and a
maximum, and 23 backward with a reciprocal and a sign-bit select; single-threaded, the new chains take 0.62-0.73x
(forward) and 0.77-0.88x (backward) of its time from 1e4 to 2e6 elements, 0.84x and 0.93x at 1.26e7 (where
first-touch page faults of the output cost as much as the chain).

Layer norm: per block of whole rows, the row means, the centred rows (kept in scratch), the two-pass biased
variance, ``y = ((x - mean) * weight) * rstd + bias`` (the weight multiplied in scratch, the row scaling by einsum
into y, the bias added in place; weight and bias through a few rows' tile); the backward recomputes ``xhat`` per
block and builds ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` (g = dy * weight), with dweight and dbias
summed per block in the dtype and across blocks in float64. The backward runs in scratch and writes each dx block
once, by its last step (the row scaling by einsum, whose loop beats numpy's broadcast multiply into another array),
with dy * weight through a few rows' tile (one flat loop per tile, see :data:`TILE`). A gradient that is a broadcast
scalar (``f(x).sum().backward()``) is never copied out to full size. Rows far from zero (:data:`_FAR`) get the
corrected two-pass.

float32 and float64 compute in their own dtype; other floating dtypes in float32, cast back once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import threads
from .kernel_dtypes import cast_back as _cast
from .kernel_dtypes import work_arrays as _work

__all__ = ["gelu", "gelu_backward", "layer_norm", "layer_norm_backward", "register"]

#: elements per block (256 KiB of float32): a block and the chain's few scratch blocks stay in L2 while every step
#: of the chain runs on them; large enough that numpy's per-call cost (~1 us per ufunc) is small per element
BLOCK = 1 << 16

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715


def _ranges(n: int, unit: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of whole ``unit``-sized blocks covering range(n), ``size`` elements in all: one, or several
    for flex's pool when size is large."""
    parts = 0
    if threads.get_num_threads() > 1 and size >= threads.min_elems:
        parts = min(2 * threads.get_num_threads(), -(-n // unit))
    if parts < 2:
        return [(0, n)]
    blocks = -(-n // unit)
    return [(i * blocks // parts * unit, min(n, (i + 1) * blocks // parts * unit)) for i in range(parts)]


def _run(n: int, unit: int, size: int, body: Callable[[int, int], None]) -> None:
    """``body(lo, hi)`` over range(n) (``size`` elements) in ranges of whole blocks, on flex's pool where size is
    large."""
    ranges = _ranges(n, unit, size)
    if len(ranges) == 1:
        body(0, n)
    else:
        threads.run([(body, r) for r in ranges])


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1)


def _broadcast_scalar(a: np.ndarray) -> np.generic | None:
    """a's one value where a is a scalar broadcast to its shape (every stride 0: the gradient of ``f(x).sum()``),
    else None. The kernels then multiply by the value instead of copying the broadcast array out to full size and
    reading it back (4 MB each way for a 1M-element float32 input); per element the product is the same IEEE
    multiply, so the result is bit for bit the one of the materialised array."""
    if a.size > 1 and not any(a.strides):
        return a.reshape(-1)[0]
    return None


# -- GELU ----------------------------------------------------------------------------------------------------------
#: the float32 exact GELU's erf(x / sqrt 2) ~ tanh(x h(x**2)): h's coefficients, constant term first (see the module
#: docstring): a minimax fit of atanh(erf(x / sqrt 2)) / x over |x| <= 7.5, its error weighted by how much it moves
#: the GELU and its derivative (2 x^2 Phi (1 - Phi) and 2 |x| Phi (1 - Phi)): 1.0e-7 in both, with float32
#: coefficients. h > 0.79 everywhere and grows with x**2, so tanh saturates to +-1 beyond |x| ~ 5.5 and at +-inf.
_TANH_ERF = (7.97884453e-01, 3.63333573e-02, -3.24720557e-05, -5.54060522e-05, 3.98651877e-06, -1.34261295e-07,
             1.82211051e-09)
_TANH_ERF_F32 = tuple(np.float32(c) for c in _TANH_ERF)
#: log(1 / sqrt(2 pi)): the normal density's factor, added to its exponent (an add where a multiply would come
#: after). exp, not exp2 with log2(e) folded in (exp2 runs ~1.8x faster on normal results): below 2**-126, from
#: |x| > 13.2 on, numpy's exp2 takes a slow path (10-300x here) where exp's costs ~13x only for |x| in 13.2-14.4
_LOG_INV_SQRT_2PI = np.float32(-0.5 * math.log(2.0 * math.pi))


def _erf_tanh_f32(x: np.ndarray, s: np.ndarray, t: np.ndarray) -> None:
    """s = x**2 and t = tanh(x h(x**2)) ~ erf(x / sqrt 2) (float32; ``_TANH_ERF``): the one approximation of the
    forward and the backward. inf, -inf and NaN give t = 1, -1, NaN (h's leading coefficient is positive, so the
    polynomial stays +inf at x**2 = inf)."""
    k = _TANH_ERF_F32
    np.square(x, out=s)
    np.multiply(s, k[-1], out=t)
    for c in k[-2:0:-1]:  # Horner in place: in-place ufuncs run ~2x faster than into another array here
        t += c
        t *= s
    t += k[0]
    t *= x
    np.tanh(t, out=t)


def _gelu_f32(x: np.ndarray, out: np.ndarray, s: np.ndarray) -> None:
    """out = GELU(x) = x (1 + t) / 2 (t = ``_erf_tanh_f32``), float32, with ``out`` as the chain's scratch (in-place
    steps only). The halving comes before the multiply by x, so it cannot overflow; inf -> inf, -inf -> NaN,
    NaN -> NaN (the erf formula's results)."""
    _erf_tanh_f32(x, s, out)
    out += np.float32(1.0)
    out *= np.float32(0.5)
    out *= x


def _gelu_grad_f32(x: np.ndarray, g: np.ndarray | np.generic, out: np.ndarray, s: np.ndarray) -> None:
    """out = g * (Phi(x) + x phi(x)), float32: Phi = (1 + t) / 2 from ``_erf_tanh_f32`` and phi's exp from its x**2
    (``exp(log(1/sqrt(2 pi)) - x**2 / 2)``), ``out`` as scratch. inf, -inf and NaN give NaN (x phi(x)
    is inf * 0 there, as in the erf formula)."""
    f = np.float32
    _erf_tanh_f32(x, s, out)
    out *= f(0.5)
    out += f(0.5)  # Phi(x)
    s *= f(-0.5)
    s += _LOG_INV_SQRT_2PI
    np.exp(s, out=s)
    s *= x  # x phi(x)
    out += s
    out *= g


def _cdf_exact(x: np.ndarray, cdf: np.ndarray) -> None:
    """cdf = Phi(x) = erfc(-x / sqrt 2) / 2 with scipy's erfc (float64)."""
    import scipy.special as sp  # imported on first use: it costs ~100 ms

    np.multiply(x, -1.0 / math.sqrt(2.0), out=cdf)
    sp.erfc(cdf, out=cdf)
    cdf *= 0.5


def _tanh_inner(x: np.ndarray, t: np.ndarray) -> None:
    """t = tanh(sqrt(2/pi) * (x + 0.044715 x**3))."""
    f = x.dtype.type
    np.square(x, out=t)
    t *= f(_KAPPA * _SQRT_2_OVER_PI)
    t += f(_SQRT_2_OVER_PI)
    t *= x
    np.tanh(t, out=t)


def gelu(backend: Any, x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """GELU of x, blocked (see the module docstring)."""
    dt = x.dtype
    work, (x,) = _work(x)
    xf = _flat(x)
    out = np.empty(xf.shape, work)
    exact = approximate != "tanh"
    f32_exact = exact and work == np.float32

    def body(lo: int, hi: int) -> None:
        a = np.empty(min(BLOCK, hi - lo), work)
        for i in range(lo, hi, BLOCK):
            j = min(hi, i + BLOCK)
            xs, p = xf[i:j], a[:j - i]
            if f32_exact:
                _gelu_f32(xs, out[i:j], p)
                continue
            if exact:
                _cdf_exact(xs, p)
            else:
                _tanh_inner(xs, p)
                p += work.type(1.0)
                p *= work.type(0.5)
            np.multiply(xs, p, out=out[i:j])

    with np.errstate(all="ignore"):
        _run(xf.size, BLOCK, xf.size, body)
    return _cast(dt, (out.reshape(x.shape),))[0]


def gelu_backward(backend: Any, x: np.ndarray, grad: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """grad * GELU'(x), blocked: exact ``Phi(x) + x * phi(x)``; tanh torch's ``gelu_backward`` formula."""
    dt = x.dtype
    work, (x, grad) = _work(x, grad)
    xf = _flat(x)
    g0 = _broadcast_scalar(grad)
    gf = _flat(grad) if g0 is None else None
    out = np.empty(xf.shape, work)
    exact = approximate != "tanh"
    f32_exact = exact and work == np.float32
    f = work.type

    def body(lo: int, hi: int) -> None:
        n = min(BLOCK, hi - lo)
        a = np.empty(n, work)
        b, c = (np.empty(0 if f32_exact else n, work) for _ in range(2))  # the float32 exact chain needs one
        for i in range(lo, hi, BLOCK):
            j = min(hi, i + BLOCK)
            xs, p, s, r = xf[i:j], a[:j - i], b[:j - i], c[:j - i]
            gs = g0 if gf is None else gf[i:j]
            if f32_exact:
                _gelu_grad_f32(xs, gs, out[i:j], p)
                continue
            if exact:
                _cdf_exact(xs, p)
                np.square(xs, out=s)
                s *= f(-0.5)
                np.exp(s, out=s)
                s *= xs
                s *= f(_INV_SQRT_2PI)
                p += s  # Phi(x) + x * phi(x)
            else:
                _tanh_inner(xs, s)  # t
                np.square(xs, out=r)  # right derivative: 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 kappa x^2)
                r *= f(3.0 * _KAPPA)
                r += f(1.0)
                r *= f(_SQRT_2_OVER_PI)
                np.square(s, out=p)
                np.subtract(f(1.0), p, out=p)
                p *= r
                p *= xs
                p *= f(0.5)
                s += f(1.0)  # + left derivative 0.5 (1 + t)
                s *= f(0.5)
                p += s
            np.multiply(gs, p, out=out[i:j])

    with np.errstate(all="ignore"):
        _run(xf.size, BLOCK, xf.size, body)
    return _cast(dt, (out.reshape(x.shape),))[0]


# -- layer norm ----------------------------------------------------------------------------------------------------
def _rows(x: np.ndarray, k: int) -> np.ndarray:
    """(R, D) view (or contiguous copy) of x with its k trailing dims flattened into D."""
    d = 1
    for s in x.shape[x.ndim - k:]:
        d *= s
    return np.ascontiguousarray(x).reshape(-1, d)


#: at most this many rows per block: the backward's per-block column sums (dweight, dbias) run sequentially over a
#: block's rows in the dtype (then in float64 across blocks), so this bounds their rounding error
MAX_ROWS = 1 << 10


def _row_block(d: int) -> int:
    """Rows per block: about :data:`BLOCK` elements, at least one row and at most :data:`MAX_ROWS`."""
    return max(1, min(MAX_ROWS, BLOCK // max(d, 1)))


#: a weight or bias row is tiled this many elements deep: a same-shape multiply or add over a (k, rows, d) view of a
#: block runs numpy's loop over rows * d contiguous elements (~0.3 ns an element here) where a (d,) broadcast loops
#: per row (~0.45 for d = 512)
TILE = 1 << 13


def _tile_rows(d: int, rb: int) -> int:
    return max(1, min(rb, TILE // max(d, 1)))


def _rowwise(op: np.ufunc, a: np.ndarray, vec: np.ndarray, tile: np.ndarray | None, out: np.ndarray) -> None:
    """out = op(a, vec) for a (n, d) block and a (d,) row; through ``tile`` (its rows all ``vec``), t rows at a time,
    where given. Every element is the same one ufunc call on the same two values either way."""
    n, d = a.shape
    t = 0 if tile is None else tile.shape[0]
    k = n - n % t if t > 1 else 0
    if k:
        op(a[:k].reshape(k // t, t, d), tile, out=out[:k].reshape(k // t, t, d))
    if k < n:
        op(a[k:], vec, out=out[k:])


#: rows whose mean is more than this many standard deviations from zero get their centring corrected: the float32
#: row sum leaves the mean a few roundings of |mean| off (measured: 3-9 eps |mean|), which would show in y as
#: (few eps) * |mean| / std -- 1e-6 at 4, 1e-3 at 1e4 -- where torch's stays near eps
_FAR = 4.0


def _recentre(x2: np.ndarray, y: np.ndarray, mean: np.ndarray, rstd: np.ndarray, w: np.ndarray | None,
              b: np.ndarray | None, inv_d: Any, eps: Any) -> None:
    """Corrected two-pass (Chan, Golub & LeVeque) for the rows whose mean is more than :data:`_FAR` standard
    deviations from zero, in place, after the blocked pass: the centred rows' own mean (the first mean's rounding
    error) moves into the mean and out of the centred rows, the variance is taken again from them and y is
    rewritten. One check per call on the row statistics; row by row, so a row's result does not depend on the rows
    around it (nor on the blocks or threads)."""
    ratio = np.abs(mean)
    ratio *= rstd
    if not ratio.max(initial=0) > _FAR:  # NaN rows compare False
        return
    rows = np.flatnonzero(ratio > _FAR)
    xr = x2[rows] - mean[rows, None]
    c = np.einsum("rd->r", xr)
    c *= inv_d
    xr -= c[:, None]
    mean[rows] += c
    v = np.einsum("rd,rd->r", xr, xr)
    v *= inv_d
    v += eps
    np.sqrt(v, out=v)
    np.reciprocal(v, out=v)
    rstd[rows] = v
    if w is not None:  # the blocked pass's order: (xc * weight) * rstd + bias
        xr *= w
    xr *= v[:, None]
    if b is not None:
        xr += b
    y[rows] = xr


def layer_norm(backend: Any, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, *,
               normalized_shape: tuple[int, ...], eps: float = 1e-5) -> tuple[np.ndarray, ...]:
    """(y, mean, rstd) per block of rows: the means, the centred rows in scratch, their squares' means (two passes:
    no cancellation), then y = centred * rstd * weight + bias."""
    dt = x.dtype
    k = len(normalized_shape)
    work, (x, weight, bias) = _work(x, weight, bias)
    x2 = _rows(x, k)
    r, d = x2.shape
    w = None if weight is None else weight.reshape(d)
    b = None if bias is None else bias.reshape(d)
    y = np.empty((r, d), work)
    mean = np.empty(r, work)
    rstd = np.empty(r, work)
    rb = _row_block(d)
    inv_d, f_eps = work.type(1.0 / d), work.type(eps)
    tr = _tile_rows(d, rb)

    def body(lo: int, hi: int) -> None:
        scratch = np.empty((min(rb, hi - lo), d), work)
        # weight and bias a few rows deep (see TILE): their multiply and add run one flat loop per tile
        wt = None if w is None else np.empty((tr, d), work)
        bt = None if b is None else np.empty((tr, d), work)
        if wt is not None:
            np.copyto(wt, w)
        if bt is not None:
            np.copyto(bt, b)
        for i in range(lo, hi, rb):
            j = min(hi, i + rb)
            n = j - i
            xb, xc = x2[i:j], scratch[:n]
            # einsum's sums: 2-3x numpy's reduce over short rows. Not a GEMV with a ones vector (1.5x faster still):
            # BLAS's kernels sum a row in an order that depends on the rows around it, and a row's statistics here
            # are the same bits whatever block or call it comes in
            m = np.einsum("rd->r", xb, out=mean[i:j])
            m *= inv_d
            np.subtract(xb, m[:, None], out=xc)
            v = np.einsum("rd,rd->r", xc, xc, out=rstd[i:j])
            v *= inv_d
            v += f_eps
            np.sqrt(v, out=v)
            np.reciprocal(v, out=v)
            # y = (xc * weight) * rstd + bias: the weight in place in scratch (cache), through its tile; the row
            # scaling by einsum into y (its loop: ~1.5x numpy's broadcast multiply into another array); y's block
            # written once, the bias added in place
            if w is not None:
                _rowwise(np.multiply, xc, w, wt, xc)
            yb = np.einsum("rd,r->rd", xc, v, out=y[i:j])
            if b is not None:
                _rowwise(np.add, yb, b, bt, yb)

    with np.errstate(all="ignore"):
        _run(r, rb, r * d, body)
        _recentre(x2, y, mean, rstd, w, b, inv_d, f_eps)
    stat = x.shape[:x.ndim - k] + (1,) * k
    return _cast(dt, (y.reshape(x.shape), mean.reshape(stat), rstd.reshape(stat)))


def layer_norm_backward(backend: Any, x: np.ndarray, weight: np.ndarray | None, mean: np.ndarray,
                        rstd: np.ndarray, dy: np.ndarray, *,
                        normalized_shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """(dx, dweight, dbias) per block of rows (see the module docstring); each block's dweight/dbias partial sums
    land in their own row, added in block order in float64, so the result is the same on any number of threads."""
    dt = x.dtype
    k = len(normalized_shape)
    work, (x, weight, mean, rstd, dy) = _work(x, weight, mean, rstd, dy)
    x2 = _rows(x, k)
    # a broadcast dy (every stride 0: the gradient of ``layer_norm(x).sum()``) is not copied out to full size: each
    # block copies its rows into scratch instead (in cache), so every later step reads the same contiguous values
    dy2 = _rows(dy, k) if dy.size <= 1 or any(dy.strides) else np.broadcast_to(dy.reshape(-1)[:1], x2.shape)
    r, d = x2.shape
    w = None if weight is None else weight.reshape(d)
    m1, s1 = mean.reshape(r), rstd.reshape(r)
    dx = np.empty((r, d), work)
    rb = _row_block(d)
    nblocks = -(-r // rb)
    dw_parts = np.empty((nblocks, d), work)
    db_parts = np.empty((nblocks, d), work)
    inv_d = work.type(1.0 / d)
    tr = _tile_rows(d, rb)

    def body(lo: int, hi: int) -> None:
        n = min(rb, hi - lo)
        xh_s, g_s = np.empty((n, d), work), np.empty((n, d), work)
        dy_s = None if dy2.flags.c_contiguous else np.empty((n, d), work)
        wt = None if w is None else np.empty((tr, d), work)
        if w is not None:
            np.copyto(wt, w)
        for i in range(lo, hi, rb):
            j = min(hi, i + rb)
            blk, nb = i // rb, j - i
            xb, dyb, s = x2[i:j], dy2[i:j], s1[i:j, None]
            if dy_s is not None:
                dyb = dy_s[:nb]
                np.copyto(dyb, dy2[i:j])
            xhat = np.subtract(xb, m1[i:j, None], out=xh_s[:nb])
            xhat *= s  # in place: a broadcast multiply into another array costs about twice as much
            np.einsum("rd,rd->d", dyb, xhat, out=dw_parts[blk])
            np.einsum("rd->d", dyb, out=db_parts[blk])
            g = dyb
            if w is not None:
                g = g_s[:nb]
                _rowwise(np.multiply, dyb, w, wt, g)
            mg = np.einsum("rd->r", g)
            mg *= inv_d
            mgx = np.einsum("rd,rd->r", g, xhat)
            mgx *= inv_d
            # dx = rstd * (g - mean(g) - xhat * mean(g xhat)), in scratch; dx's block is written once, by the last
            # step (its first write costs the most), with einsum's row scaling
            xhat *= mgx[:, None]
            gc = np.subtract(g, mg[:, None], out=g_s[:nb])
            gc -= xhat
            np.einsum("rd,r->rd", gc, s1[i:j], out=dx[i:j])

    with np.errstate(all="ignore"):
        _run(r, rb, r * d, body)
    dweight = np.add.reduce(dw_parts, axis=0, dtype=np.float64).astype(work)
    dbias = np.add.reduce(db_parts, axis=0, dtype=np.float64).astype(work)
    shape = tuple(normalized_shape)
    return _cast(dt, (dx.reshape(x.shape), dweight.reshape(shape), dbias.reshape(shape)))


def register() -> None:
    """Register the kernels with core's GELU and layer-norm ops (called when the flex plugin is loaded)."""
    from ember.ops import train_kernels as T

    T.gelu.kernel("flex")(gelu)
    T.gelu_backward.kernel("flex")(gelu_backward)
    T.layer_norm.kernel("flex")(layer_norm)
    T.layer_norm_backward.kernel("flex")(layer_norm_backward)
