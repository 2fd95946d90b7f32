"""ember's conformance kit: the backend contract in executable form.

A backend author checks a device against the contract by running the kit's test modules on it::

    pip install "ember-core[test]" my-ember-backend
    pytest --pyargs ember.testing --ember-device=mybackend        # or EMBER_TEST_DEVICE=mybackend
    pytest --pyargs ember.testing --ember-device=flex -k matmul   # one area
    pytest --pyargs ember.testing --ember-device=cuda:1 -x        # an index; "+autodiff" adds decorators

The ``--ember-device`` option comes from :mod:`ember.testing.pytest_plugin` (loaded automatically through the
``pytest11`` entry point). Every kit test runs on that device: the ``device`` fixture returns it, and the device is
made ember's default device for the session, so tensors created without ``device=`` land on it too. Results are
compared with numpy (forward values) and PyTorch (PyTorch-named semantics); dtypes the device does not support
(``Backend.supported_dtypes``) are skipped with a reason, not failed. A failure names the op, the dtypes and the
shapes involved, so a backend passes or fails op by op.

The helpers below are public so that plugin test suites can reuse them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes as dt
from ..dtypes import DType

__all__ = [
    "TOLERANCES",
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "DTYPES_FOR",
    "assert_close",
    "require_dtype",
    "to_numpy",
    "to_torch",
    "torch_dtype",
    "torch_or_skip",
    "ember_dtype",
    "noncontiguous",
    "pairs",
]

ALL_DTYPES: tuple[DType, ...] = dt.ALL_DTYPES
FLOAT_DTYPES: tuple[DType, ...] = dt.FLOAT_DTYPES
INT_DTYPES: tuple[DType, ...] = dt.INT_DTYPES

#: default (rtol, atol) by result dtype; integer and bool results must match exactly
TOLERANCES: dict[DType, tuple[float, float]] = {
    dt.float16: (1e-3, 1e-3),
    dt.bfloat16: (1.6e-2, 1e-2),
    dt.float32: (1e-5, 1e-6),
    dt.float64: (1e-10, 1e-12),
}


def DTYPES_FOR(device: Any, category: str | None = None) -> tuple[DType, ...]:  # noqa: N802 - reads as a table
    """The dtypes ``device`` supports, optionally only one category: ``"float"``, ``"int"`` or ``"bool"``."""
    pool = {None: ALL_DTYPES, "float": FLOAT_DTYPES, "int": INT_DTYPES, "bool": (dt.bool_,)}[category]
    return tuple(d for d in pool if device.supports_dtype(d))


def require_dtype(device: Any, *dtypes: Any) -> None:
    """Skip the running test (with a reason naming the device) unless ``device`` supports every dtype given."""
    import pytest

    for d in dtypes:
        d = dt.as_dtype(d)
        if not device.supports_dtype(d):
            pytest.skip(f"device {device} does not support dtype {d.name}")


def torch_or_skip() -> Any:
    """The torch module, or skip the running test when PyTorch (the semantics oracle) is not installed."""
    import pytest

    return pytest.importorskip("torch", reason="PyTorch is the kit's oracle: pip install 'ember-core[test]'")


def torch_dtype(d: Any) -> Any:
    """The torch dtype of an ember dtype."""
    import torch

    return getattr(torch, dt.as_dtype(d).name)


def ember_dtype(obj: Any) -> DType:
    """The ember dtype of a torch dtype, numpy dtype or name."""
    return dt.as_dtype(obj)


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy copy of an ember Tensor, torch tensor, numpy array or Python value (bfloat16 stays bfloat16)."""
    from ..tensor import Tensor

    if isinstance(x, Tensor):
        return np.array(x.numpy(), copy=True, order="C")
    if type(x).__module__.startswith("torch"):
        t = x.detach().cpu().resolve_conj()  # torch's lazy conjugates have no numpy view
        if str(t.dtype) == "torch.bfloat16":
            return t.float().numpy().astype(dt.bfloat16.numpy)
        return t.numpy().copy()
    return np.asarray(x)


