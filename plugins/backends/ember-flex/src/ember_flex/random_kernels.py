"""flex's uniform samples (``rand``) drawn in chunks on the thread pool, bit for bit numpy's PCG64 stream.

numpy's ``Generator.random`` turns its bit generator's output into floats one at a time:

* float32: ``(next_uint32 >> 8) * 2**-24``, where PCG64's ``next_uint32`` hands out the low, then (buffered in the
  state's ``has_uint32``/``uinteger``) the high half of one 64-bit draw;
* float64: ``(next_uint64 >> 11) * 2**-53``, which leaves a buffered half where it is.

So the k-th float of a draw depends only on the stream's position, and PCG64 can jump to any position
(``advance``, O(log n)). :func:`uniform` cuts a large draw into chunks of raw 64-bit draws; each chunk starts from a
copy of the stream advanced to its offset and runs on flex's pool (:func:`ember_flex.threads.run`). A float32 chunk
takes its raw draws (``random_raw``, which releases the GIL) block by block and converts them in place with numpy
(shift, cast, one multiply by a power of two: every step is exact, so each float is numpy's); a float64 chunk is
numpy's own ``random(out=...)`` on the copy (also without the GIL). The stream itself is then advanced past
the whole draw, its buffered half set as numpy would leave it (a float32 draw that starts on a buffered half uses
it first; one that ends on half a draw buffers the other half). The numbers are the ones ``rng.random(shape,
dtype)`` gives, for every size and any interleaving with other draws (randn, integers), whatever the chunking or
the thread count: the chunk size is fixed, and only the timing depends on the pool.

Why float32 pays even on one thread: numpy's loop calls ``next_uint32`` through a function pointer per float (with the
buffered-half branch each time); one raw draw per two floats and three vectorised passes over a cache-sized block
took ~25 % less CPU time here (float32, 4M floats: 8.7 ms against 11.6 ms, medians of thread CPU time).
Below :data:`MIN_ELEMS` elements numpy's own call is used (the chunking's fixed cost would not be repaid).

The stream's lock (``bit_generator.lock``, the one numpy's own draws hold) is held for the whole draw, as numpy
holds it: threads drawing from one stream at once each get whole, distinct runs of it.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from typing import Any

import numpy as np

from . import threads as _par

ndarray = np.ndarray

#: float32 draws of fewer elements go to numpy's own ``Generator.random``: the chunked path's fixed cost (two state
#: reads and writes, an advance: ~15-25 us) is repaid from ~2**15 floats on (measured on the busy 2-core VM,
#: medians: 2**14 0.90x, 2**15 1.06x, 2**16 1.20x of numpy's time). float64 draws are chunked only from the pool's
#: own threshold and while the pool pays (:func:`ember_flex.threads.active`): numpy's float64 loop is as fast as a
#: raw draw, so only a second core gains
MIN_ELEMS = 1 << 15
#: raw 64-bit draws per pool task (fixed: the chunking never depends on the thread count; any chunking gives the
#: same numbers anyway): 2**17 float32 or 2**16 float64 samples, ~0.2-0.4 ms of work
CHUNK_DRAWS = 1 << 16
#: raw draws converted at a time inside a task: the uint64 block (256 KiB) and its floats stay in the core's cache
#: between the draw and the three numpy passes over it
BLOCK_DRAWS = 1 << 15

# EMBER_FLEX_THREADS_MIN=n (read by ember_flex.threads too): draws of n+ elements chunked, in chunks of n/4 raw
# draws, so that tests (the conformance kit, say) push small draws through the chunked path and the pool
_env_min = os.environ.get("EMBER_FLEX_THREADS_MIN", "")
if _env_min.isdigit() and int(_env_min) > 0:
    MIN_ELEMS = min(MIN_ELEMS, int(_env_min))
    CHUNK_DRAWS = max(2, min(CHUNK_DRAWS, int(_env_min) // 4))
    BLOCK_DRAWS = max(1, min(BLOCK_DRAWS, CHUNK_DRAWS // 2))

_F32_SCALE = np.float32(2.0**-24)
_LOW32 = 0xFFFFFFFF

# one spare PCG64 per thread, whose state each task overwrites: making one costs ~15 us (seeding), setting a state ~2
_spare = threading.local()


def _copy_at(base: dict[str, Any], offset: int) -> np.random.Generator:
    """This thread's spare PCG64 (in a Generator) set to ``base`` (a PCG64 state with no buffered half) advanced
    by ``offset`` raw draws."""
    gen = getattr(_spare, "gen", None)
    if gen is None:
        gen = _spare.gen = np.random.Generator(np.random.PCG64(0))
    bg = gen.bit_generator
    bg.state = base
    bg.advance(offset)
    return gen


def _fill_f32(base: dict[str, Any], offset: int, dst: ndarray) -> None:
    """``dst`` (even length): the float32 samples of raw draws ``offset, offset + 1, ...`` from ``base``."""
    bg = _copy_at(base, offset).bit_generator
    step = 2 * BLOCK_DRAWS
    for lo in range(0, dst.size, step):
        d = dst[lo:lo + step]
        # little-endian uint32 view of the raw draws: low half first, then high, PCG64's next_uint32 order (a
        # big-endian host fails agrees_with_numpy and keeps numpy's own calls)
        u = bg.random_raw(d.size // 2).view(np.uint32)
        np.right_shift(u, 8, out=u)
        d[...] = u  # < 2**24: exact in float32
        d *= _F32_SCALE  # a power of two: exact


def _fill_f64(base: dict[str, Any], offset: int, dst: ndarray) -> None:
    """``dst``: the float64 samples of raw draws ``offset, offset + 1, ...`` from ``base``. numpy's own loop (one
    draw per float, no buffered half) on the chunk: it was faster than a raw draw and two passes here."""
    _copy_at(base, offset).random(dst.size, dtype=np.float64, out=dst)


def _chunks(fill: Any, base: dict[str, Any], dst: ndarray, per: int) -> list[tuple[Any, tuple[Any, ...]]]:
    """Pool tasks filling ``dst`` from raw draw 0 of ``base`` on, ``per`` floats per raw draw."""
    draws = dst.size // per
    return [(fill, (base, lo, dst[lo * per:min(lo + CHUNK_DRAWS, draws) * per]))
            for lo in range(0, draws, CHUNK_DRAWS)]


def uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> ndarray:
    """``rng.random(shape, dtype=dtype)``, bit for bit, leaving ``rng`` in the same state: chunked on flex's pool
    for large float32/float64 draws from a PCG64 stream; numpy's own call otherwise (small draws, other bit
    generators or dtypes, a numpy whose draws this module does not reproduce (:func:`agrees_with_numpy`), and
    every error: a negative size, say, is numpy's ValueError)."""
    npdt = np.dtype(dtype)
    bg = rng.bit_generator
    # a tuple of non-negative ints (ember.Size included); anything else is numpy's to take or reject
    n = math.prod(shape) if isinstance(shape, tuple) and all(type(s) is int and s >= 0 for s in shape) else -1
    if type(bg) is not np.random.PCG64 or not (
            n >= MIN_ELEMS if npdt == np.float32
            else npdt == np.float64 and n >= _par.min_elems and _par.active(_fill_f64)) or not agrees_with_numpy():
        return rng.random(shape, dtype=npdt)
    return _draw(bg, shape, npdt, n)


