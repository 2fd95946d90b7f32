"""Recurrent layers with torch's parameter names, gate order, initialisation and shapes: RNN, LSTM, GRU and
their single-step cells.

Each layer direction is one op, ``ember.ops.recurrent.rnn_layer`` (the whole time loop; its backward one op
too), so a backend with a kernel for it runs a layer in one call; elsewhere its composition runs the per-step
ember code. The cells are that op over a one-step sequence. The layers take padded input or a
``nn.utils.rnn.PackedSequence``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ...errors import DTypeError, ShapeError, ValueRangeError
from ...ops.creation import zeros
from ...ops.recurrent import run_layer
from ...ops.shape import cat, stack
from ...tensor import Tensor
from .. import functional as F
from ..module import Module, Parameter
from ..utils.rnn import PackedSequence, packed_to_padded, padded_to_packed
from ._common import check_input, check_positive_int, check_prob, uniform_param

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class RNNBase(Module):
    """Shared machinery of RNN, LSTM and GRU (torch's ``nn.RNNBase``)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        cls = type(self).__name__ if type(self) is not RNNBase else mode.split("_")[0]
        if mode not in _GATES:
            raise ValueRangeError(f"{cls}: unknown RNN mode {mode!r}; expected one of {sorted(_GATES)}")
        self.mode = mode
        self.input_size = check_positive_int(cls, "input_size", input_size, allow_zero=True)
        self.hidden_size = check_positive_int(cls, "hidden_size", hidden_size)
        self.num_layers = check_positive_int(cls, "num_layers", num_layers)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = check_prob(cls, "dropout", dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = check_positive_int(cls, "proj_size", proj_size, allow_zero=True)
        if proj_size and mode != "LSTM":
            raise ValueRangeError(f"{cls}: proj_size argument is only supported for LSTM, not RNN or GRU")
        if proj_size >= hidden_size:
            raise ValueRangeError(f"{cls}: proj_size has to be smaller than hidden_size, got proj_size={proj_size} "
                                  f"and hidden_size={hidden_size}")
        if self.dropout > 0 and num_layers == 1:
            warnings.warn(f"{cls}: dropout option adds dropout after all but last recurrent layer, so non-zero "
                          f"dropout expects num_layers greater than 1, but got dropout={dropout} and "
                          f"num_layers={num_layers}", UserWarning, stacklevel=2)
        gate = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        d = 2 if bidirectional else 1
        stdv = 1.0 / math.sqrt(hidden_size)
        names: list[str] = []
        for layer in range(num_layers):
            for direction in range(d):
                layer_in = input_size if layer == 0 else real_hidden * d
                sfx = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes = [(f"weight_ih{sfx}", (gate, layer_in)), (f"weight_hh{sfx}", (gate, real_hidden))]
                if bias:
                    shapes += [(f"bias_ih{sfx}", (gate,)), (f"bias_hh{sfx}", (gate,))]
                if proj_size > 0:
                    shapes.append((f"weight_hr{sfx}", (proj_size, hidden_size)))
                for name, shape in shapes:
                    # torch initialises every weight and bias from U(-1/sqrt(hidden), 1/sqrt(hidden))
                    setattr(self, name, uniform_param(shape, stdv, device, dtype))
                    names.append(name)
        self._flat_weights_names = names

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """Parameters grouped per layer and direction, in torch's order."""
        per = 2 + 2 * self.bias + (self.proj_size > 0)
        flat = [self._parameters[n] for n in self._flat_weights_names]
        return [flat[i:i + per] for i in range(0, len(flat), per)]  # type: ignore[misc]

    def flatten_parameters(self) -> None:
        """No-op kept for torch compatibility (cuDNN weight packing)."""

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        if self.mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        return s

    # -- forward -----------------------------------------------------------------------------------------------
    def _weights(self, layer: int, direction: int) -> tuple[Any, ...]:
        sfx = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        p = self._parameters
        return (p[f"weight_ih{sfx}"], p[f"weight_hh{sfx}"], p.get(f"bias_ih{sfx}"), p.get(f"bias_hh{sfx}"),
                p.get(f"weight_hr{sfx}"))

    def _prepare(self, input: Any) -> tuple[Tensor, bool]:
        cls = type(self).__name__
        check_input(cls, "input", input)
        if input.ndim not in (2, 3):
            raise ShapeError(f"{cls}: expected input to be 2-D (seq, input_size) or 3-D (seq, batch, input_size; "
                             f"batch first with batch_first=True), got {input.ndim}-D shape {input.shape}")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"{cls}: input.size(-1) must be equal to input_size, expected {self.input_size}, got "
                             f"{input.shape[-1]} (input shape {input.shape})")
        batched = input.ndim == 3
        x = input.transpose(0, 1) if (batched and self.batch_first) else input
        if not batched:
            x = x.unsqueeze(1)
        if x.shape[0] == 0:
            raise ShapeError(f"{cls}: expected a sequence length larger than 0, got input shape {input.shape}")
        return x, batched

    def _state(self, name: str, hx: Any, x: Tensor, batched: bool, size: int) -> Tensor:
        """The given initial state (checked) or zeros, as (layers * directions, batch, size)."""
        cls = type(self).__name__
        d = 2 if self.bidirectional else 1
        n = x.shape[1]
        want = (self.num_layers * d, n, size)
        if hx is None:
            return zeros(want, dtype=x._dtype, device=x._device)
        if not isinstance(hx, Tensor):
            raise DTypeError(f"{cls}: expected {name} to be a Tensor, got {type(hx).__name__}")
        if hx._dtype is not x._dtype:
            raise DTypeError(f"{cls}: {name} dtype {hx._dtype.name} does not match input dtype {x._dtype.name}")
        if batched and hx.ndim != 3:
            raise ShapeError(f"{cls}: for batched 3-D input, {name} should also be 3-D but got {hx.ndim}-D "
                             f"shape {hx.shape}")
        if not batched and hx.ndim != 2:
            raise ShapeError(f"{cls}: for unbatched 2-D input, {name} should also be 2-D but got {hx.ndim}-D "
                             f"shape {hx.shape}")
        h = hx if batched else hx.unsqueeze(1)
        if tuple(h.shape) != want:
            shown = want if batched else (want[0], want[2])
            raise ShapeError(f"{cls}: expected {name} of size {shown}, got {tuple(hx.shape)}")
        return h

    def _run(self, x: Tensor, h0: Tensor, c0: Tensor | None,
             batch_sizes: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """All layers and directions: each layer direction is one ``rnn_layer`` op (the whole time loop, one
        kernel where the backend has one); inter-layer dropout in training as torch."""
        d = 2 if self.bidirectional else 1
        h0s, c0s = h0.unbind(0), (c0.unbind(0) if c0 is not None else None)
        hn: list[Tensor] = []
        cn: list[Tensor] = []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for direction in range(d):
                idx = layer * d + direction
                y, h, c = run_layer(layer_in, h0s[idx], c0s[idx] if c0s is not None else None,
                                    self._weights(layer, direction), mode=self.mode, reverse=direction == 1,
                                    batch_sizes=batch_sizes)
                outs.append(y)
                hn.append(h)
                if c is not None:
                    cn.append(c)
            layer_in = outs[0] if d == 1 else cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        return layer_in, stack(hn, 0), (stack(cn, 0) if cn else None)

    def _finish(self, out: Tensor, batched: bool) -> Tensor:
        if not batched:
            return out.squeeze(1)
        return out.transpose(0, 1) if self.batch_first else out

    def _forward(self, input: Any, h_in: Any, c_in: Any, h_name: str) -> tuple[Any, Tensor, Tensor | None]:
        """The shared forward: a padded (or unbatched) input, or a PackedSequence (then the output is packed
        too, and the states are in the caller's batch order). Returns (output, h_n, c_n or None)."""
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        lstm = self.mode == "LSTM"
        if not isinstance(input, PackedSequence):
            x, batched = self._prepare(input)
            h0 = self._state(h_name, h_in, x, batched, real_hidden)
            c0 = self._state("c_0", c_in, x, batched, self.hidden_size) if lstm else None
            out, hn, cn = self._run(x, h0, c0)
            if not batched:
                hn, cn = hn.squeeze(1), (cn.squeeze(1) if cn is not None else None)
            return self._finish(out, batched), hn, cn
        cls = type(self).__name__
        data = check_input(cls, "input", input.data)
        if data.ndim != 2 or data.shape[-1] != self.input_size:
            raise ShapeError(f"{cls}: packed input data must be 2-D (total steps, input_size={self.input_size}), "
                             f"got shape {data.shape}")
        x, batch_sizes = packed_to_padded(input)
        sorted_idx, unsorted_idx = input.sorted_indices, input.unsorted_indices

        def permute(h: Any, idx: Any) -> Any:  # torch's permute_hidden: states follow the sorted batch order
            return h.index_select(1, idx) if isinstance(h, Tensor) and idx is not None else h

        h0 = self._state(h_name, permute(h_in, sorted_idx), x, True, real_hidden)
        c0 = self._state("c_0", permute(c_in, sorted_idx), x, True, self.hidden_size) if lstm else None
        out, hn, cn = self._run(x, h0, c0, batch_sizes)
        packed = PackedSequence(padded_to_packed(out, batch_sizes), input.batch_sizes, sorted_idx, unsorted_idx)
        return packed, permute(hn, unsorted_idx), permute(cn, unsorted_idx)


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueRangeError(f"RNN: unknown nonlinearity {nonlinearity!r}; select from 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype)

    def forward(self, input: Tensor | PackedSequence, hx: Tensor | None = None) -> tuple[Any, Tensor]:
        """Run the layers over ``input`` (padded or a PackedSequence); returns (output, h_n)."""
        out, hn, _ = self._forward(input, hx, None, "hx")
        return out, hn


class LSTM(RNNBase):
    """Long short-term memory; gates (input, forget, cell, output) in torch's order; optional ``proj_size``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)

    def forward(self, input: Tensor | PackedSequence,
                hx: tuple[Tensor, Tensor] | None = None) -> tuple[Any, tuple[Tensor, Tensor]]:
        """Run the layers over ``input`` (padded or a PackedSequence); returns (output, (h_n, c_n))."""
        if hx is None:
            h_in = c_in = None
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            h_in, c_in = hx
        else:
            raise DTypeError(f"LSTM: expected hx to be a tuple (h_0, c_0) of two tensors, got "
                             f"{type(hx).__name__}")
        out, hn, cn = self._forward(input, h_in, c_in, "h_0")
        assert cn is not None
        return out, (hn, cn)


class GRU(RNNBase):
    """Gated recurrent unit; gates (reset, update, new) in torch's order, ``n = tanh(W_in x + b_in + r * (W_hn h +
    b_hn))``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0,
                         device, dtype)

    def forward(self, input: Tensor | PackedSequence, hx: Tensor | None = None) -> tuple[Any, Tensor]:
        """Run the layers over ``input`` (padded or a PackedSequence); returns (output, h_n)."""
        out, hn, _ = self._forward(input, hx, None, "hx")
        return out, hn


