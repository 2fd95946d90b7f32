"""CuPyBackend's own kernels (pooling, interpolate, pad, softmax/logsumexp, convolution and its gradients,
gather/scatter) run end to end without a GPU: numpy stands in for CuPy (the host logic is the backend's, unchanged)
and every kernel launch runs the very program the backend asked for -- the shared generators' text, which is
OpenCL C before the CUDA/HIP dialect rewrites it -- on PoCL, with the launch's grid, block, arguments and shared
memory. Results are checked against torch. What this does not cover: the dialect's rewrite itself (compiled by
``ember kernels check --target cuda|hip``) and CuPy's own calls (checked by name in test_cupy_names.py)."""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from ember import dtypes as dt
from ember_cupy import backend as cupy_backend
from ember_cupy.backend import CuPyBackend

cl = pytest.importorskip("pyopencl")

RNG = np.random.default_rng(7)


class _PoCL:
    """Runs shared-vocabulary kernel programs on the first OpenCL device (PoCL in CI) the way CUDA would launch
    them: ``blocks`` x ``threads`` work-items, numpy arrays as buffers (a view's offset added to the element offset
    argument that follows it in every ember kernel signature), results copied back into the arrays' memory."""

    def __init__(self) -> None:
        try:
            platforms = cl.get_platforms()
            device = next(d for p in platforms for d in p.get_devices())
        except (cl.Error, StopIteration) as exc:  # pragma: no cover - CI has PoCL
            pytest.skip(f"no OpenCL device: {exc}")
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self.programs: dict[str, Any] = {}
        self.kernels: dict[tuple[str, str], Any] = {}
        self.launched: list[str] = []
        self.sources: set[str] = set()

    def _kernel(self, source: str, name: str) -> Any:
        kernel = self.kernels.get((source, name))
        if kernel is None:
            prog = self.programs.get(source)
            if prog is None:
                prog = self.programs[source] = cl.Program(self.ctx, source).build()
            kernel = self.kernels[(source, name)] = cl.Kernel(prog, name)
        return kernel

    @staticmethod
    def _root(a: np.ndarray) -> np.ndarray:
        """The bytes of the memory block a views: its owner's, which is dense in some order (numpy's astype and
        copy keep the layout, order 'K', as CuPy's do), as a uint8 array aliasing it."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        span = sum((n - 1) * abs(s) for n, s in zip(root.shape, root.strides)) + root.itemsize if root.size else 0
        assert span == root.nbytes and min(root.strides, default=0) >= 0, "owners hold dense memory"
        if not root.nbytes:
            return np.zeros(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * root.nbytes).from_address(root.ctypes.data))

    def run(self, source: str, name: str, blocks: int, threads: int, args: list[Any], shared_mem: int = 0) -> None:
        self.launched.append(name)
        self.sources.add(source)
        buffers: dict[int, tuple[np.ndarray, Any]] = {}  # by the address of the memory block
        call: list[Any] = []
        i = 0
        while i < len(args):
            a = args[i]
            if isinstance(a, np.ndarray):
                root = self._root(a)
                base = root.__array_interface__["data"][0] if root.nbytes else 0
                if base not in buffers or not root.nbytes:
                    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
                    host = root if root.nbytes else np.zeros(1, np.uint8)
                    buffers[base] = (root, cl.Buffer(self.ctx, flags, hostbuf=host))
                byte_off = a.__array_interface__["data"][0] - base if root.nbytes else 0
                assert byte_off % a.itemsize == 0
                off = args[i + 1]
                assert isinstance(off, np.int64), f"{name}: argument {i + 1} should be the element offset"
                call += [buffers[base][1], np.int64(int(off) + byte_off // a.itemsize)]
                i += 2
                continue
            call.append(a)
            i += 1
        if shared_mem:
            # the dialect drops the first `__local T* name` parameter (it becomes dynamic shared memory): put it back
            sig = re.search(rf"__kernel\s+void\s+{name}\s*\(([^)]*)\)", source)
            assert sig is not None
            params = [p.strip() for p in sig[1].split(",")]
            local = [j for j, p in enumerate(params) if p.startswith("__local")]
            assert len(local) == 1, "one __local parameter (the launcher's shared memory)"
            call.insert(local[0], cl.LocalMemory(shared_mem))
        self._kernel(source, name)(self.queue, (blocks * threads,), (threads,), *call)
        for root, buf in buffers.values():
            if root.nbytes:
                cl.enqueue_copy(self.queue, root, buf)
        self.queue.finish()


@pytest.fixture(scope="module")
def pocl() -> _PoCL:
    return _PoCL()


def _numpy_cupy() -> Any:
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.asnumpy = lambda a, stream=None, blocking=True, out=None: np.asarray(a)
    shim.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return shim


@pytest.fixture(scope="module")
def catalogued() -> set[str]:
    from ember_cupy import catalog

    return {src for _, src in catalog.all_sources()}


@pytest.fixture
def be(pocl: _PoCL, catalogued: set[str]) -> Iterator[CuPyBackend]:
    """The backend on the PoCL stand-in; afterwards, every program the test launched must be one the catalogue of
    ``ember kernels check`` compiles for CUDA and HIP (else its GPU text would go unchecked)."""
    b = CuPyBackend.__new__(CuPyBackend)
    b.index, b.name, b.platform = 0, "cuda", "cuda"
    b.cp = _numpy_cupy()
    b.device, b.stream = contextlib.nullcontext(), contextlib.nullcontext()
    b.pool = types.SimpleNamespace(used_bytes=lambda: 0, total_bytes=lambda: 0)
    b.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES if d is not dt.bfloat16)
    b._modules, b._peak, b._peak_reserved, b._key, b._offset, b._staged = {}, 0, 0, 0, 0, []
    b._lock = threading.Lock()
    b.__dict__["_multiprocessors"] = 8
    b.__dict__["_cudnn"] = None
    b.describe = lambda: "cuda:0 (PoCL stand-in)"  # type: ignore[method-assign]

    def launch(source: str, name: str, n: int, args: Any, shared_mem: int = 0) -> None:
        blocks = max(1, min(-(-n // cupy_backend._BLOCK), cupy_backend._MAX_BLOCKS))
        pocl.run(source, name, blocks, cupy_backend._BLOCK, list(args), shared_mem)

    def launch_groups(source: str, name: str, groups: int, block: int, args: Any, shared_mem: int = 0) -> None:
        pocl.run(source, name, groups, block, list(args), shared_mem)

    b._launch = launch  # type: ignore[method-assign]
    b._launch_groups = launch_groups  # type: ignore[method-assign]
    pocl.sources.clear()
    yield b
    unchecked = pocl.sources - catalogued
    assert not unchecked, "programs launched but not in ember_cupy.catalog:\n" + "\n\n".join(sorted(unchecked))


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _close(got: np.ndarray, want: torch.Tensor, tol: float = 1e-5) -> None:
    w = want.detach().numpy()
    assert got.shape == w.shape and got.dtype == w.dtype, (got.shape, w.shape, got.dtype, w.dtype)
    np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


# -- pooling -------------------------------------------------------------------------------------------------------
def test_max_pool_with_indices_padding_dilation_nan_and_strided_input(be: CuPyBackend, pocl: _PoCL) -> None:
    x = RNG.standard_normal((2, 7, 9, 3)).astype(np.float32).transpose(0, 3, 1, 2)  # (2, 3, 7, 9), not contiguous
    x[1, 2, 3, 4] = np.nan
    v, i = be.max_pool(x, (3, 2), (2, 1), (1, 1), (1, 2), True, True)
    tv, ti = torch.nn.functional.max_pool2d(_t(x), (3, 2), (2, 1), (1, 1), (1, 2), ceil_mode=True,
                                            return_indices=True)
    _close(v, tv, 0)
    np.testing.assert_array_equal(i, ti.numpy())
    assert pocl.launched[-1] == "ember_max_pool"
    x1 = RNG.integers(-50, 50, (3, 2, 11)).astype(np.int32)
    _close(be.max_pool(x1, (4,), (3,), (2,), (1,), False, False),
           torch.nn.functional.max_pool1d(_t(x1).double(), 4, 3, 2).int())


def test_avg_and_adaptive_pools_match_torch(be: CuPyBackend) -> None:
    x = RNG.standard_normal((2, 3, 8, 7)).astype(np.float32)
    for cip, div in ((True, None), (False, None), (True, 5)):
        _close(be.avg_pool(x, (3, 3), (2, 2), (1, 1), True, cip, div),
               torch.nn.functional.avg_pool2d(_t(x), 3, 2, 1, True, cip, div))
    _close(be.adaptive_avg_pool(x, (3, 5)), torch.nn.functional.adaptive_avg_pool2d(_t(x), (3, 5)))
    v, i = be.adaptive_max_pool(x, (3, 4), True)
    tv, ti = torch.nn.functional.adaptive_max_pool2d(_t(x), (3, 4), return_indices=True)
    _close(v, tv, 0)
    np.testing.assert_array_equal(i, ti.numpy())
    x3 = RNG.standard_normal((1, 2, 5, 6, 4)).astype(np.float64)
    _close(be.avg_pool(x3, (2, 3, 2), (2, 2, 1), (1, 1, 0), False, True, None),
           torch.nn.functional.avg_pool3d(_t(x3), (2, 3, 2), (2, 2, 1), (1, 1, 0)), 1e-12)


@pytest.mark.parametrize(("mode", "align", "size", "scale"), [
    ("nearest", None, (10, 5), None), ("nearest-exact", None, (5, 11), None), ("bilinear", False, (9, 13), None),
    ("bilinear", True, (4, 6), None), ("bicubic", False, (12, 10), None), ("bilinear", False, (9, 10), (1.5, 2.5)),
])
def test_interpolate_2d_matches_torch(be: CuPyBackend, mode: str, align: bool | None, size: tuple[int, int],
                                      scale: tuple[float, float] | None) -> None:
    x = RNG.standard_normal((2, 3, 6, 4)).astype(np.float32)
    got = be.interpolate(x, size, mode, align, scale)
    kw: dict[str, Any] = {"scale_factor": scale, "recompute_scale_factor": False} if scale else {"size": size}
    want = torch.nn.functional.interpolate(_t(x), mode=mode, align_corners=align, **kw)
    _close(got, want, 1e-5)


def test_interpolate_trilinear_and_area(be: CuPyBackend) -> None:
    x = RNG.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    _close(be.interpolate(x, (5, 3, 7), "trilinear", False, None),
           torch.nn.functional.interpolate(_t(x), size=(5, 3, 7), mode="trilinear", align_corners=False))
    x2 = x[0]
    _close(be.interpolate(x2, (2, 3), "area", None, None),
           torch.nn.functional.interpolate(_t(x2), size=(2, 3), mode="area"))


# -- pad -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_modes_with_crops_match_torch(be: CuPyBackend, mode: str) -> None:
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    pads = ((0, 0), (0, 0), (2, -1), (-2, 3))
    got = be.pad(x, pads, mode, 1.5)
    flat = [v for lo_hi in reversed(pads[2:]) for v in lo_hi]
    want = torch.nn.functional.pad(_t(x), flat, mode=mode, value=1.5 if mode == "constant" else None)
    _close(got, want, 0)


def test_pad_ranks_and_widths(be: CuPyBackend) -> None:
    x5 = RNG.integers(-9, 9, (2, 1, 3, 2, 4)).astype(np.int16)  # rank 5 runs the rank-8 program
    got = be.pad(x5, ((0, 0), (1, 0), (0, 2), (1, 1), (0, 1)), "constant", -7)
    want = torch.nn.functional.pad(_t(x5), (0, 1, 1, 1, 0, 2, 1, 0), value=-7)
    np.testing.assert_array_equal(got, want.numpy())
    b = RNG.integers(0, 2, (4,)).astype(bool)
    np.testing.assert_array_equal(be.pad(b, ((2, 1),), "constant", True),
                                  np.concatenate([[True, True], b, [True]]))


# -- softmax / logsumexp -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("shape", "dim"), [((5, 7), 1), ((4, 300), 1), ((300, 6), 0), ((3, 40, 5), 1)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_and_columns(be: CuPyBackend, pocl: _PoCL, shape: tuple[int, ...], dim: int,
                                  log: bool) -> None:
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[3] = -np.inf
    got = be.softmax(x, dim, log)
    want = (torch.log_softmax if log else torch.softmax)(_t(x), dim)
    _close(got, want, 1e-5)
    assert pocl.launched[-1] in ("ember_softmax_row", "ember_softmax_col")


def test_long_rows_launch_the_row_kernel_with_shared_memory(be: CuPyBackend, pocl: _PoCL) -> None:
    x = RNG.standard_normal((3, 1000)).astype(np.float64)
    _close(be.softmax(x, 1, False), torch.softmax(_t(x), 1), 1e-12)
    assert pocl.launched[-1] == "ember_softmax_row"
    _close(be.logsumexp(x, (1,), False), torch.logsumexp(_t(x), 1), 1e-12)
    assert pocl.launched[-1] == "ember_lse_row"


def test_logsumexp_multi_dim_and_minus_inf_rows(be: CuPyBackend) -> None:
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    x[2] = -np.inf
    for dims, keep in (((0, 2), True), ((1,), False), ((0, 1, 2), False)):
        _close(be.logsumexp(x, dims, keep), torch.logsumexp(_t(x), dims, keep), 1e-5)


# -- convolution ---------------------------------------------------------------------------------------------------
CONVS = [  # (x shape, w shape, stride, padding (lo, hi), dilation, groups, bias)
    ((2, 4, 9), (6, 2, 3), (2,), ((1, 1),), (1,), 2, True),
    ((2, 3, 7, 8), (4, 3, 3, 2), (1, 2), ((1, 1), (0, 0)), (2, 1), 1, True),
    ((1, 4, 6, 5), (4, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4, False),  # depthwise
    ((2, 2, 4, 5, 4), (3, 2, 2, 3, 2), (1, 2, 1), ((0, 0), (1, 1), (1, 1)), (1, 1, 2), 1, True),
]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{len(c[0]) - 2}d-g{c[5]}-b{int(c[6])}")
def test_conv_forward_and_gradients_match_torch(be: CuPyBackend, case: Any) -> None:
    xs, ws, stride, padding, dilation, groups, bias = case
    x = RNG.standard_normal(xs).astype(np.float64)
    w = RNG.standard_normal(ws).astype(np.float64)
    b = RNG.standard_normal(ws[0]).astype(np.float64) if bias else None
    y = be.conv(x, w, b, stride, padding, dilation, groups)
    tx, tw = _t(x).requires_grad_(), _t(w).requires_grad_()
    fn = getattr(torch.nn.functional, f"conv{len(xs) - 2}d")
    ty = fn(tx, tw, None if b is None else _t(b), stride, tuple(lo for lo, _ in padding), dilation, groups)
    _close(y, ty, 1e-10)
    gy = RNG.standard_normal(y.shape).astype(np.float64)
    ty.backward(_t(gy))
    _close(be.conv_input_grad(gy, w, xs, stride, padding, dilation, groups), tx.grad, 1e-10)
    _close(be.conv_weight_grad(x, gy, ws, stride, padding, dilation, groups), tw.grad, 1e-10)


def test_conv_in_batch_chunks(be: CuPyBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A column budget below one image's columns: every op runs image by image (outputs written into slices,
    weight gradients accumulated)."""
    from ember_cupy import kernels

    monkeypatch.setattr(kernels, "_COLS_BYTES", 64)
    xs, ws, stride, padding, dilation, groups, _ = CONVS[1]
    x = RNG.standard_normal((3,) + xs[1:]).astype(np.float64)
    w = RNG.standard_normal(ws).astype(np.float64)
    b = RNG.standard_normal(ws[0]).astype(np.float64)
    tx, tw = _t(x).requires_grad_(), _t(w).requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, _t(b), stride, tuple(lo for lo, _ in padding), dilation, groups)
    _close(be.conv(x, w, b, stride, padding, dilation, groups), ty, 1e-10)
    gy = RNG.standard_normal(tuple(ty.shape)).astype(np.float64)
    ty.backward(_t(gy))
    _close(be.conv_input_grad(gy, w, x.shape, stride, padding, dilation, groups), tx.grad, 1e-10)
    _close(be.conv_weight_grad(x, gy, ws, stride, padding, dilation, groups), tw.grad, 1e-10)


