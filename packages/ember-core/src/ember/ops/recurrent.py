"""One recurrent layer (one direction of one layer: the whole time loop) as a single extension op, and its
backward (backpropagation through time) as another.

``rnn_layer`` runs LSTM, GRU (torch's gate order and its ``r * (W_hn h + b_hn)`` form) and Elman RNN (tanh or
relu) layers. Its default composition is the per-step loop in ember ops, so every backend runs it (fused and
differentiated like any ember code); a backend may register one kernel for the whole loop (see
docs/extensions.md). The op's vjp is ``rnn_layer_backward``, itself one op with a composition in ember ops, so a
backend with kernels for both pays neither per-step dispatch nor per-step autodiff recording.

Both ops take the padded input ``x`` (T, B, I) and optionally ``batch_sizes`` (a tuple of T non-increasing ints,
PackedSequence's): at step t only the first ``batch_sizes[t]`` rows advance; the others keep their state and get
zero output. That is exactly a packed sequence (sorted by decreasing length): the forward direction stops each
sequence at its length, the reverse one starts it there, and the final states are taken at each sequence's end.

Besides ``y`` (T, B, P), ``h_n`` (B, P) and, for LSTM, ``c_n`` (B, H), the forward op returns a workspace
(T, B, K) of what the backward reads (PyTorch's cuDNN "reserve" buffer): LSTM the activated gates i, f, g, o and
the cell c_t (K = 5H); GRU the gates r, z, n and ``W_hn h + b_hn`` (K = 4H); RNN the activation's derivative
(K = H). Rows inactive at a step hold zeros there (kernels) or unused values (composition); the backward masks
them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..amp.autocast_mode import STATE as _AMP
from ..amp.autocast_mode import run as _amp_run
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..extension import TensorSpec, backend_extension
from ..tensor import Tensor
from . import nn as _nn
from .nn import sigmoid, tanh
from .pointwise import relu, where
from .shape import cat, stack

__all__ = ["GATES", "WORKSPACE", "rnn_layer", "rnn_layer_backward"]

#: gates per mode (rows of weight_ih / weight_hh per hidden unit), torch's order
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
#: workspace columns per hidden unit
WORKSPACE = {"LSTM": 5, "GRU": 4, "RNN_TANH": 1, "RNN_RELU": 1}


def _dims(op: str, x: TensorSpec, h0: TensorSpec, c0: Any, w_ih: TensorSpec, w_hh: TensorSpec, b_ih: Any,
          b_hh: Any, w_hr: Any, mode: str, batch_sizes: Any) -> tuple[int, int, int, int]:
    """Check one layer's arguments; returns (T, B, H, P)."""
    if mode not in GATES:
        raise ValueRangeError(f"{op}: unknown mode {mode!r}; expected one of {sorted(GATES)}")
    if x.ndim != 3 or h0.ndim != 2 or w_ih.ndim != 2 or w_hh.ndim != 2:
        raise ShapeError(f"{op}: expected x (T, B, I), h0 (B, P), w_ih (G*H, I), w_hh (G*H, P), got x {x.shape}, "
                         f"h0 {h0.shape}, w_ih {w_ih.shape}, w_hh {w_hh.shape}")
    steps, batch, n_in = x.shape
    gate_rows = w_ih.shape[0]
    if gate_rows % GATES[mode] or gate_rows == 0:
        raise ShapeError(f"{op}: w_ih has {gate_rows} rows, not a positive multiple of {GATES[mode]} ({mode})")
    hidden = gate_rows // GATES[mode]
    proj = w_hr is not None
    if proj and (mode != "LSTM" or not isinstance(w_hr, TensorSpec) or w_hr.ndim != 2 or w_hr.shape[1] != hidden):
        raise ShapeError(f"{op}: w_hr must be a (P, H={hidden}) matrix and is LSTM only, got "
                         f"{getattr(w_hr, 'shape', w_hr)!r} for {mode}")
    size = w_hr.shape[0] if proj else hidden
    want = {"w_ih": ((gate_rows, n_in), w_ih), "w_hh": ((gate_rows, size), w_hh), "h0": ((batch, size), h0)}
    if mode == "LSTM":
        if not isinstance(c0, TensorSpec):
            raise ShapeError(f"{op}: LSTM needs c0 of shape {(batch, hidden)}, got {c0!r}")
        want["c0"] = ((batch, hidden), c0)
    elif c0 is not None:
        raise ShapeError(f"{op}: c0 is LSTM only, got one for {mode}")
    if (b_ih is None) != (b_hh is None):
        raise ShapeError(f"{op}: give both biases or neither")
    if b_ih is not None:
        want["b_ih"], want["b_hh"] = ((gate_rows,), b_ih), ((gate_rows,), b_hh)
    for name, (shape, spec) in want.items():
        if not isinstance(spec, TensorSpec) or spec.shape != shape:
            raise ShapeError(f"{op}: expected {name} of shape {shape}, got {getattr(spec, 'shape', spec)!r}")
        if spec.dtype is not x.dtype:
            raise DTypeError(f"{op}: {name} has dtype {spec.dtype.name}, x has {x.dtype.name} (one dtype for all)")
    if proj and w_hr.dtype is not x.dtype:
        raise DTypeError(f"{op}: w_hr has dtype {w_hr.dtype.name}, x has {x.dtype.name}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point dtype, got {x.dtype.name}")
    check_batch_sizes(op, batch_sizes, steps, batch)
    return steps, batch, hidden, size


