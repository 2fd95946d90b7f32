"""The messages a router sends through a channel: plain, picklable data (no handles, no backend objects).

Ids name tensors on the channel's side. The router allocates positive ids for the values it records; the channel
allocates negative ids for handles it returns from a :class:`Call` (gradients, detached tensors, ...).

A graph is registered once (:class:`Register`: the *relative form* key of :func:`ember.ir.relative_form`, whose
body entries are ``(op, input positions, shapes, dtypes, args)`` with positions ``("in", k)`` for the k-th external
value and ``("v", n)`` for the n-th value computed in the graph) and replayed by id (:class:`Replay`: the concrete
tensor ids of the external inputs, the ids to give the wanted outputs, and the bindings -- dims and scalars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ember.ir import Bindings


class SliceArg(NamedTuple):
    """A ``slice`` inside recorded arguments (getitem keys): slices are unhashable before Python 3.12, and a
    graph's relative form is a dict key."""

    start: Any
    stop: Any
    step: Any
    tag: str = "slice"

    def to_slice(self) -> slice:
        return slice(self.start, self.stop, self.step)


@dataclass(frozen=True)
class Register:
    """Register graph ``graph_id``: ``key`` is its relative form (see the module docstring)."""

    graph_id: int
    key: tuple[Any, ...]


@dataclass(frozen=True)
class Replay:
    """Run registered graph ``graph_id`` on tensors ``inputs``; store its wanted outputs as ``outputs``; then free
    ``release`` (ids whose handles the router dropped). ``grad_enabled`` is the grad mode the ops were recorded
    under (None: the channel's device does not record gradients)."""

    graph_id: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    bindings: Bindings
    release: tuple[int, ...] = ()
    grad_enabled: bool | None = None


@dataclass(frozen=True)
class Upload:
    """Store host data as tensor ``id`` (``from_numpy``)."""

    id: int
    array: np.ndarray


@dataclass(frozen=True)
class Download:
    """Reply with tensor ``id``'s data as a numpy array (``to_numpy``)."""

    id: int


@dataclass(frozen=True)
class Release:
    """Free the tensors ``ids``."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class Call:
    """Call ``method`` of the channel's stack at once (a method without a shape rule, the gradient API): ``args``
    hold :class:`ember.ir.Ref` ``(k)`` for tensor ``inputs[k]``. The reply is the result with every handle replaced
    by :class:`Out` (a new negative id)."""

    method: str
    inputs: tuple[int, ...]
    args: tuple[Any, ...]
    grad_enabled: bool | None = None


@dataclass(frozen=True)
class Out:
    """A handle in a :class:`Call` reply: its new id, shape and dtype."""

    id: int
    shape: tuple[int, ...]
    dtype: Any


@dataclass(frozen=True)
class Seed:
    """Reseed the channel device's random stream."""

    seed: int


@dataclass(frozen=True)
class Sync:
    """Wait until the channel's queued work is done."""


@dataclass(frozen=True)
class Strides:
    """The strides of tensor ``id`` on the channel's side, as its backend reports them (bytes, numpy's convention),
    or None: the reply. Core checks them before ``view()`` and writes through an index (a broadcast view is
    refused); a router asks once per handle, on channels that are not local."""

    id: int


Message = Register | Replay | Upload | Download | Release | Call | Seed | Sync | Strides
