"""AutodiffBackend: the backend contract, recorded for reverse-mode differentiation.

Every method runs the op on the inner backend. When gradient mode is on and an input requires grad, it also
records a :class:`~ember_autodiff.graph.Node` whose vjp computes input gradients with inner-backend ops. The
rules live in mixins by kind (elementwise, reductions, movement, nn) over the shared recording machinery of
:class:`~ember_autodiff.recorder.Recorder`; the forwarding of everything else is :class:`ember.backend.Decorator`'s.

Policies (see ``AutodiffBackend.policy``): the rule mixins *handle* what they differentiate; a contract method
with no rule is *composed* per call -- untracked calls run the inner backend's own (fast) implementation as a
boundary, tracked calls run :class:`ember.backend.Backend`'s default composition on this stack, so its
primitives record the gradient. Extension ops (:meth:`AutodiffBackend.run_extension`) run the backend's kernel
when untracked, are one graph node when the op has a vjp, and differentiate the op's composition otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ember.autograd import GRAD_MODE, no_grad
from ember.backend import Backend, Decorator
from ember.decorator import Policy
from ember.dtypes import DType
from ember.errors import AutodiffError, PluginError
from ember.tensor import Tensor

from .graph import ADArray, Meta, Node, backward
from .rules_elementwise import ElementwiseRules
from .rules_movement import MovementRules
from .rules_nn import NNRules
from .rules_reduction import ReductionRules


def unwrap(x: Any) -> Any:
    """The inner value of an AD handle; anything else (scalars, None) unchanged."""
    return x.value if type(x) is ADArray else x


def _differentiable(dtype: DType) -> bool:
    """Outputs of these dtypes carry gradients (torch: floating point and complex)."""
    return dtype.is_floating_point or dtype.is_complex


def _any_tracked(args: tuple[Any, ...]) -> bool:
    """True when gradient mode is on and an AD handle among args (or inside a tuple/list arg) requires grad."""
    if not GRAD_MODE.enabled:
        return False
    for a in args:
        t = type(a)
        if t is ADArray:
            if a.meta is not None:
                return True
        elif t is tuple or t is list:
            for x in a:
                if type(x) is ADArray and x.meta is not None:
                    return True
    return False


class _GradParts:
    """The output gradients of one multi-output extension op, gathered for its single node: each output's own
    node hands its gradient to the op's node as a part, and parts arriving from several outputs merge."""

    __slots__ = ("parts",)

    def __init__(self, parts: dict[int, Any]) -> None:
        self.parts = parts

    def merge(self, other: _GradParts, add: Callable[[Any, Any], Any]) -> _GradParts:
        merged = dict(self.parts)
        for i, g in other.parts.items():
            merged[i] = g if i not in merged else add(merged[i], g)
        return _GradParts(merged)


