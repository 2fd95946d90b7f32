"""ember-flex kernels for ember-signal's transforms: scipy.fft (pocketfft) on flex's numpy handles.

Registered under the backend name ``"flex"`` when :mod:`ember_signal` loads (the plugin names no other plugin: a
kernel is keyed by the backend's name, and without ember-flex it is simply never looked up).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ops import c2c, c2r, frames, host_c2c, host_c2r, host_r2c, overlap_add, r2c


def _c2c(backend: Any, h: np.ndarray, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str,
         forward: bool) -> np.ndarray:
    return host_c2c(h, s, dims, norm, forward)


def _r2c(backend: Any, h: np.ndarray, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> np.ndarray:
    return host_r2c(h, s, dims, norm)


def _c2r(backend: Any, h: np.ndarray, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> np.ndarray:
    return host_c2r(h, s, dims, norm)


def _frames(backend: Any, h: np.ndarray, w: np.ndarray, *, n_fft: int, hop: int, pad: int = 0,
            pad_mode: str = "constant") -> np.ndarray:
    # the centre padding in one concatenation (np.pad's generic path costs several times more), then a strided view
    # of the frames (no copy; as_strided directly: sliding_window_view's checks cost more than the multiply on small
    # inputs), multiplied by the window into one new contiguous array
    if pad:
        if pad_mode == "reflect":
            ends = (h[..., pad:0:-1], h[..., -2:-pad - 2:-1])
        else:
            ends = (np.zeros((*h.shape[:-1], pad), h.dtype),) * 2
        h = np.concatenate([ends[0], h, ends[1]], axis=-1)
    count = (h.shape[-1] - n_fft) // hop + 1
    step = h.strides[-1]
    view = np.lib.stride_tricks.as_strided(h, shape=(*h.shape[:-1], count, n_fft),
                                           strides=(*h.strides[:-1], step * hop, step), writeable=False)
    return np.multiply(view, w, dtype=np.result_type(h, w))


def _overlap_add(backend: Any, h: np.ndarray, *, hop: int) -> np.ndarray:
    # r = ceil(n / hop) in-place adds of the frames' hop-wide column blocks into rows i .. i + t - 1 of the output
    b, t, n = h.shape
    r = -(-n // hop)
    out = np.zeros((b, (t + r - 1) * hop), dtype=h.dtype)
    rows = out.reshape(b, t + r - 1, hop)
    for i in range(r):
        w = min(hop, n - i * hop)
        rows[:, i:i + t, :w] += h[:, :, i * hop:i * hop + w]
    return np.ascontiguousarray(out[:, : n + hop * (t - 1)])


def register() -> None:
    """Register the flex kernels of signal.c2c, signal.r2c, signal.c2r, signal.frames and signal.overlap_add."""
    c2c.kernel("flex")(_c2c)
    r2c.kernel("flex")(_r2c)
    c2r.kernel("flex")(_c2r)
    frames.kernel("flex")(_frames)
    overlap_add.kernel("flex")(_overlap_add)
