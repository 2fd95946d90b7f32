"""ember.set_num_threads / get_num_threads / set_num_interop_threads (torch's names).

The host backend declares a thread pool through ``register_backend_traits(set_num_threads=...)``: ember-flex limits
the BLAS libraries numpy loaded (seen through threadpoolctl) and numexpr's pool. Results do not change.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
from ember import runtime
from ember.errors import PluginError, ValueRangeError


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = runtime._num_threads
    yield
    if before is None:
        runtime.set_num_threads(runtime._cpu_count())
        runtime._num_threads = None
    else:
        runtime.set_num_threads(before)


def _blas_threads() -> list[int]:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    np.dot(np.ones((4, 4)), np.ones((4, 4)))  # BLAS loaded
    return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]


def test_set_num_threads_limits_the_host_backend_pools(restore_threads: None) -> None:
    if not any(t.set_num_threads for t in runtime.backend_traits().values()):
        pytest.skip("no installed backend declares a thread pool")
    ember.set_num_threads(1)
    assert ember.get_num_threads() == 1
    if "flex" in runtime.backend_traits():
        assert set(_blas_threads()) <= {1}
        numexpr = pytest.importorskip("numexpr")
        assert numexpr.set_num_threads(1) == 1  # returns the previous setting: what ember set
    a = ember.randn(64, 64)
    want = a.numpy().astype(np.float64) @ a.numpy().astype(np.float64)
    np.testing.assert_allclose((a @ a).numpy(), want, rtol=1e-4, atol=1e-4)
    ember.set_num_threads(2)
    assert ember.get_num_threads() == 2
    if "flex" in runtime.backend_traits():
        assert set(_blas_threads()) <= {2}


def test_default_is_the_usable_cpu_count() -> None:
    if runtime._num_threads is None:
        assert ember.get_num_threads() == runtime._cpu_count() >= 1
    assert ember.get_num_interop_threads() >= 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_thread_counts_are_typed_errors(bad: Any) -> None:
    with pytest.raises(ValueRangeError, match="set_num_threads: expected a positive int"):
        ember.set_num_threads(bad)
    with pytest.raises(ValueRangeError, match="set_num_interop_threads: expected a positive int"):
        ember.set_num_interop_threads(bad)


def test_interop_threads_are_recorded_once() -> None:
    before = runtime._num_interop_threads
    try:
        runtime._num_interop_threads = None
        ember.set_num_interop_threads(3)
        assert ember.get_num_interop_threads() == 3
        with pytest.raises(ValueRangeError, match="only once"):
            ember.set_num_interop_threads(2)
    finally:
        runtime._num_interop_threads = before


def test_a_failing_backend_pool_is_named(restore_threads: None) -> None:
    from ember.plugins import hookimpl, manager

    reg = manager.registry.ensure_loaded()

    def refuse(n: int) -> None:
        raise OSError("no pool here")

    class Plugin:
        @hookimpl
        def register_backend_traits(self, register: Any) -> None:
            register("brokenpool", set_num_threads=refuse)

    plugin = Plugin()
    reg.register_plugin(plugin, "brokenpool-test")
    try:
        with pytest.raises(PluginError, match="backend 'brokenpool'.*could not use 2 threads: OSError: no pool here"):
            ember.set_num_threads(2)
    finally:
        reg._manager().unregister(plugin)
        reg.plugins[:] = [p for p in reg.plugins if p.name != "brokenpool-test"]
    assert "brokenpool" not in runtime.backend_traits()
