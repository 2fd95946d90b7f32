"""``ember.nn.utils.rnn``: packed variable-length sequences, with torch's names, layouts and errors.

A :class:`PackedSequence` holds a batch of sequences sorted by decreasing length, time step by time step:
``data`` is (sum(lengths), *) -- the rows of step 0 (every sequence), then those of step 1 (the sequences at least
2 long), ...; ``batch_sizes`` (an int64 tensor on the host device) says how many rows each step has;
``sorted_indices`` / ``unsorted_indices`` map between the caller's batch order and the sorted one (None when the
input was sorted already). ``nn.LSTM``/``GRU``/``RNN`` take one and return one, their final states taken at each
sequence's own length.

Packing and unpacking are index gathers (``index_select``), so gradients flow through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ... import dtypes as dt
from ...errors import DeviceError, DTypeError, ShapeError, ValueRangeError
from ...tensor import Tensor

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "pack_sequence", "unpack_sequence", "unpad_sequence"]


class PackedSequence(NamedTuple):
    """A packed batch of variable-length sequences (torch's ``nn.utils.rnn.PackedSequence``): ``data``,
    ``batch_sizes``, ``sorted_indices``, ``unsorted_indices``. Build it with :func:`pack_padded_sequence` or
    :func:`pack_sequence`, not by hand."""

    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None = None
    unsorted_indices: Tensor | None = None

    def to(self, *args: Any, **kwargs: Any) -> PackedSequence:
        """``data`` (and the index tensors) moved / cast like ``Tensor.to``; ``batch_sizes`` stays on the host."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        dev = data.device

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dev)

        return PackedSequence(data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices))

    def cpu(self) -> PackedSequence:
        """The packed sequence with ``data`` on the host device."""
        return self.to("cpu")

    @property
    def is_cuda(self) -> bool:
        """False: ember names no CUDA devices here (torch compatibility)."""
        return False

    def is_pinned(self) -> bool:
        """False (torch compatibility: ember has no pinned memory)."""
        return False


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The inverse of a permutation of ``range(n)`` (None stays None)."""
    if permutation is None:
        return None
    from ...ops.creation import tensor

    perm = permutation.numpy()
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    return tensor(inv, dtype=dt.int64, device=permutation.device)


def _host_ints(op: str, name: str, values: Any) -> np.ndarray:
    """``lengths`` as a 1-D int64 numpy array; a tensor must be 1-D, integer, and on the host device (torch
    requires a CPU tensor: the packing layout is computed on the host)."""
    from ...device import Device

    if isinstance(values, Tensor):
        if values.device.base != Device.host().base:
            raise DeviceError(f"{op}: '{name}' argument should be a 1D CPU int64 tensor, but got a tensor on "
                              f"{values.device} (pass a list, or move it with .cpu())")
        if not values._dtype.is_integer:
            raise DTypeError(f"{op}: '{name}' must be integers, got dtype {values._dtype.name}")
        arr = values.numpy()
    else:
        try:
            arr = np.asarray(values)
        except Exception as exc:  # noqa: BLE001 - anything that is no sequence of ints
            raise DTypeError(f"{op}: '{name}' must be a list or 1-D tensor of ints, got {values!r}") from exc
        if arr.size and arr.dtype.kind not in "iu":
            raise DTypeError(f"{op}: '{name}' must be a list or 1-D tensor of ints, got {values!r}")
    if arr.ndim != 1:
        raise ShapeError(f"{op}: '{name}' must be 1-D, got shape {tuple(arr.shape)}")
    return arr.astype(np.int64)


def _layout(batch_sizes: np.ndarray, batch: int) -> np.ndarray:
    """For each packed row, its position in the flattened (T * batch) padded layout, in packed order."""
    return np.concatenate([t * batch + np.arange(n, dtype=np.int64) for t, n in enumerate(batch_sizes)]) \
        if batch_sizes.size else np.zeros(0, np.int64)


def _index(values: np.ndarray, like: Tensor) -> Tensor:
    from ...ops.creation import tensor

    return tensor(values, dtype=dt.int64, device=like.device)


def pack_padded_sequence(input: Tensor, lengths: Any, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch of variable-length sequences (torch's ``pack_padded_sequence``).

    Args:
        input: (T, B, *) padded sequences ((B, T, *) with ``batch_first``).
        lengths: each sequence's length (a list, or a 1-D integer tensor on the host device), all > 0.
        batch_first: the batch is input's first dim.
        enforce_sorted: lengths must be in decreasing order; with False the batch is sorted here and the
            permutation kept in ``sorted_indices`` / ``unsorted_indices``.
    """
    op = "pack_padded_sequence"
    if not isinstance(input, Tensor):
        raise DTypeError(f"{op}: expected input to be a Tensor, got {type(input).__name__}")
    if input.ndim < 2:
        raise ShapeError(f"{op}: expected input of at least 2 dims (T, B, *), got shape {input.shape}")
    lens = _host_ints(op, "lengths", lengths)
    if input.shape[0 if batch_first else 1] != lens.size:
        raise ShapeError(f"{op}: expected {input.shape[0 if batch_first else 1]} lengths (the batch size of input "
                         f"of shape {input.shape}), got {lens.size}")
    if lens.size and lens.min() <= 0:
        raise ValueRangeError(f"{op}: Length of all samples has to be greater than 0, but found an element in "
                              f"'lengths' that is <= 0 (lengths {lens.tolist()})")
    steps = input.shape[1 if batch_first else 0]
    if lens.size and lens.max() > steps:
        raise ValueRangeError(f"{op}: a length ({int(lens.max())}) exceeds the input's sequence length {steps} "
                              f"(input shape {input.shape})")
    if enforce_sorted:
        if np.any(lens[1:] > lens[:-1]):
            raise ValueRangeError(f"{op}: `lengths` array must be sorted in decreasing order when `enforce_sorted` "
                                  f"is True (got {lens.tolist()}). You can pass `enforce_sorted=False` to "
                                  "pack_padded_sequence and/or pack_sequence to sidestep this requirement if you do "
                                  "not need ONNX exportability.")
        sorted_indices = None
    else:
        order = np.argsort(-lens, kind="stable")
        lens = lens[order]
        sorted_indices = _index(order, input)
        input = input.index_select(0 if batch_first else 1, sorted_indices)
    if batch_first:
        input = input.transpose(0, 1)
    max_len = int(lens[0]) if lens.size else 0
    batch_sizes = (lens[None, :] > np.arange(max_len)[:, None]).sum(1).astype(np.int64)
    batch = input.shape[1]
    flat = input[:max_len].reshape(max_len * batch, *input.shape[2:])
    data = flat.index_select(0, _index(_layout(batch_sizes, batch), input))
    from ...ops.creation import tensor

    return PackedSequence(data, tensor(batch_sizes, dtype=dt.int64, device="cpu"), sorted_indices,
                          invert_permutation(sorted_indices))