def test_conv_asymmetric_padding_float32_and_transpose(be: CuPyBackend) -> None:
    x = RNG.standard_normal((2, 3, 6, 7)).astype(np.float32)
    w = RNG.standard_normal((5, 3, 3, 3)).astype(np.float32)
    got = be.conv(x, w, None, (1, 1), ((2, 0), (1, 3)), (1, 1), 1)
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(_t(x), (1, 3, 2, 0)), _t(w))
    _close(got, want, 1e-4)
    x4 = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32)
    wt = RNG.standard_normal((4, 2, 3, 2)).astype(np.float32)  # (C_in, C_out / groups, *k), groups 2
    bt = RNG.standard_normal(4).astype(np.float32)
    got = be.conv_transpose(x4, wt, bt, (2, 1), (1, 0), (1, 0), (1, 2), 2)
    want = torch.nn.functional.conv_transpose2d(_t(x4), _t(wt), _t(bt), (2, 1), (1, 0), (1, 0), 2, (1, 2))
    _close(got, want, 1e-4)


# -- gather / scatter ----------------------------------------------------------------------------------------------
def test_gather_with_a_smaller_index(be: CuPyBackend) -> None:
    h = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    idx = RNG.integers(0, 5, (3, 7, 2)).astype(np.int64)
    _close(be.gather(h, 1, idx), torch.gather(_t(h), 1, _t(idx)), 0)


