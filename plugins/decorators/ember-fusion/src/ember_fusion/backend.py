"""FusionBackend: the backend contract, recorded lazily and run as fused kernels.

Recorded (lazy): ``unary``, ``binary``, ``where``, ``cast``, ``full`` and ``reduce``. Core validates shapes and
dtypes before it calls a backend, so every error is still raised at the call that caused it; recording only has
to compute the result's shape and dtype.

Handles: a pending value is an :class:`FArray`; a value in memory is the inner backend's own handle (a boundary's
result, an op run eagerly) or an FArray whose node was realized. Ops whose tensor operands are all in memory and
whose work has fewer than ``eager_below`` elements run at once on the inner backend (planning cannot pay there);
a node is made for an inner handle only when an op that reads it is recorded.

Everything else is forwarded by :class:`ember.backend.Decorator` with the *compose* policy: a *boundary* (the
pending values it reads are realized, as fused kernels, and the inner backend's method runs on them), except for
contract methods the inner backend leaves to ``Backend``'s default composition, which run that composition on
this stack instead, so its primitives are recorded and fused too. Extension ops are boundaries as well (the
base's ``run_extension``); the decorator declares ``records_lazily``, so core runs a ``fusable`` op's
composition here instead of its kernel. Methods of the inner backend outside the contract (flex's
``conv_input_grad``) are boundaries too. In-place methods (``assign``, ``setitem``, ``inplace_binary``) first
realize everything pending in the thread, because a pending value may read the memory they overwrite.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from math import prod
from typing import Any

from numpy import ndarray as _ndarray

from ember import dtypes as dt
from ember.backend import COMPARISON_OPS, PREDICATE_UNARY_OPS, Backend, Decorator
from ember.decorator import Policy
from ember.dtypes import DType
from ember.ir import Ref, Scalar
from ember.shapes import broadcast_shapes

from .graph import FArray, Node, PendingSet, pending_leaves, pending_subgraph
from .schedule import Graph, build_plan, run_plan

#: ops recorded per thread before everything pending is run (bounds kernel size and memory held by the graph)
DEFAULT_MAX_PENDING = 256
#: plans kept per backend (least recently used dropped first)
PLAN_CACHE_SIZE = 2048
#: devices' default for ``eager_below``: an op on values in memory whose work (result, or a reduction's input) has
#: fewer elements than this runs at once, unrecorded. Measured on flex (``python benchmarks/fusion.py --sections
#: threshold``: 2- to 9-op float32 chains, recording every op against the unfused device): recording, keying and
#: running a plan costs 40-100 us of Python, so below 2**17 elements every chain ran 0.1-0.7x as fast recorded; at
#: 2**18 0.84-1.12x, at 2**19 0.95-1.13x, at 2**20 and up 1.0-1.4x. Below 2**19 an op therefore runs eagerly.
DEFAULT_EAGER_BELOW = 1 << 19

_SCALARS = (bool, int, float)
_R0, _R1, _R2 = Ref(0), Ref(1), Ref(2)

# "recorded" counts the ops recorded lazily; the figure reported as recorded (FusionStats) adds the eager ones, so
# an op run at once costs one counter increment
_COUNTERS = ("recorded", "eager", "realizations", "single_ops", "plan_hits", "plan_misses", "kernels_run",
             "kernels_compiled", "kernels_interpreted", "boundaries")


class _Counts:
    """One thread's counters (only that thread writes them, so increments need no lock and lose nothing)."""

    __slots__ = _COUNTERS

    def __init__(self) -> None:
        for k in _COUNTERS:
            setattr(self, k, 0)