class AutodiffBackend(ElementwiseRules, ReductionRules, MovementRules, NNRules, Decorator):
    """Wraps ``inner``; ``balanced`` turns on balanced gradient checkpointing."""

    decorator_name = "autodiff"
    differentiable = True
    contract_version = 1
    #: random integers have no gradient: always the inner backend's
    policies = {"randint": Policy.BOUNDARY}

    def __init__(self, inner: Backend, balanced: bool = False) -> None:
        self.balanced = balanced
        super().__init__(inner)
        inner_add = inner.binary

        def add(a: Any, b: Any) -> Any:  # gradient accumulation; parts of a multi-output op's gradient merge
            if type(a) is _GradParts:
                return a.merge(b, add)
            return inner_add("add", a, b)

        self._add = add

    # ------------------------------------------------------------------------------------------------------
    # Decorator hooks: an AD handle wraps the inner stack's handle; untracked calls of composed methods take the
    # inner backend's fast path, tracked ones Backend's composition on this stack
    # ------------------------------------------------------------------------------------------------------
    def _unwrap(self, h: Any) -> Any:
        return h.value if type(h) is ADArray else h

    def _wrap(self, h: Any) -> ADArray:
        return ADArray(h)

    def _compose(self, name: str, composition: Callable[..., Any], boundary: Callable[..., Any]) -> Callable[..., Any]:
        def method(*args: Any, **kwargs: Any) -> Any:
            if _any_tracked(args):
                return composition(*args, **kwargs)
            return boundary(*args, **kwargs)

        method.__name__ = method.__qualname__ = name
        method.__doc__ = f"{name}: inner backend when untracked, else the differentiated default composition."
        return method

    def describe(self) -> str:
        mode = "balanced checkpointing" if self.balanced else "no checkpointing"
        return f"autodiff ({mode}) over {self.inner.describe()}"

    # ------------------------------------------------------------------------------------------------------
    # data primitives: nothing to differentiate (full is on the hot path of scalar ops: kept direct)
    # ------------------------------------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ADArray:
        return ADArray(self.inner.full(shape, value, dtype))

    # ------------------------------------------------------------------------------------------------------
    # extension ops
    # ------------------------------------------------------------------------------------------------------
    def run_extension(self, call: Any) -> Any:
        """Untracked (grad mode off, or no tensor argument requires grad): the inner stack runs the kernel (a
        boundary). Tracked, with a vjp: the kernel's forward and one graph node whose backward runs the op's vjp
        under no_grad. Tracked, without a vjp: the op's composition, differentiated through its ops."""
        args = call.args
        if not _any_tracked(tuple(args[i] for i in call.tensor_positions)):
            return Decorator.run_extension(self, call)
        if not call.op.has_vjp:
            return call.run_composition()
        out = self.inner.run_extension(call.with_args(self._lower_args(args), self.inner))
        single = type(out) is not tuple
        values = (out,) if single else out
        inner = self.inner
        out_dtypes = [inner.dtype_of(v) for v in values]
        # what the vjp reads later: the tensor inputs' and the outputs' values (version-checked, as any saved value)
        in_saved = {i: (self.save(args[i]), call.dtypes[i]) for i in call.tensor_positions}
        stack = call.device.stack

        def to_tensor(value: Any, dtype: DType) -> Tensor:
            h = ADArray(value) if stack is self else stack.lift(inner.lower(value))
            return Tensor._make(h, dtype, call.device)

        def from_tensor(t: Tensor, dtype: DType, i: int) -> Any:
            if not isinstance(t, Tensor):
                raise AutodiffError(f"{call.op.name}: the vjp returned {type(t).__name__} for argument {i}, "
                                    "expected a Tensor or None")
            v = t._h.value if stack is self else inner.lift(stack.lower(t._h))
            return v if t.dtype is dtype else inner.cast(v, dtype)

        out_saved: list[Callable[[], Any] | None] = []

        def vjp(g: Any) -> tuple[Any, ...]:
            grads = g.parts if type(g) is _GradParts else {0: g}
            with no_grad():
                inputs = tuple(to_tensor(in_saved[i][0](), in_saved[i][1]) if i in in_saved else a
                               for i, a in enumerate(args))
                # an output the vjp does not read was not kept (ExtensionOp.vjp(outputs=...)): None in ctx.outputs
                outputs = tuple(None if get is None else to_tensor(get(), d) for get, d in zip(out_saved, out_dtypes))
                gs = tuple(to_tensor(grads[k], out_dtypes[k]) if k in grads
                           else (to_tensor(inner.full(values[k].shape, 0, d), d) if _differentiable(d) else None)
                           for k, d in enumerate(out_dtypes))
                res = call.backward(inputs, outputs, gs)
                if len(res) != len(args):
                    raise PluginError(f"{call.op.name}: the vjp returned {len(res)} gradients for {len(args)} "
                                      "inputs (one per positional argument, None where there is none)")
                return tuple(None if r is None or i not in in_saved else from_tensor(r, in_saved[i][1], i)
                             for i, r in enumerate(res))

        name = call.op.name
        if single:
            wrapped: tuple[ADArray, ...] = (self.record(name, out, args, vjp) if _differentiable(out_dtypes[0])
                                            else ADArray(out),)
        else:
            joint = Meta(Node(name, tuple(a.meta if type(a) is ADArray else None for a in args), vjp))
            wrapped = tuple(
                ADArray(v, Meta(Node(name, (joint,), lambda g, k=k: (_GradParts({k: g}),))))
                if _differentiable(d) else ADArray(v)
                for k, (v, d) in enumerate(zip(values, out_dtypes)))
        op, n_out = call.op, len(wrapped)
        out_saved.extend(self.save(w) if op.keeps_output(k, n_out) else None for k, w in enumerate(wrapped))
        return wrapped[0] if single else wrapped

    # ------------------------------------------------------------------------------------------------------
    # the autodiff protocol core's gradient API calls (ember.backend.Differentiable)
    # ------------------------------------------------------------------------------------------------------
    def requires_grad(self, h: ADArray) -> bool:
        return h.meta is not None

    def set_requires_grad(self, h: ADArray, flag: bool) -> None:
        if h.meta is not None and h.meta.node is not None:
            if not flag:
                raise AutodiffError(
                    "requires_grad_: you can only change requires_grad flags of leaf tensors; use detach() to get "
                    "a tensor without gradient history"
                )
            return
        if flag and h.meta is None:
            h.meta = Meta()
        elif not flag:
            h.meta = None

    def is_leaf(self, h: ADArray) -> bool:
        return h.meta is None or h.meta.node is None

    def grad_fn(self, h: ADArray) -> Node | None:
        return None if h.meta is None else h.meta.node

    def grad_of(self, h: ADArray) -> Any:
        if h.meta is None or h.meta.grad is None:
            return None
        return ADArray(h.meta.grad)

    def set_grad(self, h: ADArray, g: ADArray | None) -> None:
        if h.meta is None:
            if g is None:
                return
            raise AutodiffError("grad: cannot assign a gradient to a tensor that does not require grad")
        h.meta.grad = None if g is None else g.value

    def retain_grad(self, h: ADArray) -> None:
        if h.meta is None:
            raise AutodiffError("retain_grad: the tensor does not require grad")
        if h.meta.node is not None:
            h.meta.retains_grad = True

    def detach(self, h: ADArray) -> ADArray:
        # shares data and the version counter, as PyTorch's detach(), but is no view in the graph's sense: in-place
        # ops on it are allowed (and bump the counter, so backward still catches a saved value it changed)
        out = ADArray(h.value)
        out.version = h.version
        return out

    def grad_hooks(self, h: ADArray) -> OrderedDict[int, Callable[[ADArray], ADArray | None]]:
        """The gradient hooks of ``h`` (kept on its Meta, so every Tensor wrapping ``h`` shares them)."""
        meta = self._meta_for_hooks("register_hook", h)
        if meta.hooks is None:
            meta.hooks = OrderedDict()
        return meta.hooks

    def post_accumulate_grad_hooks(self, h: ADArray) -> OrderedDict[int, Callable[[], None]]:
        """The post-accumulate hooks of the leaf ``h``."""
        meta = self._meta_for_hooks("register_post_accumulate_grad_hook", h)
        if meta.node is not None:
            raise AutodiffError("register_post_accumulate_grad_hook: post accumulate grad hooks cannot be registered "
                                "on non-leaf tensors")
        if meta.post_hooks is None:
            meta.post_hooks = OrderedDict()
        return meta.post_hooks

    @staticmethod
    def _meta_for_hooks(op: str, h: ADArray) -> Meta:
        if h.meta is None:
            raise AutodiffError(f"{op}: cannot register a hook on a tensor that doesn't require gradient "
                                "(call requires_grad_() on a leaf first)")
        return h.meta

    def hook_node(self, hs: Sequence[ADArray],
                  hook: Callable[[list[ADArray | None]], Sequence[ADArray | None] | None]) -> list[ADArray]:
        """Identity over ``hs`` recorded as one node (PyTorch's BackwardHookFunction): the outputs share their
        inputs' data and version counters; backward calls ``hook`` once with every output's gradient (None where
        none arrived) and sends what it returns (the same gradients when it returns None) on to ``hs``."""
        metas = tuple(h.meta for h in hs)
        if not GRAD_MODE.enabled or metas.count(None) == len(metas):
            return [self.detach(h) for h in hs]
        n = len(hs)

        def vjp(g: Any) -> tuple[Any, ...]:
            parts = g.parts if type(g) is _GradParts else {0: g}
            grads = [ADArray(parts[k]) if k in parts else None for k in range(n)]
            with no_grad():
                out = hook(grads)
            if out is None:
                return tuple(parts.get(k) for k in range(n))
            if len(out) != n:
                raise AutodiffError(f"backward hook: returned {len(out)} gradients for {n} tensors")
            return tuple(unwrap(o) for o in out)

        joint = Meta(Node("BackwardHookFunction", metas, vjp))
        outs = []
        for k, h in enumerate(hs):
            out = self.detach(h)  # same data, same version counter: a saved value still sees in-place writes
            if h.meta is not None:
                out.meta = Meta(Node("BackwardHookFunction", (joint,), lambda g, k=k: (_GradParts({k: g}),)))
            outs.append(out)
        return outs

    def _roots(self, op: str, outs: Sequence[ADArray], grads: Sequence[Any]) -> tuple[list[Meta], list[Any]]:
        metas, seeds = [], []
        for h, g in zip(outs, grads):
            if h.meta is None:
                raise AutodiffError(
                    f"{op}: element {len(metas)} of the outputs does not require grad and has no grad_fn "
                    "(did you create it under no_grad, or forget requires_grad=True on the inputs?)"
                )
            metas.append(h.meta)
            seeds.append(unwrap(g))
        return metas, seeds

    def backward(self, outs: Sequence[ADArray], grads: Sequence[Any], retain_graph: bool) -> None:
        metas, seeds = self._roots("backward", outs, grads)
        backward(metas, seeds, retain_graph, True, self._add, self.inner.copy)

    def grad(self, outs: Sequence[ADArray], inputs: Sequence[ADArray], grads: Sequence[Any],
             retain_graph: bool) -> list[ADArray | None]:
        metas, seeds = self._roots("grad", outs, grads)
        res = backward(metas, seeds, retain_graph, False, self._add, self.inner.copy, [h.meta for h in inputs])
        return [None if g is None else ADArray(g) for g in res or []]
