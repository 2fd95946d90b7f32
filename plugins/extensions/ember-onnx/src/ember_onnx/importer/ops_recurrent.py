"""RNN, GRU and LSTM with ONNX's semantics (gate orders, directions, sequence_lens, activations, clip, peepholes),
unrolled over time with ember ops so they run and differentiate on any device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import ember
import ember.nn.functional as F
from ember import Tensor

from .registry import Node, host_ints, register

Act = Callable[[Tensor], Tensor]


def _activation(name: str, alpha: float | None, beta: float | None) -> Act:
    key = name.lower()
    if key == "sigmoid":
        return ember.sigmoid
    if key == "tanh":
        return ember.tanh
    if key == "relu":
        return ember.relu
    if key == "affine":
        return lambda x: x * alpha + beta
    if key == "leakyrelu":
        return lambda x: F.leaky_relu(x, alpha if alpha is not None else 0.01)
    if key == "thresholdedrelu":
        return lambda x: ember.where(x > (alpha if alpha is not None else 1.0), x, ember.zeros_like(x))
    if key == "scaledtanh":
        return lambda x: ember.tanh(x * beta) * alpha
    if key == "hardsigmoid":
        return lambda x: ember.clamp(x * (alpha if alpha is not None else 0.2) + (beta if beta is not None else 0.5),
                                     0.0, 1.0)
    if key == "elu":
        return lambda x: F.elu(x, alpha if alpha is not None else 1.0)
    if key == "softsign":
        return F.softsign
    if key == "softplus":
        return lambda x: ember.logaddexp(x, ember.zeros_like(x))
    raise ValueError(name)


def _activations(node: Node, defaults: list[str], n_dirs: int) -> list[list[Act]]:
    names = list(node.attr("activations") or defaults * n_dirs)
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    acts = []
    for i, name in enumerate(names):
        try:
            acts.append(_activation(name, alphas[i] if i < len(alphas) else None,
                                    betas[i] if i < len(betas) else None))
        except ValueError:
            raise node.fail(f"activation {name!r} is not supported") from None
    per = len(defaults)
    return [acts[d * per:(d + 1) * per] for d in range(n_dirs)]


def _reverse_within(x: Tensor, lens: list[int] | None) -> Tensor:
    """Reverse (seq, batch, ...) along time, each batch entry within its own length."""
    seq, batch = x.shape[0], x.shape[1]
    if lens is None:
        return ember.flip(x, [0])
    src = np.tile(np.arange(seq)[:, None], (1, batch))
    for b, n in enumerate(lens):
        src[:n, b] = np.arange(n)[::-1]
    index = ember.tensor(src.astype(np.int64), device=x.device).reshape(seq, batch, *([1] * (x.dim() - 2)))
    return ember.gather(x, 0, ember.broadcast_to(index, tuple(x.shape)))


def _run(node: Node, kind: str, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None, lens_t: Tensor | None,
         h0: Tensor | None, c0: Tensor | None = None, p: Tensor | None = None) -> tuple[Any, ...]:
    layout = node.attr("layout", 0)
    if layout:
        x = x.permute(1, 0, 2)
        h0 = h0.permute(1, 0, 2) if h0 is not None else None
        c0 = c0.permute(1, 0, 2) if c0 is not None else None
    seq, batch = x.shape[0], x.shape[1]
    hidden = node.attr("hidden_size") or r.shape[-1]
    direction = node.attr("direction", "forward")
    n_dirs = 2 if direction == "bidirectional" else 1
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    defaults = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = _activations(node, defaults, n_dirs)
    clip = node.attr("clip")
    lens = host_ints(lens_t) if lens_t is not None else None
    if lens is not None and all(n == seq for n in lens):
        lens = None
    mask = None
    if lens is not None:
        steps = np.arange(seq)[:, None] < np.asarray(lens)[None, :]
        mask = ember.tensor(steps[:, :, None], device=x.device)  # (seq, batch, 1)
    zeros = ember.zeros(n_dirs, batch, hidden, dtype=x.dtype, device=x.device)
    h0 = zeros if h0 is None else h0
    c0 = zeros if c0 is None else c0
    ys, hs, cs = [], [], []
    for d in range(n_dirs):
        reverse = direction == "reverse" or d == 1
        wd, rd = w[d], r[d]
        bd = b[d] if b is not None else ember.zeros(2 * gates * hidden, dtype=x.dtype, device=x.device)
        wb, rb = bd[:gates * hidden], bd[gates * hidden:]
        xs = _reverse_within(x, lens) if reverse else x
        # the input projection of every step at once
        xw = ember.matmul(xs, wd.t()) + wb
        h, c = h0[d], c0[d]
        f, g, hh = (acts[d] + [None, None])[:3]
        outs = []
        for t in range(seq):
            xt = xw[t]
            if kind == "rnn":
                pre = xt + ember.matmul(h, rd.t()) + rb
                new_h = f(pre if clip is None else ember.clamp(pre, -clip, clip))
                new_c = c
            elif kind == "gru":
                xz, xr, xh = ember.split(xt, hidden, dim=-1)
                rz, rr, rh = ember.split(rd, hidden, dim=0)
                bz, br, bh = ember.split(rb, hidden, dim=0)
                zt = xz + ember.matmul(h, rz.t()) + bz
                rt_ = xr + ember.matmul(h, rr.t()) + br
                if clip is not None:
                    zt, rt_ = ember.clamp(zt, -clip, clip), ember.clamp(rt_, -clip, clip)
                z, rg = f(zt), f(rt_)
                if node.attr("linear_before_reset", 0):
                    ht = xh + rg * (ember.matmul(h, rh.t()) + bh)
                else:
                    ht = xh + ember.matmul(rg * h, rh.t()) + bh
                if clip is not None:
                    ht = ember.clamp(ht, -clip, clip)
                new_h = (1 - z) * g(ht) + z * h
                new_c = c
            else:
                pre = xt + ember.matmul(h, rd.t()) + rb
                pi, po, pf, pc = ember.split(pre, hidden, dim=-1)
                if p is not None:
                    pp_i, pp_o, pp_f = ember.split(p[d], hidden, dim=0)
                    pi, pf = pi + pp_i * c, pf + pp_f * c
                if clip is not None:
                    pi, pf, pc = (ember.clamp(v, -clip, clip) for v in (pi, pf, pc))
                i_g = f(pi)
                f_g = 1 - i_g if node.attr("input_forget", 0) else f(pf)
                new_c = f_g * c + i_g * g(pc)
                if p is not None:
                    po = po + pp_o * new_c
                if clip is not None:
                    po = ember.clamp(po, -clip, clip)
                new_h = f(po) * hh(new_c)
            if mask is not None:
                m = mask[t]
                out_t = ember.where(m, new_h, ember.zeros_like(new_h))
                h = ember.where(m, new_h, h)
                c = ember.where(m, new_c, c)
            else:
                out_t, h, c = new_h, new_h, new_c
            outs.append(out_t)
        y = ember.stack(outs, dim=0)
        if reverse:
            y = _reverse_within(y, lens)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y = ember.stack(ys, dim=1)  # (seq, dirs, batch, hidden)
    yh, yc = ember.stack(hs, dim=0), ember.stack(cs, dim=0)
    if layout:
        y, yh, yc = y.permute(2, 0, 1, 3), yh.permute(1, 0, 2), yc.permute(1, 0, 2)
    return (y, yh, yc) if kind == "lstm" else (y, yh)


@register("RNN")
def rnn(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Tensor | None = None,
        h0: Tensor | None = None) -> tuple[Any, ...]:
    return _run(node, "rnn", x, w, r, b, lens, h0)


@register("GRU")
def gru(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Tensor | None = None,
        h0: Tensor | None = None) -> tuple[Any, ...]:
    return _run(node, "gru", x, w, r, b, lens, h0)


@register("LSTM")
def lstm(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Tensor | None = None,
         h0: Tensor | None = None, c0: Tensor | None = None, p: Tensor | None = None) -> tuple[Any, ...]:
    return _run(node, "lstm", x, w, r, b, lens, h0, c0, p)
