"""Tests of ember_opencl.compiler (program cache, tune store) and ember_opencl.errors (build-error reports).

Runs for real on any OpenCL device (PoCL in CI); tests that need one skip with a reason where none is installed.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from ember.errors import EmberError, ValueRangeError

cl = pytest.importorskip("pyopencl")

from ember_opencl.compiler import ProgramCache, TuneStore, default_cache_dir, device_key  # noqa: E402
from ember_opencl.errors import (  # noqa: E402
    AutotuneError,
    KernelBuildError,
    format_build_error,
    parse_error_locations,
)

AXPY = """
__kernel void axpy(__global float *y, __global const float *x, const float a, const int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + y[i] + OFFSET;
}
__kernel void scale(__global float *y, const float a) { y[get_global_id(0)] *= a; }
"""


def _first_device() -> cl.Device | None:
    try:
        for platform in cl.get_platforms():
            devices = platform.get_devices()
            if devices:
                return devices[0]
    except cl.Error:
        return None
    return None


_DEVICE = _first_device()
needs_cl = pytest.mark.skipif(_DEVICE is None, reason="no OpenCL platform/device installed (e.g. pocl-opencl-icd)")


@pytest.fixture
def device() -> cl.Device:
    assert _DEVICE is not None
    return _DEVICE


@pytest.fixture
def ctx(device: cl.Device) -> cl.Context:
    return cl.Context([device])


def _run_axpy(ctx: cl.Context, knl: cl.Kernel, n: int = 100) -> np.ndarray:
    queue = cl.CommandQueue(ctx)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    mf = cl.mem_flags
    xb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    yb = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=y)
    knl.set_args(yb, xb, np.float32(2.0), np.int32(n))
    cl.enqueue_nd_range_kernel(queue, knl, (n,), None)
    out = np.empty_like(y)
    cl.enqueue_copy(queue, out, yb)
    queue.finish()
    return out - (2.0 * x + y)  # == OFFSET everywhere


# --------------------------------------------------------------------------------------------------------------------
# cache directory and device key


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"


def test_default_cache_dir_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("EMBER_CACHE_DIR", raising=False)
    assert default_cache_dir() == pathlib.Path(platformdirs.user_cache_dir("ember"))
    monkeypatch.setenv("EMBER_CACHE_DIR", "")  # empty means unset
    assert default_cache_dir() == pathlib.Path(platformdirs.user_cache_dir("ember"))


def _fake_device(**overrides: object) -> types.SimpleNamespace:
    fields = dict(name="Fancy GPU / X:1", version="OpenCL 3.0", driver_version="535.1", vendor_id=0x10DE)
    fields.update(overrides)
    platform = types.SimpleNamespace(name="NVIDIA CUDA", version="OpenCL 3.0 CUDA 12.2")
    return types.SimpleNamespace(platform=platform, **fields)


def test_device_key_stable_safe_and_driver_sensitive() -> None:
    k = device_key(_fake_device())
    assert k == device_key(_fake_device())
    assert k.startswith("fancy-gpu-x-1-")
    assert all(c.isalnum() or c == "-" for c in k)
    assert device_key(_fake_device(driver_version="545.0")) != k
    assert device_key(_fake_device(vendor_id=0x1002)) != k
    assert device_key(_fake_device(name="")) .startswith("device-")


@needs_cl
def test_device_key_real_device(device: cl.Device) -> None:
    k = device_key(device)
    assert k == device_key(device)
    assert "/" not in k and os.sep not in k and len(k) < 100


# --------------------------------------------------------------------------------------------------------------------
# ProgramCache


@needs_cl
def test_kernel_memoised_and_correct(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    pc = ProgramCache(ctx, device, tmp_path)
    k1 = pc.kernel(AXPY, "axpy", ("-DOFFSET=1.5f",))
    k2 = pc.kernel(AXPY, "axpy", ("-DOFFSET=1.5f",))
    assert k1 is k2
    assert pc.stats["compiled"] == 1 and pc.stats["disk_hits"] == 0 and pc.stats["memory_hits"] == 1
    assert pc.stats["compile_seconds"] > 0
    # a second kernel of the same program reuses the built program
    k3 = pc.kernel(AXPY, "scale", ("-DOFFSET=1.5f",))
    assert k3 is not k1 and k3.function_name == "scale"
    assert pc.stats["compiled"] == 1
    np.testing.assert_allclose(_run_axpy(ctx, k1), 1.5, atol=1e-5)
    # different options are a different program (and a different cache file)
    k4 = pc.kernel(AXPY, "axpy", ["-DOFFSET=-3.0f"])
    assert pc.stats["compiled"] == 2
    np.testing.assert_allclose(_run_axpy(ctx, k4), -3.0, atol=1e-5)
    files = sorted((tmp_path / "opencl" / device_key(device)).glob("*.bin"))
    assert len(files) == 2 and all(len(f.stem) == 64 for f in files)


@needs_cl
def test_options_string_is_split(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    pc = ProgramCache(ctx, device, tmp_path)
    assert pc.program(AXPY, "-DOFFSET=2.0f") is pc.program(AXPY, ("-DOFFSET=2.0f",))
    assert pc.stats["compiled"] == 1


@needs_cl
def test_warm_instance_skips_compile(device: cl.Device, tmp_path: pathlib.Path) -> None:
    opts = ("-DOFFSET=0.25f",)
    cold = ProgramCache(cl.Context([device]), device, tmp_path)
    cold.kernel(AXPY, "axpy", opts)
    assert cold.stats["compiled"] == 1

    ctx2 = cl.Context([device])  # a new context, as in a new process
    warm = ProgramCache(ctx2, device, tmp_path)
    knl = warm.kernel(AXPY, "axpy", opts)
    assert warm.stats["disk_hits"] == 1
    assert warm.stats["compiled"] == 0 and warm.stats["compile_seconds"] == 0
    np.testing.assert_allclose(_run_axpy(ctx2, knl), 0.25, atol=1e-5)


@needs_cl
def test_second_process_skips_compile(device: cl.Device, tmp_path: pathlib.Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, pyopencl as cl
        from ember_opencl.compiler import ProgramCache
        dev = [d for p in cl.get_platforms() for d in p.get_devices()][0]
        pc = ProgramCache(cl.Context([dev]), dev)
        pc.kernel({AXPY!r}, "axpy", ("-DOFFSET=1.0f",))
        print(json.dumps(pc.stats))
        """
    )
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path), POCL_KERNEL_CACHE="0")
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parents[1] / "src"), env.get("PYTHONPATH", "")])

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["compiled"] == 1 and first["disk_hits"] == 0
    assert second["compiled"] == 0 and second["disk_hits"] == 1


