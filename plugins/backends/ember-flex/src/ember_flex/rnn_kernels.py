"""numpy kernels for core's recurrent-layer ops (``nn.rnn_layer`` and its backward ``nn.rnn_layer_backward``).

Each kernel runs one direction of one LSTM / GRU / RNN layer over the whole sequence in one call, so a layer costs
one dispatch instead of a dozen ops per time step:

* forward: the input projection of every step is one GEMM (with the biases that can be folded into it); then per
  step one GEMM for the recurrent projection and the gate math in place in preallocated buffers. The activated
  gates (and LSTM's cell) go to the workspace the backward reads.
* backward (backpropagation through time): one pass from the last step processed to the first computes each
  step's pre-activation gradients into one buffer; dX, dW_ih, dW_hh and the bias gradients are then single GEMMs
  (or sums) over all steps, dh0 and dc0 the gradients left at the end.

Packed sequences (``batch_sizes``): rows are sorted by decreasing length, so the rows active at a step are a
prefix; each step works on that prefix only, and the other rows keep their state (zero output, zero gradient).

float32 and float64 compute in their own dtype; other floating dtypes in float32, cast back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .kernel_dtypes import cast_back as _cast
from .kernel_dtypes import work_arrays as _work

__all__ = ["register"]


def expit(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = 1 / (1 + exp(-a)), torch's sigmoid formula (exp overflowing to inf gives the correct 0; the
    callers silence the overflow warning once per kernel)."""
    np.negative(a, out=out)
    np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


def _order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def rnn_layer(backend: Any, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None, w_ih: np.ndarray,
              w_hh: np.ndarray, b_ih: np.ndarray | None, b_hh: np.ndarray | None, w_hr: np.ndarray | None, *,
              mode: str, reverse: bool = False, batch_sizes: tuple[int, ...] | None = None) -> tuple[np.ndarray, ...]:
    """The whole time loop of one layer direction (see the module docstring); returns core's outputs."""
    with np.errstate(over="ignore"):
        return _forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse, batch_sizes)


