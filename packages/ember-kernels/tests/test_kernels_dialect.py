"""The dialect layer: OpenCL text passes through unchanged (ember-opencl's programs and cache keys), CUDA/HIP get
the prelude and the rewrites; generated CUDA compiles and runs the same arithmetic (checked with NVRTC where it
loads; ember-opencl's tests run the same generators on PoCL)."""

from __future__ import annotations

import pytest

from ember import dtypes as dt
from ember.errors import ValueRangeError
from ember_kernels import CUDA, HIP, OPENCL, dialect
from ember_kernels import elementwise as ew
from ember_kernels import random as philox
from ember_kernels import reduction as red
from ember_kernels.ctypes_ import ctype


def test_opencl_is_the_identity() -> None:
    src = philox._source("uniform", dt.float32)[0]
    assert OPENCL.program(src) is src
    assert dialect("opencl") is OPENCL and dialect("cuda") is CUDA and dialect("hip") is HIP


def test_unknown_dialect_is_a_typed_error() -> None:
    with pytest.raises(ValueRangeError, match="unknown dialect 'metal'"):
        dialect("metal")


def test_cuda_rewrites() -> None:
    src = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
           "static inline float f(__local float* p) { return p[0]; }\n"
           "__kernel __attribute__((reqd_work_group_size(16, 8, 1))) void k(__global float* x, long n, "
           "__local float* sv, __local long* si) {\n"
           "    uint4 c = (uint4)(1, 2, 3, 4); x[0] = c.s0 + c.s3 + sv[0] + si[0];\n}\n")
    out = CUDA.program(src)
    body = out.split("/* ember: kernels */", 1)[1]
    assert "#pragma OPENCL" not in body
    assert "__device__ __forceinline__ float f(float* p)" in body
    assert "__kernel __launch_bounds__(128) void k(__global float* x, long n, long si_smem) {" in body
    assert "float* sv = (float*)ember_smem;" in body and "long* si = (long*)(ember_smem + si_smem);" in body
    assert "make_uint4(1, 2, 3, 4)" in body and "c.x + c.w" in body
    assert out.startswith("/* ember: cuda dialect prelude */")
    assert "cvt.rn.f16.f32" in out and "_Float16" in HIP.program(src)


def test_map_sources_do_not_depend_on_the_dialect() -> None:
    """Generators emit one text; only Dialect.program differs (so OpenCL's on-disk cache keys are unchanged)."""
    fam = ew._unary_plan("exp", dt.float32)[3]
    src = ew._map_source(fam, ((ctype(dt.float32), True),), 3, "strided")
    assert OPENCL.program(src) == src
    loop = "for (long i = get_global_id(0); i < n; i += get_global_size(0)) {"
    assert loop in src and loop in CUDA.program(src)  # kernel bodies pass through; only declarations change
    assert "__kernel void ember_map0(" in src
    assert CUDA.vectors is False and OPENCL.vectors is True


def _nvrtc() -> object:
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"libnvrtc not loadable: {exc}")
    return nvrtc


@pytest.mark.parametrize("source", [
    pytest.param(lambda: ew._map_source(ew._binary_plan("floor_divide", dt.int64, dt.int64)[3],
                                        ((ctype(dt.int64), True), (ctype(dt.int64), True)), 3, "strided"),
                 id="map-binary-int64"),
    pytest.param(lambda: red._reduce_source("sum", ctype(dt.float16), ctype(dt.float32), 2, False, False),
                 id="reduce-sum-float16"),
    pytest.param(lambda: red._softmax_source(ctype(dt.float64)), id="softmax-float64"),
    pytest.param(lambda: philox._source("normal", dt.float16)[0], id="philox-normal-float16"),
])
def test_cuda_text_compiles_with_nvrtc(source: object) -> None:
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(CUDA.program(source()), "t.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=compute_75", "--std=c++17"])
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(prog))
        assert b".entry" in nvrtc.getPTX(prog) or ".entry" in str(nvrtc.getPTX(prog))
    finally:
        nvrtc.destroyProgram(prog)
