"""ember's dtypes and PyTorch's type-promotion rules.

A :class:`DType` is a small immutable value; the module-level instances (``ember.float32`` ...) are the only
ones. ``bfloat16`` is backed by ``ml_dtypes`` on the host so that numpy arrays of it can be exchanged.

Complex dtypes (``complex64``/``cfloat``, ``complex128``/``cdouble``) rank above the floating ones, as in PyTorch:
``float32 + complex64 -> complex64``, ``float64 + complex64 -> complex128``, an integer tensor with a Python complex
gives the default complex dtype (``complex64`` for a ``float32`` default, ``complex128`` for ``float64``). They are
not in :data:`ALL_DTYPES` (the real dtypes every backend is measured on): a backend that stores them lists them in its
``supported_dtypes`` (:data:`COMPLEX_DTYPES`); elsewhere creating one raises DTypeError naming dtype and backend.
"""

from __future__ import annotations

import builtins as _builtins
from functools import cache

import numpy as np

from .errors import DTypeError, ValueRangeError

builtins_bool = _builtins.bool
builtins_int = _builtins.int
builtins_float = _builtins.float
builtins_complex = _builtins.complex

# category ranks: bool < integer < floating < complex
_BOOL, _INT, _FLOAT, _COMPLEX = 0, 1, 2, 3


class DType:
    """An element type. Compare with ``is`` or ``==``; hashable; ``str(ember.float32) == 'ember.float32'``."""

    __slots__ = ("name", "itemsize", "category", "is_signed", "_np_name", "_np")

    def __init__(self, name: str, itemsize: int, category: int, is_signed: bool, np_name: str) -> None:
        self.name = name
        self.itemsize = itemsize
        self.category = category
        self.is_signed = is_signed
        self._np_name = np_name
        self._np: np.dtype | None = None

    @property
    def is_floating_point(self) -> bool:
        return self.category == _FLOAT

    @property
    def is_complex(self) -> bool:
        """True for complex64 and complex128 (``torch.dtype.is_complex``)."""
        return self.category == _COMPLEX

    @property
    def to_real(self) -> DType:
        """The real dtype of a complex dtype's components (complex64 -> float32); a real dtype itself."""
        return _TO_REAL.get(self, self)

    @property
    def to_complex(self) -> DType:
        """The complex dtype whose components have this floating dtype's precision (PyTorch's ``toComplexType``:
        float64 -> complex128, the other floats -> complex64, ember having no complex32); a complex dtype itself."""
        if self.category == _COMPLEX:
            return self
        if self.category != _FLOAT:
            raise DTypeError(f"to_complex: {self} is not a floating dtype")
        return complex128 if self.itemsize == 8 else complex64

    @property
    def is_bool(self) -> bool:
        return self.category == _BOOL

    @property
    def is_integer(self) -> bool:
        """True for the integer dtypes (not bool)."""
        return self.category == _INT

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype used for this dtype on the host."""
        if self._np is None:
            if self._np_name == "bfloat16":
                import ml_dtypes

                self._np = np.dtype(ml_dtypes.bfloat16)
            else:
                self._np = np.dtype(self._np_name)
        return self._np

    def __repr__(self) -> str:
        return f"ember.{self.name}"

    def __reduce__(self) -> str:
        return self.name


float16 = DType("float16", 2, _FLOAT, True, "float16")
bfloat16 = DType("bfloat16", 2, _FLOAT, True, "bfloat16")
float32 = DType("float32", 4, _FLOAT, True, "float32")
float64 = DType("float64", 8, _FLOAT, True, "float64")
int8 = DType("int8", 1, _INT, True, "int8")
int16 = DType("int16", 2, _INT, True, "int16")
int32 = DType("int32", 4, _INT, True, "int32")
int64 = DType("int64", 8, _INT, True, "int64")
uint8 = DType("uint8", 1, _INT, False, "uint8")
bool_ = DType("bool", 1, _BOOL, False, "bool")
complex64 = DType("complex64", 8, _COMPLEX, True, "complex64")
complex128 = DType("complex128", 16, _COMPLEX, True, "complex128")
_TO_REAL = {complex64: float32, complex128: float64}

# PyTorch aliases
half = float16
float = float32  # noqa: A001 - mirrors torch.float
double = float64
short = int16
int = int32  # noqa: A001 - mirrors torch.int
long = int64
cfloat = complex64
cdouble = complex128

ALL_DTYPES: tuple[DType, ...] = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)
FLOAT_DTYPES: tuple[DType, ...] = (float16, bfloat16, float32, float64)
INT_DTYPES: tuple[DType, ...] = (int8, int16, int32, int64, uint8)
#: the complex dtypes; not in ALL_DTYPES: a backend that stores them adds them to its ``supported_dtypes``
COMPLEX_DTYPES: tuple[DType, ...] = (complex64, complex128)

_BY_NAME = {d.name: d for d in ALL_DTYPES + COMPLEX_DTYPES}
_BY_NAME.update({"half": float16, "float": float32, "double": float64, "short": int16, "int": int32, "long": int64,
                 "cfloat": complex64, "cdouble": complex128})


_BY_NUMPY: dict[object, DType] = {}  # numpy dtype -> ember dtype, filled on first use (backends ask per op)


def from_numpy_dtype(dt: np.dtype | type) -> DType:
    """The ember dtype matching a numpy dtype; raises DTypeError for unsupported ones (complex, strings...)."""
    try:
        d = _BY_NUMPY.get(dt)
    except TypeError:  # an unhashable dtype-like: convert without the cache
        return _from_numpy_dtype(dt)
    if d is None:
        d = _BY_NUMPY[dt] = _from_numpy_dtype(dt)
    return d


def _from_numpy_dtype(dt: np.dtype | type) -> DType:
    dt = np.dtype(dt)
    name = dt.name
    d = _BY_NAME.get(name)
    if d is None or name in ("float", "int", "half", "double", "short", "long", "cfloat", "cdouble"):
        if name == "bfloat16":
            return bfloat16
        raise DTypeError(f"numpy dtype {dt} has no ember equivalent; supported: "
                         f"{[d.name for d in ALL_DTYPES + COMPLEX_DTYPES]}")
    return d


def as_dtype(obj: object) -> DType:
    """Accept an ember DType, a name ('float32'), a numpy dtype/type, a torch dtype, or Python bool/int/float."""
    if isinstance(obj, DType):
        return obj
    if obj is builtins_bool:
        return bool_
    if obj is builtins_int:
        return int64
    if obj is builtins_float:
        return get_default_dtype()
    if obj is builtins_complex:
        return get_default_complex_dtype()
    if isinstance(obj, str):
        name = obj.removeprefix("ember.").removeprefix("torch.")
        if name in _BY_NAME:
            return _BY_NAME[name]
    else:
        s = str(obj)
        if s.startswith("torch."):
            return as_dtype(s)
        try:
            return from_numpy_dtype(obj)  # type: ignore[arg-type]
        except (TypeError, DTypeError):
            pass
    raise DTypeError(f"cannot interpret {obj!r} as an ember dtype; expected one of {sorted(_BY_NAME)}")


_default_float: DType = float32


def get_default_dtype() -> DType:
    """The float dtype used for Python floats and float factories when no dtype is given (torch semantics)."""
    return _default_float


def get_default_complex_dtype() -> DType:
    """The complex dtype of Python complex numbers: the default float dtype's complex counterpart (PyTorch)."""
    return _default_float.to_complex


