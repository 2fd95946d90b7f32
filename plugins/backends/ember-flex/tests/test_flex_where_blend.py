"""flex's branch-free ``where`` for large operands (ember_flex.backend._blend): bit for bit np.where -- dtype, shape,
strides and every bit (NaN payloads, -0.0, inf) -- for every operand form the backend passes (arrays, broadcast
arrays, Python and numpy scalars, 0-d arrays), and np.where's own path where the blend does not apply."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember_flex import backend as B

DTYPES = ["float32", "float64", "float16", "int16", "int32", "int64", "uint8", "int8", "bool", "complex64"]


def _operands(dtype: str, rng: np.random.Generator) -> list[tuple[Any, Any]]:
    a = (rng.standard_normal((6, 9)) * 100).astype(dtype)
    b = (rng.standard_normal((6, 9)) * 100).astype(dtype)
    if dtype.startswith("float"):
        a.flat[:4] = [np.inf, -np.inf, np.nan, -0.0]
    return [(a, b), (0, a), (a, 0.0), (-0.0, a), (1.5, a), (a, b[:1]), (b[:, :1], 7), (2, 3.5), (a.T, b.T),
            (np.asarray(0.0, a.dtype), b), (np.float32(2.5), a), (300, a)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_is_np_where_bit_for_bit(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    monkeypatch.setattr(B, "BLEND_MIN", 1)  # every size through the blend where it applies
    rng = np.random.default_rng(0)
    cond = rng.random((6, 9)) < 0.5
    checked = 0
    for a, b in _operands(dtype, rng):
        for c in (cond, cond[:1], cond[:, :1], cond.T.copy().T):
            try:
                ref = np.where(c, a, b)
            except (OverflowError, TypeError, ValueError) as e:
                with pytest.raises(type(e)):
                    B._where(c, a, b)
                continue
            got = B._where(c, a, b)
            assert (got.dtype, got.shape, got.strides) == (ref.dtype, ref.shape, ref.strides)
            assert got.tobytes() == ref.tobytes()
            checked += 1
    assert checked > 30


def test_backend_where_on_large_operands_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through FlexBackend.where, large enough for the blend, serially and chunked on flex's pool."""
    from ember_flex import threads

    be = B.FlexBackend()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 700)).astype(np.float32)
    g = rng.standard_normal((300, 700)).astype(np.float32)
    cond = x <= 0
    for a, b in ((0.0, g), (x, g), (g, 1)):
        ref = np.where(cond, a, b)
        assert be.where(cond, a, b).tobytes() == ref.tobytes()
        monkeypatch.setattr(threads, "min_elems", 1 << 10)
        monkeypatch.setattr(threads._pool, "threads", 2)
        assert be.where(cond, a, b).tobytes() == ref.tobytes()
        monkeypatch.undo()
