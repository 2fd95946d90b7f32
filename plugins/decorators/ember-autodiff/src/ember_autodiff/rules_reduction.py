"""Gradient rules of reductions, scans, sorting and softmax: reduce, cumulative, sort, topk, softmax, logsumexp.

Each vjp computes with the inner backend on plain values and follows PyTorch's backward formulas: sum expands
the gradient back; amax/amin (and full max/min) split it evenly among ties; prod and cumprod stay exact when the
input holds zeros (no division by zero); sort and topk scatter it back through their indices. Every rule is
memory-bound, so each passes ``recompute=`` for balanced checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember import dtypes as dt
from ember.capture import is_capturing
from ember.compile import is_recording

from .graph import ADArray
from .recorder import Recorder

Getter = Callable[[], Any]


def _keep_shape(shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _any(be: Any, mask: Any) -> bool:
    """Host-side any() of a bool handle (decides between the fast formula and the zero-safe one)."""
    if _numel(tuple(mask.shape)) == 0:
        return False
    return bool(be.to_numpy(be.reduce("max", mask, tuple(range(len(mask.shape))), False)))


def _branch_free() -> bool:
    """Whether a rule must not read values to pick its formula: while ``ember.compile`` records a step or
    ``ember.capture`` builds a graph (a read there is a graph break). The rule then computes every formula and
    selects with ``where`` on device: the selected values are the very ones the eager branch computes, so eager and
    replayed gradients stay bit-identical."""
    return is_recording() or is_capturing()


def _reverse_cumsum(be: Any, g: Any, dim: int) -> Any:
    return be.flip(be.cumulative("sum", be.flip(g, (dim,)), dim), (dim,))


def _exclusive_cumprod(be: Any, x: Any, dim: int, ones: Any) -> Any:
    """Product of the elements strictly before each position along dim (1 for the first)."""
    n = x.shape[dim]
    head = be.getitem(x, (slice(None),) * dim + (slice(0, n - 1),))
    return be.cat([ones, be.cumulative("prod", head, dim)], dim)


def _prod_of_others(be: Any, x: Any, dims: tuple[int, ...], dtype: Any) -> Any:
    """For every element, the product of the other elements of its reduction group (exact with zeros).

    The reduced dims are moved last and flattened into one, then the product of the others is the exclusive
    cumprod from the left times the exclusive cumprod from the right (PyTorch's prod_safe_zeros_backward).
    """
    shape = tuple(x.shape)
    nd = len(shape)
    rest = tuple(d for d in range(nd) if d not in dims)
    perm = rest + tuple(dims)
    moved = be.permute(x, perm) if perm != tuple(range(nd)) else x
    lead = tuple(shape[d] for d in rest)
    last = len(rest)
    flat = be.reshape(moved, lead + (_numel(tuple(shape[d] for d in dims)),))
    ones = be.full(lead + (1,), 1, dtype)
    left = _exclusive_cumprod(be, flat, last, ones)
    right = be.flip(_exclusive_cumprod(be, be.flip(flat, (last,)), last, ones), (last,))
    others = be.reshape(be.binary("mul", left, right), tuple(moved.shape))
    if perm == tuple(range(nd)):
        return others
    inverse = tuple(sorted(range(nd), key=perm.__getitem__))
    return be.permute(others, inverse)


def _cumprod_vjp(be: Any, g: Any, x: Any, y: Any, dim: int, dtype: Any) -> Any:
    """Gradient of cumprod along dim; exact when x holds zeros (PyTorch's cumprod_backward)."""
    isz = be.binary("eq", x, 0.0)
    # without zeros the zero-safe formula below reduces to this one bit for bit (before is all true, x is
    # divided as is), so a recording skips the read and always takes it
    if not _branch_free() and not _any(be, isz):
        return be.binary("div", _reverse_cumsum(be, be.binary("mul", g, y), dim), x)
    # per slice, with z the first zero: k < z gets the usual formula (x_k != 0 there); k == z gets
    # sum_{j>=z} g_j * prod_{i<=j, i!=z} x_i, i.e. the reverse cumsum of g * cumprod(x with x_z := 1);
    # k > z gets 0 (every product it enters also contains x_z)
    zeros_so_far = be.cumulative("sum", be.cast(isz, dt.int64), dim)
    before = be.binary("eq", zeros_so_far, 0)
    first = be.binary("logical_and", isz, be.binary("eq", zeros_so_far, 1))
    a = be.binary("div", _reverse_cumsum(be, be.binary("mul", g, y), dim), be.where(before, x, 1.0))
    y1 = be.cumulative("prod", be.where(first, 1.0, x), dim)
    b = _reverse_cumsum(be, be.binary("mul", g, y1), dim)
    return be.where(before, a, be.where(first, b, 0.0))


class ReductionRules(Recorder):
    """Mixin of AutodiffBackend: reductions, scans, sort/topk, softmax and logsumexp with their gradients."""

    def _saved_for_recompute(self, h: ADArray) -> Getter | None:
        # a rule whose vjp does not read its input saves it only for recomputation under checkpointing,
        # so that without checkpointing the input's memory is not held by the graph
        return self.save(h) if self.balanced else None

    def reduce(self, op: str, h: ADArray, dims: tuple[int, ...], keepdim: bool) -> ADArray:
        inner = self.inner
        value = inner.reduce(op, h.value, dims, keepdim)
        if not self.tracking(h):
            return self.wrap(value)
        shape = tuple(h.shape)

        def keep(v: Any) -> Any:  # reduced dims back as size 1, so that v broadcasts against the input
            # the kept shape is worked out here, at backward: recording a reduction (every loss) skips it
            return v if keepdim else inner.reshape(v, _keep_shape(shape, dims))

        if op == "sum":
            xs = self._saved_for_recompute(h)
            return self.record(
                "sum", value, (h,), lambda g: (inner.expand(keep(g), shape),),
                recompute=None if xs is None else lambda: inner.reduce("sum", xs(), dims, keepdim))
        x = self.save(h)
        dtype = inner.dtype_of(h.value)

        if op == "prod":
            def vjp(g: Any) -> tuple[Any]:
                # PyTorch's prod_backward: g * y / x when the input holds no zero; else g times the product of
                # the others (exact with zeros) for every element; prod() of everything with two zeros or more
                # gives exactly zero (the product of the others always holds a zero; an inf or NaN beside it must
                # not make it NaN)
                xv = x()
                gk = keep(g)
                isz = inner.binary("eq", xv, 0.0)
                everything = len(dims) == len(shape) and _numel(shape) > 1
                if _numel(shape) == 0:
                    return (inner.binary("div", inner.binary("mul", gk, keep(y())), xv),)
                if _branch_free():  # no read: both formulas, picked on device
                    # the zeros divided by 1 (no division by zero): where no zero exists that is x itself, and
                    # where one does this formula is not the one picked
                    fast = inner.binary("div", inner.binary("mul", gk, keep(y())), inner.where(isz, 1.0, xv))
                    safe = inner.binary("mul", gk, _prod_of_others(inner, xv, dims, dtype))
                    out = inner.where(inner.reduce("max", isz, tuple(range(len(shape))), False), safe, fast)
                    if everything:
                        zeros = inner.reduce("sum", inner.cast(isz, dt.int64), dims, False)
                        out = inner.where(inner.binary("gt", zeros, 1), 0.0, out)
                    return (out,)
                if not _any(inner, isz):
                    return (inner.binary("div", inner.binary("mul", gk, keep(y())), xv),)
                if everything:
                    zeros = inner.reduce("sum", inner.cast(isz, dt.int64), dims, False)
                    if int(inner.to_numpy(zeros)) > 1:
                        return (inner.full(shape, 0, dtype),)
                return (inner.binary("mul", gk, _prod_of_others(inner, xv, dims, dtype)),)
        else:
            def vjp(g: Any) -> tuple[Any]:
                # amax/amin: g * (x == y) / count, the gradient split evenly among ties (PyTorch)
                mask = inner.cast(inner.binary("eq", x(), keep(y())), dtype)
                count = inner.reduce("sum", mask, dims, True)
                return (inner.binary("mul", inner.binary("div", keep(g), count), mask),)

        out = self.record(op, value, (h,), vjp,
                          recompute=lambda: inner.reduce(op, x(), dims, keepdim))
        y = self.save(out)
        return out

    def cumulative(self, op: str, h: ADArray, dim: int) -> ADArray:
        inner = self.inner
        value = inner.cumulative(op, h.value, dim)
        if not self.tracking(h):
            return self.wrap(value)
        if op == "sum":
            xs = self._saved_for_recompute(h)
            return self.record(
                "cumsum", value, (h,), lambda g: (_reverse_cumsum(inner, g, dim),),
                recompute=None if xs is None else lambda: inner.cumulative("sum", xs(), dim))
        x = self.save(h)
        dtype = inner.dtype_of(h.value)
        out = self.record("cumprod", value, (h,),
                          lambda g: (_cumprod_vjp(inner, g, x(), y(), dim, dtype),),
                          recompute=lambda: inner.cumulative("prod", x(), dim))
        y = self.save(out)
        return out

    def _selected(self, name: str, h: ADArray, values: Any, indices: Any, dim: int,
                  recompute: Callable[[Getter], Getter]) -> tuple[ADArray, ADArray]:
        """Values picked from h along dim at indices: the gradient is scattered back through the indices."""
        inner = self.inner
        idx = self.wrap(indices)
        if not self.tracking(h):
            return self.wrap(values), idx
        shape = tuple(h.shape)
        dtype = inner.dtype_of(h.value)
        ig = self.save(idx)  # version-checked: the user may modify the indices

        def vjp(g: Any) -> tuple[Any]:
            # the indices of one slice are distinct, so a plain scatter into zeros is exact
            return (inner.scatter(inner.full(shape, 0, dtype), dim, ig(), g, None),)

        xs = self._saved_for_recompute(h)
        out = self.record(name, values, (h,), vjp,
                          recompute=None if xs is None else recompute(xs))
        return out, idx

    # -- results core computed elsewhere and declares selected from h (Backend.select_at / select_ties) ---------
    def select_at(self, h: ADArray, dim: int, index: ADArray, values: ADArray) -> ADArray:
        """max/min along a dim and cummax/cummin: the gradient follows the returned indices (PyTorch), so it
        is scattered back through ``index`` (h's rank, or without ``dim`` as argmax without keepdim; repeated
        indices add up), whatever ``values`` recorded."""
        if not self.tracking(h):
            return values
        inner = self.inner
        shape, vshape = tuple(h.shape), tuple(values.shape)
        ishape = tuple(index.shape)
        if len(ishape) < len(shape):  # dim dropped: put it back as size 1, as gather and scatter want
            ishape = ishape[:dim] + (1,) + ishape[dim:]
        dtype = inner.dtype_of(h.value)
        ig = self.save(index)  # version-checked: the user may modify the returned indices

        def idx() -> Any:
            i = ig()
            return i if tuple(i.shape) == ishape else inner.reshape(i, ishape)

        def vjp(g: Any) -> tuple[Any]:
            gi = g if tuple(g.shape) == ishape else inner.reshape(g, ishape)
            return (inner.scatter(inner.full(shape, 0, dtype), dim, idx(), gi, "add"),)

        xs = self._saved_for_recompute(h)
        return self.record("select_at", values.value, (h,), vjp,
                           recompute=None if xs is None else
                           lambda: inner.reshape(inner.gather(xs(), dim, idx()), vshape))

    def select_ties(self, h: ADArray, value: ADArray) -> ADArray:
        """max(), min() and median() without dim: PyTorch splits the gradient evenly among the elements equal
        to the result, or among the NaNs when the result is NaN (amax's rule would give NaN: no element equals
        NaN)."""
        if not self.tracking(h):
            return value
        inner = self.inner
        dims = tuple(range(len(h.shape)))
        dtype = inner.dtype_of(h.value)
        x = self.save(h)
        v = value.value

        def vjp(g: Any) -> tuple[Any]:
            xv = x()
            nan = inner.binary("logical_and", inner.unary("isnan", xv), inner.unary("isnan", v))
            mask = inner.cast(inner.binary("logical_or", inner.binary("eq", xv, v), nan), dtype)
            count = inner.reduce("sum", mask, dims, False) if dims else mask
            return (inner.binary("mul", inner.binary("div", g, count), mask),)

        return self.record("select_ties", v, (h,), vjp)

    def clamped_norm(self, h: ADArray, dim: int, eps: float) -> ADArray:
        """cosine_similarity's max(||x||, eps): torch clamps without recording, so the gradient is the unclamped
        norm's, x / ||x||, and 0 at a zero vector (not sqrt's 0 * inf)."""
        inner = self.inner
        value = inner.clamped_norm(h.value, dim, eps)
        if not self.tracking(h):
            return self.wrap(value)
        x = self.save(h)

        def vjp(g: Any) -> tuple[Any]:
            xv = x()
            ss = inner.reduce("sum", inner.binary("mul", xv, xv), (dim,), True)
            pos = inner.binary("gt", ss, 0.0)
            n = inner.unary("sqrt", inner.where(pos, ss, 1.0))
            return (inner.where(pos, inner.binary("mul", g, inner.binary("div", xv, n)), 0.0),)

        return self.record("clamped_norm", value, (h,), vjp, recompute=lambda: inner.clamped_norm(x(), dim, eps))

    def sort(self, h: ADArray, dim: int, descending: bool, stable: bool) -> tuple[ADArray, ADArray]:
        inner = self.inner
        v, i = inner.sort(h.value, dim, descending, stable)
        return self._selected("sort", h, v, i, dim,
                              lambda x: lambda: inner.sort(x(), dim, descending, stable)[0])

    def topk(self, h: ADArray, k: int, dim: int, largest: bool, sorted_: bool) -> tuple[ADArray, ADArray]:
        inner = self.inner
        v, i = inner.topk(h.value, k, dim, largest, sorted_)
        return self._selected("topk", h, v, i, dim,
                              lambda x: lambda: inner.topk(x(), k, dim, largest, sorted_)[0])

    def softmax(self, h: ADArray, dim: int, log: bool) -> ADArray:
        inner = self.inner
        value = inner.softmax(h.value, dim, log)
        if not self.tracking(h):
            return self.wrap(value)

        if log:
            def vjp(g: Any) -> tuple[Any]:  # g - exp(y) * sum(g)
                s = inner.reduce("sum", g, (dim,), True)
                return (inner.binary("sub", g, inner.binary("mul", inner.unary("exp", y()), s)),)
        else:
            def vjp(g: Any) -> tuple[Any]:  # y * (g - sum(g * y))
                yv = y()
                s = inner.reduce("sum", inner.binary("mul", g, yv), (dim,), True)
                return (inner.binary("mul", yv, inner.binary("sub", g, s)),)

        xs = self._saved_for_recompute(h)
        out = self.record("log_softmax" if log else "softmax", value, (h,), vjp,
                          recompute=None if xs is None else lambda: inner.softmax(xs(), dim, log))
        y = self.save(out)
        return out

    def logsumexp(self, h: ADArray, dims: tuple[int, ...], keepdim: bool) -> ADArray:
        inner = self.inner
        value = inner.logsumexp(h.value, dims, keepdim)
        if not self.tracking(h):
            return self.wrap(value)
        kshape = _keep_shape(tuple(h.shape), dims)
        x = self.save(h)

        def keep(v: Any) -> Any:
            return v if keepdim else inner.reshape(v, kshape)

        def vjp(g: Any) -> tuple[Any]:  # g * exp(x - out)
            return (inner.binary("mul", keep(g), inner.unary("exp", inner.binary("sub", x(), keep(y())))),)

        out = self.record("logsumexp", value, (h,), vjp,
                          recompute=lambda: inner.logsumexp(x(), dims, keepdim))
        y = self.save(out)
        return out
