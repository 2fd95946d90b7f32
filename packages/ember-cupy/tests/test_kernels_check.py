"""``ember kernels check``: the catalogue, the report and exit codes, a real NVRTC compile of a subset (the full
catalogue runs as its own CI step: `ember kernels check --target cuda`), and the skip path for hiprtc."""

from __future__ import annotations

import io

import pytest

from ember_cupy import catalog, check, rtc


def _nvrtc() -> rtc.NVRTC:
    try:
        return rtc.NVRTC()
    except rtc.Unavailable as exc:
        pytest.skip(f"NVRTC not loadable here: {exc}")


def test_catalogue_names_are_unique_and_cover_every_area() -> None:
    names = [n for n, _ in catalog.all_sources()]
    assert len(names) == len(set(names))
    assert {n.split("/")[0] for n in names} >= {"map", "reduce", "argreduce", "scan", "softmax", "logsumexp",
                                                "matmul", "conv", "pooling", "index", "pad", "sort", "philox",
                                                "fused"}
    assert all(src.count("__kernel") >= 1 for _, src in catalog.all_sources(["random", "sorting"]))


def test_random_and_sorting_compile_with_nvrtc() -> None:
    _nvrtc()
    out = io.StringIO()
    assert check.run_check("cuda", areas=["random", "sorting"], out=out) == 0
    assert ", 0 failed" in out.getvalue()


def test_a_broken_kernel_is_reported_with_its_source_and_log(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvrtc()
    good = "__kernel void ok_k(__global float* x) { x[get_global_id(0)] = 1.0f; }\n"
    bad = "__kernel void bad_k(__global float* x) { x[get_global_id(0)] = undefined_name; }\n"
    monkeypatch.setattr(catalog, "all_sources", lambda areas=None: iter([("t/ok", good), ("t/bad", bad)]))
    out = io.StringIO()
    assert check.run_check("cuda", out=out) == 1
    text = out.getvalue()
    assert "1 compiled, 1 failed" in text
    assert "FAILED t/bad" in text and "undefined_name" in text  # the log and the numbered source
    assert "extern \"C\" __global__" not in text or "bad_k" in text


def test_missing_compiler_is_a_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(target: str, arch: str | None = None) -> rtc.Compiler:
        raise rtc.Unavailable("hiprtc is not installed here (test)")

    monkeypatch.setattr(rtc, "compiler", unavailable)
    out = io.StringIO()
    assert check.run_check("hip", out=out) == 0
    assert "skipped: hiprtc is not installed here (test)" in out.getvalue()
    assert check.run_check("hip", require=True, out=io.StringIO()) == 2


def test_command_is_registered_with_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from ember.cli import main

    assert main(["kernels", "list", "--area", "random"]) == 0
    listed = capsys.readouterr().out.split()
    assert "philox/normal/float32" in listed


# -- HIP without ROCm: clang ---------------------------------------------------------------------------------------
def _clang() -> rtc.ClangHIP:
    try:
        return rtc.ClangHIP()
    except rtc.Unavailable as exc:
        pytest.skip(f"clang with the AMDGPU target not installed here: {exc}")


#: everything the HIP dialect's prelude takes from hiprtc's implicit hip_runtime.h, used once
_RUNTIME_USER = r"""
extern "C" __global__ __launch_bounds__(256) void uses_runtime(float* x, unsigned long long* c, int* k, long n) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)smem;
    size_t i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) {
        uint4 v = make_uint4(__umulhi(1u, 2u), 0u, 0u, (unsigned)gridDim.x);
        float y = expf(s[threadIdx.x]) + erfinv(0.5f) + (isnan(x[i]) ? 1.0f : 0.0f) + __int_as_float(v.x);
        x[i] = y + (float)__umul64hi(3ull, 4ull) + (float)__mul64hi(-3ll, 4ll);
        atomicCAS(c, 0ull, 1ull);
        atomicAdd(k, 1);
        __threadfence();
    }
}
"""


def test_clang_compiles_what_hiprtc_provides_and_reports_each_failure() -> None:
    comp = _clang()
    bad = "extern \"C\" __global__ void broken(float* x) { x[0] = not_declared; }\n"
    results = comp.compile_many([(_RUNTIME_USER, "runtime"), (bad, "broken"), (_RUNTIME_USER, "again")])
    assert [r.ok for r in results] == [True, False, True]  # a failing batch is retried file by file, in order
    assert "not_declared" in results[1].log
    assert comp.compile(_RUNTIME_USER, "single").ok
    assert comp.compile("extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }", "o", ("-ffp-contract=off",)).ok


def test_hip_falls_back_to_clang_without_hiprtc(monkeypatch: pytest.MonkeyPatch) -> None:
    _clang()

    def no_hiprtc(arch: str = rtc.DEFAULT_HIP_ARCH) -> rtc.HIPRTC:
        raise rtc.Unavailable("hiprtc is not installed here (test)")

    monkeypatch.setattr(rtc, "HIPRTC", no_hiprtc)
    comp = rtc.compiler("hip")
    assert isinstance(comp, rtc.ClangHIP) and comp.version.startswith("clang ")
    monkeypatch.setattr(rtc.shutil, "which", lambda name: None)
    monkeypatch.delenv("EMBER_HIP_CLANG", raising=False)
    with pytest.raises(rtc.Unavailable, match="hiprtc is not installed here \\(test\\); neither hiprtc .* nor clang"):
        rtc.compiler("hip")


def test_hip_dialect_programs_compile_with_clang() -> None:
    """The HIP text of the Philox programs (the dialect's vector literals, make_uint4 and lanes, mul_hi, half
    stores) through the clang check; the whole catalogue runs as its own CI step."""
    _clang()
    out = io.StringIO()
    assert check.run_check("hip", areas=["random"], out=out) == 0, out.getvalue()
    assert ", 0 failed" in out.getvalue()