@needs_cl
@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated (PoCL would crash on this if it reached the driver)
        lambda b: b[:10],  # shorter than the header
        lambda b: b"",  # empty
        lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),  # one flipped byte: checksum mismatch
    ],
    ids=["truncated", "header-only", "empty", "bitflip"],
)
def test_corrupt_binary_falls_back_and_is_rewritten(device: cl.Device, tmp_path: pathlib.Path, damage) -> None:
    opts = ("-DOFFSET=4.0f",)
    ProgramCache(cl.Context([device]), device, tmp_path).program(AXPY, opts)
    (path,) = (tmp_path / "opencl" / device_key(device)).glob("*.bin")
    good = path.read_bytes()
    path.write_bytes(damage(good))

    ctx = cl.Context([device])
    pc = ProgramCache(ctx, device, tmp_path)
    knl = pc.kernel(AXPY, "axpy", opts)
    assert pc.stats["compiled"] == 1 and pc.stats["disk_hits"] == 0 and pc.stats["disk_rejected"] == 1
    np.testing.assert_allclose(_run_axpy(ctx, knl), 4.0, atol=1e-5)
    # the file was replaced by a good one: the next instance loads it
    again = ProgramCache(cl.Context([device]), device, tmp_path)
    again.program(AXPY, opts)
    assert again.stats["disk_hits"] == 1 and again.stats["compiled"] == 0


@needs_cl
def test_binary_rejected_by_driver_falls_back(device: cl.Device, tmp_path: pathlib.Path) -> None:
    import hashlib

    from ember_opencl import compiler

    opts = ("-DOFFSET=5.0f",)
    ProgramCache(cl.Context([device]), device, tmp_path).program(AXPY, opts)
    (path,) = (tmp_path / "opencl" / device_key(device)).glob("*.bin")
    junk = b"not a program binary" * 8  # well-formed file, checksum fine, but nonsense to the driver
    path.write_bytes(compiler._HEADER.pack(compiler._MAGIC, hashlib.sha256(junk).digest(), len(junk)) + junk)
    pc = ProgramCache(cl.Context([device]), device, tmp_path)
    pc.program(AXPY, opts)
    assert pc.stats["compiled"] == 1 and pc.stats["disk_rejected"] == 1
    assert path.read_bytes() != junk