@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scatter_matches_torch(be: CuPyBackend, pocl: _PoCL, reduce: str | None, dtype: str) -> None:
    h = RNG.integers(1, 4, (3, 5, 4)).astype(dtype)
    src = RNG.integers(1, 4, (3, 6, 4)).astype(dtype)
    # duplicates along dim for the reductions; distinct targets for replace (torch leaves duplicates unspecified)
    idx = (RNG.integers(0, 5, (2, 6, 3)) if reduce else np.broadcast_to(RNG.permutation(5)[:4, None], (2, 4, 3))) \
        .astype(np.int64)
    got = be.scatter(h, 1, np.ascontiguousarray(idx), src, reduce)
    tr = {None: None, "add": "sum", "multiply": "prod"}[reduce]
    t_idx = _t(idx)
    want = torch.scatter(_t(h), 1, t_idx, _t(src)[:, : idx.shape[1], : idx.shape[2]]) if tr is None else \
        torch.scatter_reduce(_t(h), 1, t_idx, _t(src)[:, : idx.shape[1], : idx.shape[2]], tr)
    _close(got, want, 0)
    if reduce:
        assert pocl.launched[-1] == "ember_scatter_loop"
    # a scalar source
    got = be.scatter(h, 2, np.ascontiguousarray(idx[:, :4] % 4), 2, reduce)
    want = torch.scatter(_t(h), 2, _t(idx[:, :4] % 4), 2, reduce=reduce) if reduce else \
        torch.scatter(_t(h), 2, _t(idx[:, :4] % 4), 2)
    _close(got, want, 0)


