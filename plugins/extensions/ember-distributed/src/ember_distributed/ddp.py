"""``DistributedDataParallel``: data-parallel training with gradients bucketed and all-reduced during backward.

At wrap time rank 0's parameters and buffers are broadcast to every rank. Parameters that need gradients are
assigned to buckets in reverse registration order (the order backward usually produces their gradients): a first
bucket of 1 MiB, so communication starts early, then ``bucket_cap_mb`` MiB buckets, one dtype per bucket (as
torch's reducer). Each parameter's ``register_post_accumulate_grad_hook`` copies its gradient into its bucket's
flat buffer; a full bucket is all-reduced asynchronously, buckets are launched in index order on every rank (MPI
matches collectives by order), and the pending ones are polled from later hooks so MPI progresses them while
backward computes. The hook of the last parameter waits for every bucket and writes the averaged gradients back
into ``.grad``. Communication hooks (:meth:`DistributedDataParallel.register_comm_hook`) replace the all-reduce of
a bucket, the extension point for gradient compression.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import ember
from ember import nn
from ember.errors import ValueRangeError

from .collectives import _host_view, _wire_dtype, broadcast, write_into
from .errors import DistributedError
from .group import ProcessGroup, ReduceOp, Work, resolve

_MB = 1024 * 1024
#: torch's reducer starts with a small bucket so the first all-reduce overlaps as much of backward as possible
FIRST_BUCKET_BYTES = 1 * _MB


class GradBucket:
    """One bucket of flattened gradients, handed to a communication hook (``torch.distributed.GradBucket``):
    ``buffer()`` is the flat host (MPI) or CuPy (NCCL) array, ``parameters()`` its parameters in buffer order,
    ``offsets()`` where each one's gradient starts."""

    def __init__(self, index: int, params: list[Any], names: list[str], dtype: np.dtype, xp: Any) -> None:
        self._index = index
        self.params, self.names = params, names
        self.sizes = [int(p.numel()) for p in params]
        self.starts = [int(s) for s in np.concatenate([[0], np.cumsum(self.sizes)[:-1]])] if params else []
        self.numel = int(sum(self.sizes))
        self.dtype = dtype
        # with find_unused_parameters, one extra element per parameter counts the ranks that used it
        self.flat = xp.zeros(self.numel, dtype=dtype)
        self.used = xp.zeros(len(params), dtype=dtype)
        self.ready: set[int] = set()
        self.work: Work | None = None

    def index(self) -> int:
        """The bucket's index (bucket 0 holds the last registered parameters)."""
        return self._index

    def buffer(self) -> Any:
        """The flat gradient array (modified in place by the hook's collective)."""
        return self.flat

    def parameters(self) -> list[Any]:
        """The bucket's parameters, in buffer order."""
        return list(self.params)

    def offsets(self) -> list[int]:
        """Start offset of each parameter's gradient in :meth:`buffer`."""
        return list(self.starts)

    def nbytes(self) -> int:
        """Bytes of the gradients in the bucket (what one all-reduce of it sends, per rank, before the algorithm's
        factor)."""
        return int(self.numel * self.dtype.itemsize)


def allreduce_hook(group: ProcessGroup, bucket: GradBucket) -> Work:
    """The default communication hook: an async all-reduce (sum) of the bucket, divided by the group size when it
    completes (the average over ranks, as torch's DDP). Hooks take ``(state, bucket)`` and return a :class:`Work`
    whose ``wait()`` leaves the reduced gradients in ``bucket.buffer()``."""
    buf = bucket.buffer()
    n = group.size()

    def finish() -> None:
        buf[...] /= n

    return Work(f"DataParallel all_reduce of bucket {bucket.index()}", group,
                group.engine.all_reduce(buf, ReduceOp.SUM), finish, [])