def _check_packed(op: str, sequence: Any) -> np.ndarray:
    if not isinstance(sequence, PackedSequence):
        raise DTypeError(f"{op}: expected a PackedSequence, got {type(sequence).__name__}")
    bs = sequence.batch_sizes.numpy().astype(np.int64)
    if bs.ndim != 1 or (bs.size and (bs.min() <= 0 or np.any(bs[1:] > bs[:-1]))) or \
            int(bs.sum()) != sequence.data.shape[0]:
        raise ShapeError(f"{op}: batch_sizes {bs.tolist()} do not describe data of shape {sequence.data.shape} "
                         "(positive, non-increasing, summing to data.shape[0])")
    return bs


def _padded(data: Tensor, batch_sizes: np.ndarray, steps: int, padding_value: float) -> Tensor:
    """(steps, B, *) in sorted order from packed ``data``, ``padding_value`` elsewhere."""
    from ...ops.creation import full
    from ...ops.shape import cat

    batch = int(batch_sizes[0]) if batch_sizes.size else 0
    feat = tuple(data.shape[1:])
    src = np.full(steps * batch, data.shape[0], dtype=np.int64)  # the padding row, appended below
    src[_layout(batch_sizes, batch)] = np.arange(data.shape[0], dtype=np.int64)
    ext = cat([data, full((1, *feat), padding_value, dtype=data.dtype, device=data.device)], 0)
    return ext.index_select(0, _index(src, data)).reshape(steps, batch, *feat)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """Unpack a :class:`PackedSequence` into (padded, lengths) (torch's ``pad_packed_sequence``): padded is
    (T, B, *) ((B, T, *) with ``batch_first``) in the original batch order, T = ``total_length`` or the longest
    length; lengths an int64 tensor on the host device."""
    op = "pad_packed_sequence"
    bs = _check_packed(op, sequence)
    max_len = int(bs.size)
    if total_length is not None:
        if total_length < max_len:
            raise ValueRangeError(f"{op}: Expected total_length to be at least the length of the longest sequence "
                                  f"in input, but got total_length={total_length} and max sequence length being "
                                  f"{max_len}")
        max_len = int(total_length)
    batch = int(bs[0]) if bs.size else 0
    out = _padded(sequence.data, bs, max_len, padding_value)
    lens = (bs[None, :] > np.arange(batch)[:, None]).sum(1).astype(np.int64)
    if sequence.unsorted_indices is not None:
        out = out.index_select(1, sequence.unsorted_indices)
        lens = lens[sequence.unsorted_indices.numpy()]
    if batch_first:
        out = out.transpose(0, 1)
    from ...ops.creation import tensor

    return out, tensor(lens, dtype=dt.int64, device="cpu")