# -- fused reductions ----------------------------------------------------------------------------------------------
def _sample(name: str) -> Any:
    """A fused block of the catalogue (so its programs are the ones ``ember kernels check`` compiles)."""
    from ember_cupy import catalog

    return dict(catalog._fused_samples())[name]


@pytest.mark.parametrize(("op", "shape", "kernel_name"), [
    ("sum", (3, 5000, 2), "ember_fred_col"),  # kept dim inner: a thread per row, rows split into chunks
    ("max", (2, 40000, 1), "ember_fred_row"),  # few long rows: a block per (row, chunk), partials reduced by CuPy
    ("prod", (64, 7, 3), "ember_fred_col"),  # short rows
    ("min", (70, 300, 1), "ember_fred_row"),
])
def test_fused_reduction_runs_the_shared_kernels(be: CuPyBackend, pocl: _PoCL, op: str, shape: tuple[int, ...],
                                                 kernel_name: str) -> None:
    """sum/prod/max/min over dim 1 of (a - b)^2, b broadcast: one kernel, no intermediate array."""
    from ember.ir import interpret

    k = _sample(f"float32/reduce-{op}-1")
    fn = be.fusion_compile(k)
    assert fn is not None
    scale = 0.01 if op == "prod" else 1.0
    a = (RNG.standard_normal(shape) * scale + (1.0 if op == "prod" else 0.0)).astype(np.float32)
    b = (RNG.standard_normal((shape[0], 1, shape[2])) * scale).astype(np.float32)
    (got,) = fn([a, b], [], shape)
    d = (a.astype(np.float64) - b) ** 2
    want = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](d, axis=1, keepdims=True)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert kernel_name in pocl.launched
    # the reference semantics: op by op through the same backend
    (ref,) = interpret(k, be, [a, b], [], shape)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)