@needs_cl
def test_unwritable_cache_dir_only_disables_persistence(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")  # mkdir fails even as root
    pc = ProgramCache(ctx, device, blocker)
    knl = pc.kernel(AXPY, "axpy", ("-DOFFSET=1.0f",))
    np.testing.assert_allclose(_run_axpy(ctx, knl), 1.0, atol=1e-5)
    pc.kernel(AXPY, "axpy", ("-DOFFSET=2.0f",))
    assert pc.stats["compiled"] == 2
    assert blocker.is_file()


@needs_cl
def test_unknown_kernel_name(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    pc = ProgramCache(ctx, device, tmp_path)
    with pytest.raises(ValueRangeError, match=r"no kernel 'nope'.*axpy") as info:
        pc.kernel(AXPY, "nope", ("-DOFFSET=1.0f",))
    assert device.name.strip() in str(info.value)


# --------------------------------------------------------------------------------------------------------------------
# build errors

BAD = """// generated by a test
#define ONE 1
__kernel void broken(__global float *a) {
    int i = get_global_id(0);
    a[i] = undeclared_thing * ONE;
}
"""


@needs_cl
def test_build_error_report(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    pc = ProgramCache(ctx, device, tmp_path)
    with pytest.raises(KernelBuildError) as info:
        pc.kernel(BAD, "broken", ("-DX=1",))
    err = info.value
    msg = str(err)
    assert isinstance(err, EmberError) and isinstance(err, RuntimeError)
    assert "'broken'" in msg and device.name.strip() in msg and "-DX=1" in msg
    assert err.error_lines == (5,)
    # numbered excerpt with a marker on the error line and context lines around it
    assert ">> 5 |     a[i] = undeclared_thing * ONE;" in msg
    assert "   4 |     int i = get_global_id(0);" in msg
    assert "   1 | // generated by a test" not in msg  # only context, not the whole source
    assert "build log:" in msg and "undeclared_thing" in msg.split("build log:")[1]
    assert pc.stats["compiled"] == 0
    assert not list(tmp_path.rglob("*.bin"))
    # a failed build is not cached: fixing the source builds
    pc.kernel(BAD.replace("undeclared_thing", "1.0f"), "broken")
    assert pc.stats["compiled"] == 1


@needs_cl
def test_build_error_bad_option(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    pc = ProgramCache(ctx, device, tmp_path)
    with pytest.raises(KernelBuildError, match=r"(?s)--no-such-option.*first 6 of 6 generated source lines"):
        pc.program(BAD.replace("undeclared_thing", "1.0f"), ("--no-such-option",))


def test_parse_error_locations_vendor_formats() -> None:
    log = "\n".join(
        [
            "error: /home/u/.cache/pocl/kcache/tempfile_Ab12.cl:3:10: use of undeclared identifier 'b'",  # PoCL
            "<kernel>:7:5: error: expected ';' after expression",  # NVIDIA
            "/tmp/comgr-1/input/CompileSource:11:2: error: unknown type name 'flaot'",  # ROCm
            "1:13:1: error: use of undeclared identifier 'q'",  # Intel
            '"/tmp/OCL1234.cl", line 17: error: identifier "z" is undefined',  # legacy AMD APP (EDG)
            "<source>:19: error: no column here",
            "<source>:21:3: warning: unused variable 'w'",  # warnings are not errors
            "2 errors generated.",
        ]
    )
    assert [(line, col) for line, col, _ in parse_error_locations(log)] == [
        (3, 10), (7, 5), (11, 2), (13, 1), (17, None), (19, None)
    ]
    assert parse_error_locations(log)[1][2] == "expected ';' after expression"


def test_format_build_error_layout() -> None:
    source = "\n".join(f"line{i}" for i in range(1, 31))
    log = "<kernel>:5:3: error: bad thing\n<kernel>:7:1: error: other\n<kernel>:25:1: error: far away\n"
    msg = format_build_error(source, log, device="'Dev' (Plat, driver 1)", kernel_names=["k"], program="abc")
    assert msg.startswith("OpenCL build failed for kernel(s) 'k' (program abc) on device 'Dev'")
    assert ">>  5 | line5\n      |   ^ bad thing" in msg
    assert ">>  7 | line7" in msg and ">> 25 | line25" in msg
    assert "\n      | ...\n" in msg  # gap between the two windows
    assert "line15" not in msg and "   10 | line10" in msg and "   22 | line22" in msg
    assert msg.index("build log:") > msg.index(">> 25")


def test_format_build_error_fallback_and_long_log() -> None:
    source = "\n".join(f"src{i}" for i in range(1, 101))
    log = "\n".join(f"noise {i}" for i in range(500))
    msg = format_build_error(source, log, device="d")
    assert "first 40 of 100 generated source lines" in msg
    assert "   40 | src40" in msg and "src41" not in msg and ">>" not in msg
    assert "noise 149" in msg and "noise 150" not in msg and "(350 more lines)" in msg
    # an error line past the end of the source (a driver preamble) falls back too
    assert "first 40" in format_build_error(source, "<kernel>:900:1: error: x", device="d")


def test_kernel_build_error_from_log_and_pickle() -> None:
    err = KernelBuildError.from_build_log(BAD, "<kernel>:5:12: error: nope", device="'D'", options=("-DX",))
    assert err.kernel_names == ("broken",) and err.error_lines == (5,) and err.options == ("-DX",)
    assert isinstance(err, EmberError)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and isinstance(again, KernelBuildError)


# --------------------------------------------------------------------------------------------------------------------
# TuneStore

CANDS = [{"tile": 8}, {"tile": 16}, {"tile": 32}]


def test_tune_store_put_get_persist(tmp_path: pathlib.Path) -> None:
    a = TuneStore(tmp_path, "dev1")
    assert a.get("matmul", "m64") is None
    a.put("matmul", "m64", {"tile": 16, "wg": [8, 8]})
    assert a.get("matmul", "m64") == {"tile": 16, "wg": [8, 8]}
    assert (tmp_path / "opencl" / "dev1" / "tune.json").is_file()
    b = TuneStore(tmp_path, "dev1")
    assert b.get("matmul", "m64") == {"tile": 16, "wg": [8, 8]}
    assert TuneStore(tmp_path, "dev2").get("matmul", "m64") is None  # per device
    # returned dicts are copies: mutating one does not change the store
    b.get("matmul", "m64")["tile"] = 99
    assert b.get("matmul", "m64")["tile"] == 16


def test_tune_store_merges_concurrent_writers(tmp_path: pathlib.Path) -> None:
    a = TuneStore(tmp_path, "dev")
    b = TuneStore(tmp_path, "dev")
    a.put("matmul", "k1", {"tile": 8})
    b.put("conv", "k2", {"tile": 4})  # b never read k1, but must not drop it
    c = TuneStore(tmp_path, "dev")
    assert c.get("matmul", "k1") == {"tile": 8} and c.get("conv", "k2") == {"tile": 4}
    # a sees b's later write on a miss
    assert a.get("conv", "k2") == {"tile": 4}


def test_tune_runs_once_then_reuses(tmp_path: pathlib.Path) -> None:
    times = {8: 3.0, 16: 1.0, 32: 2.0}
    calls: list[dict] = []

    def run(c: dict) -> float:
        calls.append(c)
        return times[c["tile"]]

    assert TuneStore(tmp_path, "dev").tune("matmul", "m128", CANDS, run) == {"tile": 16}
    assert len(calls) == 3
    second = TuneStore(tmp_path, "dev")  # a new process
    assert second.tune("matmul", "m128", CANDS, run) == {"tile": 16}
    assert len(calls) == 3
    # another shape class is tuned separately
    second.tune("matmul", "m256", CANDS, run)
    assert len(calls) == 6


def test_tune_skips_failing_candidates(tmp_path: pathlib.Path) -> None:
    def run(c: dict) -> float:
        if c["tile"] == 16:
            raise KernelBuildError("too much local memory")
        if c["tile"] == 8:
            return float("nan")
        return 5.0

    assert TuneStore(tmp_path, "dev").tune("conv", "k", CANDS, run) == {"tile": 32}


@needs_cl
def test_tune_skips_invalid_work_group_size(ctx: cl.Context, device: cl.Device, tmp_path: pathlib.Path) -> None:
    import time

    pc = ProgramCache(ctx, device, tmp_path)
    queue = cl.CommandQueue(ctx)
    knl = pc.kernel(AXPY, "scale", ("-DOFFSET=0",))
    n = 1 << 16
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * n)
    too_big = int(device.max_work_group_size) * 2

    def run(c: dict) -> float:
        knl.set_args(buf, np.float32(1.0))
        t0 = time.perf_counter()
        cl.enqueue_nd_range_kernel(queue, knl, (n,), (c["wg"],))
        queue.finish()
        return time.perf_counter() - t0

    store = TuneStore(tmp_path, device_key(device))
    assert store.tune("scale", "n65536", [{"wg": too_big}, {"wg": 1}], run) == {"wg": 1}


def test_tune_all_fail_raises(tmp_path: pathlib.Path) -> None:
    def run(c: dict) -> float:
        raise RuntimeError(f"CL_INVALID_WORK_GROUP_SIZE for {c['tile']}")

    store = TuneStore(tmp_path, "devX")
    with pytest.raises(AutotuneError, match=r"(?s)'matmul'.*'m7'.*devX.*all 3 candidate.*INVALID_WORK_GROUP_SIZE") as e:
        store.tune("matmul", "m7", CANDS, run)
    assert isinstance(e.value, EmberError)
    assert store.get("matmul", "m7") is None
    with pytest.raises(ValueRangeError, match="no candidate"):
        store.tune("matmul", "m7", [], run)


def test_tune_retunes_when_stored_winner_is_no_longer_a_candidate(tmp_path: pathlib.Path) -> None:
    store = TuneStore(tmp_path, "dev")
    store.put("matmul", "m", {"tile": 64})
    calls = []
    assert store.tune("matmul", "m", CANDS, lambda c: calls.append(c) or c["tile"]) == {"tile": 8}
    assert len(calls) == 3 and TuneStore(tmp_path, "dev").get("matmul", "m") == {"tile": 8}


def test_tune_store_corrupt_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "opencl" / "dev" / "tune.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "entries": {"matmul": {"a": {"tile"')  # truncated
    store = TuneStore(tmp_path, "dev")
    assert store.get("matmul", "a") is None
    store.put("matmul", "b", {"tile": 8})
    assert json.loads(path.read_text())["entries"] == {"matmul": {"b": {"tile": 8}}}
    path.write_text('{"format": 1, "entries": {"matmul": {"a": 3, "b": {"tile": 4}}, "conv": []}}')  # bad records
    fresh = TuneStore(tmp_path, "dev")
    assert fresh.get("matmul", "a") is None and fresh.get("matmul", "b") == {"tile": 4}


def test_tune_store_unwritable_and_bad_values(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = TuneStore(blocker, "dev")
    store.put("matmul", "k", {"tile": 8})  # no error: kept in memory
    assert store.get("matmul", "k") == {"tile": 8}
    assert store.tune("matmul", "k2", CANDS, lambda c: 1.0) == {"tile": 8}
    with pytest.raises(ValueRangeError, match=r"'matmul'.*must be a dict"):
        store.put("matmul", "k", [8])  # type: ignore[arg-type]
    with pytest.raises(ValueRangeError, match="JSON"):
        store.put("matmul", "k", {"f": object()})


def test_scalar_arg_dtypes_parses_generated_signatures() -> None:
    from ember_opencl.compiler import scalar_arg_dtypes

    src = """
    #define T float
    __kernel __attribute__((reqd_work_group_size(64, 1, 1))) void k1(__global float* out, const long n,
        __local double* scratch, uint flags, __private float scale, unsigned char b) { }
    __kernel void k2(__global T* out, T scale) { }
    kernel void k3(void) { }
    """
    assert scalar_arg_dtypes(src, "k1") == [None, np.int64, None, np.uint32, np.float32, np.uint8]
    assert scalar_arg_dtypes(src, "k2") is None  # a macro type: pyopencl's generic path is kept
    assert scalar_arg_dtypes(src, "missing") is None


@needs_cl
def test_kernels_with_declared_scalar_types_accept_numpy_and_python_scalars(
    device: cl.Device, tmp_path: pathlib.Path
) -> None:
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    cache = ProgramCache(ctx, device, tmp_path)
    src = ("__kernel void axpb(__global float* y, long off, float a, int b, long n) {"
           " long i = get_global_id(0); if (i < n) y[off + i] = a * y[off + i] + (float)b; }")
    knl = cache.kernel(src, "axpb")
    host = np.arange(8, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    knl(queue, (8,), None, buf, np.int64(0), np.float32(2.0), 3, np.int64(8))
    knl(queue, (8,), None, buf, 0, 0.5, np.int32(1), 8)
    out = np.empty_like(host)
    cl.enqueue_copy(queue, out, buf)
    np.testing.assert_array_equal(out, (2 * host + 3) * 0.5 + 1)
