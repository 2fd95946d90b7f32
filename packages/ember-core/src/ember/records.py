"""Records: save and load model and optimizer state (safetensors by default), import PyTorch weights.

>>> from ember import records
>>> records.save(model, "model.safetensors", dtype="bfloat16")        # doctest: +SKIP
>>> report = records.load_into(model, "model.safetensors", strict=False)  # doctest: +SKIP
>>> state = records.import_torch_weights("resnet.pth", key_map=[(r"^module\\.", "")])  # doctest: +SKIP

A flat state dict (``dict[str, Tensor]``, what ``Module.state_dict()`` returns) is stored as plain safetensors
entries under its own keys, so other safetensors readers (PyTorch, numpy) open it directly. Any other
state_dict-like structure (an optimizer's nested dicts/lists of tensors and numbers) stores its tensors under
flattened keys and its non-tensor structure as JSON in the safetensors metadata.

Every write is atomic: the data goes to a temporary file in the target's directory, is flushed and fsync'ed,
then ``os.replace``'d onto the target and the directory is fsync'ed. A crash or a kill during a save leaves the
previous file untouched; a temporary file left by a killed process (``.<name>.<pid>.<token>.ember-tmp``) is
removed by the next save to the same target.

A record's structure may nest at most ``MAX_DEPTH`` levels: ``save`` refuses a deeper one, and ``load`` reports a
file claiming one as a ``CorruptRecordError`` instead of exhausting the interpreter's stack.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from . import dtypes as dt
from .dtypes import DType
from .errors import DTypeError, EmberError, ValueRangeError
from .tensor import Tensor

__all__ = [
    "save",
    "load",
    "load_into",
    "import_torch_weights",
    "remap_keys",
    "read_metadata",
    "LoadReport",
    "RecordError",
    "RecordNotFoundError",
    "CorruptRecordError",
    "IncompatibleStateError",
    "MissingDependencyError",
    "MAX_DEPTH",
]

FORMAT_VERSION = "1"
_TMP_SUFFIX = ".ember-tmp"
# metadata keys written by ember; user metadata may not use the prefix
_KIND, _VERSION, _KEYS, _STRUCTURE = "ember.kind", "ember.version", "ember.keys", "ember.structure"
_RESERVED_PREFIX = "ember."
# JSON tags of the nested-structure encoding (a dict using one of them as a key is stored in the tagged form)
_T_TENSOR, _T_ARRAY, _T_TUPLE, _T_DICT = "__tensor__", "__ndarray__", "__tuple__", "__dict__"
_TAGS = frozenset((_T_TENSOR, _T_ARRAY, _T_TUPLE, _T_DICT))
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_SAVE_DTYPES = ("float16", "bfloat16", "float32", "float64")
# deepest nesting of dicts/lists a record's structure may have: an optimizer's state is ~6 levels deep; the bound
# keeps a hostile file from exhausting the interpreter's stack (json and the decoder both recurse)
MAX_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


# -- errors ------------------------------------------------------------------------------------------------------
class RecordError(EmberError):
    """A record (checkpoint file) could not be written, read or applied."""


class RecordNotFoundError(RecordError, FileNotFoundError):
    """The record file (or the directory to save into) does not exist."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(errno.ENOENT, message, path)


class CorruptRecordError(RecordError, ValueError):
    """The file exists but is not a readable record (truncated, not safetensors, bad ember metadata)."""


class IncompatibleStateError(RecordError, ValueError):
    """Strict loading found missing, unexpected or shape-mismatched keys; ``.report`` holds all of them."""

    def __init__(self, message: str, report: LoadReport) -> None:
        super().__init__(message)
        self.report = report


class MissingDependencyError(RecordError, ImportError):
    """An optional package needed for this file (torch for ``.pt``/``.pth``) is not installed."""


