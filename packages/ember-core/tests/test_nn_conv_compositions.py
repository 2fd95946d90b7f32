"""Core's default compositions for conv/pool/interpolate/pad, through the conformance kit's nn tests.

The kit (``ember.testing.test_nn_conv``) runs these tests on the device under test with its own kernels; here the
same tests run on the default device with its nn methods replaced by :class:`ember.backend.Backend`'s default
compositions, so the compositions are checked against torch even on a backend that has kernels of its own.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from ember.testing.test_nn_conv import (  # noqa: E402, F401 - collected here under the fixture below
    test_adaptive_pools,
    test_avg_pool_matches_torch,
    test_conv_matches_torch,
    test_conv_transpose_matches_torch,
    test_conv_transpose_positional_order_is_groups_then_dilation,
    test_empty_batch,
    test_interpolate_matches_torch,
    test_max_pool_integer_input,
    test_max_pool_matches_torch,
    test_pad_integer_constant,
    test_pad_matches_torch,
    test_unfold_fold,
    test_upsample_aliases,
)

_NN_METHODS = ("conv", "conv_transpose", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool",
               "interpolate", "pad")


@pytest.fixture(autouse=True)
def _default_compositions(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Replace the default device's nn kernels by core's default compositions for the test's duration."""
    from ember.backend import Backend
    from ember.device import default_device

    cls = type(default_device().stack)
    for name in _NN_METHODS:
        monkeypatch.setattr(cls, name, getattr(Backend, name))
    return cls