def _forward(x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None, w_ih: np.ndarray, w_hh: np.ndarray,
             b_ih: np.ndarray | None, b_hh: np.ndarray | None, w_hr: np.ndarray | None, mode: str, reverse: bool,
             batch_sizes: tuple[int, ...] | None) -> tuple[np.ndarray, ...]:
    dt = x.dtype
    wd, (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr) = _work(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    steps, batch, n_in = x.shape
    gate_rows = w_ih.shape[0]
    size = h0.shape[1]
    packed = batch_sizes is not None
    alloc = np.zeros if packed else np.empty  # packed: inactive rows must read as zeros
    xg = np.matmul(x.reshape(steps * batch, n_in), w_ih.T).reshape(steps, batch, gate_rows)
    if b_ih is not None:
        xg += b_ih
        if mode == "GRU":  # W_hn h + b_hn is gated by r: only the r and z parts of b_hh fold into the input side
            xg[..., :2 * (gate_rows // 3)] += b_hh[:2 * (gate_rows // 3)]
        else:
            xg += b_hh
    y = alloc((steps, batch, size), wd)
    h = h0.copy()
    w_hh_t = w_hh.T
    if mode == "LSTM":
        hidden = gate_rows // 4
        ws = alloc((steps, batch, 5 * hidden), wd)
        c = c0.copy()
        w_hr_t = w_hr.T if w_hr is not None else None
        for t in _order(steps, reverse):
            n = batch_sizes[t] if packed else batch
            if n == 0:
                continue
            a = np.matmul(h[:n], w_hh_t)
            a += xg[t, :n]
            s = ws[t, :n]
            i, f, g, o, cc = (s[:, k * hidden:(k + 1) * hidden] for k in range(5))
            expit(a[:, :2 * hidden], out=s[:, :2 * hidden])
            np.tanh(a[:, 2 * hidden:3 * hidden], out=g)
            expit(a[:, 3 * hidden:], out=o)
            np.multiply(f, c[:n], out=cc)
            cc += i * g
            c[:n] = cc
            m = np.tanh(cc)
            m *= o
            if w_hr_t is not None:
                np.matmul(m, w_hr_t, out=h[:n])
            else:
                h[:n] = m
            y[t, :n] = h[:n]
        return _cast(dt, (y, h, c, ws))
    if mode == "GRU":
        hidden = gate_rows // 3
        ws = alloc((steps, batch, 4 * hidden), wd)
        b_hn = b_hh[2 * hidden:] if b_hh is not None else None
        for t in _order(steps, reverse):
            n = batch_sizes[t] if packed else batch
            if n == 0:
                continue
            hg = np.matmul(h[:n], w_hh_t)
            s = ws[t, :n]
            rz, nn, hn = s[:, :2 * hidden], s[:, 2 * hidden:3 * hidden], s[:, 3 * hidden:]
            np.add(xg[t, :n, :2 * hidden], hg[:, :2 * hidden], out=rz)
            expit(rz, out=rz)
            if b_hn is not None:
                np.add(hg[:, 2 * hidden:], b_hn, out=hn)
            else:
                hn[...] = hg[:, 2 * hidden:]
            np.multiply(rz[:, :hidden], hn, out=nn)
            nn += xg[t, :n, 2 * hidden:]
            np.tanh(nn, out=nn)
            d = h[:n] - nn  # h' = n + z * (h - n), torch's form
            d *= rz[:, hidden:]
            d += nn
            h[:n] = d
            y[t, :n] = d
        return _cast(dt, (y, h, ws))
    ws = alloc((steps, batch, gate_rows), wd)
    tanh = mode == "RNN_TANH"
    for t in _order(steps, reverse):
        n = batch_sizes[t] if packed else batch
        if n == 0:
            continue
        a = np.matmul(h[:n], w_hh_t)
        a += xg[t, :n]
        if tanh:
            np.tanh(a, out=a)
            np.multiply(a, a, out=ws[t, :n])
            np.subtract(1, ws[t, :n], out=ws[t, :n])
        else:
            np.maximum(a, 0, out=a)
            np.greater(a, 0, out=ws[t, :n], casting="unsafe")
        h[:n] = a
        y[t, :n] = a
    return _cast(dt, (y, h, ws))


def _prev_states(seq: np.ndarray, first: np.ndarray, batch_sizes: tuple[int, ...] | None,
                 reverse: bool) -> np.ndarray:
    """(T, B, S): the state each step starts from (``first`` for the first step processed and for packed rows
    not active at the previous step processed)."""
    steps = seq.shape[0]
    out = np.empty(seq.shape, seq.dtype)
    order = list(_order(steps, reverse))
    out[order[0]] = first
    if batch_sizes is None:
        if reverse:
            out[:-1] = seq[1:]
        else:
            out[1:] = seq[:-1]
        return out
    for p, t in zip(order, order[1:]):
        k = batch_sizes[p]
        out[t, :k] = seq[p, :k]
        out[t, k:] = first[k:]
    return out


def rnn_layer_backward(backend: Any, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None, w_ih: np.ndarray,
                       w_hh: np.ndarray, w_hr: np.ndarray | None, y: np.ndarray, ws: np.ndarray, dy: np.ndarray,
                       dhn: np.ndarray, dcn: np.ndarray | None, *, mode: str, reverse: bool = False,
                       batch_sizes: tuple[int, ...] | None = None) -> tuple[np.ndarray, ...]:
    """Backpropagation through time of one layer direction in one pass (see the module docstring)."""
    dt = x.dtype
    wd, (x, h0, c0, w_ih, w_hh, w_hr, y, ws, dy, dhn, dcn) = _work(x, h0, c0, w_ih, w_hh, w_hr, y, ws, dy, dhn,
                                                                    dcn)
    steps, batch, n_in = x.shape
    gate_rows = w_ih.shape[0]
    packed = batch_sizes is not None
    alloc = np.zeros if packed else np.empty  # packed: inactive rows get zero gradient
    d_xg = alloc((steps, batch, gate_rows), wd)
    h_prev = _prev_states(y, h0, batch_sizes, reverse)
    dh = dhn.copy()
    rev = list(_order(steps, reverse))[::-1]
    dw_hr = None
    if mode == "LSTM":
        hidden = gate_rows // 4
        c_prev = _prev_states(ws[..., 4 * hidden:], c0, batch_sizes, reverse)
        dc = dcn.copy()
        if w_hr is not None:
            dw_hr = np.zeros(w_hr.shape, wd)
        for t in rev:
            n = batch_sizes[t] if packed else batch
            if n == 0:
                continue
            gh = dh[:n]
            gh += dy[t, :n]
            s = ws[t, :n]
            i, f, g, o, cc = (s[:, k * hidden:(k + 1) * hidden] for k in range(5))
            tc = np.tanh(cc)
            if w_hr is not None:
                dw_hr += gh.T @ (o * tc)
                dm = gh @ w_hr
            else:
                dm = gh
            da = d_xg[t, :n]
            da_i, da_f, da_g, da_o = (da[:, k * hidden:(k + 1) * hidden] for k in range(4))
            dct = dc[:n]
            tmp = tc * tc
            np.subtract(1, tmp, out=tmp)  # 1 - tanh(c)^2
            tmp *= o
            tmp *= dm
            dct += tmp  # dc_t = dc carried + dm * o * (1 - tanh(c)^2)
            np.multiply(dm, tc, out=da_o)
            da_o *= o
            da_o *= 1 - o
            np.multiply(dct, g, out=da_i)
            da_i *= i
            da_i *= 1 - i
            np.multiply(dct, c_prev[t, :n], out=da_f)
            da_f *= f
            da_f *= 1 - f
            np.multiply(dct, i, out=da_g)
            da_g *= 1 - g * g
            dct *= f  # the gradient carried to c_{t-1}
            np.matmul(da, w_hh, out=dh[:n])
        d_hg = d_xg
        tail: tuple[np.ndarray, ...] = (dc,) + ((dw_hr,) if dw_hr is not None else ())
    elif mode == "GRU":
        hidden = gate_rows // 3
        d_hg = alloc((steps, batch, gate_rows), wd)
        for t in rev:
            n = batch_sizes[t] if packed else batch
            if n == 0:
                continue
            gh = dh[:n]
            gh += dy[t, :n]
            s = ws[t, :n]
            r, z, nn, hn = (s[:, k * hidden:(k + 1) * hidden] for k in range(4))
            dx_t, dh_t = d_xg[t, :n], d_hg[t, :n]
            da_r, da_z, da_n = (dx_t[:, k * hidden:(k + 1) * hidden] for k in range(3))
            np.multiply(gh, 1 - z, out=da_n)
            da_n *= 1 - nn * nn
            np.subtract(h_prev[t, :n], nn, out=da_z)
            da_z *= gh
            da_z *= z
            da_z *= 1 - z
            np.multiply(da_n, hn, out=da_r)
            da_r *= r
            da_r *= 1 - r
            dh_t[:, :2 * hidden] = dx_t[:, :2 * hidden]
            np.multiply(da_n, r, out=dh_t[:, 2 * hidden:])
            direct = gh * z
            np.matmul(dh_t, w_hh, out=dh[:n])
            dh[:n] += direct
        tail = ()
    else:
        for t in rev:
            n = batch_sizes[t] if packed else batch
            if n == 0:
                continue
            gh = dh[:n]
            gh += dy[t, :n]
            np.multiply(gh, ws[t, :n], out=d_xg[t, :n])
            np.matmul(d_xg[t, :n], w_hh, out=dh[:n])
        d_hg = d_xg
        tail = ()
    dxg2 = d_xg.reshape(steps * batch, gate_rows)
    dhg2 = d_hg.reshape(steps * batch, gate_rows)
    dx = np.matmul(dxg2, w_ih).reshape(steps, batch, n_in)
    dw_ih = dxg2.T @ x.reshape(steps * batch, n_in)
    dw_hh = dhg2.T @ h_prev.reshape(steps * batch, h_prev.shape[-1])
    db_ih = dxg2.sum(0)
    db_hh = db_ih.copy() if d_hg is d_xg else dhg2.sum(0)
    return _cast(dt, (dx, dh, dw_ih, dw_hh, db_ih, db_hh, *tail))


def register() -> None:
    """Register the kernels with core's recurrent ops (called when the flex plugin is loaded)."""
    from ember.ops import recurrent

    recurrent.rnn_layer.kernel("flex")(rnn_layer)
    recurrent.rnn_layer_backward.kernel("flex")(rnn_layer_backward)