class LoadReport(NamedTuple):
    """What ``load_into`` could not match. ``mismatched_keys`` holds ``(key, checkpoint_shape, model_shape)``."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]]

    @property
    def clean(self) -> bool:
        """True when every key matched in name and shape."""
        return not (self.missing_keys or self.unexpected_keys or self.mismatched_keys)

    def describe(self) -> str:
        parts = []
        if self.missing_keys:
            parts.append(f"missing keys {self.missing_keys}")
        if self.unexpected_keys:
            parts.append(f"unexpected keys {self.unexpected_keys}")
        if self.mismatched_keys:
            parts.append("shape mismatch for " + ", ".join(
                f"{k} (checkpoint {list(a)}, model {list(b)})" for k, a, b in self.mismatched_keys))
        return "; ".join(parts) if parts else "all keys matched"


# -- helpers -----------------------------------------------------------------------------------------------------
def _fspath(path: Any, op: str) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise DTypeError(f"{op}: path must be a str or os.PathLike, got {type(path).__name__}") from None


def _save_dtype(dtype: Any, op: str) -> DType | None:
    if dtype is None:
        return None
    d = dt.as_dtype(dtype)
    if not d.is_floating_point:
        raise DTypeError(f"{op}: dtype= converts floating tensors and must be one of {list(_SAVE_DTYPES)}, got {d}")
    return d


def _to_host(t: Tensor, d: DType | None) -> np.ndarray:
    a = t.detach().numpy()
    if d is not None and t._dtype.is_floating_point and t._dtype is not d:
        a = a.astype(d.numpy)
    return _dense(a)


def _dense(a: np.ndarray) -> np.ndarray:
    # the writer copies raw memory: views must be made C-contiguous little-endian first (np.ascontiguousarray
    # would turn a 0-d array into a 1-d one)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _require_ml_dtypes() -> None:
    # registers numpy's 'bfloat16' dtype, which safetensors' numpy reader looks up by name
    import ml_dtypes  # noqa: F401


def _check_exists(path: str, op: str) -> None:
    if not os.path.exists(path):
        raise RecordNotFoundError(f"{op}: no such file", path)
    if os.path.isdir(path):
        raise RecordError(f"{op}: {path!r} is a directory, not a record file")


# -- nested structure encoding -----------------------------------------------------------------------------------
class _Encoder:
    """Turns a state_dict-like structure into JSON, collecting its tensors under flattened dotted keys."""

    def __init__(self, d: DType | None) -> None:
        self.dtype = d
        self.arrays: dict[str, np.ndarray] = {}

    def _key(self, path: list[str]) -> str:
        key = ".".join(path) or "_"
        base, n = key, 1
        while key in self.arrays:  # a key containing '.' can collide with a nested path
            key, n = f"{base}~{n}", n + 1
        return key

    def encode(self, obj: Any, path: list[str]) -> Any:
        if len(path) > MAX_DEPTH:
            raise ValueRangeError(f"save: the structure is nested deeper than {MAX_DEPTH} levels at "
                                  f"{'.'.join(path[:8])}...; records hold at most {MAX_DEPTH} levels")
        if isinstance(obj, Tensor):
            key = self._key(path)
            self.arrays[key] = _to_host(obj, self.dtype)
            return {_T_TENSOR: key}
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                raise DTypeError(f"save: numpy array of dtype object at {'.'.join(path) or '<root>'} is not storable")
            key = self._key(path)
            self.arrays[key] = _dense(obj)
            return {_T_ARRAY: key}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, DType):
            return obj.name
        if isinstance(obj, Mapping):
            items = list(obj.items())
            if all(isinstance(k, str) and k not in _TAGS for k, _ in items):
                return {k: self.encode(v, [*path, k]) for k, v in items}
            return {_T_DICT: [[self.encode(k, [*path, "key"]), self.encode(v, [*path, str(k)])] for k, v in items]}
        if isinstance(obj, list):
            return [self.encode(v, [*path, str(i)]) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return {_T_TUPLE: [self.encode(v, [*path, str(i)]) for i, v in enumerate(obj)]}
        raise DTypeError(
            f"save: cannot store a {type(obj).__name__} at {'.'.join(path) or '<root>'}; records hold tensors, "
            "numpy arrays, numbers, strings, None and dicts/lists/tuples of them"
        )


def _json_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, found without parsing it (so without recursion)."""
    b = np.frombuffer(_JSON_STRING.sub("", text).encode(), dtype=np.uint8)
    step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(b, (ord("]"), ord("}")))
    return int(np.cumsum(step).max(initial=0))


