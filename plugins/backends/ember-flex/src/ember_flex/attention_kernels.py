"""numpy kernels for core's attention ops (``nn.scaled_dot_product_attention``, its output-only form and its
backward).

Forward, in blocks of a few heads or of one head's rows (about :data:`BLOCK` scores each, so a block stays in a
core's L2 cache): the scale folded into the block's rows of q (L*E multiplies instead of L*S), one GEMM for the
block's scores written into its slice of the probabilities' buffer, the mask or causal triangle applied in place
(causal row blocks compute only the keys up to their last row), exp in place (without a mask: exp2 of scores that
came out in base 2, log2(e) folded into q's scale; rows that are entirely masked give zeros, torch's "safe"
softmax), the row sums, and one GEMM with v (of the exponentials times the dropout factors, when dropout is on)
whose (L, E) result is multiplied by each row's reciprocal sum: the normalisation costs L*E multiplies instead of
L*S, and the (L, S) block is walked by exp and the sums only. The softmax skips subtracting each row's max where
``|q_i| |k_j|`` bounds the block's scores well inside exp's range (the max and the subtraction are two more passes),
and takes the stable form elsewhere; the kept probabilities (:func:`sdpa`) are each row times its reciprocal sum, as
torch's CPU softmax, normalised after the GEMM. Large attentions run their blocks on flex's thread pool, with
numpy's BLAS on one thread meanwhile. The blocks depend on the shapes only, so results do not depend on the thread
count. The probabilities are the op's second output: the backward reads them. For inference (core's ``sdpa_out``: no
gradient can flow) :func:`sdpa_out` runs the very same blocks, but each block's scores live in a scratch buffer of
the block's size, dropped after it: the (..., L, S) probabilities are never allocated, and ``out`` has the same bits
as the forward's.

Backward, in one pass over blocks of whole heads (on the pool as the forward's; each block's dS is a temporary that
stays in cache): dv = (attn * drop)^T @ dout, dP = dout @ v^T * drop, and in place in dP's buffer
dS = attn * (dP - rowsum(dout * out)); then dq = dS @ k * scale and dk = dS^T @ q * scale. Broadcast batch dims
and repeated (GQA) heads are summed back to each input's shape.

float32 and float64 compute in their own dtype; other floating dtypes in float32, rounded once at the end.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import threads as _threads
from .kernel_dtypes import cast_back as _cast
from .kernel_dtypes import work_arrays as _work

__all__ = ["register", "sdpa", "sdpa_backward", "sdpa_out"]


def _repeat(h: np.ndarray, r: int) -> np.ndarray:
    """repeat_interleave by r along dim -3 (GQA: each key/value head serves r query heads)."""
    return h if r == 1 else np.repeat(h, r, axis=-3)


def _unrepeat(g: np.ndarray, r: int) -> np.ndarray:
    if r == 1:
        return g
    s = g.shape
    return g.reshape(s[:-3] + (s[-3] // r, r) + s[-2:]).sum(-3)


def _bcast(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """a as a (read-only) view of ``shape``; a itself where it has it (np.broadcast_to costs ~5 us a call)."""
    return a if a.shape == shape else np.broadcast_to(a, shape)


def _sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """g summed over the dims broadcasting added or expanded, down to ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=dims).reshape(shape) if dims else g.reshape(shape)


def _l2_bytes() -> int:
    """One core's L2 cache size in bytes from Linux's sysfs, or 0 where it cannot be read."""
    import glob

    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{d}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{d}/size") as f:
                size = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        digits = size.rstrip("KMB")
        return int(digits) * scale if digits.isdigit() else 0
    return 0


#: scores per block of the forward, in elements: a block's scores stay in one core's L2 cache while the mask, the
#: softmax's passes and the second GEMM run over them, instead of streaming the whole (..., L, S) buffer through
#: memory six times; large enough that numpy's ~10 calls per block (~30 us) are a few percent of it. 1 MiB of
#: float32 (a whole 512 x 512 head) where L2 holds 2 MiB or more: measured here (2 MiB L2), serial, against 512 KiB
#: blocks: 0.91x the time at (2, 8, 512, 64), 0.93x at (8, 8, 128, 64) causal and (16, 4, 128, 32); 2 MiB blocks
#: 1.08x. 512 KiB elsewhere. Blocks depend on the shapes and this constant only, never on the thread count
BLOCK = 1 << 18 if _l2_bytes() >= 2 << 20 else 1 << 17
#: causal attention splits the rows in up to this many blocks (each at least CAUSAL_ROWS long): a block of rows
#: [r0, r1) needs keys [0, r1) only, so about (parts + 1) / (2 * parts) of the GEMMs' and softmax's work is done
CAUSAL_PARTS = 4
CAUSAL_ROWS = 32


