"""The backend contract (version 1).

A backend turns ember's ops into work on one kind of hardware. It subclasses :class:`Backend` and implements the
*required primitives* (the methods that raise :class:`~ember.errors.UnsupportedError` here); every other method
has a *default composition* written in terms of those primitives, which a backend may override with a faster
implementation (the Thinc/tinygrad lesson: start small, override hot paths later).

Conventions every method follows:

* A *handle* is the backend's own array object. It must expose ``.shape`` (a tuple of ints). ember keeps the
  dtype beside the handle, so a handle need not know its ember dtype.
* Core validates everything before calling a backend: shapes broadcast, dims are normalised to non-negative
  ints, index values are in range, dtypes are promoted. Backends never see bad input and need not re-check.
* Binary primitives receive operands of one dtype (core casts first) or a Python scalar for either operand.
  Comparisons and logical ops return bool handles; everything else returns the operands' dtype.
* Methods may return views of their inputs (as numpy slicing does) only where PyTorch returns views
  (``reshape`` of contiguous data, ``permute``, ``expand``, basic ``getitem``); ``assign`` and ``setitem``
  mutate their first argument in place.

``ember.testing`` (the conformance kit) is the executable form of this contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from . import _compositions
from . import dtypes as dt
from .dtypes import DType
from .errors import UnsupportedError

# the elementwise op names unary() and binary() accept come from the op registry (a leaf module, one entry per op)
from .opinfo import BINARY_OPS, COMPARISON_OPS, PREDICATE_UNARY_OPS, UNARY_OPS  # noqa: F401

Handle = Any
Shape = tuple[int, ...]

REDUCE_OPS = frozenset({"sum", "prod", "max", "min"})

#: the methods every backend must implement; everything else on Backend has a default composition
REQUIRED_PRIMITIVES = frozenset(
    """from_numpy to_numpy full arange cast copy dtype_of assign unary binary where reduce argreduce cumulative
    matmul sort reshape permute expand getitem setitem cat seed rand randn""".split()
)


class Backend:
    """Base class of every backend. See the module docstring for the conventions."""

    #: the device kind this backend serves ("flex", "cuda", ...); set by subclasses
    name: str = "abstract"
    #: the contract version implemented; checked at registration
    contract_version: int = 1
    #: dtypes this backend can store and compute
    supported_dtypes: frozenset[DType] = frozenset(dt.ALL_DTYPES)

    #: True for stacks that record gradients (the autodiff decorator). Core's gradient API (``backward``,
    #: ``.grad``, ``requires_grad_`` ...) forwards to such a stack and raises AutodiffError elsewhere.
    differentiable: bool = False

    #: Optional shortcut of eager binary operators (``a + b`` on two tensors of one dtype): op name -> ``kernel(a,
    #: b)``, called by core's Tensor operators instead of :meth:`binary`, without a shape check first. A kernel
    #: must return exactly what ``binary(op, a, b)`` returns for two handles of this backend of one dtype whose
    #: shapes broadcast, the first with more than one element (so never 0-d) and each with fewer than
    #: :attr:`binary_kernel_elems`; and it must raise (any exception) where the shapes do not broadcast: core then
    #: runs its checked path (``binary``), which raises the typed error. Ops missing from the mapping go through
    #: ``binary``. None (the default, and every decorator's): core calls ``binary``. Handles of a backend that sets
    #: it expose ``.size`` (their element count).
    binary_kernels: Mapping[str, Callable[[Handle, Handle], Handle]] | None = None
    #: the element count below which :attr:`binary_kernels` may be called (both operands)
    binary_kernel_elems: int = 0

    def __init__(self, index: int = 0) -> None:
        self.index = index

    # ------------------------------------------------------------------------------------------------------
    # decorated stacks: moving handles between Device.flex() and Device.flex().autodiff() shares the data
    # ------------------------------------------------------------------------------------------------------
    def lift(self, h: Handle) -> Handle:
        """Adopt a handle of the undecorated backend (a decorator wraps it; a backend returns it as is)."""
        return h

    def lower(self, h: Handle) -> Handle:
        """The undecorated backend's handle for h (a decorator unwraps it; a backend returns it as is)."""
        return h

    @property
    def base_backend(self) -> Backend:
        """The backend at the bottom of a decorator chain: the backend itself here (a decorator returns its inner
        stack's). Extension kernels are looked up by its name."""
        return self

    def extension_kernel(self, op: Any) -> Any:
        """The kernel this backend runs ``op`` with when the op registered none for its name, or None (the
        composition runs). A backend that runs every op elsewhere (a remote device: one record, the server's own
        kernel) answers here instead of registering a kernel on every op of the shared registry."""
        return None

    def run_extension(self, call: Any) -> Any:
        """Run an extension op's kernel on this backend: ``call.kernel(self, *call.args, **call.kwargs)``, where
        ``call`` is an :class:`ember.extension.ExtensionCall` whose ``args`` are this backend's handles; returns the
        kernel's handle (or tuple of handles). In debug mode (``EMBER_DEBUG=1``) the outputs are checked against
        the op's output spec. Decorators override it with their policy (see :class:`ember.backend.Decorator`)."""
        return call.run_kernel(self)

    def _missing(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"backend {self.name!r} does not implement the required primitive {what}()")

    # ------------------------------------------------------------------------------------------------------
    # device management
    # ------------------------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Wait until queued work is done (no-op for synchronous backends)."""

    def memory_report(self) -> dict[str, Any]:
        """Memory statistics: at least ``in_use``, ``reserved`` and ``peak`` bytes where the backend knows them."""
        return {}

    def memory_dry_run(self) -> AbstractContextManager[dict[str, Any]]:
        """Record the allocations of the workload run inside the context and size the memory pools from them;
        yields a dict of the recorded statistics (filled on exit). Backends without a pool do nothing."""
        return nullcontext({})

    def describe(self) -> str:
        """One line naming the hardware (shown by ``ember info``)."""
        return f"{self.name}:{self.index}"

    # ------------------------------------------------------------------------------------------------------
    # fusion: code generation for fused blocks (optional)
    # ------------------------------------------------------------------------------------------------------
    #: whether the fusion decorator wraps this backend on devices that do not name it (a backend that supports
    #: fusion, see :meth:`fusion_compile`). False where fused kernels do not beat the backend's own ops run one by
    #: one (flex: numpy chains), so recording would only add its cost; ``dev.fusion()`` still fuses there, and
    #: ``ember.compile`` fuses replayed steps through :meth:`fusion_compile` either way.
    fuse_by_default: bool = True

    def may_share_memory(self, a: Handle, b: Handle) -> bool:
        """False only when a and b certainly use disjoint memory (numpy's ``may_share_memory``). The fusion
        decorator writes an in-place result straight into its target when no other input may alias it; the
        conservative default keeps it from doing so."""
        return True

    def fusion_compile(self, kernel: Any) -> Any:
        """Compile one fused block, an :class:`ember.ir.Kernel`, into an :data:`ember.ir.CompiledKernel`, or
        return None to have it run op by op (the fusion decorator then calls this backend's contract methods).

        A backend that overrides this method *supports fusion*: with ember-fusion installed its devices fuse by
        default. It may return None for any kernel it cannot or would rather not fuse (an unsupported dtype, a
        kernel too small to pay for itself); the result is cached per kernel by the caller, so this is called once
        per distinct kernel structure.
        """
        return None

    # ------------------------------------------------------------------------------------------------------
    # required primitives: data
    # ------------------------------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Handle:
        """Copy (or adopt) a host array; its numpy dtype is the ember dtype's ``.numpy``."""
        raise self._missing("from_numpy")

    def to_numpy(self, h: Handle) -> np.ndarray:
        """The handle's data as a host numpy array (may share memory on host backends)."""
        raise self._missing("to_numpy")

    def full(self, shape: Shape, value: Any, dtype: DType) -> Handle:
        raise self._missing("full")

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> Handle:
        raise self._missing("arange")

    def cast(self, h: Handle, dtype: DType) -> Handle:
        """A new handle converted to dtype (float->int truncates toward zero, as C and PyTorch do)."""
        raise self._missing("cast")

    def copy(self, h: Handle) -> Handle:
        """A contiguous copy that shares no memory with h."""
        raise self._missing("copy")

    def dtype_of(self, h: Handle) -> DType:
        """The ember dtype of a handle (decorators use it, e.g. to cast a gradient back to its input's dtype)."""
        raise self._missing("dtype_of")

    def assign(self, dst: Handle, src: Handle | Any) -> None:
        """Copy src (a handle broadcastable to dst's shape, or a scalar) into dst in place."""
        raise self._missing("assign")

    # ------------------------------------------------------------------------------------------------------
    # required primitives: compute
    # ------------------------------------------------------------------------------------------------------
    def unary(self, op: str, h: Handle) -> Handle:
        """Elementwise op from UNARY_OPS. Predicates return bool handles."""
        raise self._missing("unary")

    def binary(self, op: str, a: Handle | Any, b: Handle | Any) -> Handle:
        """Elementwise op from BINARY_OPS with numpy broadcasting; either operand may be a Python scalar."""
        raise self._missing("binary")

    def where(self, cond: Handle, a: Handle | Any, b: Handle | Any) -> Handle:
        raise self._missing("where")

    def reduce(self, op: str, h: Handle, dims: tuple[int, ...], keepdim: bool) -> Handle:
        """sum/prod/max/min over dims (non-empty, normalised). max/min propagate NaN."""
        raise self._missing("reduce")

    def argreduce(self, op: str, h: Handle, dim: int | None, keepdim: bool) -> Handle:
        """argmax/argmin (int64) over one dim, or the flattened tensor when dim is None; first occurrence wins
        and NaN counts as the extreme value."""
        raise self._missing("argreduce")

    def cumulative(self, op: str, h: Handle, dim: int) -> Handle:
        """Inclusive scan along dim; op in sum, prod."""
        raise self._missing("cumulative")

    def matmul(self, a: Handle, b: Handle) -> Handle:
        """numpy.matmul semantics (1-d promotion, batch broadcasting); operands share a dtype."""
        raise self._missing("matmul")

    def sort(self, h: Handle, dim: int, descending: bool, stable: bool) -> tuple[Handle, Handle]:
        """(values, int64 indices); NaN sorts as the largest value (PyTorch)."""
        raise self._missing("sort")

    # ------------------------------------------------------------------------------------------------------
    # required primitives: movement and indexing
    # ------------------------------------------------------------------------------------------------------
    def reshape(self, h: Handle, shape: Shape) -> Handle:
        raise self._missing("reshape")

    def permute(self, h: Handle, dims: tuple[int, ...]) -> Handle:
        raise self._missing("permute")

    def expand(self, h: Handle, shape: Shape) -> Handle:
        """Broadcast to shape (a view where possible)."""
        raise self._missing("expand")

    def getitem(self, h: Handle, key: tuple[Any, ...]) -> Handle:
        """numpy indexing: key holds ints (in range), slices, None, Ellipsis, and int64/bool handles."""
        raise self._missing("getitem")

    def setitem(self, h: Handle, key: tuple[Any, ...], value: Handle | Any) -> None:
        """In-place numpy-style assignment h[key] = value (value broadcast to the indexed shape)."""
        raise self._missing("setitem")

    def cat(self, hs: Sequence[Handle], dim: int) -> Handle:
        raise self._missing("cat")

    # ------------------------------------------------------------------------------------------------------
    # required primitives: random numbers (each device owns its reproducible stream)
    # ------------------------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        raise self._missing("seed")

    def rand(self, shape: Shape, dtype: DType) -> Handle:
        """Uniform [0, 1)."""
        raise self._missing("rand")

    def randn(self, shape: Shape, dtype: DType) -> Handle:
        raise self._missing("randn")

    # ------------------------------------------------------------------------------------------------------
    # default compositions (override for speed)
    # ------------------------------------------------------------------------------------------------------
    def randint(self, low: int, high: int, shape: Shape, dtype: DType) -> Handle:
        u = self.rand(shape, dt.float64)
        r = self.unary("floor", self.binary("add", self.binary("mul", u, float(high - low)), float(low)))
        return self.cast(r, dtype)

    def new_random_stream(self, seed: int) -> Any:
        """A new random stream started from ``seed`` (an int in [0, 2**64)) for an ``ember.Generator`` of this
        backend: an object with ``rand(shape, dtype)``, ``randn(shape, dtype)``, ``randint(low, high, shape,
        dtype)`` returning this backend's handles, and ``get_state() -> bytes`` / ``set_state(bytes)`` that restore
        it exactly (see :class:`ember.generator.RandomStream`). It never touches the device's own stream (``seed``,
        ``rand``, ...). The default draws on the host with numpy's Philox4x32-10 and uploads with ``from_numpy``;
        a backend with an on-device generator returns its own stream."""
        from .generator import HostRandomStream

        return HostRandomStream(self, np.random.Philox(seed))

    def inplace_binary(self, op: str, a: Handle, b: Handle | Any) -> None:
        """a = a (op) b in place; the result already has a's dtype and shape (core checked)."""
        self.assign(a, self.binary(op, a, b))

    def contiguous(self, h: Handle) -> Handle:
        return self.copy(h)

    def flip(self, h: Handle, dims: tuple[int, ...]) -> Handle:
        key = tuple(slice(None, None, -1) if d in dims else slice(None) for d in range(len(h.shape)))
        return self.copy(self.getitem(h, key))  # a reversed slice is a view; flip returns new memory

    def _index_grid(self, shape: Shape, dim: int, index: Handle) -> tuple[Handle, ...]:
        """Advanced-indexing key selecting index[..] along dim and the own position elsewhere."""
        key = []
        for d in range(len(shape)):
            if d == dim:
                key.append(index)
            else:
                view = [1] * len(shape)
                view[d] = shape[d]
                ar = self.reshape(self.arange(0, shape[d], 1, dt.int64), tuple(view))
                key.append(self.expand(ar, shape))
        return tuple(key)

    def gather(self, h: Handle, dim: int, index: Handle) -> Handle:
        return self.getitem(h, self._index_grid(index.shape, dim, index))

    def scatter(self, h: Handle, dim: int, index: Handle, src: Handle | Any, reduce: str | None) -> Handle:
        """A copy of h with src scattered along dim at index; reduce is None (replace), 'add' or 'multiply'.

        For replace, duplicate indices keep one of the written values (unspecified which, as in PyTorch).
        """
        return _compositions.scatter(self, h, dim, index, src, reduce)

    def index_select(self, h: Handle, dim: int, index: Handle) -> Handle:
        key = (slice(None),) * dim + (index,)
        return self.getitem(h, key)

    def masked_fill(self, h: Handle, mask: Handle, value: Any) -> Handle:
        return self.where(mask, value, h)

    def tril(self, h: Handle, diagonal: int, upper: bool) -> Handle:
        rows, cols = h.shape[-2], h.shape[-1]
        r = self.reshape(self.arange(0, rows, 1, dt.int64), (rows, 1))
        c = self.reshape(self.arange(0, cols, 1, dt.int64), (1, cols))
        diff = self.binary("sub", c, r)
        keep = self.binary("ge" if upper else "le", diff, diagonal)
        return self.where(keep, h, 0)

    def softmax(self, h: Handle, dim: int, log: bool) -> Handle:
        m = self.reduce("max", h, (dim,), True)  # an infinite max gives a NaN row (inf - inf), as in PyTorch
        z = self.binary("sub", h, m)
        e = self.unary("exp", z)
        s = self.reduce("sum", e, (dim,), True)
        if log:
            return self.binary("sub", z, self.unary("log", s))
        return self.binary("div", e, s)

    def logsumexp(self, h: Handle, dims: tuple[int, ...], keepdim: bool) -> Handle:
        m = self.reduce("max", h, dims, True)
        m = self.where(self.unary("isfinite", m), m, 0.0)
        s = self.reduce("sum", self.unary("exp", self.binary("sub", h, m)), dims, True)
        r = self.binary("add", self.unary("log", s), m)
        if not keepdim:
            r = self.reshape(r, tuple(n for d, n in enumerate(h.shape) if d not in dims))
        return r

    def topk(self, h: Handle, k: int, dim: int, largest: bool, sorted_: bool) -> tuple[Handle, Handle]:
        v, i = self.sort(h, dim, largest, True)
        key = (slice(None),) * dim + (slice(0, k),)
        return self.getitem(v, key), self.getitem(i, key)

    def einsum(self, equation: str, *hs: Handle) -> Handle:
        return _compositions.einsum(self, equation, *hs)

    # -- gradient routing: results computed elsewhere, declared for differentiable stacks ---------------------
    def select_at(self, h: Handle, dim: int, index: Handle, values: Handle) -> Handle:
        """``values``, already computed and equal to ``gather(h, dim, index)`` reshaped to ``values.shape``
        (``index`` has h's rank, or h's rank without ``dim``, as argreduce returns it without keepdim), declared as
        selected from h at ``index`` along ``dim``. A differentiable stack
        sends the result's gradient to those elements (PyTorch's rule for max/min along a dim and cummax/cummin:
        the gradient follows the returned indices); every other stack returns ``values`` unchanged."""
        return values

    def select_ties(self, h: Handle, value: Handle) -> Handle:
        """``value``, a 0-d handle already computed from h (its max, min or median), declared as selected from
        the elements of h equal to it. A differentiable stack splits the result's gradient evenly among them
        (among h's NaNs when value is NaN): PyTorch's rule for max(), min() and median() without dim. Every
        other stack returns ``value`` unchanged."""
        return value

    def keep_graph(self, out: Handle, inputs: Sequence[Handle]) -> Handle:
        """``out``, built without reading ``inputs`` (an op whose input or output is empty skips its kernel),
        declared to depend on them. A differentiable stack ties it to the inputs that require grad, so their
        gradients are zeros of their own shapes (empty for empty inputs) as in PyTorch, not missing. Every
        other stack returns ``out`` unchanged."""
        return out

    def write_back(self, dst: Handle, src: Handle, op: str) -> Handle:
        """Make ``src`` (dst's dtype and shape) the contents of ``dst`` for an in-place op computed out of place,
        and return the handle the tensor holds from now on: ``dst`` after copying ``src`` into it (views of
        dst see the result). A differentiable stack that tracks dst returns ``src`` instead (overwriting dst
        would invalidate the values its graph saved) and refuses a leaf that requires grad."""
        self.assign(dst, src)
        return dst

    def embedding(self, weight: Handle, index: Handle, padding_idx: int | None) -> Handle:
        """Rows of the 2-d ``weight`` at the 1-d int64 ``index`` (in range; core checked). ``padding_idx`` (non-
        negative, or None) names the row whose gradient a differentiable stack keeps at zero (PyTorch); the
        values are the same either way."""
        return self.index_select(weight, 0, index)

    # -- neural-network composites (see ember._compositions for the defaults) --------------------------------
    def relu(self, h: Handle) -> Handle:
        """max(h, 0); NaN propagates. A differentiable stack gives PyTorch's gradient: zero where h <= 0 (at 0
        too, where maximum's rule would split the tie)."""
        return self.binary("maximum", h, 0.0 if self.dtype_of(h).is_floating_point else 0)

    def clamp(self, h: Handle, lo: Handle | Any | None, hi: Handle | Any | None) -> Handle:
        """h clamped to [lo, hi]: each bound a handle of h's dtype (broadcasting with h), a scalar, or None (at
        least one given; core checked). max(h, lo) then min(., hi), so hi wins where hi < lo and NaN propagates, as
        in PyTorch. A differentiable stack gives PyTorch's gradients: h's where lo <= h <= hi (never at NaN), a
        tensor lo's where h < lo < hi, a tensor hi's where h > hi or hi < lo."""
        if lo is not None:
            h = self.binary("maximum", h, lo)
        if hi is not None:
            h = self.binary("minimum", h, hi)
        return h

    def clamped_norm(self, h: Handle, dim: int, eps: float) -> Handle:
        """max(||h||_2, eps) along dim, kept as size 1 (cosine_similarity's denominator). A differentiable stack
        gives torch's gradient: that of the unclamped norm (the clamp is invisible to it), 0 at a zero vector."""
        ss = self.reduce("sum", self.binary("mul", h, h), (dim,), True)
        return self.binary("maximum", self.unary("sqrt", ss), float(eps))

    def hardtanh(self, h: Handle, lo: Any, hi: Any) -> Handle:
        """h clamped to [lo, hi] (scalars valid for h's dtype, lo <= hi; core checked). A differentiable stack
        gives PyTorch's gradient: zero where h <= lo or h >= hi (the bounds included; a NaN passes it)."""
        return self.binary("minimum", self.binary("maximum", h, lo), hi)

    def conv(self, x: Handle, w: Handle, b: Handle | None, stride: tuple[int, ...],
             padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> Handle:
        """N-d convolution (cross-correlation), torch layouts; padding is (lo, hi) per spatial dim."""
        return _compositions.conv(self, x, w, b, stride, padding, dilation, groups)

    def conv_transpose(self, x: Handle, w: Handle, b: Handle | None, stride: tuple[int, ...],
                       padding: tuple[int, ...], output_padding: tuple[int, ...], dilation: tuple[int, ...],
                       groups: int) -> Handle:
        return _compositions.conv_transpose(self, x, w, b, stride, padding, output_padding, dilation, groups)

    def max_pool(self, x: Handle, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], dilation: tuple[int, ...], ceil_mode: bool,
                 return_indices: bool) -> Handle | tuple[Handle, Handle]:
        return _compositions.max_pool(self, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def avg_pool(self, x: Handle, kernel_size: tuple[int, ...], stride: tuple[int, ...],
                 padding: tuple[int, ...], ceil_mode: bool, count_include_pad: bool,
                 divisor_override: int | None) -> Handle:
        return _compositions.avg_pool(self, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                      divisor_override)

    def adaptive_avg_pool(self, x: Handle, output_size: tuple[int, ...]) -> Handle:
        return _compositions.adaptive_avg_pool(self, x, output_size)

    def adaptive_max_pool(self, x: Handle, output_size: tuple[int, ...],
                          return_indices: bool) -> Handle | tuple[Handle, Handle]:
        return _compositions.adaptive_max_pool(self, x, output_size, return_indices)

    def interpolate(self, x: Handle, size: tuple[int, ...], mode: str, align_corners: bool | None,
                    scales: tuple[float, ...] | None) -> Handle:
        return _compositions.interpolate(self, x, size, mode, align_corners, scales)

    def pad(self, h: Handle, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> Handle:
        """Pad every dim by (lo, hi); mode constant/reflect/replicate/circular; negative pads crop."""
        return _compositions.pad(self, h, pads, mode, value)



def __getattr__(name: str) -> Any:
    """``ember.backend.Decorator`` and ``Differentiable`` live in :mod:`ember.decorator`, which imports this module
    (a lazy attribute, so the two modules form no import cycle)."""
    if name in ("Decorator", "Differentiable"):
        from . import decorator

        return getattr(decorator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