def _parse_json(text: str, what: str, path: str, op: str) -> Any:
    """json.loads with the nesting bounded by MAX_DEPTH (a deeper text is a CorruptRecordError naming the file)."""
    depth = _json_depth(text)
    if depth > MAX_DEPTH:
        raise CorruptRecordError(f"{op}: {path!r}: its {what} metadata is nested {depth} levels deep, more than the "
                                 f"{MAX_DEPTH} a record may hold (a damaged or hostile file)")
    return json.loads(text)


def _decode(obj: Any, arrays: Mapping[str, np.ndarray], make: Callable[[np.ndarray], Tensor], path: str,
            depth: int = 0) -> Any:
    if depth > MAX_DEPTH:  # json nesting is bounded already; tagged forms must not add levels past it either
        raise CorruptRecordError(f"load: {path!r}: its structure is nested deeper than {MAX_DEPTH} levels")
    d = depth + 1
    if isinstance(obj, list):
        return [_decode(v, arrays, make, path, d) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, val), = obj.items()
        if tag in (_T_TENSOR, _T_ARRAY):
            if not isinstance(val, str) or val not in arrays:
                raise CorruptRecordError(f"load: {path!r} names tensor {val!r} in its structure but does not hold it")
            return make(arrays[val]) if tag == _T_TENSOR else np.array(arrays[val])
        if tag == _T_TUPLE:
            return tuple(_decode(v, arrays, make, path, d) for v in val)
        if tag == _T_DICT:
            return {_hashable(_decode(k, arrays, make, path, d)): _decode(v, arrays, make, path, d) for k, v in val}
    return {k: _decode(v, arrays, make, path, d) for k, v in obj.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, (list, tuple)) else k


def _state_of(obj: Any) -> Any:
    from .nn.module import Module

    if isinstance(obj, Module):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        return obj
    sd = getattr(obj, "state_dict", None)
    if callable(sd):  # an optimizer, a scheduler, anything with PyTorch's state_dict protocol
        return sd()
    raise DTypeError(
        f"save: expected an nn.Module, a state dict or an object with state_dict(), got {type(obj).__name__}"
    )


def _is_flat(state: Any) -> bool:
    return isinstance(state, Mapping) and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items())


# -- atomic write ------------------------------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but belongs to someone else
    return True


def _temp_pattern(base: str) -> re.Pattern[str]:
    return re.compile(re.escape(f".{base}.") + r"(\d+)\.[0-9a-f]{16}" + re.escape(_TMP_SUFFIX))


def _clean_stale_temps(directory: str, base: str) -> None:
    """Remove temporary files that killed saves to this target left behind (their writer no longer runs)."""
    pat = _temp_pattern(base)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for e in entries:
        m = pat.fullmatch(e.name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(e.path)
            except OSError:
                pass  # another process cleaned it first, or we may not; the next save retries


def _fsync_dir(directory: str) -> None:
    # makes the rename itself durable; directories cannot be opened for fsync on Windows
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str, write: Callable[[BinaryIO], None], op: str) -> None:
    """Write through ``write(file)`` into a temporary file, fsync it and rename it onto path."""
    target = os.path.realpath(path)  # write through a symlink, as open() would, instead of replacing the link
    directory, base = os.path.split(target)
    if not os.path.isdir(directory):
        raise RecordNotFoundError(f"{op}: directory {directory!r} does not exist", path)
    if os.path.isdir(target):
        raise RecordError(f"{op}: {path!r} is a directory, not a file")
    _clean_stale_temps(directory, base)
    tmp = os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(8)}{_TMP_SUFFIX}")
    # O_EXCL: never reuse a file someone else may be writing; mode 0o666 lets the umask decide, like open()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))  # an overwrite keeps the file's permissions
            except FileNotFoundError:
                pass
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


