"""The recorded graph: AD handles, nodes, saved values, and the backward pass.

An :class:`ADArray` is the handle of an autodiff stack: the inner backend's value plus what gradient tracking
needs (the producing node, requires_grad, the accumulated grad of a leaf, a version counter shared with its
views). A :class:`Node` holds the vector-Jacobian product (vjp) of one recorded op and references to its
inputs. :class:`Saved` is how a vjp reaches the values it needs: it checks the version counter (in-place
modification after saving is an error, as in PyTorch) and, under balanced checkpointing, recomputes values
whose arrays were freed.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ember.errors import AutodiffError


class Version:
    """The version counter of one buffer, shared by all its views: in-place writes bump ``n``. ``readers`` are
    the recipes (balanced checkpointing) that would recompute from this buffer: a write first materialises
    them, so a value freed for recomputation never gets rebuilt from overwritten data."""

    __slots__ = ("n", "readers")

    def __init__(self) -> None:
        self.n = 0
        self.readers: list[weakref.ref[Recipe]] = []

    def bump(self) -> None:
        for ref in self.readers:
            recipe = ref()
            if recipe is not None:
                recipe.materialize()
        self.readers.clear()
        self.n += 1


class Meta:
    """Gradient bookkeeping of one tracked array, kept apart from its data.

    Nodes reference their inputs' Meta, not the arrays, so that an intermediate array's memory can be freed
    (balanced checkpointing) while the graph still knows how gradients flow through it.
    """

    __slots__ = ("node", "grad", "retains_grad", "hooks", "post_hooks", "__weakref__")

    def __init__(self, node: Node | None = None) -> None:
        self.node = node
        self.grad: Any = None
        self.retains_grad = False
        # gradient hooks (Tensor.register_hook): called with the gradient before it is used; created on first use
        self.hooks: OrderedDict[int, Callable[[Any], Any]] | None = None
        # post-accumulate hooks of a leaf (Tensor.register_post_accumulate_grad_hook), called after .grad changed
        self.post_hooks: OrderedDict[int, Callable[[], None]] | None = None


class ADArray:
    """Handle of an autodiff stack: the inner value, its Meta when it requires grad, and a version counter
    shared with its views. Exposes ``.shape`` (and ``.strides`` when the inner value has them)."""

    __slots__ = ("value", "shape", "meta", "_version", "recipe", "base", "__weakref__")

    def __init__(self, value: Any, meta: Meta | None = None, base: ADArray | None = None) -> None:
        self.value = value
        # a slot, not a property over value: every eager ``a + b`` compares its operands' shapes (the value is
        # never rebound, so the shape cannot go stale)
        try:
            self.shape: tuple[int, ...] = value.shape
        except AttributeError:  # a boundary's plain result (no array): reading .shape raises, as it always did
            pass
        self.meta = meta
        self.base = base  # the array this one is a view of (shares its version counter)
        self._version: Version | None = base.version if base is not None else None  # created on first use
        self.recipe: Callable[[], Any] | None = None  # recomputes value under balanced checkpointing

    @property
    def version(self) -> Version:
        v = self._version
        if v is None:
            v = self._version = Version()
        return v

    @version.setter
    def version(self, v: Version) -> None:
        self._version = v

    @property
    def strides(self) -> Any:
        return self.value.strides  # AttributeError when the inner handle has none: hasattr() stays honest

    def __repr__(self) -> str:
        return f"ADArray(shape={tuple(self.shape)}, requires_grad={self.meta is not None})"


_new = object.__new__


def new_array(value: Any) -> ADArray:
    """``ADArray(value)`` (no meta, no base) without the class call: every eager op's output is one, and a plain
    function with slot stores costs less than ``type.__call__`` running ``__init__`` (the hottest path of the
    recording, with :func:`new_node`)."""
    out = _new(ADArray)
    out.value = value
    try:
        out.shape = value.shape
    except AttributeError:  # a boundary's plain result (no array), as in ADArray.__init__
        pass
    out.meta = None
    out.base = None
    out._version = None
    out.recipe = None
    return out


def new_node(name: str, inputs: tuple[Meta | Node | None, ...], vjp: Callable[..., Sequence[Any]],
             args: tuple[Any, ...]) -> Node:
    """``Node(name, inputs, vjp, args)`` without the class call (see :func:`new_array`)."""
    node = _new(Node)
    node.name = name
    node.inputs = inputs
    node.vjp = vjp
    node.args = args
    return node


class Node:
    """One recorded op: ``vjp(*args, g) -> tuple`` of gradients (inner handles or None), one per input.

    ``args`` are the leading arguments of ``vjp`` (what the rule saved): the hottest rules pass a module-level
    function and a tuple rather than build a closure or a ``functools.partial`` on every recorded op.

    A node is also a valid :class:`Meta` of the one output it produced (``node`` is the node itself, the other
    fields are class defaults until set): single-output rules store the node as the output's meta, one object
    per recorded op instead of two. ``Meta(node)`` stays valid (multi-output ops and in-place rebases use it)."""

    __slots__ = ("name", "inputs", "vjp", "args", "__dict__", "__weakref__")
    # Meta's fields: few outputs retain their gradient or carry hooks, so the instance dict that holds these
    # once set is rarely created
    grad: Any = None
    retains_grad: bool = False
    hooks: OrderedDict[int, Callable[[Any], Any]] | None = None
    post_hooks: OrderedDict[int, Callable[[], None]] | None = None

    def __init__(self, name: str, inputs: tuple[Meta | Node | None, ...], vjp: Callable[..., Sequence[Any]],
                 args: tuple[Any, ...] = ()) -> None:
        self.name = name
        self.inputs = inputs
        self.vjp: Callable[..., Sequence[Any]] | None = vjp
        self.args = args

    @property
    def node(self) -> Node:
        """As a meta: the node that produced the output, itself (a property: a slot would be a reference cycle)."""
        return self

    def release(self) -> None:
        """Free saved values after backward (retain_graph=False)."""
        self.vjp = None
        self.args = ()

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"

    # PyTorch spells it grad_fn.name()
    def __call__(self) -> str:
        return f"{self.name}Backward"


class Recipe:
    """Recomputes a freed array's value once per graph: every Saved of that array shares the result."""

    __slots__ = ("fn", "value", "out", "__weakref__")

    def __init__(self, fn: Callable[[], Any], out: ADArray) -> None:
        self.fn = fn
        self.value: Any = None
        self.out = weakref.ref(out)

    def __call__(self) -> Any:
        if self.value is None:
            self.value = self.fn()
        return self.value

    def materialize(self) -> None:
        """Pin the value now (an input is about to be overwritten): the live array's, else recomputed."""
        if self.value is None:
            out = self.out()
            self.value = out.value if out is not None else self.fn()