def pad_sequence(sequences: Sequence[Tensor] | Tensor, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of shape (L_i, *) into (max L, B, *) ((B, max L, *) with ``batch_first``), padding with
    ``padding_value`` on the right (or the left: ``padding_side="left"``), as torch's ``pad_sequence``."""
    from ...ops.creation import full
    from ...ops.shape import cat, stack

    op = "pad_sequence"
    if padding_side not in ("left", "right"):
        raise ValueRangeError(f"{op}: Expected padding_side to be one of left or right, but got {padding_side}.")
    seqs = list(sequences.unbind(0)) if isinstance(sequences, Tensor) else list(sequences)
    if not seqs:
        raise ValueRangeError(f"{op}: received an empty list of sequences")
    for s in seqs:
        if not isinstance(s, Tensor):
            raise DTypeError(f"{op}: expected a list of Tensors, got {type(s).__name__}")
        if s.ndim < 1 or tuple(s.shape[1:]) != tuple(seqs[0].shape[1:]):
            raise ShapeError(f"{op}: every sequence must be (L, *) with the same trailing dims, got shapes "
                             f"{[tuple(t.shape) for t in seqs]}")
        if s._dtype is not seqs[0]._dtype or s.device != seqs[0].device:
            raise DTypeError(f"{op}: every sequence must share one dtype and device, got "
                             f"{[(t.dtype.name, str(t.device)) for t in seqs]}")
    longest = max(s.shape[0] for s in seqs)
    feat = tuple(seqs[0].shape[1:])
    rows = []
    for s in seqs:
        missing = longest - s.shape[0]
        if missing:
            pad = full((missing, *feat), padding_value, dtype=s.dtype, device=s.device)
            s = cat([s, pad] if padding_side == "right" else [pad, s], 0)
        rows.append(s)
    return stack(rows, 0 if batch_first else 1)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of (L_i, *) tensors (torch's ``pack_sequence``): ``pad_sequence`` then
    ``pack_padded_sequence``."""
    lengths = [int(s.shape[0]) if isinstance(s, Tensor) and s.ndim else 0 for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of (L_i, *) tensors in a :class:`PackedSequence`, in the original order (``pack_sequence``'s
    inverse)."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


def unpad_sequence(padded_sequences: Tensor, lengths: Any, batch_first: bool = False) -> list[Tensor]:
    """Split a padded batch (T, B, *) ((B, T, *) with ``batch_first``) into its (L_i, *) sequences
    (``pad_sequence``'s inverse)."""
    op = "unpad_sequence"
    if not isinstance(padded_sequences, Tensor) or padded_sequences.ndim < 2:
        raise ShapeError(f"{op}: expected a padded (T, B, *) tensor, got {padded_sequences!r}")
    lens = _host_ints(op, "lengths", lengths)
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    if lens.size != x.shape[0] or (lens.size and (lens.min() < 0 or lens.max() > x.shape[1])):
        raise ShapeError(f"{op}: lengths {lens.tolist()} do not fit padded sequences of shape "
                         f"{padded_sequences.shape} (batch_first={batch_first})")
    return [x[i, :int(n)] for i, n in enumerate(lens)]


def packed_to_padded(sequence: PackedSequence) -> tuple[Tensor, tuple[int, ...]]:
    """(the (T, B, *) zero-padded batch in sorted order, batch_sizes as a tuple): what the recurrent layers run on."""
    bs = _check_packed("PackedSequence", sequence)
    return _padded(sequence.data, bs, int(bs.size), 0.0), tuple(int(b) for b in bs)


def padded_to_packed(padded: Tensor, batch_sizes: tuple[int, ...]) -> Tensor:
    """The packed ``data`` of a (T, B, *) padded batch with these batch sizes (:func:`packed_to_padded`'s
    inverse)."""
    steps, batch = padded.shape[0], padded.shape[1]
    flat = padded.reshape(steps * batch, *padded.shape[2:])
    return flat.index_select(0, _index(_layout(np.asarray(batch_sizes, np.int64), batch), padded))