def test_fused_reduction_of_half_keeps_float_partials_and_fills_empty(be: CuPyBackend) -> None:
    k = _sample("float16/reduce-sum-0-2")
    fn = be.fusion_compile(k)
    assert fn is not None
    a = (RNG.standard_normal((300, 2, 200)) * 0.1).astype(np.float16)
    b = (RNG.standard_normal((1, 2, 1)) * 0.1).astype(np.float16)
    (got,) = fn([a, b], [], (300, 2, 200))
    d = ((a.astype(np.float32) - b.astype(np.float32)) ** 2)
    want = d.astype(np.float16).astype(np.float64).sum(axis=(0, 2), keepdims=True)
    assert got.dtype == np.float16 and got.shape == (1, 2, 1)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3)
    (empty,) = fn([a[:0], b], [], (0, 2, 200))
    np.testing.assert_array_equal(empty, np.zeros((1, 2, 1), np.float16))


def test_cudnn_is_called_for_float_convs_with_symmetric_padding(be: CuPyBackend) -> None:
    """Where CuPy ships cuDNN, the forward conv goes to ``cudnn.convolution_forward`` with tensor cores off (a
    stand-in module here records the call and computes with torch); asymmetric padding and integers keep im2col."""
    calls: list[tuple[Any, ...]] = []

    def convolution_forward(x: Any, w: Any, b: Any, y: Any, pad: Any, stride: Any, dilation: Any, groups: int,
                            *, auto_tune: bool, tensor_core: str) -> None:
        calls.append((pad, stride, dilation, groups, auto_tune, tensor_core, b is None))
        y[...] = torch.nn.functional.conv2d(_t(x), _t(w), None if b is None else _t(b), stride, pad, dilation,
                                            groups).numpy()

    be.__dict__["_cudnn"] = types.SimpleNamespace(convolution_forward=convolution_forward)
    x = RNG.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    got = be.conv(x, w, b, (1, 2), ((1, 1), (2, 2)), (1, 1), 2)
    _close(got, torch.nn.functional.conv2d(_t(x), _t(w), _t(b), (1, 2), (1, 2), 1, 2), 1e-5)
    assert calls == [((1, 2), (1, 2), (1, 1), 2, False, "never", False)]
    be.conv(x, w, None, (1, 1), ((1, 0), (0, 0)), (1, 1), 2)  # asymmetric: im2col + GEMM
    assert len(calls) == 1


