"""The contract's list of required primitives matches what Backend leaves unimplemented."""

from __future__ import annotations

import inspect

import pytest

from ember.backend import REQUIRED_PRIMITIVES, Backend
from ember.errors import UnsupportedError


def test_required_primitives_are_exactly_the_unimplemented_methods() -> None:
    unimplemented = {
        name for name, fn in inspect.getmembers(Backend, inspect.isfunction)
        if not name.startswith("_") and "self._missing(" in inspect.getsource(fn)
    }
    assert unimplemented == REQUIRED_PRIMITIVES


@pytest.mark.parametrize("name", sorted(REQUIRED_PRIMITIVES))
def test_a_missing_primitive_raises_a_clear_error(name: str) -> None:
    method = getattr(Backend(), name)
    n_args = len(inspect.signature(method).parameters)
    with pytest.raises(UnsupportedError, match=f"does not implement the required primitive {name}"):
        method(*([None] * n_args))


def test_broadcast_shape_helper_matches_numpy() -> None:
    import numpy as np

    from ember.shapes import broadcast_shapes

    for shapes in [((3, 1), (4,)), ((2, 1, 5), (1, 3, 1), (5,)), ((), (2, 3)), ((0, 1), (1, 4)), ((7,),)]:
        assert broadcast_shapes(*shapes) == np.broadcast_shapes(*shapes), shapes