class DistributedDataParallel(nn.Module):
    """Data-parallel ``module`` over the ranks of ``process_group`` (``torch.nn.parallel.DistributedDataParallel``).

    * ``broadcast_buffers``: rank 0's buffers (batch-norm running statistics) are broadcast at every forward in
      training mode (in eval mode they do not change, so ranks may evaluate independently).
    * ``bucket_cap_mb``: bucket size in MiB (25, as torch).
    * ``find_unused_parameters``: parameters of submodules whose forward did not run in this iteration count as
      ready (contributing no gradient); a parameter no rank used keeps its ``.grad``. Without it, a parameter that
      gets no gradient leaves the reduction unfinished, and the next forward raises a
      :class:`~ember_distributed.errors.DistributedError` naming it.
    * ``device_ids``, ``output_device``, ``dim`` are accepted for torch compatibility: an ember module lives on one
      device, and each rank runs its own process.

    Use :meth:`no_sync` to accumulate gradients locally over several backward passes.
    """

    def __init__(self, module: nn.Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group: ProcessGroup | None = None,
                 bucket_cap_mb: float | None = 25, find_unused_parameters: bool = False) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ValueRangeError(f"DataParallel: module must be an nn.Module, got {type(module).__name__}")
        cap = 25 if bucket_cap_mb is None else bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0:
            raise ValueRangeError(f"DataParallel: bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        self.module = module
        self.process_group = resolve(process_group, "DataParallel")
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_cap_mb = float(cap)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.require_backward_grad_sync = True
        self.dim = dim
        self._comm_hook: tuple[Any, Callable[[Any, GradBucket], Work]] = (self.process_group, allreduce_hook)
        self._sync_module_states()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._buckets = self._assign_buckets(named)
        self._where = {}  # id(param) -> (bucket, position)
        for b in self._buckets:
            for k, p in enumerate(b.params):
                self._where[id(p)] = (b, k)
        self._armed = False
        self._next_launch = 0
        self._ran: set[int] = set()
        self._stats: dict[str, float] = {}
        me = weakref.ref(self)
        self._handles = [p.register_post_accumulate_grad_hook(_ready_hook(me, b.index(), k))
                         for b in self._buckets for k, p in enumerate(b.params)]
        if self.find_unused_parameters:
            self._handles += [m.register_forward_pre_hook(_ran_hook(me)) for m in module.modules()]

    # -- setup --

    def _sync_module_states(self) -> None:
        """Rank 0's parameters and buffers on every rank (so all start from the same model)."""
        if self.process_group.size() == 1:
            return
        src = self.process_group.ranks[0]
        works = [broadcast(t, src, self.process_group, async_op=True)
                 for t in list(self.module.parameters()) + list(self.module.buffers())]
        for w in works:
            w.wait()

    def _assign_buckets(self, named: list[tuple[str, Any]]) -> list[GradBucket]:
        xp = self.process_group.engine.cupy if self.process_group.backend == "nccl" else np
        cap, first = self.bucket_cap_mb * _MB, min(FIRST_BUCKET_BYTES, self.bucket_cap_mb * _MB)
        buckets: list[GradBucket] = []
        open_: dict[Any, tuple[list[Any], list[str], int]] = {}  # one open bucket per (device, dtype)

        def close(key: Any) -> None:
            ps, ns, _ = open_.pop(key)
            buckets.append(GradBucket(len(buckets), ps, ns, key[1], xp))

        for name, p in reversed(named):
            key = (p.device, _wire_dtype(np.dtype(p.dtype.numpy)))
            ps, ns, size = open_.get(key, ([], [], 0))
            ps.append(p)
            ns.append(name)
            size += int(p.numel()) * key[1].itemsize
            open_[key] = (ps, ns, size)
            if size >= (first if not buckets else cap):
                close(key)
        for key in list(open_):
            close(key)
        return buckets

    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], Work]) -> None:
        """Replace the all-reduce of each bucket by ``hook(state, bucket) -> Work`` (torch's DDP comm hook): the
        Work's ``wait()`` must leave the averaged gradients in ``bucket.buffer()``. Gradient compression (fp16,
        PowerSGD, top-k) plugs in here; :func:`allreduce_hook` is the default."""
        if not callable(hook):
            raise ValueRangeError(f"register_comm_hook: hook must be callable, got {type(hook).__name__}")
        self._comm_hook = (state, hook)

    # -- forward --

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._check_previous_iteration()
        if self.broadcast_buffers and self.training and self.process_group.size() > 1:
            src = self.process_group.ranks[0]
            for w in [broadcast(b, src, self.process_group, async_op=True) for b in self.module.buffers()]:
                w.wait()
        arm = (self.require_backward_grad_sync and ember.is_grad_enabled() and self.process_group.size() > 1
               and bool(self._buckets))
        if arm:
            self._armed, self._next_launch, self._ran = True, 0, set()
            for b in self._buckets:
                b.ready.clear()
                b.work = None
                b.used[...] = 0
            self._stats = {"first_ready": 0.0, "last_ready": 0.0, "wait_s": 0.0, "bytes": 0.0}
        out = self.module(*inputs, **kwargs)
        if arm and self.find_unused_parameters:
            self._mark_unused()
        return out

    def _check_previous_iteration(self) -> None:
        if not self._armed:
            return
        started = any(b.ready for b in self._buckets)
        if not started:
            return  # a forward with no backward (evaluation, a skipped step): nothing to finish
        missing = [b.names[k] for b in self._buckets for k in range(len(b.params)) if k not in b.ready]
        self._armed = False
        raise DistributedError(
            "DataParallel: the previous iteration's gradient reduction did not finish: parameters "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} in all) received no gradient in "
            "backward. They were not used to compute the loss; pass find_unused_parameters=True to "
            "DataParallel, or make every parameter take part in the loss (or freeze it with requires_grad_(False) "
            "before wrapping)")

    def _mark_unused(self) -> None:
        ran = self._ran
        for m in self.module.modules():
            if id(m) in ran:
                continue
            for p in m.parameters(recurse=False):
                loc = self._where.get(id(p))
                if loc is not None:
                    self._on_ready(loc[0].index(), loc[1], used=False)

    # -- backward --

    def _on_ready(self, bi: int, k: int, used: bool = True) -> None:
        if not self._armed:
            return
        b = self._buckets[bi]
        if k in b.ready:
            return
        now = time.monotonic()
        if not self._stats["first_ready"]:
            self._stats["first_ready"] = now
        self._stats["last_ready"] = now
        start, n = b.starts[k], b.sizes[k]
        p = b.params[k]
        g = p.grad if used else None
        if g is None:
            b.flat[start:start + n] = 0
        else:
            b.flat[start:start + n] = self._grad_values(g)
            b.used[k] = 1
        b.ready.add(k)
        self._launch_ready()
        for bb in self._buckets[:self._next_launch]:  # let MPI progress what is in flight
            if bb.work is not None:
                bb.work.is_completed()
        if self._next_launch == len(self._buckets):
            self._finish_reduction()

    def _grad_values(self, g: Any) -> Any:
        if self.process_group.backend == "nccl":
            from .collectives import stage

            return stage(self.process_group, g, "DataParallel").buf
        v = _host_view(g)
        return (v if v is not None else g.detach().numpy()).reshape(-1)

    def _launch_ready(self) -> None:
        state, hook = self._comm_hook
        while self._next_launch < len(self._buckets):
            b = self._buckets[self._next_launch]
            if len(b.ready) < len(b.params):
                return
            if self.find_unused_parameters:
                # the per-parameter use counts ride along in a second collective of the same bucket
                b.flat = _concat(b.flat, b.used)
            b.work = hook(state, b)
            self._stats["bytes"] += b.nbytes()
            self._next_launch += 1

    def _finish_reduction(self) -> None:
        t0 = time.monotonic()
        for b in self._buckets:
            b.work.wait()
        self._stats["done"] = time.monotonic()
        self._stats["wait_s"] = self._stats["done"] - t0
        n = self.process_group.size()
        for b in self._buckets:
            flat = b.flat
            if self.find_unused_parameters:
                flat, used = flat[:b.numel], flat[b.numel:] * n  # the hook averaged the counts too
                b.flat = flat
            else:
                used = None
            for k, p in enumerate(b.params):
                if used is not None and float(used[k]) < 0.5:
                    continue  # no rank used it: its .grad stays as it was, as torch's
                vals = flat[b.starts[k]:b.starts[k] + b.sizes[k]]
                g = p.grad
                if g is None:
                    p.grad = ember.as_tensor(_host(vals).reshape(tuple(p.shape)).astype(np.dtype(p.dtype.numpy)),
                                             dtype=p.dtype, device=p.device)
                else:
                    write_into(g, vals)
        self._armed = False

    # -- accumulation, statistics --

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward accumulates gradients locally without communication; the first backward after the
        block all-reduces the accumulated gradients (``DistributedDataParallel.no_sync``)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def bucket_sizes(self) -> list[int]:
        """Bytes per bucket, in launch order (bucket 0 first)."""
        return [b.nbytes() for b in self._buckets]

    def bucket_parameter_names(self) -> list[list[str]]:
        """The parameter names of each bucket, in launch order."""
        return [list(b.names) for b in self._buckets]

    def last_step_stats(self) -> dict[str, float]:
        """The last synchronized backward: ``bytes`` all-reduced (gradient bytes per rank),
        ``exposed_wait_s`` (time the last hook blocked waiting for the collectives: communication backward did
        not hide, plus waiting for slower ranks), ``backward_span_s`` (first to last gradient ready), and the
        ``time.monotonic()`` instants ``ready_at`` (last gradient ready) and ``done_at`` (reduction finished), which
        ranks on one host can compare to separate waiting for a slower rank from communication."""
        s = self._stats
        if not s.get("done"):
            return {}
        return {"bytes": s["bytes"], "exposed_wait_s": s["wait_s"],
                "backward_span_s": s["last_ready"] - s["first_ready"], "ready_at": s["last_ready"],
                "done_at": s["done"]}


DataParallel = DistributedDataParallel


def _concat(a: Any, b: Any) -> Any:
    xp = np if isinstance(a, np.ndarray) else __import__("cupy")
    return xp.concatenate([a, b])


def _host(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


def _ready_hook(me: Any, bi: int, k: int) -> Callable[[Any], None]:
    def hook(param: Any) -> None:
        ddp = me()
        if ddp is not None:
            ddp._on_ready(bi, k)

    hook.__name__ = "ddp_grad_ready"
    return hook


def _ran_hook(me: Any) -> Callable[..., None]:
    def hook(module: Any, args: Any) -> None:
        ddp = me()
        if ddp is not None:
            ddp._ran.add(id(module))

    hook.__name__ = "ddp_module_ran"
    return hook
