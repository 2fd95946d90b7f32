"""The lazy graph: handles user tensors hold, and the nodes they point to.

A :class:`FArray` is what a fused device's tensors hold. It points to a :class:`Node`; a node is either
*realized* (``value`` holds the inner backend's handle) or *pending* (``op``, ``args`` and ``srcs`` say how to
compute it). A node keeps only a weak reference to its handle, so "is anything outside the graph still able to read
this value?" is ``node.handle() is not None``: pending intermediates nobody can read are computed inside fused
kernels and never written to memory.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from ember.dtypes import DType

Shape = tuple[int, ...]

_seq = itertools.count()


class Node:
    """One value of the graph. ``args`` holds the op's non-tensor arguments (ember.ir.Scalar for scalar operands,
    Ref(k) for ``srcs[k]``), in the contract method's order."""

    __slots__ = ("op", "args", "srcs", "shape", "dtype", "value", "handle", "seq")

    def __init__(self, op: str, args: tuple[Any, ...], srcs: tuple[Node, ...], shape: Shape, dtype: DType,
                 value: Any = None) -> None:
        self.op = op
        self.args = args
        self.srcs = srcs
        self.shape = shape
        self.dtype = dtype
        self.value = value
        self.handle: Any = None
        self.seq = next(_seq)

    @property
    def pending(self) -> bool:
        return self.value is None

    def realize_as(self, value: Any) -> None:
        """Turn a pending node into a realized leaf (its graph is dropped so inputs can be freed)."""
        self.value = value
        self.op, self.args, self.srcs = "leaf", (), ()

    def __repr__(self) -> str:
        state = "realized" if self.value is not None else f"pending {self.op}{self.args}"
        return f"Node#{self.seq}({state}, shape={self.shape}, dtype={self.dtype})"


class FArray:
    """The handle of a fused device: a shape and the node that computes (or holds) the value."""

    __slots__ = ("shape", "node", "__weakref__")

    def __init__(self, node: Node) -> None:
        self.shape = node.shape
        self.node = node
        node.handle = weakref.ref(self)

    @property
    def strides(self) -> Any:
        """The realized value's strides (core checks them before in-place writes); None while pending, as a
        pending value will be new contiguous memory."""
        return getattr(self.node.value, "strides", None)

    def __repr__(self) -> str:
        return f"FArray({self.node!r})"


class PendingSet(threading.local):
    """Per thread: weak references to the handles of pending nodes, how many ops were recorded since the last
    full flush (the size bound), and the thread's cell of the backend's counters (``stats.cell()``).

    ``threading.local`` runs ``__init__`` again, with the constructor's arguments, in each thread that uses it."""

    def __init__(self, stats: Any = None) -> None:
        self.handles: list[weakref.ref[FArray]] = []
        self.recorded = 0
        self.counts: Any = stats.cell() if stats is not None else None

    def add(self, h: FArray) -> None:
        self.handles.append(weakref.ref(h))
        self.recorded += 1

    def forget(self, nodes: Iterable[Node]) -> None:
        """Stop tracking ``nodes`` (their realization failed): a later flush of this thread must not run them
        again and fail unrelated ops; reading one of them directly still realizes it (and raises again)."""
        ids = {id(n) for n in nodes}
        self.handles = [r for r in self.handles if (h := r()) is not None and id(h.node) not in ids]

    def take(self) -> list[Node]:
        """The pending nodes still reachable through a live handle; forgets all of them."""
        nodes = []
        for ref in self.handles:
            h = ref()
            if h is not None and h.node.value is None:
                nodes.append(h.node)
        self.handles.clear()
        self.recorded = 0
        return nodes


def pending_subgraph(targets: Iterable[Node]) -> list[Node]:
    """The pending nodes the targets depend on (targets included), in creation order (a topological order)."""
    seen: set[int] = set()
    out: list[Node] = []
    stack = [t for t in targets if t.value is None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(s for s in n.srcs if s.value is None and id(s) not in seen)
    out.sort(key=lambda n: n.seq)
    return out


def pending_leaves(nodes: Iterable[Node]) -> list[Node]:
    """The realized nodes that the given nodes read, directly or through pending nodes."""
    leaves: dict[int, Node] = {}
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.value is not None:
            leaves[id(n)] = n
        else:
            stack.extend(n.srcs)
    return list(leaves.values())