# -- safetensors writer ------------------------------------------------------------------------------------------
# safetensors' own save_file writes to a temporary file of its own naming and renames it without fsync, and
# its in-memory save() doubles peak memory; the format is simple enough to stream into our temporary file.
_ST_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16", "uint32": "U32", "uint64": "U64",
}


def _write_safetensors(f: BinaryIO, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    # largest itemsize first (stable), as safetensors does: every tensor then starts aligned to its element size
    keys = sorted(arrays, key=lambda k: -arrays[k].dtype.itemsize)
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for k in keys:
        a = arrays[k]
        code = _ST_DTYPES.get(a.dtype.name)
        if code is None:
            raise DTypeError(f"save: tensor {k!r} has dtype {a.dtype}, which safetensors cannot store")
        header[k] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # tensor data starts 8-byte aligned
    f.write(len(raw).to_bytes(8, "little"))
    f.write(raw)
    for k in keys:
        a = arrays[k]
        if a.nbytes:
            f.write(memoryview(a.reshape(-1).view(np.uint8)))


# -- save / load -------------------------------------------------------------------------------------------------
def save(obj: Any, path: str | os.PathLike[str], *, dtype: Any = None, metadata: Mapping[str, str] | None = None
         ) -> None:
    """Save a Module's state_dict, a state dict, or an optimizer's (nested) state to a safetensors file, atomically.

    ``dtype`` (float16/bfloat16/float32/float64) converts floating tensors on the way out; integer and bool
    tensors keep theirs. ``metadata`` adds string entries to the file header (read back with read_metadata).
    """
    op = "save"
    p = _fspath(path, op)
    d = _save_dtype(dtype, op)
    meta: dict[str, str] = {"format": "pt"}  # tensor layout follows PyTorch's, so PyTorch-side readers accept it
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise DTypeError(f"save: metadata must be a dict of str to str, got {type(metadata).__name__}")
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise DTypeError(f"save: metadata entries must be str to str, got {k!r}: {type(v).__name__}")
            if k.startswith(_RESERVED_PREFIX):
                raise ValueRangeError(f"save: metadata key {k!r} uses the reserved prefix {_RESERVED_PREFIX!r}")
    state = _state_of(obj)
    if _is_flat(state):
        arrays = {k: _to_host(v, d) for k, v in state.items()}
        meta[_KIND] = "state_dict"
        meta[_KEYS] = json.dumps(list(arrays))  # safetensors sorts its header; keep the module's order
    else:
        enc = _Encoder(d)
        meta[_STRUCTURE] = json.dumps(enc.encode(state, []))
        if _json_depth(meta[_STRUCTURE]) > MAX_DEPTH:  # tagged tuples/dicts add levels: refuse what load would
            raise ValueRangeError(f"save: the structure is nested deeper than the {MAX_DEPTH} levels a record holds")
        meta[_KIND] = "nested"
        arrays = enc.arrays
    meta[_VERSION] = FORMAT_VERSION
    if metadata:
        meta.update(metadata)
    for k, a in arrays.items():  # fail before touching the disk
        if a.dtype.name not in _ST_DTYPES:
            raise DTypeError(f"save: tensor {k!r} has dtype {a.dtype}, which safetensors cannot store")
    _atomic_write(p, lambda f: _write_safetensors(f, arrays, meta), op)


def _read_safetensors(path: str, op: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import safe_open

    _check_exists(path, op)
    _require_ml_dtypes()
    try:
        with safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not a Mapping
    except Exception as e:  # safetensors raises its own error types (and TypeError for unknown dtypes)
        raise CorruptRecordError(f"{op}: {path!r} is not a readable safetensors file ({type(e).__name__}: {e})"
                                 ) from e
    return arrays, meta


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The string metadata stored in a safetensors file's header (user entries and ember's own ``ember.*``)."""
    from safetensors import safe_open

    p = _fspath(path, "read_metadata")
    _check_exists(p, "read_metadata")
    try:
        with safe_open(p, framework="np") as f:
            return dict(f.metadata() or {})
    except Exception as e:
        raise CorruptRecordError(f"read_metadata: {p!r} is not a readable safetensors file ({e})") from e


def _maker(device: Any, dtype: Any, op: str) -> Callable[[np.ndarray], Tensor]:
    from .ops.creation import tensor

    d = None if dtype is None else dt.as_dtype(dtype)
    if d is not None and not d.is_floating_point:
        raise DTypeError(f"{op}: dtype= converts floating tensors and must be a floating dtype, got {d}")

    def make(a: np.ndarray) -> Tensor:
        src = dt.from_numpy_dtype(a.dtype)
        if d is not None and src.is_floating_point:
            src = d
        return tensor(a, dtype=src, device=device)  # tensor() copies, so nothing points into the file

    return make


def load(path: str | os.PathLike[str], *, device: Any = None, dtype: Any = None) -> Any:
    """Load a record: a state dict of ember tensors (in saved order), or the nested structure that was saved.

    ``device`` places the tensors (default device when None); ``dtype`` converts floating tensors. Works on any
    safetensors file, ember-written or not.
    """
    op = "load"
    p = _fspath(path, op)
    make = _maker(device, dtype, op)
    arrays, meta = _read_safetensors(p, op)
    return _restore(arrays, meta, make, p, op)


def _restore(arrays: Mapping[str, np.ndarray], meta: Mapping[str, str], make: Callable[[np.ndarray], Tensor],
             p: str, op: str) -> Any:
    """The state a record's arrays and header metadata encode (shared by ``load`` and ``ember.load``)."""
    try:
        if meta.get(_KIND) == "nested":
            return _decode(_parse_json(meta[_STRUCTURE], _STRUCTURE, p, op), arrays, make, p)
        order = _parse_json(meta[_KEYS], _KEYS, p, op) if _KEYS in meta else list(arrays)
        if sorted(order) != sorted(arrays):
            raise CorruptRecordError(f"{op}: {p!r}: its key list does not match the tensors it holds")
    except (KeyError, ValueError, TypeError) as e:
        if isinstance(e, EmberError):
            raise
        raise CorruptRecordError(f"{op}: {p!r} has unreadable ember metadata ({type(e).__name__}: {e})") from e
    try:
        return OrderedDict((k, make(arrays[k])) for k in order)
    except DTypeError as e:
        raise DTypeError(f"{op}: {p!r}: {e}") from e


# -- key remapping -----------------------------------------------------------------------------------------------
KeyMap = Iterable[tuple[str, str | None]] | Mapping[str, str | None]


def _compile_rules(key_map: Any, op: str) -> list[tuple[re.Pattern[str], str | None]]:
    items = key_map.items() if isinstance(key_map, Mapping) else key_map
    if isinstance(items, (str, bytes)):
        raise DTypeError(f"{op}: key_map must be a list of (regex, replacement) pairs, got a string")
    rules = []
    try:
        pairs = list(items)
    except TypeError:
        raise DTypeError(f"{op}: key_map must be a list of (regex, replacement) pairs, got "
                         f"{type(key_map).__name__}") from None
    for rule in pairs:
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
                and (rule[1] is None or isinstance(rule[1], str))):
            raise DTypeError(f"{op}: each key_map rule must be (regex: str, replacement: str | None), got {rule!r}")
        try:
            rules.append((re.compile(rule[0]), rule[1]))
        except re.error as e:
            raise ValueRangeError(f"{op}: key_map rule {rule[0]!r} is not a valid regular expression: {e}") from None
    return rules


