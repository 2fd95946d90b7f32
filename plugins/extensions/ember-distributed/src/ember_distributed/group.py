"""Process groups on an existing engine: MPI through mpi4py (host buffers), NCCL through CuPy (device memory).

The default group (``WORLD``) is made by :func:`init`; :func:`new_group` makes subgroups, collectively on every rank
like ``torch.distributed.new_group``. Every collective is issued non-blocking (``MPI_I*`` requests, or an NCCL call
and a CUDA event on a stream) and waited for by polling against the group's timeout, so a rank that died makes its
peers raise :class:`~ember_distributed.errors.DistributedTimeoutError` instead of hanging forever. A rank that
raises an uncaught exception aborts the job at once (``MPI_Abort``) after printing its traceback.
"""

from __future__ import annotations

import atexit
import enum
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from ember.errors import DeviceError, ValueRangeError

from .errors import DistributedError, DistributedTimeoutError

#: default collective timeout (seconds); torch's default for its CPU backend is 30 minutes, which is far too long to
#: notice a dead rank in an interactive run. ``EMBER_DIST_TIMEOUT`` (seconds) or ``init(timeout=...)`` override it.
DEFAULT_TIMEOUT_S = 600.0


class ReduceOp(enum.Enum):
    """Reduction of :func:`all_reduce` / :func:`reduce_scatter` (``torch.distributed.ReduceOp``'s members)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"

    @classmethod
    def of(cls, op: Any, where: str) -> ReduceOp:
        """``op`` as a ReduceOp (members or their names, any case); a ValueRangeError naming ``where`` otherwise."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            try:
                return cls[op.upper()]
            except KeyError:
                pass
        raise ValueRangeError(f"{where}: op must be a ReduceOp ({', '.join(m.name for m in cls)}), got {op!r}")


# --- engines ---------------------------------------------------------------------------------------------------

class _MPIEngine:
    """Collectives of one MPI communicator on contiguous host numpy buffers (mpi4py's buffer protocol)."""

    kind = "mpi"

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD,
                     ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX}

    def all_reduce(self, buf: np.ndarray, op: ReduceOp) -> list[Any]:
        return [self.comm.Iallreduce(self.MPI.IN_PLACE, buf, self._ops[op])]

    def broadcast(self, buf: np.ndarray, root: int) -> list[Any]:
        return [self.comm.Ibcast(buf, root=root)]

    def all_gather(self, send: np.ndarray, recv: np.ndarray) -> list[Any]:
        return [self.comm.Iallgather(send, recv)]

    def all_gatherv(self, send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> list[Any]:
        return [self.comm.Iallgatherv(send, [recv, list(counts)])]

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, op: ReduceOp) -> list[Any]:
        return [self.comm.Ireduce_scatter_block(send, recv, self._ops[op])]

    def barrier(self) -> list[Any]:
        return [self.comm.Ibarrier()]

    def test(self, pending: list[Any]) -> bool:
        return bool(self.MPI.Request.Testall(pending))

    def engine_error(self) -> type[BaseException]:
        return self.MPI.Exception


class _NCCLEngine:
    """Collectives of one NCCL communicator on CuPy device arrays (CuPy's ``cupy.cuda.nccl`` bindings); the unique
    id is exchanged over the MPI communicator the group was made from. Ops run on a dedicated stream; each call's
    completion is a CUDA event, polled like MPI requests."""

    kind = "nccl"

    def __init__(self, comm: Any) -> None:
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError as exc:
            raise DeviceError(
                "init(backend='nccl'): needs CuPy built with NCCL (pip install cupy-cuda12x, or cupy-rocm-* on ROCm); "
                f"it is not importable here ({exc}); use backend='mpi' for host tensors") from None
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise DeviceError("init(backend='nccl'): CuPy finds no GPU on this host; use backend='mpi'")
        self.cupy, self.nccl, self.mpi = cupy, nccl, comm
        uid = nccl.get_unique_id() if comm.rank == 0 else None
        uid = comm.bcast(uid, root=0)  # bootstrap over MPI, as torch's NCCL bootstrap does over its store
        self.comm = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._ops = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.AVG: nccl.NCCL_SUM, ReduceOp.PRODUCT: nccl.NCCL_PROD,
                     ReduceOp.MIN: nccl.NCCL_MIN, ReduceOp.MAX: nccl.NCCL_MAX}

    def _dtype(self, a: Any) -> int:
        n = self.nccl
        table = {"float16": n.NCCL_FLOAT16, "float32": n.NCCL_FLOAT32, "float64": n.NCCL_FLOAT64,
                 "int8": n.NCCL_INT8, "uint8": n.NCCL_UINT8, "int32": n.NCCL_INT32, "uint32": n.NCCL_UINT32,
                 "int64": n.NCCL_INT64, "uint64": n.NCCL_UINT64}
        try:
            return table[str(a.dtype)]
        except KeyError:
            raise DistributedError(f"nccl: no NCCL datatype for {a.dtype}") from None

    def _event(self) -> list[Any]:
        ev = self.cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(self.stream)
        return [ev]

    def all_reduce(self, buf: Any, op: ReduceOp) -> list[Any]:
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._dtype(buf), self._ops[op], self.stream.ptr)
        return self._event()

    def broadcast(self, buf: Any, root: int) -> list[Any]:
        self.comm.bcast(buf.data.ptr, buf.size, self._dtype(buf), root, self.stream.ptr)
        return self._event()

    def all_gather(self, send: Any, recv: Any) -> list[Any]:
        self.comm.allGather(send.data.ptr, recv.data.ptr, send.size, self._dtype(send), self.stream.ptr)
        return self._event()

    def all_gatherv(self, send: Any, recv: Any, counts: Sequence[int]) -> list[Any]:
        raise DistributedError("nccl: variable-size gathers (the *_object collectives) run on the MPI group")

    def reduce_scatter(self, send: Any, recv: Any, op: ReduceOp) -> list[Any]:
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self._dtype(send), self._ops[op],
                                self.stream.ptr)
        return self._event()

    def barrier(self) -> list[Any]:
        one = self.cupy.ones(1, dtype=self.cupy.float32)
        return self.all_reduce(one, ReduceOp.SUM)

    def test(self, pending: list[Any]) -> bool:
        return all(ev.done for ev in pending)

    def engine_error(self) -> type[BaseException]:
        return self.nccl.NcclError