def check_batch_sizes(op: str, batch_sizes: Any, steps: int, batch: int) -> None:
    """``batch_sizes`` is None or a tuple of ``steps`` non-increasing ints in [0, batch]."""
    if batch_sizes is None:
        return
    if not isinstance(batch_sizes, tuple) or len(batch_sizes) != steps or \
            any(isinstance(b, bool) or not isinstance(b, int) for b in batch_sizes):
        raise ShapeError(f"{op}: batch_sizes must be a tuple of {steps} ints (one per step), got {batch_sizes!r}")
    if any(not 0 <= b <= batch for b in batch_sizes) or \
            any(a < b for a, b in zip(batch_sizes, batch_sizes[1:])):
        raise ValueRangeError(f"{op}: batch_sizes must be non-increasing and within [0, {batch}], got "
                              f"{batch_sizes}")


def _layer_spec(x: TensorSpec, h0: TensorSpec, c0: Any, w_ih: TensorSpec, w_hh: TensorSpec, b_ih: Any, b_hh: Any,
                w_hr: Any, *, mode: str, reverse: bool = False,
                batch_sizes: tuple[int, ...] | None = None) -> tuple[TensorSpec, ...]:
    steps, batch, hidden, size = _dims("rnn_layer", x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, batch_sizes)
    d = x.dtype
    out = [TensorSpec((steps, batch, size), d), TensorSpec((batch, size), d)]
    if mode == "LSTM":
        out.append(TensorSpec((batch, hidden), d))
    out.append(TensorSpec((steps, batch, WORKSPACE[mode] * hidden), d))
    return tuple(out)


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x @ w.T + b over x's last dim (the ops-level linear, without nn.functional's checks: the spec did them)."""
    return _nn.linear(x, w, b, (*x.shape[:-1], w.shape[0]))


def _order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _masks(batch_sizes: tuple[int, ...] | None, batch: int, like: Tensor) -> list[Tensor] | None:
    """Per step, a (B, 1) bool tensor: which rows advance (None when all do)."""
    if batch_sizes is None:
        return None
    from .creation import arange

    rows = arange(batch, device=like._device).reshape(batch, 1)
    return [rows < n for n in batch_sizes]


@backend_extension("nn.rnn_layer", output=_layer_spec, publish=False,
                   description="one recurrent layer direction (LSTM/GRU/RNN), the whole time loop")
def rnn_layer(x: Tensor, h0: Tensor, c0: Tensor | None, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
              b_hh: Tensor | None, w_hr: Tensor | None, *, mode: str, reverse: bool = False,
              batch_sizes: tuple[int, ...] | None = None) -> tuple[Tensor, ...]:
    """Run one direction of one recurrent layer over a whole sequence.

    Args:
        x: (T, B, I) input; h0 (B, P) and, for LSTM, c0 (B, H) initial states (None otherwise).
        w_ih, w_hh, b_ih, b_hh, w_hr: the layer's parameters with torch's names and shapes (biases both or
            neither; w_hr LSTM's projection or None).
        mode: "LSTM", "GRU", "RNN_TANH" or "RNN_RELU"; reverse: run from the last step to the first.
        batch_sizes: a packed sequence's batch sizes (rows beyond ``batch_sizes[t]`` neither advance nor output).

    Returns:
        (y, h_n, workspace) or, for LSTM, (y, h_n, c_n, workspace); y is (T, B, P), zero where a row is inactive.
    """
    steps, batch = x.shape[0], x.shape[1]
    xg = linear(x, w_ih, b_ih).unbind(0)  # every step's input projection in one matmul
    masks = _masks(batch_sizes, batch, x)
    h, c = h0, c0
    ys: list[Any] = [None] * steps
    wss: list[Any] = [None] * steps
    for t in _order(steps, reverse):
        pre = xg[t] + linear(h, w_hh, b_hh) if mode != "GRU" else None
        c_new = None
        if mode == "LSTM":
            assert pre is not None and c is not None
            ai, af, ag, ao = pre.chunk(4, dim=-1)
            i, f, g, o = sigmoid(ai), sigmoid(af), tanh(ag), sigmoid(ao)
            c_new = f * c + i * g
            h_new = o * tanh(c_new)
            if w_hr is not None:
                h_new = linear(h_new, w_hr)
            ws = cat([i, f, g, o, c_new], -1)
        elif mode == "GRU":
            hg = linear(h, w_hh, b_hh)
            xr, xz, xn = xg[t].chunk(3, dim=-1)
            hr, hz, hn = hg.chunk(3, dim=-1)
            r = sigmoid(xr + hr)
            z = sigmoid(xz + hz)
            n = tanh(xn + r * hn)  # torch's reset gate applies to (W_hn h + b_hn)
            h_new = n + z * (h - n)  # = (1 - z) * n + z * h
            ws = cat([r, z, n, hn], -1)
        else:
            assert pre is not None
            h_new = tanh(pre) if mode == "RNN_TANH" else relu(pre)
            ws = 1 - h_new * h_new if mode == "RNN_TANH" else (h_new > 0).to(h_new.dtype)
        if masks is None:
            h, c, ys[t] = h_new, c_new, h_new
        else:
            m = masks[t]
            h = where(m, h_new, h)
            c = where(m, c_new, c) if c_new is not None else None
            ys[t] = where(m, h_new, 0.0)
        wss[t] = ws
    outs = [stack(ys, 0), h]
    if mode == "LSTM":
        outs.append(c)
    outs.append(stack(wss, 0))
    return tuple(outs)


# -- backward ---------------------------------------------------------------------------------------------------------
def _backward_spec(x: TensorSpec, h0: TensorSpec, c0: Any, w_ih: TensorSpec, w_hh: TensorSpec, w_hr: Any,
                   y: TensorSpec, ws: TensorSpec, dy: TensorSpec, dhn: TensorSpec, dcn: Any, *, mode: str,
                   reverse: bool = False, batch_sizes: tuple[int, ...] | None = None) -> tuple[TensorSpec, ...]:
    op = "rnn_layer_backward"
    steps, batch, hidden, size = _dims(op, x, h0, c0, w_ih, w_hh, None, None, w_hr, mode, batch_sizes)
    want = {"y": (y, (steps, batch, size)), "dy": (dy, (steps, batch, size)), "dhn": (dhn, (batch, size)),
            "ws": (ws, (steps, batch, WORKSPACE[mode] * hidden))}
    if mode == "LSTM":
        want["dcn"] = (dcn, (batch, hidden))
    for name, (spec, shape) in want.items():
        if not isinstance(spec, TensorSpec) or spec.shape != shape or spec.dtype is not x.dtype:
            raise ShapeError(f"{op}: expected {name} of shape {shape} and dtype {x.dtype.name}, got "
                             f"{getattr(spec, 'shape', spec)!r}")
    d = x.dtype
    out = [TensorSpec(x.shape, d), TensorSpec(h0.shape, d), TensorSpec(w_ih.shape, d), TensorSpec(w_hh.shape, d),
           TensorSpec((w_ih.shape[0],), d), TensorSpec((w_ih.shape[0],), d)]
    if mode == "LSTM":
        out.append(TensorSpec(c0.shape, d))
    if w_hr is not None:
        out.append(TensorSpec(w_hr.shape, d))
    return tuple(out)


def _prev_states(seq: Tensor, first: Tensor, masks: list[Tensor] | None, reverse: bool) -> Tensor:
    """(T, B, S): the state each step starts from -- ``first`` for the first step processed, the previous
    processed step's value otherwise (``first`` again for a packed row that was not active there)."""
    steps = seq.shape[0]
    prev: list[Any] = [None] * steps
    order = list(_order(steps, reverse))
    for k, t in enumerate(order):
        if k == 0:
            prev[t] = first
        else:
            p = order[k - 1]
            prev[t] = seq[p] if masks is None else where(masks[p], seq[p], first)
    return stack(prev, 0)


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])