# -- cells ----------------------------------------------------------------------------------------------------------
class RNNCellBase(Module):
    """Shared parameters of the single-step cells: weight_ih, weight_hh, bias_ih, bias_hh."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        cls = type(self).__name__
        self.input_size = check_positive_int(cls, "input_size", input_size, allow_zero=True)
        self.hidden_size = check_positive_int(cls, "hidden_size", hidden_size)
        self.bias = bool(bias)
        stdv = 1.0 / math.sqrt(hidden_size)
        g = num_chunks * hidden_size
        self.weight_ih = uniform_param((g, input_size), stdv, device, dtype)
        self.weight_hh = uniform_param((g, hidden_size), stdv, device, dtype)
        if bias:
            self.bias_ih = uniform_param((g,), stdv, device, dtype)
            self.bias_hh = uniform_param((g,), stdv, device, dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        return s

    def _prepare(self, input: Any) -> tuple[Tensor, bool]:
        cls = type(self).__name__
        check_input(cls, "input", input)
        if input.ndim not in (1, 2):
            raise ShapeError(f"{cls}: expected input to be 1-D (input_size,) or 2-D (batch, input_size), got "
                             f"{input.ndim}-D shape {input.shape}")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"{cls}: input has {input.shape[-1]} features (shape {input.shape}) but input_size="
                             f"{self.input_size}")
        batched = input.ndim == 2
        return (input if batched else input.unsqueeze(0)), batched

    def _step(self, mode: str, x: Tensor, h: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One step as the recurrent layer op over a one-step sequence (one kernel where the backend has one)."""
        _, h, c = run_layer(x.unsqueeze(0), h, c, (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, None),
                            mode=mode, reverse=False, batch_sizes=None)
        return h, c

    def _state(self, name: str, hx: Any, x: Tensor, batched: bool) -> Tensor:
        cls = type(self).__name__
        want = (x.shape[0], self.hidden_size)
        if hx is None:
            return zeros(want, dtype=x._dtype, device=x._device)
        if not isinstance(hx, Tensor):
            raise DTypeError(f"{cls}: expected {name} to be a Tensor, got {type(hx).__name__}")
        if hx._dtype is not x._dtype:
            raise DTypeError(f"{cls}: {name} dtype {hx._dtype.name} does not match input dtype {x._dtype.name}")
        h = hx if batched else (hx.unsqueeze(0) if hx.ndim == 1 else hx)
        if tuple(h.shape) != want or hx.ndim != (2 if batched else 1):
            shown = want if batched else (self.hidden_size,)
            raise ShapeError(f"{cls}: expected {name} of shape {shown}, got {tuple(hx.shape)}")
        return h


class RNNCell(RNNCellBase):
    """One Elman RNN step: ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueRangeError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; select from 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, batched = self._prepare(input)
        h = self._state("hx", hx, x, batched)
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        h = self._step(mode, x, h, None)[0]
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step; returns ``(h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        x, batched = self._prepare(input)
        if hx is None:
            h_in = c_in = None
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            h_in, c_in = hx
        else:
            raise DTypeError(f"LSTMCell: expected hx to be a tuple (h_0, c_0) of two tensors, got "
                             f"{type(hx).__name__}")
        h = self._state("h_0", h_in, x, batched)
        c = self._state("c_0", c_in, x, batched)
        h, c = self._step("LSTM", x, h, c)
        assert c is not None
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, batched = self._prepare(input)
        h = self._state("hx", hx, x, batched)
        h = self._step("GRU", x, h, None)[0]
        return h if batched else h.squeeze(0)


__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