# --- groups ----------------------------------------------------------------------------------------------------

_broken = False  # a collective timed out or the engine failed: MPI_Finalize would hang, exit without it
_lock = threading.Lock()


def _exit_without_finalize() -> None:
    # registered at init, so it runs before mpi4py's own finalizer (a C-level exit hook): with a lost peer
    # MPI_Finalize blocks forever, which is exactly the hang a dead rank must not cause
    if _broken:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# Seconds between printing a failing rank's traceback and aborting the job, for mpiexec to forward it.
_ABORT_GRACE_S = 0.5


def _install_fail_fast(world: Any) -> None:
    """An uncaught exception on one rank aborts the whole job right after its traceback is printed (as torchrun
    tears the other workers down), instead of leaving the other ranks to time out in their next collective. A
    rank whose group already timed out exits through :func:`_exit_without_finalize` instead."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if _broken or previous is not sys.__excepthook__:
            previous(kind, value, tb)
        else:
            # One write, then a pause before the abort: mpiexec forwards each rank's stderr through its own proxy,
            # and an abort that lands while the traceback is still in the pipe loses its last lines (the message).
            sys.stdout.flush()
            sys.stderr.flush()
            text = "".join(traceback.format_exception(kind, value, tb)).encode(errors="replace")
            while text:
                text = text[os.write(2, text):]
        if not _broken:
            time.sleep(_ABORT_GRACE_S)
            world.Abort(1)

    sys.excepthook = hook


class ProcessGroup:
    """A set of ranks and the engine communicator that connects them (``torch.distributed.ProcessGroup``).

    ``rank()`` / ``size()`` are this process's rank in the group and the group's size; ``ranks`` the global ranks
    of its members in group order. A process outside a group made by :func:`new_group` gets a group whose
    ``rank()`` is -1; collectives on it raise :class:`DistributedError`.
    """

    def __init__(self, engine: Any, mpi_comm: Any, ranks: Sequence[int], timeout_s: float, name: str) -> None:
        self.engine = engine
        self.mpi_comm = mpi_comm  # the MPI communicator (also NCCL groups keep it for bootstrap and objects)
        self.ranks = tuple(int(r) for r in ranks)
        self.timeout_s = float(timeout_s)
        self.name = name
        self._rank = -1 if mpi_comm is None else int(mpi_comm.rank)

    @property
    def backend(self) -> str:
        """``"mpi"`` or ``"nccl"``."""
        return self.engine.kind if self.engine is not None else "none"

    def rank(self) -> int:
        """This process's rank in the group (-1 outside it)."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return len(self.ranks)

    def group_rank(self, global_rank: int, where: str) -> int:
        """The group rank of a global rank; a ValueRangeError naming ``where`` when it is not a member."""
        try:
            return self.ranks.index(int(global_rank))
        except ValueError:
            raise ValueRangeError(f"{where}: rank {global_rank} is not in process group {self.name} (ranks "
                                  f"{list(self.ranks)})") from None

    def check_member(self, where: str) -> None:
        """Raise a DistributedError when this process is not in the group."""
        if self._rank < 0:
            raise DistributedError(f"{where}: this process (global rank {get_rank()}) is not a member of process "
                                   f"group {self.name} (ranks {list(self.ranks)})")

    def wait(self, pending: list[Any], what: str, timeout_s: float | None = None, engine: Any = None) -> None:
        """Poll the engine (``engine``: another one of this group, the MPI one of an NCCL group) until ``pending``
        completes; a DistributedTimeoutError after the timeout."""
        global _broken
        limit = self.timeout_s if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + limit
        spins = 0
        eng = self.engine if engine is None else engine
        err = eng.engine_error()
        while True:
            try:
                if eng.test(pending):
                    return
            except err as exc:
                _broken = True
                raise DistributedError(f"{what} on rank {self._rank} of process group {self.name} failed in "
                                       f"{self.backend}: {exc}") from exc
            if time.monotonic() > deadline:
                _broken = True
                raise DistributedTimeoutError(
                    f"{what} on rank {self._rank} of {self.size()} (process group {self.name}, {self.backend}) did not "
                    f"complete within {limit:g} s: a peer rank died or is stuck; the group is unusable now and "
                    "this process exits with status 1 at interpreter exit (init(timeout=...) or "
                    "EMBER_DIST_TIMEOUT set the limit)")
            spins += 1
            # spin briefly (fast completions), then back off to at most 0.2 ms per poll: MPI progresses a
            # non-blocking collective only inside MPI calls, so each poll gap delays each step of its algorithm
            if spins > 200:
                time.sleep(min(2e-4, 2e-6 * (spins - 200)))

    def __repr__(self) -> str:
        return f"ProcessGroup({self.name}, backend={self.backend}, ranks={list(self.ranks)}, rank={self._rank})"