class FusionStats:
    """Counters shown in ``device.memory_report()`` under ``fusion_*`` keys.

    Each thread counts in its own :class:`_Counts` cell (see :meth:`cell`); reading a counter
    (``stats.plan_hits``) sums the cells of every thread, so the totals are exact under threads. Cells of threads
    that ended are folded into one when the next thread registers or the counters are read.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cells: list[tuple[weakref.ref[threading.Thread], _Counts]] = []
        self._ended = _Counts()
        self._local = threading.local()

    def cell(self) -> _Counts:
        """The calling thread's counters."""
        try:
            return self._local.cell  # type: ignore[no-any-return]
        except AttributeError:
            c = self._local.cell = _Counts()
            with self._lock:
                self._fold_ended()
                self._cells.append((weakref.ref(threading.current_thread()), c))
            return c

    def _fold_ended(self) -> None:
        live = []
        for ref, c in self._cells:
            t = ref()
            if t is None or not t.is_alive():
                for k in _COUNTERS:
                    setattr(self._ended, k, getattr(self._ended, k) + getattr(c, k))
            else:
                live.append((ref, c))
        self._cells = live

    def __getattr__(self, name: str) -> int:
        if name not in _COUNTERS:
            raise AttributeError(name)
        with self._lock:
            self._fold_ended()
            cells = [self._ended] + [c for _, c in self._cells]
            total = sum(getattr(c, name) for c in cells)
            if name == "recorded":  # the ops run at once were seen too (see _COUNTERS)
                total += sum(c.eager for c in cells)
            return total

    def reset(self) -> None:
        with self._lock:
            self._ended = _Counts()
            for _, c in self._cells:
                c.__init__()  # type: ignore[misc]

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            self._fold_ended()
            cells = [self._ended] + [c for _, c in self._cells]
            out = {f"fusion_{k}": sum(getattr(c, k) for c in cells) for k in _COUNTERS}
        out["fusion_recorded"] += out["fusion_eager"]  # see _COUNTERS
        looked_up = out["fusion_plan_hits"] + out["fusion_plan_misses"]
        out["fusion_plan_hit_rate"] = out["fusion_plan_hits"] / looked_up if looked_up else 0.0
        return out


