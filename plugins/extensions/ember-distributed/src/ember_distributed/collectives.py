"""Collectives on ember tensors, in place like ``torch.distributed``'s.

Host tensors (the host backend, with or without decorators such as autodiff) whose data the backend exposes as a
writable contiguous numpy array are handed to MPI zero-copy through the buffer protocol. Other tensors (OpenCL,
wgpu, a dtype MPI has no type for, non-contiguous data) are staged: copied to a contiguous host array, reduced
there, and copied back with ``Tensor.copy_``. On an NCCL group, tensors on a CUDA/ROCm device are passed to NCCL as
CuPy views through DLPack; host tensors are staged through device memory.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ember
from ember.device import is_host
from ember.errors import DTypeError, ShapeError, ValueRangeError

from .group import ProcessGroup, ReduceOp, Work, resolve

# numpy dtypes MPI reduces natively (mpi4py maps them to MPI datatypes); others travel as one of these
_NATIVE = {np.dtype(t) for t in ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                 "uint32", "uint64", "complex64", "complex128")}


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    if dtype in _NATIVE:
        return dtype
    if dtype == np.bool_:
        return np.dtype(np.uint8)
    if dtype.kind == "f" or dtype.name == "bfloat16":  # float16 / bfloat16: reduce in float32, round once at the end
        return np.dtype(np.float32)
    raise DTypeError(f"collective: numpy dtype {dtype} has no MPI datatype")


def _check_tensor(t: Any, where: str, name: str = "tensor") -> None:
    if not isinstance(t, ember.Tensor):
        raise DTypeError(f"{where}: {name} must be an ember Tensor, got {type(t).__name__}")


def _host_view(t: Any) -> np.ndarray | None:
    """A writable contiguous numpy array sharing ``t``'s memory, or None when the backend copies on read."""
    if not is_host(t.device.base):
        return None
    a = t.detach().numpy()
    if not (isinstance(a, np.ndarray) and a.flags.writeable and a.flags.c_contiguous and a.dtype in _NATIVE):
        return None
    # a backend that copies hands out a fresh array per call; two reads sharing memory are views of the storage
    return a if np.shares_memory(a, t.detach().numpy()) else None


@dataclass
class _Staged:
    """A tensor's data as an engine buffer; ``writeback()`` puts the buffer's values into the tensor."""

    tensor: Any
    buf: Any
    zero_copy: bool

    def writeback(self, values: Any = None) -> None:
        v = self.buf if values is None else values
        if self.zero_copy and values is None:
            return
        write_into(self.tensor, v)


def write_into(t: Any, values: Any) -> None:
    """Copy host or CuPy ``values`` (``t``'s shape) into tensor ``t`` in place, outside autograd."""
    view = _host_view(t)
    if view is not None and isinstance(values, np.ndarray):
        np.copyto(view, values.reshape(view.shape), casting="unsafe")
        return
    if not isinstance(values, np.ndarray):
        values = values.get()  # CuPy array staged for a tensor on a device NCCL cannot address
    with ember.no_grad():
        t.copy_(ember.as_tensor(np.ascontiguousarray(values.reshape(tuple(t.shape))).astype(
            _numpy_dtype(t), copy=False), dtype=t.dtype, device=t.device))


def _numpy_dtype(t: Any) -> np.dtype:
    return np.dtype(t.dtype.numpy)


def stage(group: ProcessGroup, t: Any, where: str) -> _Staged:
    """``t``'s data as a buffer of ``group``'s engine (zero-copy where possible)."""
    if group.backend == "nccl":
        return _stage_cupy(group, t)
    view = _host_view(t)
    if view is not None:
        return _Staged(t, view.reshape(-1), True)
    a = t.detach().numpy()
    return _Staged(t, np.ascontiguousarray(a, dtype=_wire_dtype(a.dtype)).reshape(-1).copy(), False)


def _stage_cupy(group: ProcessGroup, t: Any) -> _Staged:
    cupy = group.engine.cupy
    if t.device.base.kind in ("cuda", "rocm") and t.is_contiguous():
        try:
            return _Staged(t, cupy.from_dlpack(t.detach()).reshape(-1), True)
        except Exception:  # a backend without DLPack export: stage through the host below
            pass
    a = t.detach().numpy()
    return _Staged(t, cupy.asarray(np.ascontiguousarray(a, dtype=_wire_dtype(a.dtype)).reshape(-1)), False)


def _finish(work_or_none: Work, async_op: bool) -> Work | None:
    if async_op:
        return work_or_none
    work_or_none.wait()
    return None


# --- the collectives -------------------------------------------------------------------------------------------

