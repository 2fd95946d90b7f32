"""Gradient rules of movement and indexing: reshape, permute, expand, getitem, setitem, cat, and fast rules for
the default compositions flip, gather, scatter, index_select, masked_fill, tril and pad.

Views (permute, expand, basic getitem, and reshape when the inner backend really returned a view) are recorded
with ``view_of=h`` so that they share the version counter of the array they view; their vjps need only shapes,
so they pass no ``recompute`` (keeping a view costs no memory). Every other output is memory-bound and passes
``recompute`` (built only under balanced checkpointing, so that nothing is saved needlessly otherwise).
Forwards run the inner backend's own method, so a backend's fast paths are used while tracking too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember import dtypes as dt
from ember.autograd import GRAD_MODE
from ember.backend import Backend
from ember.errors import AutodiffError

from .graph import ADArray, Meta, Node
from .recorder import Recorder
from .rules_elementwise import unbroadcast

_BASIC = (int, slice, type(None), type(Ellipsis))


def _v(x: Any) -> Any:
    """The inner value of an AD handle; anything else (scalars, None) unchanged."""
    return x.value if type(x) is ADArray else x


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _zeros(be: Any, shape: tuple[int, ...], like: Any) -> Any:
    return be.full(shape, 0.0, be.dtype_of(like))


class MovementRules(Recorder):
    """Mixin of AutodiffBackend: movement and indexing primitives and their gradients."""


    def _recompute(self, fn: Callable[..., Any], *arrs: Any) -> Callable[[], Any] | None:
        """A recompute closure over saved getters of arrs; None when not checkpointing (then nothing is saved)."""
        if not self.balanced:
            return None
        getters = [self.save(a) for a in arrs]
        return lambda: fn(*(g() for g in getters))

    def _saved_key(self, key: tuple[Any, ...]) -> Callable[[], tuple[Any, ...]]:
        """A getter of the inner key: index handles are saved (version-checked), the rest kept as is."""
        if not any(type(k) is ADArray for k in key):
            return lambda: key
        parts = [self.save(k) if type(k) is ADArray else (lambda k=k: k) for k in key]
        return lambda: tuple(p() for p in parts)

    # ------------------------------------------------------------------------------------------------------
    # required primitives
    # ------------------------------------------------------------------------------------------------------
    def reshape(self, h: ADArray, shape: tuple[int, ...]) -> ADArray:
        inner = self.inner
        value = inner.reshape(h.value, shape)
        # reshape is a view only when the inner backend made one (contiguous data); a copy must not share the
        # version counter, or in-place writes to it would be refused (or charged to h) for no reason
        view = value is h.value or inner.may_share_memory(value, h.value)
        if not self.tracking(h):
            return self.wrap(value, view_of=h if view else None)
        src = tuple(h.shape)
        vjp = lambda g: (inner.reshape(g, src),)  # noqa: E731
        if view:
            return self.record("reshape", value, (h,), vjp, view_of=h)
        return self.record("reshape", value, (h,), vjp,
                           recompute=self._recompute(lambda x: inner.reshape(x, shape), h))

    def permute(self, h: ADArray, dims: tuple[int, ...]) -> ADArray:
        inner = self.inner
        value = inner.permute(h.value, dims)
        if not self.tracking(h):
            return self.wrap(value, view_of=h)
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        back = tuple(inv)
        return self.record("permute", value, (h,), lambda g: (inner.permute(g, back),), view_of=h)

    def expand(self, h: ADArray, shape: tuple[int, ...]) -> ADArray:
        inner = self.inner
        value = inner.expand(h.value, shape)
        if not self.tracking(h):
            return self.wrap(value, view_of=h)
        src = tuple(h.shape)
        return self.record("expand", value, (h,), lambda g: (unbroadcast(inner, g, src),), view_of=h)

    def getitem(self, h: ADArray, key: tuple[Any, ...]) -> ADArray:
        inner = self.inner
        basic = all(type(k) in _BASIC for k in key)
        ikey = key if basic else tuple(_v(k) for k in key)
        value = inner.getitem(h.value, ikey)
        if not self.tracking(h):
            return self.wrap(value, view_of=h if basic else None)
        shape = tuple(h.shape)
        if basic:
            def vjp_basic(g: Any) -> tuple[Any]:
                out = _zeros(inner, shape, g)
                inner.setitem(out, key, g)
                return (out,)

            return self.record("index", value, (h,), vjp_basic, view_of=h)
        k = self._saved_key(key)

        def vjp(g: Any) -> tuple[Any]:
            # advanced indices may repeat a position: scatter-add into the flat positions the key selects
            n = _numel(shape)
            if _numel(tuple(g.shape)) == 0:
                return (_zeros(inner, shape, g),)
            pos = inner.getitem(inner.reshape(inner.arange(0, n, 1, dt.int64), shape), k())
            m = _numel(tuple(pos.shape))
            flat = inner.scatter(_zeros(inner, (n,), g), 0, inner.reshape(pos, (m,)), inner.reshape(g, (m,)), "add")
            return (inner.reshape(flat, shape),)

        return self.record("index", value, (h,), vjp,
                           recompute=self._recompute(lambda x, *ks: inner.getitem(x, ks), h, *key))

    def setitem(self, h: ADArray, key: tuple[Any, ...], value: Any) -> None:
        self.check_inplace("setitem", h)
        inner = self.inner
        ikey = tuple(_v(k) for k in key)
        if not self.tracking(h, value):
            # untracked write (or under no_grad): h keeps its history, as in PyTorch; the version bump above makes
            # any vjp that saved h refuse to run
            inner.setitem(h.value, ikey, _v(value))
            return
        tracked_value = type(value) is ADArray and value.meta is not None
        if tracked_value and h.base is not None and h.value is not h.base.value:
            # the base would need its history rebased too (PyTorch's CopySlices); refuse rather than drop gradients
            raise AutodiffError(
                f"setitem: writing a tensor that requires grad into a view (shape {tuple(h.shape)}) is not "
                "supported; index the base tensor in one go (x[i, j] = v instead of x[i][j] = v) or clone() the view"
            )
        inner.setitem(h.value, ikey, _v(value))
        vshape = tuple(value.shape) if tracked_value else None
        k = self._saved_key(key)

        def vjp(g: Any) -> tuple[Any, Any]:
            kk = k()
            g_old = inner.copy(g)
            inner.setitem(g_old, kk, 0.0)  # the overwritten region of the old contents gets no gradient
            g_val = None if vshape is None else unbroadcast(inner, inner.getitem(g, kk), vshape)
            return g_old, g_val

        # rebase h's history onto this node (cf. ElementwiseRules._rebase): inputs are the old h and the value
        metas = (h.meta, value.meta if tracked_value else None)
        if GRAD_MODE.enabled and any(m is not None for m in metas):
            h.meta = Meta(Node("index_put", metas, vjp))
            h.recipe = None  # its value is now the written result: kept as saved

    def cat(self, hs: Sequence[ADArray], dim: int) -> ADArray:
        inner = self.inner
        value = inner.cat([h.value for h in hs], dim)
        if not self.tracking(*hs):
            return self.wrap(value)
        spans = []
        off = 0
        for h in hs:
            n = h.shape[dim]
            spans.append(None if h.meta is None else (off, off + n))
            off += n
        head = (slice(None),) * dim

        def vjp(g: Any) -> list[Any]:
            return [None if s is None else inner.getitem(g, head + (slice(s[0], s[1]),)) for s in spans]

        return self.record("cat", value, tuple(hs), vjp,
                           recompute=self._recompute(lambda *xs: inner.cat(list(xs), dim), *hs))

    # ------------------------------------------------------------------------------------------------------
    # fast rules for default compositions (the inner backend's own method forward)
    # ------------------------------------------------------------------------------------------------------
    def keep_graph(self, out: ADArray, inputs: Sequence[Any]) -> ADArray:
        """``out`` (built without reading ``inputs``: an empty op skipped its kernel) tied to the inputs that
        require grad, so backward reaches them and gives each a zero gradient of its own shape and dtype (empty
        for empty inputs), as PyTorch does, instead of none."""
        tied = [h for h in inputs if type(h) is ADArray and h.meta is not None]
        if not tied or not GRAD_MODE.enabled:
            return out
        inner = self.inner
        kind = inner.dtype_of(out.value)
        if not (kind.is_floating_point or kind.is_complex):
            return out
        specs = [(tuple(h.shape), inner.dtype_of(h.value)) for h in tied]

        def vjp(g: Any) -> list[Any]:
            return [g] + [inner.full(shape, 0, dtype) for shape, dtype in specs]

        return self.record("keep_graph", out.value, (out, *tied), vjp)

    def flip(self, h: ADArray, dims: tuple[int, ...]) -> ADArray:
        inner = self.inner
        value = inner.flip(h.value, dims)
        if not self.tracking(h):
            return self.wrap(value)
        return self.record("flip", value, (h,), lambda g: (inner.flip(g, dims),),
                           recompute=self._recompute(lambda x: inner.flip(x, dims), h))

    def gather(self, h: ADArray, dim: int, index: ADArray) -> ADArray:
        inner = self.inner
        value = inner.gather(h.value, dim, index.value)
        if not self.tracking(h):
            return self.wrap(value)
        shape = tuple(h.shape)
        idx = self.save(index)

        def vjp(g: Any) -> tuple[Any]:
            # repeated indices gather one entry several times: their gradients add up
            return (inner.scatter(_zeros(inner, shape, g), dim, idx(), g, "add"),)

        return self.record("gather", value, (h,), vjp,
                           recompute=self._recompute(lambda x, i: inner.gather(x, dim, i), h, index))

    def scatter(self, h: ADArray, dim: int, index: ADArray, src: Any, reduce: str | None) -> ADArray:
        inner = self.inner
        if reduce not in (None, "add", "sum") and self.tracking(h, src):
            # multiply: the default composition, differentiated through the primitives it runs on this stack
            return Backend.scatter(self, h, dim, index, src, reduce)  # type: ignore[arg-type]
        value = inner.scatter(h.value, dim, index.value, _v(src), reduce)
        if not self.tracking(h, src):
            return self.wrap(value)
        idx = self.save(index)
        want_h = h.meta is not None
        sshape = tuple(src.shape) if type(src) is ADArray and src.meta is not None else None

        def vjp(g: Any) -> tuple[Any, Any]:
            i = idx()
            gh = None
            if want_h:
                # replace: the overwritten positions get no gradient; add: everything passes through
                gh = g if reduce is not None else inner.scatter(g, dim, i, 0.0, None)
            gs = None
            if sshape is not None:
                gs = inner.gather(g, dim, i)
                if tuple(gs.shape) != sshape:  # src larger than index: its unused part gets zeros
                    full = _zeros(inner, sshape, g)
                    inner.setitem(full, tuple(slice(0, n) for n in gs.shape), gs)
                    gs = full
            return gh, gs

        return self.record("scatter", value, (h, src), vjp,
                           recompute=self._recompute(
                               lambda x, i, s: inner.scatter(x, dim, i, s, reduce), h, index, src))

    def index_select(self, h: ADArray, dim: int, index: ADArray) -> ADArray:
        inner = self.inner
        value = inner.index_select(h.value, dim, index.value)
        if not self.tracking(h):
            return self.wrap(value)
        shape = tuple(h.shape)
        idx = self.save(index)

        def vjp(g: Any) -> tuple[Any]:
            gs = tuple(g.shape)
            view = tuple(gs[d] if d == dim else 1 for d in range(len(gs)))
            full = inner.expand(inner.reshape(idx(), view), gs)
            return (inner.scatter(_zeros(inner, shape, g), dim, full, g, "add"),)  # index_add of g

        return self.record("index_select", value, (h,), vjp,
                           recompute=self._recompute(lambda x, i: inner.index_select(x, dim, i), h, index))

    def masked_fill(self, h: ADArray, mask: ADArray, value: Any) -> ADArray:
        inner = self.inner
        out = inner.masked_fill(h.value, mask.value, value)
        if not self.tracking(h):
            return self.wrap(out)
        m = self.save(mask)
        return self.record("masked_fill", out, (h,), lambda g: (inner.where(m(), 0.0, g),),
                           recompute=self._recompute(lambda x, mk: inner.masked_fill(x, mk, value), h, mask))

    def tril(self, h: ADArray, diagonal: int, upper: bool) -> ADArray:
        inner = self.inner
        value = inner.tril(h.value, diagonal, upper)
        if not self.tracking(h):
            return self.wrap(value)
        return self.record("triu" if upper else "tril", value, (h,), lambda g: (inner.tril(g, diagonal, upper),),
                           recompute=self._recompute(lambda x: inner.tril(x, diagonal, upper), h))

    def pad(self, h: ADArray, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> ADArray:
        inner = self.inner
        if not self.tracking(h):
            return self.wrap(inner.pad(h.value, pads, mode, value))
        if mode != "constant":
            # reflect/replicate/circular: the default composition, differentiated through its primitives
            return Backend.pad(self, h, pads, mode, value)  # type: ignore[arg-type]
        out = inner.pad(h.value, pads, mode, value)
        shape = tuple(h.shape)
        full = [(0, 0)] * (len(shape) - len(pads)) + [(int(lo), int(hi)) for lo, hi in pads]
        # the part of h that survives (negative pads crop), in h's and in the output's coordinates
        kept = [sz - max(-lo, 0) - max(-hi, 0) for sz, (lo, hi) in zip(shape, full)]
        out_key = tuple(slice(max(lo, 0), max(lo, 0) + c) for c, (lo, hi) in zip(kept, full))
        cropped = any(lo < 0 or hi < 0 for lo, hi in full)
        in_key = tuple(slice(max(-lo, 0), max(-lo, 0) + c) for c, (lo, hi) in zip(kept, full))

        def vjp(g: Any) -> tuple[Any]:
            gi = inner.getitem(g, out_key)
            if cropped:  # cropped-away entries of h get zeros
                z = _zeros(inner, shape, g)
                inner.setitem(z, in_key, gi)
                gi = z
            return (gi,)

        return self.record("constant_pad", out, (h,), vjp,
                           recompute=self._recompute(lambda x: inner.pad(x, pads, mode, value), h))
