"""Argument forms where ember deliberately differs from torch, found by the fuzz suite (tests/fuzz) and kept.

torch refuses these calls; ember accepts them on purpose, consistently, and they are documented where they are
implemented (``shapes.check_shape_arg``, ``ops.shape._int_args``, ``ops.shape.squeeze``):

* no size at all is the empty size: ``zeros()``, ``ones()``, ``empty()``, ``rand()`` give a 0-d tensor, and
  ``x.expand()``, ``x.repeat()``, ``x.reshape()`` of a 0-d ``x`` give a 0-d tensor (torch: TypeError, missing size);
* ``squeeze(x, None)`` squeezes every size-1 dim like ``squeeze(x)``, following ember's dim=None convention of the
  reductions (torch: TypeError).

Everything else the fuzz classes covered matches torch and is tested on every device in the conformance kit
(``ember.testing.test_edge_cases``); these tests pin the extensions so a change to them is a decision, not an
accident, and check that each extension agrees with the explicit form torch accepts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember.errors import ShapeError

torch = pytest.importorskip("torch")


def _same(out: Any, ref: Any) -> None:
    assert out.shape == tuple(ref.shape)
    assert str(out.dtype).split(".")[-1] == str(ref.dtype).split(".")[-1]
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


@pytest.mark.parametrize("name", ["zeros", "ones", "empty"])
def test_factories_without_a_size_are_0d(name: str) -> None:
    with pytest.raises(TypeError):
        getattr(torch, name)()
    out = getattr(ember, name)()
    assert out.shape == () and out.dtype is ember.float32
    if name != "empty":
        _same(out, getattr(torch, name)(()))
    assert ember.rand().shape == () and ember.randn(dtype=ember.float64).shape == ()


@pytest.mark.parametrize("method", ["expand", "repeat", "reshape"])
def test_0d_shape_methods_without_sizes_are_0d(method: str) -> None:
    with pytest.raises(TypeError):
        getattr(torch.tensor(0.5), method)()
    _same(getattr(ember.tensor(0.5), method)(), getattr(torch.tensor(0.5), method)(()))
    # a tensor with dims still needs its sizes: the empty size is too short for it
    with pytest.raises(ShapeError, match=method):
        getattr(ember.zeros(2, 3), method)()


def test_squeeze_with_dim_none_squeezes_every_size_1_dim() -> None:
    a = np.arange(6.0).reshape(1, 3, 1, 2)
    with pytest.raises(TypeError):
        torch.squeeze(torch.tensor(a), None)
    _same(ember.squeeze(ember.tensor(a), None), torch.squeeze(torch.tensor(a)))
    _same(ember.tensor(a).squeeze(dim=None), torch.tensor(a).squeeze())