@backend_extension("nn.rnn_layer_backward", output=_backward_spec, publish=False,
                   description="backpropagation through time of one recurrent layer direction")
def rnn_layer_backward(x: Tensor, h0: Tensor, c0: Tensor | None, w_ih: Tensor, w_hh: Tensor, w_hr: Tensor | None,
                       y: Tensor, ws: Tensor, dy: Tensor, dhn: Tensor, dcn: Tensor | None, *, mode: str,
                       reverse: bool = False, batch_sizes: tuple[int, ...] | None = None) -> tuple[Tensor, ...]:
    """Gradients of :func:`rnn_layer` from its outputs' gradients, in one pass backwards through time.

    Takes the forward's inputs (no biases: they do not enter the backward), its outputs ``y`` and workspace
    ``ws``, and the gradients ``dy``, ``dhn`` and (LSTM) ``dcn``. Returns (dx, dh0, dw_ih, dw_hh, db_ih, db_hh),
    then dc0 for LSTM and dw_hr with a projection.
    """
    steps, batch = x.shape[0], x.shape[1]
    hidden = ws.shape[-1] // WORKSPACE[mode]
    masks = _masks(batch_sizes, batch, x)
    h_prev = _prev_states(y, h0, masks, reverse)
    c_prev = _prev_states(ws[..., 4 * hidden:], c0, masks, reverse) if mode == "LSTM" else None
    dh, dc = dhn, dcn
    d_xg: list[Any] = [None] * steps  # gradient of each step's input pre-activations
    d_hg: list[Any] = [None] * steps  # ... and of its recurrent ones (they differ for GRU only)
    dw_hr = None
    for t in reversed(list(_order(steps, reverse))):
        m = masks[t] if masks is not None else None
        gh = dh + dy[t]
        if m is not None:  # inactive rows: their carried gradient belongs to another step
            gh = where(m, gh, 0.0)
        if mode == "LSTM":
            assert dc is not None and c_prev is not None
            i, f, g, o, cc = ws[t].chunk(5, dim=-1)
            tc = tanh(cc)
            if w_hr is not None:
                contrib = gh.T @ (o * tc)
                dw_hr = contrib if dw_hr is None else dw_hr + contrib
                dm = gh @ w_hr
            else:
                dm = gh
            dc_in = dc if m is None else where(m, dc, 0.0)
            dct = dc_in + dm * o * (1 - tc * tc)
            da = cat([dct * g * i * (1 - i), dct * c_prev[t] * f * (1 - f), dct * i * (1 - g * g),
                      dm * tc * o * (1 - o)], -1)
            d_xg[t] = d_hg[t] = da
            dh_new = da @ w_hh
            dc_new = dct * f
            dc = dc_new if m is None else where(m, dc_new, dc)
        elif mode == "GRU":
            r, z, n, hn = ws[t].chunk(4, dim=-1)
            da_n = gh * (1 - z) * (1 - n * n)
            da_z = gh * (h_prev[t] - n) * z * (1 - z)
            da_r = da_n * hn * r * (1 - r)
            d_xg[t] = cat([da_r, da_z, da_n], -1)
            d_hg[t] = cat([da_r, da_z, da_n * r], -1)
            dh_new = gh * z + d_hg[t] @ w_hh
        else:
            da = gh * ws[t]
            d_xg[t] = d_hg[t] = da
            dh_new = da @ w_hh
        dh = dh_new if m is None else where(m, dh_new, dh)
    dxg, dhg = stack(d_xg, 0), stack(d_hg, 0)
    dxg2, dhg2 = _flat(dxg), _flat(dhg)
    dx = dxg @ w_ih
    out = [dx, dh, dxg2.T @ _flat(x), dhg2.T @ _flat(h_prev), dxg2.sum(0), dhg2.sum(0)]
    if mode == "LSTM":
        out.append(dc)
    if w_hr is not None:
        if dw_hr is None:  # no step ran: zero gradient of w_hr's shape
            dw_hr = w_hr * 0
        out.append(dw_hr)
    return tuple(out)


