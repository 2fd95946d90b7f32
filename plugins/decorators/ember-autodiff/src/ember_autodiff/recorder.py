"""The recording machinery every rule mixin builds on: tracking checks, saved values, nodes, in-place rules.

:class:`Recorder` is the common base of the rule mixins (elementwise, reductions, movement, nn);
:class:`~ember_autodiff.backend.AutodiffBackend` combines them and sets ``inner`` and ``balanced``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ember.autograd import GRAD_MODE
from ember.errors import AutodiffError

from .graph import ADArray, Node, Recipe, Saved, keep, new_array


class Recorder:
    """Recording helpers shared by the rule mixins (``inner`` is the wrapped backend)."""

    inner: Any
    balanced: bool

    @staticmethod
    def tracking(*hs: Any) -> bool:
        """True when gradient mode is on and any AD handle among hs requires grad."""
        if not GRAD_MODE.enabled:
            return False
        for h in hs:
            if type(h) is ADArray and h.meta is not None:
                return True
        return False

    def save(self, arr: Any) -> Callable[[], Any]:
        """A getter for arr's value at backward time (version-checked; recomputed if freed when balanced)."""
        if type(arr) is not ADArray:
            return lambda: arr
        if not self.balanced:
            return keep(arr)
        return Saved(arr, keep=False).get

    def record(self, name: str, value: Any, inputs: Sequence[Any], vjp: Callable[[Any], Sequence[Any]], *,
               recompute: Callable[[], Any] | None = None, view_of: ADArray | None = None) -> ADArray:
        """Wrap an op's output and, if it needs a gradient, its node.

        ``inputs`` are the op's operands in the order ``vjp`` returns gradients for them (non-AD operands and
        untracked arrays get None). ``recompute`` rebuilds the value from saved getters: passed only by
        memory-bound ops, it is used under balanced checkpointing. ``view_of`` makes the output share the
        version counter of the array it views.
        """
        out = ADArray(value, base=view_of)
        metas = tuple([h.meta if type(h) is ADArray else None for h in inputs])
        if GRAD_MODE.enabled and metas.count(None) != len(metas):
            out.meta = Node(name, metas, vjp)  # the node is the output's meta (see Node)
            if self.balanced and recompute is not None:
                recipe = out.recipe = Recipe(recompute, out)
                ref = weakref.ref(recipe)
                for h in inputs:
                    if type(h) is ADArray:
                        readers = h.version.readers
                        if len(readers) > 64:  # long-lived buffers (parameters): drop recipes of freed graphs
                            readers[:] = [r for r in readers if r() is not None]
                        readers.append(ref)
        return out

    def wrap(self, value: Any, view_of: ADArray | None = None) -> ADArray:
        """An untracked output (integer results, or nothing requires grad)."""
        return new_array(value) if view_of is None else ADArray(value, base=view_of)

    def wrap_many(self, values: Sequence[Any]) -> tuple[ADArray, ...]:
        return tuple(ADArray(v) for v in values)

    def check_inplace(self, op: str, h: ADArray) -> None:
        """PyTorch's rules for in-place ops on tracked arrays; bumps the version counter."""
        if GRAD_MODE.enabled:
            if h.meta is not None and h.meta.node is None:
                raise AutodiffError(
                    f"{op}: a leaf tensor that requires grad is being used in an in-place operation; "
                    "wrap it in `with ember.no_grad():` (e.g. for parameter updates) or clone() it first"
                )
            base = h.base
            if base is not None and (base.meta is not None or h.meta is not None):
                raise AutodiffError(
                    f"{op}: in-place modification of a view of a tensor that requires grad is not supported; "
                    "use an out-of-place op (e.g. torch-style x = x.clone(); x[...] = v on a fresh tensor)"
                )
        h.version.bump()

