"""Property-based checks (hypothesis): broadcasting, reductions and movement over random shapes and dtypes.

numpy is the oracle; the shapes include size-0 and size-1 dims, 0-d tensors and ranks up to 4.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember

from . import assert_close

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
hnp = pytest.importorskip("hypothesis.extra.numpy")

SETTINGS = hypothesis.settings(max_examples=60, deadline=None, derandomize=True)

_NUMPY_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


def _values(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Random values of ``dtype``, or of its 32-bit kind where the device under test lacks the 64-bit dtype."""
    if dtype in ("float64", "int64") and not ember.default_device().supports_dtype(ember.dtypes.as_dtype(dtype)):
        dtype = dtype.replace("64", "32")
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@SETTINGS
@hypothesis.given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4),
    dtype=st.sampled_from(["float32", "float64", "int32", "int64"]),
    op=st.sampled_from(sorted(_NUMPY_OPS)),
    seed=st.integers(0, 2**16),
)
def test_binary_broadcasting_matches_numpy(device, shapes, dtype, op, seed) -> None:
    sa, sb = shapes.input_shapes
    a, b = _values(sa, dtype, seed), _values(sb, dtype, seed + 1)
    out = getattr(ember, op)(ember.tensor(a), ember.tensor(b))
    assert out.shape == shapes.result_shape
    assert_close(out, _NUMPY_OPS[op](a, b))


@SETTINGS
@hypothesis.given(
    sa=hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4),  # last dim 1 would broadcast
    extra=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_incompatible_shapes_raise_shape_error(device, sa, extra, seed) -> None:
    bad = sa[:-1] + (sa[-1] + extra,)
    a, b = ember.tensor(_values(sa, "float32", seed)), ember.tensor(_values(bad, "float32", seed))
    with pytest.raises(ember.ShapeError, match="not broadcastable"):
        a + b


@SETTINGS
@hypothesis.given(
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
    data=st.data(),
    keepdim=st.booleans(),
    dtype=st.sampled_from(["float32", "float64", "int64"]),
)
def test_sum_and_amax_over_random_dims_match_numpy(device, shape, data, keepdim, dtype) -> None:
    x = _values(shape, dtype, 7)
    ndim = len(shape)
    dims = data.draw(st.lists(st.integers(0, max(ndim - 1, 0)), unique=True, max_size=ndim)) if ndim else []
    dims = tuple(d - ndim if data.draw(st.booleans()) else d for d in dims)  # negative dims too
    t = ember.tensor(x)
    axis = dims if dims else None
    expected_sum = np.sum(x, axis=axis, keepdims=keepdim, dtype=np.int64 if dtype == "int64" else None)
    assert_close(t.sum(dim=dims if dims else None, keepdim=keepdim), expected_sum)
    if x.size and all(shape[d] for d in dims):
        assert_close(t.amax(dim=dims if dims else None, keepdim=keepdim), np.amax(x, axis=axis, keepdims=keepdim))


@SETTINGS
@hypothesis.given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), data=st.data())
def test_permute_reshape_round_trip_matches_numpy(device, shape, data) -> None:
    x = _values(shape, "float32", 3)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    t = ember.tensor(x).permute(*perm)
    assert_close(t, np.transpose(x, perm))
    flat = t.reshape(-1)
    assert_close(flat, np.transpose(x, perm).reshape(-1))
    assert_close(flat.reshape(*t.shape).permute(*np.argsort(perm)), x)