def _modified_error(now: int, saved: int) -> AutodiffError:
    return AutodiffError(
        "one of the tensors needed for gradient computation has been modified by an in-place operation "
        f"(version {now}, saved at version {saved}); clone() it before modifying, or modify a copy"
    )


def kept(value: Any, counter: Version, version: int) -> Any:
    """A saved value held as is (no checkpointing), after PyTorch's in-place check: the getter of
    :func:`keep` (a ``partial`` over this function costs less to build than a :class:`Saved` and its bound
    ``get``, and recording runs on every op)."""
    if counter.n != version:
        raise _modified_error(counter.n, version)
    return value


def keep(arr: ADArray) -> Callable[[], Any]:
    """A getter of ``arr``'s value at backward time that holds the value (what :class:`Saved` does with
    ``keep=True``), version-checked."""
    counter = arr._version
    if counter is None:
        counter = arr._version = Version()
    return partial(kept, arr.value, counter, counter.n)


class Saved:
    """A value a vjp needs later, with PyTorch's in-place check and optional recomputation."""

    __slots__ = ("_value", "_ref", "_version", "_counter", "_recipe", "_cache")

    def __init__(self, arr: ADArray, keep: bool) -> None:
        self._counter = counter = arr.version  # one property call: this runs for every saved value
        self._version = counter.n
        self._cache = None
        if keep or arr.recipe is None:  # no recipe: a leaf or a compute-bound output, kept as is
            self._value = arr.value
            self._ref = None
            self._recipe = None
        else:  # balanced checkpointing: hold the array weakly, recompute if it is gone by backward time
            self._value = None
            self._ref = weakref.ref(arr)
            self._recipe = arr.recipe

    def get(self) -> Any:
        if self._counter.n != self._version:
            raise _modified_error(self._counter.n, self._version)
        if self._value is not None:
            return self._value
        if self._cache is not None:
            return self._cache
        arr = self._ref() if self._ref is not None else None
        if arr is not None and arr.version.n == self._version:
            return arr.value
        self._cache = self._recipe()  # type: ignore[misc]
        return self._cache


#: Guards the read-add-write of ``Meta.grad``: threads running backward through one model (shared parameters)
#: must not lose each other's contributions (PyTorch locks its gradient accumulation the same way).
_ACCUMULATE = threading.Lock()


def _accumulate(meta: Meta, g: Any, add: Callable[[Any, Any], Any], copy: Callable[[Any], Any]) -> None:
    with _ACCUMULATE:
        meta.grad = copy(g) if meta.grad is None else add(meta.grad, g)