_WORLD: ProcessGroup | None = None


def _timeout_seconds(timeout: Any) -> float:
    if timeout is None:
        env = os.environ.get("EMBER_DIST_TIMEOUT")
        if env:
            try:
                return float(env)
            except ValueError:
                raise ValueRangeError(f"init: EMBER_DIST_TIMEOUT must be seconds, got {env!r}") from None
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, timedelta):
        s = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        s = float(timeout)
    else:
        raise ValueRangeError(f"init: timeout must be a datetime.timedelta or seconds, got {timeout!r}")
    if s <= 0:
        raise ValueRangeError(f"init: timeout must be positive, got {s} s")
    return s


def _auto_backend() -> str:
    """``nccl`` when ember's default device is a GPU one and CuPy with NCCL sees a GPU; ``mpi`` otherwise."""
    import ember

    if ember.Device.default().base.kind not in ("cuda", "rocm"):
        return "mpi"
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401

        return "nccl" if cupy.cuda.runtime.getDeviceCount() > 0 else "mpi"
    except Exception:  # no CuPy / no NCCL / no driver: MPI with host staging still works
        return "mpi"


def init(backend: str = "auto", timeout: Any = None) -> ProcessGroup:
    """Initialize the default process group over every rank the launcher started (``mpiexec``, ``srun``,
    ``ember launch``; a plain ``python`` process is a group of one).

    ``backend``: ``"mpi"`` (mpi4py; host tensors zero-copy, other devices staged through host memory), ``"nccl"``
    (CuPy's NCCL on GPU tensors; bootstrapped over MPI) or ``"auto"`` (NCCL when the default device is a GPU and
    NCCL is available, else MPI). ``timeout``: seconds or a ``timedelta`` after which a collective raises
    :class:`DistributedTimeoutError` (default ``EMBER_DIST_TIMEOUT`` or 600 s). With more than one rank, an
    uncaught exception on any rank aborts the whole job after its traceback (fail fast, as torchrun). Returns the
    default group.
    """
    global _WORLD
    if backend not in ("mpi", "nccl", "auto"):
        raise ValueRangeError(f"init: backend must be 'mpi', 'nccl' or 'auto', got {backend!r}")
    timeout_s = _timeout_seconds(timeout)
    with _lock:
        if _WORLD is not None:
            raise DistributedError(f"init: the default process group is already initialized ({_WORLD}); call "
                                   "destroy_process_group() first")
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise DistributedError(f"init: mpi4py is not importable ({exc}); pip install mpi4py mpich (or build "
                                   "mpi4py against the cluster's MPI)") from None
        atexit.register(_exit_without_finalize)
        comm = MPI.COMM_WORLD.Dup()  # ember's traffic never mixes with the application's own MPI messages
        chosen = _auto_backend() if backend == "auto" else backend
        engine = _NCCLEngine(comm) if chosen == "nccl" else _MPIEngine(comm)
        _WORLD = ProcessGroup(engine, comm, range(comm.size), timeout_s, "WORLD")
        if comm.size > 1:
            _install_fail_fast(MPI.COMM_WORLD)
        return _WORLD


