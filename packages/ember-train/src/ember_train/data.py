"""Datasets and the DataLoader: reproducible shuffles, exact mid-epoch resume, prefetching worker threads.

Data order is a pure function of ``(seed, epoch)``: an epoch's permutation is
``numpy.random.default_rng(seed + epoch).permutation(len(dataset))``. Together with the position in the epoch
(batches already handed out) this is the loader's whole state, so ``state_dict()`` / ``load_state_dict()``
resume a run exactly, and the order never depends on ``num_workers``. A loader given no seed takes one from
ember's global generator (``ember.draw_seed()``), so ``ember.manual_seed(n)`` makes its shuffles reproducible.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

import ember
from ember import dtypes as dt
from ember.device import Device, as_device, default_device
from ember.errors import EmberError, ShapeError, ValueRangeError

from .errors import CollateError


class Dataset:
    """A map-style dataset: ``len(ds)`` items, ``ds[i]`` a tuple of numpy arrays, numbers or ember Tensors."""

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement __len__")

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")


class IterableDataset:
    """A stream of items; the DataLoader batches it in order (no shuffling, no random access)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


def _host(a: Any) -> np.ndarray:
    if isinstance(a, ember.Tensor):
        return a.detach().numpy()
    return np.asarray(a)


class TensorDataset(Dataset):
    """Item ``i`` is ``tuple(a[i] for a in arrays)``; arrays are numpy arrays or ember Tensors, equal length."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueRangeError("TensorDataset: needs at least one array")
        self.arrays = tuple(_host(a) for a in arrays)
        for k, a in enumerate(self.arrays):
            if a.ndim == 0:
                raise ShapeError(f"TensorDataset: array {k} is a scalar (shape ()); every array needs a first dim")
        lengths = [a.shape[0] for a in self.arrays]
        if len(set(lengths)) != 1:
            shapes = ", ".join(str(tuple(a.shape)) for a in self.arrays)
            raise ShapeError(f"TensorDataset: arrays differ in their first dimension: shapes {shapes}")

    def __len__(self) -> int:
        return int(self.arrays[0].shape[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(a[index] for a in self.arrays)


class Subset(Dataset):
    """The items of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = [int(i) for i in indices]
        n = len(dataset)
        bad = [i for i in self.indices if not -n <= i < n]
        if bad:
            raise ValueRangeError(f"Subset: indices {bad[:5]} out of range for a dataset of length {n}")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the wrapped dataset (per-epoch random transforms)."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        # dataset metadata (classes, mean, std ...) stays visible through a split
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class TransformDataset(Dataset):
    """Applies ``transform(field, rng=...)`` to field ``field`` of each item.

    Random transforms draw from ``numpy.random.default_rng((seed, epoch, index))``, so an augmented item depends
    only on (seed, epoch, index): identical with or without workers and after a resume. The DataLoader calls
    ``set_epoch`` at the start of each epoch.
    """

    def __init__(self, dataset: Any, transform: Callable[..., Any], field: int = 0, seed: int = 0) -> None:
        self.dataset, self.transform, self.field, self.seed = dataset, transform, int(field), int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose augmentation stream items are drawn from."""
        self.epoch = int(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        item = tuple(self.dataset[index])
        rng = np.random.default_rng((self.seed, self.epoch, int(index) % max(len(self), 1)))
        out = list(item)
        out[self.field] = self.transform(out[self.field], rng=rng)
        return tuple(out)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def random_split(dataset: Any, lengths: Sequence[int | float], seed: int = 0) -> list[Subset]:
    """Split into non-overlapping Subsets of the given lengths (ints summing to len, or fractions summing to 1)."""
    n = len(dataset)
    lengths = list(lengths)
    if not lengths:
        raise ValueRangeError("random_split: lengths is empty")
    if all(isinstance(x, float) for x in lengths) and math.isclose(sum(lengths), 1.0, abs_tol=1e-6):
        if any(not 0.0 <= x <= 1.0 for x in lengths):
            raise ValueRangeError(f"random_split: fractions must lie in [0, 1], got {lengths}")
        counts = [int(math.floor(n * x)) for x in lengths]
        for k in range(n - sum(counts)):  # hand the remainder out round-robin, like PyTorch
            counts[k % len(counts)] += 1
    else:
        if any(isinstance(x, float) and not float(x).is_integer() for x in lengths):
            raise ValueRangeError(f"random_split: fractional lengths {lengths} must sum to 1")
        counts = [int(x) for x in lengths]
        if any(c < 0 for c in counts):
            raise ValueRangeError(f"random_split: negative length in {lengths}")
        if sum(counts) != n:
            raise ValueRangeError(f"random_split: lengths {lengths} sum to {sum(counts)}, the dataset has {n} items")
    perm = np.random.default_rng(seed).permutation(n)
    out, start = [], 0
    for c in counts:
        out.append(Subset(dataset, perm[start:start + c].tolist()))
        start += c
    return out


# --- collation -------------------------------------------------------------------------------------------------

def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"array of shape {tuple(v.shape)} dtype {v.dtype}"
    if isinstance(v, ember.Tensor):
        return f"Tensor of shape {tuple(v.shape)} dtype {v.dtype}"
    return f"{type(v).__name__} {v!r}"[:80]


def _field_array(values: list[Any], field: int, where: Callable[[int], str]) -> np.ndarray:
    arrays = []
    for k, v in enumerate(values):
        if isinstance(v, ember.Tensor):
            v = v.detach().numpy()
        elif isinstance(v, (bool, int, float, np.generic, np.ndarray)):
            v = np.asarray(v)
        else:
            raise CollateError(
                f"collate: field {field} of {where(k)} is a {_describe(v)}; only numpy arrays, numbers and ember "
                "Tensors collate (pass collate_fn= for other types)"
            )
        if v.dtype.kind not in "biuf":
            raise CollateError(f"collate: field {field} of {where(k)} is a {_describe(v)}, not numeric")
        arrays.append(v)
    first = arrays[0].shape
    for k, a in enumerate(arrays):
        if a.shape != first:
            raise CollateError(
                f"collate: field {field} of {where(k)} has shape {tuple(a.shape)} but {where(0)} has shape "
                f"{tuple(first)}; all items of a batch must have equal shapes per field"
            )
    out = np.stack(arrays)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        out = out.astype(np.int64, copy=False)  # Python ints -> int64 on every platform, like torch
    try:
        dt.from_numpy_dtype(out.dtype)
    except EmberError:
        msg = f"collate: field {field} has numpy dtype {out.dtype}, which ember has no dtype for"
        raise CollateError(msg) from None
    return out


def collate_host(batch: Sequence[Any], indices: Sequence[int] | None = None) -> tuple[np.ndarray, ...]:
    """Stack a list of items field by field into host numpy arrays (PyTorch's default_collate dtype rules:
    Python floats -> float64, ints -> int64, bools -> bool, numpy/Tensor dtypes kept)."""
    if len(batch) == 0:
        raise CollateError("collate: empty batch")

    def where(k: int) -> str:
        return f"item {k}" + (f" (dataset index {indices[k]})" if indices is not None else "")

    items = [tuple(it) if isinstance(it, (tuple, list)) else (it,) for it in batch]
    nfields = len(items[0])
    for k, it in enumerate(items):
        if len(it) != nfields:
            raise CollateError(f"collate: {where(k)} has {len(it)} fields but {where(0)} has {nfields}")
    return tuple(_field_array([it[f] for it in items], f, where) for f in range(nfields))


def default_collate(batch: Sequence[Any]) -> tuple[np.ndarray, ...]:
    """Stack items into one host array per field; the DataLoader moves them to its device as ember Tensors."""
    return collate_host(batch)


def _to_device(x: Any, device: Device) -> Any:
    if isinstance(x, np.ndarray):
        return ember.as_tensor(np.ascontiguousarray(x), dtype=dt.from_numpy_dtype(x.dtype), device=device)
    if isinstance(x, ember.Tensor):
        return x.to(device)
    if isinstance(x, tuple):
        return tuple(_to_device(v, device) for v in x)
    if isinstance(x, list):
        return [_to_device(v, device) for v in x]
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    return x


# --- the loader ------------------------------------------------------------------------------------------------

_DONE = object()


class DataLoader:
    """Batches a dataset into tuples of ember Tensors on ``device``.

    * ``shuffle``: epoch ``e`` uses ``numpy.random.default_rng(seed + e).permutation(n)``. ``seed=None`` takes one
      seed from ember's global generator (``ember.draw_seed()``) when the loader first needs it (its first shuffled
      epoch or ``state_dict()``), as torch's loader draws from its default generator: after
      ``ember.manual_seed(n)`` two runs shuffle identically, without it every run differs. The seed is kept in
      ``state_dict`` so resuming stays exact.
    * every complete pass advances ``epoch`` by one; ``set_epoch(e)`` picks the epoch explicitly.
    * ``num_workers > 0``: a thread pool indexes and collates up to ``prefetch`` batches per worker ahead of the
      consumer; batches still come out in order, identical to ``num_workers=0``. A worker's exception is
      re-raised in the consumer; breaking out of the loop cancels pending work and joins the threads.
    * ``pin_memory`` is accepted for PyTorch compatibility and ignored: ember's host backends already hold
      batches in host memory, and no backend exposes page-locked buffers.
    * ``collate_fn(list_of_items)`` may return arrays / Tensors (nested in tuples, lists, dicts); they are moved
      to ``device``.
    * ``sampler``: an iterable of dataset indices with a length (torch's ``sampler=``, e.g. ember-distributed's
      ``DistributedSampler`` for one rank's shard) replaces the loader's own order; it excludes ``shuffle``. The
      loader calls ``sampler.set_epoch(e)`` (when it has one) before reading epoch ``e``'s order, so the order
      stays a function of the epoch and resume stays exact.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, seed: int | None = None,
                 drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None,
                 num_workers: int = 0, prefetch: int = 2, pin_memory: bool = False, device: Any = None,
                 sampler: Any = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueRangeError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueRangeError(f"DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        if not isinstance(prefetch, (int, np.integer)) or prefetch < 1:
            raise ValueRangeError(f"DataLoader: prefetch must be an int >= 1, got {prefetch!r}")
        self.iterable = isinstance(dataset, IterableDataset) or (
            not hasattr(dataset, "__getitem__") and hasattr(dataset, "__iter__")
        )
        if self.iterable and shuffle:
            raise ValueRangeError(
                f"DataLoader: shuffle=True needs a map-style dataset; {type(dataset).__name__} is iterable "
                "(shuffle the stream itself)"
            )
        if not self.iterable and not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ValueRangeError(
                f"DataLoader: {type(dataset).__name__} is neither map-style (__len__ + __getitem__) nor iterable"
            )
        if sampler is not None:
            if shuffle:
                raise ValueRangeError("DataLoader: sampler option is mutually exclusive with shuffle (the sampler "
                                      "decides the order; shuffle inside it)")
            if self.iterable:
                raise ValueRangeError(f"DataLoader: sampler= needs a map-style dataset; {type(dataset).__name__} is "
                                      "iterable")
            if not (hasattr(sampler, "__iter__") and hasattr(sampler, "__len__")):
                raise ValueRangeError(f"DataLoader: sampler must be an iterable of indices with a length, got "
                                      f"{type(sampler).__name__}")
        self.sampler = sampler
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueRangeError(f"DataLoader: seed must be an int >= 0 or None, got {seed!r}")
        self._seed = None if seed is None else int(seed)
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn
        self.num_workers = int(num_workers)
        self.prefetch = int(prefetch)
        self.pin_memory = bool(pin_memory)
        self._device = None if device is None else as_device(device)
        self.epoch = 0
        self._position = 0  # batches handed out in the current epoch
        self._resume_from = 0  # where the next __iter__ starts (set by load_state_dict)

    @property
    def seed(self) -> int:
        """The shuffle seed: given, restored by ``load_state_dict``, or drawn from ember's global generator on
        first use (drawn late, so ``ember.manual_seed`` called after building the loader still decides it)."""
        if self._seed is None:
            self._seed = ember.draw_seed()
        return self._seed

    @seed.setter
    def seed(self, value: int) -> None:
        self._seed = int(value)

    @property
    def device(self) -> Device:
        """The device batches land on (ember's default device unless given)."""
        if self._device is None:
            self._device = default_device()  # resolved lazily so building a loader never loads plugins
        return self._device

    def __len__(self) -> int:
        if self.iterable and not hasattr(self.dataset, "__len__"):
            raise TypeError(f"DataLoader: the length of iterable dataset {type(self.dataset).__name__} is unknown")
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    # -- order and state --

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle order); the next iteration starts at its first batch."""
        self.epoch = int(epoch)
        self._position = self._resume_from = 0

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The dataset indices of an epoch, in the order they are served (map-style datasets)."""
        e = self.epoch if epoch is None else int(epoch)
        if self.sampler is not None:
            if hasattr(self.sampler, "set_epoch"):
                self.sampler.set_epoch(e)
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng(self.seed + e).permutation(n)
        return np.arange(n)

    def batch_indices(self, epoch: int | None = None) -> list[list[int]]:
        """The index lists of every batch of an epoch."""
        order = self.order(epoch).tolist()
        nb = len(self)
        return [order[b * self.batch_size:(b + 1) * self.batch_size] for b in range(nb)]

    def state_dict(self) -> dict[str, int]:
        """``{epoch, seed, position}``: position = batches already handed out in this epoch."""
        return {"epoch": int(self.epoch), "seed": int(self.seed), "position": int(self._position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields exactly the batches not yet handed out in ``state``'s epoch."""
        missing = {"epoch", "seed", "position"} - set(state)
        if missing:
            raise ValueRangeError(f"DataLoader.load_state_dict: state lacks {sorted(missing)}; got {sorted(state)}")
        pos = int(state["position"])
        if pos < 0 or (not self.iterable and pos > len(self)):
            raise ValueRangeError(f"DataLoader.load_state_dict: position {pos} outside 0..{len(self)} batches")
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])
        self._position = self._resume_from = pos

    # -- iteration --

    def _collate(self, items: list[Any], indices: Sequence[int] | None) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(items)
        return collate_host(items, indices)

    def _make_batch(self, indices: list[int]) -> Any:
        return self._collate([self.dataset[i] for i in indices], indices)

    def check(self) -> Any:
        """Collate the epoch's first batch now (and move it to the device), so bad data fails before training."""
        if self.iterable:
            items = []
            for item in self.dataset:
                items.append(item)
                if len(items) == self.batch_size:
                    break
            if not items:
                raise ValueRangeError(f"DataLoader.check: {type(self.dataset).__name__} yields no items")
            return _to_device(self._collate(items, None), self.device)
        if len(self) == 0:
            raise ValueRangeError(
                f"DataLoader.check: no batches: {len(self.dataset)} items, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last}"
            )
        return _to_device(self._make_batch(self.batch_indices()[0]), self.device)

    def __iter__(self) -> Iterator[Any]:
        start, self._resume_from = self._resume_from, 0
        self._position = start
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        device = self.device
        host = self._host_iterable(start) if self.iterable else self._host_mapped(start)
        finished = False
        try:
            for batch in host:
                out = _to_device(batch, device)
                self._position += 1
                yield out
            finished = True
        finally:
            close = getattr(host, "close", None)
            if close is not None:
                close()
        if finished:
            self.epoch += 1
            self._position = 0

    def _host_mapped(self, start: int) -> Iterator[Any]:
        batches = self.batch_indices()[start:]
        if self.num_workers == 0:
            for idx in batches:
                yield self._make_batch(idx)
            return
        window = self.num_workers * self.prefetch
        pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="ember-data")
        pending: list[tuple[Future[Any], list[int]]] = []
        try:
            nxt = 0
            while nxt < len(batches) or pending:
                while nxt < len(batches) and len(pending) < window:
                    pending.append((pool.submit(self._make_batch, batches[nxt]), batches[nxt]))
                    nxt += 1
                fut, idx = pending.pop(0)
                try:
                    batch = fut.result()
                except Exception as exc:
                    exc.add_note(f"raised in a DataLoader worker preparing the batch of dataset indices {idx[:8]}...")
                    raise
                yield batch
        finally:
            for f, _ in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _iter_items_batched(self, start: int, stop: threading.Event | None = None) -> Iterator[Any]:
        it = iter(self.dataset)
        skipped = 0
        items: list[Any] = []
        for item in it:
            if stop is not None and stop.is_set():
                return
            items.append(item)
            if len(items) == self.batch_size:
                if skipped < start:  # resume: skip batches already handed out, without collating them
                    skipped += 1
                else:
                    yield self._collate(items, None)
                items = []
        if items and not self.drop_last and skipped >= start:
            yield self._collate(items, None)

    def _host_iterable(self, start: int) -> Iterator[Any]:
        if self.num_workers == 0:
            yield from self._iter_items_batched(start)
            return
        # an iterator cannot be split between threads without sharding, so one producer thread reads and
        # collates ahead of the consumer into a bounded queue
        q: queue.Queue[Any] = queue.Queue(maxsize=self.num_workers * self.prefetch)
        stop = threading.Event()

        def put(x: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(x, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for b in self._iter_items_batched(start, stop):
                    if not put(("ok", b)):
                        return
                put(("done", _DONE))
            except BaseException as exc:  # handed to the consumer, which re-raises it
                put(("err", exc))

        th = threading.Thread(target=produce, name="ember-data-producer", daemon=True)
        th.start()
        try:
            while True:
                kind, val = q.get()
                if kind == "done":
                    return
                if kind == "err":
                    if isinstance(val, Exception):
                        val.add_note("raised in a DataLoader worker thread")
                    raise val
                yield val
        finally:
            stop.set()
            th.join()

    def __repr__(self) -> str:
        seed = "<drawn on first use>" if self._seed is None else self._seed  # repr must not draw it
        sampler = "" if self.sampler is None else f", sampler={type(self.sampler).__name__}"
        return (f"DataLoader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"seed={seed}, drop_last={self.drop_last}, num_workers={self.num_workers}, epoch={self.epoch}"
                f"{sampler})")


__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "Subset",
    "TransformDataset",
    "random_split",
    "default_collate",
    "collate_host",
    "DataLoader",
]
