"""A pending value whose realization fails (here: more memory than exists) raises at its read, and only there: it
does not stay in the thread's pending set, where every later flush (an in-place op, sync) would run it again."""

from __future__ import annotations

import pytest

import ember
from ember import OutOfMemoryError


def test_a_failed_value_does_not_poison_later_flushes():
    dev = ember.Device.flex().fusion()
    huge = ember.full((10**13,), 2.0, device=dev)  # recorded lazily; kept alive like a traceback would keep it
    with pytest.raises(OutOfMemoryError, match="allocate"):
        huge.numpy()
    x = ember.tensor([1.0, -2.0], device=dev)
    x.clamp_(min=0.0)  # an in-place op on memory first runs everything pending in this thread
    dev.sync()
    assert x.tolist() == [1.0, 0.0]
    with pytest.raises(OutOfMemoryError):  # the failed value itself still raises when read again
        huge.numpy()