def _draw(bg: np.random.PCG64, shape: tuple[int, ...], npdt: np.dtype[Any], n: int) -> ndarray:
    """The chunked draw of ``n`` (``prod(shape)``) float32/float64 samples from ``bg``, advancing it as numpy's
    ``Generator.random`` does."""
    out = np.empty(shape, npdt)
    flat = out.reshape(-1)
    with bg.lock:  # numpy's draws hold it too: nobody moves the stream between reading and advancing it
        st = bg.state
        base = {"bit_generator": "PCG64", "state": st["state"], "has_uint32": 0, "uinteger": 0}
        if npdt == np.float64:
            _par.run(_chunks(_fill_f64, base, flat, 1), _fill_f64)
            bg.advance(n)
            # advance clears the buffered half, which float64 draws leave alone (stale uinteger included): restored
            bg.state = {**bg.state, "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}
            return out
        k = 0
        if st["has_uint32"]:  # numpy's first float32 is the half buffered by an earlier draw
            flat[0] = (st["uinteger"] >> 8) * 2.0**-24
            k = 1
        m = n - k
        pairs = m // 2
        _par.run(_chunks(_fill_f32, base, flat[k:k + 2 * pairs], 2), _fill_f32)
        draws = pairs + m % 2
        if draws == 0:  # n == 1 on a buffered half: numpy clears the flag and leaves the value
            bg.state = {**st, "has_uint32": 0}
            return out
        # the state numpy leaves: past every raw draw, the last draw's high half in uinteger, buffered (has_uint32)
        # when the draw ended on its low half; the last draw is taken again here to read that half
        bg.advance(draws - 1)
        v = int(bg.random_raw())
        if m % 2:
            flat[-1] = ((v & _LOW32) >> 8) * 2.0**-24
        bg.state = {**bg.state, "has_uint32": m % 2, "uinteger": v >> 32}
    return out


@functools.cache
def agrees_with_numpy() -> bool:
    """Whether this module's draws are the installed numpy's, checked once on first use (~0.3 ms): a few float32
    and float64 draws, odd and even, on and off a buffered half, made both ways on two PCG64 streams of one seed,
    samples and states compared. A numpy that changed how ``Generator.random`` makes floats or buffers halves then
    keeps its own calls: the numbers stay numpy's whatever it does."""
    a = np.random.Generator(np.random.PCG64(20261202))
    b = np.random.Generator(np.random.PCG64(20261202))
    for n, dtype in [(3, np.float32), (12, np.float32), (11, np.float32), (4, np.float32), (1, np.float32),
                     (1, np.float32), (7, np.float64), (1, np.float32), (6, np.float64), (2, np.float32)]:
        npdt = np.dtype(dtype)
        if _draw(b.bit_generator, (n,), npdt, n).tobytes() != a.random(n, dtype=npdt).tobytes():
            return False
        if b.bit_generator.state != a.bit_generator.state:
            return False
    return True