def remap_keys(state: Mapping[str, Any], key_map: KeyMap, *, op: str = "remap_keys") -> OrderedDict[str, Any]:
    """Apply (regex, replacement) rules in order to each key with ``re.sub``. A rule whose replacement is None
    drops the keys it matches; a key rewritten to '' is dropped. Two keys mapped to one raise ValueRangeError."""
    rules = _compile_rules(key_map, op)
    out: OrderedDict[str, Any] = OrderedDict()
    source: dict[str, str] = {}
    for key, value in state.items():
        new: str | None = key
        for pat, repl in rules:
            if repl is None:
                if pat.search(new):
                    new = None
                    break
            else:
                try:
                    new = pat.sub(repl, new)
                except (re.error, IndexError) as e:
                    raise ValueRangeError(f"{op}: replacement {repl!r} of rule {pat.pattern!r} is invalid: {e}"
                                          ) from None
        if not new:
            continue
        if new in out:
            raise ValueRangeError(f"{op}: keys {source[new]!r} and {key!r} are both mapped to {new!r}")
        out[new], source[new] = value, key
    return out


# -- loading into a module ---------------------------------------------------------------------------------------
def load_into(module: Any, path: str | os.PathLike[str], *, strict: bool = True, dtype: Any = None,
              key_map: KeyMap | None = None) -> LoadReport:
    """Load a record into a Module's parameters and buffers (in place; each keeps its device).

    Returns a LoadReport of missing, unexpected and shape-mismatched keys. strict=True (default) raises
    IncompatibleStateError listing all of them and changes nothing; strict=False loads the keys that match.
    ``dtype`` converts the module's floating parameters and buffers (``module.to(dtype)``) before loading;
    without it values are cast to each parameter's dtype. ``key_map`` renames checkpoint keys first.
    """
    from .autograd import no_grad
    from .device import Device
    from .nn.module import Module

    op = "load_into"
    if not isinstance(module, Module):
        raise DTypeError(f"{op}: expected an nn.Module, got {type(module).__name__} "
                         "(for an optimizer use opt.load_state_dict(records.load(path)))")
    if not isinstance(strict, bool):
        raise DTypeError(f"{op}: strict must be a bool, got {type(strict).__name__}")
    d = _save_dtype(dtype, op)
    p = _fspath(path, op)
    state = load(p, device=Device.host())  # host first; copy_ moves each value to its parameter's device
    if not _is_flat(state):
        raise RecordError(f"{op}: {p!r} holds nested state (an optimizer's?), not a module state dict; "
                          "use records.load(path)")
    if key_map is not None:
        state = remap_keys(state, key_map, op=op)
    own = module.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [(k, state[k].shape, own[k].shape) for k in own if k in state and state[k].shape != own[k].shape]
    report = LoadReport(missing, unexpected, mismatched)
    if strict and not report.clean:
        raise IncompatibleStateError(
            f"{op}: {p!r} does not match {type(module).__name__}: {report.describe()} "
            "(pass strict=False to load the matching keys only)", report)
    if d is not None:
        module.to(dtype=d)
        own = module.state_dict(keep_vars=True)  # buffers are new tensors after a dtype change
    bad = {k for k, _, _ in mismatched}
    with no_grad():
        for k, target in own.items():
            if k in state and k not in bad:
                target.copy_(state[k])
    return report


