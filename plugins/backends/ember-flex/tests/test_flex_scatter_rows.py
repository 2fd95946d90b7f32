"""FlexBackend.scatter's flat-index path for replace-scatters along the last axis (max-pool's backward) against the
open-grid fancy index it replaces: same values, duplicates resolved the same way, fallbacks where it does not apply."""

from __future__ import annotations

import numpy as np
import pytest

from ember_flex.backend import FlexBackend


def _grid_scatter(h: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray) -> np.ndarray:
    out = h.copy()
    src = src[tuple(slice(0, n) for n in index.shape)]
    out[FlexBackend._grid(index, dim)] = src
    return out


@pytest.mark.parametrize("shape, k", [((7, 13), 13), ((7, 13), 5), ((3, 4, 9), 9), ((3, 4, 9), 2), ((1, 1), 1)])
def test_last_axis_replace_matches_the_grid_path(shape, k):
    rng = np.random.default_rng(0)
    h = rng.standard_normal(shape).astype(np.float32)
    index = rng.integers(0, shape[-1], size=shape[:-1] + (k,))  # duplicates within rows
    src = rng.standard_normal(shape[:-1] + (k + 1,)).astype(np.float32)  # larger than index: sliced
    out = h.copy()
    assert FlexBackend._scatter_rows(out, len(shape) - 1, index, src[..., :k])
    np.testing.assert_array_equal(out, _grid_scatter(h, len(shape) - 1, index, src))
    np.testing.assert_array_equal(FlexBackend().scatter(h, len(shape) - 1, index, src, None),
                                  _grid_scatter(h, len(shape) - 1, index, src))


def test_duplicates_keep_the_value_the_grid_path_keeps():
    h = np.zeros((2, 4), np.float64)
    index = np.array([[1, 1, 1], [3, 0, 3]])
    src = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    got = FlexBackend().scatter(h, 1, index, src, None)
    np.testing.assert_array_equal(got, _grid_scatter(h, 1, index, src))
    assert got[0, 1] == 3.0 and got[1, 3] == 6.0  # the last write in C order


def test_where_it_does_not_apply_nothing_is_written_and_scatter_still_agrees():
    rng = np.random.default_rng(1)
    h = rng.standard_normal((4, 6))
    src = rng.standard_normal((4, 6))
    cases = [(0, rng.integers(0, 4, size=(4, 6))),        # not the last axis
             (1, rng.integers(0, 6, size=(3, 6))),        # index covers fewer rows than h
             (1, np.array([[-1, 0]] * 4)),                # a negative index (the grid wraps it)
             (1, np.zeros((4, 0), np.int64))]             # empty index
    for dim, index in cases:
        out = h.copy()
        assert not FlexBackend._scatter_rows(out, dim, index, src[tuple(slice(0, n) for n in index.shape)])
        np.testing.assert_array_equal(out, h)
        np.testing.assert_array_equal(FlexBackend().scatter(h, dim, index, src, None),
                                      _grid_scatter(h, dim, index, src))


def test_add_and_multiply_reductions_keep_their_accumulating_path():
    h = np.ones((2, 3))
    index = np.array([[0, 0, 2], [1, 1, 1]])
    src = np.full((2, 3), 2.0)
    np.testing.assert_array_equal(FlexBackend().scatter(h, 1, index, src, "add"), [[5, 1, 3], [1, 7, 1]])
    np.testing.assert_array_equal(FlexBackend().scatter(h, 1, index, src, "multiply"), [[4, 1, 2], [1, 8, 1]])
