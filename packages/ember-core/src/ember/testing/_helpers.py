"""Private helpers shared by the kit's op test modules (reductions, shape, indexing, nn.functional).

Every tensor they build lands on the device under test (ember's default device while kit tests run); the
non-contiguous layouts are made with the backend's own ``getitem``/``permute`` primitives, never through numpy
memory tricks, so they hold on any backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from .. import dtypes as dt
from . import noncontiguous, require_dtype

#: the nn tests run in both float precisions; a device without float64 skips those cases
NN_DTYPES = (np.float32, np.float64)
#: tolerances of the nn checks against torch, by numpy dtype (others compare exactly)
NN_TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


def default_device() -> Any:
    """The device under test (ember's default device while kit tests run)."""
    from ..device import default_device as current

    return current()


def need(dtype: Any) -> None:
    """Skip the running test unless the device under test supports ``dtype`` (numpy or ember dtype)."""
    require_dtype(default_device(), dt.from_numpy_dtype(np.dtype(dtype)) if not isinstance(dtype, dt.DType)
                  else dtype)


def rand(shape: tuple[int, ...], dtype: Any = np.float64, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Reproducible standard-normal data of ``shape`` (times ``scale``) as a numpy array of ``dtype``."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def E(a: Any, layout: str = "contiguous") -> Any:  # noqa: N802 - reads as "Ember"
    """An ember tensor on the device under test with a's values; ``layout="strided"`` gives a non-contiguous
    handle (a transposed view of a strided slice) holding the same values."""
    from ..ops.creation import tensor

    a = np.asarray(a)
    need(a.dtype)
    if layout == "strided" and a.ndim >= 2:
        return noncontiguous(a, default_device())
    return tensor(a)


def NC(a: Any) -> Any:  # noqa: N802 - reads as "Non-Contiguous"
    """A non-contiguous ember tensor on the device under test holding a's values (0-d and 1-d included)."""
    a = np.asarray(a)
    need(a.dtype)
    t = noncontiguous(a, default_device())
    assert tuple(t.shape) == a.shape
    return t


def T(a: Any) -> Any:  # noqa: N802 - reads as "Torch"
    """A torch tensor holding a copy of numpy array ``a`` (0-d stays 0-d)."""
    import torch

    return torch.from_numpy(np.array(a, order="C", copy=True))


def check(out: Any, ref: Any, dtype: Any = None, **tol: float) -> None:
    """``out`` (ember Tensor) equals ``ref`` (torch Tensor) in shape, dtype and values (nn tolerances)."""
    ref = ref.detach().numpy()
    got = out.numpy()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    kw = dict(NN_TOL.get(np.dtype(dtype or got.dtype).type, {"rtol": 0, "atol": 0}))
    kw.update(tol)
    np.testing.assert_allclose(got, ref, **kw)


@contextmanager
def raises(exc: type[BaseException], *fragments: str) -> Iterator[Any]:
    """Assert the block raises ``exc`` whose message holds every fragment (literally)."""
    with pytest.raises(exc) as info:
        yield info
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


def rx(s: str) -> str:
    """``s`` as a literal regular expression (for ``pytest.raises(match=...)``)."""
    return re.escape(s)


def shares(base: Any, other: Any) -> bool:
    """Whether ``other`` is a view of ``base``: a write to every element of ``base`` shows in ``other``.

    Observed through the public ops only (no numpy memory checks), so it holds for any backend; ``base`` is
    restored afterwards. An empty ``other`` shares nothing observable and gives False.
    """
    from ..ops.creation import tensor

    if not other.numel():
        return False
    saved = base.numpy().copy()
    before = other.numpy().copy()
    first = before.reshape(-1)[0]
    # a value other's first element does not hold: a view must show it there
    if before.dtype == np.bool_:
        sentinel = np.logical_not(first)
    else:
        sentinel = np.asarray(0 if np.isnan(first) else first + 1).astype(before.dtype)
    base[...] = tensor(sentinel)
    after = other.numpy().copy()
    base[...] = tensor(saved)
    return not np.array_equal(before, after, equal_nan=before.dtype.kind == "f")


def elsewhere(t: Any) -> Any:
    """``t``'s data labelled with a second, never-resolved device of the same kind: enough for the device
    checks, which every op runs before any backend call."""
    from ..device import Device
    from ..tensor import Tensor

    dev = t.device
    other = Device(dev.kind, dev.index, (*dev.options, ("conformance_kit_other_device", True)))
    assert other is not dev
    return Tensor._make(t._h, t._dtype, other)


def grad_device(device: Any) -> Any:
    """``device`` recording gradients: itself when its stack is differentiable, else ``device`` with the
    installed differentiable decorator (a declared capability, not a name) applied; None when there is none."""
    from ..plugins.manager import registry

    if getattr(device.stack, "differentiable", False):
        return device
    registry.ensure_loaded()
    spec = registry.differentiable_decorator()
    if spec is None:
        return None
    return getattr(device, spec.name)()
