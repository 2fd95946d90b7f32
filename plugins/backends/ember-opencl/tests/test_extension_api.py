"""OpenCLBackend.empty and OpenCLBackend.compile_kernel: what an extension kernel (ember.backend_extension) uses to
allocate its output and build its own OpenCL C without importing this plugin's modules."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember import dtypes as dt
from ember.errors import DTypeError, ShapeError

ember_opencl = pytest.importorskip("ember_opencl")
from ember_opencl import runtime  # noqa: E402
from ember_opencl.errors import KernelBuildError  # noqa: E402

if not runtime.list_devices():
    pytest.skip("no OpenCL platform on this machine (install pocl-opencl-icd)", allow_module_level=True)

_SCALE = """
__kernel void scale(__global const float* x, long x_off, __global float* y, long y_off, float a, int n) {
    const int i = get_global_id(0);
    if (i < n) y[y_off + i] = a * x[x_off + i];
}
"""


@pytest.fixture(scope="module")
def backend() -> Any:
    return Device.opencl(0).stack.base_backend  # the OpenCLBackend itself, whatever decorates it


def test_empty_allocates_a_contiguous_array_of_the_shape_and_dtype(backend: Any) -> None:
    h = backend.empty((3, 5), dt.float32)
    assert h.shape == (3, 5) and h.dtype is dt.float32 and h.is_contiguous
    assert backend.dtype_of(h) is dt.float32
    backend.assign(h, 2.5)
    np.testing.assert_array_equal(backend.to_numpy(h), np.full((3, 5), 2.5, np.float32))
    assert backend.empty([0, 4], dt.int64).shape == (0, 4)  # any sequence of ints; empty arrays allowed
    assert backend.empty((), dt.float32).shape == ()


def test_empty_refuses_bad_shapes_and_unsupported_dtypes(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ShapeError, match=r"OpenCLBackend.empty: negative dimension in shape \(2, -1\)"):
        backend.empty((2, -1), dt.float32)
    monkeypatch.setattr(backend, "supported_dtypes", frozenset({dt.float32}))
    with pytest.raises(DTypeError, match="OpenCLBackend.empty: float64 is not supported"):
        backend.empty((2,), dt.float64)


def test_compile_kernel_builds_once_and_the_kernel_runs_on_handles(backend: Any) -> None:
    xs = backend.getitem(backend.from_numpy(np.arange(10, dtype=np.float32)), (slice(3, None),))
    assert xs.eoff > 0  # a view with an element offset: the kernel must honour it
    y = backend.empty(xs.shape, dt.float32)
    knl = backend.compile_kernel(_SCALE, "scale")
    assert backend.compile_kernel(_SCALE, "scale") is knl  # cached per thread: one dict lookup per launch
    knl(backend.rt.queue, (7,), None, xs.buf, np.int64(xs.eoff), y.buf, np.int64(y.eoff), np.float32(2.0),
        np.int32(7))
    np.testing.assert_array_equal(backend.to_numpy(y), 2.0 * np.arange(3, 10, dtype=np.float32))


def test_compile_kernel_reports_build_errors_and_missing_names(backend: Any) -> None:
    with pytest.raises(KernelBuildError):
        backend.compile_kernel("__kernel void broken(__global float* x) { x[0] = undefined_name; }", "broken")
    with pytest.raises(ember.errors.ValueRangeError, match="no kernel 'other'"):
        backend.compile_kernel(_SCALE, "other")
