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