def test_half_precision_and_other_ranks(be: CuPyBackend) -> None:
    """float16 storage (computed in float) through softmax, average pooling and linear interpolation; nearest
    interpolation in 1-d and 3-d; max pooling of uint8."""
    x = RNG.standard_normal((3, 2, 40)).astype(np.float16)
    _close(be.softmax(x, 2, True), torch.log_softmax(_t(x).float(), 2).half(), 2e-3)
    _close(be.avg_pool(x, (4,), (3,), (1,), False, True, None),
           torch.nn.functional.avg_pool1d(_t(x).float(), 4, 3, 1).half(), 2e-3)
    _close(be.interpolate(x, (57,), "linear", False, None),
           torch.nn.functional.interpolate(_t(x).float(), size=57, mode="linear").half(), 2e-3)
    _close(be.interpolate(x, (17,), "nearest", None, None),
           torch.nn.functional.interpolate(_t(x).float(), size=17, mode="nearest").half(), 0)
    x3 = RNG.standard_normal((1, 1, 3, 4, 5)).astype(np.float32)
    _close(be.interpolate(x3, (6, 3, 9), "nearest", None, None),
           torch.nn.functional.interpolate(_t(x3), size=(6, 3, 9), mode="nearest"), 0)
    u = RNG.integers(0, 255, (2, 3, 9, 9)).astype(np.uint8)
    v, i = be.max_pool(u, (3, 3), (2, 2), (1, 1), (1, 1), False, True)
    tv, ti = torch.nn.functional.max_pool2d(_t(u).float(), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(v, tv.numpy().astype(np.uint8))
    assert v.dtype == np.uint8
    np.testing.assert_array_equal(i, ti.numpy())  # ties: the first maximum in row-major order, as torch