@rnn_layer.vjp(outputs=(0, -1))  # reads y and the workspace: h_n and c_n may be modified in place
def _rnn_layer_vjp(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = ctx.inputs
    mode = ctx.kwargs["mode"]
    y, ws = ctx.outputs[0], ctx.outputs[-1]
    dy, dhn = grads[0], grads[1]
    dcn = grads[2] if mode == "LSTM" else None
    res = rnn_layer_backward(x, h0, c0, w_ih, w_hh, w_hr, y, ws, dy, dhn, dcn, **ctx.kwargs)
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh = res[:6]
    dc0 = res[6] if mode == "LSTM" else None
    dw_hr = res[-1] if w_hr is not None else None
    has_bias = b_ih is not None
    return (dx, dh0, dc0, dw_ih, dw_hh, db_ih if has_bias else None, db_hh if has_bias else None, dw_hr)


def run_layer(x: Tensor, h0: Tensor, c0: Tensor | None, weights: Sequence[Tensor | None], *, mode: str,
              reverse: bool, batch_sizes: tuple[int, ...] | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """One layer direction through :func:`rnn_layer`: returns (y, h_n, c_n or None)."""
    if _AMP.kinds is not None:  # autocast (ember.amp.policy: "rnn_<mode>"): one thread-local read when off
        return _amp_run(f"rnn_{mode}", run_layer, x, h0, c0, weights, mode=mode, reverse=reverse,
                        batch_sizes=batch_sizes)
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    out = rnn_layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode=mode, reverse=reverse, batch_sizes=batch_sizes)
    return out[0], out[1], (out[2] if mode == "LSTM" else None)