# -- PyTorch import ----------------------------------------------------------------------------------------------
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module")


def _torch_to_numpy(t: Any, key: str, path: str) -> np.ndarray:
    import torch

    name = str(t.dtype).removeprefix("torch.")
    if name not in {d.name for d in dt.ALL_DTYPES} or t.layout != torch.strided:
        raise DTypeError(f"import_torch_weights: {path!r}: tensor {key!r} has dtype {t.dtype} / layout {t.layout}, "
                         f"which ember does not hold (supported: {[d.name for d in dt.ALL_DTYPES]}, strided)")
    t = t.detach().cpu()
    if name == "bfloat16":  # numpy has no bfloat16: reinterpret the bits as ml_dtypes' bfloat16
        return t.contiguous().view(torch.int16).numpy().view(dt.bfloat16.numpy)
    return t.numpy()


def _pick_state_dict(obj: Any, path: str) -> Mapping[str, Any]:
    import torch

    def tensor_dict(x: Any) -> bool:
        return isinstance(x, Mapping) and len(x) > 0 and all(isinstance(v, torch.Tensor) for v in x.values())

    if isinstance(obj, Mapping) and (len(obj) == 0 or tensor_dict(obj)):
        return obj
    if isinstance(obj, Mapping):
        for w in _WRAPPER_KEYS:  # training checkpoints wrap the weights: {"state_dict": ..., "epoch": ...}
            if tensor_dict(obj.get(w)):
                return obj[w]
        others = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
        raise RecordError(
            f"import_torch_weights: {path!r} is not a state dict of tensors: entries {others[:8]} are not tensors "
            f"and none of {list(_WRAPPER_KEYS)} holds one"
        )
    raise RecordError(f"import_torch_weights: {path!r} holds a {type(obj).__name__}, not a state dict "
                      "(save model.state_dict() with torch.save)")