def set_default_dtype(dtype: DType | str) -> None:
    """Set the global default float dtype (a floating dtype only, as in PyTorch)."""
    global _default_float
    d = as_dtype(dtype)
    if not d.is_floating_point:
        raise DTypeError(f"set_default_dtype: only floating dtypes are allowed, got {d}")
    _default_float = d


@cache
def promote_types(a: DType, b: DType) -> DType:
    """PyTorch's ``torch.promote_types`` for ember dtypes."""
    if a is b:
        return a
    if a.category != b.category:
        hi, lo = (a, b) if a.category > b.category else (b, a)
        if hi.category == _COMPLEX and lo.category == _FLOAT and lo.itemsize > hi.itemsize // 2:
            return complex128  # float64 with complex64: both halves need float64
        return hi
    if a.category == _COMPLEX:
        return a if a.itemsize > b.itemsize else b
    if a.category == _FLOAT:
        if {a, b} == {float16, bfloat16}:
            return float32
        return a if a.itemsize > b.itemsize else b
    if a.category == _INT:
        if a.is_signed != b.is_signed:  # one is uint8
            signed = a if a.is_signed else b
            return int16 if signed.itemsize == 1 else signed
        return a if a.itemsize > b.itemsize else b
    return a


def _scalar_dtype(v: object) -> DType:
    if isinstance(v, builtins_bool):
        return bool_
    if isinstance(v, builtins_int):
        return int64
    if isinstance(v, builtins_complex):
        return _default_float.to_complex
    return _default_float


