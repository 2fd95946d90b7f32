"""Integer max pooling on a backend without float64 (wgpu, OpenCL without cl_khr_fp64): pooled in float32 where
that is exact, a typed error where it would round."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.errors import UnsupportedError
from ember.nn import functional as F

torch = pytest.importorskip("torch")


@pytest.fixture
def no_float64(monkeypatch: pytest.MonkeyPatch) -> Any:
    dev = ember.Device.flex().fusion(False)
    stack = dev.stack
    monkeypatch.setattr(stack, "supported_dtypes", frozenset(d for d in stack.supported_dtypes if d is not dt.float64))
    return dev


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_small_integers_pool_exactly_in_float32(no_float64: Any, dtype: Any) -> None:
    x = np.random.default_rng(0).integers(-100, 100, (1, 2, 6, 6)).astype(dtype)
    x[0, 0, 0, 0] = np.iinfo(dtype).min if dtype in (np.int8, np.int16) else -(2**24)  # the extremes stay exact
    out = F.max_pool2d(ember.tensor(x, device=no_float64), 2)
    ref = torch.nn.functional.max_pool2d(torch.from_numpy(x), 2)
    assert out.dtype is dt.from_numpy_dtype(np.dtype(dtype))
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_integers_beyond_float32_are_refused_not_rounded(no_float64: Any) -> None:
    x = np.full((1, 1, 2, 2), 2**24 + 1, dtype=np.int32)
    with pytest.raises(UnsupportedError, match=r"max_pool: int32 values up to 16777217 pool exactly only in "
                                               r"float64, which the device .* does not support"):
        F.max_pool2d(ember.tensor(x, device=no_float64), 2)


def test_float64_backends_keep_pooling_wide_integers_exactly() -> None:
    x = np.full((1, 1, 2, 2), 2**40 + 1, dtype=np.int64)
    out = F.max_pool2d(ember.tensor(x, device=ember.Device.flex()), 2)
    assert out.numpy().item() == 2**40 + 1