def _load_torch_file(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            f"import_torch_weights: reading PyTorch file {path!r} needs torch; install it with `pip install torch` "
            "(or convert the file to .safetensors, which needs no torch)"
        ) from None
    import pickle

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e):
            raise RecordError(
                f"import_torch_weights: {path!r} pickles Python objects beyond tensors (a whole model?); only "
                "state dicts load safely: save model.state_dict() with torch.save"
            ) from e
        raise CorruptRecordError(f"import_torch_weights: {path!r} is not a readable PyTorch file ({e})") from e
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise CorruptRecordError(f"import_torch_weights: {path!r} is not a readable PyTorch file "
                                 f"({type(e).__name__}: {e})") from e
    sd = _pick_state_dict(obj, path)
    out: dict[str, np.ndarray] = {}
    for k, v in sd.items():
        if not isinstance(k, str):
            raise RecordError(f"import_torch_weights: {path!r} has a non-string key {k!r}")
        out[k] = _torch_to_numpy(v, k, path)
    return out


def _is_safetensors_file(path: str) -> bool:
    lower = path.lower()
    if lower.endswith(".safetensors"):
        return True
    if lower.endswith(_TORCH_SUFFIXES):
        return False
    with open(path, "rb") as f:
        head = f.read(9)
    # safetensors starts with its header's length (8 bytes, little-endian) and the header's "{"; torch.save writes
    # a zip archive ("PK", then a compression method where the "{" would be) or a pickle. The length is checked
    # against the file's size, not its first byte: a header of 384 bytes starts with 0x80, as a pickle does
    if len(head) != 9 or head[8:9] != b"{":
        return False
    return 0 < int.from_bytes(head[:8], "little") <= os.path.getsize(path) - 8


def import_torch_weights(path: str | os.PathLike[str], *, key_map: KeyMap | None = None, device: Any = None,
                         dtype: Any = None) -> OrderedDict[str, Tensor]:
    """An ember state dict from PyTorch weights: a ``.pt``/``.pth`` state dict (read by torch, which must be
    installed, with ``weights_only=True``) or a ``.safetensors`` file (no torch needed).

    A training checkpoint whose weights sit under "state_dict", "model_state_dict", "model" or "module" is
    unwrapped. ``key_map`` is a list of (regex, replacement) rules applied in order to each key (``re.sub``);
    a None replacement or an empty result drops the key. ``device``/``dtype`` as in :func:`load`.
    """
    op = "import_torch_weights"
    p = _fspath(path, op)
    _check_exists(p, op)
    make = _maker(device, dtype, op)
    if _is_safetensors_file(p):
        arrays, _ = _read_safetensors(p, op)
    else:
        arrays = _load_torch_file(p)
    if key_map is not None:
        arrays = remap_keys(arrays, key_map, op=op)
    out: OrderedDict[str, Tensor] = OrderedDict()
    for k, a in arrays.items():
        try:
            out[k] = make(a)
        except DTypeError as e:
            raise DTypeError(f"{op}: {p!r}: tensor {k!r}: {e}") from e
    return out