class _SerialBlas:
    """While active, numpy's BLAS runs each GEMM on the calling thread: the blocks' GEMMs already run in parallel on
    flex's pool, and BLAS threads on top of them oversubscribe the cores (measured: 2-30x slower medians on a
    loaded 2-core machine). Re-entrant across threads: the first to enter saves the BLAS thread counts, the last to
    leave restores them. BLAS results do not depend on its thread count (it splits a GEMM's output, never the
    sums), so neither do the kernel's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[tuple[Any, int]] = []
        self._libs: list[Any] | None = None

    def _blas(self) -> list[Any]:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController

                self._libs = list(ThreadpoolController().select(user_api="blas").lib_controllers)
            except Exception:  # noqa: BLE001 - no control over BLAS threads costs speed only, never a result
                self._libs = []
        return self._libs

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = [(lib, lib.num_threads) for lib in self._blas()]
                for lib, n in self._saved:
                    if n != 1:
                        lib.set_num_threads(1)
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for lib, n in self._saved:
                    if n != 1:
                        lib.set_num_threads(n)
                self._saved = []


_serial_blas = _SerialBlas()


#: the largest score bound that softmax takes without subtracting each row's max: exp(bound) * S stays far below
#: the dtype's largest value and exp(-bound) far above its smallest normal (no overflow, no subnormals)
_EXP_LIMIT = {4: 60.0, 8: 600.0}
_LOG2E = 1.0 / math.log(2.0)
#: the stable softmax's scores are floored here (after the max is subtracted): exp's smallest normal results
#: (float32 1.2e-38, float64 2.2e-308); below, numpy's exp returns subnormals through a slow path (~13x here)
_EXP_FLOOR = {4: -87.0, 8: -708.0}


def _reach(mask: np.ndarray, scores: int) -> float:
    """The largest magnitude of a float mask's finite values (its -inf entries hide positions, they add nothing);
    inf where it has NaN or +inf, or where scanning it (three passes) would cost more than the two passes over the
    ``scores`` elements it can save (then softmax takes its stable form)."""
    if mask.size > max(1 << 16, scores // 4):
        return math.inf
    a = np.abs(mask)
    a[np.isneginf(mask)] = 0
    return float(a.max()) if a.size else 0.0


def _plan(batch: tuple[int, ...], L: int, S: int, is_causal: bool,
          split_rows: bool = True) -> list[tuple[tuple[Any, ...], int, int]]:
    """The blocks, as (index into the batch dims, first row, end row): rows split where one batch entry's scores
    exceed :data:`BLOCK` and for causal attention (unless ``split_rows`` is False: the backward sums over rows),
    batch entries grouped along one batch axis up to :data:`BLOCK` scores. Depends on the shapes only (never on the
    thread count), so a result's bits do not."""
    return _plan_cached(batch, L, S, is_causal, split_rows, BLOCK, CAUSAL_PARTS, CAUSAL_ROWS)