def init_process_group(backend: str = "auto", timeout: Any = None) -> ProcessGroup:
    """``torch.distributed.init_process_group``'s name for :func:`init`."""
    return init(backend, timeout)


def is_initialized() -> bool:
    """Whether :func:`init` made the default process group."""
    return _WORLD is not None


def is_available() -> bool:
    """Whether an engine is importable (mpi4py; NCCL additionally needs CuPy)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def default_group(where: str) -> ProcessGroup:
    """The default group; a DistributedError naming ``where`` before :func:`init`."""
    if _WORLD is None:
        raise DistributedError(f"{where}: the default process group is not initialized; call "
                               "ember.distributed.init() first (under mpiexec / ember launch for several ranks)")
    return _WORLD


def resolve(group: ProcessGroup | None, where: str) -> ProcessGroup:
    """``group`` or the default one, checked to be a ProcessGroup this process belongs to."""
    g = default_group(where) if group is None else group
    if not isinstance(g, ProcessGroup):
        raise ValueRangeError(f"{where}: group must be a ProcessGroup or None, got {type(g).__name__}")
    g.check_member(where)
    return g


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (default: the world), -1 outside it."""
    return (default_group("get_rank") if group is None else group).rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (default: the world)."""
    return (default_group("get_world_size") if group is None else group).size()


def rank(group: ProcessGroup | None = None) -> int:
    """Short name of :func:`get_rank`."""
    return get_rank(group)


def world_size(group: ProcessGroup | None = None) -> int:
    """Short name of :func:`get_world_size`."""
    return get_world_size(group)


def get_backend(group: ProcessGroup | None = None) -> str:
    """``"mpi"`` or ``"nccl"``."""
    return (default_group("get_backend") if group is None else group).backend


def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: str | None = None) -> ProcessGroup:
    """A subgroup of the given global ranks (all ranks when None), in that order. Like torch, every rank of the
    world calls it (it is collective over the world); a rank not in ``ranks`` gets a non-member group."""
    world = default_group("new_group")
    members = list(range(world.size())) if ranks is None else [int(r) for r in ranks]
    bad = [r for r in members if not 0 <= r < world.size()]
    if bad or len(set(members)) != len(members) or not members:
        raise ValueRangeError(f"new_group: ranks must be distinct ranks in 0..{world.size() - 1}, got {ranks!r}")
    from mpi4py import MPI

    me = world.rank()
    color = 0 if me in members else MPI.UNDEFINED
    key = members.index(me) if me in members else 0
    sub = world.mpi_comm.Split(color, key)  # collective over the world, like torch's new_group
    timeout_s = world.timeout_s if timeout is None else _timeout_seconds(timeout)
    name = f"group{members}"
    if sub == MPI.COMM_NULL:
        return ProcessGroup(None, None, members, timeout_s, name)
    kind = backend or world.backend
    engine = _NCCLEngine(sub) if kind == "nccl" else _MPIEngine(sub)
    return ProcessGroup(engine, sub, members, timeout_s, name)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free a group's communicator (the default group when None, after which :func:`init` may run again)."""
    global _WORLD
    g = default_group("destroy_process_group") if group is None else group
    if g.mpi_comm is not None and not _broken:
        g.mpi_comm.Free()
    g.mpi_comm, g.engine, g._rank = None, None, -1
    if group is None or g is _WORLD:
        _WORLD = None


class Work:
    """The handle of an async collective (``async_op=True``), as torch's ``Work``: ``wait()`` blocks until it is
    done (raising on a timeout or an engine error) and writes the result into the output tensors; then
    ``is_completed()`` is True and ``result()`` lists the output tensors."""

    def __init__(self, what: str, group: ProcessGroup, pending: list[Any], finish: Callable[[], None] | None,
                 outputs: Sequence[Any]) -> None:
        self.what, self.group, self._pending, self._finish = what, group, pending, finish
        self._outputs = list(outputs)
        self._done = False

    def is_completed(self) -> bool:
        """Whether the collective finished (polls the engine once; finishing writes the outputs)."""
        if not self._done and self.group.engine.test(self._pending):
            self._complete()
        return self._done

    def wait(self, timeout: Any = None) -> bool:
        """Block until done (``timeout``: seconds or a timedelta instead of the group's); returns True."""
        if not self._done:
            t = None if timeout is None else _timeout_seconds(timeout)
            self.group.wait(self._pending, self.what, t)
            self._complete()
        return True

    def _complete(self) -> None:
        self._done = True
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()

    def result(self) -> list[Any]:
        """The output tensors (after :meth:`wait`)."""
        return list(self._outputs)

    def __repr__(self) -> str:
        return f"Work({self.what}, {'completed' if self._done else 'pending'})"
