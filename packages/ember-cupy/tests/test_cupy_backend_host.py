"""The host-side logic of CuPyBackend, run with numpy standing in for CuPy (the two share these functions'
semantics: CuPy implements numpy's API), against torch as the oracle: reductions (integer wrap, bool any/all,
half accumulation), argmax/argmin, scans, stable descending sort with NaN, integer/bool matmul, Philox counter
offsets and the launch arguments of the shared map kernels. Kernel launches are captured, not run (no GPU)."""

from __future__ import annotations

import contextlib
import types
from typing import Any

import numpy as np
import pytest
import torch

from ember import dtypes as dt
from ember.errors import DTypeError, OutOfMemoryError, ValueRangeError
from ember_cupy.backend import CuPyBackend


class _Pool:
    def used_bytes(self) -> int:
        return 1024

    def total_bytes(self) -> int:
        return 4096


class _OOM(Exception):
    pass


def _numpy_cupy() -> Any:
    """numpy with the few CuPy-only names the backend uses."""
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.asnumpy = lambda a, stream=None, blocking=True: np.asarray(a)
    shim.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=_OOM),
                                      runtime=types.SimpleNamespace(memGetInfo=lambda: (1 << 44, 1 << 44)))
    return shim


@pytest.fixture
def be() -> CuPyBackend:
    b = CuPyBackend.__new__(CuPyBackend)
    b.index, b.name, b.platform = 0, "cuda", "cuda"
    b.cp = _numpy_cupy()
    b.device, b.stream = contextlib.nullcontext(), contextlib.nullcontext()
    b.pool = _Pool()
    b.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES if d is not dt.bfloat16)
    b._modules, b._peak, b._peak_reserved, b._key, b._offset = {}, 0, 0, 0, 0
    import threading

    b._lock = threading.Lock()
    b.describe = lambda: "cuda:0 (stand-in)"  # type: ignore[method-assign]
    b.launches = []  # type: ignore[attr-defined]
    b._launch = lambda source, name, n, args: b.launches.append((source, name, n, list(args)))  # type: ignore
    return b


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", ["int8", "int32", "float16", "float32"])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_reduce_keeps_the_dtype_and_wraps_like_torch(be: CuPyBackend, dtype: str, op: str) -> None:
    x = RNG.integers(-100, 100, (4, 6, 5)).astype(dtype) if "int" in dtype else RNG.standard_normal((4, 6, 5)) \
        .astype(dtype)
    got = be.reduce(op, x, (1, 2), keepdim=False)
    want = getattr(torch, op)(torch.from_numpy(x).reshape(4, -1), dim=1, dtype=getattr(torch, dtype)).numpy()
    assert got.dtype == x.dtype
    tol = {"float16": 2e-3, "float32": 1e-5}.get(dtype, 0)  # floats: summation order differs in the last bits
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def test_bool_sum_prod_are_any_all_and_empty_max_is_an_error(be: CuPyBackend) -> None:
    m = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(be.reduce("sum", m, (1,), keepdim=True), [[True], [False]])
    np.testing.assert_array_equal(be.reduce("prod", m, (0,), keepdim=False), [False, False])
    from ember.errors import ShapeError

    with pytest.raises(ShapeError, match="empty dim"):
        be.reduce("max", np.zeros((2, 0), np.float32), (1,), keepdim=False)
    with pytest.raises(ValueRangeError, match="unknown op"):
        be.reduce("median", m, (0,), keepdim=False)


def test_argreduce_matches_torch_with_nan(be: CuPyBackend) -> None:
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    x[1, 4] = np.nan
    for op in ("max", "min"):
        got = be.argreduce(op, x, 1, keepdim=True)
        want = getattr(torch, f"arg{op}")(torch.from_numpy(x), dim=1, keepdim=True).numpy()
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64
    assert be.argreduce("max", x, None, keepdim=False).shape == ()


@pytest.mark.parametrize("dtype", ["int16", "float32", "bool"])
def test_scans_match_torch(be: CuPyBackend, dtype: str) -> None:
    x = (RNG.integers(0, 3, (4, 5)) if dtype != "float32" else RNG.standard_normal((4, 5))).astype(dtype)
    for op, fn in (("sum", torch.cumsum), ("prod", torch.cumprod)):
        got = be.cumulative(op, x, 1)
        if dtype == "bool":  # stored as bool: running any / all
            want = (np.cumsum(x, 1) > 0) if op == "sum" else np.cumprod(x, 1).astype(bool)
        else:
            want = fn(torch.from_numpy(x), dim=1, dtype=getattr(torch, dtype)).numpy()
        assert got.dtype == x.dtype
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6)


def test_descending_sort_is_stable_with_nan_first(be: CuPyBackend) -> None:
    x = np.array([[1.0, np.nan, 3.0, 1.0, 3.0, -2.0]], np.float32)
    vals, idx = be.sort(x, 1, descending=True, stable=True)
    tv, ti = torch.sort(torch.from_numpy(x), dim=1, descending=True, stable=True)
    np.testing.assert_array_equal(idx, ti.numpy())
    np.testing.assert_array_equal(vals, tv.numpy())
    vals, idx = be.sort(x, 1, descending=False, stable=True)
    tv, ti = torch.sort(torch.from_numpy(x), dim=1, stable=True)
    np.testing.assert_array_equal(idx, ti.numpy())


