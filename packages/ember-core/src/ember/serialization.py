"""``ember.save`` / ``ember.load``: PyTorch's ``torch.save(obj, f)`` / ``torch.load(f, map_location=...)`` for the
state real scripts save, stored as safetensors (never pickle, so loading a file runs no code).

>>> ember.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3}, "ckpt.safetensors")  # doctest: +SKIP
>>> ckpt = ember.load("ckpt.safetensors", map_location="cpu")                                  # doctest: +SKIP

What can be saved: tensors, numpy arrays, Python numbers, strings, bools, None, and dicts (any hashable keys of
those types), lists and tuples nesting them; that is, module and optimizer state dicts and the checkpoints that
wrap them. Modules, optimizers and other objects are refused with a typed error naming where they sit in the
structure: save their ``state_dict()``.

The file format is ``ember.records``': a flat ``dict[str, Tensor]`` (what ``Module.state_dict()`` returns) is
stored as plain safetensors entries under its own keys, so any safetensors reader opens it; anything else keeps
its tensors under flattened keys and its structure (keys, list/tuple/dict types, numbers, tensor references) as
JSON in the header metadata. ``records.load`` reads what ``ember.save`` writes and the other way round.

Tensors are stored as their values (dtype, including bfloat16, and shape; views and non-contiguous tensors as the
values they show). A tensor that appears several times in the structure (tied weights: the same tensor object,
or tensors showing the same host memory with the same shape, strides and dtype, as ``state_dict()``'s detached
entries of one parameter do) is stored once and comes back as one shared tensor in every place; on a backend whose
memory is not host memory only the same tensor object is recognised, and other tied entries come back as equal
copies. Distinct views of one tensor (``w`` and ``w.T``) are stored as separate values. ``requires_grad`` is
not stored: loaded tensors are plain values, like the detached tensors ``state_dict()`` returns.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np

from . import dtypes as dt
from . import records as _rec
from .device import Device
from .errors import DeviceError, DTypeError, UnsupportedError, ValueRangeError
from .records import CorruptRecordError
from .tensor import Tensor

__all__ = ["save", "load"]

_MODULE_HINT = ("ember.save stores state, not objects: save model.state_dict() and restore it with "
                "model.load_state_dict(ember.load(f))")
_STORABLE = ("ember.save stores tensors, numpy arrays, numbers, strings, bools, None and dicts/lists/tuples of "
             "them (a state dict); objects are never pickled")


def _where(root: str, keys: list[Any]) -> str:
    """``state['layers'][2]['w']``: the place of a value, as the user would index it."""
    return root + "".join(f"[{k!r}]" for k in keys)


class _Encoder(_rec._Encoder):
    """records' encoder with PyTorch-style key paths in its errors and shared tensors stored once."""

    def __init__(self) -> None:
        super().__init__(None)
        self.shared = False  # whether some tensor was met twice
        self._by_id: dict[int, str] = {}  # id(tensor) -> its safetensors key; the structure keeps tensors alive
        # (address, shape, strides, dtype) of a tensor's host array -> its key: state_dict() returns a new
        # detached Tensor per entry, so tied weights are found by their memory, not by object identity
        self._by_memory: dict[tuple[Any, ...], str] = {}
        self._alive: list[np.ndarray] = []  # host copies stay alive so no address is reused while encoding

    def _tensor(self, t: Tensor, keys: list[Any]) -> str:
        key = self._by_id.get(id(t))
        if key is not None:
            self.shared = True
            return key
        a = t.detach().numpy()
        self._alive.append(a)
        mem = (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)
        key = self._by_memory.get(mem) if a.size else None
        if key is None:
            key = self._key([str(k) for k in keys])
            self.arrays[key] = _rec._dense(a)
            self._by_memory[mem] = key
        else:
            self.shared = True
        self._by_id[id(t)] = key
        return key

    def encode_at(self, obj: Any, keys: list[Any]) -> Any:
        where = _where("obj", keys)
        if len(keys) > _rec.MAX_DEPTH:
            raise ValueRangeError(f"save: {_where('obj', keys[:8])}... is nested deeper than the "
                                  f"{_rec.MAX_DEPTH} levels a file holds")
        if isinstance(obj, Tensor):
            return {_rec._T_TENSOR: self._tensor(obj, keys)}
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                raise DTypeError(f"save: {where} is a numpy array of dtype object; {_STORABLE}")
            key = self._key([str(k) for k in keys])
            self.arrays[key] = _rec._dense(obj)
            return {_rec._T_ARRAY: key}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, np.generic) and obj.dtype != object:
            return obj.item()
        if isinstance(obj, Mapping):
            items = list(obj.items())
            for k, _ in items:
                self._check_key(k, where)
            if all(isinstance(k, str) and k not in _rec._TAGS for k, _ in items):
                return {k: self.encode_at(v, [*keys, k]) for k, v in items}
            return {_rec._T_DICT: [[self.encode_at(k, keys), self.encode_at(v, [*keys, k])] for k, v in items]}
        if isinstance(obj, list):
            return [self.encode_at(v, [*keys, i]) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return {_rec._T_TUPLE: [self.encode_at(v, [*keys, i]) for i, v in enumerate(obj)]}
        raise DTypeError(f"save: {where} is {_describe(obj)}")

    @staticmethod
    def _check_key(k: Any, where: str) -> None:
        ok = k is None or isinstance(k, (bool, int, float, str)) or (
            isinstance(k, tuple) and all(x is None or isinstance(x, (bool, int, float, str)) for x in k))
        if not ok:
            raise DTypeError(f"save: {where} has a key {k!r:.60} of type {type(k).__name__}; dict keys must be "
                             "strings, numbers, bools, None or tuples of them")


def _describe(obj: Any) -> str:
    from .nn.module import Module

    if isinstance(obj, Module):
        return f"an nn.Module ({type(obj).__name__}); {_MODULE_HINT}"
    if callable(getattr(obj, "state_dict", None)):
        return (f"a {type(obj).__name__} object; save its state_dict() instead (restore it with "
                f"load_state_dict(...))")
    return f"a {type(obj).__name__}; {_STORABLE}"


def _file_name(f: Any) -> str:
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def save(obj: Any, f: str | os.PathLike[str] | BinaryIO) -> None:
    """Save a state dict (or a nested dict/list/tuple of tensors, numbers, strings, bools and None) to ``f``,
    like ``torch.save``: a path (written atomically, see ``ember.records``) or a binary file object opened for
    writing (``open(path, "wb")``, ``io.BytesIO()``; written at its current position).

    The format is safetensors with the structure in its JSON metadata; nothing is pickled. An ``nn.Module``,
    an optimizer or any other object raises DTypeError naming where it sits: save its ``state_dict()``.
    """
    op = "save"
    if _is_path(f):
        path = _rec._fspath(f, op)
    elif isinstance(f, io.TextIOBase):
        raise DTypeError(f"save: {_file_name(f)!r} is open in text mode; open it in binary mode ('wb')")
    elif not callable(getattr(f, "write", None)):
        raise DTypeError(f"save: f must be a path (str or os.PathLike) or a binary file object opened for writing, "
                         f"got {type(f).__name__}")
    if not isinstance(obj, (Mapping, list, tuple, Tensor, np.ndarray)):
        raise DTypeError(f"save: obj is {_describe(obj)}")
    arrays, meta = _encode(obj)
    if _is_path(f):
        _rec._atomic_write(path, lambda out: _rec._write_safetensors(out, arrays, meta), op)
    else:
        _rec._write_safetensors(f, arrays, meta)  # type: ignore[arg-type]


def _encode(obj: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The safetensors arrays and header metadata for ``obj`` (records' format; checked before any write)."""
    meta: dict[str, str] = {"format": "pt", _rec._VERSION: _rec.FORMAT_VERSION}
    enc = _Encoder()
    structure = json.dumps(enc.encode_at(obj, []))
    arrays = enc.arrays
    if _rec._is_flat(obj) and not enc.shared and list(arrays) == list(obj):
        # a plain state dict without shared tensors: its own keys, readable by every safetensors reader
        meta[_rec._KIND] = "state_dict"
        meta[_rec._KEYS] = json.dumps(list(arrays))  # safetensors sorts its header; keep the module's order
    else:
        if _rec._json_depth(structure) > _rec.MAX_DEPTH:  # tagged tuples/dicts add levels
            raise ValueRangeError(f"save: obj is nested deeper than the {_rec.MAX_DEPTH} levels a file holds")
        meta[_rec._KIND] = "nested"
        meta[_rec._STRUCTURE] = structure
    for k, a in arrays.items():
        if a.dtype.name not in _rec._ST_DTYPES:
            raise DTypeError(f"save: tensor {k!r} has dtype {a.dtype}, which safetensors cannot store")
    return arrays, meta


# -- load --------------------------------------------------------------------------------------------------------
def _device(map_location: Any) -> Device | None:
    """The device ``map_location`` names (None: the default device, as ``ember.tensor`` uses)."""
    if map_location is None or isinstance(map_location, Device):
        return map_location
    if isinstance(map_location, str):
        return Device.parse(map_location)
    if isinstance(map_location, Mapping):
        # ember files do not record where tensors lived; {"cuda:0": "cpu"}-style maps with one target are
        # what ported scripts pass, and mean "put everything there"
        targets = {str(v) if isinstance(v, Device) else v for v in map_location.values()}
        if not targets:
            return None
        if len(targets) == 1:
            (target,) = targets
            return _device(Device.parse(target) if isinstance(target, str) else target)
        raise UnsupportedError(f"load: map_location={dict(map_location)!r} maps to several devices; ember files do "
                               "not record each tensor's device: pass one device (e.g. map_location='cpu')")
    if callable(map_location):
        raise UnsupportedError("load: map_location as a function is not supported (ember files store values, not "
                               "storages with locations); pass a device or a device string, e.g. 'cpu'")
    raise DeviceError(f"load: map_location must be None, a Device, a device string or a dict, got "
                      f"{type(map_location).__name__}")


_TORCH_HINT = ("it is a PyTorch (torch.save) pickle file; ember.load never unpickles (loading would run code): "
               "read its state dict with ember.records.import_torch_weights(path), or save it from ember")


def _is_torch_file(head: bytes, size: int) -> bool:
    """Whether a file starting with ``head`` is a torch.save zip archive ("PK") or legacy pickle (0x80) rather than
    safetensors (whose first 8 bytes, the header length, may begin with the same bytes: check the header first)."""
    n = int.from_bytes(head[:8], "little")
    if len(head) == 9 and head[8:9] == b"{" and 8 + n <= size:
        return False
    return head[:2] == b"PK" or head[:1] == b"\x80"


def _read_path(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    _rec._check_exists(path, "load")
    with open(path, "rb") as fh:
        head = fh.read(9)
    if _is_torch_file(head, os.path.getsize(path)):
        raise CorruptRecordError(f"load: {path!r} is not an ember file: {_TORCH_HINT}")
    return _rec._read_safetensors(path, "load")


def _read_bytes(data: bytes, name: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Arrays and metadata of a safetensors image held in memory (a file object's contents)."""
    from safetensors import deserialize

    if _is_torch_file(data[:9], len(data)):
        raise CorruptRecordError(f"load: {name!r} is not an ember file: {_TORCH_HINT}")
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if n < 2 or 8 + n > len(data) or data[8:9] != b"{":
        raise CorruptRecordError(f"load: {name!r} is not a safetensors file ({len(data)} bytes; its header is "
                                 "missing or truncated)")
    try:
        header = _rec._parse_json(data[8:8 + n].decode("utf-8"), "header", name, "load")
        meta = header.get("__metadata__") or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError("__metadata__ must map strings to strings")
        arrays = {k: _array(v) for k, v in deserialize(data)}  # validates offsets and sizes against the header
    except CorruptRecordError:
        raise
    except Exception as e:  # safetensors raises its own error types; json/unicode errors are ValueErrors
        raise CorruptRecordError(f"load: {name!r} is not a readable safetensors file ({type(e).__name__}: {e})"
                                 ) from e
    return arrays, meta


_NP_OF_CODE = {code: name for name, code in _rec._ST_DTYPES.items()}


def _array(entry: Mapping[str, Any]) -> np.ndarray:
    """A numpy array from one ``safetensors.deserialize`` entry (its numpy reader has no bfloat16)."""
    name = _NP_OF_CODE.get(entry["dtype"])
    if name is None:
        raise ValueError(f"tensor dtype {entry['dtype']!r} has no ember dtype")
    dtype = dt.bfloat16.numpy if name == "bfloat16" else np.dtype(name).newbyteorder("<")
    return np.frombuffer(entry["data"], dtype=dtype).reshape(entry["shape"])


def load(f: str | os.PathLike[str] | BinaryIO, map_location: Any = None, *, weights_only: bool | None = None) -> Any:
    """Load what :func:`save` wrote (or any safetensors file), like ``torch.load``: from a path or a binary file
    object (read from its current position to the end).

    ``map_location`` places every tensor: None (the default device, as ``ember.tensor``), a ``Device``, a device
    string (``"cpu"`` is the host device, ``"flex+autodiff"``), or a dict whose values all name one device (what
    ``{"cuda:0": "cpu"}`` in PyTorch code means). A function, or a dict mapping to several devices, raises
    UnsupportedError. ``weights_only`` is accepted for PyTorch compatibility; ember files only ever hold data.
    A file that is not a safetensors file (random bytes, a ``torch.save`` pickle) raises CorruptRecordError
    naming it. A tensor saved in several places comes back as one shared tensor.
    """
    if weights_only is not None and not isinstance(weights_only, bool):
        raise DTypeError(f"load: weights_only must be a bool or None, got {type(weights_only).__name__}")
    device = _device(map_location)
    if _is_path(f):
        name = _rec._fspath(f, "load")
        arrays, meta = _read_path(name)
    elif callable(getattr(f, "read", None)):
        name = _file_name(f)
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DTypeError(f"load: {name!r} is open in text mode; open it in binary mode ('rb')")
        arrays, meta = _read_bytes(bytes(data), name)
    else:
        raise DTypeError(f"load: f must be a path (str or os.PathLike) or a binary file object opened for reading, "
                         f"got {type(f).__name__}")
    return _rec._restore(arrays, meta, _shared_maker(_rec._maker(device, None, "load")), name, "load")


def _shared_maker(make: Callable[[np.ndarray], Tensor]) -> Callable[[np.ndarray], Tensor]:
    # one stored array referenced from several places (a shared tensor) becomes one tensor; the arrays mapping
    # keeps every array alive while loading, so ids are not reused
    made: dict[int, Tensor] = {}

    def make_once(a: np.ndarray) -> Tensor:
        t = made.get(id(a))
        if t is None:
            t = made[id(a)] = make(a)
        return t

    return make_once