def result_type(*operands: object) -> DType:
    """PyTorch's ``torch.result_type`` over tensors and Python scalars.

    Dimensioned tensors take precedence over 0-d tensors, which take precedence over Python scalars, unless
    a lower-priority operand is of a higher category (bool < integer < floating).
    """
    dim_r = zero_r = wrap_r = None
    for op in operands:
        dt = getattr(op, "_dtype", None)
        if dt is not None:
            if op.ndim:  # type: ignore[attr-defined]
                dim_r = dt if dim_r is None else promote_types(dim_r, dt)
            else:
                zero_r = dt if zero_r is None else promote_types(zero_r, dt)
        elif isinstance(op, (builtins_bool, builtins_int, builtins_float, builtins_complex)) or isinstance(
                op, np.generic):
            dt = from_numpy_dtype(op.dtype) if isinstance(op, np.generic) else _scalar_dtype(op)
            if isinstance(op, np.generic):
                # numpy scalars behave like 0-d tensors
                zero_r = dt if zero_r is None else promote_types(zero_r, dt)
            else:
                wrap_r = dt if wrap_r is None else promote_types(wrap_r, dt)
        else:
            raise DTypeError(f"result_type: unsupported operand of type {type(op).__name__}")
    r = _combine(dim_r, _combine(zero_r, wrap_r))
    if r is None:
        raise DTypeError("result_type: no operands")
    return r


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.category == _COMPLEX:
        return higher
    if lower.category == _COMPLEX:
        # PyTorch keeps a floating operand's precision (float32 tensor + complex128 scalar -> complex64)
        return higher.to_complex if higher.category == _FLOAT else lower
    if higher.category == _FLOAT:
        return higher
    if higher is bool_ or lower.category == _FLOAT:
        return promote_types(higher, lower)
    return higher


#: a Python int an op takes as a scalar must fit 64 bits (PyTorch's Scalar: int64, or uint64 above it)
SCALAR_INT_MIN, SCALAR_INT_MAX = -(2**63), 2**64 - 1


def check_scalar_int(v: object, op: str) -> None:
    """Refuse a Python int operand no 64-bit scalar can hold (PyTorch: OverflowError "int too big to convert")."""
    if type(v) is builtins_int and not SCALAR_INT_MIN <= v <= SCALAR_INT_MAX:  # type: ignore[operator]
        raise ValueRangeError(
            f"{op}: Python int {v} is too big to convert to a 64-bit scalar (the range is "
            f"[-2**63, 2**64 - 1])"
        )


@cache
def int_range(d: DType) -> tuple[builtins_int, builtins_int]:
    """The smallest and largest value of an integer dtype."""
    info = np.iinfo(d.numpy)
    return builtins_int(info.min), builtins_int(info.max)


def fits(v: builtins_int | builtins_float, d: DType) -> bool:
    """PyTorch's overflow check of a scalar converted to integer dtype ``d`` (c10 ``overflows``): ints must lie in
    the dtype's range, where an unsigned dtype also takes negatives down to -max (they wrap, two's complement);
    floats must be finite and within [min, max]."""
    lo, hi = int_range(d)
    if type(v) is builtins_float or isinstance(v, builtins_float):
        return v == v and lo <= v <= hi  # NaN and +-inf fail
    if not d.is_signed:
        return -hi <= v <= hi
    return lo <= v <= hi


def convert_scalar(v: object, d: DType, op: str) -> object:
    """A Python or numpy scalar converted to dtype ``d`` as PyTorch converts fill values, bounds and other scalar
    arguments: checked against the dtype's range (ValueRangeError naming the op, value and dtype), floats
    truncated toward zero for integer dtypes, negatives wrapped for unsigned ones, anything non-zero (NaN too)
    True for bool."""
    if isinstance(v, np.generic):
        v = v.item()
    if d.category == _COMPLEX and isinstance(v, (builtins_bool, builtins_int, builtins_float, builtins_complex)):
        check_scalar_int(v, op)
        return builtins_complex(v)
    if isinstance(v, builtins_complex):
        raise DTypeError(f"{op}: complex value {v!r} cannot be converted to the real dtype {d.name}")
    if not isinstance(v, (builtins_bool, builtins_int, builtins_float)):
        raise DTypeError(f"{op}: value must be a number, got {type(v).__name__} {v!r}")
    check_scalar_int(v, op)
    if d.category == _BOOL:
        return builtins_bool(v)
    if d.category == _FLOAT:
        return builtins_float(v)
    if type(v) is builtins_bool:
        return builtins_int(v)
    if not fits(v, d):  # type: ignore[arg-type]
        raise ValueRangeError(f"{op}: value {v} cannot be converted to type {d.name} without overflow")
    iv = builtins_int(v)
    return iv % (1 << d.bits) if iv < 0 and not d.is_signed else iv


def can_cast(from_: DType, to: DType) -> bool:
    """PyTorch's ``torch.can_cast``: same-kind casting (no float->int, no int->bool, ...)."""
    return from_.category <= to.category


__all__ = [
    "DType",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool_",
    "complex64",
    "complex128",
    "ALL_DTYPES",
    "COMPLEX_DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "as_dtype",
    "from_numpy_dtype",
    "get_default_dtype",
    "get_default_complex_dtype",
    "set_default_dtype",
    "promote_types",
    "result_type",
    "can_cast",
    "check_scalar_int",
    "convert_scalar",
    "fits",
    "int_range",
]