def backward(roots: Sequence[Meta], grads: Sequence[Any], retain_graph: bool, accumulate: bool,
             add: Callable[[Any, Any], Any], copy: Callable[[Any], Any],
             inputs: Sequence[Meta] | None = None) -> list[Any] | None:
    """Reverse-mode sweep from roots seeded with grads.

    With ``accumulate``, leaf gradients are added into their ``grad`` (``Tensor.backward``); otherwise the
    gradients of ``inputs`` are returned (``autograd.grad``), no ``grad`` is touched, and only the part of the graph
    that leads to ``inputs`` runs (as PyTorch: nodes and hooks elsewhere are not executed). A gradient stored for
    the first time is copied: vjps may hand out views (sum's expand) or one array to several inputs (add), and
    a leaf's ``.grad`` must be its own writable memory (optimizers update it in place).

    A meta's gradient hooks run once, when its gradient is complete (every consumer has contributed) and before it
    is captured, kept (retain_grad), accumulated or propagated; a hook's result replaces the gradient. A leaf's
    post-accumulate hooks run right after its ``grad`` was updated.
    """
    order = _topological(roots)
    # metas and nodes hash by identity: they key the sweep's tables directly (no id() call per lookup)
    pending: dict[Meta, Any] = {}
    for r, g in zip(roots, grads):
        pending[r] = g if r not in pending else add(pending[r], g)
    wanted: set[Meta] = set(inputs) if inputs is not None else set()
    needed = _leading_to(order, wanted) if inputs is not None else None
    results: dict[Meta, Any] = {}
    for meta in order:
        g = pending.pop(meta, None)
        if g is None or (needed is not None and meta not in needed):
            continue
        if meta.hooks:
            g = _run_hooks(meta.hooks, g)
        if meta in wanted:
            results[meta] = g if meta not in results else add(results[meta], g)
        node = meta.node
        if node is None:  # a leaf
            if accumulate:
                _accumulate(meta, g, add, copy)
                if meta.post_hooks:
                    _run_post_hooks(meta.post_hooks)
            continue
        if accumulate and meta.retains_grad:
            _accumulate(meta, g, add, copy)
        vjp = node.vjp
        if vjp is None:
            raise AutodiffError(
                f"trying to backward through the graph a second time (through {node()}): its saved values were "
                "freed after the first backward; pass retain_graph=True to the first backward() if you need that"
            )
        args = node.args
        in_grads = vjp(*args, g) if args else vjp(g)
        if not retain_graph:
            node.release()
        for inp, ig in zip(node.inputs, in_grads):
            if inp is None or ig is None:
                continue
            pending[inp] = ig if inp not in pending else add(pending[inp], ig)
    if inputs is not None:
        return [None if m not in results else copy(results[m]) for m in inputs]
    return None


def _leading_to(order: list[Meta], wanted: set[Meta]) -> set[Meta]:
    """The metas in ``order`` (consumers first) from which a meta in ``wanted`` is reachable."""
    needed = set(wanted)
    for meta in reversed(order):  # producers first: a meta is needed when one of its node's inputs is
        node = meta.node
        if node is not None and meta not in needed:
            for inp in node.inputs:
                if inp is not None and inp in needed:
                    needed.add(meta)
                    break
    return needed


def _run_hooks(hooks: OrderedDict[int, Callable[[Any], Any]], g: Any) -> Any:
    """A gradient after a meta's hooks, in registration order: each gets this stack's handle of the gradient so
    far and may return a handle that replaces it. Hooks run without recording, as the rest of backward."""
    from ember.autograd import no_grad

    with no_grad():
        for hook in list(hooks.values()):  # a hook may remove itself (handle.remove()) while running
            out = hook(ADArray(g))
            if out is not None:
                g = out.value
    return g


def _run_post_hooks(hooks: OrderedDict[int, Callable[[], None]]) -> None:
    from ember.autograd import no_grad

    with no_grad():
        for hook in list(hooks.values()):
            hook()


def _topological(roots: Sequence[Meta]) -> list[Meta]:
    """Metas reachable from roots, each after every meta that consumes it (iterative DFS, no recursion)."""
    seen: set[Meta] = set()
    post: list[Meta] = []
    stack: list[tuple[Meta, bool]] = [(r, False) for r in roots]
    while stack:
        meta, done = stack.pop()
        if done:
            post.append(meta)
            continue
        if meta in seen:
            continue
        seen.add(meta)
        stack.append((meta, True))
        node = meta.node
        if node is not None:
            for inp in node.inputs:
                if inp is not None and inp not in seen:
                    stack.append((inp, False))
    post.reverse()
    return post
