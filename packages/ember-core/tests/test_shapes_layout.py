"""ember.shapes' strided-view arithmetic (shared by the backends with strided handles: OpenCL, wgpu) against numpy's
own views of the same array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember.shapes import basic_index_layout, expand_strides

BASE = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)


def _layout(a: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, offset) of a view of BASE, in elements."""
    item = a.itemsize
    offset = (a.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]) // item
    return a.shape, tuple(s // item for s in a.strides), offset


@pytest.mark.parametrize("key", [
    (0,), (-1, slice(None), 2), (slice(1, None), None, slice(None, None, 2)), (Ellipsis, 3),
    (slice(None), Ellipsis, None, slice(4, 0, -2)), (1, 2, 3, 4), (slice(5, 9),), (None, Ellipsis, None),
], ids=str)
def test_basic_index_layout_is_numpys_view(key: tuple[Any, ...]) -> None:
    shape, strides, offset = _layout(BASE)
    got = basic_index_layout(shape, strides, offset, key)
    view = BASE[key]
    if not isinstance(view, np.ndarray):  # every dim indexed by an int: numpy's 0-d view needs a trailing Ellipsis
        view = BASE[(*key, Ellipsis)]
    if view.size:
        assert got == _layout(view)
    else:
        assert got[0] == view.shape


def test_expand_strides_zero_the_broadcast_dims() -> None:
    a = BASE[:, :1, :, :1]
    _, strides, _ = _layout(a)
    assert expand_strides(a.shape, strides, (7, 2, 3, 4, 5)) == (0, 60, 0, 5, 0)
    np.testing.assert_array_equal(np.broadcast_to(a, (7, 2, 3, 4, 5)).strides,
                                  tuple(s * 4 for s in (0, 60, 0, 5, 0)))


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (2, 0, 3), (1, 1, 7)], ids=str)
def test_contiguous_strides_are_numpys(shape: tuple[int, ...]) -> None:
    from ember.shapes import contiguous_strides

    a = np.zeros(shape, dtype=np.float32)
    want = tuple(s // 4 for s in a.strides) if a.size else contiguous_strides(shape)
    assert contiguous_strides(shape) == want
    assert contiguous_strides((2, 0, 3)) == (3, 3, 1)