def test_integer_and_bool_matmul_wrap_like_torch(be: CuPyBackend) -> None:
    a = RNG.integers(-128, 127, (5, 7)).astype(np.int8)
    b = RNG.integers(-128, 127, (7, 3)).astype(np.int8)
    got = be.matmul(a, b)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, (torch.from_numpy(a).long() @ torch.from_numpy(b).long()).to(torch.int8))
    m = RNG.integers(0, 2, (4, 4)).astype(bool)
    np.testing.assert_array_equal(be.matmul(m, m), (m.astype(int) @ m.astype(int)) != 0)


def test_philox_calls_take_fresh_offsets_and_reject_bad_input(be: CuPyBackend) -> None:
    be.seed(-1)
    be.rand((3, 5), dt.float32)
    be.randint(0, 10, (7,), dt.int64)
    (src0, name0, n0, args0), (src1, name1, n1, args1) = be.launches
    assert name0 == "ember_philox_uniform" and name1 == "ember_philox_integers"
    assert (int(args0[4]), int(args0[5])) == (0xFFFFFFFF, 0xFFFFFFFF)  # key = seed mod 2**64
    assert (int(args0[6]), int(args1[6])) == (0, 1)  # call offsets 0, 1
    assert n0 == 4 and n1 == 4  # blocks: 15 uniforms at 4 per block, 7 integers at 2 per block
    with pytest.raises(DTypeError):
        be.rand((2,), dt.int32)
    with pytest.raises(ValueRangeError):
        be.randint(5, 5, (2,), dt.int64)
    with pytest.raises(DTypeError, match="bfloat16"):
        be.full((2,), 0, dt.bfloat16)


def test_map_launch_arguments(be: CuPyBackend) -> None:
    """A broadcast binary op launches the shared strided map kernel with element strides (0 where broadcast)."""
    a = np.zeros((4, 1, 3), np.float32)
    b = np.zeros((5, 1), np.float32)
    out = be.binary("add", a, b)
    assert out.shape == (4, 5, 3)
    source, name, n, args = be.launches[-1]
    assert name.startswith("ember_map") and n == 60 and "__kernel void ember_map" in source
    assert int(args[6]) == 60  # n
    sizes = [int(v) for v in args[7:10]]
    assert sizes == [4, 5, 3]  # rank 3 bucket: no padding needed
    strides = [int(v) for v in args[10:]]
    assert strides == [15, 3, 1, 3, 0, 1, 0, 1, 0]  # out, a (dim 1 broadcast), b (dims 0 and 2 broadcast)


def test_out_of_memory_is_typed(be: CuPyBackend) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise _OOM("out of memory allocating 1099511627776 bytes")

    be.cp.empty = boom
    with pytest.raises(OutOfMemoryError, match="out of device memory .*1099511627776.* in use 1.0 KiB"):
        be.empty((1 << 40,), dt.uint8)


def test_requests_past_device_memory_are_typed_before_cupy(be: CuPyBackend) -> None:
    be.cp.cuda.runtime = types.SimpleNamespace(memGetInfo=lambda: (1 << 33, 1 << 34))  # 16 GiB device
    with pytest.raises(OutOfMemoryError, match=r"full: cannot allocate 73786976294838206464 bytes .*16.0 GiB"):
        be.full((2**62, 4), 1.0, dt.float32)
    with pytest.raises(OutOfMemoryError, match="empty: cannot allocate"):
        be.empty((1 << 32, 5), dt.float32)
    assert be.empty((1 << 20,), dt.uint8).nbytes == 1 << 20  # below the check: straight to CuPy


def test_fusion_compiles_elementwise_blocks_and_reductions(be: CuPyBackend) -> None:
    from ember.ir import Instr, Kernel

    f32 = dt.float32
    k = Kernel(rank=2, inputs=(f32, f32), scalars=1,
               body=(Instr("load", (0,), f32), Instr("load", (1,), f32), Instr("binary", ("mul", 0, 1), f32),
                     Instr("scalar", (0,), f32), Instr("binary", ("add", 2, 3), f32)),
               outputs=(4,))
    fn = be.fusion_compile(k)
    assert fn is not None and be.fusion_compile(k) is fn  # memoised per kernel
    a = np.zeros((3, 4), np.float32)
    b = np.zeros((1, 4), np.float32)
    (out,) = fn([a, b], [2.5], (3, 4))
    assert out.shape == (3, 4)
    source, name, n, args = be.launches[-1]
    assert name == "ember_fused" and n == 12 and "__kernel void ember_fused(" in source
    assert float(args[6]) == 2.5  # the scalar parameter follows the arrays
    red = k._replace(reduce=("sum", (1,)))
    assert type(be.fusion_compile(red)).__name__ == "CuPyReduceKernel"  # run on PoCL in test_cupy_kernels_pocl
    assert be.fusion_compile(k._replace(reduce=("sum", (1,)), outputs=(3, 4))) is None  # one output per reduction
    assert be.fusion_compile(k._replace(reduce=("median", (1,)))) is None