def to_torch(t: Any) -> Any:
    """A torch tensor holding a copy of an ember Tensor (same dtype and shape) for use as an oracle input."""
    import torch

    a = to_numpy(t)
    if a.dtype == dt.bfloat16.numpy:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a)


def _dtype_of(expected: Any) -> DType | None:
    if isinstance(expected, np.ndarray | np.generic):
        return dt.from_numpy_dtype(expected.dtype)
    if type(expected).__module__.startswith("torch"):
        return dt.as_dtype(str(expected.dtype))
    return getattr(expected, "_dtype", None)


def assert_close(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None, *,
                 dtype: Any = None, equal_nan: bool = True, msg: str = "") -> None:
    """Assert an ember Tensor equals ``expected`` (numpy array, torch tensor, ember Tensor or Python value).

    Checks the shape and the dtype (the expected dtype is ``dtype`` when given, else ``expected``'s own dtype;
    Python values carry none), then the values: exactly for integer and bool results, within per-dtype default
    tolerances (:data:`TOLERANCES`, overridable with ``rtol``/``atol``) for floating results. NaN matches NaN and
    infinities must match in sign.
    """
    from ..tensor import Tensor

    where = f" ({msg})" if msg else ""
    if not isinstance(actual, Tensor):
        raise AssertionError(f"expected an ember Tensor, got {type(actual).__name__}{where}")
    want_dtype = dt.as_dtype(dtype) if dtype is not None else _dtype_of(expected)
    exp = to_numpy(expected)
    got = to_numpy(actual)
    if tuple(actual.shape) != tuple(exp.shape):
        raise AssertionError(f"shape mismatch: got {tuple(actual.shape)}, expected {tuple(exp.shape)}{where}")
    if got.shape != tuple(actual.shape):
        raise AssertionError(f"backend handle shape {got.shape} differs from tensor shape {actual.shape}{where}")
    if want_dtype is not None and actual.dtype is not want_dtype:
        raise AssertionError(f"dtype mismatch: got {actual.dtype.name}, expected {want_dtype.name}{where}")
    if got.dtype != actual.dtype.numpy:
        raise AssertionError(f"backend returned numpy dtype {got.dtype} for an {actual.dtype.name} tensor{where}")
    if actual.dtype.is_complex:  # the component dtype's tolerances, on real and imaginary parts together
        r0, a0 = TOLERANCES[actual.dtype.to_real]
        np.testing.assert_allclose(got.astype(np.complex128), exp.astype(np.complex128),
                                   rtol=r0 if rtol is None else rtol, atol=a0 if atol is None else atol,
                                   equal_nan=equal_nan, err_msg=f"values differ{where}")
        return
    if not actual.dtype.is_floating_point:
        np.testing.assert_array_equal(got, exp.astype(got.dtype) if exp.dtype.kind != "f" else exp,
                                      err_msg=f"values differ{where}")
        return
    r0, a0 = TOLERANCES[actual.dtype]
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=r0 if rtol is None else rtol,
                               atol=a0 if atol is None else atol, equal_nan=equal_nan,
                               err_msg=f"values differ{where}")


def pairs(items: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Every ordered pair of items (for exhaustive dtype-pair tests)."""
    seq = list(items)
    return [(a, b) for a in seq for b in seq]


def noncontiguous(array: Any, device: Any) -> Any:
    """An ember Tensor on ``device`` equal to ``array`` whose handle is a strided, transposed view.

    Built with the backend's required ``getitem`` and ``permute`` primitives, so it works before (and
    independently of) the public shape ops: every elementwise op must give the same answer on such views.
    """
    from ..tensor import Tensor

    a = np.asarray(array)
    d = dt.from_numpy_dtype(a.dtype)
    if a.ndim == 0:
        return Tensor._make(device.stack.from_numpy(a.copy()), d, device)
    rev = tuple(reversed(range(a.ndim)))
    junk = np.ones_like(a) if a.dtype == np.bool_ else a + 1
    base = np.ascontiguousarray(np.stack([a.transpose(rev), junk.transpose(rev)], axis=-1))
    stack = device.stack
    h = stack.getitem(stack.from_numpy(base), (Ellipsis, 0))
    return Tensor._make(stack.permute(h, rev), d, device)