class FusionBackend(Decorator):
    """Wraps ``inner`` (a backend that implements ``fusion_compile``)."""

    decorator_name = "fusion"
    contract_version = 1
    records_lazily = True
    #: optional methods of the inner backend (flex's ``conv_input_grad``, looked up by autodiff with getattr)
    optional_policy = Policy.BOUNDARY

    def __init__(self, inner: Backend, max_pending: int = DEFAULT_MAX_PENDING, eager_below: int = 0) -> None:
        self.max_pending = max_pending
        #: ops on values in memory with fewer elements than this (result and inputs) run at once (0: record all);
        #: devices get :data:`DEFAULT_EAGER_BELOW`, a bare ``FusionBackend(inner)`` records everything
        self.eager_below = eager_below
        self.stats = FusionStats()
        self._pending = PendingSet(self.stats)
        self._plans: OrderedDict[Any, Any] = OrderedDict()
        self._compiled: dict[Any, Any] = {}
        # Held while pending nodes turn into values (and while the plan and compile caches change). Recording is
        # per thread, but a pending handle can reach another thread (handed over, or read through a shared
        # tensor): two threads must never realize one node at once, nor read a node's graph while another thread
        # replaces it with its value. Boundary ops (matmul, conv, ...) run outside it, in parallel.
        self._lock = threading.RLock()
        super().__init__(inner)  # binds the forwarded contract methods, which read the state above

    # ------------------------------------------------------------------------------------------------------
    # handles
    # ------------------------------------------------------------------------------------------------------
    def _leaf(self, value: Any) -> FArray:
        return FArray(self._leaf_node(value))

    def _leaf_node(self, value: Any) -> Node:
        """A realized node holding ``value``, an inner handle in memory (to record an op that reads it)."""
        return Node("leaf", (), (), tuple(value.shape), self.inner.dtype_of(value), value)

    # Decorator's handle hooks. A value in memory is the inner backend's own handle (a boundary's result, an op
    # run eagerly): wrapping it in an FArray would cost two objects per op and gain nothing, as only recording
    # needs a node, and a node for it is made then (_leaf_node).
    def _wrap(self, h: Any) -> Any:
        return h

    def _unwrap(self, h: Any) -> Any:
        return self._value(h)

    def _wrap_out(self, out: Any) -> Any:
        """A boundary's result as it is: values in memory are inner handles (tuples and lists of them too)."""
        return out

    def _boundary(self, name: str) -> Any:
        """Decorator's boundary with its two hooks inlined (results are inner handles, so there is nothing to
        wrap): this runs for every matmul, view, index and copy of a small-op model."""
        inner_method = getattr(self.inner, name)
        values, pending = self._values, self._pending

        def boundary(*args: Any, **kwargs: Any) -> Any:
            pending.counts.boundaries += 1
            for a in args:  # _values' own first check, inlined: most calls pass inner handles and plain values
                t = type(a)
                if t is FArray or t is tuple or t is list:
                    return inner_method(*values(args), **kwargs)
            return inner_method(*args, **kwargs)

        boundary.__name__ = boundary.__qualname__ = name
        boundary.__doc__ = f"{name}: the inner stack's implementation, run as a boundary."
        return boundary

    def _lower_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A boundary call's arguments, realized together (one plan for all their pending values)."""
        self._pending.counts.boundaries += 1
        return self._values(args)

    def _eager(self) -> None:
        """Count an op run at once (see :attr:`eager_below`): it was recorded and realized in one go."""
        self._pending.counts.eager += 1

    def _record(self, op: str, args: tuple[Any, ...], srcs: tuple[Node, ...], shape: tuple[int, ...],
                dtype: DType) -> FArray:
        h = FArray(Node(op, args, srcs, shape, dtype))
        pending = self._pending
        pending.add(h)
        pending.counts.recorded += 1
        if pending.recorded >= self.max_pending:
            self.flush()
        return h

    # ------------------------------------------------------------------------------------------------------
    # realization
    # ------------------------------------------------------------------------------------------------------
    def _realize(self, nodes: list[Node], into: dict[int, Any] | None = None) -> None:
        with self._lock:  # see __init__: the targets' state is read and changed only under the lock
            targets = [n for n in nodes if n.value is None]
            if not targets:
                return
            try:
                self._realize_targets(targets, into)
            except Exception:
                self._pending.forget(targets)  # e.g. an OutOfMemoryError: later flushes must not retry them
                raise

    def _realize_targets(self, targets: list[Node], into: dict[int, Any] | None) -> None:
        """Compute the pending ``targets`` (not in memory yet) as one plan; the caller holds the lock."""
        stats = self._pending.counts
        pending = pending_subgraph(targets)
        if len(pending) == 1 and into is None:
            # one op on values in memory: nothing to fuse, so skip the planning and call the backend's op
            n = pending[0]
            n.realize_as(self._run_one(n))
            stats.realizations += 1
            stats.single_ops += 1
            return
        graph = Graph(pending, {id(n) for n in targets})
        key = graph.key
        try:  # one hash of the key on a hit: lookup and least-recently-used bookkeeping together
            self._plans.move_to_end(key)
            plan = self._plans[key]
        except KeyError:
            plan = None
        if plan is None:
            plan = build_plan(graph, self._compile)
            self._plans[key] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
            stats.plan_misses += 1
        else:
            stats.plan_hits += 1
        stats.realizations += 1
        stats.kernels_run += run_plan(plan, graph, self.inner, into)

    def _run_one(self, n: Node) -> Any:
        """A pending node whose inputs are all in memory, computed by the inner backend's own method."""
        inner, op, a, srcs = self.inner, n.op, n.args, n.srcs
        if op == "binary":
            x, y = a[1], a[2]
            return inner.binary(a[0], srcs[x.k].value if type(x) is Ref else x.value,
                                srcs[y.k].value if type(y) is Ref else y.value)
        if op == "unary":
            return inner.unary(a[0], srcs[0].value)
        if op == "where":
            x, y = a[1], a[2]
            return inner.where(srcs[0].value, srcs[x.k].value if type(x) is Ref else x.value,
                               srcs[y.k].value if type(y) is Ref else y.value)
        if op == "cast":
            return inner.cast(srcs[0].value, a[0])
        if op == "full":
            return inner.full(n.shape, a[0].value, n.dtype)
        return inner.reduce(a[0], srcs[0].value, a[2], a[3])  # reduce: (op, Ref(0), dims, keepdim)

    def _compile(self, kernel: Any) -> Any:
        if kernel in self._compiled:
            return self._compiled[kernel]
        fn = self.inner.fusion_compile(kernel)
        self._compiled[kernel] = fn
        counts = self._pending.counts
        if fn is None:
            counts.kernels_interpreted += 1
        else:
            counts.kernels_compiled += 1
        return fn

    def flush(self) -> None:
        """Run everything pending in this thread (live values are stored, dead intermediates never are)."""
        pending = self._pending
        if not pending.handles:  # every in-place op flushes: with small values nothing is pending, so return early
            pending.recorded = 0
            return
        self._realize(pending.take())

    def _value(self, h: Any) -> Any:
        """The inner handle of h (realizing it), or h itself when it is no FArray (scalars, None)."""
        if type(h) is not FArray:
            return h
        n = h.node
        if n.value is None:
            self._realize([n])
        return n.value

    def _values(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """args with every FArray (also inside tuples and lists) replaced by its realized inner handle; all
        pending values among them are realized together, as one plan."""
        pending: list[Node] = []
        wrapped = False
        for a in args:
            t = type(a)
            if t is FArray:
                wrapped = True
                if a.node.value is None:
                    pending.append(a.node)
            elif t is tuple or t is list:
                for x in a:
                    if type(x) is FArray:
                        wrapped = True
                        if x.node.value is None:
                            pending.append(x.node)
        if not wrapped:  # the common case once values are in memory: inner handles, shapes, scalars
            return args
        if pending:
            self._realize(pending)
        out = []
        for a in args:  # a loop, not a closure per call: this runs for every boundary op
            t = type(a)
            if t is FArray:
                out.append(a.node.value)
            elif t is tuple or t is list:
                out.append(t(x.node.value if type(x) is FArray else x for x in a))
            else:
                out.append(a)
        return tuple(out)

    # ------------------------------------------------------------------------------------------------------
    # decorated stack plumbing (the rest is Decorator's)
    # ------------------------------------------------------------------------------------------------------
    def sync(self) -> None:
        self.flush()
        self.inner.sync()

    def memory_report(self) -> dict[str, Any]:
        report = dict(self.inner.memory_report())
        report.update(self.stats.as_dict())
        report["fusion_plans_cached"] = len(self._plans)
        return report

    def dtype_of(self, h: Any) -> DType:
        return h.node.dtype if type(h) is FArray else self.inner.dtype_of(h)

    # ------------------------------------------------------------------------------------------------------
    # in-place methods: a pending value may read the memory they overwrite, so run everything pending first
    # ------------------------------------------------------------------------------------------------------
    def assign(self, dst: FArray, src: Any) -> None:
        self.flush()
        self.inner.assign(self._value(dst), self._value(src))

    def setitem(self, h: FArray, key: tuple[Any, ...], value: Any) -> None:
        self.flush()
        key = self._values(key)
        self.inner.setitem(self._value(h), key, self._value(value))

    def inplace_binary(self, op: str, a: Any, b: Any) -> None:
        tb = type(b)
        if type(a) is not FArray:  # a is in memory
            if tb is not FArray or b.node.value is not None:
                self.flush()  # nothing pending to fuse into the write; pending values may read a's old contents
                self.inner.inplace_binary(op, a, b.node.value if tb is FArray else b)
                return
            na = self._leaf_node(a)
        else:
            na = a.node
        if tb is FArray:
            args, srcs = (op, _R0, _R1), (na, b.node)
        elif tb in _SCALARS:
            args, srcs = (op, _R0, Scalar(b)), (na,)
        else:
            self.flush()
            self.inner.inplace_binary(op, self._value(a), b)
            return
        n = Node("binary", args, srcs, na.shape, na.dtype)
        if na.value is None:
            # a pending value has no views (view ops realize their input), so updating it in place is the same as
            # pointing its handle at a new node; pending readers of the old value keep the old node
            na.handle = None
            a.node = n
            n.handle = weakref.ref(a)
            pending = self._pending
            pending.add(a)
            pending.counts.recorded += 1
            if pending.recorded >= self.max_pending:
                self.flush()
            return
        if tb is not FArray or b.node.value is not None or not self._writable_in_place(na, srcs):
            # nothing pending to fuse into the write (a scalar or a value in memory), or b may alias a
            self.flush()
            self.inner.inplace_binary(op, na.value, self._value(b))
            return
        # first everything pending that might read a's old contents, then one plan that writes a in place
        with self._lock:  # the two steps together, so no other thread's realization runs between them
            self._realize([x for x in self._pending.take() if x is not srcs[-1]])
            self._realize([n], into={id(n): na.value})
        self._pending.counts.recorded += 1

    def _writable_in_place(self, target: Node, srcs: tuple[Node, ...]) -> bool:
        """True when no realized value the pending sources read may share memory with ``target`` (other than
        target itself, which a fused kernel reads and writes at the same element)."""
        may_alias = self.inner.may_share_memory
        dst = target.value
        for leaf in pending_leaves(srcs):
            if leaf.value is not dst and may_alias(leaf.value, dst):
                return False
        return True

    # ------------------------------------------------------------------------------------------------------
    # recorded ops. Each first checks whether it runs at once: every tensor operand in memory (an inner handle,
    # or an FArray whose node was realized) and fewer than eager_below elements of work; then the inner
    # backend's own method runs, exactly the unfused device's op. Otherwise the op is recorded.
    # ------------------------------------------------------------------------------------------------------
    def unary(self, op: str, h: Any) -> Any:
        if type(h) is FArray:
            n = h.node
            if n.value is None or not self.eager_below:
                return self._record("unary", (op, _R0), (n,), n.shape,
                                    dt.bool_ if op in PREDICATE_UNARY_OPS else n.dtype)
            h = n.value
        if (h.size if type(h) is _ndarray else prod(h.shape)) < self.eager_below:
            self._pending.counts.eager += 1  # _eager() inlined, as in binary
            return self.inner.unary(op, h)
        n = self._leaf_node(h)
        return self._record("unary", (op, _R0), (n,), n.shape, dt.bool_ if op in PREDICATE_UNARY_OPS else n.dtype)

    def binary(self, op: str, a: Any, b: Any) -> Any:
        below = self.eager_below
        ta, tb = type(a), type(b)
        # the hottest path of small models, first: a numpy handle and one of its shape (or a Python scalar),
        # below the threshold, runs at once
        if ta is _ndarray and below and ((tb is _ndarray and a.shape == b.shape) or tb in _SCALARS) and (
                a.size < below):
            self._pending.counts.eager += 1  # _eager() inlined
            return self.inner.binary(op, a, b)
        if below:
            va = a.node.value if type(a) is FArray else a
            vb = b.node.value if type(b) is FArray else b
            if va is not None and vb is not None:  # every operand in memory (or a Python scalar)
                tva, tvb = type(va), type(vb)
                # element counts: a numpy handle's ``size`` is 4x cheaper than prod(shape) (this is the hottest
                # path of small models)
                if tvb in _SCALARS:
                    work = va.size if tva is _ndarray else prod(va.shape)
                elif tva in _SCALARS:
                    work = vb.size if tvb is _ndarray else prod(vb.shape)
                else:
                    sa, sb = va.shape, vb.shape
                    work = va.size if tva is _ndarray else prod(sa)
                    if sa != sb:
                        # the broadcast result has at least max and at most the product of the two sizes: work
                        # out its shape only where those bounds straddle the threshold
                        nb = vb.size if tvb is _ndarray else prod(sb)
                        if work * nb >= below:
                            work = max(work, nb)
                            if work < below:
                                work = prod(broadcast_shapes(sa, sb))
                        else:
                            work = 0
                if work < below:
                    self._pending.counts.eager += 1  # _eager() inlined
                    return self.inner.binary(op, va, vb)
        if ta is not FArray and ta not in _SCALARS:
            a, ta = self._leaf(a), FArray
        if tb is not FArray and tb not in _SCALARS:
            b, tb = self._leaf(b), FArray
        if ta is FArray and tb is FArray:
            na, nb = a.node, b.node
            shape = na.shape if na.shape == nb.shape else broadcast_shapes(na.shape, nb.shape)
            args, srcs, d = (op, _R0, _R1), (na, nb), na.dtype
        elif ta is FArray:
            na = a.node
            args, srcs, shape, d = (op, _R0, Scalar(b)), (na,), na.shape, na.dtype
        else:
            nb = b.node
            args, srcs, shape, d = (op, Scalar(a), _R0), (nb,), nb.shape, nb.dtype
        return self._record("binary", args, srcs, shape, dt.bool_ if op in COMPARISON_OPS else d)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        ops = (cond, a, b)
        vals = [x.node.value if type(x) is FArray else x for x in ops]
        tensors = [v for v in vals if type(v) not in _SCALARS]
        if self.eager_below and all(v is not None for v in vals) and prod(
                broadcast_shapes(*(v.shape for v in tensors))) < self.eager_below:
            self._eager()
            return self.inner.where(*vals)
        cond, a, b = (x if type(x) is FArray or type(x) in _SCALARS else self._leaf(x) for x in ops)
        ta, tb = type(a), type(b)
        if type(cond) is not FArray or not (ta is FArray or tb is FArray):
            return self.inner.where(*self._values((cond, a, b)))
        srcs = [cond.node]
        args: list[Any] = [_R0]
        for x in (a, b):
            if type(x) is FArray:
                args.append(Ref(len(srcs)))
                srcs.append(x.node)
            else:
                args.append(Scalar(x))
        d = (a if ta is FArray else b).node.dtype
        return self._record("where", tuple(args), tuple(srcs), broadcast_shapes(*(s.shape for s in srcs)), d)

    def cast(self, h: Any, dtype: DType) -> Any:
        if type(h) is FArray:
            n = h.node
            if n.value is None or not self.eager_below:
                return self._record("cast", (dtype, _R0), (n,), n.shape, dtype)
            h = n.value
        if prod(h.shape) < self.eager_below:
            self._eager()
            return self.inner.cast(h, dtype)
        n = self._leaf_node(h)
        return self._record("cast", (dtype, _R0), (n,), n.shape, dtype)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> Any:
        if type(value) not in _SCALARS:
            return self.inner.full(shape, value, dtype)
        if prod(shape) < self.eager_below:
            self._eager()
            return self.inner.full(shape, value, dtype)
        return self._record("full", (Scalar(value),), (), tuple(shape), dtype)

    def reduce(self, op: str, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
        if type(h) is FArray and (h.node.value is None or not self.eager_below):
            n = h.node
        else:
            v = h.node.value if type(h) is FArray else h
            if prod(v.shape) < self.eager_below:
                self._eager()
                return self.inner.reduce(op, v, dims, keepdim)
            n = self._leaf_node(v)
        if keepdim:
            shape = tuple(1 if d in dims else s for d, s in enumerate(n.shape))
        else:
            shape = tuple(s for d, s in enumerate(n.shape) if d not in dims)
        return self._record("reduce", (op, _R0, tuple(sorted(dims)), bool(keepdim)), (n,), shape, n.dtype)