@functools.lru_cache(maxsize=256)
def _plan_cached(batch: tuple[int, ...], L: int, S: int, is_causal: bool, split_rows: bool, block: int,
                 causal_parts: int, causal_rows: int) -> list[tuple[tuple[Any, ...], int, int]]:
    rb = L
    if split_rows and L * S > block:
        rb = max(8, block // max(S, 1))
    if split_rows and is_causal and L >= 2 * causal_rows:
        rb = min(rb, max(causal_rows, -(-L // causal_parts)))
    rows = [(r, min(r + rb, L)) for r in range(0, L, rb)] if L else [(0, 0)]
    inner, a = rb * S, len(batch)
    while a > 0 and inner * batch[a - 1] <= block:  # trailing batch dims that fit whole in a block
        inner *= batch[a - 1]
        a -= 1
    if a == 0:
        heads: list[tuple[Any, ...]] = [()]
    else:
        axis = a - 1
        c = max(1, block // max(inner, 1))
        heads = [lead + (slice(i, min(i + c, batch[axis])),)
                 for lead in itertools.product(*(range(n) for n in batch[:axis]))
                 for i in range(0, batch[axis], c)]
    return [(b, r0, r1) for b in heads for r0, r1 in rows]


#: causal masks of up to this many positions are kept (read-only) for the next call of the same shape
_TRI_CACHED = 1 << 22


def _causal_hidden(L: int, S: int) -> np.ndarray:
    """(L, S) bool: True right of the diagonal (the keys each query row hides under ``is_causal``). Building it costs
    ~0.4-0.7 ms at 512 x 512 (~5% of a causal attention there), so shapes up to :data:`_TRI_CACHED` positions reuse
    one read-only array; larger ones build it per call (small next to their attention)."""
    return _causal_cached(L, S) if L * S <= _TRI_CACHED else np.arange(S) > np.arange(L)[:, None]


@functools.lru_cache(maxsize=8)
def _causal_cached(L: int, S: int) -> np.ndarray:
    tri = np.arange(S) > np.arange(L)[:, None]
    tri.flags.writeable = False
    return tri


def _run_blocks(block: Callable[..., None], blocks: list[tuple[tuple[Any, ...], int, int]], size: int) -> None:
    """``block(*b)`` for every block: when the attention has ``size`` >= the pool's threshold elements, on flex's
    pool with numpy's BLAS on one thread meanwhile (while the pool is cold, :func:`ember_flex.threads.active`, the
    blocks run one after another on this thread, BLAS still on one: other processes hold the other cores, and
    BLAS's spinning threads would fight them too); serially with BLAS's own threads otherwise."""
    if len(blocks) > 1 and _threads.get_num_threads() > 1 and size >= _threads.min_elems:
        with _serial_blas:
            _threads.run([(block, b) for b in blocks])
    else:
        for b in blocks:
            block(*b)


def sdpa(backend: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
         drop: np.ndarray | None, *, scale: float, is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
         mask_grad: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The forward (see the module docstring); returns (out, attn).

    Computed in blocks of :func:`_plan` (a few heads, or a range of one head's rows), each block's scores written
    into its slice of ``attn``: the GEMM, the mask and the softmax's passes run on a block that stays in cache, and
    the blocks run on flex's thread pool when the attention is large (each block is the same computation on any
    number of threads: the result's bits do not depend on it)."""
    out, attn = _forward(q, k, v, mask, drop, scale, is_causal, repeat_k, repeat_v, True)
    assert attn is not None
    return out, attn


def sdpa_out(backend: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
             drop: np.ndarray | None, *, scale: float, is_causal: bool = False, repeat_k: int = 1,
             repeat_v: int = 1) -> np.ndarray:
    """``out`` of :func:`sdpa` alone (core's ``sdpa_out``, for inference): the same blocks and arithmetic, bit for
    bit, but each block's scores live in a scratch buffer of the block's size (in cache, dropped after it) instead
    of a slice of the whole (..., L, S) probabilities, which are never allocated."""
    return _forward(q, k, v, mask, drop, scale, is_causal, repeat_k, repeat_v, False)[0]


def _forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, drop: np.ndarray | None,
             scale: float, is_causal: bool, repeat_k: int, repeat_v: int,
             weights: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(out, attn) of the forward, attn None unless ``weights``: one block function for both, so ``out`` has the
    same bits whether the probabilities are kept or not."""
    dt = q.dtype
    work, (q, k, v, mask, drop) = _work(q, k, v, mask, drop)
    k, v = _repeat(k, repeat_k), _repeat(v, repeat_v)
    L, S, E, ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    shape = batch + (L, S)
    # operands as (broadcast) views of the attention's batch dims; the scale is folded into each block's rows of q
    # (L*E multiplies, in a block-sized buffer in cache: a scaled copy of the whole q was a fresh allocation whose
    # page faults cost as much as its multiplies)
    # without a mask (causal or not) the scores come out in base 2 (log2(e) folded into q's scale, free) for exp2,
    # which numpy runs ~1.8x faster than exp here (0.28 against 0.51 ns a float32 element) where its results are
    # normal numbers: in the max-free form (scores bounded by the limit, 2**-87 at least; the causal triangle is
    # zeroed after exp2, never passed to it as -inf), not in the stable one (see the block). A mask keeps natural
    # units and exp: a float mask is added to the scores as torch adds it (the same rounding: a -1e4 added in base
    # 2 moved rows of such masks by 1e-3 from torch's), and a bool mask gives the bits of its 0/-inf float twin
    base2 = mask is None
    f_scale = work.type(scale * _LOG2E if base2 else scale)
    f_ln2 = work.type(math.log(2.0))
    floor = work.type(_EXP_FLOOR[work.itemsize])
    expf = np.exp2 if base2 else np.exp
    qs = _bcast(q, batch + (L, E))
    kt = np.swapaxes(_bcast(k, batch + (S, E)), -1, -2)
    vb = _bcast(v, batch + (S, ev))
    attn = np.empty(shape, work) if weights else None
    out = np.empty(batch + (L, ev), work)
    add = skip = None
    if mask is not None and mask.dtype == np.bool_:
        skip = _bcast(~mask, shape)  # ~ on the mask as given (often (L, S) or (N, 1, 1, S))
    elif mask is not None:
        add = _bcast(mask, shape)
    tri = _causal_hidden(L, S) if is_causal else None
    size = math.prod(shape)
    if size == 0 or out.size == 0:  # nothing to attend (the functional runs the composition for these)
        out[...] = 0
        return _cast(dt, (out,))[0], None if attn is None else _cast(dt, (attn,))[0]
    # squared row norms of the scaled q and of k (bounds on each block's scores), and a float mask's reach
    qn2 = _bcast(np.einsum("...e,...e->...", q, q), batch + (L,))  # of q unscaled: times |scale| in the bound
    kn2 = _bcast(np.einsum("...e,...e->...", k, k), batch + (S,))
    span = _reach(mask, size) if add is not None else 0.0
    limit = _EXP_LIMIT[work.itemsize]
    blocks = _plan(batch, L, S, is_causal)

    def block(b: tuple[Any, ...], r0: int, r1: int) -> None:
        rows = b + (Ellipsis, slice(r0, r1), slice(None))
        c = min(S, r1) if is_causal else S  # keys beyond the block's last row are masked for all its rows
        qb = np.multiply(qs[rows], f_scale)
        # the block's scores: its slice of the probabilities, or a scratch buffer of the block's size (in cache)
        s = np.empty(qb.shape[:-1] + (c,), work) if attn is None else \
            attn[b + (Ellipsis, slice(r0, r1), slice(0, c))]
        np.matmul(qb, kt[b + (Ellipsis, slice(None), slice(0, c))], out=s)
        # |q_i . k_j| <= |q_i| |k_j|: where the block's scores are bounded well inside exp's range, softmax needs no
        # max subtracted (the max and the subtraction are 2 of its 5 passes); otherwise the stable form
        bound = math.sqrt(float(qn2[b + (Ellipsis, slice(r0, r1))].max()) *
                          float(kn2[b + (Ellipsis, slice(0, c))].max())) * abs(scale) + span
        # the diagonal's right: keys r0+1 .. c-1 hide from some rows
        hide = tri[r0:r1, r0 + 1:c] if tri is not None and c > r0 + 1 else None
        if tri is None and skip is not None:
            np.copyto(s, -np.inf, where=skip[rows])
        elif tri is None and add is not None:
            s += add[rows]
        if bound <= limit:  # NaN (NaN or inf operands) takes the stable form
            with np.errstate(under="ignore"):
                expf(s, out=s)
            if hide is not None:  # zeroed after exp (exp2(-inf) is 0 too, but takes numpy's slow path: ~10x)
                np.copyto(s[..., r0 + 1:c], 0, where=hide)
        else:
            # stable softmax in place: rows whose max is -inf (all masked) subtract 0 (their sum, 0, becomes 1
            # below: zeros)
            if hide is not None:
                np.copyto(s[..., r0 + 1:c], -np.inf, where=hide)
            m = s.max(-1, keepdims=True)
            m[m == -np.inf] = 0
            s -= m
            if base2:
                # back to natural units for exp: below 2**-126 (subnormal or zero results, -inf included)
                # numpy's exp2 takes a slow path (10-300x here), and after the max is subtracted the scores reach
                # that far
                s *= f_ln2
            if add is None:
                # exp is slow (~13x) where its results are subnormal: scores floored where exp gives the smallest
                # normal number (a weight below 1e-38 of the row's largest, 1, moves nothing), and the hidden
                # positions (-inf, floored too) zeroed after exp. A float mask's -inf positions are not known
                # here: its scores keep exp's own results
                np.maximum(s, floor, out=s)
            with np.errstate(under="ignore"):
                np.exp(s, out=s)
            if add is None and hide is not None:
                np.copyto(s[..., r0 + 1:c], 0, where=hide)
            elif add is None and skip is not None:
                np.copyto(s, 0, where=skip[rows])
        # the row sums by einsum (its loop: ~2.5x numpy's reduce over rows of a few hundred); a row whose every
        # position is masked sums to 0 (unmasked ones give at least exp(-limit) > 0, or 1 at the row's max)
        total = np.einsum("...j->...", s)[..., None]
        total[total == 0] = 1
        r = np.reciprocal(total, out=total)  # as torch's CPU softmax: one reciprocal per row, then multiplies
        if drop is not None:  # the kept probabilities stay undropped: the dropped ones in a scratch buffer
            p = s * drop[b + (Ellipsis, slice(r0, r1), slice(0, c))] if attn is not None else \
                np.multiply(s, drop[b + (Ellipsis, slice(r0, r1), slice(0, c))], out=s)
        else:
            p = s
        # the normalisation moves past the GEMM with v: (exp(s) @ v) * r, L*E multiplies instead of L*S (8x
        # fewer at S = 512, E = 64); the kept probabilities (sdpa) are normalised after it, so ``out`` has the
        # same bits with or without them
        o = out[rows]
        np.matmul(p, vb[b + (Ellipsis, slice(0, c), slice(None))], out=o)
        o *= r
        if attn is not None:
            s *= r
            if c < S:
                attn[b + (Ellipsis, slice(r0, r1), slice(c, None))] = 0

    _run_blocks(block, blocks, size)
    if attn is None:
        return _cast(dt, (out,))[0], None
    out, attn = _cast(dt, (out, attn))
    return out, attn


def sdpa_backward(backend: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                  drop: np.ndarray | None, out: np.ndarray, attn: np.ndarray, dout: np.ndarray, *, scale: float,
                  is_causal: bool = False, repeat_k: int = 1, repeat_v: int = 1,
                  mask_grad: bool = False) -> tuple[np.ndarray, ...]:
    """dq, dk, dv (and the float mask's gradient with ``mask_grad``) in one pass (see the module docstring), in
    blocks of whole heads (each block's dS stays in cache and is dropped after it), on flex's pool when large."""
    dt = q.dtype
    q_shape = q.shape
    work, (q, k, v, mask, drop, out, attn, dout) = _work(q, k, v, mask, drop, out, attn, dout)
    kr, vr = _repeat(k, repeat_k), _repeat(v, repeat_v)
    batch, (L, S) = attn.shape[:-2], attn.shape[-2:]
    E, ev = q.shape[-1], v.shape[-1]
    qb = _bcast(q, batch + (L, E))
    kb = _bcast(kr, batch + (S, E))
    vt = np.swapaxes(_bcast(vr, batch + (S, ev)), -1, -2)
    dq = np.empty(batch + (L, E), work)
    dk = np.empty(batch + (S, E), work)
    dv = np.empty(batch + (S, ev), work)
    dmask = np.empty(attn.shape, work) if mask_grad and mask is not None else None
    sc = work.type(scale)

    def block(b: tuple[Any, ...], r0: int, r1: int) -> None:
        a, g = attn[b], dout[b]
        p = a if drop is None else a * drop[b]
        np.matmul(np.swapaxes(p, -1, -2), g, out=dv[b])
        ds = np.matmul(g, vt[b])  # dP, then dS in place
        if drop is not None:
            ds *= drop[b]
        ds -= np.einsum("...i,...i->...", g, out[b])[..., None]
        ds *= a
        gq, gk = dq[b], dk[b]
        np.matmul(ds, kb[b], out=gq)
        gq *= sc
        np.matmul(np.swapaxes(ds, -1, -2), qb[b], out=gk)
        gk *= sc
        if dmask is not None:
            dmask[b] = ds

    if attn.size and dq.size + dk.size + dv.size:
        _run_blocks(block, _plan(batch, L, S, is_causal, split_rows=False), attn.size)
    else:  # no positions: every gradient is zero
        for g in (dq, dk, dv) + (() if dmask is None else (dmask,)):
            g[...] = 0
    grads = [_sum_to(dq, q_shape),
             _unrepeat(_sum_to(dk, kr.shape), repeat_k),
             _unrepeat(_sum_to(dv, vr.shape), repeat_v)]
    if dmask is not None and mask is not None:
        grads.append(_sum_to(dmask, mask.shape))
    return _cast(dt, tuple(np.ascontiguousarray(g) for g in grads))


def register() -> None:
    """Register the kernels with core's attention ops (called when the flex plugin is loaded)."""
    from ember.ops import attention

    attention.sdpa.kernel("flex")(sdpa)
    attention.sdpa_out.kernel("flex")(sdpa_out)
    attention.sdpa_backward.kernel("flex")(sdpa_backward)