def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` over the group's ranks, in place on every rank (``torch.distributed.all_reduce``).

    ``op``: SUM, AVG (sum / group size; floating tensors), PRODUCT, MIN or MAX. ``async_op=True`` returns a
    :class:`Work`; ``tensor`` holds the result after its ``wait()``."""
    where = "all_reduce"
    _check_tensor(tensor, where)
    op = ReduceOp.of(op, where)
    g = resolve(group, where)
    if op is ReduceOp.AVG and not tensor.dtype.is_floating_point:
        raise DTypeError(f"all_reduce: ReduceOp.AVG needs a floating tensor, got {tensor.dtype} "
                         f"(shape {tuple(tensor.shape)})")
    s = stage(g, tensor, where)
    pending = g.engine.all_reduce(s.buf, op)
    n = g.size()

    def finish() -> None:
        if op is ReduceOp.AVG:
            s.buf /= n  # in the engine buffer (zero-copy: the tensor itself)
        s.writeback()

    return _finish(Work(where, g, pending, finish, [tensor]), async_op)


def broadcast(tensor: Any, src: int, group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Copy ``tensor`` of global rank ``src`` into ``tensor`` of every rank of the group."""
    where = "broadcast"
    _check_tensor(tensor, where)
    g = resolve(group, where)
    root = g.group_rank(src, where)
    s = stage(g, tensor, where)
    pending = g.engine.broadcast(s.buf, root)
    is_root = g.rank() == root
    return _finish(Work(where, g, pending, None if is_root else s.writeback, [tensor]), async_op)


def _check_like(where: str, ref: Any, others: Sequence[Any], what: str) -> None:
    for k, o in enumerate(others):
        _check_tensor(o, where, f"{what}[{k}]")
        if tuple(o.shape) != tuple(ref.shape) or o.dtype != ref.dtype:
            raise ShapeError(f"{where}: {what}[{k}] has shape {tuple(o.shape)} dtype {o.dtype}; expected shape "
                             f"{tuple(ref.shape)} dtype {ref.dtype} (like the input)")


def all_gather(tensor_list: list[Any], tensor: Any, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Fill ``tensor_list[r]`` with ``tensor`` of group rank ``r``, on every rank."""
    where = "all_gather"
    _check_tensor(tensor, where)
    g = resolve(group, where)
    if not isinstance(tensor_list, (list, tuple)) or len(tensor_list) != g.size():
        length = len(tensor_list) if hasattr(tensor_list, "__len__") else "?"
        raise ValueRangeError(f"all_gather: tensor_list must be a list of {g.size()} tensors (the group size), got "
                              f"{type(tensor_list).__name__} of length {length}")
    _check_like(where, tensor, tensor_list, "tensor_list")
    s = stage(g, tensor, where)
    recv = _empty_like_buf(g, s.buf, g.size() * s.buf.size)
    pending = g.engine.all_gather(s.buf, recv)
    n = s.buf.size

    def finish() -> None:
        for r, out in enumerate(tensor_list):
            write_into(out, recv[r * n:(r + 1) * n])

    return _finish(Work(where, g, pending, finish, list(tensor_list)), async_op)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None,
                           async_op: bool = False) -> Work | None:
    """``output_tensor`` (first dim ``group size * input's``) gets every rank's ``input_tensor``, in rank order."""
    where = "all_gather_into_tensor"
    _check_tensor(input_tensor, where, "input_tensor")
    _check_tensor(output_tensor, where, "output_tensor")
    g = resolve(group, where)
    if output_tensor.numel() != g.size() * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
        raise ShapeError(f"{where}: output_tensor shape {tuple(output_tensor.shape)} dtype {output_tensor.dtype} "
                         f"must hold {g.size()} x input shape {tuple(input_tensor.shape)} dtype {input_tensor.dtype}")
    s_in = stage(g, input_tensor, where)
    s_out = stage(g, output_tensor, where)
    pending = g.engine.all_gather(s_in.buf, s_out.buf)
    return _finish(Work(where, g, pending, s_out.writeback, [output_tensor]), async_op)


def _empty_like_buf(g: ProcessGroup, buf: Any, n: int) -> Any:
    if g.backend == "nccl":
        return g.engine.cupy.empty(n, dtype=buf.dtype)
    return np.empty(n, dtype=buf.dtype)


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
                   async_op: bool = False) -> Work | None:
    """``output`` on group rank ``r`` = the reduction over ranks of their ``input_list[r]``."""
    where = "reduce_scatter"
    _check_tensor(output, where, "output")
    op = ReduceOp.of(op, where)
    g = resolve(group, where)
    if not isinstance(input_list, (list, tuple)) or len(input_list) != g.size():
        raise ValueRangeError(f"reduce_scatter: input_list must be a list of {g.size()} tensors (the group size)")
    _check_like(where, output, input_list, "input_list")
    bufs = [stage(g, t, where).buf for t in input_list]
    xp = g.engine.cupy if g.backend == "nccl" else np
    send = xp.concatenate(bufs)
    return _reduce_scatter(where, g, output, send, op, async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
                          async_op: bool = False) -> Work | None:
    """``output`` on group rank ``r`` = the reduction of the ``r``-th chunk (along dim 0) of every rank's
    ``input`` (``input`` holds group size x ``output``'s elements)."""
    where = "reduce_scatter_tensor"
    _check_tensor(output, where, "output")
    _check_tensor(input, where, "input")
    op = ReduceOp.of(op, where)
    g = resolve(group, where)
    if input.numel() != g.size() * output.numel() or input.dtype != output.dtype:
        raise ShapeError(f"{where}: input shape {tuple(input.shape)} dtype {input.dtype} must hold {g.size()} x "
                         f"output shape {tuple(output.shape)} dtype {output.dtype}")
    return _reduce_scatter(where, g, output, stage(g, input, where).buf, op, async_op)


def _reduce_scatter(where: str, g: ProcessGroup, output: Any, send: Any, op: ReduceOp,
                    async_op: bool) -> Work | None:
    if op is ReduceOp.AVG and not output.dtype.is_floating_point:
        raise DTypeError(f"{where}: ReduceOp.AVG needs a floating tensor, got {output.dtype}")
    s_out = stage(g, output, where)
    if s_out.buf.dtype != send.dtype:
        raise DTypeError(f"{where}: input and output travel as {send.dtype} and {s_out.buf.dtype}")
    pending = g.engine.reduce_scatter(send, s_out.buf, op)
    n = g.size()

    def finish() -> None:
        if op is ReduceOp.AVG:
            s_out.buf /= n
        s_out.writeback()

    return _finish(Work(where, g, pending, finish, [output]), async_op)


def barrier(group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Return when every rank of the group has called ``barrier``."""
    g = resolve(group, "barrier")
    return _finish(Work("barrier", g, g.engine.barrier(), None, []), async_op)


# --- Python objects (pickled; over MPI even on an NCCL group) -----------------------------------------------------

def _mpi_group(g: ProcessGroup) -> Any:
    from .group import _MPIEngine

    return g.engine if g.backend == "mpi" else _MPIEngine(g.mpi_comm)


def all_gather_object(object_list: list[Any], obj: Any, group: ProcessGroup | None = None) -> None:
    """Fill ``object_list`` (length group size) with every rank's picklable ``obj``, in rank order."""
    where = "all_gather_object"
    g = resolve(group, where)
    if not isinstance(object_list, list) or len(object_list) != g.size():
        raise ValueRangeError(f"{where}: object_list must be a list of length {g.size()} (the group size)")
    eng = _mpi_group(g)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = np.empty(g.size(), dtype=np.int64)
    g.wait(eng.all_gather(np.array([data.size], dtype=np.int64), sizes), where, engine=eng)
    recv = np.empty(int(sizes.sum()), dtype=np.uint8)
    g.wait(eng.all_gatherv(data, recv, sizes.tolist()), where, engine=eng)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    for r in range(g.size()):
        object_list[r] = pickle.loads(recv[offs[r]:offs[r + 1]].tobytes())


def broadcast_object_list(object_list: list[Any], src: int = 0, group: ProcessGroup | None = None) -> None:
    """Replace ``object_list``'s items on every rank with those of global rank ``src`` (picklable objects)."""
    where = "broadcast_object_list"
    g = resolve(group, where)
    if not isinstance(object_list, list):
        raise ValueRangeError(f"{where}: object_list must be a list, got {type(object_list).__name__}")
    root = g.group_rank(src, where)
    eng = _mpi_group(g)
    payload = np.frombuffer(pickle.dumps(object_list), dtype=np.uint8) if g.rank() == root else None
    size = np.array([0 if payload is None else payload.size], dtype=np.int64)
    g.wait(eng.broadcast(size, root), where, engine=eng)
    buf = payload.copy() if payload is not None else np.empty(int(size[0]), dtype=np.uint8)
    g.wait(eng.broadcast(buf, root), where, engine=eng)
    if g.rank() != root:
        items = pickle.loads(buf.tobytes())
        if len(items) != len(object_list):
            raise ValueRangeError(f"{where}: rank {src} sent {len(items)} objects, this rank's list has "
                                  f"{len(object_list)}")
        object_list[:] = items
