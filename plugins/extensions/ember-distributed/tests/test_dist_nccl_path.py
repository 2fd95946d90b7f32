"""The NCCL code path run against a stand-in for CuPy's NCCL bindings (one rank; no GPU here): the engine's calls,
staging host tensors through "device" arrays, async events and DataParallel's device buckets. On a machine with a
GPU and CuPy the same code runs on the real bindings."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import numpy as np
import pytest

import ember
from ember.errors import DeviceError

pytest.importorskip("mpi4py", reason="the NCCL group bootstraps over MPI (pip install mpi4py mpich)")

_ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8}  # NCCL datatype codes -> bytes


class FakeArray(np.ndarray):
    """A host array that answers like a CuPy array (``.data.ptr``, ``.get()``)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        return np.array(self)


def _fake(a: Any) -> FakeArray:
    return np.ascontiguousarray(a).view(FakeArray)


class FakeComm:
    """A one-rank NCCL communicator: every collective of one rank copies its input to its output."""

    calls: list[str] = []

    def __init__(self, size: int, uid: Any, rank: int) -> None:
        assert size == 1 and rank == 0 and uid == b"uid"

    def _copy(self, name: str, src: int, dst: int, count: int, dtype: int) -> None:
        FakeComm.calls.append(name)
        if src != dst:
            ctypes.memmove(dst, src, count * _ITEMSIZE[dtype])

    def allReduce(self, s: int, r: int, n: int, dt: int, op: int, stream: int) -> None:  # noqa: N802 - CuPy's names
        self._copy("allReduce", s, r, n, dt)

    def bcast(self, b: int, n: int, dt: int, root: int, stream: int) -> None:
        FakeComm.calls.append("bcast")

    def allGather(self, s: int, r: int, n: int, dt: int, stream: int) -> None:  # noqa: N802
        self._copy("allGather", s, r, n, dt)

    def reduceScatter(self, s: int, r: int, n: int, dt: int, op: int, stream: int) -> None:  # noqa: N802
        self._copy("reduceScatter", s, r, n, dt)


class FakeEvent:
    def __init__(self, block: bool = False, disable_timing: bool = True) -> None:
        self.done = False

    def record(self, stream: Any) -> None:
        self.done = True  # the stand-in's collectives finish synchronously


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    nccl = types.ModuleType("cupy.cuda.nccl")
    for k, name in enumerate(["INT8", "UINT8", "INT32", "UINT32", "INT64", "UINT64", "FLOAT16", "FLOAT32",
                              "FLOAT64"]):
        setattr(nccl, f"NCCL_{name}", k)
    for k, name in enumerate(["SUM", "PROD", "MAX", "MIN"]):
        setattr(nccl, f"NCCL_{name}", k)
    nccl.get_unique_id = lambda: b"uid"
    nccl.NcclCommunicator = FakeComm
    nccl.NcclError = type("NcclError", (RuntimeError,), {})
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    cuda.Stream = lambda non_blocking=True: types.SimpleNamespace(ptr=0)
    cuda.Event = FakeEvent
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    cupy.float32 = np.float32
    cupy.asarray = _fake
    cupy.from_dlpack = lambda t: _fake(np.from_dlpack(t))
    cupy.empty = lambda n, dtype=None: _fake(np.empty(n, dtype))
    cupy.zeros = lambda n, dtype=None: _fake(np.zeros(n, dtype))
    cupy.ones = lambda n, dtype=None: _fake(np.ones(n, dtype))
    cupy.concatenate = lambda xs: _fake(np.concatenate([np.asarray(x) for x in xs]))
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", nccl)):
        monkeypatch.setitem(sys.modules, name, mod)
    FakeComm.calls = []
    return cupy


def test_nccl_group_collectives_and_ddp(fake_cupy: types.ModuleType) -> None:
    dist = ember.distributed
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    g = dist.init("nccl", timeout=30)
    try:
        assert g.backend == "nccl" and dist.get_backend() == "nccl"
        t = ember.tensor(np.arange(6, dtype=np.float32), device="flex")
        dist.all_reduce(t, op="avg")
        np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32))
        w = dist.all_reduce(ember.ones(3, device="flex"), async_op=True)
        assert w.wait() and w.is_completed()
        out = [ember.zeros(2, device="flex")]
        dist.all_gather(out, ember.tensor(np.array([1.0, 2.0], np.float32), device="flex"))
        np.testing.assert_array_equal(out[0].numpy(), [1.0, 2.0])
        o = ember.zeros(2, device="flex")
        dist.reduce_scatter_tensor(o, ember.tensor(np.array([3.0, 4.0], np.float32), device="flex"))
        np.testing.assert_array_equal(o.numpy(), [3.0, 4.0])
        dist.broadcast(t, src=0)
        dist.barrier()
        objs: list = [None]
        dist.all_gather_object(objs, {"a": 1})  # objects travel over the MPI communicator
        assert objs == [{"a": 1}]
        assert {"allReduce", "allGather", "reduceScatter", "bcast"} <= set(FakeComm.calls)
        # DataParallel keeps its buckets in device arrays on an NCCL group; with one rank nothing is reduced
        dev = ember.Device.parse("flex").autodiff()
        model = ember.nn.Linear(3, 2).to(dev)
        ddp = dist.DataParallel(model)
        assert isinstance(ddp._buckets[0].buffer(), FakeArray)
        ddp(ember.ones((2, 3), device=dev)).sum().backward()
        np.testing.assert_allclose(model.weight.grad.numpy(), np.full((2, 3), 2.0))
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def test_nccl_unavailable_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember_distributed.group import _NCCLEngine

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(DeviceError, match="needs CuPy built with NCCL"):
        _NCCLEngine(None)
